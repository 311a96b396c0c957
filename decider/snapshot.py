"""What the decider knows of Prometheus: an immutable snapshot, replaced whole on each refresh.

The refresher (`decider.refresher`) reads the rules' series (docs/rules.md) in parts; each
part keeps the time of its last successful read, so one failing query ages that part alone.
A part is used only while it is younger than its staleness limit (decider.yaml
`staleness`); an older part counts as missing, and the answers say so (DESIGN.md §5:
missing data never blocks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from decider.facility import DomainRef

Condition = Literal["ok", "warm", "hot", "unknown"]

#: The parts of a snapshot, each read by its own query, and what each one holds.
PARTS: dict[str, str] = {
    "membership": "which domains each node belongs to (llmgw:node_domain:membership)",
    "inventory": "the known domains (llmgw_domain_info)",
    "measured": "domain measured power (llmgw_domain_measured_watts), and three-phase pdus' "
    "per phase where a site signal measures it (llmgw:domain_phase_site_power_watts)",
    "conditions": "domain conditions (llmgw_domain_condition)",
    "ages": "domain reading ages (llmgw_domain_reading_age_seconds)",
    "gpus": "each node's GPU count (llmgw:node_gpus:count)",
    "limits": "each node's enforced GPU power limit (llmgw_gpu_power_limit_watts)",
    "min_limits": "each node's largest GPU minimum power limit (llmgw_gpu_power_limit_min_watts)",
    "profiles": "measured tokens per joule per model and profile "
    "(llmgw:model_profile_tokens_per_joule:ratio5m)",
    "hot": "how long each hot domain has been hot (llmgw_domain_condition, for shedding)",
    "cpus": "each node's CPU models (llmgw_node_cpu_info)",
    "evidence": "what each domain's condition rests on: inlet and thresholds, cooling alarm, "
    "throttled GPUs, racks hot, how long warm (llmgw_domain_inlet_temperature_celsius and "
    "others)",
}
#: Parts read only where the facility file asks for them, and what each one holds: a
#: snapshot's `parts` names them only then, so a site that does not opt in has none of them
#: (the refresher's query for each: decider.peaks).
OPTIONAL_PARTS: dict[str, str] = {
    "peaks": "each oversubscribed domain's measured power at the facility file's percentile "
    "over its window and the history it has (quantile_over_time of "
    "llmgw_domain_measured_watts), and each model profile's peak per replica "
    "(llmgw:unit_power_watts)",
}
#: Parts that describe the site's layout and hardware: they change rarely and stay usable
#: for `staleness.inventory`; the others are readings, usable for `staleness.readings`.
INVENTORY_PARTS = frozenset({"membership", "inventory", "gpus", "limits", "min_limits", "cpus"})


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Part:
    """One part's data as last read, and when (Unix seconds; None: never read)."""

    read_at: float | None = None
    error: str | None = None  # why the last attempt failed; None when it succeeded
    #: The bad series the data was read without (decider.prometheus_parse), named; shown
    #: in `missing` while the part is fresh, since the domains and nodes they were about
    #: read as not measured.
    left_out: str | None = None
    #: How many series `left_out` names or counts (llmgw_decider_series_left_out).
    left_out_count: int = 0


