"""`check-config --prometheus`: the facility file's site signals run against a live Prometheus.

Every configured signal's query is run as its recording rule runs it (`stale_after` applied,
`Signal.bounded_query`), and the answer is held against the file's declared domains:

- **ok**: it returns series, each series' `domain_label` names a declared domain of the
  signal's kind, and every declared domain of that kind has at least one series;
- **broken**, and the command says which part: the query fails (a PromQL syntax error, a
  query Prometheus refuses or cannot finish in time), it returns no series (nothing scraped
  under that name), it returns a range vector or a scalar, some series map onto no declared
  domain (no `domain_label`, a value that is no domain name, or a domain the file does not
  declare: each such series is named), or some declared domains have no series.

A signal per phase of three-phase pdus (one with a `phase_label`) maps each series onto a
declared pdu's phase, `pdu/NAME L1`: a pdu that declares no phases, or a phase it does not
declare, maps nowhere, and every declared phase of every phased pdu should have a series.

The queries go through the decider's own reader (decider.prometheus_reader): the same
deadline per query, retries, basic auth or Authorization header from files, TLS. Before any
signal one probe query (`vector(1)`) tells a Prometheus that cannot be reached or is not
Prometheus from a broken signal.

Exit status (llmgw_facility.exit_status): 0 every file valid and every signal ok; 1 a signal
broken; 2 unusable input (a file refused, a bad Prometheus option, no facility file to take
signals from); 3 Prometheus could not be reached, did not answer in time, or is not
Prometheus. The files themselves are checked first, as plain `check-config` checks them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from decider import config as decider_config
from decider import facility as facility_file
from decider.config import (
    AuthorizationSettings,
    BasicAuthSettings,
    PrometheusSettings,
    TLSSettings,
)
from decider.facility import Facility, Signal, check_name
from decider.prometheus_reader import PrometheusReader, QueryError
from llmgw_common.yamlfile import ConfigError
from llmgw_facility.exit_status import EXIT_BAD_FILE, EXIT_UNREACHABLE
from llmgw_facility.local_files import check_config

#: `--prometheus` given without a URL: the Prometheus of the `--decider-config` file.
FROM_DECIDER = "from decider.yaml"
#: Per attempt (connect, and each read): a signal's query over a large site can take seconds.
DEFAULT_TIMEOUT_S = 10.0
#: A signal broken: check-config's status for a configuration that is wrong.
EXIT_SIGNAL_BROKEN = 1
#: The most series a report names one by one; the rest are counted.
MAX_NAMED = 10
#: A query every Prometheus-compatible server answers: tells "unreachable" from a bad signal.
PROBE_QUERY = "vector(1)"


# --- the command line -------------------------------------------------------------------------


def add_arguments(check: argparse.ArgumentParser) -> None:
    """`check-config`'s options for the live check, as one group of its `--help`."""
    live = check.add_argument_group(
        "against a live Prometheus",
        "Run every site signal of the facility files (--facility, or the one a "
        "--decider-config names) and check that it returns series that map onto the "
        "declared domains. Exit 0: all good; 1: a signal broken; 2: a file or option "
        "unusable; 3: Prometheus unreachable, too slow or not Prometheus.",
    )
    live.add_argument(
        "--prometheus",
        nargs="?",
        const=FROM_DECIDER,
        metavar="URL",
        help="Prometheus' base URL (a path prefix is kept); without URL, the prometheus "
        "section of the one --decider-config (its URL, timeout, retries, auth and TLS)",
    )
    live.add_argument(
        "--prometheus-timeout",
        type=_seconds,
        metavar="SECONDS",
        help=f"each query's connect and read timeout; its deadline is twice this plus 0.5 s "
        f"(default {DEFAULT_TIMEOUT_S:g})",
    )
    live.add_argument("--prometheus-user", metavar="NAME", help="basic auth user")
    live.add_argument(
        "--prometheus-password-file",
        type=Path,
        metavar="FILE",
        help="basic auth password, the file's first line",
    )
    live.add_argument(
        "--prometheus-credentials-file",
        type=Path,
        metavar="FILE",
        help="an Authorization header's credentials (a token), the file's first line",
    )
    live.add_argument(
        "--prometheus-authorization-type",
        metavar="TYPE",
        help="the Authorization header's type (default Bearer)",
    )
    live.add_argument("--prometheus-ca-file", type=Path, metavar="FILE", help="CA to trust")
    live.add_argument(
        "--prometheus-cert-file", type=Path, metavar="FILE", help="client certificate"
    )
    live.add_argument("--prometheus-key-file", type=Path, metavar="FILE", help="its key")
    live.add_argument(
        "--prometheus-insecure-skip-verify",
        action="store_true",
        help="do not check Prometheus' certificate (tests only)",
    )


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= 600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds, above 0, ≤ 600")
    return seconds


