"""The capping ladder of an oversubscribed domain (issue 20, docs/oversubscription.md): a pure
function of its state, the time, the domain's power and budget and its GPUs by shedding
class. No I/O, no clock: the decider (decider.capping.driver) and the week simulator
(llmgw_sim.week) both drive it.

- **Up at once.** Power above `first_threshold` x budget: step 1, the lowest class capped
  (the groups of the lowest `rank`; the caller ranks replicas with no class, and nodes with
  no reservation, there). Above `second_threshold` x budget: step 2, every class capped.
  Going up waits for nothing: it is the safe direction.
- **Down one step at a time, after `hold`.** A step is released only after power has
  stayed below its release line, (its threshold - `release_margin`) x budget, for `hold`
  seconds, **and** power plus what its caps hold back stays below `ceiling_watts` (the
  domain's cap, rating x derating: past it an excursion counts). Power held down by the
  caps is not what the domain draws once they are lifted: judged alone, a release could
  put the domain past its cap, or past a rating (the week simulated at derating 0.9 did).
  What the caps hold back is not measured: `lifted` bounds what a release lets the domain
  draw more, each GPU whose cap the release raises by how much (from step 2: the classes
  above the lowest to their limit, the lowest to its step-1 cap at this reading; from
  step 1: the lowest class to its limit). The bound is not held to the release line:
  step 1 caps the lowest class against the worst case, to its minimum in a domain
  oversubscribed past what that class can absorb, and power plus that bound stayed over
  the release line all day (the week simulated so: 10 % of domain-time capped, 4.5 % of
  tokens lost); past the release
  line after a release, the ladder caps again within the reaction time, and the hold
  keeps that from flapping. The next step down needs its own `hold` below its own line. A
  reading at or above either line starts the wait again (`calm_since`). A step never ends
  sooner.
- **The caps.** The highest whole-watt per-GPU cap, the same for every class it caps, that
  brings the domain's **worst case** (each GPU at its cap, the rest at their uncapped
  limit, plus `other_watts`: what the domain draws besides its GPUs at worst, the caller's
  estimate) under the target, first_threshold x budget; or that takes off what the
  measurement says is over it (power - target, assuming each GPU draws its limit: the most
  a cap can save), whichever is more. Step 1 caps the lowest class alone; step 2 keeps it
  at its step-1 cap and spreads the remainder over every class. A class is never capped
  below `max(min_limit_watts, floor_gpu_watts)` nor above its limit: where that floor
  stops the cut short, the worst case stays over the target and the reason says by how
  much. Within a step caps only fall (the lowest seen since it began): they rise only with
  a release, so a noisy reading cannot move them up and down.
- **A lost feed** (`LostFeed`, worked out by the caller: decider.capping.feeds): the worst
  case must then fit what the surviving feeds carry (`survivor_watts`: rating x derating,
  shared evenly), whatever the measured power says; the ladder goes to the step that needs
  (lowest class first, then every class) and releases nothing while the feed is lost.
- **The safe limit** (`safe_gpu_limit`): the per-GPU limit at which the domain fits its
  budget at the estimates with every GPU at it, which every lease carries for the node
  agent to fall back to (docs/oversubscription.md, "Safety").

`power_watts` is what the budget is compared to: the domain's measured load, with what no
node reports (`other_watts` of the facility file) added as admission adds it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from decider.facility import Ladder

#: The steps: uncapped, the lowest class capped, every class capped.
UNCAPPED, LOWEST_CAPPED, ALL_CAPPED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class ClassGpus:
    """The GPUs of one shedding class in one domain."""

    klass: str  # shedding class name; "" for replicas with no class
    rank: int  # 0 = capped first (the lowest class: last of `classes`)
    gpus: int
    limit_watts: float  # each GPU's uncapped enforced limit
    min_limit_watts: float  # the card's minimum limit

    def lowest(self, floor: float | None) -> float:
        """The lowest cap this class may get: the card's minimum, or the floor above it."""
        return max(self.min_limit_watts, floor or 0.0)

    @property
    def name(self) -> str:
        return f"class {self.klass}" if self.klass else "the replicas with no class"


@dataclass(frozen=True, slots=True)
class LostFeed:
    """A feed of the domain lost (decider.capping.feeds): the pdus that read nothing and
    what the survivors carry together (each one's rating x derating, the tightest times
    their number: the load is shared evenly, as decider.shedding.failover has it)."""

    pdus: tuple[str, ...]
    survivor_watts: float


