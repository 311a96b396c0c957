"""The exporter's HTTP side: `/metrics` for Prometheus, `/` for a person.

The page (`/`) shows what this node reads, from the same samples `/metrics` serves at that
moment (a stale source's readings are gone from both): the GPUs (temperature, power, the
enforced limit, the throttle reasons on), the CPUs (package temperature and power), the
inlet air and the whole node's power, beside each source's health. Plain HTML rendered by
Jinja2 with autoescape (a sensor or a label names nothing that can inject markup), no
JavaScript, one column wide enough for a phone.

Jinja2 is imported, and the page's template compiled, at the first request for `/`, not
at start: most nodes' pages are never opened, and the two cost about 3 MiB of the
exporter's resident memory (docs/benchmarks.md, "Where the memory goes").
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from socketserver import TCPServer, ThreadingMixIn
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from exporter.collector import declared_samples, includes_gpus, served_samples
from exporter.config import AgentConfig
from exporter.poller import SourceRunner
from exporter.samples import Sample
from llmgw_common.metrics import THERMAL_REASONS

if TYPE_CHECKING:
    import jinja2

StartResponse = Callable[..., object]
Environ = dict[str, object]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def server_bind(self) -> None:
        """Bind, naming the server by the address it listens on.

        http.server's own server_bind asks DNS for the address's full name (`getfqdn`), only
        for the WSGI environ's SERVER_NAME, which no route here reads: a start that can wait on
        a resolver (a node booting before its DNS answers), and the idna codec with
        `unicodedata` kept loaded for good (docs/benchmarks.md, "Where the memory goes").
        """
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)
        self.setup_environ()


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Scrapes every few seconds would flood the log; errors still reach stderr."""


@dataclass
class GpuReading:
    """One GPU's row on the page; None where the source did not publish the figure."""

    index: str
    uuid: str
    model: str = ""
    temperature: float | None = None
    slowdown: float | None = None
    power: float | None = None
    limit: float | None = None
    #: Throttle reasons on now; `thermal`: whether any of them means heat (THERMAL_REASONS).
    throttled: list[str] = field(default_factory=list)
    thermal: bool = False


@dataclass
class SourceRow:
    name: str
    interval: str
    status: str
    up: bool | None
    series: int
    last_success: str


@dataclass
class Readings:
    """The node's readings as the page shows them, each list in a stable order."""

    gpus: list[GpuReading]
    #: The CPU models /proc/cpuinfo names (the decider's CPU profiles are keyed on them).
    cpu_models: list[str]
    #: (chip, sensor, °C) for CPU temperatures and inlet sensors.
    cpu_temperatures: list[tuple[str, str, float]]
    #: (package, CPU watts or None, DRAM watts or None).
    cpu_power: list[tuple[str, float | None, float | None]]
    inlets: list[tuple[str, str, float]]
    #: (source, watts, includes the GPUs: True, False or None when not said).
    node_power: list[tuple[str, float, bool | None]]
    overhead_watts: float | None


def readings(samples: Iterable[Sample]) -> Readings:
    """The page's figures from the samples `/metrics` serves (exporter.collector)."""
    gpus: dict[str, GpuReading] = {}
    cpu_models: list[str] = []
    cpu_temperatures: list[tuple[str, str, float]] = []
    inlets: list[tuple[str, str, float]] = []
    packages: dict[str, list[float | None]] = {}
    node_power: dict[str, float] = {}
    includes: dict[str, bool] = {}
    overhead = None
    gpu_figures = {
        "llmgw_gpu_temperature_celsius": "temperature",
        "llmgw_gpu_slowdown_temperature_celsius": "slowdown",
        "llmgw_gpu_power_watts": "power",
        "llmgw_gpu_power_limit_watts": "limit",
    }
    for sample in samples:
        labels, metric = sample.labels, sample.metric
        if "gpu" in labels and metric.startswith("llmgw_gpu_"):
            gpu = gpus.setdefault(labels["gpu"], GpuReading(labels["gpu"], labels.get("uuid", "")))
            if metric == "llmgw_gpu_info":
                gpu.model = labels.get("model", "")
            elif metric in gpu_figures:
                setattr(gpu, gpu_figures[metric], sample.value)
            elif metric == "llmgw_gpu_throttled" and sample.value == 1:
                gpu.throttled.append(labels.get("reason", ""))
                gpu.thermal = gpu.thermal or labels.get("reason") in THERMAL_REASONS
        elif metric == "llmgw_node_cpu_info":
            cpu_models.append(labels.get("model", ""))
        elif metric == "llmgw_node_cpu_temperature_celsius":
            cpu_temperatures.append(
                (labels.get("chip", ""), labels.get("sensor", ""), sample.value)
            )
        elif metric == "llmgw_node_inlet_temperature_celsius":
            inlets.append((labels.get("chip", ""), labels.get("sensor", ""), sample.value))
        elif metric in ("llmgw_node_cpu_power_watts", "llmgw_node_dram_power_watts"):
            package = packages.setdefault(labels.get("package", ""), [None, None])
            package[0 if metric == "llmgw_node_cpu_power_watts" else 1] = sample.value
        elif metric == "llmgw_node_power_watts":
            node_power[labels.get("source", "")] = sample.value
        elif metric == "llmgw_node_power_includes_gpus":
            includes[labels.get("source", "")] = sample.value == 1
        elif metric == "llmgw_node_power_overhead_watts":
            overhead = sample.value
    for gpu in gpus.values():
        gpu.throttled.sort()
    return Readings(
        gpus=sorted(gpus.values(), key=lambda g: (len(g.index), g.index)),
        cpu_models=sorted(cpu_models),
        cpu_temperatures=sorted(cpu_temperatures),
        cpu_power=[(name, cpu, dram) for name, (cpu, dram) in sorted(packages.items())],
        inlets=sorted(inlets),
        node_power=[
            (source, watts, includes.get(source)) for source, watts in sorted(node_power.items())
        ],
        overhead_watts=overhead,
    )


