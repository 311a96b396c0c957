"""The rules sharded: the node layer in S Prometheus shards, the domain layer on a global view.

N nodes of rules_eval's fleet (one generator process, one scrape target per node) are
split over S shards in node order, so racks, rows and rooms can straddle two shards as on
a site. Each shard is a real Prometheus scraping its nodes every 15 s and evaluating the
**node layer** (the groups named by `--node-layer`). Each shard remote-writes what the
global view needs (the series the domain layer reads, and those the decider reads) to two
global views side by side, fed the same samples:

- a Prometheus receiving remote write (`--web.enable-remote-write-receiver`) that
  evaluates the **domain layer** (every other group, or `--domain-layer`);
- VictoriaMetrics with vmalert evaluating the same domain-layer files, writing back to it
  (the flags of docs/rules.md, "Running in vmalert").

After a warm-up it reads, for several evaluations of every group: each shard's and the
global Prometheus' `prometheus_rule_group_last_duration_seconds` (rules_eval.Recorder),
vmalert's `vmalert_iteration_duration_seconds` (sum and count over the same time), every
process's CPU and memory; then each group's floor (`count()` of every input series it
reads, rules_eval.selection_costs) on the Prometheus that runs it, and the decider's
refresh (decider.refresher.refresh, the function its background thread runs) against
each global view, whole and readings only. From these: the node layer's cost per node
(per shard), the domain layer's per domain, the decider's per node, and what a site of
`--extrapolate` nodes needs with shards of the measured size.

Usage (from the repository root):

    .venv/bin/python benchmarks/rules_sharded.py --nodes 3000 --shards 3 \\
        --node-layer rules/node.yml --node-layer alerts/exporter.yml \\
        --node-layer alerts/domain.yml:llmgw-gpu.alerts

`--node-layer` and `--domain-layer` take a rule file, or `file:group` for one group of
it, and may be repeated; the domain layer defaults to every group of rules/ and alerts/
not in the node layer. Writes benchmarks/results/rules_sharded.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from statistics import mean, median
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rules_eval as bench

sys.path.insert(0, str(bench.REPO))
from decider.prometheus_reader import PrometheusReader
from decider.refresher import FRESH_WINDOW_S, queries, refresh
from decider.snapshot import INVENTORY_PARTS, Snapshot

RESULTS = bench.REPO / "benchmarks" / "results" / "rules_sharded.json"
#: The decider's default staleness.inventory (decider/config.py): the inventory parts' window.
INVENTORY_WINDOW_S = 3600.0
#: A shard's node layer, all its groups together, may take this share of the interval in the
#: extrapolation (room for a slower evaluation, a compaction, a restart's catch-up).
SHARD_BUDGET_SHARE = 0.25
#: Shards' remote write: flush at least this often, so the global view lags a few seconds.
REMOTE_WRITE_DEADLINE = "5s"


# --- the layers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerSpec:
    """A rule file, or one group of it (`file:group`)."""

    path: str
    group: str | None

    @classmethod
    def parse(cls, text: str) -> LayerSpec:
        path, _, group = text.partition(":")
        if not (bench.REPO / path).is_file():
            raise argparse.ArgumentTypeError(f"{path}: no such rule file in the repository")
        return cls(path, group or None)


def split_layers(
    contents: dict[str, bytes], node: list[LayerSpec], domain: list[LayerSpec] | None
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """Per layer: file (relative path) -> its groups in that layer. A group named twice or
    in no file is an error, as is a group in both layers."""
    groups = {
        name: (yaml.safe_load(content) or {}).get("groups") or []
        for name, content in contents.items()
    }

    def select(specs: list[LayerSpec]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for spec in specs:
            if spec.path not in groups:
                raise SystemExit(f"{spec.path}: not among the rule files {sorted(groups)}")
            chosen = [g for g in groups[spec.path] if spec.group in (None, g["name"])]
            if not chosen:
                raise SystemExit(f"{spec.path} has no group {spec.group!r}")
            taken = out.setdefault(spec.path, [])
            for group in chosen:
                if group in taken:
                    raise SystemExit(f"{spec.path}: group {group['name']} named twice")
                taken.append(group)
        return out

    node_layer = select(node)
    if domain is None:
        domain_layer = {
            path: rest
            for path, all_groups in groups.items()
            if (rest := [g for g in all_groups if g not in node_layer.get(path, [])])
        }
    else:
        domain_layer = select(domain)
    both = [
        f"{path}:{g['name']}"
        for path, chosen in domain_layer.items()
        for g in chosen
        if g in node_layer.get(path, [])
    ]
    if both:
        raise SystemExit(f"in both layers: {', '.join(both)}")
    return node_layer, domain_layer


def write_layer(root: Path, layer: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """The layer's groups, each file under `root` at its own relative path (the path and
    the group's name set its evaluation offset, as in the repository)."""
    paths = []
    for name, groups in sorted(layer.items()):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000))
        paths.append(path)
    return paths


def layer_names(layer: dict[str, list[dict[str, Any]]]) -> list[str]:
    return sorted(f"{path}:{group['name']}" for path, groups in layer.items() for group in groups)


