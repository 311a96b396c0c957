"""The decider's HTTP reader of Prometheus: instant queries against one Prometheus-compatible
URL, each bounded in time and in retries (prometheus-api-client's own default retries for
seconds and honours a `Retry-After` of any length), every failure one QueryError whose
message says what went wrong.
"""

from __future__ import annotations

import queue
from typing import Any, cast

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.exceptions import MaxRetryError, ReadTimeoutError, ResponseError
from urllib3.util import Retry

from decider.config import PrometheusSettings

#: Retry backoff: the first retry is immediate, then 0.2 s, 0.4 s, at most 0.5 s.
BACKOFF_FACTOR_S = 0.1
BACKOFF_MAX_S = 0.5
RETRY_ON_STATUS = (500, 502, 503, 504)


class QueryError(Exception):
    """A query got no usable answer; the message says what went wrong, on one line."""


class PrometheusReader:
    """Runs instant queries against one Prometheus-compatible URL, bounded in time.

    Thread-safe: each concurrent query takes its own PrometheusConnect (and so its own
    requests session and connection pool) from a pool, since a session is not promised to
    be safe across threads.
    """

    def __init__(self, url: str, timeout: float, retries: int) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self._idle: queue.SimpleQueue[PrometheusConnect] = queue.SimpleQueue()
        self._closed = False

    @classmethod
    def from_settings(cls, settings: PrometheusSettings) -> PrometheusReader:
        return cls(settings.url, settings.timeout, settings.retries)

    @property
    def budget_s(self) -> float:
        """The longest one query should take, retries and backoff included.

        requests' timeout bounds each connect and each read, so an attempt may take two of
        them; past this a query counts as failed even if it is still trickling in.
        """
        backoff = sum(
            min(BACKOFF_MAX_S, BACKOFF_FACTOR_S * 2 ** (attempt - 1))
            for attempt in range(2, self.retries + 1)
        )
        return (self.retries + 1) * 2 * self.timeout + backoff + 0.5

    def _retry(self) -> Retry:
        return Retry(
            total=self.retries,
            backoff_factor=BACKOFF_FACTOR_S,
            backoff_max=BACKOFF_MAX_S,
            status_forcelist=RETRY_ON_STATUS,
            allowed_methods=frozenset({"GET"}),
            # A 503 with `Retry-After: 3600` must not stall the refresher for an hour.
            respect_retry_after_header=False,
        )

    def _client(self) -> PrometheusConnect:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return PrometheusConnect(url=self.url, retry=self._retry(), timeout=self.timeout)

    def query(self, promql: str) -> list[Any]:
        """The query's `data.result`, unchecked; raises QueryError on any failure."""
        client = self._client()
        try:
            result = client.custom_query(promql)
        except Exception as exc:  # any failure of the library or the server is one outcome
            raise QueryError(self._describe(exc)) from exc
        finally:
            if self._closed:
                client.close()
            else:
                self._idle.put(client)
        return cast(list[Any], result)

    def _describe(self, exc: Exception) -> str:
        attempts = f"{self.retries + 1} attempt{'s' if self.retries else ''}"
        reason = exc.args[0] if exc.args else None
        if isinstance(reason, MaxRetryError):
            reason = reason.reason
        if isinstance(exc, requests.exceptions.JSONDecodeError):
            return f"the answer is not JSON ({exc})"
        if isinstance(exc, requests.exceptions.RetryError) or isinstance(reason, ResponseError):
            return f"HTTP error from {self.url} on all {attempts} ({reason})"
        if isinstance(exc, requests.exceptions.Timeout) or isinstance(reason, ReadTimeoutError):
            return f"no answer from {self.url} within {self.timeout:g}s, {attempts}"
        if isinstance(exc, requests.exceptions.ConnectionError):
            return f"cannot reach {self.url} ({attempts}): {reason or exc}"
        if isinstance(exc, PrometheusApiClientException):
            return f"{self.url} answered {exc}"
        if isinstance(exc, (KeyError, TypeError, IndexError, ValueError)):
            return f"the answer is not a Prometheus query response ({type(exc).__name__}: {exc})"
        return f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Close every idle session; one still in use is closed when its query ends."""
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
