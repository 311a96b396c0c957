"""`llmgw-decider --config decider.yaml`: the placement sidecar of DESIGN.md §5 (docs/decider.md).

Both files are validated before anything starts (every problem with its file and line, exit
2). SIGHUP and `POST /-/reload` re-read them; a bad file leaves the running config in place.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType

import uvicorn

from decider.api import create_app
from decider.api.http_server import MAX_HEADER_BYTES, HeaderLimitedH11Protocol
from decider.config import split_listen
from decider.placement import entry_index
from decider.service import Service, load_all
from decider.store import StoreError
from llmgw_common.yamlfile import ConfigError

log = logging.getLogger("llmgw-decider")

EXIT_BAD_CONFIG = 2


class _Server(uvicorn.Server):
    """uvicorn, stopping the decider's threads and closing its database once it has stopped
    serving. On SIGTERM or SIGINT uvicorn shuts down gracefully, then raises the signal again
    into the handler it found (`main`'s `on_stop`, which makes the exit a clean 0)."""

    def __init__(self, service: Service, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        self.service.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmgw-decider", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, metavar="DECIDER_YAML")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        loaded = load_all(args.config)
        service = Service(args.config, loaded)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_CONFIG
    except StoreError as exc:
        print(f"llmgw-decider: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    host, port = split_listen(loaded.config.listen)
    server = _Server(
        service,
        uvicorn.Config(
            create_app(service),
            host=host,
            port=port,
            log_level=args.log_level,
            access_log=False,
            lifespan="off",
            # A head past MAX_HEADER_BYTES gets 431 (decider.api.http_server).
            http=HeaderLimitedH11Protocol,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        ),
    )

    def on_hangup(_signum: int, _frame: FrameType | None) -> None:
        # Not here: the handler runs on the main thread, which serves every request, and a
        # reload waits for a refresh in flight (as long as Prometheus' timeout × attempts).
        threading.Thread(target=service.reload, name="reload", daemon=True).start()

    def on_stop(_signum: int, _frame: FrameType | None) -> None:
        # Before uvicorn serves (its own handlers not yet in place): stop as soon as it has
        # started. After its graceful shutdown it raises the signal again into this handler,
        # whose default would end the process by the signal (status -15), not with 0.
        server.should_exit = True

    signal.signal(signal.SIGHUP, on_hangup)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    if not entry_index.COMPILED:
        log.warning(
            "the placement loop in C (decider/placement/_entry_index.c) is not built: "
            "placements join their candidates in Python, taking up to twice as long; install the "
            "package where a C compiler and Python's headers are (Debian: gcc, python3-dev)"
        )
    service.start()
    log.info(
        "serving on http://%s:%d (mode %s, facility %s, Prometheus %s)",
        host,
        port,
        loaded.facility.mode,
        loaded.config.facility,
        loaded.config.prometheus.url,
    )
    try:
        server.run()
    finally:
        service.stop()
    # End here, output flushed, rather than return to the interpreter's exit: that waits for
    # every thread of a ThreadPoolExecutor, and a query to Prometheus cancelled by the
    # shutdown (or one a refresh started meanwhile) may be inside its call for as long as
    # its timeout. Everything to keep is closed: the database above, in `service.stop`.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if server.started else 1)


if __name__ == "__main__":
    sys.exit(main())
