"""`llmgw-facility`: the operator CLI. It checks configuration files, renders the site's
recording rules from the facility file, and talks to a running decider over its HTTP API
(docs/decider.md): the domain table, holds, overrides, a placement explained, headroom per
profile.

The decider is found at `--decider URL`, else $LLMGW_DECIDER_URL, else
http://127.0.0.1:9851; mutating calls (hold, release, override) send the bearer token read from
`--token-file`, else $LLMGW_DECIDER_TOKEN_FILE. Exit status: 0 done; 1 the decider
answered with an error (its detail is printed); 2 bad usage or a bad local file; 3 the
decider could not be reached or did not answer in time.
"""

# The module's docstring is `--help`'s description. Here: the parser, its argument types and
# main(); the commands live by job in llmgw_facility.local_files (check-config, rules render),
# llmgw_facility.client (the decider's HTTP API) and llmgw_facility.commands (the calls).

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from urllib.parse import urlparse

from decider.facility import DomainRef
from llmgw_facility.client import (
    DEFAULT_DECIDER_URL,
    DEFAULT_TIMEOUT_S,
    TOKEN_ENV,
    URL_ENV,
    CallFailed,
    Decider,
)
from llmgw_facility.commands.capping import capping_table
from llmgw_facility.commands.domains import facility_table, hold, override, release
from llmgw_facility.commands.placement import explain_placement, headroom
from llmgw_facility.commands.recommendations import failover_report, profiles, shedding_plan
from llmgw_facility.exit_status import EXIT_BAD_FILE, EXIT_UNREACHABLE
from llmgw_facility.local_files import check_config, render_rules
from llmgw_facility.signal_check import add_arguments as add_live_check_arguments
from llmgw_facility.signal_check import check_config_live

PROG = "llmgw-facility"


# --- argument types ---------------------------------------------------------------------------


