"""The Grafana dashboards of llmgw-facility, built with grafana-foundation-sdk's builders and
written as JSON beside this file (docs/dashboards.md). `make dashboards` runs it; the JSON is
committed, and tests/test_dashboards.py fails when it differs from what this file builds.

    python dashboards/generate.py [--check]

Every dashboard reads one Prometheus-compatible datasource chosen by the `datasource`
variable, has a stable uid (the file name), and sets a unit on every panel.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as board
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

HERE = Path(__file__).resolve().parent
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: What a multi-value variable set to "All" stands for in a `=~` matcher.
ALL = ".+"
ROW_HEIGHT = 8

PanelBuilder = Any  # the SDK's panel builders share no base class with these methods


def _target(expr: str, legend: str = "", *, instant: bool = False) -> prom.Dataquery:
    query = prom.Dataquery().expr(expr).legend_format(legend or "__auto").datasource(DATASOURCE)
    return query.instant().format(PromQueryFormat.TABLE) if instant else query.range()


def _panel(
    kind: Callable[[], PanelBuilder],
    title: str,
    description: str,
    unit: str,
    targets: Iterable[prom.Dataquery],
    *,
    width: int = 12,
) -> PanelBuilder:
    panel = (
        kind()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(ROW_HEIGHT)
        .span(width)
    )
    for ref, target in zip("ABCDEFGH", targets, strict=False):
        panel = panel.with_target(target.ref_id(ref))
    return _options(panel)


def _options(panel: PanelBuilder) -> PanelBuilder:
    """Each kind's options set, so that no panel has `options: null`."""
    if isinstance(panel, timeseries.Panel | statetimeline.Panel):
        return panel.legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        ).tooltip(
            common_builders.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    if isinstance(panel, stat.Panel | bargauge.Panel):
        return panel.reduce_options(
            common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False)
        ).orientation(common.VizOrientation.HORIZONTAL)
    if isinstance(panel, table.Panel):
        return panel.show_header(True)
    raise TypeError(f"no options for {type(panel).__name__}")


def _datasource_variable() -> board.DatasourceVariable:
    return board.DatasourceVariable("datasource").label("Data source").type("prometheus")


def _query_variable(
    name: str, label: str, query: str, *, current: str | None = None
) -> board.QueryVariable:
    return (
        board.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(ALL)
        .current(
            model.VariableOption(selected=True, text=current or "All", value=current or ["$__all"])
        )
    )


def _base(uid: str, title: str, description: str, tags: list[str]) -> board.Dashboard:
    return (
        board.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["llmgw-facility", *tags])
        .timezone("browser")
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .with_variable(_datasource_variable())
    )


# --- facility overview ------------------------------------------------------------------------

DOMAIN = 'kind=~"$kind", domain=~"$domain"'
CONDITION_LEVELS = {"ok": 0, "warm": 1, "hot": 2, "unknown": 3}
CONDITION_COLOURS = {"ok": "green", "warm": "orange", "hot": "red", "unknown": "text"}


def _condition_mappings() -> list[model.ValueMapping]:
    return [
        model.ValueMap(
            options={
                str(level): model.ValueMappingResult(
                    text=name, color=CONDITION_COLOURS[name], index=level
                )
                for name, level in CONDITION_LEVELS.items()
            }
        )
    ]


def _condition_expr() -> str:
    parts = [
        f'(llmgw_domain_condition{{condition="{name}", {DOMAIN}}} == 1) * {level}'
        for name, level in CONDITION_LEVELS.items()
    ]
    return "max by (kind, domain) (\n    " + "\n  or\n    ".join(parts) + "\n)"


