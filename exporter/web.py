"""The exporter's HTTP side: `/metrics` for Prometheus, `/` for a person."""

from __future__ import annotations

import html
import socket
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from exporter.config import AgentConfig
from exporter.poller import SourceRunner

StartResponse = Callable[..., object]
Environ = dict[str, object]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Scrapes every few seconds would flood the log; errors still reach stderr."""


def status_page(
    config: AgentConfig, runners: Iterable[SourceRunner], disabled: Iterable[str]
) -> str:
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
            f"<tr><td>{runner.name}</td><td>{runner.interval:g}s</td>"
            f"<td>{html.escape(status)}</td><td>{len(state.samples)}</td><td>{age}</td></tr>"
        )
    rows += [
        f"<tr><td>{name}</td><td></td><td>disabled in agent.yaml</td><td>0</td><td></td></tr>"
        for name in disabled
    ]
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
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>llmgw exporter: {html.escape(config.node)}</title></head><body>"
        f"<h1>llmgw exporter on {html.escape(config.node)}</h1>"
        f"<p>Location: {html.escape(place) or 'none declared (a rack of one)'}; "
        f"feeds: {html.escape(', '.join(labels.pdus)) or 'none declared'}.</p>"
        "<table border='1' cellpadding='4'><tr><th>source</th><th>interval</th>"
        "<th>status</th><th>series</th><th>last success</th></tr>"
        + "".join(rows)
        + "</table><p><a href='/metrics'>/metrics</a></p></body></html>"
    )


def make_app(
    registry: CollectorRegistry, page: Callable[[], str]
) -> Callable[..., Iterable[bytes]]:
    metrics_app = make_wsgi_app(registry)

    def app(environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics_app(environ, start_response)  # type: ignore[arg-type]
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
