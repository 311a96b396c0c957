"""A per-node cache shared from View to View: one base dict, and a small overlay per View.

A write (a reservation, a hold, a release) makes a new View that changes a few nodes' state
(a rack's, its PDUs'): copying the earlier View's 10,000-node caches for it would cost the
write, and the next placement, what the whole site costs (docs/benchmarks.md, "Where the
time goes"). So each View's cache is a `Layered`: a `base` shared with the Views before and
after it, and an `overlay` of its own, of what changed since the base was made: a changed
node maps to its new value, a stale one to None ("not here: work it out"). A View made
after a write (`settled`) shares the base and copies the overlay (small), the stale nodes
marked in it; once the overlay holds more than `limit` names, the two are compacted into a
new base, and the overlay starts empty. A read is one lookup in the overlay, then one in
the base: `over.get(name, base.get(name))`, None when neither has it.

Where a value worked out on first use is written (decider.placement.view and .answers
choose, see theirs): into the View's own overlay always holds; into the shared base only
when the value is the same on every View that shares it and reads the base for that name.

Threads: a placement reads and fills its View's cache on the event loop's thread while a
write settles the next View on a worker thread, without a lock. `settled` and `compacted`
copy each dict with one C call (`dict(...)`, whole under the GIL), and write only dicts no
other View has yet. A Layered holds two dicts and nothing that refers back to it: a View's
garbage has no cycles (decider.placement.answers says why it must not).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from decider.giving_way import paced

V = TypeVar("V")

#: An overlay of at most this many names is never compacted (a small site's writes then
#: share one base for longer); past it, `limit` decides.
OVERLAY_FLOOR = 32


def limit(base_size: int) -> int:
    """The overlay's size past which a write compacts it into a new base: 4·√(base size)
    (400 at 10,000 nodes). A write copies the overlay (at most this many names) and every
    limit/k writes the base (base-size names), k the names a write marks (a rack's and its
    PDUs' nodes: about 8); their sum per write, limit + k·base/limit, is least at
    √(k·base), about 3·√(base) — a little more leaves room for the entries placements
    fill in between."""
    return max(OVERLAY_FLOOR, 4 * math.isqrt(base_size))


class Layered(Mapping[str, V], Generic[V]):
    """A base shared with other Views and an overlay of this View's own (module docstring).
    Hot paths read `over` and `base` directly; the Mapping is for everything else."""

    __slots__ = ("base", "over")

    def __init__(
        self, base: dict[str, V] | None = None, over: dict[str, V | None] | None = None
    ) -> None:
        self.base: dict[str, V] = {} if base is None else base
        self.over: dict[str, V | None] = {} if over is None else over

    def get(self, name: str, default: V | None = None) -> V | None:  # type: ignore[override]
        found = self.over.get(name, self.base.get(name))
        return default if found is None else found

    def __getitem__(self, name: str) -> V:
        found = self.over.get(name, self.base.get(name))
        if found is None:
            raise KeyError(name)
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[str]:
        over = self.over
        for name in self.base:
            if name not in over:
                yield name
        for name, value in over.items():
            if value is not None:
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:  # not __len__'s walk of the base
        over = self.over
        return any(value is not None for value in over.values()) or any(
            name not in over for name in self.base
        )

    def pop(self, name: str) -> V:
        """Take one out (marked stale in the overlay): it is worked out again when asked."""
        found = self[name]
        self.over[name] = None
        return found

    def settled(self, stale: Iterable[str]) -> Layered[V]:
        """The cache of a View made after a write: this base, a copy of this overlay with
        `stale` marked (call `bounded` once done marking, if marking more)."""
        over = dict(self.over)
        for name in stale:
            over[name] = None
        return Layered(self.base, over).bounded()

    def bounded(self) -> Layered[V]:
        """This, or compacted once the overlay holds more than `limit` names."""
        return self.compacted() if len(self.over) > limit(len(self.base)) else self

    def compacted(self) -> Layered[V]:
        """Base and overlay as one new base (a copy: the old ones may still be read, and
        written, on other threads), and an empty overlay; paced as the thread's runtime
        policy says (a refresh's gives way: decider.giving_way)."""
        base = dict(self.base)
        for name, value in paced(list(self.over.items())):
            if value is None:
                base.pop(name, None)
            else:
                base[name] = value
        return Layered(base, {})