def rules_of(layer: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """rules_eval.load_rules' shape: every rule with its file, group and interval."""
    out = []
    for name, groups in layer.items():
        for group in groups:
            interval = bench.seconds(group.get("interval", f"{bench.EVALUATION_INTERVAL_S}s"))
            for index, rule in enumerate(group.get("rules") or []):
                out.append(
                    {"file": Path(name), "group": group["name"], "interval_s": interval}
                    | {"index": index}
                    | rule
                )
    return out


def decider_reads() -> set[str]:
    """Every series name the decider's queries select."""
    names: set[str] = set()
    for text in queries(FRESH_WINDOW_S, INVENTORY_WINDOW_S).values():
        names |= set(bench._NAME.findall(text))
    return names


def forwarded(node_rules: list[dict[str, Any]], domain_rules: list[dict[str, Any]]) -> list[str]:
    """What the shards send the global view: every series the domain layer or the decider
    reads that the domain layer does not record itself (the node layer's outputs, and any
    exporter family read above the node layer)."""
    recorded_above = {r["record"] for r in domain_rules if "record" in r}
    known = {*bench.FAMILIES, bench.TOKENS} | {r["record"] for r in node_rules if "record" in r}
    domain_groups = {r["group"] for r in domain_rules}
    read_above = {
        name
        for group, names in bench.input_names([*node_rules, *domain_rules]).items()
        if group in domain_groups
        for name in names
    }
    return sorted(((read_above | decider_reads()) & known) - recorded_above)


# --- the servers -----------------------------------------------------------------------------


@contextmanager
def notifier_sink() -> Iterator[str]:
    """A loopback URL that accepts vmalert's alert POSTs (vmalert 1.79 needs a notifier)."""

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    thread = threading.Thread(target=server.serve_forever, name="notifier-sink", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextmanager
def victoria(
    name: str, workdir: Path, argv: list[str], ready_path: str = "/health"
) -> Iterator[tuple[bench.Proc, str]]:
    """A VictoriaMetrics binary (`argv` without its listen address) on a free port."""
    for attempt in range(3):
        port = bench.free_port()
        url = f"http://127.0.0.1:{port}"
        proc = bench.Proc(
            name, [*argv, f"-httpListenAddr=127.0.0.1:{port}"], workdir / f"{name}.log"
        )
        try:
            proc.start()
            deadline = time.monotonic() + 120
            while proc.alive() and time.monotonic() < deadline:
                try:
                    bench.http_get(f"{url}{ready_path}", timeout=2)
                    break
                except OSError:
                    time.sleep(0.2)
            else:
                log = proc.tail()
                proc.stop()
                if "address already in use" in log and attempt < 2:
                    continue
                raise RuntimeError(f"{name} did not get ready; its log ends:\n{log}")
            yield proc, url
            return
        finally:
            proc.stop()


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"{name} is not installed (`make debian-packages`)")
    return path


def shard_config(
    shard: str,
    generator_port: int,
    nodes: list[bench.Node],
    rule_files: list[Path],
    write_to: list[str],
    keep: list[str],
) -> dict[str, Any]:
    config = bench.prometheus_config(generator_port, nodes, rule_files)
    # Each shard's own label (docs/rules.md, "Layers"): a location in two shards arrives
    # at the global view as one series per shard.
    config["global"]["external_labels"] = {"shard": shard}
    keep_regex = "|".join(re.escape(name) for name in keep)
    config["remote_write"] = [
        {
            "url": url,
            "write_relabel_configs": [
                {"source_labels": ["__name__"], "regex": keep_regex, "action": "keep"}
            ],
            "queue_config": {"batch_send_deadline": REMOTE_WRITE_DEADLINE},
        }
        for url in write_to
    ]
    return config


def global_config(rule_files: list[Path]) -> dict[str, Any]:
    return {
        "global": {"evaluation_interval": f"{bench.EVALUATION_INTERVAL_S}s"},
        "rule_files": [str(path) for path in rule_files],
    }


# --- vmalert's figures -----------------------------------------------------------------------


def vmalert_counters(url: str) -> dict[str, dict[str, float]]:
    """Per group: the iteration duration's sum and count, and missed iterations."""
    out: dict[str, dict[str, float]] = {}
    for name, labels, value in bench.parse_metrics(bench.http_get(f"{url}/metrics").decode()):
        if name in (
            "vmalert_iteration_duration_seconds_sum",
            "vmalert_iteration_duration_seconds_count",
            "vmalert_iteration_missed_total",
        ):
            out.setdefault(labels["group"], {})[name] = value
    return out


def vmalert_health(url: str) -> list[str]:
    """Rules vmalert reports in error, `group #name: error`."""
    groups = bench.api(url, "/api/v1/rules")["groups"]
    return [
        f"{group['name']} {rule['name']}: {rule['lastError']}"
        for group in groups
        for rule in group["rules"]
        if rule.get("lastError")
    ]


# --- the decider against a global view ------------------------------------------------------


#: How long the global view may take to hold every node's membership once measuring ends.
MEMBERSHIP_WAIT_S = 180.0


def wait_for_every_node(url: str, nodes: int) -> float:
    """Seconds until the view at `url` holds the membership of all `nodes` (what the
    decider reads first), so that its refresh reads a whole fleet; raises past
    MEMBERSHIP_WAIT_S, naming how many it holds."""
    started = time.monotonic()
    expr = "count(count by (node) (last_over_time(llmgw:node_domain:membership[2m])))"
    while True:
        held = int(bench.query_value(url, expr) or 0)
        if held >= nodes:
            return time.monotonic() - started
        if time.monotonic() - started > MEMBERSHIP_WAIT_S:
            raise RuntimeError(f"{url} holds the membership of {held} of {nodes} nodes")
        time.sleep(1.0)


def decider_refreshes(url: str, times: int) -> dict[str, Any]:
    """decider.refresher.refresh against `url`, `times` over: a whole refresh (every part,
    as at start and after a reload) and a readings refresh (the inventory parts kept, as
    most background refreshes), wall time each; then each part's query alone, one after
    the other (the load it puts on the server); and what the snapshot holds."""
    reader = PrometheusReader(url, timeout=60.0, retries=0)
    try:
        whole, readings = [], []
        snapshot = Snapshot()
        for _ in range(times):
            started = time.perf_counter()
            snapshot = refresh(
                Snapshot(),
                reader,
                FRESH_WINDOW_S,
                time.time(),
                inventory_window_seconds=INVENTORY_WINDOW_S,
            )
            whole.append(time.perf_counter() - started)
            started = time.perf_counter()
            refresh(
                snapshot,
                reader,
                FRESH_WINDOW_S,
                time.time(),
                inventory_window_seconds=INVENTORY_WINDOW_S,
                keep=frozenset(INVENTORY_PARTS),
            )
            readings.append(time.perf_counter() - started)
        per_part = {}
        for part, text in queries(FRESH_WINDOW_S, INVENTORY_WINDOW_S).items():
            runs = []
            for _ in range(3):
                started = time.perf_counter()
                answer = reader.query(text)
                runs.append(time.perf_counter() - started)
            per_part[part] = {"ms": median(runs) * 1e3, "series": len(answer)}
        errors = {p: part.error for p, part in snapshot.parts.items() if part.error}
    finally:
        reader.close()
    return {
        "whole_ms": {"median": median(whole) * 1e3, "max": max(whole) * 1e3},
        "readings_ms": {"median": median(readings) * 1e3, "max": max(readings) * 1e3},
        "per_part": per_part,
        "queries_ms_sum": sum(p["ms"] for p in per_part.values()),
        "snapshot": {
            "nodes": len(snapshot.membership),
            "domains": len(snapshot.domains),
            "measured_watts": len(snapshot.measured_watts),
            "conditions": len(snapshot.conditions),
            "node_gpus": len(snapshot.node_gpus),
            "prometheus_up": snapshot.prometheus_up,
            "errors": errors,
        },
    }


# --- the run ---------------------------------------------------------------------------------


def share_ms_per_30s(groups: dict[str, Any]) -> float:
    """Σ each group's median duration over its interval, as ms per 30 s (rules_eval's
    share of the time), the baselines left out."""
    return sum(
        g["duration_ms"]["median"] / g["interval_s"] * bench.EVALUATION_INTERVAL_S
        for name, g in groups.items()
        if not name.startswith("bench-baseline-")
    )


def prometheus_groups(
    recorder: bench.Recorder,
    keys: set[str],
    since: float,
    evaluations: int,
    intervals: dict[str, float],
) -> dict[str, Any]:
    out = {}
    for key in sorted(keys):
        evals = recorder.evaluations(key, since)[:evaluations]
        rule_evals = recorder.rule_evaluations(key, since)[:evaluations]
        name = key.partition(";")[2]
        durations = [e["duration_s"] for e in evals]
        out[name] = {
            "rules": len(rule_evals[0]) if rule_evals else 0,
            "interval_s": intervals.get(name, bench.EVALUATION_INTERVAL_S),
            "evaluations": len(evals),
            "duration_ms": bench._stats_ms(durations) if durations else {},
            "mean_ms": mean(durations) * 1e3 if durations else None,
            "per_rule": [
                {
                    "index": rule["index"],
                    "name": rule["name"],
                    "health": sorted({e[rule["index"]]["health"] for e in rule_evals}),
                    "errors": sorted({e[rule["index"]]["error"] for e in rule_evals} - {""}),
                }
                for rule in (rule_evals[0] if rule_evals else [])
            ],
        }
    return out


def expected_keys(rule_files: list[Path]) -> tuple[set[str], dict[str, float]]:
    rules = bench.load_rules(rule_files)
    keys = {f"{rule['file']};{rule['group']}" for rule in rules}
    for path in rule_files:  # groups without rules (the empty baseline)
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups") or []:
            keys.add(f"{path};{group['name']}")
    intervals = {rule["group"]: rule["interval_s"] for rule in rules}
    return keys, intervals


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    snapshot = bench.RuleSnapshot.take(bench.RULE_FILES)
    node_layer, domain_layer = split_layers(snapshot.contents, args.node_layer, args.domain_layer)
    node_rules, domain_rules = rules_of(node_layer), rules_of(domain_layer)
    keep = forwarded(node_rules, domain_rules)
    plan = bench.plan_backfill([*node_rules, *domain_rules], args.warmup)
    # Nothing is backfilled here: a window reaching past the warm-up is read part-filled
    # (rules_eval.py's memory windows are too, `live_only`); said, and kept in the JSON.
    part_filled = sorted(plan.raw | plan.recorded | plan.live_only)
    if part_filled:
        print(f"windows reaching past the warm-up, read part-filled: {part_filled}")
    fleet = bench.topology(args.nodes, args.energy)
    shards = [
        [node for node in fleet if node.index * args.shards // args.nodes == shard]
        for shard in range(args.shards)
    ]
    log = print
    with (
        tempfile.TemporaryDirectory(prefix="llmgw-rules-sharded-") as tmp_name,
        ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        # Each shard its own copy: Prometheus offsets a group in the interval by a hash of
        # its name and file, so copies at one path would evaluate at the same instants,
        # three shards at once on this machine's cores; a site's shards have their own.
        node_files = [
            write_layer(tmp / f"shard-{index}-rules", node_layer) for index in range(args.shards)
        ]
        domain_files = write_layer(tmp / "domain-layer", domain_layer)
        baseline = tmp / bench.BASELINE_FILE
        baseline.write_text(yaml.safe_dump(bench.baseline_rules(), sort_keys=False))
        log(f"node layer: {', '.join(layer_names(node_layer))}")
        log(f"domain layer: {', '.join(layer_names(domain_layer))}")
        log(f"forwarded to the global view: {keep}")
        generator, port = stack.enter_context(
            bench.generator_process(args.nodes, time.time() - 3600, tmp, args.energy)
        )
        (tmp / "global").mkdir()
        global_prom, global_url = stack.enter_context(
            bench.prometheus(
                tmp,
                tmp / "global",
                global_config([*domain_files, baseline]),
                name="global-prometheus",
                extra_args=("--web.enable-remote-write-receiver",),
            )
        )
        vm, vm_url = stack.enter_context(
            victoria(
                "victoria-metrics",
                tmp,
                [
                    binary("victoria-metrics"),
                    f"-storageDataPath={tmp / 'vm-data'}",
                    "-search.latencyOffset=0s",
                    "-search.disableCache",
                ],
            )
        )
        sink = stack.enter_context(notifier_sink())
        vmalert, vmalert_url = stack.enter_context(
            victoria(
                "vmalert",
                tmp,
                [
                    binary("vmalert"),
                    *(f"-rule={path}" for path in domain_files),
                    f"-datasource.url={vm_url}",
                    f"-remoteWrite.url={vm_url}",
                    "-remoteWrite.flushInterval=1s",
                    f"-remoteRead.url={vm_url}",
                    f"-notifier.url={sink}",
                    f"-evaluationInterval={bench.EVALUATION_INTERVAL_S}s",
                ],
            )
        )
        shard_procs: list[tuple[bench.Proc, str]] = []
        for index, members in enumerate(shards):
            data = tmp / f"shard-{index}"
            data.mkdir()
            config = shard_config(
                f"shard-{index}",
                port,
                members,
                [*node_files[index], baseline],
                [f"{global_url}/api/v1/write", f"{vm_url}/api/v1/write"],
                keep,
            )
            shard_procs.append(
                stack.enter_context(bench.prometheus(tmp, data, config, name=f"shard-{index}"))
            )
        live_from = time.time()
        log(
            f"{args.nodes} nodes over {args.shards} shards live since"
            f" {time.strftime('%H:%M:%S')}; warm-up {args.warmup:.0f} s"
        )
        vmalert_group_names = {g["name"] for groups in domain_layer.values() for g in groups}
        shard_expected = [expected_keys([*files, baseline]) for files in node_files]
        shard_keys = [keys for keys, _ in shard_expected]
        shard_intervals = shard_expected[0][1]
        global_keys, global_intervals = expected_keys([*domain_files, baseline])
        recorders = [bench.Recorder(url) for _, url in shard_procs]
        global_recorder = bench.Recorder(global_url)
        measure_from = live_from + args.warmup
        slowest = max(
            [bench.EVALUATION_INTERVAL_S, *shard_intervals.values(), *global_intervals.values()]
        )
        deadline = measure_from + (args.evaluations + 3) * slowest + 120
        procs = {
            **{f"shard-{i}": proc for i, (proc, _) in enumerate(shard_procs)},
            "global-prometheus": global_prom,
            "victoria-metrics": vm,
            "vmalert": vmalert,
            "generator": generator,
        }
        before: dict[str, Any] = {}
        while True:
            dead = [name for name, proc in procs.items() if not proc.alive()]
            if dead:
                raise RuntimeError(
                    f"{dead} exited:\n" + "\n".join(procs[name].tail() for name in dead)
                )
            for recorder in [*recorders, global_recorder]:
                recorder.poll()
            if not before and time.time() >= measure_from:
                before = {
                    "at": time.time(),
                    "busy": bench.busy_seconds(),
                    "cpu": {name: proc.cpu_seconds() for name, proc in procs.items()},
                    "own": bench.own_seconds(),
                    "vmalert": vmalert_counters(vmalert_url),
                }
            if before:
                vm_now = vmalert_counters(vmalert_url)
                vm_done = all(
                    vm_now.get(g, {}).get("vmalert_iteration_duration_seconds_count", 0)
                    - before["vmalert"]
                    .get(g, {})
                    .get("vmalert_iteration_duration_seconds_count", 0)
                    >= args.evaluations
                    for g in vmalert_group_names
                )
                prom_done = all(
                    len(r.evaluations(k, measure_from)) >= args.evaluations
                    for r, keys in zip(recorders, shard_keys, strict=True)
                    for k in keys
                ) and all(
                    len(global_recorder.evaluations(k, measure_from)) >= args.evaluations
                    for k in global_keys
                )
                if vm_done and prom_done:
                    break
            if time.time() > deadline:
                counts = {
                    **{
                        f"shard-{i} {k}": len(r.evaluations(k, measure_from))
                        for i, (r, keys) in enumerate(zip(recorders, shard_keys, strict=True))
                        for k in keys
                    },
                    **{k: len(global_recorder.evaluations(k, measure_from)) for k in global_keys},
                }
                raise RuntimeError(f"too few evaluations before the deadline: {counts}")
            time.sleep(args.poll)
        wall = time.time() - before["at"]
        cpu = {
            name: (proc.cpu_seconds() - before["cpu"][name]) / wall for name, proc in procs.items()
        }
        own = bench.own_seconds() - before["own"]
        other = (
            max(0.0, bench.busy_seconds() - before["busy"] - sum(cpu.values()) * wall - own) / wall
        )
        rss = {name: proc.rss_mib() for name, proc in procs.items()}
        vm_after = vmalert_counters(vmalert_url)
        vm_errors = vmalert_health(vmalert_url)
        log(f"measured {wall:.0f} s; floors and the decider's refreshes next")

        shard_results = []
        for index, ((_proc, url), recorder, members) in enumerate(
            zip(shard_procs, recorders, shards, strict=True)
        ):
            groups = prometheus_groups(
                recorder, shard_keys[index], measure_from, args.evaluations, shard_intervals
            )
            inputs = bench.input_names(node_rules)
            costs = bench.selection_costs(url, {n for names in inputs.values() for n in names})
            bench.group_floors(groups, inputs, costs)
            metrics = bench.parse_metrics(bench.http_get(f"{url}/metrics").decode())
            shard_results.append(
                {
                    "shard": index,
                    "nodes": len(members),
                    "groups": groups,
                    "share_ms_per_30s": share_ms_per_30s(groups),
                    "head_series": bench.metric_sum(metrics, "prometheus_tsdb_head_series"),
                    "missed_iterations": bench.metric_sum(
                        metrics, "prometheus_rule_group_iterations_missed_total"
                    ),
                    "remote_write_failed_samples": bench.metric_sum(
                        metrics, "prometheus_remote_storage_samples_failed_total"
                    ),
                    "cpu_cores": cpu[f"shard-{index}"],
                    "rss_mib": rss[f"shard-{index}"][0],
                    "peak_rss_mib": rss[f"shard-{index}"][1],
                }
            )
        global_groups = prometheus_groups(
            global_recorder, global_keys, measure_from, args.evaluations, global_intervals
        )
        inputs = bench.input_names([*node_rules, *domain_rules])
        domain_inputs = {g: inputs.get(g, []) for g in global_groups}
        costs = bench.selection_costs(
            global_url, {n for names in domain_inputs.values() for n in names}
        )
        bench.group_floors(global_groups, domain_inputs, costs)
        global_metrics = bench.parse_metrics(bench.http_get(f"{global_url}/metrics").decode())
        vmalert_groups = {}
        for group in sorted(vmalert_group_names):
            interval = global_intervals.get(group, bench.EVALUATION_INTERVAL_S)
            a, b = before["vmalert"].get(group, {}), vm_after.get(group, {})
            count = b.get("vmalert_iteration_duration_seconds_count", 0) - a.get(
                "vmalert_iteration_duration_seconds_count", 0
            )
            total = b.get("vmalert_iteration_duration_seconds_sum", 0) - a.get(
                "vmalert_iteration_duration_seconds_sum", 0
            )
            vmalert_groups[group] = {
                "interval_s": interval,
                "evaluations": count,
                "mean_ms": total / count * 1e3 if count else None,
                "missed_iterations": b.get("vmalert_iteration_missed_total", 0),
            }
        vm_share = sum(
            (g["mean_ms"] or 0) / g["interval_s"] * bench.EVALUATION_INTERVAL_S
            for name, g in vmalert_groups.items()
            if not name.startswith("bench-baseline-")
        )
        prom_mean_share = sum(
            (g["mean_ms"] or 0) / g["interval_s"] * bench.EVALUATION_INTERVAL_S
            for name, g in global_groups.items()
            if not name.startswith("bench-baseline-")
        )
        decider = {}
        for engine, url in (("prometheus", global_url), ("victoriametrics", vm_url)):
            waited = wait_for_every_node(url, args.nodes)
            decider[engine] = decider_refreshes(url, args.refreshes) | {"waited_s": waited}
        domain_count = sum(bench.domains(fleet).values())
        result_global = {
            "prometheus": {
                "groups": global_groups,
                "share_ms_per_30s": share_ms_per_30s(global_groups),
                "mean_share_ms_per_30s": prom_mean_share,
                "head_series": bench.metric_sum(global_metrics, "prometheus_tsdb_head_series"),
                "missed_iterations": bench.metric_sum(
                    global_metrics, "prometheus_rule_group_iterations_missed_total"
                ),
                "cpu_cores": cpu["global-prometheus"],
                "rss_mib": rss["global-prometheus"][0],
                "peak_rss_mib": rss["global-prometheus"][1],
            },
            "victoriametrics_vmalert": {
                "groups": vmalert_groups,
                "mean_share_ms_per_30s": vm_share,
                "rules_in_error": vm_errors,
                "cpu_cores": {
                    "victoria-metrics": cpu["victoria-metrics"],
                    "vmalert": cpu["vmalert"],
                },
                "rss_mib": {
                    "victoria-metrics": rss["victoria-metrics"][0],
                    "vmalert": rss["vmalert"][0],
                },
                "peak_rss_mib": {
                    "victoria-metrics": rss["victoria-metrics"][1],
                    "vmalert": rss["vmalert"][1],
                },
            },
        }
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": args.command,
        "machine": bench.machine()
        | {
            # vmalert 1.79 prints no version; Debian's package says it.
            "vmalert": "victoria-metrics and vmalert "
            + bench.version_line(["dpkg-query", "-W", "-f", "${Version}", "victoria-metrics"])
        },
        "settings": {
            "nodes": args.nodes,
            "shards": args.shards,
            "warmup_s": args.warmup,
            "evaluations": args.evaluations,
            "energy_fleet": args.energy,
            "node_layer": layer_names(node_layer),
            "domain_layer": layer_names(domain_layer),
            "forwarded": keep,
            "part_filled_windows": part_filled,
            "rule_files_sha256": snapshot.sha256(),
        },
        "domains": bench.domains(fleet) | {"total": domain_count},
        "shards": shard_results,
        "global": result_global,
        "decider": decider,
        "other_load_cores": other,
        "generator_cpu_cores": cpu["generator"],
        "measured_window_s": wall,
        "wall_s": time.monotonic() - started,
    }
    result["per_unit"] = per_unit(result)
    result["extrapolation"] = [extrapolate(result, n) for n in args.extrapolate]
    return result


def per_unit(result: dict[str, Any]) -> dict[str, Any]:
    """The measured costs per node (node layer, per shard; the decider's refresh) and per
    domain (the domain layer on the global view)."""
    shards = result["shards"]
    nodes = result["settings"]["nodes"]
    domains = result["domains"]["total"]
    glob = result["global"]
    return {
        "node_layer_ms_per_30s_per_node": mean(s["share_ms_per_30s"] / s["nodes"] for s in shards),
        "shard_rss_mib_per_node": mean(s["rss_mib"] / s["nodes"] for s in shards),
        "shard_cpu_cores_per_node": mean(s["cpu_cores"] / s["nodes"] for s in shards),
        "domain_layer_ms_per_30s_per_domain": {
            "prometheus": glob["prometheus"]["share_ms_per_30s"] / domains,
            "victoriametrics_vmalert": glob["victoriametrics_vmalert"]["mean_share_ms_per_30s"]
            / domains,
        },
        "global_head_series_per_node": glob["prometheus"]["head_series"] / nodes,
        "global_rss_mib_per_node": {
            "prometheus": glob["prometheus"]["rss_mib"] / nodes,
            "victoriametrics_vmalert": sum(glob["victoriametrics_vmalert"]["rss_mib"].values())
            / nodes,
        },
        "decider_whole_refresh_ms_per_node": {
            engine: figures["whole_ms"]["median"] / nodes
            for engine, figures in result["decider"].items()
        },
        "decider_readings_refresh_ms_per_node": {
            engine: figures["readings_ms"]["median"] / nodes
            for engine, figures in result["decider"].items()
        },
        "decider_query_load_ms_per_node": {
            engine: figures["queries_ms_sum"] / nodes
            for engine, figures in result["decider"].items()
        },
    }


def extrapolate(result: dict[str, Any], nodes: int) -> dict[str, Any]:
    """A site of `nodes` nodes, linear in the measured per-node and per-domain costs:
    shards no larger than the measured ones (and fewer nodes each where the node layer
    would pass SHARD_BUDGET_SHARE of the interval), the domain layer over this fleet's
    domains, the decider's refresh in proportion to the nodes. Linear is a lower bound
    where a cost per series grows with the head (docs/benchmarks.md)."""
    unit = result["per_unit"]
    measured_shard = max(s["nodes"] for s in result["shards"])
    budget = SHARD_BUDGET_SHARE * bench.EVALUATION_INTERVAL_S * 1e3
    per_node = unit["node_layer_ms_per_30s_per_node"]
    shard_nodes = min(measured_shard, math.floor(budget / per_node)) if per_node else measured_shard
    fleet_domains = sum(bench.domains(bench.topology(nodes)).values())
    return {
        "nodes": nodes,
        "domains": fleet_domains,
        "shards": math.ceil(nodes / shard_nodes),
        "nodes_per_shard": shard_nodes,
        "node_layer_ms_per_30s_per_shard": per_node * shard_nodes,
        "shard_rss_mib": unit["shard_rss_mib_per_node"] * shard_nodes,
        "domain_layer_ms_per_30s": {
            engine: per_domain * fleet_domains
            for engine, per_domain in unit["domain_layer_ms_per_30s_per_domain"].items()
        },
        "global_head_series": unit["global_head_series_per_node"] * nodes,
        "global_rss_mib": {
            engine: per * nodes for engine, per in unit["global_rss_mib_per_node"].items()
        },
        "decider_whole_refresh_ms": {
            engine: per * nodes for engine, per in unit["decider_whole_refresh_ms_per_node"].items()
        },
        "decider_readings_refresh_ms": {
            engine: per * nodes
            for engine, per in unit["decider_readings_refresh_ms_per_node"].items()
        },
    }


# --- the report ------------------------------------------------------------------------------


def report(result: dict[str, Any]) -> str:
    m, settings = result["machine"], result["settings"]
    glob, unit = result["global"], result["per_unit"]
    lines = [
        f"machine: {m['cpu_model']}, {m['logical_cpus']} logical CPUs, {m['memory_gib']} GiB;"
        f" {m['prometheus']}; {m['vmalert']}",
        f"{settings['nodes']} nodes over {settings['shards']} shards; {result['domains']['total']}"
        f" domains; other processes {result['other_load_cores']:.2f} cores, the generator"
        f" {result['generator_cpu_cores']:.2f}, while measuring"
        f" {result['measured_window_s']:.0f} s",
        f"node layer: {', '.join(settings['node_layer'])}",
        f"domain layer: {', '.join(settings['domain_layer'])}",
        f"forwarded: {len(settings['forwarded'])} names",
        "",
        "shard  nodes  node layer ms per 30 s  head series  RSS MiB  cores  missed",
    ]
    for shard in result["shards"]:
        lines.append(
            f"{shard['shard']:>5}  {shard['nodes']:>5}  {shard['share_ms_per_30s']:>22.1f}"
            f"  {shard['head_series']:>11,.0f}  {shard['rss_mib']:>7.0f}"
            f"  {shard['cpu_cores']:>5.2f}"
            f"  {shard['missed_iterations']:>6.0f}"
        )
    lines.append("  per group (shard 0): median / max ms, floor ms, net / floor")
    for name, group in result["shards"][0]["groups"].items():
        floor = group.get("floor")
        lines.append(
            f"    {name} ({group['rules']} rules, every {group['interval_s']:g} s):"
            f" {group['duration_ms'].get('median', 0):.1f}"
            f" / {group['duration_ms'].get('max', 0):.1f}"
            + (
                f"; floor {floor['floor_ms']:.1f}, {floor['net_ratio']:.2f}x"
                if floor and floor["net_ratio"] is not None
                else ""
            )
        )
    prom, vm = glob["prometheus"], glob["victoriametrics_vmalert"]
    lines.append("")
    lines.append("domain layer on the global view, mean ms per evaluation: Prometheus / vmalert")
    for name, group in prom["groups"].items():
        vm_group = vm["groups"].get(name, {})
        floor = group.get("floor")
        lines.append(
            f"    {name}: {group['mean_ms'] or 0:.1f} / {vm_group.get('mean_ms') or 0:.1f}"
            + (
                f"; floor {floor['floor_ms']:.1f}, {floor['net_ratio']:.2f}x"
                if floor and floor["net_ratio"] is not None
                else ""
            )
        )
    lines += [
        f"  all groups, ms per 30 s: Prometheus {prom['mean_share_ms_per_30s']:.1f}"
        f" (median-based {prom['share_ms_per_30s']:.1f}),"
        f" vmalert {vm['mean_share_ms_per_30s']:.1f}",
        f"  CPU cores: Prometheus {prom['cpu_cores']:.2f}; VictoriaMetrics"
        f" {vm['cpu_cores']['victoria-metrics']:.2f} + vmalert {vm['cpu_cores']['vmalert']:.2f}",
        f"  RSS MiB: Prometheus {prom['rss_mib']:.0f} (peak {prom['peak_rss_mib']:.0f});"
        f" VictoriaMetrics {vm['rss_mib']['victoria-metrics']:.0f} + vmalert"
        f" {vm['rss_mib']['vmalert']:.0f}",
        f"  head series (Prometheus): {prom['head_series']:,.0f}; vmalert rules in error:"
        f" {len(vm['rules_in_error'])}",
        "",
        "the decider's refresh against the global view, ms median (max): whole / readings;"
        " its queries one after the other",
    ]
    for engine, figures in result["decider"].items():
        snap = figures["snapshot"]
        lines.append(
            f"  {engine}: {figures['whole_ms']['median']:.0f} ({figures['whole_ms']['max']:.0f})"
            f" / {figures['readings_ms']['median']:.0f} ({figures['readings_ms']['max']:.0f});"
            f" {figures['queries_ms_sum']:.0f}; snapshot {snap['nodes']} nodes,"
            f" {snap['domains']} domains, {snap['conditions']} conditions,"
            f" {snap['measured_watts']} measured; errors {snap['errors'] or 'none'}"
        )
        slow = sorted(figures["per_part"].items(), key=lambda kv: kv[1]["ms"], reverse=True)
        lines.append(
            "    " + ", ".join(f"{part} {p['ms']:.0f} ms ({p['series']})" for part, p in slow)
        )
    lines += [
        "",
        f"per node: node layer {unit['node_layer_ms_per_30s_per_node']:.3f} ms per 30 s,"
        f" shard RSS {unit['shard_rss_mib_per_node']:.2f} MiB; per domain: domain layer"
        f" {unit['domain_layer_ms_per_30s_per_domain']['prometheus']:.3f} ms per 30 s"
        f" (vmalert {unit['domain_layer_ms_per_30s_per_domain']['victoriametrics_vmalert']:.3f})",
    ]
    for site in result["extrapolation"]:
        lines.append(
            f"at {site['nodes']:,} nodes ({site['domains']:,} domains): {site['shards']} shards"
            f" of {site['nodes_per_shard']:,}, node layer"
            f" {site['node_layer_ms_per_30s_per_shard']:.0f}"
            f" ms per 30 s and {site['shard_rss_mib']:.0f} MiB each; domain layer"
            f" {site['domain_layer_ms_per_30s']['prometheus']:.0f} ms per 30 s in Prometheus,"
            f" {site['domain_layer_ms_per_30s']['victoriametrics_vmalert']:.0f} in vmalert;"
            f" global head {site['global_head_series']:,.0f} series; the decider's whole refresh"
            f" {site['decider_whole_refresh_ms']['prometheus']:.0f} /"
            f" {site['decider_whole_refresh_ms']['victoriametrics']:.0f} ms, readings"
            f" {site['decider_readings_refresh_ms']['prometheus']:.0f} /"
            f" {site['decider_readings_refresh_ms']['victoriametrics']:.0f} ms"
            " (Prometheus / VictoriaMetrics)"
        )
    if result["other_load_cores"] > bench.NOISY_LOAD_CORES:
        lines.append(
            f"warning: other processes used {result['other_load_cores']:.2f} CPUs while"
            " measuring: durations include that contention"
        )
    lines.append(f"total wall time: {result['wall_s']:.0f} s")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3000, help="nodes of 8 GPUs (default 3000)")
    parser.add_argument("--shards", type=int, default=3, help="Prometheus shards (default 3)")
    parser.add_argument(
        "--node-layer",
        action="append",
        type=LayerSpec.parse,
        required=True,
        help="a rule file or file:group evaluated in every shard (repeat for more)",
    )
    parser.add_argument(
        "--domain-layer",
        action="append",
        type=LayerSpec.parse,
        help="a rule file or file:group evaluated on the global view (repeat for more;"
        " default: every group of rules/ and alerts/ not in the node layer)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=390.0,
        help="seconds live before measuring (default 390, as rules_eval.py)",
    )
    parser.add_argument(
        "--evaluations", type=int, default=5, help="evaluations per group measured (default 5)"
    )
    parser.add_argument(
        "--refreshes", type=int, default=5, help="the decider's refreshes per view (default 5)"
    )
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between reads (default 5)")
    parser.add_argument(
        "--extrapolate",
        default="10000,50000",
        type=lambda text: sorted({int(n) for n in text.split(",") if n}),
        help="site sizes to work out from the per-node and per-domain costs (default 10000,50000)",
    )
    parser.add_argument("--no-energy", dest="energy", action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.nodes < 1 or not 1 <= args.shards <= args.nodes or args.evaluations < 1:
        parser.error("--nodes at least 1, --shards between 1 and --nodes, --evaluations >= 1")
    if args.refreshes < 1 or args.warmup < 0 or any(n < 1 for n in args.extrapolate):
        parser.error("--refreshes at least 1, --warmup at least 0, --extrapolate sizes >= 1")
    script = Path(__file__).resolve()
    shown = script.relative_to(bench.REPO) if script.is_relative_to(bench.REPO) else script
    args.command = " ".join(
        [".venv/bin/python", str(shown), *(sys.argv[1:] if argv is None else argv)]
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(report(result))
    print(f"\nwritten: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