def facility_overview() -> board.Dashboard:
    def decider(metric: str) -> str:
        # the decider's own series carry its instance and job: one value per domain
        return f"max by (kind, domain) ({metric}{{{DOMAIN}}})"

    power = _panel(
        timeseries.Panel,
        "Budget, reserved and measured power",
        "Per domain: the budget from the facility file (the decider's "
        "llmgw_domain_power_budget_watts), the estimate of the replicas reserved there, and "
        "the measured draw (llmgw_domain_measured_watts, rules/domain.yml).",
        "watt",
        [
            _target(decider("llmgw_domain_power_budget_watts"), "{{kind}}/{{domain}} budget"),
            _target(decider("llmgw_domain_reserved_watts"), "{{kind}}/{{domain}} reserved"),
            _target(f"llmgw_domain_measured_watts{{{DOMAIN}}}", "{{kind}}/{{domain}} measured"),
        ],
    )
    headroom = _panel(
        bargauge.Panel,
        "Headroom",
        "Budget minus load (the larger of reserved and measured, plus other_watts), as the "
        "decider sees it: what is left for new replicas. Domains without a budget have none.",
        "watt",
        [_target(decider("llmgw_domain_headroom_watts"), "{{kind}}/{{domain}}", instant=True)],
    )
    load = _panel(
        timeseries.Panel,
        "Measured power against budget",
        "Measured draw over the budget: past 100 % the domain is over its cap "
        "(LlmgwDomainPowerOverCap).",
        "percentunit",
        [
            _target(
                f"llmgw_domain_measured_watts{{{DOMAIN}}}\n/ on (kind, domain)\n"
                + decider("llmgw_domain_power_budget_watts"),
                "{{kind}}/{{domain}}",
            )
        ],
    )
    held = _panel(
        stat.Panel,
        "Held domains",
        "Domains the facility team holds (no new placements until released).",
        "none",
        [_target(f"sum({decider('llmgw_domain_held')})", "held", instant=True)],
        width=6,
    )
    reserved_count = _panel(
        stat.Panel,
        "Domains per condition",
        "How many domains are ok, warm, hot or unknown now (llmgw_domain_condition).",
        "none",
        [
            _target(
                f"sum by (condition) (llmgw_domain_condition{{{DOMAIN}}})",
                "{{condition}}",
                instant=True,
            )
        ],
        width=6,
    )
    conditions = _panel(
        statetimeline.Panel,
        "Conditions over time",
        "Each domain's condition (ok, warm, hot, unknown) from the llmgw_domain_condition "
        "state set (rules/conditions.yml).",
        "none",
        [_target(_condition_expr(), "{{kind}}/{{domain}}")],
        width=24,
    ).mappings(_condition_mappings())
    inlet = _panel(
        timeseries.Panel,
        "Inlet temperature",
        "The hottest inlet reading among each domain's nodes, or the site's own signal.",
        "celsius",
        [_target(f"llmgw_domain_inlet_temperature_celsius{{{DOMAIN}}}", "{{kind}}/{{domain}}")],
    )
    age = _panel(
        timeseries.Panel,
        "Age of the freshest reading",
        "Seconds since the domain's freshest thermal reading: a growing age is a domain "
        "going unknown (LlmgwFacilityDataStale).",
        "s",
        [_target(f"llmgw_domain_reading_age_seconds{{{DOMAIN}}}", "{{kind}}/{{domain}}")],
    )
    alerts = _panel(
        table.Panel,
        "Firing alerts",
        "llmgw-facility's alerts (alerts/*.yml) firing now.",
        "none",
        [
            _target(
                'ALERTS{alertname=~"Llmgw.*", alertstate="firing"}',
                "{{alertname}}",
                instant=True,
            )
        ],
        width=24,
    )
    return (
        _base(
            "llmgw-facility-overview",
            "llmgw / Facility overview",
            "Per domain: budget, reserved, measured and headroom; conditions; firing alerts.",
            ["facility"],
        )
        .with_variable(
            _query_variable("kind", "Kind", "label_values(llmgw_domain_info, kind)", current="rack")
        )
        .with_variable(
            _query_variable(
                "domain", "Domain", 'label_values(llmgw_domain_info{kind=~"$kind"}, domain)'
            )
        )
        .with_row(board.Row("Power"))
        .with_panel(power)
        .with_panel(headroom)
        .with_panel(load)
        .with_panel(held)
        .with_panel(reserved_count)
        .with_row(board.Row("Conditions"))
        .with_panel(conditions)
        .with_panel(inlet)
        .with_panel(age)
        .with_row(board.Row("Alerts"))
        .with_panel(alerts)
    )


# --- node sensors -----------------------------------------------------------------------------

NODE = 'node=~"$node"'


