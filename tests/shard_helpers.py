"""A small GPU fleet served in three shards, and the servers that evaluate its rules in
layers: Prometheus shards with the node layer, feeding a global view (VictoriaMetrics with
vmalert through remote write, or a Prometheus federating them) with the domain layer
(docs/rules.md, "Layers"). tests/test_sharded_rules.py compares those views with one
Prometheus that scrapes the whole fleet and evaluates every layer.

The fleet (12 nodes of 4 GPUs, site s1):

    room m1  row w1  rack r1: r1-n1 (A), r1-n2 (A)     inlet 40 °C: hot
                     rack r2: r2-n1 (A), r2-n2 (B)     inlets 22 and 29 °C: warm, across shards
             row w2  rack r3: r3-n1 (A), r3-n2 (B)     2 of its 8 GPUs throttled, both on r3-n1
                                                       (A): 0.25 of the rack, hot, across shards
                     rack r4: r4-n1 (B), r4-n2 (B)     a GPU near slowdown: warm
    room m2  row w3  rack r5: r5-n1 (C), r5-n2 (C)     22 °C: ok
                     rack r6: r6-n1 (C), r6-n2 (C)     33 °C: hot
    pdus: pa feeds r1 (A) and r4 (B); pb feeds r2 and r3 (A and B) and r4-n2 (dual-fed,
          on pa too); pc feeds r5 and r6 (C).

Odd nodes report a BMC reading (measured power), even ones their components (GPUs and CPU
packages), so both node power branches add up across shards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from llmgw_sim.demo.scale import scale_rules
from tests.promstack import Server, _status_ok, binary, running

REPO = Path(__file__).resolve().parent.parent
NODE_LAYER = [REPO / "rules" / "node.yml"]
DOMAIN_LAYER = [REPO / "rules" / "domain.yml", REPO / "rules" / "conditions.yml"]
#: What a shard ships to the global view: the node layer's output, nothing else (its own
#: scrapes and any site rules it evaluates stay local).
NODE_LAYER_SERIES = "llmgw:(node|location|pdu)_.+"
SHARDS = ("a", "b", "c")
GPUS_PER_NODE = 4


@dataclass
class Node:
    name: str
    shard: str
    room: str
    row: str
    rack: str
    pdus: tuple[str, ...]
    inlet_celsius: float
    throttled: int = 0
    headrooms: tuple[float, ...] = (20.0, 20.0, 20.0, 20.0)


def _fleet() -> list[Node]:
    def node(name: str, shard: str, rack: str, pdus: tuple[str, ...], inlet: float, **kw: Any):
        row, room = {
            "r1": ("w1", "m1"),
            "r2": ("w1", "m1"),
            "r3": ("w2", "m1"),
            "r4": ("w2", "m1"),
            "r5": ("w3", "m2"),
            "r6": ("w3", "m2"),
        }[rack]
        return Node(name, shard, room, row, rack, pdus, inlet, **kw)

    return [
        node("r1-n1", "a", "r1", ("pa",), 40.0),
        node("r1-n2", "a", "r1", ("pa",), 40.0),
        node("r2-n1", "a", "r2", ("pb",), 22.0),
        node("r2-n2", "b", "r2", ("pb",), 29.0),
        node("r3-n1", "a", "r3", ("pb",), 22.0, throttled=1),
        node("r3-n2", "b", "r3", ("pb",), 22.0),
        node("r4-n1", "b", "r4", ("pa",), 22.0),
        node("r4-n2", "b", "r4", ("pa", "pb"), 22.0, headrooms=(20.0, 3.0, 20.0, 20.0)),
        node("r5-n1", "c", "r5", ("pc",), 22.0),
        node("r5-n2", "c", "r5", ("pc",), 22.0),
        node("r6-n1", "c", "r6", ("pc",), 33.0),
        node("r6-n2", "c", "r6", ("pc",), 33.0),
    ]


@dataclass
class Fleet:
    """The nodes, with their inlets changeable while the pages are served."""

    nodes: list[Node] = field(default_factory=_fleet)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set_inlet(self, rack: str, celsius: float) -> None:
        with self._lock:
            for node in self.nodes:
                if node.rack == rack:
                    node.inlet_celsius = celsius

    def page(self, shard: str | None) -> bytes:
        """The exporters' series of the shard's nodes (every node for None), as one
        exposition: each series carries `node`, as the exporter's do."""
        now = time.time()
        lines: list[str] = []
        with self._lock:
            nodes = [n for n in self.nodes if shard is None or n.shard == shard]
            for n in nodes:
                lines += _node_lines(n, now, measured=int(n.name[-1]) % 2 == 1)
        return ("\n".join(lines) + "\n").encode()


def _node_lines(n: Node, now: float, *, measured: bool) -> list[str]:
    at = f'node="{n.name}"'
    lines = [
        f'llmgw_node_info{{{at},site="s1",room="{n.room}",row="{n.row}",rack="{n.rack}"}} 1',
        *(f'llmgw_node_pdu_info{{{at},pdu="{pdu}"}} 1' for pdu in n.pdus),
        f"llmgw_node_gpus{{{at}}} {GPUS_PER_NODE}",
        f"llmgw_node_gpus_thermally_throttled{{{at}}} {n.throttled}",
        f"llmgw_node_gpu_power_watts{{{at}}} {GPUS_PER_NODE * 300}",
        *(
            f'llmgw_gpu_slowdown_headroom_celsius{{{at},gpu="{gpu}",uuid="GPU-{n.name}-{gpu}"}} '
            f"{headroom}"
            for gpu, headroom in enumerate(n.headrooms)
        ),
        f'llmgw_node_inlet_temperature_celsius{{{at},chip="platform_nct6775_656",sensor="SYSTIN"}} '
        f"{n.inlet_celsius}",
        f'llmgw_exporter_source_last_success_timestamp_seconds{{{at},source="gpu"}} {now:.3f}',
        f'llmgw_exporter_source_last_success_timestamp_seconds{{{at},source="hwmon"}} {now:.3f}',
    ]
    if measured:
        lines.append(f'llmgw_node_power_watts{{{at},source="ipmi"}} 1500')
    else:
        lines.append(f'llmgw_node_cpu_power_watts{{{at},package="0"}} 150')
    return lines


