"""`llmgw-exporter`: poll this node's sensors and serve them to Prometheus."""

from __future__ import annotations

import argparse
import ctypes
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from exporter import config as agent_config
from exporter.collector import ExporterCollector
from exporter.nvml import Nvml
from exporter.poller import SourceRunner
from exporter.sources import SOURCES
from exporter.web import make_app, serve, status_page
from llmgw_common.yamlfile import ConfigError

if TYPE_CHECKING:
    from exporter.capping import CappingAgent

log = logging.getLogger("llmgw-exporter")

#: glibc's `mallopt` parameter for how many malloc arenas the process may have (malloc.h).
_M_ARENA_MAX = -8
#: The process's malloc arenas. glibc's default, eight per core, gives each thread that
#: contends its own arena, each keeping what was freed in it; the exporter's threads (a
#: poller and a poll per source, one per request) allocate little, and the GIL runs one at
#: a time. Two arenas: 0.3 MiB less resident (docs/benchmarks.md, "Where the memory goes").
MALLOC_ARENAS = 2


def glibc() -> ctypes.CDLL | None:
    """The C library, where it is glibc (it has `mallopt` and `malloc_trim`); else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None  # musl, macOS: their allocators return memory on their own terms
    return libc


def cap_malloc_arenas(libc: ctypes.CDLL) -> None:
    """At most MALLOC_ARENAS arenas; called before the first thread starts."""
    libc.mallopt(_M_ARENA_MAX, MALLOC_ARENAS)


def release_freed_heap(libc: ctypes.CDLL) -> None:
    """Hand the heap freed since start back to the system.

    Compiling modules without cached bytecode, reading agent.yaml and building the config
    models' validators leave freed memory inside the heap, which glibc keeps mapped: 0.6
    MiB of resident memory that nothing uses again.
    """
    libc.malloc_trim(ctypes.c_size_t(0))


def nvml_library(config: agent_config.AgentConfig) -> str | None:
    """The NVML library to load: a process has one, the first `library` set among the
    enabled sources that read NVML (gpu, then units); another one set apart is said, unused."""
    libraries = [
        library
        for name, cls in SOURCES.items()
        if cls.reads_nvml
        and config.source(name).enabled
        and (library := getattr(config.source(name), "library", None))
    ]
    for other in libraries[1:]:
        if other != libraries[0]:
            log.warning(
                "NVML library %s not loaded: the process has one NVML library, %s",
                other,
                libraries[0],
            )
    return libraries[0] if libraries else None


def build_runners(
    config: agent_config.AgentConfig, sysfs: Path, nvml: Nvml | None = None
) -> list[SourceRunner]:
    """A runner per enabled source; those that read NVML share one `Nvml`."""
    nvml = nvml or Nvml(nvml_library(config))
    runners = []
    for name, cls in SOURCES.items():
        source_config = config.source(name)
        if not source_config.enabled:
            continue
        source = (
            cls(sysfs, source_config, nvml=nvml) if cls.reads_nvml else cls(sysfs, source_config)
        )
        runners.append(SourceRunner(source, config.interval(name)))
    return runners


def build_registry(
    config: agent_config.AgentConfig,
    runners: list[SourceRunner],
    agent: CappingAgent | None = None,
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    extra = [] if agent is None else [agent.samples]
    registry.register(ExporterCollector(config, runners, extra))
    return registry


def wait_settled(runners: list[SourceRunner], timeout: float) -> list[str]:
    """Block until every source has a complete reading; return those that have none."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(runner.state.settled for runner in runners):
            return []
        time.sleep(0.05)
    return [runner.name for runner in runners if not runner.state.settled]


def stop_all(stop: threading.Event, runners: list[SourceRunner]) -> None:
    """Stop polling, let a poll in flight finish, then release what each source holds."""
    stop.set()
    for runner in runners:
        runner.join(timeout=10)
        if runner.in_flight:
            # Releasing a library (nvmlShutdown) under a call still inside it could crash
            # the process on its way out; the process is ending anyway.
            log.warning(
                "source %s not closed: a poll is still running in it (or stuck past its deadline)",
                runner.name,
            )
            continue
        runner.source.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llmgw-exporter", description=__doc__)
    parser.add_argument("--config", type=Path, help="agent.yaml (default: built-in defaults)")
    parser.add_argument(
        "--sysfs",
        type=Path,
        default=Path("/sys"),
        help="root of sysfs, for containers and tests (default: /sys)",
    )
    parser.add_argument("--listen", help="HOST:PORT to serve on (default: agent.yaml's listen)")
    parser.add_argument(
        "--once",
        action="store_true",
        help="print one exposition once every source has a reading, and exit",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    libc = glibc()
    if libc is not None:
        cap_malloc_arenas(libc)
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = agent_config.load(args.config)
        if args.listen:
            config = agent_config.AgentConfig.model_validate(
                {**config.model_dump(by_alias=True), "listen": args.listen}
            )
    except ConfigError as exc:
        print(f"llmgw-exporter: refusing the configuration:\n{exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"llmgw-exporter: --listen: {exc}", file=sys.stderr)
        return 2

    nvml = Nvml(nvml_library(config))
    runners = build_runners(config, args.sysfs, nvml)
    agent = None
    if config.capping.enabled and not args.once:
        # Imported only where a node turns capping on (the exporter's memory target).
        from exporter.capping import CappingAgent

        agent = CappingAgent(config.capping, config.node, nvml)
    registry = build_registry(config, runners, agent)
    stop = threading.Event()
    for runner in runners:
        runner.start(stop)
    if agent is not None:
        agent.start(stop)

    if args.once:
        timeout = 10 + 3 * max((runner.interval for runner in runners), default=0)
        missing = wait_settled(runners, timeout)
        if missing:
            log.warning("printing without a complete reading from: %s", ", ".join(missing))
        sys.stdout.write(generate_latest(registry).decode())
        stop_all(stop, runners)
        return 0

    registry.register(ProcessCollector(registry=None))
    disabled = [name for name in SOURCES if not config.source(name).enabled]
    probes = None
    if config.bmcs:
        # Imported only where agent.yaml lists BMCs to read on request.
        from exporter.bmc_probe import PATH, BmcProbes

        probes = BmcProbes(config.bmcs, args.sysfs)
        log.info("reading %d BMCs when probed: %s?target=NODE", len(config.bmcs), PATH)
    routes = {} if probes is None else {PATH: probes.app}
    app = make_app(registry, lambda: status_page(config, runners, disabled), routes)
    host, port = config.listen_address
    try:
        server = serve(host, port, app)
    except OSError as exc:
        print(f"llmgw-exporter: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        stop.set()
        if agent is not None:
            agent.close()
        return 1

    def shutdown(signum: int, frame: FrameType | None) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    def no_reload(signum: int, frame: FrameType | None) -> None:
        log.warning("SIGHUP ignored: the exporter has no reload; restart it to apply agent.yaml")

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGHUP, no_reload)
    log.info(
        "serving %s on http://%s:%d/metrics (sources: %s)",
        config.node,
        host,
        server.server_port,
        ", ".join(runner.name for runner in runners) or "none",
    )
    if libc is not None:
        release_freed_heap(libc)
    server.serve_forever()
    stop_all(stop, runners)
    if probes is not None:
        probes.close()
    if agent is not None:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