@dataclass(frozen=True, slots=True)
class ProfileFigures:
    """One model and profile as rules/energy.yml measured it, over the units that count tokens:
    tokens per joule (5 min), and the sums it is made of where Prometheus has them.

    `read_at`: when the decider last read it from Prometheus. A profile whose series ends
    (no replica runs it any more) is kept with its last figures and that time, for
    `staleness.inventory`, so GET /v1/profiles can show how old its figures are.
    """

    tokens_per_joule: float
    tokens_per_second: float | None  # summed over `units`
    watts: float | None  # the units' mean watts over 5 minutes, summed
    units: int | None
    read_at: float


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one domain's condition rests on, as the rules publish it (rules/domain.yml,
    rules/conditions.yml; docs/rules.md): each figure None where Prometheus has none.
    decider.placement.evidence turns it into the words of a refusal."""

    #: The rack's inlet (its hottest node's, or the site's rack signal), or a row's, room's,
    #: site's or pdu's own site inlet signal; never a parent's hottest node.
    inlet_celsius: float | None = None
    inlet_warm_celsius: float | None = None  # the domain's thresholds
    inlet_hot_celsius: float | None = None
    cooling_alarm: float | None = None  # 1 while a cooling unit about the domain is in alarm
    gpus: float | None = None  # a rack's GPUs
    gpus_thermally_throttled: float | None = None
    gpus_near_slowdown: float | None = None
    throttled_hot_ratio: float | None = None  # threshold: a share of the rack's GPUs
    racks_hot_ratio: float | None = None  # a row's, room's or site's share of racks hot
    racks_warm_ratio: float | None = None  # … warm or hot
    racks_hot_share: float | None = None  # thresholds: hot above, warm above
    racks_warm_share: float | None = None
    #: Seconds the domain has been warm or hot without a break (at most the lookback).
    warm_seconds: float | None = None
    #: Seconds it has been hot: the `hot` part's (Snapshot.hot_seconds), which the View adds.
    hot_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class DomainPeak:
    """One domain's measured power at the oversubscription percentile over its window
    (`peak_watts`), and how many seconds of measurements the window holds (`history_seconds`:
    since its first sample in the window, to the step of the query). None: not read."""

    peak_watts: float | None = None
    history_seconds: float | None = None
    #: The share of the window's samples at which the domain's capping ladder was at step 1
    #: or 2 (llmgw_decider_capping_step; decider.placement.predicted_peak's capped guard).
    capped_share: float | None = None


#: The figures of Evidence, as the evidence query's `figure` label names them.
EVIDENCE_FIGURES = frozenset(Evidence.__slots__) - {"hot_seconds"}


@dataclass(frozen=True)
class Snapshot:
    """Everything read from Prometheus. Mappings are read-only; a refresh builds a new one.

    - `membership`: node → its domains (rack, pdus, row, room, site), sorted.
    - `domains`: the known domains (inventory and every domain a node belongs to).
    - `measured_watts`, `conditions`, `reading_ages`: per domain, only where read.
    - `phase_measured_watts`: per (pdu name, phase) of a three-phase pdu, where a site signal
      measures the phase (read with `measured_watts`, the same part).
    - `node_gpus`: physical GPUs per node; `gpu_limit_watts`: the node's largest enforced
      GPU power limit; `gpu_min_limit_watts`: the largest of its GPUs' minimum limits (the
      lowest limit every card of the node accepts), where its exporter publishes them.
    - `profiles`: (model, profile) → its measured figures, fresh or remembered.
    - `hot_seconds`: per domain hot now, how long it has been hot (decider.shedding).
    - `cpu_models`: each node's CPU models, sorted (the watts per core of a CPU replica).
    - `evidence`: per domain, the figures its condition rests on (decider.placement.evidence).
    - `domain_peaks`, `unit_peak_watts`: the optional `peaks` part (OPTIONAL_PARTS): per
      oversubscribed domain its measured peak and history, per (model, profile) the peak of
      one replica (decider.placement.predicted_peak).
    - `parts`: per part of PARTS, when it was last read and the last error.
    """

    membership: Mapping[str, tuple[DomainRef, ...]] = field(default_factory=_empty)
    domains: frozenset[DomainRef] = frozenset()
    measured_watts: Mapping[DomainRef, float] = field(default_factory=_empty)
    phase_measured_watts: Mapping[tuple[str, str], float] = field(default_factory=_empty)
    conditions: Mapping[DomainRef, Condition] = field(default_factory=_empty)
    reading_ages: Mapping[DomainRef, float] = field(default_factory=_empty)
    node_gpus: Mapping[str, int] = field(default_factory=_empty)
    gpu_limit_watts: Mapping[str, float] = field(default_factory=_empty)
    gpu_min_limit_watts: Mapping[str, float] = field(default_factory=_empty)
    profiles: Mapping[tuple[str, str], ProfileFigures] = field(default_factory=_empty)
    #: Seconds each domain hot now has been hot without a break (decider.shedding), at most
    #: the query's lookback.
    hot_seconds: Mapping[DomainRef, float] = field(default_factory=_empty)
    cpu_models: Mapping[str, tuple[str, ...]] = field(default_factory=_empty)
    evidence: Mapping[DomainRef, Evidence] = field(default_factory=_empty)
    domain_peaks: Mapping[DomainRef, DomainPeak] = field(default_factory=_empty)
    unit_peak_watts: Mapping[tuple[str, str], float] = field(default_factory=_empty)
    parts: Mapping[str, Part] = field(default_factory=lambda: {name: Part() for name in PARTS})
    #: Whether the last refresh reached Prometheus and every query succeeded.
    prometheus_up: bool = False

    def read_at(self) -> float | None:
        """When the oldest part was last read: the snapshot's age runs from here."""
        times = [part.read_at for part in self.parts.values()]
        if any(time is None for time in times):
            return None
        return min(time for time in times if time is not None)

    def age_seconds(self, now: float) -> float | None:
        """Seconds since the oldest part was read; None while some part was never read."""
        read_at = self.read_at()
        return None if read_at is None else max(0.0, now - read_at)

    def fresh_parts(
        self, now: float, readings_limit: float, inventory_limit: float
    ) -> tuple[frozenset[str], tuple[str, ...]]:
        """The parts usable now, and a sentence for each one that is not, and for each usable
        one read without some bad series."""
        fresh: set[str] = set()
        missing: list[str] = []
        for name, part in self.parts.items():
            limit = inventory_limit if name in INVENTORY_PARTS else readings_limit
            what = PARTS[name] if name in PARTS else OPTIONAL_PARTS[name]
            if part.read_at is None:
                reason = f": {part.error}" if part.error else ""
                missing.append(f"{what}: never read from Prometheus{reason}")
            elif now - part.read_at > limit:
                reason = f" ({part.error})" if part.error else ""
                missing.append(
                    f"{what}: last read {now - part.read_at:.0f}s ago, "
                    f"older than its {limit:g}s limit{reason}"
                )
            else:
                fresh.add(name)
                if part.left_out:
                    missing.append(f"{what}: {part.left_out}")
        return frozenset(fresh), tuple(missing)
