"""`llmgw-facility simulate --scenario FILE`: serve a simulated site until stopped.

Exit status: 0 stopped by SIGINT or SIGTERM; 2 a scenario that cannot be used (every
problem printed as `FILE:LINE: field: reason`), or a bad `--listen`; 3 the address cannot
be bound.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from llmgw_common.yamlfile import ConfigError
from llmgw_sim import scenario as scenario_file
from llmgw_sim.engine import Simulator
from llmgw_sim.server import SimulatorServer

EXIT_BAD_FILE = 2
EXIT_CANNOT_BIND = 3


def split_listen(listen: str) -> tuple[str, int]:
    """`host:port` (`:port` means 127.0.0.1; port 0 picks a free one)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen {listen!r} is not host:port (e.g. 127.0.0.1:0)")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def run(
    scenario_path: Path,
    *,
    listen: str = "127.0.0.1:0",
    targets_file: Path | None = None,
    decider_url: str | None = None,
) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    prog = "llmgw-facility simulate"
    try:
        host, port = split_listen(listen)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_BAD_FILE
    try:
        scenario = scenario_file.load(scenario_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_FILE
    from_decider = scenario.load.from_decider
    if from_decider is not None and from_decider.url is None and decider_url is None:
        print(
            f"{scenario_path}: load.from_decider has no url: give the decider's with --decider URL",
            file=sys.stderr,
        )
        return EXIT_BAD_FILE
    simulator = Simulator(scenario, now=time.time())
    try:
        server = SimulatorServer(
            simulator, host=host, port=port, targets_file=targets_file, decider_url=decider_url
        )
    except OSError as exc:
        print(f"{prog}: cannot listen on {listen}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_CANNOT_BIND
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with server:
        racks = sum(len(row) for row in scenario.row_racks.values())
        where = f", targets file {targets_file}" if targets_file is not None else ""
        print(
            f"serving {len(simulator.nodes)} nodes in {racks} racks on {server.url} "
            f"(time scale {scenario.time_scale:g}{where}); Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )
        stop.wait()
    return 0
