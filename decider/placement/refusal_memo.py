"""A speed layer beside `judge`: each domain's and phase's filter refusals worked out once per
View (decider.placement.rules.domain_refusals), not once per node and replica shape.

`judge` runs the registry's domain filters (held, hot, over_cap and any registered) on every
domain and phase of a node; a rack's 40 nodes, each judged for a few replica shapes, would
run them on the same rack state a hundred times or more. The View holds one memo
(View.domain_refusals) unless made with `memo_refusals=False`, which runs the filters at
each call: tests/test_placement_answers.py holds the answers equal either way.

Correct because a filter reads only the fields of the state it is given (rules.check holds
each rule to its declared `reads`) and the states are frozen: the same state object gives
the same refusals. Keyed by the state's identity (the state is kept with its refusals, so
its id is not reused while the memo holds it). Shared by the Views of one basis: a View
that settles after a reservation or a hold (View.settle) carries it over, as it does the
states the change did not touch (those it replaced are new objects, worked out anew), so
that a write's next placements do not run the filters again on the site's unchanged
domains; a refresh or a reload starts a new one, and so does a View made after a rule was
registered or unregistered (`still_current`). The rules never import this module.
"""

from __future__ import annotations

from collections.abc import Callable

from decider.placement import rules
from decider.placement.states import Budgeted, Refusal

#: States held at most; past it the memo starts again (a View reads each of its site's
#: domains and phases, a few thousand; only a View asked about made-up domains goes past).
KEPT = 100_000


def remembered() -> Callable[[Budgeted], tuple[Refusal, ...]]:
    """`rules.domain_refusals`, remembered per domain or phase state: a new memo (a closure
    over a dict: a third cheaper per call than a method, and `judge` makes one call per
    domain and phase of every node it judges)."""
    found: dict[int, tuple[Budgeted, tuple[Refusal, ...]]] = {}
    get = found.get
    work_out = rules.domain_refusals
    registry = rules.DOMAIN_FILTERS

    def refusals(domain: Budgeted) -> tuple[Refusal, ...]:
        hit = get(id(domain))
        if hit is not None and hit[0] is domain:
            return hit[1]
        refused = work_out(domain)
        if len(found) >= KEPT:
            found.clear()
        found[id(domain)] = (domain, refused)
        return refused

    refusals.registry = registry  # type: ignore[attr-defined]
    return refusals


def still_current(memo: Callable[[Budgeted], tuple[Refusal, ...]]) -> bool:
    """Whether `memo` was made for the registry's filters as they are now (no rule
    registered or unregistered since): a View that settles carries it over only then."""
    return getattr(memo, "registry", None) is rules.DOMAIN_FILTERS
