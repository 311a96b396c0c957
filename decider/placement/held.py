"""Refuse a node any of whose domains the facility team holds (`POST …/hold`).

No data needed: a hold is the decider's own record. It refuses in every condition and in
every mode (concern `always`): a hold is an order, not an observation. A node whose
membership is not fresh is refused by the holds on its last known domains (the View says
which: `last_known`).
"""

from __future__ import annotations

from decider.facility import DomainRef
from decider.placement.states import Budgeted
from decider.store import Hold

name = "held"
concern = "always"
reads = frozenset({"held"})


def refuse(domain: Budgeted) -> str | None:
    if domain.held is None:
        return None
    return _reason(domain.ref, domain.held)


def refuse_last_known(ref: DomainRef, hold: Hold) -> str:
    """The refusal of a node whose membership is unknown, by a hold on a domain it was last
    known to be in."""
    return f"{_reason(ref, hold)} (from the node's last known domains)"


def _reason(ref: DomainRef, hold: Hold) -> str:
    return f"{ref.kind} {ref.name} held: {hold.reason}"
