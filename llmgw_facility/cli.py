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

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import requests

from decider import facility as facility_file
from decider import rules_render
from decider.facility import KINDS, DomainRef
from exporter import config as agent_config
from llmgw_common.yamlfile import ConfigError

PROG = "llmgw-facility"

#: Exit status for a facility file that cannot be used (argparse uses 2 for bad usage too).
EXIT_BAD_FILE = 2
#: The decider answered with an error (4xx, 5xx).
EXIT_REFUSED = 1
#: The decider could not be reached, did not answer in time, or is not the decider.
EXIT_UNREACHABLE = 3

DEFAULT_DECIDER_URL = "http://127.0.0.1:9851"
URL_ENV = "LLMGW_DECIDER_URL"
TOKEN_ENV = "LLMGW_DECIDER_TOKEN_FILE"
DEFAULT_TIMEOUT_S = 10.0


# --- check-config and rules render ------------------------------------------------------------


def check_config(
    agent_files: list[Path],
    facility_files: list[Path] | None = None,
    decider_files: list[Path] | None = None,
) -> int:
    """Validate each agent.yaml, facility.yaml and decider.yaml (with the facility file and
    token it names); print every problem with its file and line."""
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
    if decider_files:
        # The service module brings the Prometheus client along: load it only when asked.
        from decider.service import load_all

        for path in decider_files:
            try:
                loaded = load_all(path)
            except ConfigError as exc:
                print(exc, file=sys.stderr)
                failed += 1
                continue
            config = loaded.config
            token = (
                f"token file {config.token_file}"
                if config.token_file is not None
                else "no token_file: mutating calls are refused"
            )
            print(
                f"{path}: ok (listen {config.listen}, Prometheus {config.prometheus.url}, "
                f"facility {config.facility}: {len(loaded.facility.domains)} domains, mode "
                f"{loaded.facility.mode}; database {config.database}; {token})"
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


# --- the decider's API ------------------------------------------------------------------------


class CallFailed(Exception):
    """A call to the decider that got no usable answer; the message is one line."""

    def __init__(self, message: str, exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _os_reason(exc: BaseException) -> str | None:
    """The operating system's words under a requests error ("Connection refused"), if any."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        strerror = getattr(current, "strerror", None)
        if isinstance(strerror, str) and strerror:
            return strerror
        reason = getattr(current, "reason", None)
        stack.extend(arg for arg in current.args if isinstance(arg, BaseException))
        if isinstance(reason, BaseException):
            stack.append(reason)
        stack.extend((current.__cause__, current.__context__))
    return None


class Decider:
    """The decider's HTTP API as the CLI calls it: JSON in and out, every failure one line."""

    def __init__(self, url: str, token_file: Path | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.token_file = token_file
        self.timeout = timeout

    def _token(self) -> str | None:
        if self.token_file is None:
            return None
        try:
            token = self.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CallFailed(
                f"cannot read the token file {self.token_file}: {exc}", EXIT_BAD_FILE
            ) from exc
        if not token:
            raise CallFailed(f"the token file {self.token_file} is empty", EXIT_BAD_FILE)
        token = token.splitlines()[0].strip()
        if not token.isascii() or not token.isprintable():
            raise CallFailed(
                f"the token in {self.token_file} is not printable ASCII: an HTTP header "
                "cannot carry it",
                EXIT_BAD_FILE,
            )
        return token

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        mutating: bool = False,
    ) -> Any:
        """The answer's JSON; raises CallFailed with the decider's own words on an error."""
        headers = {"Accept": "application/json"}
        token = self._token() if mutating else None
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        where = f"the decider at {self.url}"
        try:
            response = requests.request(
                method,
                self.url + path,
                json=body,
                params=params,
                headers=headers,
                timeout=self.timeout,
            )
        except requests.Timeout as exc:
            raise CallFailed(
                f"no answer from {where} within {self.timeout:g}s", EXIT_UNREACHABLE
            ) from exc
        except requests.ConnectionError as exc:
            why = _os_reason(exc) or "the connection failed"
            raise CallFailed(
                f"cannot reach {where}: {why} (is llmgw-decider running there? set the "
                f"address with --decider URL or ${URL_ENV})",
                EXIT_UNREACHABLE,
            ) from exc
        except requests.RequestException as exc:
            raise CallFailed(f"cannot call {where}: {exc}", EXIT_UNREACHABLE) from exc
        try:
            answer = response.json() if response.content else None
        except ValueError:
            answer = None
            if response.ok:
                kind = response.headers.get("Content-Type", "no content type")
                raise CallFailed(
                    f"{self.url}{path} answered HTTP {response.status_code} with {kind}, not "
                    f"JSON: is {self.url} the decider?",
                    EXIT_UNREACHABLE,
                ) from None
        if response.ok:
            return answer
        raise CallFailed(self._describe(response, answer))

    def _describe(self, response: requests.Response, answer: Any) -> str:
        status = f"HTTP {response.status_code}"
        detail = answer.get("detail") if isinstance(answer, dict) else None
        if not isinstance(detail, str):
            text = " ".join(response.text.split())[:200]
            detail = text or response.reason or "no detail"
        if response.status_code == 401:
            if self.token_file is None:
                hint = f"give the decider's token with --token-file FILE or ${TOKEN_ENV}"
            else:
                hint = f"the token in {self.token_file} is not the decider's"
            return f"the decider refused the call ({status}): {hint}"
        return f"the decider answered {status}: {detail}"


def domain_path(ref: DomainRef) -> str:
    return f"/v1/domains/{quote(ref.kind, safe='')}/{quote(ref.name, safe='')}"


def parse_domain(text: str) -> DomainRef:
    """`kind/name`; a plain name is a rack (`hold r12-07`, as DESIGN.md §5 writes it)."""
    try:
        return DomainRef.parse(text if "/" in text else f"rack/{text}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def kw(watts: float | None) -> str:
    """Watts as kW with one decimal; "-" for none. A shortfall under 50 W keeps its sign
    and more digits ("-0.044"), so that a refusal never reads as a headroom of -0.0."""
    if watts is None:
        return "-"
    text = f"{watts / 1000:.1f}"
    if text == "-0.0":
        text = f"{watts / 1000:.3f}".rstrip("0").rstrip(".")
    return "0.0" if text in ("-0", "-0.0") else text


def table(headers: Sequence[str], rows: list[list[str]], right: frozenset[int]) -> list[str]:
    """Aligned columns, two spaces apart; columns in `right` are right-aligned."""
    widths = [max(len(row[i]) for row in [list(headers), *rows]) for i in range(len(headers))]
    lines = []
    for row in [list(headers), *rows]:
        cells = [
            cell.rjust(width) if index in right else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def domain_order(entry: dict[str, Any]) -> tuple[int, str]:
    """Site, room, row, rack, pdu; by name within a kind."""
    kind = entry.get("kind", "")
    rank = KINDS.index(kind) if kind in KINDS else len(KINDS)
    return rank, str(entry.get("domain", ""))


def print_missing(missing: list[str]) -> None:
    if missing:
        print("missing:")
        for note in missing:
            print(f"  - {note}")


def show_json(answer: Any) -> None:
    print(json.dumps(answer, indent=2, ensure_ascii=False))


def facility_table(decider: Decider, as_json: bool) -> int:
    answer = decider.call("GET", "/v1/domains")
    if as_json:
        show_json(answer)
        return 0
    domains = sorted(answer.get("domains", []), key=domain_order)
    if not domains:
        print("no domains: the facility file declares none and Prometheus names none")
    else:
        rows = []
        for entry in domains:
            held = entry.get("held")
            rows.append(
                [
                    f"{entry['kind']}/{entry['domain']}",
                    entry.get("condition", "unknown"),
                    kw(entry.get("cap_watts")),
                    kw(entry.get("reserved_watts")),
                    kw(entry.get("measured_watts")),
                    kw(entry.get("room_watts")),
                    kw(entry.get("headroom_watts")),
                    held["reason"] if held else "-",
                ]
            )
            rows += phase_rows(entry)
        # HEADROOM is what placement allows: limit - load, the limit being cap * (1 - margin).
        # cap - load is what is left before the cap itself, named as such.
        headers = (
            "DOMAIN",
            "CONDITION",
            "CAP kW",
            "RESERVED kW",
            "MEASURED kW",
            "HEADROOM kW",
            "CAP-LOAD kW",
            "HELD",
        )
        for line in table(headers, rows, frozenset({2, 3, 4, 5, 6})):
            print(line)
        for entry in domains:  # each override in force, with what the rules say
            if entry.get("override"):
                print(f"{entry['kind']}/{entry['domain']}: {entry['override']['text']}")
    print_missing(answer.get("missing", []))
    return 0


def phase_rows(entry: dict[str, Any]) -> list[list[str]]:
    """A three-phase pdu's phases under its row: cap, reserved, headroom (limit - load) and
    cap - load; nothing measured."""
    return [
        [
            f"  phase {phase['phase']}",
            "",
            kw(phase.get("cap_watts")),
            kw(phase.get("reserved_watts")),
            "-",
            kw(phase.get("room_watts")),
            kw(phase.get("headroom_watts")),
            "",
        ]
        for phase in entry.get("phases") or []
    ]


def hold(decider: Decider, ref: DomainRef, reason: str) -> int:
    answer = decider.call(
        "POST", f"{domain_path(ref)}/hold", body={"reason": reason}, mutating=True
    )
    held = answer.get("held") or {}
    print(f"held {ref}: {held.get('reason', reason)} (no new placements on its nodes)")
    return 0


def release(decider: Decider, ref: DomainRef) -> int:
    before = decider.call("GET", domain_path(ref))
    if not before.get("held"):
        print(f"{ref} is not held; nothing to release")
        return 0
    decider.call("POST", f"{domain_path(ref)}/release", mutating=True)
    print(f"released {ref} (it was held: {before['held']['reason']})")
    return 0


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


def override(decider: Decider, ref: DomainRef, args: argparse.Namespace) -> int:
    """Clear a domain's condition known to be a sensor fault (`--for`, `--reason`), or end
    its override (`--end`)."""
    if args.end:
        before = decider.call("GET", domain_path(ref))
        if not before.get("override"):
            print(f"{ref} has no override; nothing to end")
            return 0
        decider.call("POST", f"{domain_path(ref)}/override/release", mutating=True)
        print(f"ended the override of {ref} ({before['override']['text']})")
        print(f"its condition is now the rules' own: {before['override']['condition']}")
        return 0
    body: dict[str, Any] = {"reason": args.reason, "for_seconds": args.for_seconds}
    if args.by is not None:
        body["by"] = args.by
    answer = decider.call("POST", f"{domain_path(ref)}/override", body=body, mutating=True)
    shown = answer.get("override") or {}
    print(f"overrode {ref}: {shown.get('text', args.reason)}")
    print(f"placement reads it as {answer.get('condition', 'ok')} until then")
    return 0


def explain_placement(decider: Decider, args: argparse.Namespace) -> int:
    replica: dict[str, Any] = {"model": args.model, "profile": args.profile, "gpus": args.gpus}
    if args.power_watts is not None:
        replica["power_watts"] = args.power_watts
    if args.cpu_cores is not None:
        replica["cpu_cores"] = args.cpu_cores
    if args.replica_class is not None:
        replica["class"] = args.replica_class
    answer = decider.call(
        "POST", "/v1/placements", body={"replica": replica, "candidates": args.nodes}
    )
    if args.json:
        show_json(answer)
        return 0
    mode = answer.get("mode", "?")
    order = answer.get("order", [])
    rank = {node: index for index, node in enumerate(order, start=1)}
    gpus = f"{args.gpus} GPU{'' if args.gpus == 1 else 's'}"
    print(
        f"{mode} mode: a replica of {args.model} (profile {args.profile}, {gpus}) on "
        f"{len(args.nodes)} candidate{'' if len(args.nodes) == 1 else 's'}"
    )
    nodes = answer.get("nodes", [])
    rows = []
    for entry in nodes:
        headroom = entry.get("headroom_watts")
        rows.append(
            [
                entry["node"],
                "allowed" if entry.get("allowed") else "refused",
                f"~{kw(entry.get('estimate_watts'))} kW",
                f"condition {entry.get('condition', 'unknown')}",
                "no budget" if headroom is None else f"headroom {kw(headroom)} kW",
                f"rank {rank[entry['node']]}" if entry["node"] in rank else "",
            ]
        )
    lines = table(("NODE", "VERDICT", "ESTIMATE", "CONDITION", "HEADROOM", ""), rows, frozenset())
    print(lines[0])
    for entry, line in zip(nodes, lines[1:], strict=True):
        print(line)
        for reason in entry.get("reasons", []):
            print(f"    - {reason}")
        for reason in entry.get("would_refuse") or []:
            print(f"    - would refuse: {reason}")
        for words in entry.get("condition_evidence") or []:
            print(f"    - placed after ok nodes: {words}")
    print(f"order, best first: {', '.join(order) if order else 'none'}")
    print(answer.get("summary", ""))
    print_missing(answer.get("missing", []))
    return 0


def headroom(decider: Decider, profile: str, as_json: bool) -> int:
    answer = decider.call("GET", "/v1/headroom", params={"profile": profile})
    if as_json:
        show_json(answer)
        return 0
    print(f"profile {profile}: how many more replicas fit, per domain")
    rows = []
    for entry in sorted(answer.get("domains", []), key=domain_order):
        rows.append(fit_row(f"{entry['kind']}/{entry['domain']}", entry))
        rows += [fit_row(f"  phase {phase['phase']}", phase) for phase in entry.get("phases") or []]
    for line in table(("DOMAIN", "FITS", "WHAT BINDS"), rows, frozenset({1})):
        print(line)
    print_missing(answer.get("missing", []))
    return 0


def fit_row(label: str, entry: dict[str, Any]) -> list[str]:
    """One headroom row (a domain, or a three-phase pdu's phase): what fits, what binds."""
    fits = entry.get("fits")
    binds = "; ".join(
        bind["reason"] if bind.get("nodes", 1) <= 1 else f"{bind['reason']} ({bind['nodes']} nodes)"
        for bind in entry.get("binds", [])
    )
    return [label, "unbounded" if fits is None else str(fits), binds or "-"]


def profiles(decider: Decider, model: str, as_json: bool) -> int:
    """GET /v1/profiles/{model}: the model's profiles, best tokens per joule first."""
    answer = decider.call("GET", f"/v1/profiles/{quote(model, safe='/')}")
    if as_json:
        show_json(answer)
        return 0

    def figure(value: Any, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    print(answer.get("summary", f"model {model}"))
    rows = [
        [
            "-" if entry.get("rank") is None else str(entry["rank"]),
            str(entry["profile"]),
            str(entry["status"]),
            figure(entry.get("tokens_per_joule"), 3),
            figure(entry.get("tokens_per_second"), 1),
            figure(entry.get("watts"), 1),
            "-" if entry.get("replicas") is None else str(entry["replicas"]),
            figure(entry.get("age_seconds"), 0),
        ]
        for entry in answer.get("profiles", [])
    ]
    headers = ("RANK", "PROFILE", "STATUS", "TOKENS/J", "TOKENS/S", "WATTS", "REPLICAS", "AGE S")
    for line in table(headers, rows, frozenset({0, 3, 4, 5, 6, 7})):
        print(line)
    print_missing(answer.get("missing", []))
    return 0


def shedding_plan(decider: Decider, as_json: bool) -> int:
    answer = decider.call("GET", "/v1/shedding")
    if as_json:
        show_json(answer)
        return 0
    print(answer["summary"])
    rows = []
    for entry in answer.get("plan", []):
        moves = entry.get("moves", [])
        hot = entry.get("hot_seconds")
        hot_text = "-" if hot is None else f"{hot / 60:.1f}m"
        for move in moves or [None]:
            rows.append(
                [
                    entry["domain"],
                    hot_text,
                    "-" if move is None else move["reservation"],
                    "-" if move is None else f"{move['model']} ({move['class'] or 'no class'})",
                    "-" if move is None else f"{move['from']} -> {move['to']}",
                    "-" if move is None else kw(move["estimate_watts"]),
                ]
            )
    if rows:
        headers = ("DOMAIN", "HOT FOR", "MOVE", "MODEL (CLASS)", "FROM -> TO", "KW")
        for line in table(headers, rows, frozenset({1, 5})):
            print(line)
    for entry in answer.get("plan", []):
        print(f"{entry['domain']}: {entry['reason']}")
        for skipped in entry.get("skipped", []):
            print(f"  skipped {skipped['reservation']}: {skipped['reason']}")
        if entry.get("power_capping"):
            print(f"  or cap instead: {entry['power_capping']['reason']}")
    for capping in answer.get("power_capping", []):
        print(f"cap {capping['kind']}/{capping['domain']}: {capping['reason']}")
    print_missing(answer.get("missing", []))
    return 0


def failover_report(decider: Decider, ref: DomainRef, as_json: bool) -> int:
    answer = decider.call("GET", "/v1/failover", params={"domain": str(ref)})
    if as_json:
        show_json(answer)
        return 0
    print(answer["summary"])
    rows = []
    for entry in answer.get("domains", []):
        survivors = ", ".join(feed["pdu"] for feed in entry.get("surviving_feeds", [])) or "none"
        rows.append(
            [
                entry["domain"],
                kw(entry["load_watts"]),
                survivors,
                kw(entry.get("share_watts")),
                kw(entry.get("limit_watts")),
                "UNPOWERED" if entry.get("unpowered") else "OVER" if entry["over"] else "ok",
            ]
        )
    if rows:
        headers = ("DOMAIN", "LOAD KW", "SURVIVING FEEDS", "PER FEED KW", "LIMIT KW", "")
        for line in table(headers, rows, frozenset({1, 3, 4})):
            print(line)
    for entry in answer.get("domains", []):
        if entry["over"]:
            print(f"{entry['domain']}: {entry['reason']}")
            for move in entry.get("moves", []):
                print(
                    f"  move {move['reservation']} ({move['model']}, {kw(move['estimate_watts'])}"
                    f" kW) {move['from']} -> {move['to']}"
                )
    print_missing(answer.get("missing", []))
    return 0


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