#: The options that set how to reach Prometheus, by their argparse names.
_OPTIONS = {
    "prometheus_timeout": "--prometheus-timeout",
    "prometheus_user": "--prometheus-user",
    "prometheus_password_file": "--prometheus-password-file",
    "prometheus_credentials_file": "--prometheus-credentials-file",
    "prometheus_authorization_type": "--prometheus-authorization-type",
    "prometheus_ca_file": "--prometheus-ca-file",
    "prometheus_cert_file": "--prometheus-cert-file",
    "prometheus_key_file": "--prometheus-key-file",
    "prometheus_insecure_skip_verify": "--prometheus-insecure-skip-verify",
}


def settings_from_options(args: argparse.Namespace) -> PrometheusSettings:
    """The Prometheus to query, as decider.yaml's `prometheus` section would give it;
    raises ValueError saying which option is wrong."""
    given = [option for name, option in _OPTIONS.items() if getattr(args, name)]
    if args.prometheus == FROM_DECIDER:
        if len(args.decider_config) != 1:
            raise ValueError(
                "--prometheus without a URL takes the Prometheus of one --decider-config; "
                f"give exactly one (got {len(args.decider_config)}), or give the URL"
            )
        if given:
            raise ValueError(
                f"{', '.join(given)}: the Prometheus comes from "
                f"{args.decider_config[0]}; give --prometheus URL to set it here instead"
            )
        try:
            return decider_config.load(args.decider_config[0]).prometheus
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    basic_auth = authorization = tls = None
    try:
        if args.prometheus_user or args.prometheus_password_file:
            if not (args.prometheus_user and args.prometheus_password_file):
                raise ValueError(
                    "--prometheus-user and --prometheus-password-file go together (basic auth)"
                )
            basic_auth = BasicAuthSettings(
                username=args.prometheus_user, password_file=args.prometheus_password_file
            )
        if args.prometheus_credentials_file or args.prometheus_authorization_type:
            if not args.prometheus_credentials_file:
                raise ValueError("--prometheus-authorization-type needs its credentials file")
            authorization = AuthorizationSettings(
                type=args.prometheus_authorization_type or "Bearer",
                credentials_file=args.prometheus_credentials_file,
            )
        if any(
            (
                args.prometheus_ca_file,
                args.prometheus_cert_file,
                args.prometheus_key_file,
                args.prometheus_insecure_skip_verify,
            )
        ):
            tls = TLSSettings(
                ca_file=args.prometheus_ca_file,
                cert_file=args.prometheus_cert_file,
                key_file=args.prometheus_key_file,
                insecure_skip_verify=args.prometheus_insecure_skip_verify,
            )
        settings = PrometheusSettings(
            url=args.prometheus,
            timeout=args.prometheus_timeout or DEFAULT_TIMEOUT_S,
            # One attempt: a check is run by hand, and its answer should come at once.
            retries=0,
            basic_auth=basic_auth,
            authorization=authorization,
            tls_config=tls,
        )
    except ValidationError as exc:
        raise ValueError("; ".join(_validation_message(error) for error in exc.errors())) from None
    for path in _named_files(settings):
        if not os.access(path, os.R_OK):
            raise ValueError(f"{path}: cannot be read")
    return settings


#: A settings field → the option that sets it, for messages.
_FIELD_OPTIONS = {
    "url": "--prometheus",
    "username": "--prometheus-user",
    "type": "--prometheus-authorization-type",
}


