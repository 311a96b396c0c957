"""The rules in layers, sharded, on real servers (issue 21; docs/rules.md, "Layers").

Three Prometheus shards each scrape a third of a small fleet (tests/shard_helpers.py) and
evaluate the node layer (rules/node.yml), labelled apart by a `shard` external label. Two
global views evaluate the domain layer (rules/domain.yml, rules/conditions.yml) from the
node layer's output only: VictoriaMetrics with vmalert, fed by the shards' remote write,
and a Prometheus federating the shards. A single Prometheus scraping the whole fleet and
evaluating every layer is the reference: each global view must give its domain series and
conditions, series by series, within the lag the extra hop adds. A rack whose nodes are in
two shards, and a pdu feeding racks in two shards, come out right; with one shard down its
domains go `unknown`, their readings missing and their age growing, and nothing else
changes.

The rules run 15 times faster than in production (2-s evaluations, 9-s enter holds), as
the demo scales them; the waits are on conditions, with deadlines generous for busy cores.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.promstack import Server, metrics_target, victoria_metrics
from tests.shard_helpers import (
    DOMAIN_LAYER,
    NODE_LAYER,
    SHARDS,
    Fleet,
    conditions,
    federate,
    host_port,
    prometheus_server,
    query,
    scaled_rule_files,
    scrape,
    vmalert_server,
)

pytestmark = pytest.mark.servers

REPO = Path(__file__).resolve().parent.parent
FACTOR = 15  # the rules' 30 s interval becomes 2 s
INTERVAL_S = 30 / FACTOR
#: How far back an instant selector looks in the global views (vmalert's queryStep and these
#: queries' `step` in VictoriaMetrics, the federating Prometheus's lookback delta): twice the
#: interval, so that a shard that stopped sending stops counting (docs/rules.md, "Layers").
STEP = f"{2 * INTERVAL_S:g}s"
SETTLE_S = 240.0  # first conditions: hold windows of 9 s, a chain of groups, busy cores

#: The conditions of the fleet (tests/shard_helpers.py) as one Prometheus gives them.
EXPECTED = {
    ("rack", "r1"): "hot",
    ("rack", "r2"): "warm",  # 29 °C on its shard-B node
    ("rack", "r3"): "warm",  # 1 of its 8 GPUs throttled: not the 0.25 of shard A's 4
    ("rack", "r4"): "warm",  # a GPU near slowdown
    ("rack", "r5"): "ok",
    ("rack", "r6"): "hot",
    ("row", "w1"): "warm",
    ("row", "w2"): "warm",
    ("row", "w3"): "warm",
    ("room", "m1"): "warm",
    ("room", "m2"): "ok",
    ("site", "s1"): "warm",
    ("pdu", "pa"): "unknown",
    ("pdu", "pb"): "unknown",
    ("pdu", "pc"): "unknown",
}

#: Domain-layer series compared value for value between the views.
SAME_FIGURES = (
    "llmgw_domain_info",
    "llmgw_domain_measured_watts",
    "llmgw_domain_inlet_temperature_celsius",
    "llmgw:domain_gpus:count",
    "llmgw:domain_gpus_thermally_throttled:count",
    "llmgw:domain_gpus_thermally_throttled:ratio",
    "llmgw:domain_gpus_near_slowdown:count",
    "llmgw:domain_rack:membership",
    "llmgw:domain_threshold:value",
    "llmgw:domain_racks_hot:ratio",
    "llmgw:domain_racks_warm:ratio",
    "llmgw:domain_condition:level",
    "llmgw_domain_condition",
)
#: Domain-layer series that are times or ages: the same series, values within the lag.
TIMED_FIGURES = (
    "llmgw_domain_reading_age_seconds",
    "llmgw:domain_last_reading:timestamp",
    "llmgw:domain_last_member_seen:timestamp",
)


@dataclass
class Stack:
    fleet: Fleet
    single: Server
    shards: dict[str, Server]
    victoria: Server
    federation: Server

    @property
    def views(self) -> dict[str, str]:
        return {"vmalert": self.victoria.url, "federation": self.federation.url}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("sharded-rules")
    fleet = Fleet()
    node_rules = scaled_rule_files(NODE_LAYER, FACTOR, tmp / "node-rules")
    domain_rules = scaled_rule_files(DOMAIN_LAYER, FACTOR, tmp / "domain-rules")
    interval = f"{INTERVAL_S:g}s"
    with ExitStack() as stack:
        targets = {
            shard: stack.enter_context(metrics_target(lambda shard=shard: fleet.page(shard)))
            for shard in SHARDS
        }
        job = "llmgw-exporter"
        single = stack.enter_context(
            prometheus_server(
                "single",
                tmp / "single",
                rule_files=node_rules + domain_rules,
                scrape_configs=[scrape(job, list(targets.values()))],
                interval=interval,
            )
        )
        victoria = stack.enter_context(victoria_metrics(tmp / "vm", scrape_targets={}))
        shards = {
            shard: stack.enter_context(
                prometheus_server(
                    f"shard-{shard}",
                    tmp / f"shard-{shard}",
                    rule_files=node_rules,
                    scrape_configs=[scrape(job, [targets[shard]])],
                    interval=interval,
                    external_labels={"shard": shard},
                    remote_write=f"{victoria.url}/api/v1/write",
                )
            )
            for shard in SHARDS
        }
        stack.enter_context(
            vmalert_server(
                tmp / "vmalert", rule_files=domain_rules, datasource=victoria.url, query_step=STEP
            )
        )
        federation = stack.enter_context(
            prometheus_server(
                "federation",
                tmp / "federation",
                rule_files=domain_rules,
                scrape_configs=[federate([host_port(s.url) for s in shards.values()])],
                interval=interval,
                lookback_delta=STEP,
            )
        )
        yield Stack(fleet, single, shards, victoria, federation)


def wait_for(check: Callable[[], str | None], timeout_s: float) -> None:
    """Until `check()` says nothing is wrong (None), or fail with what it last said."""
    deadline = time.monotonic() + timeout_s
    while (wrong := check()) is not None:
        if time.monotonic() > deadline:
            pytest.fail(f"after {timeout_s:.0f} s: {wrong}")
        time.sleep(0.5)


def differences(reference: str, view: str, *, time_tolerance_s: float) -> list[str]:
    """Every domain-layer series that `view` gives otherwise than `reference`."""
    found = []
    for name in SAME_FIGURES:
        want, got = query(reference, name, STEP), query(view, name, STEP)
        if want.keys() != got.keys() or any(
            got[k] != pytest.approx(v, rel=1e-9) for k, v in want.items()
        ):
            found.append(f"{name}: reference {sorted(want.items())}, view {sorted(got.items())}")
    for name in TIMED_FIGURES:
        want, got = query(reference, name, STEP), query(view, name, STEP)
        if want.keys() != got.keys() or any(
            abs(got[k] - v) > time_tolerance_s for k, v in want.items()
        ):
            found.append(f"{name}: reference {sorted(want.items())}, view {sorted(got.items())}")
    return found


#: The largest difference a time or an age may show between the reference and a global
#: view: what the hop adds (a transfer, one evaluation of the domain layer) and vmalert's
#: one evaluation per chained rule (docs/rules.md, "Running in vmalert") on a 2-s interval.
TIME_TOLERANCE_S = 4 * INTERVAL_S + 2


def test_the_reference_gives_the_fleets_conditions(stack: Stack) -> None:
    wait_for(
        lambda: (
            None
            if (got := conditions(stack.single.url, STEP)) == EXPECTED
            else f"one Prometheus gives {got}"
        ),
        SETTLE_S,
    )


@pytest.mark.parametrize("view", ["vmalert", "federation"])
def test_each_global_view_gives_the_reference_series_by_series(stack: Stack, view: str) -> None:
    url = stack.views[view]
    wait_for(
        lambda: None if (got := conditions(url, STEP)) == EXPECTED else f"{view} gives {got}",
        SETTLE_S,
    )
    # The fleet holds still: every figure must agree, once the hop has carried it.
    wait_for(
        lambda: (
            "\n".join(differences(stack.single.url, url, time_tolerance_s=TIME_TOLERANCE_S)) or None
        ),
        60,
    )
    # A rack and a pdu across two shards: summed over the shards' series, not taken from
    # one of them.
    watts = query(url, 'llmgw_domain_measured_watts{domain=~"r2|r3|pa"}', STEP)
    assert {dict(k)["domain"]: v for k, v in watts.items()} == {
        "r2": 1500 + 1350,
        "r3": 1500 + 1350,
        "pa": 2 * 1500 + 2 * 1350,  # r1-n1, r1-n2 (A); r4-n1, r4-n2 (B)
    }


def test_a_change_reaches_the_global_views_within_the_hops_lag(stack: Stack) -> None:
    """r5 (shard C) turns hot: each view says so at most the hop's lag after the reference
    (measured; printed with -s)."""
    stack.fleet.set_inlet("r5", 40.0)
    seen: dict[str, float] = {}
    urls = {"single": stack.single.url, **stack.views}
    started = time.monotonic()
    deadline = started + SETTLE_S
    while len(seen) < len(urls) and time.monotonic() < deadline:
        for name, url in urls.items():
            if name not in seen and conditions(url, STEP).get(("rack", "r5")) == "hot":
                seen[name] = time.monotonic() - started
        time.sleep(0.1)
    assert len(seen) == len(urls), f"r5 hot only in {seen} after {SETTLE_S:.0f} s"
    lags = {name: seen[name] - seen["single"] for name in stack.views}
    print(
        f"r5 hot after {seen['single']:.1f} s in one Prometheus; the global views' lags: "
        + ", ".join(
            f"{name} {lag:+.1f} s ({lag / INTERVAL_S:+.1f} evaluations)"
            for name, lag in lags.items()
        )
    )
    # Federation: one scrape of the shards (1 s) and one evaluation of the domain layer.
    assert lags["federation"] <= 2 * INTERVAL_S + 1.5, lags
    # vmalert: the remote write, and one evaluation per rule of the chain from the
    # location figures to the state set (domain inlet, level, state set: docs/rules.md).
    assert lags["vmalert"] <= 4 * INTERVAL_S + 1.5, lags
    stack.fleet.set_inlet("r5", 22.0)


def test_one_shard_down_leaves_its_domains_unknown_and_nothing_else(stack: Stack) -> None:
    # Settled again (r5 back to ok takes the 21-s leave hold), so that what changes next
    # is the shard's going.
    wait_for(
        lambda: None if (got := conditions(stack.single.url, STEP)) == EXPECTED else f"{got}",
        SETTLE_S,
    )
    before = {view: conditions(url, STEP) for view, url in stack.views.items()}
    watts_before = {
        view: query(url, 'llmgw_domain_measured_watts{domain=~"pa|pb|r1|r2|r3|r4|w1|w2|m1"}', STEP)
        for view, url in stack.views.items()
    }
    shard_c = stack.shards["c"].process
    shard_c.terminate()
    shard_c.wait(timeout=30)

    gone = {("rack", "r5"), ("rack", "r6"), ("row", "w3"), ("room", "m2")}
    expected = {key: "unknown" if key in gone else cond for key, cond in EXPECTED.items()}
    for view, url in stack.views.items():
        wait_for(
            lambda url=url, view=view: (
                None
                if (got := conditions(url, STEP)) == expected
                else f"{view} with shard c down gives {got}"
            ),
            SETTLE_S,
        )
        # What is missing is named: the racks' readings are gone, their age grows.
        missing = query(url, 'llmgw_domain_inlet_temperature_celsius{domain=~"r5|r6"}', STEP)
        assert missing == {}, missing
        ages = {
            dict(k)["domain"]: v
            for k, v in query(
                url, 'llmgw_domain_reading_age_seconds{kind="rack",domain=~"r5|r6"}', STEP
            ).items()
        }
        assert set(ages) == {"r5", "r6"} and min(ages.values()) > 75 / FACTOR, ages
        # Nothing else changed: the other domains' conditions (the site and room m1 still
        # warm on their other racks) and the power of domains without a node in shard c.
        assert {k: v for k, v in before[view].items() if k not in gone} == {
            k: v for k, v in conditions(url, STEP).items() if k not in gone
        }
        watts = query(
            url, 'llmgw_domain_measured_watts{domain=~"pa|pb|r1|r2|r3|r4|w1|w2|m1"}', STEP
        )
        assert watts == watts_before[view]
        assert query(url, 'llmgw_domain_measured_watts{domain="pc"}', STEP) == {}


def test_the_layers_read_across_only_as_documented() -> None:
    """The node layer reads no domain-layer series; the domain layer no exporter series."""
    node_rules = [r for f in NODE_LAYER for g in load(f) for r in g["rules"]]
    domain_rules = [
        r
        for f in [*DOMAIN_LAYER, REPO / "rules" / "energy_models.yml"]
        for g in load(f)
        for r in g["rules"]
    ]
    domain_outputs = {r["record"] for r in domain_rules}
    for rule in node_rules:
        read = [name for name in domain_outputs if name in rule["expr"]]
        assert not read, f"node layer {rule['record']} reads the domain layer's {read}"
    for rule in domain_rules:
        exporter = re.findall(r"(?<![\w:])(llmgw_(?:node|gpu|unit|exporter)_\w+)", rule["expr"])
        assert not exporter, f"domain layer {rule['record']} reads exporter series {exporter}"


def load(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text())["groups"]
