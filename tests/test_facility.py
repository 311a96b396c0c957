"""facility.yaml: accepted as documented, refused with file, line and reason; what it means."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decider import facility as facility_file
from decider.facility import BUILTIN_THRESHOLDS, Domain, DomainRef, Feed, limit_watts
from tests.facility_helpers import EXAMPLE, load, refusal

# --- the example and the defaults ---------------------------------------------------------------


def test_the_example_file_loads_as_documented():
    facility = facility_file.load(EXAMPLE)
    assert facility.defaults.margin == 0.10
    assert facility.defaults.derating == 0.80
    assert [str(ref) for ref, _ in facility.declared()] == [
        "site/sto1",
        "room/hall-b",
        "row/12",
        "rack/r12-07",
        "rack/r12-08",
        "pdu/r12-07-a",
        "pdu/r12-07-b",
    ]
    assert facility.cap_watts("rack", "r12-07") == pytest.approx(13840)  # 17300 * 0.8
    assert facility.cap_watts("rack", "r12-08") == 12000  # held below its feeds
    assert facility.cap_watts("pdu", "r12-07-a") == 13840
    assert facility.cap_watts("row", "12") == 120000
    assert facility.domain("rack", "r12-07").other_watts == 900
    assert facility.thresholds("row", "12").inlet_warm_c == 26
    assert facility.thresholds("row", "12").inlet_hot_c == 32
    assert facility.profiles["llama-70b-tp4"].power_watts == 2900
    assert facility.profiles["embedder-cpu"].cpu_cores == 16
    assert facility.node_share_watts == 350
    assert facility.cpu_watts_per_core.default == 6
    assert facility.mode == "observe"
    assert (facility.shedding.enabled, facility.shedding.hot_for) == (False, 600)
    assert facility.shedding.interval == 300
    signals = facility.signals.configured()
    assert list(signals) == ["inlet_temp_c", "power_watts", "cooling_alarm"]
    assert [(s.domain_label, s.kind, s.stale_after) for s in signals.values()] == [
        ("rack", "rack", 120),
        ("pdu", "pdu", 120),
        ("row", "row", 300),
    ]


def test_an_empty_file_is_refused_not_read_as_observe_with_no_budgets(tmp_path):
    # A truncated write must not switch enforcement off (issue 16): mode is required.
    assert refusal(tmp_path, "").endswith("facility.yaml:1: mode: Field required")
    assert refusal(tmp_path, "domains: {rack/r1: {cap_watts: 9000}}\n").endswith(
        "facility.yaml:1: mode: Field required"
    )


def test_a_file_of_mode_alone_is_a_site_with_no_facility_data(tmp_path):
    facility = load(tmp_path, "mode: observe\n")
    assert facility.domains == {}
    assert facility.defaults.margin == 0.10
    assert facility.defaults.derating == 0.80
    assert facility.mode == "observe"
    assert facility.signals.configured() == {}
    assert facility.cap_watts("rack", "r1") is None
    assert facility.thresholds("rack", "r1").model_dump() == BUILTIN_THRESHOLDS


def test_names_that_yaml_reads_as_numbers_are_names(tmp_path):
    facility = load(
        tmp_path,
        "domains:\n  row/12: {feeds: [{pdu: 7, rating_watts: 1000}]}\ncpu_watts_per_core: 8\n"
        "mode: enforce\n",
    )
    assert facility.domain("row", "12").feeds[0].pdu == "7"
    assert facility.cpu_watts_per_core.default == 8


# --- refusals -------------------------------------------------------------------------------


def test_every_problem_is_reported_at_once_with_its_line(tmp_path):
    message = refusal(
        tmp_path,
        (
            "defaults:\n"
            "  margin: 1.5\n"  # 2: out of range
            "  thresholds: {inlet_hot_c: 30}\n"
            "domains:\n"
            "  rak/r1: {cap_watts: 1000}\n"  # 5: bad key
            "  rack/r2:\n"
            "    feeds: [{pdu: a, rating_watts: -1}]\n"  # 7: negative rating
            "    colour: red\n"  # 8: unknown key
            "  row/12: {thresholds: {inlet_warm_c: 31}}\n"  # 9: warm above the default hot
            "  rack/r3: {cap_watts: 100, other_watts: 200}\n"  # 10: no room left
            "  rack/r4: {feeds: [{pdu: a, rating_watts: 9}, {pdu: a, rating_watts: 9}]}\n"  # 11
            "profiles:\n"
            "  idle: {gpus: 0}\n"  # 13: nothing to estimate from
            "mode: yolo\n"  # 14
            "shedding: {hot_for: 5 parsecs}\n"  # 15
            "signals:\n"
            "  inlet_temp_c: {query: 'max by (rack) (x', domain_label: rack}\n"  # 17
            "  power_watts: {query: x, domain_label: pdu_name}\n"  # 18: kind needed
            "  cooling_alarm: {query: x, domain_label: 'row-name'}\n"  # 19: not a label
            "extra: 1\n"  # 20
        ),
    )
    path = tmp_path / "facility.yaml"
    expected = [
        "2: defaults.margin: Input should be less than 1",
        "5: domains.rak/r1.[key]: Value error, 'rak/r1' is not kind/name with kind one of "
        "site, room, row, rack, pdu",
        "7: domains.rack/r2.feeds.0.rating_watts: Input should be greater than 0",
        "8: domains.rack/r2.colour: Extra inputs are not permitted",
        "9: domains.row/12.thresholds: inlet_warm_c 31 must be below inlet_hot_c 30 "
        "(from defaults)",
        "10: domains.rack/r3.other_watts: other_watts 200 leaves no room under the cap of 100 W",
        "11: domains.rack/r4.feeds: Value error, feed a is listed more than once",
        "13: profiles.idle: Value error, a profile with no GPUs needs cpu_cores or power_watts",
        "14: mode: Input should be 'observe' or 'enforce'",
        "15: shedding.hot_for: Value error, '5 parsecs' is not a duration",
        "17: signals.inlet_temp_c.query: Value error, '(' at character 15 is never closed",
        "18: signals.power_watts: Value error, kind is required: domain_label 'pdu_name' is "
        "not one of site, room, row, rack, pdu",
        "19: signals.cooling_alarm.domain_label: Value error, 'row-name' is not a Prometheus "
        "label name",
        "20: extra: Extra inputs are not permitted",
    ]
    lines = message.splitlines()
    for line_and_reason in expected:
        assert any(line.startswith(f"{path}:{line_and_reason}") for line in lines), (
            line_and_reason,
            message,
        )
    assert len(lines) == len(expected), message


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("rack", "'rack' is not kind/name"),
        ("cabinet/r1", "'cabinet/r1' is not kind/name"),
        ("Rack/r1", "'Rack/r1' is not kind/name"),
        ("rack/", "the name is empty"),
        ("rack/r1/a", "'r1/a' contains '/'"),
        ("'rack/ r1'", "' r1' starts or ends with a space"),
        ("pdu/a,b", "'a,b' contains ','"),
    ],
)
def test_a_bad_domain_key_is_refused_with_its_line(tmp_path, key, reason):
    message = refusal(tmp_path, f"mode: observe\ndomains:\n  {key}: {{cap_watts: 1000}}\n")
    assert f"{tmp_path / 'facility.yaml'}:3: domains." in message
    assert reason in message


def test_a_domain_named_twice_is_refused(tmp_path):
    message = refusal(tmp_path, "domains:\n  rack/r1: {}\n  rack/r1: {cap_watts: 5}\n")
    assert ":3: duplicate key 'rack/r1'" in message


def test_a_qualified_row_name_is_a_name(tmp_path):
    facility = load(tmp_path, "domains:\n  row/hall-b.12: {cap_watts: 1000}\nmode: observe\n")
    assert facility.declared()[0][0] == DomainRef("row", "hall-b.12")


def test_a_signal_on_a_label_that_is_no_kind_needs_one(tmp_path):
    facility = load(
        tmp_path,
        "signals:\n  power_watts: {query: 'sum by (pdu_name) (w)', domain_label: pdu_name, "
        "kind: pdu}\nmode: observe\n",
    )
    assert facility.signals.power_watts.kind == "pdu"
    message = refusal(
        tmp_path, "signals:\n  power_watts: {query: w, domain_label: rack, kind: cabinet}\n"
    )
    assert ":2: signals.power_watts.kind: Input should be 'site', 'room'" in message


PHASE_QUERY = (
    "sum by (pdu, phase) (label_replace(st4PhaseActivePower, 'phase', 'L$1', "
    "'st4PhaseLabel', '(?:.*:)?L([123])(?:-L[123])?'))"
)


def test_a_phase_signal_names_its_pdu_and_phase_labels(tmp_path):
    facility = load(
        tmp_path,
        "signals:\n  phase_power_watts:\n"
        f'    query: "{PHASE_QUERY}"\n'
        "    domain_label: pdu\n    phase_label: phase\n    stale_after: 1m\nmode: observe\n",
    )
    signal = facility.signals.phase_power_watts
    assert (signal.kind, signal.domain_label, signal.phase_label) == ("pdu", "pdu", "phase")
    assert signal.stale_after == 60
    assert list(facility.signals.configured()) == ["phase_power_watts"]


@pytest.mark.parametrize(
    ("signal", "reason"),
    [
        (
            "{query: w, domain_label: rack, phase_label: phase}",
            ":2: signals.phase_power_watts.kind: Value error, only a pdu has phases: kind "
            "'rack' is not pdu",
        ),
        (
            "{query: w, domain_label: pdu_name, kind: row, phase_label: phase}",
            ":2: signals.phase_power_watts.kind: Value error, only a pdu has phases",
        ),
        (
            "{query: w, domain_label: pdu}",
            ":2: signals.phase_power_watts.phase_label: Field required",
        ),
        (
            "{query: w, domain_label: pdu, phase_label: pdu}",
            ":2: signals.phase_power_watts: Value error, phase_label and domain_label are both "
            "'pdu'",
        ),
        (
            "{query: w, domain_label: pdu, phase_label: 'st4 phase'}",
            ":2: signals.phase_power_watts.phase_label: Value error, 'st4 phase' is not a "
            "Prometheus label name",
        ),
        (
            "{query: 'sum by (pdu, phase) (w', domain_label: pdu, phase_label: phase}",
            ":2: signals.phase_power_watts.query: Value error, '(' at character 21 is never closed",
        ),
    ],
)
def test_a_phase_signal_is_checked(tmp_path, signal, reason):
    assert reason in refusal(tmp_path, f"signals:\n  phase_power_watts: {signal}\nmode: observe\n")


def test_a_stale_after_shorter_than_a_second_is_refused(tmp_path):
    message = refusal(
        tmp_path, "signals:\n  inlet_temp_c: {query: t, domain_label: rack, stale_after: 500ms}\n"
    )
    assert ":2: signals.inlet_temp_c.stale_after: Value error, 0.5s is shorter" in message


# --- caps -----------------------------------------------------------------------------------


def test_a_dual_fed_cap_is_the_smallest_feed_times_derating_never_the_sum(tmp_path):
    facility = load(
        tmp_path,
        "defaults: {derating: 0.8}\n"
        "domains:\n"
        "  rack/r1:\n"
        "    feeds: [{pdu: a, rating_watts: 17300}, {pdu: b, rating_watts: 16000}]\n"
        "mode: enforce\n",
    )
    assert facility.cap_watts("rack", "r1") == pytest.approx(16000 * 0.8)


def test_cap_watts_is_used_as_given_and_the_smaller_cap_wins():
    feeds = (Feed(pdu="a", rating_watts=10000), Feed(pdu="b", rating_watts=10000))
    assert Domain(cap_watts=9000).cap(derating=0.8) == 9000  # no derating on a given cap
    assert Domain(cap_watts=6000, feeds=feeds).cap(derating=0.8) == 6000  # below the feeds
    assert Domain(cap_watts=9000, feeds=feeds).cap(derating=0.8) == 8000  # never above
    assert Domain().cap(derating=0.8) is None  # no budget
    assert Domain(thresholds={"inlet_warm_c": 25}).cap(derating=0.8) is None


def test_the_placement_limit_leaves_the_margin(tmp_path):
    facility = load(
        tmp_path,
        "defaults: {margin: 0.1}\ndomains:\n  rack/r1: {cap_watts: 16000}\nmode: enforce\n",
    )
    # As placement works it out (decider.placement.view: the cap, the domain's margin).
    limit = limit_watts(facility.cap_watts("rack", "r1"), facility.margin("rack", "r1"))
    assert limit == pytest.approx(14400)
    undeclared = facility.cap_watts("rack", "not-declared")
    assert limit_watts(undeclared, facility.margin("rack", "not-declared")) is None


@given(
    ratings=st.lists(
        st.floats(min_value=1, max_value=1e7, allow_nan=False), min_size=1, max_size=6
    ),
    derating=st.floats(min_value=0.01, max_value=1),
    cap_watts=st.none() | st.floats(min_value=1, max_value=1e7),
)
def test_a_cap_never_exceeds_the_smallest_feed_rating(ratings, derating, cap_watts):
    feeds = tuple(Feed(pdu=f"p{i}", rating_watts=rating) for i, rating in enumerate(ratings))
    cap = Domain(feeds=feeds, cap_watts=cap_watts).cap(derating)
    assert cap is not None
    assert cap <= min(ratings)
    assert cap == pytest.approx(min([min(ratings) * derating, cap_watts or float("inf")]))


# --- thresholds -----------------------------------------------------------------------------


def test_thresholds_fall_back_from_the_domain_to_defaults_to_the_built_ins(tmp_path):
    facility = load(
        tmp_path,
        "defaults:\n"
        "  thresholds: {inlet_hot_c: 30, throttled_hot_ratio: 0.5}\n"
        "domains:\n"
        "  row/12: {thresholds: {inlet_warm_c: 24, throttled_hot_ratio: 0.3}}\n"
        "  rack/r1: {cap_watts: 1000}\n"
        "mode: observe\n",
    )
    row = facility.thresholds("row", "12")
    assert (row.inlet_warm_c, row.inlet_hot_c) == (24, 30)  # own, defaults
    assert (row.throttled_hot_ratio, row.gpu_slowdown_margin_c) == (0.3, 5)  # own, built-in
    rack = facility.thresholds("rack", "r1")
    assert (rack.inlet_warm_c, rack.inlet_hot_c, rack.throttled_hot_ratio) == (27, 30, 0.5)
    # a domain the file does not declare follows the defaults too
    assert facility.thresholds("rack", "elsewhere") == rack
    # what the file sets, for the rendered overrides: never the built-ins
    assert facility.written_thresholds("row", "12") == {
        "inlet_warm_c": 24,
        "inlet_hot_c": 30,
        "throttled_hot_ratio": 0.3,
    }
    assert facility.written_thresholds("rack", "r1") == {
        "inlet_hot_c": 30,
        "throttled_hot_ratio": 0.5,
    }


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (
            "defaults:\n  thresholds: {inlet_warm_c: 32, inlet_hot_c: 32}\n",
            2,
            "defaults.thresholds: Value error, inlet_warm_c 32 must be below inlet_hot_c 32",
        ),
        (
            "defaults:\n  thresholds: {inlet_warm_c: 33}\n",
            2,
            "defaults.thresholds: Value error, inlet_warm_c 33 must be below inlet_hot_c 32 "
            "(built-in)",
        ),
        (
            "defaults:\n  thresholds: {inlet_warm_c: 20}\n"
            "domains:\n  rack/r1:\n    thresholds: {inlet_hot_c: 19}\n",
            5,
            "domains.rack/r1.thresholds: inlet_warm_c 20 (from defaults) must be below "
            "inlet_hot_c 19",
        ),
    ],
)
def test_warm_must_be_below_hot_once_fallbacks_apply(tmp_path, text, line, reason):
    message = refusal(tmp_path, text)
    assert f"{tmp_path / 'facility.yaml'}:{line}: {reason}" in message


def test_thresholds_out_of_range_are_refused(tmp_path):
    message = refusal(
        tmp_path,
        "defaults:\n"
        "  thresholds:\n"
        "    throttled_hot_ratio: 1.5\n"
        "    gpu_slowdown_margin_c: -1\n"
        "    inlet_warm_c: 0\n"
        "    inlet_hot_c: 90\n",
    )
    assert ":3: defaults.thresholds.throttled_hot_ratio: Input should be less than" in message
    assert ":4: defaults.thresholds.gpu_slowdown_margin_c: Input should be greater" in message
    assert ":5: defaults.thresholds.inlet_warm_c: Value error, 0 °C is not an inlet" in message
    assert (
        ":6: defaults.thresholds.inlet_hot_c: Value error, 90 °C is not an inlet temperature "
        "(°F? thresholds are °C)" in message
    )
