"""The recent decisions the status page shows: a bounded, in-memory ring.

The placement and reservation endpoints record each answer they give, with its reasons;
the oldest fall off past `capacity`. Nothing is persisted: after a restart the page starts
empty (the durable record is the decision counters on `/metrics` and the reservations).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

#: Decisions kept for the status page.
CAPACITY = 50
#: Distinct refusal reasons kept per decision (a placement over 10,000 nodes has many).
REASONS_KEPT = 12


@dataclass(frozen=True)
class Reason:
    """One refusal reason and the nodes it was given for (the first few of them)."""

    text: str
    nodes: tuple[str, ...]
    count: int


@dataclass(frozen=True)
class Record:
    """One answer: a placement (`call="placement"`) or a reservation (`"reservation"`)."""

    at: float
    call: str
    subject: str
    outcome: str
    allowed: bool
    reasons: tuple[Reason, ...] = field(default_factory=tuple)
    more_reasons: int = 0


def group_reasons(refusals: Iterable[tuple[str, str]], shown_nodes: int = 3) -> list[Reason]:
    """(node, reason) pairs as one Reason per distinct text, in first-seen order."""
    nodes: dict[str, list[str]] = {}
    for node, reason in refusals:
        nodes.setdefault(reason, []).append(node)
    return [Reason(text, tuple(names[:shown_nodes]), len(names)) for text, names in nodes.items()]


class DecisionLog:
    """A thread-safe ring of the last `capacity` decisions, newest first when read."""

    def __init__(self, capacity: int = CAPACITY, clock: Callable[[], float] = time.time) -> None:
        self._records: deque[Record] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._clock = clock

    def record(
        self,
        call: str,
        subject: str,
        outcome: str,
        *,
        allowed: bool,
        refusals: Iterable[tuple[str, str]] = (),
    ) -> None:
        reasons = group_reasons(refusals)
        entry = Record(
            at=self._clock(),
            call=call,
            subject=subject,
            outcome=outcome,
            allowed=allowed,
            reasons=tuple(reasons[:REASONS_KEPT]),
            more_reasons=max(len(reasons) - REASONS_KEPT, 0),
        )
        with self._lock:
            self._records.append(entry)

    def recent(self) -> list[Record]:
        with self._lock:
            return list(reversed(self._records))
