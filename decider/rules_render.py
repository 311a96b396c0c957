"""Render the site's recording rules from the facility file (DESIGN.md §6, docs/rules.md).

One rule group, `llmgw-site.rules`, evaluated every 30 s like the conditions it feeds:

- each configured signal, one rule into its contract series, per domain:

  | signal | series | per domain |
  |---|---|---|
  | `inlet_temp_c` | `llmgw:domain_site_inlet_temperature_celsius` | `max`: the hottest reading |
  | `power_watts` | `llmgw:domain_site_power_watts` | `sum`: every meter of the domain |
  | `cooling_alarm` | `llmgw:domain_cooling_alarm` | 1 while any reading is above 0, else 0 |
  | `phase_power_watts` | `llmgw:domain_phase_site_power_watts` | `sum` per pdu and phase |

  The query's `domain_label` becomes `domain` (`label_replace`), `kind` is set by the rule's
  `labels:`, and a series whose `domain_label` is empty or missing is dropped; the phase
  signal's `phase_label` becomes `phase` likewise (a series without one is dropped). With
  `stale_after`, every instant selector of the query reads only samples that recent
  (`decider.promql.bound_age`); without it, Prometheus' own staleness applies.
- `llmgw:domain_declared:info` = 1 for every declared domain;
- `llmgw:threshold_default:value{threshold}` for every threshold of `defaults.thresholds`:
  the site-wide value, which every domain without its own takes, declared or not;
- `llmgw:threshold_kind_default:value{kind, threshold}` for every threshold and racks share
  a kind of `defaults.kinds` sets: the value for every domain of that kind without its own;
- `llmgw:domain_threshold_override:value{threshold}` for every threshold a declared domain
  sets itself. A threshold the file sets nowhere is left to the rules' built-in default;
- `llmgw:domain_metered_other_watts:value{kind, domain}` = `other_watts` for every declared
  domain whose site meter already includes them (`measured_includes_other: true`): the rules
  take them off the meter's reading, so that the decider's load counts them once.

The Jinja2 template (`templates/llmgw-site.rules.yml.j2`) lays the rules out; the
rendered text is read back and must be exactly these rules, so no value can escape
its place in the YAML.
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import yaml

from decider import promql
from decider.facility import THRESHOLD_LABELS, Facility, PhaseSignal, Signal
from llmgw_common.yamlfile import load_text

GROUP = "llmgw-site.rules"
INTERVAL = "30s"
TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE = "llmgw-site.rules.yml.j2"


@dataclass(frozen=True)
class SignalSeries:
    """How a signal becomes its contract series."""

    record: str
    aggregation: str  # max | sum
    alarm: bool = False  # 0/1: above 0 is an alarm


SIGNAL_SERIES: dict[str, SignalSeries] = {
    "inlet_temp_c": SignalSeries("llmgw:domain_site_inlet_temperature_celsius", "max"),
    "power_watts": SignalSeries("llmgw:domain_site_power_watts", "sum"),
    "cooling_alarm": SignalSeries("llmgw:domain_cooling_alarm", "max", alarm=True),
    "phase_power_watts": SignalSeries("llmgw:domain_phase_site_power_watts", "sum"),
}
#: The label a phase signal's series carry the phase in (L1, L2, L3), as the decider reads it.
PHASE_LABEL = "phase"
DECLARED = "llmgw:domain_declared:info"
OVERRIDE = "llmgw:domain_threshold_override:value"
DEFAULT = "llmgw:threshold_default:value"
KIND_DEFAULT = "llmgw:threshold_kind_default:value"
METERED_OTHER = "llmgw:domain_metered_other_watts:value"


class RenderError(Exception):
    """The rendered text does not read back as the rules it should hold (a bug, not a file)."""


@dataclass(frozen=True)
class Rule:
    """One recording rule as it will be written."""

    record: str
    expr: str
    labels: dict[str, str]
    comment: list[str] = field(default_factory=list)
    heading: str = ""  # starts a section of the file

    def as_yaml(self) -> dict[str, object]:
        return {"record": self.record, "expr": self.expr, "labels": self.labels}


def number(value: float) -> str:
    """A PromQL number literal that reads back as exactly `value`: 26, 0.25, 1e+20."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _tidy(query: str, indent: str) -> str:
    """The query without comments, trailing spaces or blank lines, lines after the first
    indented by `indent`; a raw string over several lines is kept exactly as it is."""
    found = promql.tokens(query)
    text = "".join(token.text for token in found if token.kind != "comment")
    if any(token.kind == "string" and "\n" in token.text for token in found):
        return text.strip()
    lines = [line.rstrip() for line in textwrap.dedent(text).strip().splitlines()]
    return textwrap.indent("\n".join(line for line in lines if line), indent).lstrip()


