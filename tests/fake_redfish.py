"""A small Redfish service on loopback, serving tests/fixtures/redfish/ like a BMC would.

Real HTTP on 127.0.0.1 at a port picked at run time (HTTPS when given a server
`ssl.SSLContext`, the handshake done in each connection's own thread). It checks credentials
(session or basic), forgets its sessions on `restart()` (as a BMC does when it
reboots), can stop answering (`hang()`) or answer an error status (`fail()`), and
counts what it was asked.

It serves CEEMS' fixtures by default, or another tree (`mockup_documents`: DMTF's
mockup in tests/fixtures/redfish/public-rackmount1) with that tree's Sessions
collection: sushy-static, which serves the mockup in tests/test_redfish_sushy.py,
has no session service (any POST gets 204 without a token), so the session login
is tested here, against the mockup's own documents.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import ssl
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "redfish"

#: Where the fixture files are served, as their own `@odata.id` links say.
FIXTURE_PATHS = {
    "/redfish/v1/": "service_root.json",
    "/redfish/v1/Chassis": "chassis_collection.json",
    "/redfish/v1/Chassis/Chassis-1": "chassis_1.json",
    "/redfish/v1/Chassis/Chassis-1/Power": "chassis_1_power.json",
    "/redfish/v1/Chassis/Chassis-2": "chassis_2.json",
    "/redfish/v1/Chassis/Chassis-2/Power": "chassis_2_power.json",
}
SESSIONS = "/redfish/v1/Sessions"  # the fixture service root's Links.Sessions
USER, PASSWORD = "monitor", "s3cr3t-Pa55"


def fixture_documents() -> dict[str, dict[str, Any]]:
    return {path: json.loads((FIXTURES / name).read_text()) for path, name in FIXTURE_PATHS.items()}


def mockup_documents(root: Path) -> dict[str, dict[str, Any]]:
    """A DMTF mockup tree (DIR/…/index.json) as the paths it is served at, as sushy-static
    and DMTF's Redfish-Mockup-Server serve it: DIR/index.json at /redfish/v1/, DIR/X/index.json
    at /redfish/v1/X."""
    documents = {}
    for index in root.rglob("index.json"):
        relative = index.parent.relative_to(root).as_posix()
        path = "/redfish/v1/" if relative == "." else f"/redfish/v1/{relative}"
        documents[path] = json.loads(index.read_text())
    return documents


class FakeRedfish:
    def __init__(
        self,
        auth: str = "session",
        tls: ssl.SSLContext | None = None,
        documents: dict[str, dict[str, Any]] | None = None,
        sessions: str = SESSIONS,
    ) -> None:
        self.auth = auth
        self.tls = tls
        self.documents = fixture_documents() if documents is None else documents
        self.sessions = sessions  # where logins are POSTed: the service root's Links.Sessions
        self.errors: dict[str, int] = {}  # path -> the status a GET of it is answered with
        self.tokens: set[str] = set()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.deleted: list[str] = []
        self.release = threading.Event()  # set: a hung service answers again
        self.release.set()
        self.stopped = False
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        # A client that gave up on a hung request leaves a broken pipe: not a test failure.
        self.server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeRedfish:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop answering: new connections are refused, kept-alive ones are dropped."""
        if self.stopped:
            return
        self.stopped = True
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def restart(self) -> None:
        """The BMC rebooted: every session it handed out is gone."""
        with self.lock:
            self.tokens.clear()

    def hang(self) -> None:
        """Accept connections but answer nothing until `release` is set."""
        self.release.clear()

    def set(self, path: str, document: dict[str, Any]) -> None:
        with self.lock:
            self.documents[path] = copy.deepcopy(document)

    def fail(self, path: str, status: int) -> None:
        """Answer GET `path` with `status` (and a Redfish error body) from now on."""
        with self.lock:
            self.errors[path] = status

    def logins(self) -> int:
        return self.requests[("POST", self.sessions)]

    def _authorized(self, headers: Any) -> bool:
        if self.auth == "none":
            return True
        if self.auth == "session":
            with self.lock:
                return headers.get("X-Auth-Token") in self.tokens
        expected = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        return headers.get("Authorization") == f"Basic {expected}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        bmc = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else each answer waits on a delayed ACK

            def log_message(self, format: str, *args: object) -> None:
                pass

            def setup(self) -> None:
                if bmc.tls is not None:
                    # A client that refuses our certificate fails this handshake:
                    # the connection ends here, silently (handle_error above).
                    self.request.settimeout(10)  # for the handshake only
                    self.request = bmc.tls.wrap_socket(self.request, server_side=True)
                    self.request.settimeout(None)
                super().setup()

            def finish(self) -> None:
                super().finish()
                if isinstance(self.request, ssl.SSLSocket):
                    # socketserver closes the socket it accepted, which the TLS one replaced.
                    self.request.close()

            def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None):
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def handle_one_request(self) -> None:
                super().handle_one_request()
                if bmc.stopped:
                    self.close_connection = True

            def parse_request(self) -> bool:
                if bmc.stopped:  # a kept-alive connection: hang up without an answer
                    self.close_connection = True
                    return False
                return super().parse_request()

            def _path(self) -> str:
                path = self.path.split("?")[0]
                return "/redfish/v1/" if path in ("/redfish/v1", "/redfish") else path

            def do_GET(self) -> None:
                path = self._path()
                bmc.requests[("GET", path)] += 1
                bmc.release.wait()
                if path != "/redfish/v1/" and not bmc._authorized(self.headers):
                    return self._send(401, {"error": {"code": "Base.1.0.NoValidSession"}})
                with bmc.lock:
                    document = copy.deepcopy(bmc.documents.get(path))
                    error = bmc.errors.get(path)
                if error is not None:
                    return self._send(error, {"error": {"code": "Base.1.0.InternalError"}})
                if document is None:
                    return self._send(404, {"error": {"code": "Base.1.0.ResourceMissingAtURI"}})
                return self._send(200, document)

            def do_POST(self) -> None:
                path = self._path()
                bmc.requests[("POST", path)] += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if path != bmc.sessions or bmc.auth != "session":
                    return self._send(405)
                if body.get("UserName") != USER or body.get("Password") != PASSWORD:
                    return self._send(401, {"error": {"code": "Base.1.0.NoValidSession"}})
                token = secrets.token_hex(16)
                with bmc.lock:
                    bmc.tokens.add(token)
                return self._send(
                    201,
                    {"Id": token[:8], "UserName": USER},
                    {"X-Auth-Token": token, "Location": f"{bmc.sessions}/{token[:8]}"},
                )

            def do_DELETE(self) -> None:
                path = self._path()
                bmc.requests[("DELETE", path)] += 1
                bmc.deleted.append(path)
                self._send(204 if bmc._authorized(self.headers) else 401)

        return Handler
