"""Reading the answers of the decider's queries: an instant vector's series checked one by
one, then each part's data (decider.snapshot.PARTS) made of them.

One bad series never costs more than itself (issue 16, item 3): a series with a bad label
(a kind that is not a domain kind, a missing `node` or `domain`), a value that is not a
finite number (NaN, ±Inf, text), a negative power, GPU count or profile figure, or a GPU
count that is not a whole number, is left out and named in the part's `left_out` note
(shown in every answer's `missing`); the rest of the part is used. The domain or node it
was about then reads as not measured, not counted: what the decider does for a reading
Prometheus does not have. Only an answer that is not an instant vector at all fails the
part, which then keeps its previous data until it is stale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from decider.facility import KINDS, PHASES, DomainRef, Kind
from decider.giving_way import Pause, no_pause, paced
from decider.prometheus_reader import QueryError
from decider.snapshot import (
    EVIDENCE_FIGURES,
    Condition,
    DomainPeak,
    Evidence,
    ProfileFigures,
)

#: A domain showing two conditions at once (two rulers, or a state set read half written
#: where a ruler's write is no transaction: vmalert, docs/rules.md)
#: counts as the worse one.
CONDITION_RANK: dict[str, int] = {"unknown": 0, "ok": 1, "warm": 2, "hot": 3}


@dataclass(frozen=True, slots=True)
class Sample:
    labels: Mapping[str, str]
    value: float


def read_samples(result: Any, dropped: Dropped, pause: Pause = no_pause) -> list[Sample]:
    """An instant vector's series with a finite value; a series that has no string labels,
    no [time, value] pair or a value that is not a finite number is left out into
    `dropped`. Raises QueryError when `result` is not a list of series at all. `pause` is
    called every PAUSE_EVERY series (decider.giving_way)."""
    if not isinstance(result, list):
        raise QueryError(
            f"the result is a {type(result).__name__}, not an instant vector (a list of series)"
        )
    samples: list[Sample] = []
    for index, item in enumerate(paced(result, pause)):
        metric = item.get("metric") if isinstance(item, dict) else None
        pair = item.get("value") if isinstance(item, dict) else None
        if not isinstance(metric, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in metric.items()
        ):
            dropped.note(f"series {index} has no `metric` object of string labels")
            continue
        if not isinstance(pair, list) or len(pair) != 2:
            dropped.note(f"series {_show(metric)} has no `value` [time, value] pair")
            continue
        number = _finite(pair[1])
        if number is None:
            dropped.note(f"series {_show(metric)} has value {_value(pair[1])}, not a finite number")
            continue
        samples.append(Sample(metric, number))
    return samples


def _value(raw: Any) -> str:
    """A sample value as a note shows it: short, on one line."""
    shown = repr(raw)
    return shown if len(shown) <= 20 else shown[:19] + "…"


def _finite(raw: Any) -> float | None:
    """A sample value (Prometheus sends it as a string) as a finite float, else None."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        number = float(raw)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _show(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{key}="{value}"' for key, value in sorted(labels.items())) + "}"


class Dropped:
    """The series a part left out, each with why: counted, the first few named."""

    #: How many left-out series a note names; the rest are counted.
    NAMED = 3

    def __init__(self) -> None:
        self.count = 0
        self.named: list[str] = []

    def add(self, sample: Sample, why: str) -> None:
        self.note(f"{_show(sample.labels)}: {why}")

    def note(self, what: str) -> None:
        if self.count < self.NAMED:
            self.named.append(what)
        self.count += 1

    def message(self) -> str | None:
        if not self.count:
            return None
        more = f"; and {self.count - len(self.named)} more" if self.count > len(self.named) else ""
        return f"left out {self.count} bad series: {'; '.join(self.named)}{more}"


def _domain(sample: Sample, dropped: Dropped) -> DomainRef | None:
    kind = sample.labels.get("kind", "")
    name = sample.labels.get("domain", "")
    if kind not in KINDS:
        dropped.add(sample, f"kind {kind!r} is not one of {', '.join(KINDS)}")
        return None
    if not name:
        dropped.add(sample, "no `domain` label")
        return None
    return DomainRef(cast(Kind, kind), name)


