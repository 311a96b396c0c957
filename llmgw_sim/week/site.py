"""The simulated site: rows of racks, each rack dual-fed, nodes of eight H100s.

The limits are a real facility file (`decider.facility.Facility`), so the budgets are the
decider's own: a rack's cap is its smallest feed's rating x derating (`Domain.cap`), its
budget cap x (1 - margin) (`decider.facility.limit_watts`, the one place the decider works
it out). The lines the week measures against:

- **rating**: what must never be passed. A rack's is its smallest feed's `rating_watts`
  (a node on both feeds counts fully against each, DESIGN.md §3: that is what each feed
  carries when the other fails, so a rack's power *is* each feed's load in that view,
  and the feeds' figures are the rack's). A row has no feeds; its `cap_watts` is already
  derated (docs/facility.md), so its rating is taken as cap_watts / derating.
- **rating x derating**: the cap; time above it is counted per event.
- **budget**: cap x (1 - margin): where admission stops; the ladder's thresholds are shares
  of it.

A node with no replica is taken as powered off (a power-bound site does not keep idle
hosts up): it draws nothing. A powered node's host (two Xeon 8480 sockets, their DRAM and
the declared overhead) follows llmgw_sim.hardware's figures and load model; its GPUs
with no replica idle at the H100 capture's idle power.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from decider.facility import Facility, limit_watts
from llmgw_sim.hardware import CPU_MODELS, HOST_BASE_LOAD, HOST_GPU_SHARE
from llmgw_sim.week.data import CLASSES, MODELS

XEON = CPU_MODELS["xeon-8480"]
#: The declared draw no sensor sees, per node (llmgw_sim.scenario.NodeType's default).
NODE_OVERHEAD_WATTS = 600.0
CPU_SOCKETS = 2


def host_watts(gpu_load: Any) -> Any:
    """A powered node's host draw at a mean GPU load of 0-1 (numpy arrays welcome):
    llmgw_sim.hardware's CPU and DRAM lines at load base + share x GPU load."""
    load = HOST_BASE_LOAD + HOST_GPU_SHARE * gpu_load
    cpu = XEON.idle_watts + (XEON.tdp_watts - XEON.idle_watts) * load
    dram = XEON.dram_idle_watts + (XEON.dram_max_watts - XEON.dram_idle_watts) * load
    return NODE_OVERHEAD_WATTS + CPU_SOCKETS * (cpu + dram)


HOST_PEAK_WATTS = float(host_watts(1.0))


@dataclass(frozen=True)
class SiteSpec:
    """The site's shape and figures; `facility()` writes its facility file."""

    rows: int = 2
    racks_per_row: int = 6
    nodes_per_rack: int = 4
    gpus_per_node: int = 8
    feed_rating_watts: float = 17_300.0
    """Each of a rack's two feeds (a 208 V 3-phase 60 A PDU at 80 %: the design's example)."""
    rack_other_watts: float = 600.0
    """Switches: draw no node reports (the facility file's `other_watts`)."""
    row_cap_watts: float = 75_000.0
    """A row's cap (already derated): below its racks' caps together, as rows usually are."""
    node_share_watts: float = 1_200.0
    """The facility file's per-node host share in a replica's estimate: at or above the
    host's most (`HOST_PEAK_WATTS`), so that estimates are estimates."""
    margin: float = 0.10
    derating: float = 0.80
    oversubscription: dict[str, Any] = field(default_factory=dict)
    """The facility file's `oversubscription` section (its defaults where empty)."""

    def facility(self, oversubscribe: bool) -> Facility:
        """The facility file of this site, every domain opted in or none."""
        domains: dict[str, Any] = {}
        for row in self.row_names:
            # A row's meter is its nodes' sum: its racks' switches are declared on it too.
            domains[f"row/{row}"] = {
                "cap_watts": self.row_cap_watts,
                "other_watts": self.rack_other_watts * self.racks_per_row,
            }
            for rack in self.racks_of(row):
                domains[f"rack/{rack}"] = {
                    "feeds": [
                        {"pdu": f"{rack}-{side}", "rating_watts": self.feed_rating_watts}
                        for side in ("a", "b")
                    ],
                    "other_watts": self.rack_other_watts,
                }
        if oversubscribe:
            for domain in domains.values():
                domain["oversubscribe"] = True
        return Facility.model_validate(
            {
                "defaults": {"margin": self.margin, "derating": self.derating},
                "domains": domains,
                "node_share_watts": self.node_share_watts,
                "classes": list(CLASSES),
                "models": {model.name: {"class": model.klass} for model in MODELS},
                "oversubscription": self.oversubscription,
                "mode": "enforce",
            }
        )

    @cached_property
    def row_names(self) -> list[str]:
        return [f"{index + 1:02d}" for index in range(self.rows)]

    def racks_of(self, row: str) -> list[str]:
        return [f"r{row}-{index + 1:02d}" for index in range(self.racks_per_row)]


@dataclass(frozen=True)
class Domain:
    """One domain the week measures and admits against."""

    kind: str
    name: str
    rating_watts: float
    cap_watts: float
    budget_watts: float
    other_watts: float
    oversubscribe: bool

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"


def domains(spec: SiteSpec, facility: Facility) -> list[Domain]:
    """Racks first (in row order), then rows: every budgeted domain of the site."""
    found: list[Domain] = []
    for kind in ("rack", "row"):
        for row in spec.row_names:
            for name in spec.racks_of(row) if kind == "rack" else [row]:
                declared = facility.domain(kind, name)
                cap = facility.cap_watts(kind, name)
                budget = limit_watts(cap, facility.margin(kind, name))
                if declared is None or cap is None or budget is None:
                    raise ValueError(f"{kind}/{name} has no budget in the site's facility file")
                if declared.feeds:
                    rating = min(feed.rating_watts for feed in declared.feeds)
                else:
                    rating = cap / facility.derating(kind, name)
                found.append(
                    Domain(
                        kind,
                        name,
                        rating,
                        cap,
                        budget,
                        declared.other_watts,
                        declared.oversubscribe,
                    )
                )
    return found
