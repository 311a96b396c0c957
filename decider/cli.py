"""`llmgw-facility`: the operator CLI. It checks configuration files and renders the site's
recording rules from the facility file."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import tempfile
from pathlib import Path

from decider import facility as facility_file
from decider import rules_render
from exporter import config as agent_config
from exporter.yamlfile import ConfigError

NOT_BUILT = ("facility", "hold", "release", "explain-placement", "headroom", "demo")

#: Exit status for a facility file that cannot be used (argparse uses 2 for bad usage too).
EXIT_BAD_FILE = 2


def check_config(agent_files: list[Path], facility_files: list[Path] | None = None) -> int:
    """Validate each agent.yaml and facility.yaml; print every problem with its file and line."""
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
    for path in facility_files or []:
        try:
            facility = facility_file.load(path)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        signals = ", ".join(facility.signals.configured()) or "none"
        print(
            f"{path}: ok ({len(facility.domains)} domains, {len(facility.profiles)} profiles, "
            f"signals: {signals}; mode {facility.mode})"
        )
    return 1 if failed else 0


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step: readers see the old file or the new, never half.

    The text goes to a temporary file beside it, flushed to disk, then renamed over it. A
    symbolic link is followed (the link stays); an existing file keeps its permissions.
    """
    target = path.resolve() if path.is_symlink() else path
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
    )
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def render_rules(facility_path: Path, output: Path | None) -> int:
    """`rules render`: the site's rule file on stdout, or written whole to `output`."""
    try:
        facility = facility_file.load(facility_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_FILE
    text = rules_render.render(facility, source=str(facility_path))
    if output is None or str(output) == "-":
        sys.stdout.write(text)
        return 0
    try:
        write_atomically(output, text)
    except OSError as exc:
        print(f"{output}: cannot write the rules: {exc}", file=sys.stderr)
        return 1
    count = len(rules_render.site_rules(facility))
    print(
        f"{output}: {count} rules in group {rules_render.GROUP}; "
        "reload Prometheus (SIGHUP or POST /-/reload) to load them",
        file=sys.stderr,
    )
    return 0


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
    check.add_argument(
        "--facility",
        type=Path,
        action="append",
        default=[],
        metavar="FACILITY_YAML",
        help="a facility file, facility.yaml (repeatable)",
    )
    rules = commands.add_parser("rules", help="the site's recording rules")
    rules_commands = rules.add_subparsers(dest="rules_command", required=True)
    render = rules_commands.add_parser(
        "render",
        help="render the site's recording rules (group llmgw-site.rules) from a facility file",
        description="Render signals, declared domains and threshold overrides of a facility "
        "file as one Prometheus rule file (docs/facility.md). A bad facility file is refused "
        f"with its file, line and reason (exit {EXIT_BAD_FILE}); nothing is written then.",
    )
    render.add_argument("--facility", type=Path, required=True, metavar="FACILITY_YAML")
    render.add_argument(
        "--output",
        type=Path,
        metavar="FILE",
        help="write here, replacing the file in one step (default: stdout)",
    )
    for name in NOT_BUILT:
        commands.add_parser(name, help="not built yet")
    args = parser.parse_args(argv)
    if args.command == "check-config":
        if not args.agent and not args.facility:
            parser.error(
                "check-config: name at least one file (--agent agent.yaml, "
                "--facility facility.yaml)"
            )
        return check_config(args.agent, args.facility)
    if args.command == "rules":
        return render_rules(args.facility, args.output)
    print(f"llmgw-facility {args.command}: not built yet (it needs the decider)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