def _node(sample: Sample, dropped: Dropped) -> str | None:
    node = sample.labels.get("node", "")
    if not node:
        dropped.add(sample, "no `node` label")
    return node or None


#: Why a value cannot be what a part reads, or None when it can.
Check = Callable[[float], str | None]


def _any_finite(_value: float) -> str | None:
    return None


def _not_negative(value: float) -> str | None:
    return f"{value:g} is negative" if value < 0 else None


def _whole_count(value: float) -> str | None:
    if value < 0 or not value.is_integer():
        return f"{value:g} GPUs, not a whole number"
    return None


#: What each per-domain or per-node part accepts beside a finite number.
CHECKS: dict[str, Check] = {
    "measured": _not_negative,  # watts
    "ages": _any_finite,  # seconds; a clock a little ahead reads as a little under zero
    "hot": _any_finite,
    "gpus": _whole_count,
    "limits": _not_negative,  # watts
    "min_limits": _not_negative,  # watts
    "profiles": _not_negative,  # tokens per joule, per second, watts, units
}


def _per_domain(samples: list[Sample], dropped: Dropped, check: Check) -> dict[DomainRef, float]:
    # A duplicate (two rulers writing one series) keeps the larger: more power, older age.
    values: dict[DomainRef, float] = {}
    for sample in samples:
        if (why := check(sample.value)) is not None:
            dropped.add(sample, why)
        elif (domain := _domain(sample, dropped)) is not None:
            values[domain] = max(sample.value, values.get(domain, sample.value))
    return values


def _per_node(samples: list[Sample], dropped: Dropped, check: Check) -> dict[str, float]:
    values: dict[str, float] = {}
    for sample in samples:
        if (why := check(sample.value)) is not None:
            dropped.add(sample, why)
        elif (node := _node(sample, dropped)) is not None:
            values[node] = max(sample.value, values.get(node, sample.value))
    return values


def parse_part(part: str, samples: list[Sample], dropped: Dropped, pause: Pause = no_pause) -> Any:
    """One part's data, from its query's series."""
    if part == "membership":  # 60,000 series at 10,000 nodes: it gives way as it goes
        nodes: dict[str, set[DomainRef]] = {}
        for sample in paced(samples, pause):
            node = _node(sample, dropped)
            domain = _domain(sample, dropped) if node is not None else None
            if node is not None and domain is not None:
                nodes.setdefault(node, set()).add(domain)
        return {node: tuple(sorted(domains)) for node, domains in nodes.items()}
    if part == "inventory":
        found = (_domain(sample, dropped) for sample in samples)
        return frozenset(domain for domain in found if domain is not None)
    if part == "conditions":
        conditions: dict[DomainRef, Condition] = {}
        half_written: set[DomainRef] = set()
        for sample in samples:
            if "condition" not in sample.labels:  # the query's mark: none at 1
                if (domain := _domain(sample, dropped)) is not None:
                    half_written.add(domain)
                continue
            condition = sample.labels["condition"]
            if condition not in CONDITION_RANK:
                dropped.add(sample, f"condition {condition!r} is not one of ok, warm, hot, unknown")
                continue
            domain = _domain(sample, dropped)
            if domain is None:
                continue
            held = conditions.get(domain)
            if held is None or CONDITION_RANK[condition] > CONDITION_RANK[held]:
                conditions[domain] = cast(Condition, condition)
        return ConditionsRead(conditions, frozenset(half_written - conditions.keys()))
    if part == "measured":
        return _measured(samples, dropped)
    if part in ("ages", "hot"):
        return _per_domain(samples, dropped, CHECKS[part])
    if part == "gpus":
        counts = _per_node(samples, dropped, CHECKS[part])
        return {node: int(count) for node, count in counts.items()}
    if part in ("limits", "min_limits"):
        return _per_node(samples, dropped, CHECKS[part])
    if part == "profiles":
        return _profiles(samples, dropped)
    if part == "cpus":
        return _cpu_models(samples, dropped)
    if part == "evidence":
        return _evidence(samples, dropped)
    if part == "peaks":
        return _peaks(samples, dropped)
    raise AssertionError(f"no parser for part {part!r}")


