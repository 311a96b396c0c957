"""The phases of three-phase PDUs: each phase a limit of its own (docs/facility.md "Phases").

A three-phase PDU trips one phase's breaker while its total still looks fine, so where the
facility file gives a pdu `phases`, every phase is a budget beside the PDU's own:

- a phase's cap is its `rating_watts` × the pdu's derating (as a feed's), its limit
  cap × (1 − margin) with the pdu's margin;
- its load is the larger of what is reserved on it and what is measured on it, plus its
  `other_watts` (Domain.phase_other_watts), as for any domain (DESIGN.md §5), and
  `load_basis` says which. The measurement is the site's own, per phase: the facility
  file's `signals.phase_power_watts` (a metered PDU's per-phase active power, rendered into
  `llmgw:domain_phase_site_power_watts`, read with the measured part). Per node there is no
  reading a phase could be summed from, so without that signal, or while its reading is
  missing or stale, a phase's load is what is reserved, and `missing` says so for a phased
  pdu the signal is configured for. A pdu whose meter includes its `other_watts`
  (`measured_includes_other: true`) has each phase's taken off its phase reading, never
  below 0, so that they count once, as the rules do for the pdu's total;
- a reservation counts against its node's phase of each phased PDU the node is on
  (`nodes: {NODE: {phases: {PDU: L1}}}`); a node the file gives no phase on a phased PDU
  counts against every phase of it, the safe side, and `missing` says so.

The rules of the other domains apply to phases through the same reason codes:
`over_cap` refuses the nodes of a phase already past its cap, `power_cap` a replica that
would take a phase past its limit: each rule module refuses a phase as it does a domain
(decider.placement.states.PhaseState reads alike), and `judge` calls them. A pdu without
`phases` has none of this.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from decider.facility import PHASES, Domain, DomainRef, Facility
from decider.placement.states import PhaseState, some
from decider.snapshot import Snapshot

if TYPE_CHECKING:
    from decider.store import Reservation

#: (pdu name, phase): where a phase's figures are kept.
PhaseKey = tuple[str, str]


class PhaseView(Protocol):
    """What these functions read of a View (decider.placement.view, which imports this
    module: typed by what it reads, not by the View)."""

    facility: Facility
    snapshot: Snapshot
    fresh: frozenset[str]
    reservations: Mapping[str, Reservation]

    @property
    def phased_pdus(self) -> dict[str, Domain]: ...
    @property
    def phase_reserved(self) -> dict[PhaseKey, float]: ...
    @property
    def members(self) -> dict[DomainRef, list[str]]: ...
    def phase(self, pdu: str, phase: str) -> PhaseState: ...
    def reservation_domains(self, reservation: Reservation) -> tuple[DomainRef, ...]: ...


# --- what a view works out ------------------------------------------------------------------


def phases_of(view: PhaseView, node: str, refs: tuple[DomainRef, ...]) -> list[PhaseKey]:
    """The phases a load on `node`, member of `refs`, counts against."""
    phased = view.phased_pdus
    found: list[PhaseKey] = []
    for ref in refs:
        if ref.kind != "pdu" or ref.name not in phased:
            continue
        phase = view.facility.node_phase(node, ref.name)
        if phase is None:  # not said: the safe side, every phase of the pdu
            found.extend((ref.name, each) for each in PHASES)
        else:
            found.append((ref.name, phase))
    return found


def reservation_phases(view: PhaseView, reservation: Reservation) -> list[PhaseKey]:
    return phases_of(view, reservation.node, view.reservation_domains(reservation))


def reserved_by_phase(view: PhaseView) -> dict[PhaseKey, float]:
    totals: dict[PhaseKey, float] = {}
    if not view.phased_pdus:
        return totals
    for reservation in view.reservations.values():
        for key in reservation_phases(view, reservation):
            totals[key] = totals.get(key, 0.0) + reservation.estimate_watts
    return totals


def phase_measured(view: PhaseView, pdu: str, phase: str) -> float | None:
    """The phase's fresh measured power, less its `other_watts` where the pdu's meter
    includes them (never below 0); None: no fresh reading."""
    if "measured" not in view.fresh:
        return None
    measured = view.snapshot.phase_measured_watts.get((pdu, phase))
    if measured is None:
        return None
    domain = view.phased_pdus[pdu]
    if domain.measured_includes_other:
        measured = max(0.0, measured - domain.phase_other_watts(phase))
    return measured


def phase_state(view: PhaseView, pdu: str, phase: str) -> PhaseState:
    domain = view.phased_pdus[pdu]
    facility = view.facility
    return PhaseState.build(
        pdu=DomainRef("pdu", pdu),
        phase=phase,
        rating=domain.phases[phase].rating_watts,
        derating=facility.derating("pdu", pdu),
        margin=facility.margin("pdu", pdu),
        other_watts=domain.phase_other_watts(phase),
        reserved=view.phase_reserved.get((pdu, phase), 0.0),
        measured=phase_measured(view, pdu, phase),
    )


def pdu_phases(view: PhaseView, pdu: str) -> tuple[PhaseState, ...]:
    """Every phase of a phased pdu, L1 to L3; empty for a pdu without phases."""
    if pdu not in view.phased_pdus:
        return ()
    return tuple(view.phase(pdu, phase) for phase in PHASES)


def phase_members(view: PhaseView, pdu: str) -> dict[str | None, list[str]]:
    """The pdu's member nodes by the phase the file gives them; None: no phase given."""
    found: dict[str | None, list[str]] = {}
    for node in sorted(view.members.get(DomainRef("pdu", pdu), ())):
        found.setdefault(view.facility.node_phase(node, pdu), []).append(node)
    return found


def unmeasured(view: PhaseView) -> list[str]:
    """The phases a configured phase signal should measure (every phase of a phased pdu)
    that have no fresh reading: counted as reserved, which `missing` says."""
    if view.facility.signals.phase_power_watts is None or not view.phased_pdus:
        return []
    return [
        f"{pdu} {phase}"
        for pdu in view.phased_pdus
        for phase in PHASES
        if phase_measured(view, pdu, phase) is None
    ]


def notes(view: PhaseView) -> list[str]:
    """For `missing`: the phases a phase signal should measure that have no fresh reading,
    the members of phased pdus with no phase in the file (counted against every phase), and
    phases the file gives a node on a pdu Prometheus does not put it on."""
    if not view.phased_pdus:
        return []
    found: list[str] = []
    if "measured" in view.fresh and (missing := unmeasured(view)):
        found.append(
            f"no fresh measured power for {some(missing, 'pdu phase')} "
            "(signals.phase_power_watts): their load counts what is reserved"
        )
    if "membership" not in view.fresh:
        return found
    unphased: list[str] = []
    for pdu in view.phased_pdus:
        unphased += [f"{node} on {pdu}" for node in phase_members(view, pdu).get(None, ())]
    if unphased:
        found.append(
            f"no phase in the facility file for {some(unphased)}: counted against every "
            "phase of the pdu"
        )
    elsewhere = [
        f"{node} on {pdu}"
        for node, wiring in view.facility.nodes.items()
        for pdu in wiring.phases
        if DomainRef("pdu", pdu) not in view.snapshot.membership.get(node, ())
    ]
    if elsewhere:
        found.append(
            f"the facility file gives a phase to {some(elsewhere)}, but the node is not "
            "among that pdu's members: unused"
        )
    return found
