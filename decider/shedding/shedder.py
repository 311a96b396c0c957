"""`Shedder`: the shedding plan's pacing record, kept in the database, and the plan on the
current view; GET /v1/shedding and /metrics both ask it."""

from __future__ import annotations

import threading
from collections.abc import Callable

from decider.facility import DomainRef
from decider.placement.view import View
from decider.shedding.planner import Plan, plan
from decider.store import Proposal, Store


class Shedder:
    """The pacing record, kept in the database, and the plan on the current view."""

    def __init__(
        self,
        store: Store,
        view: Callable[[], View],
        clock: Callable[[], float],
        record: Callable[[dict[DomainRef, Proposal | None]], None] | None = None,
    ) -> None:
        self._view = view
        self._clock = clock
        self._record = record or store.set_proposals  # State.record_proposals in the service
        self._lock = threading.Lock()
        self._pacing = store.proposals()

    def plan(self) -> Plan:
        with self._lock:  # two plans at once must not both open the same domain's window
            result = plan(self._view(), self._clock(), self._pacing)
            if result.pacing:
                self._record(result.pacing)
                pacing = dict(self._pacing)
                for ref, proposal in result.pacing.items():
                    if proposal is None:
                        pacing.pop(ref, None)
                    else:
                        pacing[ref] = proposal
                self._pacing = pacing
            return result