#: Evidence figures that may be below zero: a temperature (a threshold set low, a cold aisle).
_SIGNED_EVIDENCE = frozenset({"inlet_celsius", "inlet_warm_celsius", "inlet_hot_celsius"})


def _evidence(samples: list[Sample], dropped: Dropped) -> dict[DomainRef, Evidence]:
    """Domain → its Evidence, from series labelled {kind, domain, figure}; a series with an
    unknown figure, or a count, share or duration below zero, is left out alone. Two series
    of one figure (two rulers) keep the larger."""
    figures: dict[DomainRef, dict[str, float]] = {}
    for sample in samples:
        figure = sample.labels.get("figure", "")
        if figure not in EVIDENCE_FIGURES:
            dropped.add(sample, f"figure {figure!r} is not an evidence figure")
            continue
        if figure not in _SIGNED_EVIDENCE and (why := _not_negative(sample.value)) is not None:
            dropped.add(sample, why)
            continue
        domain = _domain(sample, dropped)
        if domain is None:
            continue
        found = figures.setdefault(domain, {})
        found[figure] = max(sample.value, found.get(figure, sample.value))
    return {domain: Evidence(**found) for domain, found in figures.items()}


def _cpu_models(samples: list[Sample], dropped: Dropped) -> dict[str, tuple[str, ...]]:
    """Node → its CPU models, sorted; a series with no `model` label is left out alone."""
    models: dict[str, set[str]] = {}
    for sample in samples:
        model = sample.labels.get("model", "")
        if not model:
            dropped.add(sample, "no `model` label")
        elif (node := _node(sample, dropped)) is not None:
            models.setdefault(node, set()).add(model)
    return {node: tuple(sorted(found)) for node, found in models.items()}


PROFILE_FIGURES = ("tokens_per_joule", "tokens_per_second", "watts", "units")