def parse_domain(text: str) -> DomainRef:
    """`kind/name`; a plain name is a rack (`hold r12-07`, as DESIGN.md §5 writes it)."""
    try:
        return DomainRef.parse(text if "/" in text else f"rack/{text}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


#: An override's length on the command line: a number and s, m, h or d (`--for 2h`).
_OVERRIDE_FOR = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_OVERRIDE_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: An override lasts a minute to seven days (docs/decider.md, "Overrides"; the decider
#: checks it again).
OVERRIDE_FOR_S = (60.0, 7 * 86400.0)


def override_for(text: str) -> float:
    """`90s`, `30m`, `2h`, `1d` as seconds, within OVERRIDE_FOR_S."""
    match = _OVERRIDE_FOR.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30m, 2h or 1d")
    seconds = float(match.group(1)) * _OVERRIDE_UNIT_S[match.group(2)]
    shortest, longest = OVERRIDE_FOR_S
    if not shortest <= seconds <= longest:
        raise argparse.ArgumentTypeError(f"{text!r}: an override lasts 1m to 7d")
    return seconds


def parse_pdu(text: str) -> DomainRef:
    """`pdu/NAME`; a plain name is a PDU here."""
    try:
        ref = DomainRef.parse(text if "/" in text else f"pdu/{text}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if ref.kind != "pdu":
        raise argparse.ArgumentTypeError(f"{text!r} is not a pdu: give pdu/NAME")
    return ref


def decider_url(text: str) -> str:
    parsed = urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


def timeout_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return seconds


# --- the calls to the decider -----------------------------------------------------------------


def call_decider(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    url = args.decider or os.environ.get(URL_ENV) or DEFAULT_DECIDER_URL
    try:
        decider_url(url)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"${URL_ENV}: {exc}")
    token_file = args.token_file or (
        Path(os.environ[TOKEN_ENV]) if os.environ.get(TOKEN_ENV) else None
    )
    decider = Decider(url, token_file, args.timeout)
    try:
        if args.command == "facility":
            return facility_table(decider, args.json)
        if args.command == "hold":
            return hold(decider, args.domain, args.reason)
        if args.command == "release":
            return release(decider, args.domain)
        if args.command == "override":
            if not args.end and (args.for_seconds is None or args.reason is None):
                parser.error("override: give --for and --reason, or --end")
            return override(decider, args.domain, args)
        if args.command == "explain-placement":
            return explain_placement(decider, args)
        if args.command == "profiles":
            return profiles(decider, args.model, args.json)
        if args.command == "shedding":
            return shedding_plan(decider, args.json)
        if args.command == "failover":
            return failover_report(decider, args.pdu, args.json)
        if args.command == "capping":
            return capping_table(decider, args.node, args.json)
        return headroom(decider, args.profile, args.json)
    except CallFailed as exc:
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except (KeyError, TypeError, AttributeError) as exc:  # an answer of another shape
        print(
            f"{PROG} {args.command}: the answer from {url} is not what the decider sends "
            f"({type(exc).__name__}: {exc}); is it the decider, and of this version?",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE


# --- the command line -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    check.add_argument(
        "--decider-config",
        type=Path,
        action="append",
        default=[],
        metavar="DECIDER_YAML",
        help="a decider.yaml, checked with the facility file and token file it names (repeatable)",
    )
    add_live_check_arguments(check)
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

    api = argparse.ArgumentParser(add_help=False)
    where = api.add_argument_group("the decider")
    where.add_argument(
        "--decider",
        type=decider_url,
        metavar="URL",
        help=f"the decider's address (default: ${URL_ENV}, else {DEFAULT_DECIDER_URL})",
    )
    where.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help=f"the bearer token of mutating calls (default: ${TOKEN_ENV})",
    )
    where.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up on an answer after this long (default {DEFAULT_TIMEOUT_S:g})",
    )
    raw = argparse.ArgumentParser(add_help=False)
    raw.add_argument("--json", action="store_true", help="print the decider's answer as JSON")

    commands.add_parser(
        "facility",
        parents=[api, raw],
        help="the domain table: condition, cap, reserved, measured, headroom, hold",
        description="Every domain the decider knows (GET /v1/domains), site to pdu; powers in kW.",
    )
    domain_help = "kind/name (rack/r12-07, pdu/r12-07-a, row/12); a plain name is a rack"
    hold_parser = commands.add_parser(
        "hold",
        parents=[api],
        help="hold a domain: no new placements on its nodes until released",
        description="POST /v1/domains/{kind}/{name}/hold (needs the token).",
    )
    hold_parser.add_argument("domain", type=parse_domain, metavar="DOMAIN", help=domain_help)
    hold_parser.add_argument("--reason", required=True, help="why, shown with the hold")
    release_parser = commands.add_parser(
        "release",
        parents=[api],
        help="release a held domain",
        description="POST /v1/domains/{kind}/{name}/release (needs the token).",
    )
    release_parser.add_argument("domain", type=parse_domain, metavar="DOMAIN", help=domain_help)
    override_parser = commands.add_parser(
        "override",
        parents=[api],
        help="clear a domain's condition known to be a sensor fault, for a while",
        description="POST /v1/domains/{kind}/{name}/override (needs the token): placement "
        "reads the domain as ok until the override ends (--for, 1m to 7d) or --end ends it "
        "(POST …/override/release).",
    )
    override_parser.add_argument("domain", type=parse_domain, metavar="DOMAIN", help=domain_help)
    override_parser.add_argument(
        "--for",
        dest="for_seconds",
        type=override_for,
        metavar="DURATION",
        help="how long: 30m, 2h, 1d (1m to 7d)",
    )
    override_parser.add_argument("--reason", help="why, shown with the override")
    override_parser.add_argument("--by", help="who sets it (default: ops)")
    override_parser.add_argument("--end", action="store_true", help="end the override now")
    explain = commands.add_parser(
        "explain-placement",
        parents=[api, raw],
        help="judge a replica against candidate nodes and say why",
        description="POST /v1/placements: each node's verdict and reasons, in the order given, "
        "then the decider's order. Nothing is reserved.",
    )
    explain.add_argument("--model", required=True)
    explain.add_argument("--profile", required=True)
    explain.add_argument("--gpus", type=int, required=True, metavar="N")
    explain.add_argument(
        "--power-watts", type=float, metavar="W", help="declared draw: the estimate then"
    )
    explain.add_argument("--cpu-cores", type=float, metavar="C", help="for a CPU replica")
    explain.add_argument("--class", dest="replica_class", metavar="CLASS")
    explain.add_argument("nodes", nargs="+", metavar="NODE", help="candidates, in your order")
    headroom_parser = commands.add_parser(
        "headroom",
        parents=[api, raw],
        help="how many more replicas of a profile fit, per domain, and what binds",
        description="GET /v1/headroom: the scheduler's dry run on a copy; nothing reserved.",
    )
    headroom_parser.add_argument("--profile", required=True, metavar="NAME")
    profiles_parser = commands.add_parser(
        "profiles",
        parents=[api, raw],
        help="a model's profiles ranked by measured tokens per joule",
        description="GET /v1/profiles/{model}: ranked by fresh tokens per joule; stale and "
        "unmeasured profiles are listed, never ranked.",
    )
    profiles_parser.add_argument("model", metavar="MODEL")
    commands.add_parser(
        "shedding",
        parents=[api, raw],
        help="the shedding plan: which replicas would move off hot domains, to where",
        description="GET /v1/shedding: a recommendation; the decider moves nothing.",
    )
    failover_parser = commands.add_parser(
        "failover",
        parents=[api, raw],
        help="what the loss of one PDU would overload, and what shedding would move",
        description="GET /v1/failover?domain=pdu/NAME: each rack the PDU feeds, on its "
        "surviving feeds.",
    )
    failover_parser.add_argument(
        "pdu", type=parse_pdu, metavar="PDU", help="pdu/NAME (a plain name is a pdu)"
    )
    capping_parser = commands.add_parser(
        "capping",
        parents=[api, raw],
        help="each oversubscribed domain's capping ladder: step, GPU caps per class, why",
        description="GET /v1/capping (docs/oversubscription.md); with --node, the lease a node "
        "agent gets now: GET /v1/capping/leases/{node} (needs the token).",
    )
    capping_parser.add_argument("--node", metavar="NODE", help="show this node's lease")
    simulate = commands.add_parser(
        "simulate",
        help="serve a simulated site's exporter metrics, one scrape target per node",
        description="Serve every node of a scenario file (docs/simulation.md) as its own "
        "scrape target, /nodes/<node>/metrics, and the site's own meters at /site/metrics, "
        "until Ctrl-C. Exit 2: a scenario refused with its file, line and reason; 3: the "
        "address cannot be bound.",
    )
    simulate.add_argument("--scenario", type=Path, required=True, metavar="SCENARIO_YAML")
    simulate.add_argument(
        "--listen",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="where to serve (default 127.0.0.1:0: a free port, printed at start)",
    )
    simulate.add_argument(
        "--targets-file",
        type=Path,
        metavar="PATH",
        help="write a Prometheus file_sd target file listing every node here",
    )
    simulate.add_argument(
        "--decider",
        type=decider_url,
        metavar="URL",
        help="read reservations from this decider (load.from_decider; overrides its url)",
    )
    demo = commands.add_parser(
        "demo",
        help="run the whole system on a simulated site and tell its story",
        description="Start a real Prometheus and Alertmanager, a simulated site and the "
        "decider on loopback ports, then show replicas placed until a rack is full, a "
        "cooling failure turning a row warm then hot, placements moving elsewhere and the "
        "alert arriving; then stay up until Ctrl-C (docs/simulation.md).",
    )
    demo.add_argument(
        "--once",
        action="store_true",
        help="stop after the story; exit 0 only if every step happened in time",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "check-config":
        if not args.agent and not args.facility and not args.decider_config:
            parser.error(
                "check-config: name at least one file (--agent agent.yaml, "
                "--facility facility.yaml, --decider-config decider.yaml)"
            )
        if args.prometheus is not None:
            return check_config_live(args)
        return check_config(args.agent, args.facility, args.decider_config)
    if args.command == "rules":
        return render_rules(args.facility, args.output)
    if args.command == "simulate":
        from llmgw_sim.main import run as simulate

        return simulate(
            args.scenario,
            listen=args.listen,
            targets_file=args.targets_file,
            decider_url=args.decider,
        )
    if args.command == "demo":
        from llmgw_sim.demo.main import run as demo

        return demo(once=args.once)
    return call_decider(args, parser)


if __name__ == "__main__":
    sys.exit(main())