def signal_expr(signal: Signal, series: SignalSeries) -> str:
    """The PromQL of one signal's rule (see the module docstring)."""
    compare = " > bool 0" if series.alarm else ""
    if not isinstance(signal, PhaseSignal):
        query = _tidy(signal.bounded_query(), "    ")
        return (
            f"{series.aggregation} by (domain) (\n"
            f"  label_replace(\n"
            f"    {query},\n"
            f'    "domain", "$1", {json.dumps(signal.domain_label)}, "(.*)"\n'
            f"  )\n"
            f"){compare}\n"
            f"unless on (domain) vector(1)"
        )
    # Per pdu and phase: the phase's label copied to `phase` as well (left as it is where the
    # query already calls it that), and a series without either dropped.
    copies = [("domain", signal.domain_label)]
    if signal.phase_label != PHASE_LABEL:
        copies.append((PHASE_LABEL, signal.phase_label))
    inner = _tidy(signal.bounded_query(), "  " * (len(copies) + 1))
    for depth in range(len(copies), 0, -1):  # the innermost copy first
        target, source = copies[depth - 1]
        pad = "  " * depth
        inner = (
            f"label_replace(\n"
            f"{pad}  {inner},\n"
            f'{pad}  {json.dumps(target)}, "$1", {json.dumps(source)}, "(.*)"\n'
            f"{pad})"
        )
    return (
        f"{series.aggregation} by (domain, {PHASE_LABEL}) (\n"
        f"  {inner}\n"
        f"){compare}\n"
        f"unless on (domain) vector(1)\n"
        f"unless on ({PHASE_LABEL}) vector(1)"
    )


def _signal_comment(name: str, signal: Signal) -> list[str]:
    lines = [f"signals.{name}: per {signal.kind}, from label {signal.domain_label!r}:"]
    if isinstance(signal, PhaseSignal):
        lines[0] = (
            f"signals.{name}: per {signal.kind} and phase, from labels "
            f"{signal.domain_label!r} and {signal.phase_label!r}:"
        )
    lines += [f"  {line}" for line in signal.query.strip().splitlines()]
    if signal.stale_after is None:
        lines.append("no stale_after: Prometheus' staleness (a scrape failure, 5m lookback)")
    else:
        window = promql.format_duration(signal.stale_after)
        lines.append(f"stale_after {window}: readings older than {window} are dropped")
    return lines


