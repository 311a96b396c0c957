"""`llmgw-facility demo [--once]`: the whole system on one machine, telling its story.

It starts, on loopback ports it picks and with its files in a temporary directory:

- the simulated site of examples/scenarios/demo.yaml, in this process
  (llmgw_sim), its nodes' load following the decider's reservations;
- a real Prometheus with the committed rules and alerts (and the site rules rendered
  from examples/scenarios/demo-facility.yaml), every duration divided by the scenario's
  `time_scale` (llmgw_sim.demo.scale; `promtool check rules` checks the copy);
- a real Alertmanager;
- the decider (`python -m decider.main`), in enforce mode, its own durations scaled too.

Then it tells the story (llmgw_sim.demo.story), prints the URLs and stays up until Ctrl-C.
`--once` stops after the story instead: exit 0 when every step happened in time.

Exit status: 0 done; 1 a step of the story did not happen; 2 a binary is missing, or a
file of the demo is refused; 3 a server did not start; 130 interrupted.
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import TextIO

from decider import facility as facility_file
from decider import rules_render
from decider.promql import format_duration
from llmgw_common.yamlfile import ConfigError
from llmgw_sim import scenario as scenario_file
from llmgw_sim.demo import stack
from llmgw_sim.demo.scale import scale_duration, scale_rules
from llmgw_sim.demo.story import Cast, Story, StoryFailed
from llmgw_sim.engine import Simulator
from llmgw_sim.server import SimulatorServer

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "examples" / "scenarios" / "demo.yaml"
FACILITY = REPO / "examples" / "scenarios" / "demo-facility.yaml"
MODEL = "llama-70b"
PROFILE = "llama-70b-tp4"

EXIT_STORY = 1
EXIT_SETUP = 2
EXIT_START = 3
EXIT_INTERRUPTED = 130


class _Stop(Exception):
    """SIGTERM or SIGHUP: stop like Ctrl-C, tearing every server down."""


def rule_sources(repo: Path = REPO) -> list[Path]:
    """The committed rule and alert files, in a stable order."""
    return sorted((repo / "rules").glob("*.yml")) + sorted((repo / "alerts").glob("*.yml"))


def write_scaled_rules(
    directory: Path, factor: float, facility: facility_file.Facility, *, repo: Path = REPO
) -> list[Path]:
    """Copies of the committed rules and alerts, and the site rules rendered from the
    facility file, every duration divided by `factor`; checked with promtool."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for source in rule_sources(repo):
        target = directory / f"{source.parent.name}-{source.name}"
        target.write_text(
            scale_rules(source.read_text(), factor, source=str(source.relative_to(repo)))
        )
        written.append(target)
    site = directory / "site-llmgw-site.yml"
    site.write_text(
        scale_rules(
            rules_render.render(facility, source="demo-facility.yaml"), factor, source="site"
        )
    )
    written.append(site)
    check = subprocess.run(
        ["promtool", "check", "rules", *map(str, written)],
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        raise stack.DemoError(f"promtool refuses the scaled rules:\n{check.stdout}{check.stderr}")
    return written


def run(once: bool, out: TextIO = sys.stdout) -> int:
    missing = stack.missing_binaries()
    if missing:
        packages = " ".join(sorted(set(missing.values())))
        print(
            f"llmgw-facility demo: {', '.join(sorted(missing))} not found; install the Debian "
            f"package(s): sudo apt-get install {packages}  (or: make debian-packages)",
            file=sys.stderr,
        )
        return EXIT_SETUP
    try:
        scenario = scenario_file.load(SCENARIO)
        facility = facility_file.load(FACILITY)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_SETUP

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stop

    # SIGINT too, explicitly: a process started in the background of a script inherits
    # SIGINT ignored, and Python then never turns Ctrl-C into KeyboardInterrupt.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-demo-"))
    code = EXIT_INTERRUPTED
    try:
        code = _run(workdir, scenario, facility, once=once, out=out)
    except (KeyboardInterrupt, _Stop):
        print("\nstopped; every server is down", file=out, flush=True)
    finally:
        if code == EXIT_STORY:
            print(f"the servers' logs are in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return code


def _run(
    workdir: Path,
    scenario: scenario_file.Scenario,
    facility: facility_file.Facility,
    *,
    once: bool,
    out: TextIO,
) -> int:
    factor = scenario.time_scale
    started = time.monotonic()
    print(
        f"llmgw-facility demo: a simulated site of {len(scenario.nodes)} nodes; time runs "
        f"{factor:g}x faster (1 s here is {format_duration(factor)} there), and every hold "
        "time of the rules with it",
        file=out,
        flush=True,
    )
    with ExitStack() as services:
        simulator_log = logging.getLogger("llmgw.simulate")
        handler = logging.FileHandler(workdir / "simulator.log")
        simulator_log.addHandler(handler)
        simulator_log.propagate = False  # the terminal is the story's
        services.callback(handler.close)
        services.callback(simulator_log.removeHandler, handler)
        try:
            rules = write_scaled_rules(workdir / "rules", factor, facility)
            simulator = Simulator(scenario, now=time.time(), start_timeline=False)
            server = SimulatorServer(simulator, targets_file=workdir / "targets" / "nodes.json")
            services.enter_context(server)
            alertmanager = stack.start_alertmanager(workdir / "alertmanager")
            services.callback(alertmanager.stop)
            decider_targets = workdir / "targets" / "decider.json"
            decider_targets.write_text("[]\n")
            interval = scale_duration("30s", factor)
            prometheus = stack.start_prometheus(
                workdir / "prometheus",
                rule_files=rules,
                scrape_configs=[
                    {
                        "job_name": "llmgw-exporter",
                        "file_sd_configs": [{"files": [str(workdir / "targets" / "nodes.json")]}],
                    },
                    {
                        "job_name": "facility",
                        "metrics_path": "/site/metrics",
                        "static_configs": [
                            {"targets": [server.address], "labels": {"instance": "site"}}
                        ],
                    },
                    {
                        "job_name": "llmgw-decider",
                        "file_sd_configs": [{"files": [str(decider_targets)]}],
                    },
                ],
                alertmanager=alertmanager.url.removeprefix("http://"),
                interval=interval,
                lookback=scale_duration("5m", factor),
            )
            services.callback(prometheus.stop)
            token = secrets.token_hex(16)
            decider_dir = workdir / "decider"
            decider_dir.mkdir()
            (decider_dir / "decider.token").write_text(token + "\n")
            (decider_dir / "decider.token").chmod(0o600)  # the decider warns otherwise
            (decider_dir / "facility.yaml").write_text(FACILITY.read_text())
            decider = stack.start_decider(
                decider_dir,
                {
                    "prometheus": {"url": prometheus.url, "timeout": "2s", "retries": 1},
                    "facility": "facility.yaml",
                    "database": "decider.db",
                    "token_file": "decider.token",
                    "refresh_interval": scale_duration("15s", factor),
                    "reservation_ttl": scale_duration("5m", factor),
                    "staleness": {
                        "readings": scale_duration("2m", factor),
                        "inventory": scale_duration("1h", factor),
                    },
                },
            )
            services.callback(decider.stop)
            decider_targets.write_text(
                json.dumps([{"targets": [decider.url.removeprefix("http://")]}]) + "\n"
            )
            server.set_decider_url(decider.url)
            services.callback(server.set_decider_url, None)  # before the decider stops
        except stack.DemoError as exc:
            print(f"llmgw-facility demo: {exc}", file=sys.stderr)
            return EXIT_START
        urls = {
            "the decider's page": decider.url + "/",
            "Prometheus": prometheus.url,
            "Alertmanager": alertmanager.url,
            "the simulated site": server.url + "/",
        }
        for name, url in (
            ("simulator", server.url),
            ("Alertmanager", alertmanager.url),
            ("Prometheus", prometheus.url),
            ("decider", decider.url),
        ):
            print(f"{'':9} {name:13} {url}", file=out)
        cast = Cast(
            simulator=simulator,
            decider=decider.url,
            token=token,
            prometheus=prometheus.url,
            alertmanager=alertmanager.url,
            model=MODEL,
            profile=PROFILE,
            gpus=facility.profiles[PROFILE].gpus,
            time_scale=factor,
            out=out,
            started=started,
        )
        try:
            Story(cast).run()
        except StoryFailed as exc:
            print(f"\nllmgw-facility demo: the story stopped: {exc}", file=sys.stderr)
            return EXIT_STORY
        print(file=out)
        print(f"[{time.monotonic() - started:6.1f}s] the story is told. Have a look:", file=out)
        for name, url in urls.items():
            print(f"{'':9} {name:19} {url}", file=out)
        if once:
            print(f"{'':9} (--once: stopping everything)", file=out, flush=True)
            return 0
        print(f"{'':9} Ctrl-C stops everything.", file=out, flush=True)
        threading.Event().wait()
    return 0  # pragma: no cover - the wait above ends by an exception