def _validation_message(error: Any) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    field_name = str(error["loc"][-1]) if error["loc"] else ""
    option = _FIELD_OPTIONS.get(field_name, f"--prometheus-{field_name.replace('_', '-')}")
    return f"{option}: {message}" if field_name else message


def _named_files(settings: PrometheusSettings) -> Iterable[Path]:
    if settings.basic_auth is not None:
        yield settings.basic_auth.password_file
    if settings.authorization is not None:
        yield settings.authorization.credentials_file
    if settings.tls_config is not None:
        tls = settings.tls_config
        yield from (path for path in (tls.ca_file, tls.cert_file, tls.key_file) if path)


# --- the check --------------------------------------------------------------------------------


@dataclass
class SignalReport:
    """What one signal's query gave, held against the declared domains."""

    name: str
    signal: Signal
    series: int = 0
    #: The declared domains (or `pdu/NAME PHASE`) that at least one series maps onto.
    covered: set[str] = field(default_factory=set)
    #: The query's failure, or an answer that is not one series per domain.
    failure: str | None = None
    #: (series as PromQL writes it, why it maps onto no declared domain)
    unmapped: list[tuple[str, str]] = field(default_factory=list)
    #: Declared domains of the signal's kind that no series covers.
    uncovered: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None and self.series > 0 and not self.unmapped and not self.uncovered


def check_signal(
    reader: PrometheusReader, facility: Facility, name: str, signal: Signal
) -> SignalReport:
    """Run one signal's query as its rule runs it and map its series onto domains."""
    report = SignalReport(name, signal)
    try:
        result = reader.query(signal.bounded_query())
    except QueryError as exc:
        report.failure = f"the query fails: {exc}"
        return report
    if not all(isinstance(item, dict) and "value" in item for item in result):
        shape = "a range vector" if result and isinstance(result[0], dict) else "a scalar"
        report.failure = (
            f"the query returns {shape}, not an instant vector of one series per {signal.kind}"
        )
        return report
    report.series = len(result)
    for item in result:
        labels = item.get("metric") or {}
        target, why = _target_of(labels, signal, facility)
        if target is not None:
            report.covered.add(target)
        else:
            report.unmapped.append((series_text(labels), why))
    report.unmapped.sort()  # Prometheus' order of an aggregation's series is its own
    report.uncovered = [
        target for target in _declared_targets(signal, facility) if target not in report.covered
    ]
    return report


def _phase_label(signal: Signal) -> str | None:
    """The label holding the phase, for a signal per phase of three-phase pdus."""
    return getattr(signal, "phase_label", None)


def _unit(signal: Signal) -> str:
    """What one series of the signal maps onto: a domain of its kind, or a pdu's phase."""
    return "pdu phase" if _phase_label(signal) else signal.kind


def _target_of(
    labels: dict[str, str], signal: Signal, facility: Facility
) -> tuple[str | None, str]:
    """(the declared domain, or `pdu/NAME PHASE`, the series maps onto; None and why not)."""
    kind, value = signal.kind, labels.get(signal.domain_label, "")
    if not value:
        return None, f"no {signal.domain_label} label: the rule drops it"
    try:
        check_name(value, kind)
    except ValueError as exc:
        return None, f"{kind}/{value} is no domain name: {exc}"
    domain = f"{kind}/{value}"
    declared = facility.domains.get(domain)
    if declared is None:
        return None, f"{domain} is not declared in the facility file"
    phase_label = _phase_label(signal)
    if phase_label is None:
        return domain, ""
    phase = labels.get(phase_label, "")
    if not declared.phases:
        return None, f"{domain} declares no phases"
    if phase not in declared.phases:
        shown = f"phase {phase!r}" if phase else f"no {phase_label} label"
        return None, f"{shown}: not one of {domain}'s phases ({', '.join(declared.phases)})"
    return f"{domain} {phase}", ""


def _declared_targets(signal: Signal, facility: Facility) -> list[str]:
    """What the signal should cover: the declared domains of its kind, or every phase of
    the declared pdus that have phases."""
    of_kind = {
        key: domain
        for key, domain in facility.domains.items()
        if key.partition("/")[0] == signal.kind
    }
    if _phase_label(signal) is None:
        return list(of_kind)
    return [f"{key} {phase}" for key, domain in of_kind.items() for phase in domain.phases]


