"""`llmgw-facility`: the operator CLI. Today it checks configuration files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exporter import config as agent_config
from exporter.yamlfile import ConfigError

NOT_BUILT = ("facility", "hold", "release", "explain-placement", "headroom", "demo")


def check_config(agent_files: list[Path]) -> int:
    """Validate each agent.yaml; print every problem with its file and line."""
    failed = 0
    for path in agent_files:
        try:
            config = agent_config.load(path)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        print(
            f"{path}: ok (node {config.node}, rack {config.labels.rack or 'none: a rack of one'})"
        )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmgw-facility", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-config", help="validate configuration files")
    check.add_argument(
        "--agent",
        type=Path,
        action="append",
        default=[],
        metavar="AGENT_YAML",
        help="an exporter agent.yaml (repeatable)",
    )
    for name in NOT_BUILT:
        commands.add_parser(name, help="not built yet")
    args = parser.parse_args(argv)
    if args.command == "check-config":
        if not args.agent:
            parser.error("check-config: name at least one file (--agent agent.yaml)")
        return check_config(args.agent)
    print(f"llmgw-facility {args.command}: not built yet (it needs the decider)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
