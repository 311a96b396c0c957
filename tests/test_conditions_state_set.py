"""The condition state set is read whole: never a domain at no condition, or at two.

Prometheus commits each rule's samples in a transaction of its own. Written as four rules,
`llmgw_domain_condition` could be read between two of their commits, and a domain that was
changing condition showed none at 1, or two (docs/rules.md, "One rule, one commit"); the
decider read the first as `unknown`. This test runs the committed rules/conditions.yml in a
real Prometheus, its durations divided by 60 (0.5 s evaluations, 2.25 s enter holds, 5.25 s
leave holds) as the demo divides them, over many domains changing condition all the time,
and reads the state set back to back while they change.

Against the four-rule file, 30 s of this reading found a domain at no condition in 71 of 919
reads: in 10 s, a pass by chance is out of reach.
"""

from __future__ import annotations

import time
from pathlib import Path

import requests

from llmgw_sim.demo.scale import scale_rules
from tests.promstack import metrics_target, prometheus

REPO = Path(__file__).resolve().parent.parent
FACTOR = 60  # the rules' 30 s interval becomes 0.5 s
DOMAINS = 300
PERIOD_S = 20.0  # each domain's inlet: high for half of it, low for the other half
#: (low, high) inlet °C against the default 27 °C warm and 32 °C hot thresholds: a third of
#: the domains go ok <-> hot, a third ok <-> warm, a third warm <-> hot.
SWINGS = ((24.0, 35.0), (24.0, 29.0), (29.0, 35.0))
READ_S = 10.0
CONDITIONS = ("ok", "warm", "hot", "unknown")


def _exposition(elapsed: float) -> bytes:
    lines = []
    for index in range(DOMAINS):
        # racks: a rack's condition reads its inlet (a row's reads its racks and site signals)
        labels = f'kind="rack",domain="d{index}"'
        phase = index * PERIOD_S / DOMAINS  # changes spread evenly over the period
        low, high = SWINGS[index % len(SWINGS)]
        inlet = high if (elapsed + phase) % PERIOD_S < PERIOD_S / 2 else low
        lines += [
            f"llmgw_domain_info{{{labels}}} 1",
            f"llmgw_domain_inlet_temperature_celsius{{{labels}}} {inlet}",
            f'llmgw:domain_threshold:value{{{labels},threshold="inlet_warm_celsius"}} 27',
            f'llmgw:domain_threshold:value{{{labels},threshold="inlet_hot_celsius"}} 32',
            f'llmgw:domain_threshold:value{{{labels},threshold="throttled_hot_ratio"}} 0.5',
        ]
    return ("\n".join(lines) + "\n").encode()


def _state_sets(url: str) -> dict[str, list[str]]:
    """domain → the conditions at 1, as one instant query reads them."""
    answer = requests.get(
        f"{url}/api/v1/query", params={"query": "llmgw_domain_condition == 1"}, timeout=5
    )
    answer.raise_for_status()
    at_one: dict[str, list[str]] = {}
    for series in answer.json()["data"]["result"]:
        labels = series["metric"]
        at_one.setdefault(labels["domain"], []).append(labels["condition"])
    return at_one


def test_every_read_finds_each_domain_at_exactly_one_condition(tmp_path: Path) -> None:
    rules = tmp_path / "conditions.yml"
    rules.write_text(scale_rules((REPO / "rules" / "conditions.yml").read_text(), FACTOR))
    started = time.monotonic()
    with (
        metrics_target(lambda: _exposition(time.monotonic() - started)) as target,
        prometheus(
            tmp_path / "prometheus",
            rule_files=[rules],
            scrape_targets={"inputs": [target]},
            interval="500ms",
        ) as server,
    ):
        deadline = time.monotonic() + 30
        while len(_state_sets(server.url)) < DOMAINS:
            assert time.monotonic() < deadline, "the state set never covered every domain"
            time.sleep(0.2)
        reads = 0
        changes = 0
        bad: list[str] = []
        last: dict[str, list[str]] = {}
        end = time.monotonic() + READ_S
        while time.monotonic() < end:
            at_one = _state_sets(server.url)
            reads += 1
            for index in range(DOMAINS):
                domain = f"d{index}"
                conditions = sorted(at_one.get(domain, []))
                if len(conditions) != 1:
                    bad.append(f"read {reads}: {domain} at {conditions or 'no condition'}")
                elif domain in last and last[domain] != conditions:
                    changes += 1
                last[domain] = conditions
        assert not bad, f"{len(bad)} half-written state sets in {reads} reads: {bad[:5]}"
        # The reading must have watched the set change, or it proves nothing: ~300 changes
        # happen in 10 s (each domain changes twice a period).
        assert changes >= 100, f"only {changes} condition changes seen in {reads} reads"
        assert {condition for seen in last.values() for condition in seen} <= set(CONDITIONS)