@dataclass(frozen=True, slots=True)
class LadderState:
    step: int  # 0 uncapped, 1 lowest class capped, 2 every class capped
    caps: Mapping[str, float]  # class -> per-GPU cap in W (absent: uncapped)
    since: float  # when this step began (seconds, the caller's clock)
    calm_since: float | None  # since when power has stayed under the release line
    reason: str  # with figures
    #: The lost feed the caps answer, if any (None: every feed reads).
    lost_feed: LostFeed | None = field(default=None)


def initial(now: float, reason: str = "uncapped: the ladder has not run yet") -> LadderState:
    """A domain's state before its first reading: uncapped since `now`."""
    return LadderState(UNCAPPED, MappingProxyType({}), now, None, reason)


def threshold(settings: Ladder, step: int) -> float:
    """The share of the budget above which `step` is entered (1 or 2)."""
    return settings.first_threshold if step == LOWEST_CAPPED else settings.second_threshold


def release_line(settings: Ladder, step: int, budget_watts: float) -> float:
    """Power must stay below this for `hold` before `step` is released."""
    return (threshold(settings, step) - settings.release_margin) * budget_watts


def worst_case(groups: Iterable[ClassGpus], caps: Mapping[str, float], other_watts: float) -> float:
    """Every GPU at its cap (else its limit), plus what the domain draws besides its GPUs."""
    return other_watts + sum(
        group.gpus * min(caps.get(group.klass, group.limit_watts), group.limit_watts)
        for group in groups
    )


def held_back(groups: Iterable[ClassGpus], caps: Mapping[str, float]) -> float:
    """The most the caps hold back: each capped GPU at its limit less its cap."""
    return lifted(groups, caps, {})


def lifted(
    groups: Iterable[ClassGpus], before: Mapping[str, float], after: Mapping[str, float]
) -> float:
    """The most the domain may draw more going from the caps `before` to the caps `after`:
    each GPU whose cap rises, by how much (absent: its limit)."""
    return sum(
        group.gpus
        * max(
            0.0,
            min(after.get(group.klass, group.limit_watts), group.limit_watts)
            - min(before.get(group.klass, group.limit_watts), group.limit_watts),
        )
        for group in groups
    )


def _uniform_cut(
    groups: Sequence[ClassGpus], base: Mapping[str, float], cut: float, floor: float | None
) -> tuple[dict[str, float], float]:
    """The highest whole-watt cap c over `groups` (each at min(its base, max(its lowest, c)))
    that saves at least `cut` watts from their base, assuming each GPU draws its base: the
    caps and the watts still missing (0 where the cut is made)."""
    if cut <= 0 or not groups:
        return {}, max(0.0, cut)

    def at(group: ClassGpus, cap: float) -> float:
        return float(min(base[group.klass], max(group.lowest(floor), cap)))

    def saving(cap: float) -> float:
        return sum(group.gpus * (base[group.klass] - at(group, cap)) for group in groups)

    low = math.floor(min(group.lowest(floor) for group in groups))
    most = saving(low)  # every group at its lowest
    if most < cut:
        return {group.klass: at(group, low) for group in groups}, cut - most
    high = math.ceil(max(base[group.klass] for group in groups))  # saves nothing: < cut
    while high - low > 1:  # saving(low) >= cut > saving(high); saving falls as the cap rises
        middle = (low + high) // 2
        if saving(middle) >= cut:
            low = middle
        else:
            high = middle
    return {group.klass: at(group, low) for group in groups}, 0.0


@dataclass(frozen=True, slots=True)
class _Fit:
    caps: dict[str, float]
    short_watts: float  # over the target still, every capped class at its lowest
    needs: int  # the step the fit took: 0 nothing to cut, 1 the lowest class did, 2 all


def _fit(
    step: int,
    groups: Sequence[ClassGpus],
    other_watts: float,
    target_watts: float,
    power_watts: float,
    floor: float | None,
) -> _Fit:
    """The caps of `step` (see the module doc) against `target_watts`."""
    limits = {group.klass: group.limit_watts for group in groups}
    measured_excess = power_watts - target_watts
    first_cut = max(worst_case(groups, {}, other_watts) - target_watts, measured_excess)
    if step == UNCAPPED or first_cut <= 0 or not groups:
        return _Fit({}, 0.0, UNCAPPED)
    lowest_rank = min(group.rank for group in groups)
    lowest = [group for group in groups if group.rank == lowest_rank]
    caps, short = _uniform_cut(lowest, limits, first_cut, floor)
    if step == LOWEST_CAPPED or len(lowest) == len(groups):
        return _Fit(_capped(groups, caps), short, LOWEST_CAPPED if short == 0 else ALL_CAPPED)
    base = limits | caps
    second_cut = max(worst_case(groups, base, other_watts) - target_watts, measured_excess)
    if second_cut <= 0:
        return _Fit(_capped(groups, caps), 0.0, LOWEST_CAPPED)
    spread, short = _uniform_cut(groups, base, second_cut, floor)
    return _Fit(_capped(groups, base | spread), short, ALL_CAPPED)


