"""The phases of three-phase PDUs: each phase a limit of its own (docs/facility.md "Phases").

A three-phase PDU trips one phase's breaker while its total still looks fine, so where the
facility file gives a pdu `phases`, every phase is a budget beside the PDU's own:

- a phase's cap is its `rating_watts` × `defaults.derating` (as a feed's), its limit
  cap × (1 − margin);
- its load is what is reserved on it plus its `other_watts` (Domain.phase_other_watts).
  Nothing measures a phase: `llmgw_domain_measured_watts` is per PDU and the PDU's total
  still counts against the PDU's cap as today; per node there is no reading a phase could
  be summed from with its reservations kept apart. So a phase's load is reserved only;
- a reservation counts against its node's phase of each phased PDU the node is on
  (`nodes: {NODE: {phases: {PDU: L1}}}`); a node the file gives no phase on a phased PDU
  counts against every phase of it, the safe side, and `missing` says so.

The rules of the other domains apply to phases through the same reason codes:
`over_cap` refuses the nodes of a phase already past its cap, `power_cap` a replica that
would take a phase past its limit. A pdu without `phases` has none of this.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from decider.facility import PHASES, DomainRef
from decider.placement.over_cap import kw

if TYPE_CHECKING:
    from decider.placement.view import View
    from decider.store import Reservation

#: (pdu name, phase): where a phase's figures are kept.
PhaseKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class PhaseState:
    """One phase's figures in a view, watts; as DomainState, but reserved only."""

    pdu: DomainRef
    phase: str
    rating: float
    cap: float
    limit: float
    other_watts: float
    reserved: float
    load: float
    room: float  # under the limit; negative: past it
    headroom: float  # under the cap
    refusals: tuple[tuple[str, str], ...] = ()
    load_basis: str = "reserved"

    @property
    def label(self) -> str:
        """How reasons name it: `pdu r12-07-a phase L2`."""
        return f"pdu {self.pdu.name} phase {self.phase}"

    @classmethod
    def build(
        cls,
        pdu: DomainRef,
        phase: str,
        rating: float,
        derating: float,
        margin: float,
        other_watts: float,
        reserved: float,
    ) -> PhaseState:
        from decider.placement import over_cap  # the registry imports this module

        cap = rating * derating
        limit = cap * (1 - margin)
        load = reserved + other_watts
        state = cls(
            pdu=pdu,
            phase=phase,
            rating=rating,
            cap=cap,
            limit=limit,
            other_watts=other_watts,
            reserved=reserved,
            load=load,
            room=limit - load,
            headroom=cap - load,
        )
        if load <= cap:
            return state
        reason = f"{state.label}: over its cap, {kw(load)} of {kw(cap)} kW reserved{_other(state)}"
        return replace(state, refusals=((over_cap.name, reason),))


def _other(state: PhaseState) -> str:
    return f" (incl. {kw(state.other_watts)} other)" if state.other_watts else ""


def refuse(state: PhaseState, estimate_watts: float, margin: float) -> str | None:
    """power_cap on one phase: the replica would take it past cap × (1 − margin)."""
    if estimate_watts <= state.room or state.load > state.cap:  # over its cap: over_cap's
        return None
    return (
        f"{state.label}: {kw(state.load)} of {kw(state.cap)} kW reserved{_other(state)}, "
        f"replica needs ~{kw(estimate_watts)}, margin {margin * 100:g}%"
    )


# --- what a view works out ------------------------------------------------------------------


def phases_of(view: View, node: str, refs: tuple[DomainRef, ...]) -> list[PhaseKey]:
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


def reservation_phases(view: View, reservation: Reservation) -> list[PhaseKey]:
    return phases_of(view, reservation.node, view.reservation_domains(reservation))


def reserved_by_phase(view: View) -> dict[PhaseKey, float]:
    totals: dict[PhaseKey, float] = {}
    if not view.phased_pdus:
        return totals
    for reservation in view.reservations.values():
        for key in reservation_phases(view, reservation):
            totals[key] = totals.get(key, 0.0) + reservation.estimate_watts
    return totals


def phase_state(view: View, pdu: str, phase: str) -> PhaseState:
    domain = view.phased_pdus[pdu]
    facility = view.facility
    return PhaseState.build(
        pdu=DomainRef("pdu", pdu),
        phase=phase,
        rating=domain.phases[phase].rating_watts,
        derating=facility.defaults.derating,
        margin=facility.defaults.margin,
        other_watts=domain.phase_other_watts(phase),
        reserved=view.phase_reserved.get((pdu, phase), 0.0),
    )


def pdu_phases(view: View, pdu: str) -> tuple[PhaseState, ...]:
    """Every phase of a phased pdu, L1 to L3; empty for a pdu without phases."""
    if pdu not in view.phased_pdus:
        return ()
    return tuple(view.phase(pdu, phase) for phase in PHASES)


def phase_members(view: View, pdu: str) -> dict[str | None, list[str]]:
    """The pdu's member nodes by the phase the file gives them; None: no phase given."""
    found: dict[str | None, list[str]] = {}
    for node in sorted(view.members.get(DomainRef("pdu", pdu), ())):
        found.setdefault(view.facility.node_phase(node, pdu), []).append(node)
    return found


def notes(view: View) -> list[str]:
    """For `missing`: the members of phased pdus with no phase in the file (counted against
    every phase), and phases the file gives a node on a pdu Prometheus does not put it on."""
    if not view.phased_pdus or "membership" not in view.fresh:
        return []
    unphased: list[str] = []
    for pdu in view.phased_pdus:
        unphased += [f"{node} on {pdu}" for node in phase_members(view, pdu).get(None, ())]
    found = []
    if unphased:
        found.append(
            f"no phase in the facility file for {_some(unphased)}: counted against every "
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
            f"the facility file gives a phase to {_some(elsewhere)}, but the node is not "
            "among that pdu's members: unused"
        )
    return found


def _some(items: list[str], shown: int = 5) -> str:
    if len(items) <= shown:
        return f"node{'s' if len(items) > 1 else ''} {', '.join(items)}"
    return f"{len(items)} nodes ({', '.join(items[:shown])}, …)"
