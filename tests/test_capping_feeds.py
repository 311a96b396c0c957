"""A lost feed in the decider (decider.capping.feeds, driven by decider.capping.driver) on
generated racks in-process: whatever the readings, with one feed lost the caps make the
rack's worst case fit its survivors (or every class is at its lowest), and a rack with no
feed reading, or every feed reading, has none lost."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from decider.capping.driver import Capper
from decider.capping.ladder import worst_case
from decider.facility import DomainRef
from tests.shedding_helpers import site

RACK = DomainRef("rack", "r1")
NODES = [f"n{i}" for i in range(4)]  # 8 GPUs at 700 W each (tests.shedding_helpers.Site)

readings = st.none() | st.sampled_from([0.0]) | st.floats(1.0, 40_000.0)


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    feeds=st.lists(readings, min_size=2, max_size=3),
    ratings=st.lists(st.floats(8_000.0, 40_000.0), min_size=3, max_size=3),
    rack_power=st.floats(0.0, 40_000.0),
    floor=st.none() | st.floats(100.0, 400.0),
)
def test_with_a_feed_lost_the_caps_fit_the_survivors(feeds, ratings, rack_power, floor):
    pdus = [f"r1-{chr(ord('a') + i)}" for i in range(len(feeds))]
    facility = {
        "defaults": {"margin": 0.0, "derating": 0.8},
        "node_share_watts": 0,
        "oversubscription": {"ladder": {"floor_gpu_watts": floor}},
        "domains": {
            "rack/r1": {
                "feeds": [
                    {"pdu": pdu, "rating_watts": rating}
                    for pdu, rating in zip(pdus, ratings, strict=False)
                ],
                "oversubscribe": True,
            }
        },
    }
    membership = {node: ["rack/r1", *(f"pdu/{pdu}" for pdu in pdus)] for node in NODES}
    with site(facility, membership) as made:
        made.measured = {RACK: rack_power} | {
            DomainRef("pdu", pdu): watts
            for pdu, watts in zip(pdus, feeds, strict=True)
            if watts is not None
        }
        made.refresh()
        capper = Capper(lambda: made.now)
        capper.refresh(made.state.view())
        (capping,) = capper.domains()
    state = capping.state
    dark = [pdu for pdu, watts in zip(pdus, feeds, strict=True) if not watts]
    if not dark or len(dark) == len(pdus):
        event("no feed lost")
        assert state.lost_feed is None
        return
    assert state.lost_feed is not None and list(state.lost_feed.pdus) == dark
    survivors = [r * 0.8 for pdu, r in zip(pdus, ratings, strict=False) if pdu not in dark]
    # failover's figures are rounded to a tenth of a watt
    expected = min(survivors) * len(survivors)
    assert state.lost_feed.survivor_watts == pytest.approx(expected, abs=0.05 * len(survivors))
    worst = worst_case(capping.groups, state.caps, capping.other_watts)
    event(
        "a feed lost, caps short"
        if worst > state.lost_feed.survivor_watts + 1e-6
        else "a feed lost, caps fit"
    )
    if worst > state.lost_feed.survivor_watts + 1e-6:
        for group in capping.groups:  # nothing more to take off
            assert state.caps.get(group.klass) == group.lowest(floor)
    for group in capping.groups:
        cap = state.caps.get(group.klass)
        assert cap is None or group.lowest(floor) <= cap < group.limit_watts
