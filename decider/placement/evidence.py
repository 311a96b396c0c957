"""A domain's thermal evidence in words (issue 17 part 3; DESIGN.md §5's "rack r12-07 is hot
(inlet 31 °C for 6 min)"): what the refusal of a hot domain (decider.placement.hot) and the
down-score of a warm one say, with each figure and how long.

    rack r12-07 hot: inlet 33.1 °C over its 32 °C hot threshold for 6 min
    row 12 hot: cooling unit in alarm for 3 min
    rack r12-08 warm: 3 of 32 GPUs thermally throttled for 40 s

Plain: it reads decider.snapshot.Evidence (the rules' figures, rules/domain.yml and
rules/conditions.yml) and imports no rule. Missing data never blocks, nor does it change a
decision: a figure Prometheus does not have is left out of the words, and a domain with no
evidence gets None, the caller's plain text ("rack r12-08 hot (reading 12s old)").
"""

from __future__ import annotations

from dataclasses import replace

from decider.facility import DomainRef
from decider.snapshot import Condition, Evidence


def duration(seconds: float) -> str:
    """`40 s`, `6 min`, `2 h 5 min`: how long, to the minute past the first one."""
    if seconds < 60:
        return f"{max(seconds, 0):.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h" if not minutes else f"{hours} h {minutes} min"


def _celsius(value: float) -> str:
    return f"{value:.1f} °C" if value != round(value) else f"{value:.0f} °C"


def _share(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"


def _gpus(count: float, evidence: Evidence, what: str) -> str:
    of = "" if evidence.gpus is None else f" of {evidence.gpus:.0f}"
    return f"{count:.0f}{of} GPUs {what}"


def _hot_signs(evidence: Evidence) -> list[str]:
    """What holds the domain hot now, each with its figure and threshold."""
    signs = []
    inlet, hot = evidence.inlet_celsius, evidence.inlet_hot_celsius
    if inlet is not None and hot is not None and inlet >= hot:
        signs.append(f"inlet {_celsius(inlet)} over its {_celsius(hot)} hot threshold")
    if evidence.cooling_alarm is not None and evidence.cooling_alarm >= 1:
        signs.append("cooling unit in alarm")
    throttled, limit = evidence.gpus_thermally_throttled, evidence.throttled_hot_ratio
    if throttled and evidence.gpus and limit is not None and throttled / evidence.gpus >= limit:
        signs.append(_gpus(throttled, evidence, f"thermally throttled (hot from {_share(limit)})"))
    ratio, share = evidence.racks_hot_ratio, evidence.racks_hot_share
    if ratio is not None and share is not None and ratio > share:
        signs.append(f"{_share(ratio)} of its racks hot (hot above {_share(share)})")
    return signs


def _warm_signs(evidence: Evidence) -> list[str]:
    """What holds the domain warm now (or what of a hot one's is past the warm marks)."""
    signs = []
    inlet, warm = evidence.inlet_celsius, evidence.inlet_warm_celsius
    if inlet is not None and warm is not None and inlet >= warm:
        signs.append(f"inlet {_celsius(inlet)} over its {_celsius(warm)} warm threshold")
    if evidence.cooling_alarm is not None and evidence.cooling_alarm >= 1:
        signs.append("cooling unit in alarm")
    if evidence.gpus_thermally_throttled:
        signs.append(_gpus(evidence.gpus_thermally_throttled, evidence, "thermally throttled"))
    if evidence.gpus_near_slowdown:
        signs.append(
            _gpus(evidence.gpus_near_slowdown, evidence, "near their slowdown temperature")
        )
    ratio, share = evidence.racks_warm_ratio, evidence.racks_warm_share
    if ratio is not None and share is not None and ratio > share:
        signs.append(f"{_share(ratio)} of its racks warm or hot (warm above {_share(share)})")
    return signs


def describe(
    ref: DomainRef,
    condition: Condition,
    evidence: Evidence | None,
    seconds: float | None = None,
) -> str | None:
    """The words for a `warm` or `hot` domain: its evidence and for how long (`seconds`,
    how long it has been in this condition); None without evidence (the caller keeps its
    plain words), and for `ok` and `unknown`. A hot domain whose figures are now below its
    thresholds (it stays hot until every signal has been clear for 5 minutes, docs/rules.md)
    names its inlet as it is."""
    if condition not in ("warm", "hot"):
        return None
    signs: list[str] = []
    if evidence is not None:
        signs = _hot_signs(evidence) if condition == "hot" else _warm_signs(evidence)
        if not signs and condition == "hot":
            signs = _warm_signs(evidence)
        if not signs and evidence.inlet_celsius is not None:
            signs = [f"inlet {_celsius(evidence.inlet_celsius)}, cooling down"]
    if not signs:
        return None
    since = "" if seconds is None else f" for {duration(seconds)}"
    return f"{ref.kind} {ref.name} {condition}: {', '.join(signs)}{since}"


def of(
    condition: Condition, evidence: Evidence | None, hot_seconds: float | None
) -> Evidence | None:
    """What a domain state keeps (decider.placement.states): for a warm or hot domain, its
    evidence with how long it has been hot (the `hot` part's `hot_seconds`); None for any
    other, or when there is neither, so that an ok domain's state never changes with the
    readings it does not show."""
    if condition not in ("warm", "hot") or (evidence is None and hot_seconds is None):
        return None
    if hot_seconds is None:
        return evidence
    return replace(evidence or Evidence(), hot_seconds=hot_seconds)


def words(ref: DomainRef, condition: Condition, evidence: Evidence | None) -> str | None:
    """`describe`, with how long read where it is kept: a hot domain's `hot_seconds`, a warm
    one's `warm_seconds`."""
    if evidence is None:
        return describe(ref, condition, None)
    seconds = evidence.hot_seconds if condition == "hot" else evidence.warm_seconds
    return describe(ref, condition, evidence, seconds)