def _profiles(samples: list[Sample], dropped: Dropped) -> dict[tuple[str, str], dict[str, float]]:
    """(model, profile) → {figure: value}; units with no model or profile name (docs/energy.md)
    are no profile anyone can ask for, and are left out without a note."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for sample in samples:
        model = sample.labels.get("model", "")
        profile = sample.labels.get("profile", "")
        figure = sample.labels.get("figure", "")
        if not (model and profile and figure in PROFILE_FIGURES):
            continue
        if (why := CHECKS["profiles"](sample.value)) is not None:
            dropped.add(sample, why)
            continue
        found.setdefault((model, profile), {})[figure] = sample.value
    return found


def merge_profiles(
    read: Mapping[tuple[str, str], Mapping[str, float]],
    previous: Mapping[tuple[str, str], ProfileFigures],
    now: float,
    keep_seconds: float,
) -> dict[tuple[str, str], ProfileFigures]:
    """What was read now (those with a tokens per joule), and the profiles read before that
    Prometheus no longer has, with their old read time, for `keep_seconds`."""
    merged: dict[tuple[str, str], ProfileFigures] = {}
    for key, figures in read.items():
        ratio = figures.get("tokens_per_joule")
        if ratio is None:
            continue
        units = figures.get("units")
        merged[key] = ProfileFigures(
            tokens_per_joule=ratio,
            tokens_per_second=figures.get("tokens_per_second"),
            watts=figures.get("watts"),
            units=int(units) if units is not None and units >= 1 else None,
            read_at=now,
        )
    for key, old in previous.items():
        if key not in merged and now - old.read_at <= keep_seconds:
            merged[key] = old
    return merged


@dataclass(frozen=True)
class MeasuredRead:
    """The measured part as read: each domain's measured power (llmgw_domain_measured_watts),
    and each phase's of a three-phase pdu where a site signal measures it
    (llmgw:domain_phase_site_power_watts), by (pdu name, phase)."""

    domains: dict[DomainRef, float]
    phases: dict[tuple[str, str], float]


def _measured(samples: list[Sample], dropped: Dropped) -> MeasuredRead:
    """Series with a `phase` label are a phase's, the others a domain's. A phase series of
    another kind than pdu, or whose phase is not L1, L2 or L3, is left out alone; two series
    of one phase (two rulers) keep the larger."""
    whole: list[Sample] = []
    phases: dict[tuple[str, str], float] = {}
    for sample in samples:
        if "phase" not in sample.labels:
            whole.append(sample)
            continue
        phase = sample.labels["phase"]
        if (why := _not_negative(sample.value)) is not None:
            dropped.add(sample, why)
        elif phase not in PHASES:
            dropped.add(sample, f"phase {phase!r} is not one of {', '.join(PHASES)}")
        elif (domain := _domain(sample, dropped)) is None:
            continue
        elif domain.kind != "pdu":
            dropped.add(sample, f"a {domain.kind} has no phases: only a pdu has")
        else:
            key = (domain.name, phase)
            phases[key] = max(sample.value, phases.get(key, sample.value))
    return MeasuredRead(_per_domain(whole, dropped, CHECKS["measured"]), phases)


@dataclass(frozen=True)
class ConditionsRead:
    """The conditions part as read: each domain's condition, and the domains whose state set
    was read half written (no condition at 1)."""

    conditions: dict[DomainRef, Condition]
    half_written: frozenset[DomainRef]


def settle_conditions(
    read: ConditionsRead, previous: Mapping[DomainRef, Condition]
) -> tuple[dict[DomainRef, Condition], str | None]:
    """The conditions to use: as read, and for a domain still read half written, the
    condition it had before (none: unknown), with a note saying so."""
    conditions = dict(read.conditions)
    if not read.half_written:
        return conditions, None
    for domain in read.half_written:
        if domain in previous:
            conditions[domain] = previous[domain]
    first = min(read.half_written)
    return conditions, (
        f"{len(read.half_written)} domain(s) read with no condition at 1 twice (a state set "
        f"half written), e.g. {first}: each keeps its previous condition, else unknown"
    )


@dataclass(frozen=True)
class PeaksRead:
    """The peaks part as read (decider.peaks): per domain its measured peak and history, per
    (model, profile) the peak of one replica."""

    domains: dict[DomainRef, DomainPeak]
    units: dict[tuple[str, str], float]


#: The figures of the peaks part, by its `figure` label: of a domain, or of a model profile.
PEAK_DOMAIN_FIGURES = ("peak_watts", "history_seconds", "capped_share")
PEAK_UNIT_FIGURE = "unit_peak_watts"


def _peaks(samples: list[Sample], dropped: Dropped) -> PeaksRead:
    """A negative figure, or an unknown one, is left out alone; a unit series with no model or
    profile name (docs/energy.md) is no profile anyone asks for, left out without a note. Two
    series of one figure keep the larger: more power, more history."""
    domains: dict[DomainRef, dict[str, float]] = {}
    units: dict[tuple[str, str], float] = {}
    for sample in samples:
        figure = sample.labels.get("figure", "")
        if figure not in (*PEAK_DOMAIN_FIGURES, PEAK_UNIT_FIGURE):
            dropped.add(sample, f"figure {figure!r} is not a peaks figure")
        elif (why := _not_negative(sample.value)) is not None:
            dropped.add(sample, why)
        elif figure == PEAK_UNIT_FIGURE:
            key = (sample.labels.get("model", ""), sample.labels.get("profile", ""))
            if all(key):
                units[key] = max(sample.value, units.get(key, sample.value))
        elif (domain := _domain(sample, dropped)) is not None:
            found = domains.setdefault(domain, {})
            found[figure] = max(sample.value, found.get(figure, sample.value))
    return PeaksRead({domain: DomainPeak(**figures) for domain, figures in domains.items()}, units)
