"""The recent decisions the status page shows: a bounded, in-memory ring.

The placement and reservation endpoints record each answer they give, with its reasons;
the oldest fall off past `capacity`. Reasons are grouped when the page reads them.
Nothing is persisted: after a restart the page starts empty (the durable record is the
decision counters on `/metrics` and the reservations).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
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


@dataclass
class _Pending:
    """A decision as recorded: its refusals are grouped when the page first reads it, not
    on the request's path (a placement over 10,000 nodes may refuse thousands)."""

    at: float
    call: str
    subject: str
    outcome: str
    allowed: bool
    refusals: Sequence[tuple[str, str]]
    grouped: Record | None = None

    def record(self) -> Record:
        if self.grouped is None:
            reasons = group_reasons(self.refusals)
            self.grouped = Record(
                at=self.at,
                call=self.call,
                subject=self.subject,
                outcome=self.outcome,
                allowed=self.allowed,
                reasons=tuple(reasons[:REASONS_KEPT]),
                more_reasons=max(len(reasons) - REASONS_KEPT, 0),
            )
            self.refusals = ()
        return self.grouped


class DecisionLog:
    """A thread-safe ring of the last `capacity` decisions, newest first when read."""

    def __init__(self, capacity: int = CAPACITY, clock: Callable[[], float] = time.time) -> None:
        self._records: deque[_Pending] = deque(maxlen=capacity)
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
        """Keep a decision; `refusals`, (node, reason) pairs, are kept as given when they are
        a sequence (the caller does not change it after), grouped when first read."""
        kept = refusals if isinstance(refusals, Sequence) else tuple(refusals)
        entry = _Pending(self._clock(), call, subject, outcome, allowed, kept)
        with self._lock:
            self._records.append(entry)

    def recent(self) -> list[Record]:
        with self._lock:
            pending = list(reversed(self._records))
        return [entry.record() for entry in pending]
