"""The EntryIndex a placement joins its candidates through (decider.placement.answers).

The C one (decider/placement/_entry_index.c) where the package was built with a C compiler
and Python's headers (`make` installs them; a plain `pip install` without them builds the
package without it), else `EntryIndexInPython`, the same loop in Python: the same answers,
placements taking 1.6 to 2.1 times as long (docs/benchmarks.md, the figures of 19:52).
`llmgw-decider` logs a warning at start when it runs the Python one (`COMPILED`). The
Python one is also the C one's reference: tests/test_entry_index.py holds them alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter
from typing import Protocol


class Joined(Protocol):
    """What join reads of an entry (decider.placement.answers.Entry)."""

    @property
    def name(self) -> str: ...
    @property
    def head(self) -> bytes: ...
    @property
    def rank(self) -> float | None: ...


_RANK = attrgetter("rank")


class EntryIndexInPython:
    """A shape's base entries (a dict of node name to entry, never written once made)."""

    def __init__(self, base: Mapping[str, Joined]) -> None:
        self._base = base

    def __len__(self) -> int:
        return len(self._base)

    def join(
        self, over: Mapping[str, Joined | None], candidates: list[str]
    ) -> tuple[bytes, list[str], list[Joined]] | int:
        """Each candidate's entry, from `over` (a shape's overlay: an entry, or None for one
        to work out) or else the base: the answer's nodes (each entry's head, without the
        first one's comma, an allowed node's followed by its index and "}}"), the allowed
        candidates by rank then position, and the refused entries in the candidates' order;
        or the position of the first candidate with no entry."""
        over_get, base_get = over.get, self._base.get
        parts: list[bytes] = []
        append = parts.append
        allowed: list[Joined] = []
        refused: list[Joined] = []
        for position, name in enumerate(candidates):
            found = over_get(name, base_get(name))
            if found is None:
                return position
            append(found.head)
            if found.rank is None:
                refused.append(found)
            else:
                append(b"%d}}" % position)
                allowed.append(found)
        if parts:
            parts[0] = parts[0][1:]  # every head starts with the comma before it
        allowed.sort(key=_RANK)  # stable: equal ranks stay in the scheduler's order
        return b"".join(parts), [found.name for found in allowed], refused


try:
    from decider.placement._entry_index import EntryIndex
except ImportError:  # built without a C compiler or Python's headers
    EntryIndex = EntryIndexInPython  # type: ignore[misc,assignment]

COMPILED = EntryIndex is not EntryIndexInPython
