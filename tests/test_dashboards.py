"""The Grafana dashboards (dashboards/, docs/dashboards.md): the committed JSON is what
dashboards/generate.py builds; it validates against Grafana's dashboard schema as
grafana-foundation-sdk models it; every query parses in a real Prometheus; and every query
returns data in the running demo, except the panels listed in NO_DATA_IN_DEMO with why.
"""

from __future__ import annotations

import enum
import json
import re
import time
import types
import typing
from pathlib import Path

import pytest
import requests

from dashboards import generate
from tests import demo_running, promstack

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = {path.stem: json.loads(path.read_text()) for path in generate.rendered()}
FILES = {path.stem: path for path in generate.rendered()}

#: Panels whose queries the demo cannot answer, and why. Each is checked to return nothing
#: there, so that a panel that starts to work in the demo is moved out of this list.
NO_DATA_IN_DEMO = {
    (
        "llmgw-energy",
        "Power per replica",
    ): "the simulator publishes no compute units (llmgw_unit_*), so no per-unit power",
    ("llmgw-energy", "Power per model and profile"): "no compute units in the simulator",
    ("llmgw-energy", "Tokens per joule, by model and profile"): (
        "no compute units, and no replica token counter (llmgw_replica_tokens_total)"
    ),
    ("llmgw-energy", "Energy per model and profile, 5 minutes"): "no compute units",
}


def panels(dashboard: dict) -> list[dict]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def targets() -> list[tuple[str, str, dict]]:
    return [
        (uid, panel["title"], target)
        for uid, dashboard in DASHBOARDS.items()
        for panel in panels(dashboard)
        for target in panel["targets"]
    ]


def _target_id(case: tuple[str, str, dict]) -> str:
    uid, title, target = case
    return f"{uid}:{title}:{target['refId']}"


# --- the committed JSON -----------------------------------------------------------------------


def test_the_committed_json_is_what_the_generator_builds():
    for path, text in generate.rendered().items():
        assert path.exists(), f"{path.name} missing: run `make dashboards`"
        assert path.read_text() == text, f"{path.name} is stale: run `make dashboards`"
    committed = {p.name for p in (REPO / "dashboards").glob("*.json")}
    assert committed == {p.name for p in generate.rendered()}
    assert generate.main(["--check"]) == 0


# --- Grafana's schema, as grafana-foundation-sdk models it ----------------------------------


