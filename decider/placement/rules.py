"""The registry: every placement rule once, by name, with its concern and what it reads.

A rule is one module (a `name`, its reason code in metrics; a `concern`; `reads`, the
fields of the plain data it reads, decider.placement.states) and one line here:

- `DOMAIN_FILTERS`: filters on one domain or phase that need no estimate (`refuse(state)`);
  the View has them work out each domain's refusals once (`domain_refusals`), and the
  answer cache compares those refusals between Views: a filter that reads only fields of
  the states (checked below) is never served stale;
- `ESTIMATE_FILTERS`: the filters that need the replica's estimate: `power_cap`, called
  by `judge` on every domain and phase of a node past its least room, and `predicted_peak`,
  on every oversubscribed domain of a node on its predicted basis;
- `ORDER`: the ordering scores, lower first, each with its range: `decide`, the answer's
  `scores` and the answer cache's packed rank all derive from this one table; the
  scheduler's own order breaks ties last.

Concerns (docs/decider.md "Observe and enforce"): `power`, `thermal`, each observed or
enforced as the facility file says; `always` (a hold): enforced whenever any concern is,
and, as every rule, only reported when the whole file observes (DESIGN.md §5).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from decider.placement import (
    condition,
    held,
    hot,
    over_cap,
    power_cap,
    predicted_peak,
    rack_room,
    spread,
)
from decider.placement.states import (
    Ask,
    Budgeted,
    DomainState,
    NodeState,
    PhaseState,
    Refusal,
)

#: The concerns the facility file sets a mode for, and the one no mode turns off.
CONCERNS = ("power", "thermal")
ALWAYS = "always"


class DomainFilter(Protocol):
    name: str
    concern: str
    reads: frozenset[str]

    def refuse(self, domain: Budgeted, /) -> str | None: ...


@dataclass(frozen=True)
class Order:
    """One ordering score: lower first, in [lowest, highest]; `concern` None: it orders
    whenever any concern is enforced."""

    name: str
    score: Callable[[NodeState, Ask], int]
    lowest: float
    highest: float
    concern: str | None


# --- the registry: one line per rule -----------------------------------------------------------

DOMAIN_FILTERS: tuple[DomainFilter, ...] = (held, hot, over_cap)
ESTIMATE_FILTERS = (power_cap, predicted_peak)
ORDER: tuple[Order, ...] = tuple(
    Order(rule.name, rule.score, rule.lowest, rule.highest, rule.concern)
    for rule in (condition, rack_room, spread)
)

# --- what follows from it ----------------------------------------------------------------------

#: The reason codes, in the order reasons are given.
RULES = (*(rule.name for rule in DOMAIN_FILTERS), power_cap.name)
#: predicted_peak refuses only where the facility file oversubscribes a domain (off by
#: default): its metrics' series appear with its first refusal, not with the others at 0.
#: The answer's `scores`, in order; the scheduler's order last.
SCHEDULER_ORDER = "scheduler_order"
ORDER_KEYS = (*(order.name for order in ORDER), SCHEDULER_ORDER)

_FIELDS = {field.name for field in dataclasses.fields(DomainState)} & {
    field.name for field in dataclasses.fields(PhaseState)
} | {"label", "ref"}


def concern_of(rule: str) -> str:
    """A registered rule's concern (a refusal's rule name); unknown names are enforced."""
    return _CONCERN_OF.get(rule, ALWAYS)


def check(filters: Iterable[DomainFilter], order: Iterable[Order]) -> None:
    """Every rule reads only what the states hold (so the cache sees each change of it) and
    serves a known concern; raises at import, not at the first placement."""
    for rule in filters:
        unread = set(rule.reads) - _FIELDS
        if unread:
            raise TypeError(f"rule {rule.name} reads {sorted(unread)}: not in the states")
        if rule.concern not in (*CONCERNS, ALWAYS):
            raise TypeError(f"rule {rule.name}: unknown concern {rule.concern!r}")
    for each in order:
        if each.concern not in (*CONCERNS, None):
            raise TypeError(f"score {each.name}: unknown concern {each.concern!r}")
        if not each.lowest <= each.highest:
            raise TypeError(f"score {each.name}: empty range")


_CONCERN_OF = {rule.name: rule.concern for rule in (*DOMAIN_FILTERS, *ESTIMATE_FILTERS)}
check((*DOMAIN_FILTERS, *ESTIMATE_FILTERS), ORDER)


def register(rule: DomainFilter) -> None:
    """Add a domain filter after the registry's own (a plug-in, or a test's): checked as
    the registry's are. Register before the decider serves: Views built after it run it,
    but the answer cache carries a node's answer over from View to View of one basis (after
    a reservation or a hold) until the next refresh or reload."""
    global DOMAIN_FILTERS
    check((rule,), ())
    DOMAIN_FILTERS = (*DOMAIN_FILTERS, rule)
    _CONCERN_OF[rule.name] = rule.concern


def unregister(name: str) -> None:
    global DOMAIN_FILTERS
    DOMAIN_FILTERS = tuple(rule for rule in DOMAIN_FILTERS if rule.name != name)
    _CONCERN_OF.pop(name, None)


def domain_refusals(domain: Budgeted) -> tuple[Refusal, ...]:
    """Every domain filter on one domain or phase, in the registry's order."""
    found: tuple[Refusal, ...] = ()
    for rule in DOMAIN_FILTERS:
        reason = rule.refuse(domain)
        if reason is not None:
            found += ((rule.name, reason),)
    return found


def scores(node: NodeState, ask: Ask) -> tuple[int, ...]:
    """The node's ordering scores, as `ORDER` lists them."""
    return tuple(order.score(node, ask) for order in ORDER)


def ordering_mask(enforced: frozenset[str]) -> tuple[bool, ...]:
    """Which scores order the allowed nodes when `enforced` concerns are enforced: an
    observed concern's score orders nothing, and with no concern enforced none does (the
    scheduler's order stands)."""
    if not enforced & set(CONCERNS):
        return tuple(False for _ in ORDER)
    return tuple(order.concern is None or order.concern in enforced for order in ORDER)


def masked(scored: tuple[int, ...], mask: tuple[bool, ...]) -> tuple[int, ...]:
    """The scores that order (0 in place of an observed concern's)."""
    return tuple(score if used else 0 for score, used in zip(scored, mask, strict=True))


def packing() -> tuple[tuple[float, int], ...]:
    """Per score, (lowest, bits): the widths the answer cache packs a rank with, below 2**53
    in all (a float exactly). A bounded score takes what its range needs; the unbounded
    share what is left, at most 21 bits each."""
    bounded = [
        _bits(o.highest - o.lowest)
        for o in ORDER
        if math.isfinite(o.lowest) and math.isfinite(o.highest)
    ]
    unbounded = sum(1 for o in ORDER if not (math.isfinite(o.lowest) and math.isfinite(o.highest)))
    share = min(21, (53 - sum(bounded)) // unbounded) if unbounded else 0
    found: list[tuple[float, int]] = []
    for order in ORDER:
        if math.isfinite(order.lowest) and math.isfinite(order.highest):
            found.append((order.lowest, _bits(order.highest - order.lowest)))
        elif math.isfinite(order.lowest):
            found.append((order.lowest, share))
        else:  # unbounded below: its highest is the top of the packed range
            found.append((order.highest - (1 << share) + 1, share))
    return tuple(found)


def _bits(span: float) -> int:
    """Bits that hold 0..span."""
    return max(1, math.ceil(math.log2(span + 1)))
