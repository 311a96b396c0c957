"""One figure for "over its cap" (issue 17 part 5): the decider publishes the load it judges
placements by (`llmgw_domain_load_watts`: the larger of reserved and measured, plus
`other_watts`), and alerts/domain.yml's LlmgwDomainPowerOverCap and NearCap compare exactly
that with the budget. Here the decider's own /metrics families, collected in-process, are fed
to promtool with the alert file: a domain the decider refuses as over its cap pages."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from decider.facility import DomainRef
from decider.metrics import DomainCollector
from decider.models import Replica
from decider.placement import decide
from decider.snapshot import PARTS, Part, Snapshot
from tests.placement_helpers import NOW, SiteSpec, state_of

ROOT = Path(__file__).resolve().parent.parent
#: rack/r20: 15.5 kW measured by its nodes, 0.9 kW of switches. pdu/p1: its site meter reads
#: 15.5 kW with the switches in it (measured_includes_other), which the rules give as 14.6 kW.
MEMBERSHIP = {
    "n20": (DomainRef("pdu", "p1"), DomainRef("rack", "r20")),
    "n21": (DomainRef("rack", "r21"),),
}
MEASURED = {
    DomainRef("rack", "r20"): 15_500.0,
    DomainRef("pdu", "p1"): 14_600.0,
    DomainRef("rack", "r21"): 10_000.0,
}
FACILITY = {
    "mode": "enforce",
    "defaults": {"margin": 0.0},
    "domains": {
        "rack/r20": {"cap_watts": 16_000, "other_watts": 900},
        "pdu/p1": {"cap_watts": 16_000, "other_watts": 900, "measured_includes_other": True},
        "rack/r21": {"cap_watts": 16_000, "other_watts": 900},
    },
    "signals": {"power_watts": {"query": "sum by (pdu) (pdu_watts)", "domain_label": "pdu"}},
}


def collected() -> dict[tuple[str, str, str], float]:
    """(family, kind, domain) -> value, from the decider's DomainCollector over the site."""
    spec = SiteSpec(FACILITY, MEMBERSHIP, MEASURED, {}, {}, {}, {}, [], {})
    snapshot = Snapshot(
        membership=MEMBERSHIP,
        domains=frozenset(r for refs in MEMBERSHIP.values() for r in refs),
        measured_watts=MEASURED,
        parts={name: Part(NOW) for name in PARTS},
        prometheus_up=True,
    )
    with state_of(spec, snapshot) as state:
        view = state.view()
        refused = decide(view, Replica(model="a", profile="p", gpus=0, power_watts=1.0), ["n20"])
        [(rule, reason)] = refused.verdicts[0].refusals
        assert (rule, reason.startswith("rack r20: over its cap, 16.4")) == ("over_cap", True)
        values: dict[tuple[str, str, str], float] = {}
        for family in DomainCollector(lambda: view, clock=lambda: NOW).collect():
            for sample in family.samples:
                if "domain" in sample.labels:
                    key = (sample.name, sample.labels["kind"], sample.labels["domain"])
                    values[key] = sample.value
        return values


def test_the_decider_publishes_the_load_it_refuses_on():
    values = collected()
    assert values["llmgw_domain_load_watts", "rack", "r20"] == 16_400.0  # 15.5 + 0.9
    assert values["llmgw_domain_load_watts", "pdu", "p1"] == 15_500.0  # the meter, once
    assert values["llmgw_domain_load_watts", "rack", "r21"] == 10_900.0
    for key in (("rack", "r20"), ("pdu", "p1"), ("rack", "r21")):
        budget = values[("llmgw_domain_power_budget_watts", *key)]
        headroom = values[("llmgw_domain_headroom_watts", *key)]
        assert values[("llmgw_domain_load_watts", *key)] == budget - headroom


def test_the_over_cap_alert_pages_for_what_the_decider_refuses(tmp_path: Path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make debian-packages` installs it")
    values = collected()
    scraped = 'instance="decider-0:9851",job="llmgw-decider"'
    series = [
        {"series": f'{name}{{kind="{kind}",domain="{domain}",{scraped}}}', "values": f"{v:g}x10"}
        for (name, kind, domain), v in sorted(values.items())
    ]
    test = {
        "rule_files": [str(ROOT / "alerts" / "domain.yml")],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertname="LlmgwDomainPowerOverCap",alertstate="firing"}',
                        "eval_time": "2m",
                        "exp_samples": [
                            {
                                "labels": 'ALERTS{alertname="LlmgwDomainPowerOverCap",'
                                'alertstate="firing",kind="rack",domain="r20",'
                                'severity="critical"}',
                                "value": 1,
                            }
                        ],
                    },
                    {
                        "expr": 'ALERTS{alertname="LlmgwDomainPowerNearCap",alertstate="firing"}',
                        "eval_time": "5m",
                        "exp_samples": [
                            {
                                "labels": 'ALERTS{alertname="LlmgwDomainPowerNearCap",'
                                f'alertstate="firing",kind="{kind}",domain="{domain}",'
                                'severity="warning"}',
                                "value": 1,
                            }
                            for kind, domain in (("pdu", "p1"), ("rack", "r20"))
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "load_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
