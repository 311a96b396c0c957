"""Every alert follows the mixin conventions, and every rule file has promtool tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RUNBOOK_BASE = "https://github.com/llmgw/llmgw-facility/blob/main/docs/runbooks.md#"
RULE_FILES = sorted([*ROOT.glob("rules/*.yml"), *ROOT.glob("alerts/*.yml")])
ALERTS = [
    (path.name, rule)
    for path in ROOT.glob("alerts/*.yml")
    for group in yaml.safe_load(path.read_text())["groups"]
    for rule in group["rules"]
    if "alert" in rule
]


def runbook_anchors() -> set[str]:
    text = (ROOT / "docs" / "runbooks.md").read_text()
    return {heading.strip().lower() for heading in re.findall(r"^## (.+)$", text, re.MULTILINE)}


def test_there_are_alerts_to_check():
    assert ALERTS


@pytest.mark.parametrize(("file", "rule"), ALERTS, ids=[rule["alert"] for _, rule in ALERTS])
def test_alert_conventions(file: str, rule: dict):
    name = rule["alert"]
    assert name.startswith("Llmgw"), f"{file}: {name} is not prefixed Llmgw"
    assert rule.get("labels", {}).get("severity") in {"critical", "warning", "info"}, name
    annotations = rule.get("annotations", {})
    for key in ("summary", "description", "runbook_url"):
        assert annotations.get(key), f"{file}: {name} has no {key}"
    assert annotations["runbook_url"] == RUNBOOK_BASE + name.lower()
    assert name.lower() in runbook_anchors(), f"docs/runbooks.md has no section ## {name}"


@pytest.mark.parametrize("path", RULE_FILES, ids=[p.name for p in RULE_FILES])
def test_every_rule_file_has_promtool_tests(path: Path):
    relative = f"../../{path.relative_to(ROOT).as_posix()}"
    tests = [
        test
        for test in (ROOT / "tests" / "rules").glob("*_test.yml")
        if relative in yaml.safe_load(test.read_text()).get("rule_files", [])
    ]
    assert tests, f"no promtool test in tests/rules/ loads {path.relative_to(ROOT)}"