_PAGE_SOURCE = """\
{%- macro number(value, unit, digits=0) -%}
{{ "-" if value is none else ("%." ~ digits ~ "f") % value ~ " " ~ unit }}
{%- endmacro -%}
<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>llmgw exporter: {{ node }}</title>
<style>
body { font-family: sans-serif; margin: 1em; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.2em; }
td, th { padding: 0.2em 0.5em; border-bottom: 1px solid #ddd; text-align: left; }
td.n { text-align: right; white-space: nowrap; }
.scroll { overflow-x: auto; }
.down, .thermal { color: #fff; background: #c62828; padding: 0 0.3em; }
.muted { color: #777; }
</style></head><body>
<h1>llmgw exporter on {{ node }}</h1>
<p>Location: {{ place or "none declared (a rack of one)" }};
feeds: {{ feeds or "none declared" }}.
Readings as <a href="/metrics">/metrics</a> serves them now.</p>

<h2 id="gpus">GPUs</h2>
{% if r.gpus %}<div class="scroll"><table>
<tr><th>GPU</th><th>model</th><th>temperature</th><th>slowdown at</th><th>power</th>
<th>limit</th><th>throttled</th></tr>
{% for g in r.gpus %}<tr id="gpu-{{ g.index }}" title="{{ g.uuid }}">
<td>{{ g.index }}</td><td>{{ g.model }}</td>
<td class="n">{{ number(g.temperature, "°C") }}</td>
<td class="n">{{ number(g.slowdown, "°C") }}</td>
<td class="n">{{ number(g.power, "W", 1) }}</td><td class="n">{{ number(g.limit, "W") }}</td>
<td>{% if g.throttled -%}
<span class="{{ 'thermal' if g.thermal else '' }}">{{ g.throttled | join(", ") }}</span>
{%- else %}no{% endif %}</td>
</tr>{% endfor %}
</table></div>
{% else %}<p class="muted">No GPU readings.</p>{% endif %}

<h2 id="cpus">CPUs</h2>
<p id="cpu-model">Model: {{ r.cpu_models | join("; ") if r.cpu_models else "not known" }}</p>
{% if r.cpu_temperatures %}<table>
<tr><th>sensor</th><th>temperature</th></tr>
{% for chip, sensor, value in r.cpu_temperatures %}<tr class="cpu-temperature">
<td>{{ chip }} {{ sensor }}</td><td class="n">{{ number(value, "°C") }}</td></tr>
{% endfor %}</table>
{% else %}<p class="muted">No CPU temperature.</p>{% endif %}
{% if r.cpu_power %}<table>
<tr><th>package</th><th>CPU power</th><th>DRAM power</th></tr>
{% for package, cpu, dram in r.cpu_power %}<tr class="cpu-power">
<td>{{ package }}</td><td class="n">{{ number(cpu, "W", 1) }}</td>
<td class="n">{{ number(dram, "W", 1) }}</td></tr>
{% endfor %}</table>
{% else %}<p class="muted">No CPU power.</p>{% endif %}

<h2 id="inlet">Inlet air</h2>
{% if r.inlets %}<table>
{% for chip, sensor, value in r.inlets %}<tr class="inlet">
<td>{{ chip }} {{ sensor }}</td><td class="n">{{ number(value, "°C", 1) }}</td></tr>
{% endfor %}</table>
{% else %}<p class="muted">No inlet reading.</p>{% endif %}

<h2 id="power">Node power</h2>
{% if r.node_power %}<table>
{% for source, watts, includes in r.node_power %}<tr class="node-power">
<td>{{ source }}</td><td class="n">{{ number(watts, "W", 1) }}</td>
<td>{{ "GPUs included" if includes else "GPUs not included" if includes is false else "" }}</td>
</tr>
{% endfor %}</table>
{% else %}<p class="muted">No whole-node power reading.</p>{% endif %}
{% if r.overhead_watts is not none %}<p>Declared overhead (no sensor sees it):
{{ number(r.overhead_watts, "W") }}.</p>{% endif %}

<h2 id="sources">Sources</h2>
<div class="scroll"><table>
<tr><th>source</th><th>interval</th><th>status</th><th>series</th><th>last success</th></tr>
{% for s in sources %}<tr id="source-{{ s.name }}">
<td>{{ s.name }}</td><td>{{ s.interval }}</td>
<td>{% if s.up is false %}<span class="down">{{ s.status }}</span>
{%- else %}{{ s.status }}{% endif %}</td>
<td class="n">{{ s.series }}</td><td>{{ s.last_success }}</td></tr>
{% endfor %}</table></div>
<p><a href="/metrics">/metrics</a></p>
</body></html>
"""