def series_text(labels: dict[str, str]) -> str:
    """A series as PromQL writes it: `name{label="value", …}`."""
    name = labels.get("__name__", "")
    pairs = ", ".join(
        f'{key}="{value}"' for key, value in sorted(labels.items()) if key != "__name__"
    )
    return f"{name}{{{pairs}}}"


def describe(source: Path, report: SignalReport) -> tuple[bool, list[str]]:
    """(ok, lines) of one signal's report: one line when ok, else a line and its details."""
    signal = report.signal
    head = f"{source}: signals.{report.name}"
    unit = _unit(signal)
    if report.ok:
        return True, [
            f"{head}: ok: {report.series} series onto "
            f"{_count(len(report.covered), 'declared ' + unit)} "
            f"({', '.join(sorted(report.covered))})"
        ]
    query = " ".join(signal.bounded_query().split())
    if report.failure is not None:
        return False, [f"{head}: {report.failure}", f"  query: {query}"]
    if report.series == 0:
        return False, [
            f"{head}: returns no series: nothing in Prometheus matches the query (is the "
            "exporter scraped, and its metric and labels spelled as in the query?)",
            f"  query: {query}",
        ]
    lines = [
        f"{head}: does not map onto the declared {unit}s: {report.series} series, "
        f"{len(report.unmapped)} onto none of them; "
        f"{_count(len(report.uncovered), 'declared ' + unit)} with no series"
    ]
    for text, why in report.unmapped[:MAX_NAMED]:
        lines.append(f"  series {text}: {why}")
    if len(report.unmapped) > MAX_NAMED:
        lines.append(f"  … and {len(report.unmapped) - MAX_NAMED} more such series")
    if report.uncovered:
        more = len(report.uncovered) - MAX_NAMED
        lines.append(
            f"  declared, no series: {', '.join(report.uncovered[:MAX_NAMED])}"
            + (f" and {more} more" if more > 0 else "")
        )
    lines.append(f"  query: {query}")
    return False, lines


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"


def check_config_live(args: argparse.Namespace) -> int:
    """`check-config … --prometheus`: the files as plain check-config checks them, then
    every signal of every facility file against the live Prometheus."""
    try:
        settings = settings_from_options(args)
    except ValueError as exc:
        print(f"check-config --prometheus: {exc}", file=sys.stderr)
        return EXIT_BAD_FILE
    files_status = check_config(args.agent, args.facility, args.decider_config)
    facilities = list(_facilities(args.facility, args.decider_config))
    if not facilities:
        if files_status == 0:
            print(
                "check-config --prometheus: no facility file to take signals from: give "
                "--facility facility.yaml or --decider-config decider.yaml",
                file=sys.stderr,
            )
        return EXIT_BAD_FILE
    reader = PrometheusReader.from_settings(settings)
    try:
        return _check_all(reader, facilities, files_ok=files_status == 0)
    finally:
        reader.close()


def _facilities(
    facility_files: Sequence[Path], decider_files: Sequence[Path]
) -> Iterable[tuple[Path, Facility]]:
    """Each facility file that loads, named or named by a decider.yaml, once each; one
    that does not load was already reported by check_config."""
    paths = list(facility_files)
    for path in decider_files:
        try:
            paths.append(decider_config.load(path).facility)
        except ConfigError:
            continue
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        try:
            yield path, facility_file.load(path)
        except ConfigError:
            continue


def _check_all(
    reader: PrometheusReader, facilities: list[tuple[Path, Facility]], files_ok: bool
) -> int:
    try:
        reader.query(PROBE_QUERY)
    except QueryError as exc:
        print(
            f"check-config --prometheus: cannot check the signals: {exc}",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    broken = 0
    for path, facility in facilities:
        signals = facility.signals.configured()
        if not signals:
            print(f"{path}: no signals to check against {reader.url}")
        for name, signal in signals.items():
            ok, lines = describe(path, check_signal(reader, facility, name, signal))
            print("\n".join(lines), file=sys.stdout if ok else sys.stderr)
            broken += not ok
    if not files_ok:
        return EXIT_BAD_FILE
    return EXIT_SIGNAL_BROKEN if broken else 0