def _capped(groups: Sequence[ClassGpus], caps: Mapping[str, float]) -> dict[str, float]:
    """The caps below their class's limit: a cap at the limit is no cap."""
    return {
        group.klass: caps[group.klass]
        for group in groups
        if group.klass in caps and caps[group.klass] < group.limit_watts
    }


def _lower_of(
    groups: Sequence[ClassGpus], floor: float | None, *caps: Mapping[str, float]
) -> dict[str, float]:
    """Per class the lowest of `caps`, kept within [its lowest, its limit]; classes no
    longer in `groups` dropped."""
    found: dict[str, float] = {}
    for group in groups:
        values = [each[group.klass] for each in caps if group.klass in each]
        if values:
            value = max(min(values), group.lowest(floor))
            if value < group.limit_watts:
                found[group.klass] = value
    return found


def _check(power_watts: float, budget_watts: float, groups: Sequence[ClassGpus]) -> None:
    if not math.isfinite(power_watts) or power_watts < 0:
        raise ValueError(f"power {power_watts!r} W is not a reading (a finite number >= 0)")
    if not math.isfinite(budget_watts) or budget_watts <= 0:
        raise ValueError(f"budget {budget_watts!r} W is not a budget (a finite number > 0)")
    names = [group.klass for group in groups]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"class {', '.join(map(repr, repeated))} given twice: one group each")
    for group in groups:
        if group.gpus < 0 or not group.limit_watts > 0 or not group.min_limit_watts >= 0:
            raise ValueError(f"{group}: gpus >= 0, limit > 0 and minimum >= 0 W are needed")


def _kw(watts: float) -> str:
    return f"{watts / 1000:.1f}"


def _describe_caps(groups: Sequence[ClassGpus], caps: Mapping[str, float]) -> str:
    parts = [
        f"{group.name} ({group.gpus} GPUs, limit {group.limit_watts:g} W) "
        f"to {caps[group.klass]:g} W"
        for group in sorted(groups, key=lambda each: (each.rank, each.klass))
        if group.klass in caps
    ]
    return "capping " + ", ".join(parts) if parts else "nothing to cap"


@dataclass(frozen=True, slots=True)
class _Move:
    step: int
    since: float
    calm_since: float | None
    released: bool
    words: tuple[str, ...]


def _move(
    state: LadderState,
    now: float,
    power_watts: float,
    budget_watts: float,
    settings: Ladder,
    feed_lost: bool,
    held_watts: float,
    ceiling_watts: float,
) -> _Move:
    """The step after this reading: up at once past a threshold, down one step after `hold`
    below the release line with power plus `held_watts` (what the caps hold back, at most)
    below `ceiling_watts` (never while a feed is lost)."""
    share = power_watts / budget_watts
    wanted = UNCAPPED
    if share > settings.second_threshold:
        wanted = ALL_CAPPED
    elif share > settings.first_threshold:
        wanted = LOWEST_CAPPED
    step, calm = state.step, state.calm_since
    if wanted > step:
        which = "second" if wanted == ALL_CAPPED else "first"
        words = f"> {which} threshold {threshold(settings, wanted):g}"
        return _Move(wanted, now, None, False, (words,))
    if step == UNCAPPED:
        return _Move(step, state.since, None, False, ())
    line = release_line(settings, step, budget_watts)
    if feed_lost:
        return _Move(step, state.since, None, False, (f"step {step} held: a feed is lost",))
    if power_watts >= line:
        words = f"step {step} held: at or above its release line {_kw(line)} kW"
        return _Move(step, state.since, None, False, (words,))
    if power_watts + held_watts >= ceiling_watts:  # what the domain may draw once released
        words = (
            f"step {step} held: {_kw(power_watts)} kW + up to {_kw(held_watts)} kW its caps "
            f"hold back would reach its cap {_kw(ceiling_watts)} kW"
        )
        return _Move(step, state.since, None, False, (words,))
    calm = now if calm is None else calm
    if now - calm < settings.hold:
        words = f"below the release line {_kw(line)} kW for {now - calm:.0f} of {settings.hold:g} s"
        return _Move(step, state.since, calm, False, (words,))
    words = f"released to step {step - 1} after {now - calm:.0f} s below {_kw(line)} kW"
    step -= 1
    below_next = step > UNCAPPED and power_watts < release_line(settings, step, budget_watts)
    return _Move(step, now, now if below_next else None, True, (words,))