def node_sensors() -> board.Dashboard:
    def raw(metric: str, extra: str = "") -> str:
        # an exporter scraped by two jobs is one reading
        return f"max without (instance, job) ({metric}{{{NODE}{extra}}})"

    gpu_temp = _panel(
        timeseries.Panel,
        "GPU temperature",
        "Each GPU's die temperature, and the temperature at which it slows down.",
        "celsius",
        [
            _target(raw("llmgw_gpu_temperature_celsius"), "{{node}} GPU {{gpu}}"),
            _target(raw("llmgw_gpu_slowdown_temperature_celsius"), "{{node}} GPU {{gpu}} slowdown"),
        ],
    )
    hbm = _panel(
        timeseries.Panel,
        "HBM temperature",
        "Each GPU's memory temperature, where the card reports one.",
        "celsius",
        [_target(raw("llmgw_gpu_memory_temperature_celsius"), "{{node}} GPU {{gpu}}")],
    )
    gpu_power = _panel(
        timeseries.Panel,
        "GPU power and enforced limit",
        "Each GPU's power draw, and the limit enforced after every limiter.",
        "watt",
        [
            _target(raw("llmgw_gpu_power_watts"), "{{node}} GPU {{gpu}}"),
            _target(raw("llmgw_gpu_power_limit_watts"), "{{node}} GPU {{gpu}} limit"),
        ],
    )
    gpu_share = _panel(
        timeseries.Panel,
        "GPU power against its limit",
        "Power draw over the enforced limit: near 100 % the card is power-capped.",
        "percentunit",
        [
            _target(
                raw("llmgw_gpu_power_watts") + "\n/\n" + raw("llmgw_gpu_power_limit_watts"),
                "{{node}} GPU {{gpu}}",
            )
        ],
    )
    throttle = _panel(
        timeseries.Panel,
        "GPUs throttled, by reason",
        "How many GPUs hold their clocks down for each reason. sw_power_cap is normal under "
        "load; hw_thermal, sw_thermal and power_brake are thermal signals.",
        "none",
        [_target(f"sum by (node, reason) ({raw('llmgw_gpu_throttled')})", "{{node}} {{reason}}")],
    )
    inlet = _panel(
        timeseries.Panel,
        "Inlet temperature",
        "The node's inlet (or ambient) sensor, from hwmon or the BMC.",
        "celsius",
        [_target(raw("llmgw_node_inlet_temperature_celsius"), "{{node}}")],
    )
    cpu_temp = _panel(
        timeseries.Panel,
        "CPU temperature",
        "Package temperature (or the hottest core) per CPU.",
        "celsius",
        [_target(raw("llmgw_node_cpu_temperature_celsius"), "__auto")],
    )
    cpu_power = _panel(
        timeseries.Panel,
        "CPU and DRAM power",
        "RAPL package and DRAM power, summed per node.",
        "watt",
        [
            _target(
                f"sum by (node) ({raw('llmgw_node_cpu_power_watts')})", "{{node}} CPU packages"
            ),
            _target(f"sum by (node) ({raw('llmgw_node_dram_power_watts')})", "{{node}} DRAM"),
        ],
    )
    node_power = _panel(
        timeseries.Panel,
        "Node power",
        "The node's power as the rules count it (llmgw:node_power_watts): measured by its "
        "BMC where fresh, else the sum of its parts.",
        "watt",
        [_target(f"llmgw:node_power_watts{{{NODE}}}", "{{node}} ({{source}})")],
    )
    sources = _panel(
        timeseries.Panel,
        "Exporter sources up",
        "1 while each of the exporter's sources reads its sensors.",
        "bool_yes_no",
        [_target(raw("llmgw_exporter_source_up"), "{{node}} {{source}}")],
    )
    return (
        _base(
            "llmgw-node-sensors",
            "llmgw / Node sensors",
            "Per node: GPU, HBM, CPU and inlet temperatures, GPU power against its limit, "
            "throttle reasons, CPU and DRAM power.",
            ["sensors"],
        )
        .with_variable(_query_variable("rack", "Rack", "label_values(llmgw_node_info, rack)"))
        .with_variable(
            _query_variable("node", "Node", 'label_values(llmgw_node_info{rack=~"$rack"}, node)')
        )
        .with_row(board.Row("GPUs"))
        .with_panel(gpu_temp)
        .with_panel(hbm)
        .with_panel(gpu_power)
        .with_panel(gpu_share)
        .with_panel(throttle)
        .with_row(board.Row("Node"))
        .with_panel(inlet)
        .with_panel(cpu_temp)
        .with_panel(cpu_power)
        .with_panel(node_power)
        .with_panel(sources)
    )


