"""The exporter's HTTP server binds without asking DNS (exporter.web._ThreadingServer):
http.server's own bind looks the address's full name up (`socket.getfqdn`), which can hold
a node's exporter at start while its resolver does not answer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable

import pytest
import requests

from exporter.web import serve


def echo_server_name(
    environ: dict[str, object], start_response: Callable[..., object]
) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(environ["SERVER_NAME"]).encode()]


def test_binding_asks_no_resolver_and_names_the_server_by_its_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def resolver_that_hangs(name: str = "") -> str:
        asked.append(name)
        raise AssertionError(f"getfqdn({name!r}): the bind waited on DNS")

    monkeypatch.setattr(socket, "getfqdn", resolver_that_hangs)
    server = serve("127.0.0.1", 0, echo_server_name)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        answer = requests.get(f"http://127.0.0.1:{server.server_port}/", timeout=5)
        assert answer.status_code == 200 and answer.text == "127.0.0.1"
        assert asked == []
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