def _check(value: object, hint: object, where: str, problems: list[str]) -> None:
    """`value` against the SDK model's type annotation `hint`, recursively."""
    origin = typing.get_origin(hint)
    if hint in (typing.Any, object):
        return
    if origin in (typing.Union, types.UnionType):
        attempts = []
        for option in typing.get_args(hint):
            attempt: list[str] = []
            _check(value, option, where, attempt)
            if not attempt:
                return
            attempts.append(attempt)
        # the deepest explanation: the option that got furthest into the value
        problems.extend(max(attempts, key=lambda lines: max(len(x.split(":")[0]) for x in lines)))
        return
    if hint is type(None):
        if value is not None:
            problems.append(f"{where}: {value!r} is not None")
        return
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            problems.append(f"{where}: {value!r} not in {typing.get_args(hint)}")
        return
    if origin is list:
        if not isinstance(value, list):
            problems.append(f"{where}: {value!r} is not a list")
            return
        (item,) = typing.get_args(hint)
        for i, element in enumerate(value):
            _check(element, item, f"{where}[{i}]", problems)
        return
    if origin is dict:
        if not isinstance(value, dict):
            problems.append(f"{where}: {value!r} is not an object")
            return
        _, item = typing.get_args(hint)
        for key, element in value.items():
            _check(element, item, f"{where}.{key}", problems)
        return
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            hint(value)
        except ValueError:
            problems.append(f"{where}: {value!r} is not a {hint.__name__}")
        return
    if hint is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            problems.append(f"{where}: {value!r} is not a number")
        return
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            problems.append(f"{where}: {value!r} is not an integer")
        return
    if isinstance(hint, type) and hint.__module__.startswith("grafana_foundation_sdk.models"):
        if not isinstance(value, hint):
            problems.append(f"{where}: {type(value).__name__} is not a {hint.__name__}")
            return
        for name, attribute in typing.get_type_hints(hint).items():
            _check(getattr(value, name), attribute, f"{where}.{name}", problems)
        return
    if isinstance(hint, type):
        if not isinstance(value, hint):
            problems.append(f"{where}: {value!r} is not a {hint.__name__}")
        return
    problems.append(f"{where}: cannot check against {hint!r}")  # pragma: no cover


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_the_dashboard_validates_against_the_sdk_schema(uid):
    from grafana_foundation_sdk.cog import runtime
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import dashboard as model
    from grafana_foundation_sdk.models import prometheus

    register_default_plugins()
    data = DASHBOARDS[uid]
    decoded = model.Dashboard.from_json(data)
    # 1. every field has the type the schema gives it (enums, literals, nested models)
    problems: list[str] = []
    _check(decoded, model.Dashboard, "dashboard", problems)
    assert problems == []
    # 2. nothing the schema does not know: decoding drops unknown keys, so the round trip
    #    would lose them
    assert json.loads(json.dumps(decoded, cls=JSONEncoder)) == data
    # 3. every panel is of a type with a registered schema (options and field config
    #    decoded into that type's models), and every query is a Prometheus query
    for panel in decoded.panels or []:
        if isinstance(panel, model.RowPanel):
            continue
        config = runtime.panelcfg_config(panel.type_val or "")
        assert config is not None, panel.type_val
        assert not isinstance(panel.options, dict), panel.title
        assert panel.targets, panel.title
        for target in panel.targets:
            assert isinstance(target, prometheus.Dataquery), panel.title


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_the_dashboard_keeps_the_house_conventions(uid):
    data = DASHBOARDS[uid]
    assert data["uid"] == uid == FILES[uid].stem
    assert re.fullmatch(r"[a-z0-9-]{1,40}", uid)
    assert data["title"].startswith("llmgw / ")
    assert "llmgw-facility" in data["tags"]
    variables = {v["name"]: v for v in data["templating"]["list"]}
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    reference = {"type": "prometheus", "uid": "${datasource}"}
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == reference, variable["name"]
    ids = [panel["id"] for panel in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(data):
        title = panel["title"]
        assert panel["datasource"] == reference, title
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        assert panel["description"], title
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, title
        for target in panel["targets"]:
            assert target["datasource"] == reference, title
            assert target["expr"].strip(), title


def test_units_say_what_the_series_measure():
    units = {
        (uid, panel["title"]): panel["fieldConfig"]["defaults"]["unit"]
        for uid, data in DASHBOARDS.items()
        for panel in panels(data)
    }
    for (uid, title), unit in units.items():
        exprs = " ".join(
            t["expr"] for p in panels(DASHBOARDS[uid]) if p["title"] == title for t in p["targets"]
        )
        if "temperature_celsius" in exprs:
            assert unit == "celsius", title
        elif "/" not in exprs and "_watts" in exprs:
            assert unit == "watt", title
    assert units[("llmgw-facility-overview", "Measured power against budget")] == "percentunit"
    assert units[("llmgw-node-sensors", "GPU power against its limit")] == "percentunit"


def test_the_dashboards_read_the_contracted_series():
    text = json.dumps(DASHBOARDS)
    for series in (
        "llmgw_domain_power_budget_watts",
        "llmgw_domain_reserved_watts",
        "llmgw_domain_measured_watts",
        "llmgw_domain_headroom_watts",
        "llmgw_domain_condition",
        'ALERTS{alertname=~\\"Llmgw.*\\"',
        "llmgw_gpu_temperature_celsius",
        "llmgw_gpu_memory_temperature_celsius",
        "llmgw_gpu_power_limit_watts",
        "llmgw_gpu_throttled",
        "llmgw_node_cpu_temperature_celsius",
        "llmgw_node_cpu_power_watts",
        "llmgw_node_inlet_temperature_celsius",
        "llmgw:unit_power_watts",
        "llmgw:model_profile_tokens_per_joule:ratio5m",
    ):
        assert series in text, series
    recorded = "".join(
        (REPO / "rules" / name).read_text() for name in ("energy.yml", "energy_models.yml")
    )
    for name in re.findall(r"llmgw:[a-z_:0-9]+", json.dumps(DASHBOARDS["llmgw-energy"])):
        assert f"record: {name}\n" in recorded, f"{name} is not recorded by rules/energy*.yml"


def test_the_no_data_list_names_real_panels():
    titles = {(uid, panel["title"]) for uid, data in DASHBOARDS.items() for panel in panels(data)}
    assert set(NO_DATA_IN_DEMO) <= titles


# --- the queries, in a real Prometheus --------------------------------------------------------

LABEL_VALUES = re.compile(r"label_values\((?P<selector>.*),\s*(?P<label>\w+)\)$", re.S)


def _variable_queries() -> list[tuple[str, str]]:
    return [
        (uid, variable["query"])
        for uid, data in DASHBOARDS.items()
        for variable in data["templating"]["list"]
        if variable["type"] == "query"
    ]


def _substitute(expr: str, values: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        return values[match.group(1) or match.group(2)]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    with promstack.prometheus(
        tmp_path_factory.mktemp("prometheus"), rule_files=[], scrape_targets={}
    ) as server:
        yield server


def _parses(prometheus, expr: str) -> None:
    response = requests.post(
        f"{prometheus.url}/api/v1/format_query", data={"query": expr}, timeout=10
    )
    assert response.status_code == 200, f"{expr}\n{response.text}"
    assert response.json()["status"] == "success"


def test_every_query_parses(prometheus):
    every = {"kind": "rack", "domain": ".+", "rack": ".+", "node": ".+"}
    every |= {"model": ".+", "profile": ".+"}
    checked = 0
    for _, _, target in targets():
        _parses(prometheus, _substitute(target["expr"], every))
        checked += 1
    for _, query in _variable_queries():
        match = LABEL_VALUES.match(query)
        assert match, query
        _parses(prometheus, _substitute(match["selector"], every))
        checked += 1
    assert checked == len(targets()) + len(_variable_queries())


# --- the queries, against the demo ------------------------------------------------------------


@pytest.fixture(scope="session")
def demo(request, tmp_path_factory):
    return demo_running.shared(request, tmp_path_factory)


def _variables(prometheus: str, dashboard: dict) -> dict[str, str]:
    """Each variable's value as Grafana shows the dashboard at first: its `current`
    option, where that is All the variable's allValue, evaluated in order."""
    values: dict[str, str] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        current = variable["current"]["value"]
        if current in (["$__all"], "$__all"):
            values[variable["name"]] = variable["allValue"]
            continue
        match = LABEL_VALUES.match(variable["query"])
        assert match
        response = requests.get(
            f"{prometheus}/api/v1/label/{match['label']}/values",
            params={"match[]": _substitute(match["selector"], values)},
            timeout=10,
        )
        offered = response.json()["data"]
        assert current in offered, f"{variable['name']}={current!r} not among {offered}"
        values[variable["name"]] = current
    return values


def _series(prometheus: str, target: dict, expr: str) -> list[dict]:
    if target.get("instant"):
        response = requests.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=30)
    else:
        now = time.time()
        response = requests.get(
            f"{prometheus}/api/v1/query_range",
            params={"query": expr, "start": now - 300, "end": now, "step": "5"},
            timeout=30,
        )
    body = response.json()
    assert body["status"] == "success", f"{expr}\n{body}"
    return list(body["data"]["result"])


@pytest.mark.parametrize("case", targets(), ids=_target_id)
def test_every_query_returns_data_in_the_demo(demo, case):
    uid, title, target = case
    expr = _substitute(target["expr"], _variables(demo.prometheus, DASHBOARDS[uid]))
    result = _series(demo.prometheus, target, expr)
    if (uid, title) in NO_DATA_IN_DEMO:
        assert result == [], f"{title} now has data in the demo: take it off NO_DATA_IN_DEMO"
        return
    assert result, f"{uid} / {title}: no data for\n{expr}"


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("graphTooltip",), 7, "DashboardCursorSync"),
        (("style",), "blue", "not in"),
        (("templating", "list", 1, "refresh"), 9, "VariableRefresh"),
        (("panels", 1, "gridPos", "w"), "wide", "not an integer"),
    ],
)
def test_the_schema_check_catches_a_bad_field(path, value, problem):
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import dashboard as model

    register_default_plugins()
    data = json.loads(json.dumps(DASHBOARDS["llmgw-facility-overview"]))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    problems: list[str] = []
    _check(model.Dashboard.from_json(data), model.Dashboard, "dashboard", problems)
    assert any(problem in line for line in problems), problems
