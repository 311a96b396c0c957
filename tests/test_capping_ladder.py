"""The capping ladder (decider.capping.ladder), pure: properties over generated domains and
readings, and the worked examples of docs/oversubscription.md."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, composite

from decider.capping.ladder import (
    ALL_CAPPED,
    LOWEST_CAPPED,
    UNCAPPED,
    ClassGpus,
    LadderState,
    LostFeed,
    advance,
    held_back,
    initial,
    lifted,
    release_line,
    safe_gpu_limit,
    worst_case,
)
from decider.facility import Ladder

#: Float sums in a different order: a worst case may pass the target by this much.
SLACK_W = 1e-6

SETTINGS = Ladder(first_threshold=0.90, second_threshold=0.97, release_margin=0.05, hold=600.0)


@composite
def ladders(draw: DrawFn) -> Ladder:
    first = draw(st.floats(0.5, 0.95))
    second = draw(st.floats(first + 0.01, 1.0))
    return Ladder(
        first_threshold=first,
        second_threshold=second,
        release_margin=draw(st.floats(0.0, first - 0.01)),
        hold=draw(st.sampled_from([1.0, 30.0, 600.0])),
        floor_gpu_watts=draw(st.none() | st.floats(50.0, 500.0)),
    )


@composite
def domains(draw: DrawFn) -> tuple[list[ClassGpus], float, float]:
    """Classes of GPUs (distinct names, ranks 0..n-1), what the domain draws besides them,
    and a budget somewhere between far below and above their worst case."""
    count = draw(st.integers(1, 4))
    groups = []
    for rank in range(count):
        limit = draw(st.floats(150.0, 1000.0))
        groups.append(
            ClassGpus(
                klass=["", "batch", "standard", "interactive"][rank],
                rank=rank,
                gpus=draw(st.integers(0, 64)),
                limit_watts=limit,
                min_limit_watts=draw(st.floats(0.0, limit)),
            )
        )
    other = draw(st.floats(0.0, 5000.0))
    uncapped = worst_case(groups, {}, other)
    budget = draw(st.floats(max(1.0, 0.3 * uncapped), max(2.0, 1.5 * uncapped)))
    return groups, other, budget


def lowest(group: ClassGpus, ladder: Ladder) -> float:
    return max(group.min_limit_watts, ladder.floor_gpu_watts or 0.0)


def check_caps(state: LadderState, groups: list[ClassGpus], ladder: Ladder) -> None:
    """Never a cap outside [max(card minimum, floor), limit]; none at step 0."""
    by_name = {group.klass: group for group in groups}
    if state.step == UNCAPPED:
        assert not state.caps
    for name, cap in state.caps.items():
        group = by_name[name]
        assert lowest(group, ladder) <= cap < group.limit_watts, (name, cap, group)


readings = st.lists(
    st.tuples(st.floats(1.0, 400.0), st.floats(0.0, 1.2)),  # (seconds later, share of budget)
    min_size=1,
    max_size=40,
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(domains(), ladders(), readings)
def test_caps_bring_the_worst_case_under_the_target_where_the_minimum_allows(
    domain: tuple[list[ClassGpus], float, float], ladder: Ladder, steps: list[tuple[float, float]]
) -> None:
    groups, other, budget = domain
    target = ladder.first_threshold * budget
    state, now = initial(0.0), 0.0
    for later, share in steps:
        now += later
        power = share * budget
        state = advance(state, now, power, budget, groups, ladder, other_watts=other)
        check_caps(state, groups, ladder)
        capped_ranks = {0} if state.step == LOWEST_CAPPED else None
        if state.step == UNCAPPED:
            continue
        worst = worst_case(groups, state.caps, other)
        if worst <= target + SLACK_W:
            continue
        # Over the target only where every class the step may cap is at its lowest.
        lowest_rank = min((g.rank for g in groups if g.gpus), default=0)
        for group in groups:
            if group.gpus == 0 or group.limit_watts <= lowest(group, ladder):
                continue
            if capped_ranks is not None and group.rank != lowest_rank:
                continue
            assert state.caps.get(group.klass) == pytest.approx(lowest(group, ladder)), state.reason


@hypothesis_settings(max_examples=300, deadline=None)
@given(domains(), ladders(), readings)
def test_no_release_before_hold_below_the_release_line(
    domain: tuple[list[ClassGpus], float, float], ladder: Ladder, steps: list[tuple[float, float]]
) -> None:
    groups, other, budget = domain
    state, now = initial(0.0), 0.0
    history: list[tuple[float, float]] = [(now, 0.0)]
    for later, share in steps:
        now += later
        power = share * budget
        before = state
        state = advance(before, now, power, budget, groups, ladder, other_watts=other)
        history.append((now, power))
        assert state.step >= before.step - 1, "one step at a time"
        if state.step < before.step:
            line = release_line(ladder, before.step, budget)
            calm = before.calm_since if before.calm_since is not None else now
            assert now - calm >= ladder.hold
            # every reading since the wait began was below the line, and what the release
            # lets the domain draw more (the caps it raises, by how much, at most) keeps it
            # under the ceiling (the budget where none is given)
            assert all(p < line for t, p in history if t >= calm), (history, calm, line)
            more = lifted(groups, before.caps, state.caps)
            assert power + more < budget, (power, more, budget, before.caps, state.caps)
            assert state.since == now
        elif state.step == before.step and state.step > UNCAPPED and state.lost_feed is None:
            # within a step caps only fall
            for name, cap in state.caps.items():
                assert cap <= before.caps.get(name, math.inf) + SLACK_W
            assert set(before.caps) <= set(state.caps) or not groups
        if share > ladder.second_threshold:
            assert state.step == ALL_CAPPED
        elif share > ladder.first_threshold:
            assert state.step >= LOWEST_CAPPED


@hypothesis_settings(max_examples=300, deadline=None)
@given(
    domains(),
    ladders(),
    st.floats(0.0, 1.2),
    st.floats(0.2, 1.0),
)
def test_with_a_feed_lost_the_caps_fit_the_survivors(
    domain: tuple[list[ClassGpus], float, float], ladder: Ladder, share: float, survive: float
) -> None:
    """Whatever the reading, a lost feed's caps bring the worst case under what the
    surviving feeds carry, or every class is at its lowest."""
    groups, other, budget = domain
    survivor_watts = survive * budget
    lost = LostFeed(("r1-b",), survivor_watts)
    state = advance(
        initial(0.0),
        10.0,
        share * budget,
        budget,
        groups,
        ladder,
        other_watts=other,
        lost_feed=lost,
    )
    check_caps(state, groups, ladder)
    worst = worst_case(groups, state.caps, other)
    if worst > survivor_watts + SLACK_W:
        for group in groups:
            if group.gpus and group.limit_watts > lowest(group, ladder):
                assert state.caps.get(group.klass) == pytest.approx(lowest(group, ladder))
    # and no release while it stays lost, however long power stays low
    later = advance(state, 1e6, 0.0, budget, groups, ladder, other_watts=other, lost_feed=lost)
    assert later.step == state.step
    assert worst_case(groups, later.caps, other) <= max(worst, survivor_watts) + SLACK_W


@hypothesis_settings(max_examples=500, deadline=None)
@given(
    st.floats(1000.0, 1e6),
    st.floats(0.0, 0.99),
    st.integers(1, 2000),
    st.floats(0.0, 800.0),
)
def test_a_safe_limit_always_fits_the_budget_at_the_estimates(
    budget: float, other_share: float, gpus: int, minimum: float
) -> None:
    other = other_share * budget
    limit, reason = safe_gpu_limit(budget, other, gpus, minimum)
    assert reason
    if limit is None:
        assert (budget - other) / gpus < minimum + 1
        assert "below the card minimum" in reason
    else:
        assert limit >= minimum
        assert other + gpus * limit <= budget + SLACK_W
        assert other + gpus * (limit + 1) > budget  # the highest whole watt that does


def test_safe_limit_of_no_gpu_is_none_with_a_reason() -> None:
    assert safe_gpu_limit(10_000, 0, 0, 100) == (
        None,
        "no GPU in the domain: no GPU limit fits its budget",
    )


# --- worked examples ----------------------------------------------------------------------


RACK = [
    ClassGpus("batch", 0, 16, 700.0, 200.0),
    ClassGpus("interactive", 1, 16, 700.0, 200.0),
]
# 32 GPUs at 700 W + 2 kW besides: 24.4 kW worst case against a 20 kW budget (oversubscribed).
BUDGET, OTHER = 20_000.0, 2_000.0


def test_step_one_caps_the_lowest_class_to_fit_the_target() -> None:
    state = advance(
        initial(0), 0, 18_100, BUDGET, RACK, SETTINGS, other_watts=OTHER, label="rack r1"
    )
    assert state.step == LOWEST_CAPPED
    # target 18 kW: 2000 + 16 * c + 16 * 700 <= 18000 -> c = 300
    assert dict(state.caps) == {"batch": 300.0}
    assert worst_case(RACK, state.caps, OTHER) == 18_000
    assert state.reason.startswith(
        "rack r1: 18.1 kW of 20.0 kW budget (0.91) > first threshold 0.9"
    )
    assert "class batch (16 GPUs, limit 700 W) to 300 W" in state.reason


def test_step_two_spreads_the_remainder_over_every_class() -> None:
    tight = 16_000.0  # target 14.4 kW: batch at 200 W leaves 14.4 - 2 - 3.2 = 9.2 for 16 GPUs
    state = advance(initial(0), 0, 0.98 * tight, tight, RACK, SETTINGS, other_watts=OTHER)
    assert state.step == ALL_CAPPED
    # batch alone at 200 W leaves a 16.4 kW worst case: interactive to 9.2 kW / 16 = 575 W
    assert dict(state.caps) == {"batch": 200.0, "interactive": 575.0}
    assert worst_case(RACK, state.caps, OTHER) == 14_400


def test_release_waits_for_hold_one_step_at_a_time() -> None:
    state = advance(initial(0), 0, 19_500, BUDGET, RACK, SETTINGS, other_watts=OTHER)
    assert state.step == ALL_CAPPED
    # batch to 300 W (the worst case to 18 kW), then 1.5 kW measured over it off both: 606 W
    assert dict(state.caps) == {"batch": 300.0, "interactive": 606.0}
    assert held_back(RACK, state.caps) == 16 * 400 + 16 * 94  # 7.9 kW, but a release of
    # step 2 lifts only interactive's cap (batch keeps its step-1 cap): 1.5 kW, and 18.4 kW
    # less a watt + 1.5 kW stays under the budget (the ceiling where none is given)
    line2 = release_line(SETTINGS, 2, BUDGET)  # 0.92 * 20 kW = 18.4 kW
    calm = line2 - 1
    state = advance(state, 60, calm, BUDGET, RACK, SETTINGS, other_watts=OTHER)
    assert (state.step, state.calm_since) == (ALL_CAPPED, 60)
    state = advance(state, 600, calm, BUDGET, RACK, SETTINGS, other_watts=OTHER)
    assert state.step == ALL_CAPPED  # 540 s of 600
    state = advance(state, 650, line2 + 1, BUDGET, RACK, SETTINGS, other_watts=OTHER)
    assert (state.step, state.calm_since) == (ALL_CAPPED, None)  # the wait starts again
    state = advance(state, 700, 9_000, BUDGET, RACK, SETTINGS, other_watts=OTHER)
    state = advance(state, 1300, 9_000, BUDGET, RACK, SETTINGS, other_watts=OTHER)
    assert (state.step, state.since) == (LOWEST_CAPPED, 1300)
    assert set(state.caps) == {"batch"}
    # 9 kW is below step 1's line too (0.85 * 20 = 17 kW), and it needs its own hold; its
    # release lifts batch's 6.4 kW: 15.4 kW, under the budget
    assert state.calm_since == 1300
    state = advance(state, 1899, 9_000, BUDGET, RACK, SETTINGS, other_watts=OTHER)
    assert state.step == LOWEST_CAPPED
    state = advance(state, 1900, 9_000, BUDGET, RACK, SETTINGS, other_watts=OTHER)
    assert (state.step, dict(state.caps)) == (UNCAPPED, {})
    assert "uncapped" in state.reason


def test_a_release_counts_what_the_caps_hold_back() -> None:
    """Power held down by the caps is not what the domain draws once they are lifted: at
    16 kW, under step 1's release line (17 kW), with batch capped to 300 W (up to 6.4 kW
    held back), the domain may draw 22.4 kW released, past its 22 kW cap: no release,
    however long. At 15 kW (21.4 kW released) it is released after the hold."""
    cap = 22_000.0
    state = advance(initial(0), 0, 18_100, BUDGET, RACK, SETTINGS, other_watts=OTHER)
    assert (state.step, dict(state.caps)) == (LOWEST_CAPPED, {"batch": 300.0})
    assert held_back(RACK, state.caps) == 6_400
    for now in (60, 700, 1_400, 5_000):
        state = advance(
            state, now, 16_000, BUDGET, RACK, SETTINGS, other_watts=OTHER, ceiling_watts=cap
        )
        assert (state.step, state.calm_since) == (LOWEST_CAPPED, None), state.reason
    assert "16.0 kW + up to 6.4 kW its caps hold back would reach its cap 22.0 kW" in state.reason
    for now in (5_060, 5_660):
        state = advance(
            state, now, 15_000, BUDGET, RACK, SETTINGS, other_watts=OTHER, ceiling_watts=cap
        )
    assert (state.step, dict(state.caps), state.since) == (UNCAPPED, {}, 5_660)


def test_a_lost_feed_caps_to_the_survivor_at_low_power_and_holds() -> None:
    lost = LostFeed(("r1-b",), 16_000.0)  # one survivor: 20 kW rating x 0.8
    state = advance(initial(0), 0, 9_000, BUDGET, RACK, SETTINGS, other_watts=OTHER, lost_feed=lost)
    # 24.4 kW worst case over 16 kW: batch to 200 W (-8 kW) leaves 16.4, then both to 187.5 -> 200
    assert state.step == ALL_CAPPED
    assert worst_case(RACK, state.caps, OTHER) <= 16_000 or set(state.caps.values()) == {200.0}
    assert "feed r1-b lost" in state.reason
    back = advance(state, 10_000, 9_000, BUDGET, RACK, SETTINGS, other_watts=OTHER)
    assert back.step == ALL_CAPPED and back.calm_since == 10_000  # back: the hold starts now


def test_bad_readings_are_refused_with_a_message() -> None:
    with pytest.raises(ValueError, match="is not a reading"):
        advance(initial(0), 0, math.nan, BUDGET, RACK, SETTINGS)
    with pytest.raises(ValueError, match="is not a budget"):
        advance(initial(0), 0, 1.0, 0.0, RACK, SETTINGS)
    with pytest.raises(ValueError, match="given twice"):
        advance(initial(0), 0, 1.0, BUDGET, [RACK[0], RACK[0]], SETTINGS)
