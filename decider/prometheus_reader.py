"""The decider's HTTP reader of Prometheus: instant queries against one Prometheus-compatible
URL, each ended by a total deadline, every failure one QueryError whose message says what
went wrong and never carries a credential.

- **A total deadline per query.** `budget_s` (every attempt, retry and backoff) bounds the
  whole query: connecting, the TLS handshake, the headers and the body. A read timeout alone
  does not: a server that answers 200 and then trickles a byte a second never trips it, and
  the thread reading it would never end (issue 16, item 9). Past the deadline a watchdog
  thread shuts the query's socket down, which wakes the blocked read at once; the query
  raises QueryError and its connection is closed. So no query outlives its budget by more
  than a moment, and threads and sockets stay flat against any server.
- **Connections kept alive** between queries (standard library http.client, gzip as
  Prometheus offers it); one cut at its deadline or left half read is closed, never reused.
- **Retries**, at most `retries`, on a connection error, a timeout or a 5xx, after a short
  backoff; a `Retry-After` is not honoured (a 503 asking for an hour must not stall the
  refresher). A 4xx is not retried: the query itself is wrong.
- **Credentials from files only** (decider.yaml `prometheus.basic_auth.password_file`,
  `prometheus.authorization.credentials_file`), read at every query so that a rotated file
  counts from the next one, as Prometheus does; `tls_config` for a private CA, a client
  certificate or `insecure_skip_verify`. A URL with a user and password in it is refused:
  what the reader shows of its URL (`url`) has none, and every error message is scrubbed of
  the secrets it read, in case a server echoes them back.
"""

from __future__ import annotations

import base64
import heapq
import http.client
import itertools
import json
import math
import queue
import socket
import ssl
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlencode, urlparse

from decider.config import (
    AuthorizationSettings,
    BasicAuthSettings,
    PrometheusSettings,
    TLSSettings,
    credentials_in_url,
)

#: Retry backoff: the first retry is immediate, then 0.2 s, 0.4 s, at most 0.5 s.
BACKOFF_FACTOR_S = 0.1
BACKOFF_MAX_S = 0.5
RETRY_ON_STATUS = (500, 502, 503, 504)
#: The most one read takes from the socket.
CHUNK_BYTES = 65536
#: The most of an error body a message quotes.
MAX_BODY_QUOTE = 120
#: What stands for a secret in a message.
REDACTED = "[redacted]"


class QueryError(Exception):
    """A query got no usable answer; the message says what went wrong, on one line."""


class _PastDeadline(Exception):
    """The query's total deadline passed; its socket was shut down."""


class _Watchdog:
    """One daemon thread that shuts down the socket of every query past its deadline.

    `watch` registers a socket's file descriptor until `unwatch`; the cut and `unwatch` take
    one lock, so a descriptor is never touched once its owner has moved on and may close it
    (a descriptor number can be reused by the next socket opened).
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._watched: dict[int, tuple[int, threading.Event]] = {}
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float, fd: int, cut: threading.Event) -> int:
        with self._lock:
            token = next(self._tokens)
            self._watched[token] = (fd, cut)
            heapq.heappush(self._heap, (deadline, token))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="prometheus-deadlines", daemon=True
                )
                self._thread.start()
            self._lock.notify()
        return token

    def unwatch(self, token: int) -> None:
        with self._lock:
            self._watched.pop(token, None)

    def _run(self) -> None:
        with self._lock:
            while True:
                while self._heap and self._heap[0][1] not in self._watched:
                    heapq.heappop(self._heap)  # finished in time
                if not self._heap:
                    self._lock.wait()
                    continue
                deadline, token = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                heapq.heappop(self._heap)
                fd, cut = self._watched.pop(token)
                cut.set()
                _shut_down(fd)


def _shut_down(fd: int) -> None:
    """Shut the socket behind `fd` down both ways: a read blocked on it returns at once.
    Through a duplicate, so the owner's descriptor stays its own to close."""
    try:
        with socket.socket(fileno=socket.dup(fd)) as duplicate:
            duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or reset: nothing left to wake