def site_rules(facility: Facility) -> list[Rule]:
    """Every rule of the group, in order: signals, declared domains, thresholds (site-wide,
    per kind, per domain), other watts inside a meter."""
    rules: list[Rule] = []
    for position, (name, signal) in enumerate(facility.signals.configured().items()):
        series = SIGNAL_SERIES[name]
        rules.append(
            Rule(
                record=series.record,
                expr=signal_expr(signal, series),
                labels={"kind": signal.kind},
                comment=_signal_comment(name, signal),
                heading="site signals (signals:)" if position == 0 else "",
            )
        )
    declared = facility.declared()
    for position, (ref, _) in enumerate(declared):
        rules.append(
            Rule(
                record=DECLARED,
                expr="vector(1)",
                labels={"kind": ref.kind, "domain": ref.name},
                heading="declared domains (domains:)" if position == 0 else "",
            )
        )
    for position, (key, value) in enumerate(facility.defaults.thresholds.written().items()):
        rules.append(
            Rule(
                record=DEFAULT,
                expr=f"vector({number(value)})",
                labels={"threshold": THRESHOLD_LABELS[key]},
                heading="site-wide thresholds (defaults.thresholds)" if position == 0 else "",
            )
        )
    first = True
    for kind, kind_defaults in facility.defaults.kinds.items():
        thresholds = kind_defaults.thresholds.written()
        written = {THRESHOLD_LABELS[key]: value for key, value in thresholds.items()}
        written |= kind_defaults.written_shares()
        for label, value in written.items():
            rules.append(
                Rule(
                    record=KIND_DEFAULT,
                    expr=f"vector({number(value)})",
                    labels={"kind": kind, "threshold": label},
                    heading="thresholds per kind (defaults.kinds)" if first else "",
                )
            )
            first = False
    first = True
    for ref, domain in declared:
        for key, value in domain.thresholds.written().items():
            rules.append(
                Rule(
                    record=OVERRIDE,
                    expr=f"vector({number(value)})",
                    labels={
                        "kind": ref.kind,
                        "domain": ref.name,
                        "threshold": THRESHOLD_LABELS[key],
                    },
                    heading="per-domain thresholds (domains: …: thresholds:)" if first else "",
                )
            )
            first = False
    metered = [(ref, domain) for ref, domain in declared if domain.measured_includes_other]
    for position, (ref, domain) in enumerate(metered):
        rules.append(
            Rule(
                record=METERED_OTHER,
                expr=f"vector({number(domain.other_watts)})",
                labels={"kind": ref.kind, "domain": ref.name},
                heading="other watts inside a site meter (measured_includes_other)"
                if position == 0
                else "",
            )
        )
    return rules


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_:.()/-]*")
#: Words YAML 1.1 reads as booleans or null: written plain they would not be strings.
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})


def _quote(value: str) -> str:
    """A YAML double-quoted scalar (JSON's escapes are YAML's)."""
    return json.dumps(value)


def _scalar(value: str) -> str:
    """`value` plain where YAML reads it back as that string (`rack`, `vector(26)`), else quoted."""
    if _PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS:
        return value
    return _quote(value)


def _literal_safe(text: str) -> bool:
    return all(
        char == "\n" or (char.isprintable() and char not in "\x85\u2028\u2029\ufeff")
        for char in text
    ) and not any(line != line.rstrip() or not line for line in text.split("\n"))


def _yaml_block(text: str, indent: int) -> str:
    """`|-` and the lines, indented, where YAML keeps them exactly; else a quoted scalar."""
    if "\n" not in text or not _literal_safe(text):
        return _scalar(text)
    pad = " " * indent
    return "|-\n" + "\n".join(pad + line for line in text.split("\n"))


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["scalar"] = _scalar
    environment.filters["yaml_block"] = _yaml_block
    return environment


def render(facility: Facility, source: str = "facility.yaml") -> str:
    """The rule file's text. `source` names the facility file in the header comment."""
    rules = site_rules(facility)
    text = (
        _environment()
        .get_template(TEMPLATE)
        .render(
            group=GROUP,
            interval=INTERVAL,
            rules=rules,
            source=str(source).splitlines() or [""],
        )
    )
    expected = {
        "groups": [{"name": GROUP, "interval": INTERVAL, "rules": [r.as_yaml() for r in rules]}]
    }
    try:
        read_back = load_text(text)
    except yaml.YAMLError as exc:
        raise RenderError(f"the rendered rules are not YAML: {exc}") from exc
    if read_back != expected:
        raise RenderError("the rendered rules do not read back as the rules rendered")
    return text