def scaled_rule_files(files: Sequence[Path], factor: float, workdir: Path) -> list[Path]:
    """Copies of `files` in `workdir` with every duration divided by `factor`."""
    workdir.mkdir(parents=True, exist_ok=True)
    copies = []
    for source in files:
        copy = workdir / source.name
        copy.write_text(scale_rules(source.read_text(), factor, source=source.name))
        copies.append(copy)
    return copies


@contextmanager
def prometheus_server(
    name: str,
    workdir: Path,
    *,
    rule_files: Sequence[Path],
    scrape_configs: list[dict[str, Any]],
    interval: str,
    external_labels: Mapping[str, str] | None = None,
    remote_write: str | None = None,
    lookback_delta: str | None = None,
) -> Iterator[Server]:
    """A Prometheus with the given scrapes (every second), rules and, for a shard, the
    external labels that tell its series apart and a remote write of the node layer's
    output (relabelled to those series alone) to `remote_write`. `lookback_delta`: how
    far back an instant selector finds a sample (default 5m); a federating Prometheus
    needs it short, since federated samples carry their timestamps and a failed scrape
    of a stopped shard writes no stale markers for them (docs/rules.md, "Layers")."""
    workdir.mkdir(parents=True, exist_ok=True)
    global_config: dict[str, Any] = {
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "evaluation_interval": interval,
    }
    if external_labels:
        global_config["external_labels"] = dict(external_labels)
    config: dict[str, Any] = {
        "global": global_config,
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": scrape_configs,
    }
    if remote_write:
        config["remote_write"] = [
            {
                "url": remote_write,
                "queue_config": {"batch_send_deadline": "200ms"},
                "write_relabel_configs": [
                    {"source_labels": ["__name__"], "regex": NODE_LAYER_SERIES, "action": "keep"}
                ],
            }
        ]
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))

    def command(port: int) -> list[str]:
        return [
            binary("prometheus"),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *([f"--query.lookback-delta={lookback_delta}"] if lookback_delta else []),
        ]

    with running(name, command, workdir, _status_ok("/-/ready"), timeout_s=60) as server:
        yield server


@contextmanager
def vmalert_server(
    workdir: Path, *, rule_files: Sequence[Path], datasource: str, query_step: str
) -> Iterator[Server]:
    """vmalert evaluating `rule_files` against the VictoriaMetrics at `datasource`, writing
    its results back there, with `-datasource.queryStep` at `query_step`: how far back an
    instant selector finds a sample. Its default, 5m, keeps a shard that stopped sending
    (Prometheus writes no stale marker when it stops) in every domain for five minutes;
    twice the node layer's interval lets it go after two missed evaluations
    (docs/rules.md, "Layers")."""

    def command(port: int) -> list[str]:
        return [
            binary("vmalert"),
            *(f"-rule={path}" for path in rule_files),
            f"-datasource.url={datasource}",
            f"-datasource.queryStep={query_step}",
            f"-remoteWrite.url={datasource}",
            "-remoteWrite.flushInterval=500ms",
            f"-remoteRead.url={datasource}",
            f"-httpListenAddr=127.0.0.1:{port}",
        ]

    with running("vmalert", command, workdir, _status_ok("/health"), timeout_s=60) as server:
        yield server


def scrape(job: str, targets: Sequence[str]) -> dict[str, Any]:
    return {"job_name": job, "static_configs": [{"targets": list(targets)}]}


def federate(targets: Sequence[str]) -> dict[str, Any]:
    """The global Prometheus's scrape of the shards' /federate: the node layer's series,
    with the labels the shards gave them (their `shard` external label among them)."""
    return {
        "job_name": "federate",
        "honor_labels": True,
        "metrics_path": "/federate",
        "params": {"match[]": [f'{{__name__=~"{NODE_LAYER_SERIES}"}}']},
        "static_configs": [{"targets": list(targets)}],
    }


def host_port(url: str) -> str:
    return url.removeprefix("http://")


def query(url: str, promql: str, step: str) -> dict[frozenset[tuple[str, str]], float]:
    """An instant query's answer: labels (without the name) → value. `step` is how far
    back VictoriaMetrics looks for a sample (Prometheus ignores it: 5m, or a stale marker)."""
    answer = requests.get(f"{url}/api/v1/query", params={"query": promql, "step": step}, timeout=10)
    answer.raise_for_status()
    body = answer.json()
    assert body["status"] == "success", body
    return {
        frozenset((k, v) for k, v in series["metric"].items() if k != "__name__"): float(
            series["value"][1]
        )
        for series in body["data"]["result"]
    }


def conditions(url: str, step: str) -> dict[tuple[str, str], str]:
    """(kind, domain) → its condition at 1, one instant query of the state set."""
    out: dict[tuple[str, str], str] = {}
    for labels, value in query(url, "llmgw_domain_condition == 1", step).items():
        named = dict(labels)
        assert value == 1
        key = (named["kind"], named["domain"])
        assert key not in out, f"{key} at two conditions: {out[key]} and {named['condition']}"
        out[key] = named["condition"]
    return out