_WATCHDOG = _Watchdog()


class _Connection(http.client.HTTPConnection):
    """A connection whose socket the watchdog watches while a query uses it (`arm`), and
    which speaks TLS itself, so that the handshake is under the deadline too."""

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None) -> None:
        super().__init__(host, port, timeout=timeout)
        self.default_port = 443 if tls is not None else 80  # the Host header omits it then
        self._tls = tls
        self._deadline = math.inf
        self.cut = threading.Event()
        self._token: int | None = None

    def arm(self, deadline: float) -> None:
        """Watch the socket (once connected) until `disarm`: past `deadline` it is cut."""
        self._deadline = deadline
        if self.sock is not None:
            self._token = _WATCHDOG.watch(deadline, self.sock.fileno(), self.cut)

    def disarm(self) -> None:
        if self._token is not None:
            _WATCHDOG.unwatch(self._token)  # before the descriptor can be closed and reused
            self._token = None

    def connect(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise _PastDeadline
        sock = socket.create_connection((self.host, self.port), min(self.timeout, left))
        self.sock = sock
        self.arm(self._deadline)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)

    def close(self) -> None:
        self.disarm()
        super().close()


class PrometheusReader:
    """Runs instant queries against one Prometheus-compatible URL, bounded in time.

    Thread-safe: each query has its own connection. `url` is the URL without credentials,
    fit to show anywhere.
    """

    def __init__(
        self,
        url: str,
        timeout: float,
        retries: int,
        *,
        basic_auth: BasicAuthSettings | None = None,
        authorization: AuthorizationSettings | None = None,
        tls_config: TLSSettings | None = None,
    ) -> None:
        if credentials_in_url(url):
            raise ValueError(
                "the Prometheus URL carries credentials: name a password file in "
                "prometheus.basic_auth.password_file instead"
            )
        self.url = url.rstrip("/")
        parsed = urlparse(self.url)
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname or ""
        self._port = parsed.port or (443 if self._https else 80)
        self._path = parsed.path.rstrip("/") + "/api/v1/query"
        self.timeout = timeout
        self.retries = retries
        self._basic_auth = basic_auth
        self._authorization = authorization
        self._tls_config = tls_config
        self._tls: ssl.SSLContext | None = None
        self._secrets: frozenset[str] = frozenset()
        self._secrets_lock = threading.Lock()
        self._idle: queue.SimpleQueue[_Connection] = queue.SimpleQueue()
        self._closed = False
        # A reader dropped without close() (a reload's, a test's) still closes its sockets.
        weakref.finalize(self, _close_idle, self._idle)

    @classmethod
    def from_settings(cls, settings: PrometheusSettings) -> PrometheusReader:
        return cls(
            settings.url,
            settings.timeout,
            settings.retries,
            basic_auth=settings.basic_auth,
            authorization=settings.authorization,
            tls_config=settings.tls_config,
        )

    @property
    def budget_s(self) -> float:
        """The longest one query takes, retries and backoff included: its total deadline.

        An attempt may take a connect and a read timeout; past this the query is ended
        (its socket shut down) even if its answer is still trickling in.
        """
        backoff = sum(
            min(BACKOFF_MAX_S, BACKOFF_FACTOR_S * 2 ** (attempt - 1))
            for attempt in range(2, self.retries + 1)
        )
        return (self.retries + 1) * 2 * self.timeout + backoff + 0.5

    def query(self, promql: str) -> list[Any]:
        """The query's `data.result`, unchecked; raises QueryError on any failure."""
        deadline = time.monotonic() + self.budget_s
        try:
            body = self._get(promql, deadline)
            return _result(body, self._scrub)
        except QueryError as exc:
            raise QueryError(self._scrub(str(exc))) from None
        except Exception as exc:  # any failure of the server or of this code is one outcome
            raise QueryError(self._scrub(f"{type(exc).__name__}: {exc}")) from None

    def close(self) -> None:
        """Close every idle connection; one in use is closed when its query ends. A query
        asked later still works, on a connection closed at its end."""
        self._closed = True
        _close_idle(self._idle)

    # --- one query --------------------------------------------------------------------------

    def _get(self, promql: str, deadline: float) -> bytes:
        """The body of a 200 answer, after at most `retries` retries; raises QueryError."""
        attempts = self.retries + 1
        shown = f"{attempts} attempt{'s' if attempts > 1 else ''}"
        last = ""
        for attempt in range(1, attempts + 1):
            if attempt > 2:
                time.sleep(min(BACKOFF_MAX_S, BACKOFF_FACTOR_S * 2 ** (attempt - 2)))
            if time.monotonic() >= deadline:
                break
            try:
                status, body = self._attempt(promql, deadline)
            except _PastDeadline:
                break
            except TimeoutError:
                last = f"no answer from {self.url} within {self.timeout:g}s, {shown}"
                continue
            except (OSError, http.client.HTTPException) as exc:
                last = f"cannot reach {self.url} ({shown}): {_reason(exc)}"
                continue
            if status == 200:
                return body
            if status in RETRY_ON_STATUS:
                quoted = self._quote(body)
                last = f"HTTP error from {self.url} on all {shown} (HTTP {status}{quoted})"
                continue
            raise QueryError(f"{self.url} answered HTTP {status}{self._quote(body)}")
        if time.monotonic() >= deadline or not last:
            raise QueryError(
                f"no complete answer from {self.url} within {self.budget_s:g}s, the query's "
                "deadline: its connection was closed"
            )
        raise QueryError(last)

    def _attempt(self, promql: str, deadline: float) -> tuple[int, bytes]:
        """(status, body) of one request; raises _PastDeadline when the watchdog cut it.

        A connection kept alive from an earlier query is used first; one the server has
        closed since fails before any answer and is replaced by a new one, as urllib3 does.
        """
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip"}
        if (authorization := self._authorization_header()) is not None:
            headers["Authorization"] = authorization
        target = f"{self._path}?{urlencode({'query': promql})}"
        while True:
            try:
                connection, reused = self._idle.get_nowait(), True
            except queue.Empty:
                tls = self._tls_context()
                connection, reused = _Connection(self._host, self._port, self.timeout, tls), False
            connection.arm(deadline)
            try:
                status, body, keep = self._exchange(connection, target, headers)
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                connection.close()
                if reused and not connection.cut.is_set():
                    continue  # closed by the server while idle: not this query's failure
                if connection.cut.is_set() or time.monotonic() >= deadline:
                    raise _PastDeadline from None
                raise
            except (OSError, http.client.HTTPException, zlib.error):
                connection.close()
                if connection.cut.is_set() or time.monotonic() >= deadline:
                    raise _PastDeadline from None
                raise
            except BaseException:  # _PastDeadline, or a bug: the connection goes either way
                connection.close()
                raise
            connection.disarm()
            if keep and not connection.cut.is_set() and not self._closed:
                self._idle.put(connection)
            else:
                connection.close()
            return status, body

    @staticmethod
    def _exchange(
        connection: _Connection, target: str, headers: dict[str, str]
    ) -> tuple[int, bytes, bool]:
        """(status, body, whether the connection may be used again) of one request."""
        connection.request("GET", target, None, headers)
        response = connection.getresponse()
        gzipped = response.getheader("Content-Encoding", "").strip().lower() == "gzip"
        unzip = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
        chunks: list[bytes] = []
        # read1: what one read of the socket gives, so no call waits for a whole chunk.
        while chunk := response.read1(CHUNK_BYTES):
            chunks.append(unzip.decompress(chunk) if unzip is not None else chunk)
        if connection.cut.is_set():
            raise _PastDeadline  # the watchdog's shutdown reads as the end of the body
        if response.length:  # http.client's read1 takes an early end for the last byte
            raise http.client.IncompleteRead(b"", response.length)
        if unzip is not None:
            chunks.append(unzip.flush())
        keep = not response.will_close
        response.close()  # read to its end: the connection may carry the next request
        return response.status, b"".join(chunks), keep

    # --- credentials ------------------------------------------------------------------------

    def _authorization_header(self) -> str | None:
        """The Authorization header from the credential files, read now; remembers what it
        read so that messages can be scrubbed of it."""
        if self._basic_auth is not None:
            password = _read_secret(self._basic_auth.password_file, "basic_auth.password_file")
            pair = f"{self._basic_auth.username}:{password}".encode()
            encoded = base64.b64encode(pair).decode()
            self._remember(password, encoded)
            return f"Basic {encoded}"
        if self._authorization is not None:
            name = "authorization.credentials_file"
            credentials = _read_secret(self._authorization.credentials_file, name)
            self._remember(credentials)
            return f"{self._authorization.type} {credentials}"
        return None

    def _quote(self, body: bytes) -> str:
        """An error body as a message quotes it, scrubbed before it is cut short (a secret cut
        in two would no longer be found)."""
        return _quote(self._scrub(body.decode("utf-8", "replace")))

    def _remember(self, *secrets: str) -> None:
        with self._secrets_lock:
            self._secrets = self._secrets | {secret for secret in secrets if secret}

    def _scrub(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, REDACTED)
        return text

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self._https:
            return None
        if self._tls is None:  # built on first use: a bad file is then a query's error
            self._tls = _tls_context(self._tls_config or TLSSettings())
        return self._tls