# --- energy -----------------------------------------------------------------------------------

MODEL = 'model=~"$model", profile=~"$profile"'


def energy() -> board.Dashboard:
    unit_power = _panel(
        timeseries.Panel,
        "Power per replica",
        "Each compute unit's share of its node's power (llmgw:unit_power_watts, the CEEMS "
        "method of docs/energy.md).",
        "watt",
        [_target(f"llmgw:unit_power_watts{{{MODEL}}}", "{{node}} {{unit}}")],
    )
    by_model = _panel(
        timeseries.Panel,
        "Power per model and profile",
        "The replicas' power summed per model and profile.",
        "watt",
        [
            _target(
                f"sum by (model, profile) (llmgw:unit_power_watts{{{MODEL}}})",
                "{{model}} {{profile}}",
            )
        ],
    )
    tokens_per_joule = _panel(
        timeseries.Panel,
        "Tokens per joule, by model and profile",
        "Tokens generated per joule over the last 5 minutes "
        "(llmgw:model_profile_tokens_per_joule:ratio5m).",
        "suffix: tok/J",
        [
            _target(
                f"llmgw:model_profile_tokens_per_joule:ratio5m{{{MODEL}}}",
                "{{model}} {{profile}}",
            )
        ],
    )
    energy_5m = _panel(
        timeseries.Panel,
        "Energy per model and profile, 5 minutes",
        "Joules the replicas of each model and profile used over the last 5 minutes.",
        "joule",
        [_target(f"llmgw:model_profile_energy_joules:sum5m{{{MODEL}}}", "{{model}} {{profile}}")],
    )
    unattributed = _panel(
        timeseries.Panel,
        "Unattributed power",
        "What no replica takes of each node's power (llmgw:node_unattributed_power_watts): "
        "idle nodes, and the parts of busy ones no unit's share covers.",
        "watt",
        [_target("sum by (node) (llmgw:node_unattributed_power_watts)", "{{node}}")],
    )
    method = _panel(
        table.Panel,
        "Energy method per node",
        "Which method splits each node's power (llmgw:node_energy_method:info).",
        "none",
        [_target("llmgw:node_energy_method:info", "{{node}}", instant=True)],
    )
    return (
        _base(
            "llmgw-energy",
            "llmgw / Energy",
            "Per-replica power and energy, and tokens per joule by model and profile.",
            ["energy"],
        )
        .with_variable(_query_variable("model", "Model", "label_values(llmgw_unit_info, model)"))
        .with_variable(
            _query_variable(
                "profile", "Profile", 'label_values(llmgw_unit_info{model=~"$model"}, profile)'
            )
        )
        .with_row(board.Row("Replicas"))
        .with_panel(unit_power)
        .with_panel(by_model)
        .with_panel(tokens_per_joule)
        .with_panel(energy_5m)
        .with_row(board.Row("Nodes"))
        .with_panel(unattributed)
        .with_panel(method)
    )


#: file name (without .json) -> builder; the file name is the dashboard's uid.
DASHBOARDS: dict[str, Callable[[], board.Dashboard]] = {
    "llmgw-facility-overview": facility_overview,
    "llmgw-node-sensors": node_sensors,
    "llmgw-energy": energy,
}


def render(build: Callable[[], board.Dashboard]) -> str:
    """The dashboard as the committed JSON text (sorted keys, two-space indent)."""
    dashboard = build().build()
    for number, panel in enumerate(dashboard.panels or [], start=1):
        panel.id_val = number  # stable: the order the builder gives them
    # Through the SDK's decoder once more: the JSON then holds the schema's defaults (each
    # panel type's custom field config), so decoding the committed file changes nothing.
    register_default_plugins()
    built = json.loads(json.dumps(dashboard, cls=JSONEncoder))
    data = json.loads(json.dumps(model.Dashboard.from_json(built), cls=JSONEncoder))
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def rendered() -> dict[Path, str]:
    return {HERE / f"{uid}.json": render(build) for uid, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a committed file differs, write nothing"
    )
    args = parser.parse_args(argv)
    stale = []
    for path, text in rendered().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(path.name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run `make dashboards`)", file=sys.stderr)
        return 1
    for name in stale:
        print(f"wrote dashboards/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
