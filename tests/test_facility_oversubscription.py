"""The facility file's `oversubscription` section and `oversubscribe` opt-in (issue 20):
read as written, off by default, every bad value refused at its line."""

from __future__ import annotations

import pytest

from decider.facility import Facility, Ladder, Oversubscription
from tests.facility_helpers import load, refusal

GOOD = """\
mode: enforce
oversubscription:
  percentile: 0.95
  window: 3d
  min_history: 12h
  ladder:
    first_threshold: 0.85
    second_threshold: 0.95
    release_margin: 0.04
    hold: 15m
    floor_gpu_watts: 250
    admission_headroom: 0.05
  lease: 90s
domains:
  rack/r1:
    cap_watts: 30000
    oversubscribe: true
  rack/r2: {cap_watts: 30000}
"""


def test_a_good_section_loads_as_written(tmp_path):
    facility = load(tmp_path, GOOD)
    settings = facility.oversubscription
    assert (settings.percentile, settings.window, settings.min_history, settings.lease) == (
        0.95,
        3 * 86400.0,
        12 * 3600.0,
        90.0,
    )
    assert settings.ladder == Ladder(
        first_threshold=0.85,
        second_threshold=0.95,
        release_margin=0.04,
        hold=900.0,
        floor_gpu_watts=250.0,
        admission_headroom=0.05,
    )
    assert settings.ladder.admit_to == pytest.approx(0.80)
    assert facility.domains["rack/r1"].oversubscribe is True
    assert facility.domains["rack/r2"].oversubscribe is False


def test_off_by_default_with_the_documented_settings(tmp_path):
    facility = load(tmp_path, "mode: observe\ndomains:\n  rack/r1: {cap_watts: 1000}\n")
    assert not any(domain.oversubscribe for domain in facility.domains.values())
    assert facility.oversubscription == Oversubscription() == Facility().oversubscription
    settings = facility.oversubscription
    assert (settings.percentile, settings.window, settings.min_history, settings.lease) == (
        0.99,
        7 * 86400.0,
        86400.0,
        60.0,
    )
    assert settings.ladder == Ladder(
        first_threshold=0.97,
        second_threshold=0.99,
        release_margin=0.05,
        hold=600.0,
        floor_gpu_watts=None,
        admission_headroom=0.02,
    )
    assert settings.ladder.admit_to == 0.95


@pytest.mark.parametrize(
    ("section", "line", "reason"),
    [
        ("  percentile: 0", 3, "oversubscription.percentile: Input should be greater than 0"),
        ("  percentile: 1.5", 3, "oversubscription.percentile: Input should be less than or"),
        ("  percentile: '0.99'", 3, "oversubscription.percentile: Input should be a valid number"),
        ("  window: 7 weeks", 3, "oversubscription.window: Value error, '7 weeks' is not a"),
        ("  window: 400d", 3, "oversubscription.window: Value error, '400d' is more than a year"),
        (
            "  window: 1d\n  min_history: 2d",
            3,
            "oversubscription: Value error, min_history 2d is longer than window 1d",
        ),
        ("  lease: 2s", 3, "oversubscription.lease: Value error, a lease of 2s is shorter than 5s"),
        (
            "  ladder: {first_threshold: 0}",
            3,
            "oversubscription.ladder.first_threshold: Input should be greater",
        ),
        (
            "  ladder: {second_threshold: 1.2}",
            3,
            "oversubscription.ladder.second_threshold: Input should be less",
        ),
        (
            "  ladder: {first_threshold: 0.97, second_threshold: 0.9}",
            3,
            "oversubscription.ladder: Value error, first_threshold 0.97 must be below "
            "second_threshold 0.9",
        ),
        (
            "  ladder: {first_threshold: 0.9, second_threshold: 0.9}",
            3,
            "oversubscription.ladder: Value error, first_threshold 0.9 must be below "
            "second_threshold 0.9: the lowest class is capped first",
        ),
        (
            "  ladder: {first_threshold: 0.3, second_threshold: 0.5, release_margin: 0.3}",
            3,
            "oversubscription.ladder: Value error, release_margin 0.3 must be below "
            "first_threshold 0.3",
        ),
        (
            "  ladder: {release_margin: -0.01}",
            3,
            "oversubscription.ladder.release_margin: Input should be greater",
        ),
        (
            "  ladder: {hold: never}",
            3,
            "oversubscription.ladder.hold: Value error, 'never' is not a duration",
        ),
        (
            "  ladder: {floor_gpu_watts: 0}",
            3,
            "oversubscription.ladder.floor_gpu_watts: Input should be greater",
        ),
        (
            "  ladder: {floor_gpu_watts: 60000}",
            3,
            "oversubscription.ladder.floor_gpu_watts: Input should be less",
        ),
        (
            "  ladder: {admission_headroom: -0.01}",
            3,
            "oversubscription.ladder.admission_headroom: Input should be greater",
        ),
        (
            "  ladder: {first_threshold: 0.4, second_threshold: 0.6, admission_headroom: 0.4}",
            3,
            "oversubscription.ladder: Value error, admission_headroom 0.4 must be below "
            "first_threshold 0.4: admission would fill nothing",
        ),
        ("  capping: on", 3, "oversubscription.capping: Extra inputs are not permitted"),
    ],
)
def test_each_bad_setting_is_refused_at_its_line(tmp_path, section, line, reason):
    message = refusal(tmp_path, f"mode: observe\noversubscription:\n{section}\n")
    assert f"{tmp_path / 'facility.yaml'}:{line}: {reason}" in message, message
    assert len(message.splitlines()) == 1, message


def test_a_bad_opt_in_is_refused_at_its_line(tmp_path):
    message = refusal(
        tmp_path,
        (
            "mode: observe\n"
            "domains:\n"
            "  rack/r1: {cap_watts: 1000, oversubscribe: 'yes'}\n"  # 3: text, not a boolean
            "  rack/r2:\n"
            "    oversubscribe: true\n"  # 5: nothing to oversubscribe
        ),
    )
    path = tmp_path / "facility.yaml"
    lines = message.splitlines()
    assert f"{path}:3: domains.rack/r1.oversubscribe: Input should be a valid boolean" in lines[0]
    assert lines[1] == (
        f"{path}:5: domains.rack/r2.oversubscribe: no budget to oversubscribe: give the "
        "domain cap_watts or feeds"
    ), message
    assert len(lines) == 2, message


def test_a_fed_domain_can_opt_in(tmp_path):
    facility = load(
        tmp_path,
        "mode: observe\ndomains:\n"
        "  rack/r1: {feeds: [{pdu: a, rating_watts: 17300}], oversubscribe: true}\n",
    )
    assert facility.domains["rack/r1"].oversubscribe