def _close_idle(idle: queue.SimpleQueue[_Connection]) -> None:
    while True:
        try:
            idle.get_nowait().close()
        except queue.Empty:
            return


def _read_secret(path: Path, field: str) -> str:
    try:
        secret = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise QueryError(f"cannot read prometheus.{field} {path}: {reason}") from None
    if not secret:
        raise QueryError(f"prometheus.{field} {path} is empty")
    return secret


def _tls_context(settings: TLSSettings) -> ssl.SSLContext:
    """A client context from decider.yaml `prometheus.tls_config`; raises QueryError."""
    try:
        context = ssl.create_default_context(
            cafile=str(settings.ca_file) if settings.ca_file else None
        )
        if settings.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if settings.cert_file is not None:
            key = str(settings.key_file) if settings.key_file is not None else None
            context.load_cert_chain(str(settings.cert_file), key)
    except (OSError, ssl.SSLError) as exc:
        raise QueryError(f"cannot load prometheus.tls_config: {_reason(exc)}") from None
    return context


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _quote(body: str) -> str:
    """An error body as a message quotes it: Prometheus' `errorType: error`, else its text."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        text = f"{answer.get('errorType', 'error')}: {answer['error']}"
    else:
        text = body
    text = " ".join(text.split())
    if not text:
        return ""
    return ": " + (text if len(text) <= MAX_BODY_QUOTE else text[: MAX_BODY_QUOTE - 1] + "…")


def _result(body: bytes, scrub: Callable[[str], str]) -> list[Any]:
    """`data.result` of a Prometheus answer; raises QueryError for anything else, quoting
    the answer's start, `scrub`bed of secrets first."""
    try:
        answer = json.loads(body)
    except ValueError as exc:
        raise QueryError(f"the answer is not JSON ({exc})") from None
    if (
        not isinstance(answer, dict)
        or answer.get("status") != "success"
        or not isinstance(answer.get("data"), dict)
        or "result" not in answer["data"]
    ):
        shown = " ".join(scrub(body[: MAX_BODY_QUOTE * 4].decode("utf-8", "replace")).split())
        shown = shown if len(shown) <= MAX_BODY_QUOTE else shown[: MAX_BODY_QUOTE - 1] + "…"
        raise QueryError(f"the answer is not a Prometheus query response: {shown}")
    return cast(list[Any], answer["data"]["result"])