def advance(
    state: LadderState,
    now: float,
    power_watts: float,
    budget_watts: float,
    groups: Sequence[ClassGpus],
    settings: Ladder,
    *,
    other_watts: float = 0.0,
    lost_feed: LostFeed | None = None,
    label: str = "",
    ceiling_watts: float | None = None,
) -> LadderState:
    """The ladder's next state after a reading (see the module doc). `other_watts`: what the
    domain draws besides its GPUs at worst (the caller's estimate; 0 counts GPUs alone);
    `lost_feed`: a feed of the domain lost; `label`: how reasons name the domain
    (`rack r1`); `ceiling_watts`: no release may let power plus what the caps hold back reach
    it (the domain's cap, rating x derating; None: the budget). Raises ValueError on a
    reading or budget that is not a number, or a class given twice."""
    _check(power_watts, budget_watts, groups)
    groups = [group for group in groups if group.gpus > 0]
    floor = settings.floor_gpu_watts
    target = settings.first_threshold * budget_watts
    # What a release from this step would let the domain draw more: the caps it lifts, to
    # the caps of the step below worked out at this reading (none below step 1).
    held = 0.0
    if state.step > UNCAPPED:
        below = state.step - 1
        after = _fit(below, groups, other_watts, target, power_watts, floor).caps if below else {}
        held = lifted(groups, state.caps, after)
    ceiling = budget_watts if ceiling_watts is None else ceiling_watts
    move = _move(
        state, now, power_watts, budget_watts, settings, lost_feed is not None, held, ceiling
    )
    step, since, calm = move.step, move.since, move.calm_since

    fit = _fit(step, groups, other_watts, target, power_watts, floor)
    caps = fit.caps
    feed_words = ""
    if lost_feed is not None:
        survivors = lost_feed.survivor_watts
        survive = _fit(ALL_CAPPED, groups, other_watts, survivors, power_watts, floor)
        if survive.needs > step:
            step, since, calm = survive.needs, now, None
        caps = _lower_of(groups, floor, caps, survive.caps)
        feed_words = (
            f"; feed {', '.join(lost_feed.pdus)} lost: the worst case must fit the survivors' "
            f"{_kw(survivors)} kW"
        )
        if survive.short_watts > 0:
            feed_words += f", still {_kw(survive.short_watts)} kW over at the lowest caps"
    if not move.released and step > UNCAPPED and state.step > UNCAPPED:
        caps = _lower_of(groups, floor, caps, state.caps)  # within a step caps only fall
    if step == UNCAPPED:
        caps = {}

    share = power_watts / budget_watts
    text = (
        f"{label + ': ' if label else ''}{_kw(power_watts)} kW of {_kw(budget_watts)} kW "
        f"budget ({share:.2f})"
    )
    said = "; ".join(move.words)
    if step == UNCAPPED:
        text += ": uncapped" + (f" ({said})" if said else "")
    else:
        worst = worst_case(groups, caps, other_watts)
        # "> first threshold 0.9" reads on from the figures; anything else is a clause
        joined = (" " if said.startswith(">") else "; ") + said if said else ""
        text += f"{joined}: step {step}, {_describe_caps(groups, caps)}"
        text += f"; worst case {_kw(worst)} kW against the target {_kw(target)} kW"
        if fit.short_watts > 0:
            text += (
                f", {_kw(fit.short_watts)} kW more than the caps can take off at "
                "max(card minimum, floor)"
            )
    return LadderState(
        step=step,
        caps=MappingProxyType(caps),
        since=since,
        calm_since=calm,
        reason=text + feed_words,
        lost_feed=lost_feed,
    )


def safe_gpu_limit(
    budget_watts: float, other_watts: float, gpus: int, min_limit_watts: float
) -> tuple[float | None, str]:
    """The whole-watt per-GPU limit at which the domain fits its budget at the estimates with
    every one of its `gpus` GPUs at it (`other_watts`: the rest of its estimate); None where
    that is below the card's minimum (or the domain has no GPU), with the reason."""
    if gpus <= 0:
        return None, "no GPU in the domain: no GPU limit fits its budget"
    exact = (budget_watts - other_watts) / gpus
    limit = float(math.floor(exact + 1e-9))
    figures = (
        f"({_kw(budget_watts)} kW budget - {_kw(other_watts)} kW besides GPUs) / {gpus} GPUs"
        f" = {exact:.0f} W"
    )
    if limit < min_limit_watts:
        return None, f"{figures}, below the card minimum {min_limit_watts:g} W"
    return limit, f"{figures} per GPU"
