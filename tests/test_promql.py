"""decider.promql: every instant selector of a site's query, and only those, reads fresh samples."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from decider.promql import PromQLError, bound_age, check, format_duration

REWRITES = [
    (
        "max by (rack) (dcim_rack_inlet_temperature_celsius)",
        "max by (rack) (last_over_time(dcim_rack_inlet_temperature_celsius[2m]))",
    ),
    (
        'sum by (pdu) (pdu_outlet_power_watts{site="sto1", phase=~"L[12]"})',
        'sum by (pdu) (last_over_time(pdu_outlet_power_watts{site="sto1", phase=~"L[12]"}[2m]))',
    ),
    (
        '{__name__=~"crac_.*_alarm"} > bool 0',
        'last_over_time({__name__=~"crac_.*_alarm"}[2m]) > bool 0',
    ),
    ("x offset 5m", "last_over_time(x[2m] offset 5m)"),
    ("x offset -1m @ end()", "last_over_time(x[2m] offset -1m @ end())"),
    ("x @ 1700000000", "last_over_time(x[2m] @ 1700000000)"),
    # range selectors are left alone: their window bounds the age already
    ("rate(x_total[5m]) * 60", "rate(x_total[5m]) * 60"),
    ("max_over_time(x[10m] offset 1m)", "max_over_time(x[10m] offset 1m)"),
    # a subquery evaluates its selectors as instants: those are bounded
    ("max_over_time(x[10m:1m])", "max_over_time(last_over_time(x[2m])[10m:1m])"),
    (
        "max_over_time((x + y)[10m:])",
        "max_over_time((last_over_time(x[2m]) + last_over_time(y[2m]))[10m:])",
    ),
    # label lists, function names, keywords and numbers are not selectors
    (
        "sum without (a, b) (x) / on (c) group_left (d) y",
        "sum without (a, b) (last_over_time(x[2m])) / on (c) group_left (d) last_over_time(y[2m])",
    ),
    ("count(x) by (rack)", "count(last_over_time(x[2m])) by (rack)"),
    (
        "topk(3, x) or vector(Inf) unless vector(NaN)",
        "topk(3, last_over_time(x[2m])) or vector(Inf) unless vector(NaN)",
    ),
    (
        'label_replace(x, "rack", "$1", "cabinet", "cab-(.*)")',
        'label_replace(last_over_time(x[2m]), "rack", "$1", "cabinet", "cab-(.*)")',
    ),
    (
        "a:b:c / ignoring (phase) d",
        "last_over_time(a:b:c[2m]) / ignoring (phase) last_over_time(d[2m])",
    ),
    (
        "x # the DCIM's reading\n+ y",
        "last_over_time(x[2m]) # the DCIM's reading\n+ last_over_time(y[2m])",
    ),
    ("vector(1)", "vector(1)"),
]


@pytest.mark.parametrize(("query", "expected"), REWRITES, ids=[q for q, _ in REWRITES])
def test_each_instant_selector_reads_only_fresh_samples(query, expected):
    assert bound_age(query, 120) == expected


def test_the_rewritten_queries_are_promql(tmp_path):
    """promtool parses every rewrite (and the originals), so the lexer made no nonsense."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make debian-packages` installs it")
    rules = [
        {"record": f"check:rewrite_{i}:{which}", "expr": text}
        for i, (query, expected) in enumerate(REWRITES)
        for which, text in (("original", query), ("bounded", expected))
    ]
    path = tmp_path / "rewrites.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "rewrites", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("", "the query is empty"),
        ("max by (rack) (x", "'(' at character 15 is never closed"),
        ('x{rack="r1}', "a string opened at character 8 never ends"),
        ("x)", "unmatched ')' at character 2"),
        ("x[5m)", "unmatched ')'"),
        ("x ! y", "unexpected '!' at character 3"),
    ],
)
def test_queries_that_cannot_be_promql_are_refused(query, reason):
    with pytest.raises(PromQLError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        check(query)


@pytest.mark.parametrize(
    ("seconds", "text"), [(120, "2m"), (90, "90s"), (3600, "1h"), (0.5, "500ms"), (5400, "90m")]
)
def test_durations_are_written_as_promql_durations(seconds, text):
    assert format_duration(seconds) == text


# --- a property over generated queries --------------------------------------------------------

names = st.sampled_from(["x", "dcim_temp", "pdu:watts:sum", "crac_alarm"])
matchers = st.sampled_from(["", '{rack="r1"}', '{a=~"b.*", c!="d"}'])
modifiers = st.sampled_from(["", " offset 5m", " @ end()"])


@st.composite
def selector(draw: st.DrawFn) -> tuple[str, int]:
    return draw(names) + draw(matchers) + draw(modifiers), 1


def expression(depth: int = 3) -> st.SearchStrategy[tuple[str, int]]:
    """(a query, how many instant selectors it holds)."""
    leaves = st.one_of(
        selector(),
        st.tuples(names, matchers).map(lambda t: (f"rate({t[0]}{t[1]}[5m])", 0)),
        st.sampled_from([("1", 0), ("vector(0)", 0), ("Inf", 0)]),
    )
    if depth == 0:
        return leaves
    inner = expression(depth - 1)
    return st.one_of(
        leaves,
        st.tuples(st.sampled_from(["sum", "max"]), st.sampled_from(["", " by (rack)"]), inner).map(
            lambda t: (f"{t[0]}{t[1]} ({t[2][0]})", t[2][1])
        ),
        st.tuples(inner, st.sampled_from([" + ", " and on (rack) ", " > bool "]), inner).map(
            lambda t: (f"{t[0][0]}{t[1]}{t[2][0]}", t[0][1] + t[2][1])
        ),
        inner.map(lambda t: (f"max_over_time(({t[0]})[10m:1m])", t[1])),
        inner.map(lambda t: (f"abs({t[0]})", t[1])),
    )


@given(expression())
def test_every_instant_selector_is_bounded_once_and_only_once(generated):
    query, selectors = generated
    bounded = bound_age(query, 120)
    assert bounded.count("last_over_time(") == selectors
    assert bound_age(bounded, 120) == bounded  # a bounded selector is a range selector
    check(bounded)