@functools.cache
def page_template() -> jinja2.Template:
    """The page's template, compiled once, at the first request for `/` (see the module)."""
    import jinja2

    return jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(
        _PAGE_SOURCE
    )


def source_rows(runners: Iterable[SourceRunner], disabled: Iterable[str]) -> list[SourceRow]:
    now = time.time()
    rows = []
    for runner in runners:
        state = runner.state
        if state.up is None:
            status = "not polled yet"
        elif not state.up:
            status = f"failing: {state.reason}"
        else:
            status = state.reason or "ok"
        age = "never" if state.last_success is None else f"{now - state.last_success:.1f}s ago"
        rows.append(
            SourceRow(
                runner.name, f"{runner.interval:g}s", status, state.up, len(state.samples), age
            )
        )
    rows += [SourceRow(name, "", "disabled in agent.yaml", None, 0, "") for name in disabled]
    return rows


def served(config: AgentConfig, runners: list[SourceRunner]) -> list[Sample]:
    """The samples `/metrics` serves now (exporter.collector.ExporterCollector), less the
    exporter's own bookkeeping."""
    samples = declared_samples(config)
    by_source = {runner.name: {s.metric for s in runner.fresh_samples()} for runner in runners}
    for runner in runners:
        samples.extend(served_samples(runner, by_source))
    samples.extend(includes_gpus(config, samples))
    return samples


def status_page(
    config: AgentConfig, runners: Iterable[SourceRunner], disabled: Iterable[str]
) -> str:
    runners = list(runners)
    labels = config.labels
    place = ", ".join(
        f"{kind} {name}"
        for kind, name in (
            ("site", labels.site),
            ("room", labels.room),
            ("row", labels.row),
            ("rack", labels.rack),
        )
        if name
    )
    return page_template().render(
        node=config.node,
        place=place,
        feeds=", ".join(labels.pdus),
        r=readings(served(config, runners)),
        sources=source_rows(runners, disabled),
    )


def make_app(
    registry: CollectorRegistry,
    page: Callable[[], str],
    routes: Mapping[str, Callable[[Environ, StartResponse], Iterable[bytes]]] | None = None,
) -> Callable[..., Iterable[bytes]]:
    """`/metrics`, `/`, and the `routes` given (path → WSGI app: `/bmc`, exporter/bmc_probe.py)."""
    metrics_app = make_wsgi_app(registry)
    routes = dict(routes or {})

    def app(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)  # type: ignore[arg-type]
        if isinstance(path, str) and path in routes:
            return routes[path](environ, start_response)
        if path == "/":
            body = page().encode()
            start_response(
                "200 OK",
                [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body)))],
            )
            return [body]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics or /\n"]

    return app


def serve(host: str, port: int, app: Callable[..., Iterable[bytes]]) -> WSGIServer:
    """Bind now (so a busy port fails at start); the caller runs serve_forever()."""
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    return make_server(host, port, app, server_class=server_class, handler_class=_QuietHandler)
