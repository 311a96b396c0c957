"""The decider's view of Prometheus: a background refresher that rebuilds the Snapshot.

A placement never waits on Prometheus (DESIGN.md §5): a daemon thread reads the rules'
series (docs/rules.md) every `refresh_interval` and replaces the shared `Snapshot` whole.

- **Bounded.** Every query has the configured timeout and at most `retries` retries with a
  short backoff (prometheus-api-client's own default retries for seconds and honours a
  `Retry-After` of any length). The queries of one refresh run in parallel, so a dead
  Prometheus costs one query's worth of time, not seven.
- **Fresh only.** Each series is read through `last_over_time(series[window])`: a restarted
  Prometheus otherwise serves the previous process's last sample for five minutes. Plain
  PromQL, so VictoriaMetrics, Thanos and Mimir run it too.
- **Per part.** Each part of `snapshot.PARTS` has its own query. One that fails keeps its
  previous data and read time, so it ages on its own; the error says which query failed and
  why. A bad series label (a kind that is not a domain kind, a missing label) drops that
  series and is noted in the part's error, the rest is used; a bad value (not a finite
  number) or a malformed answer fails the part, since the whole answer is then suspect.
- **Inventory less often.** The inventory parts (`snapshot.INVENTORY_PARTS`: layout and
  hardware, which change rarely; membership alone is 60,000 series at 10,000 nodes) are
  read again once their last read is `staleness.readings / 2` old (a minute with the
  defaults), at every refresh after a failed attempt or an empty answer, and at the next
  refresh after a reload;
  `refresh_now` reads every part. The snapshot's age, the oldest part's, so stays below
  the readings' own limit, and a node added is seen within about a minute.
- **Never raises.** Whatever the server answers, `refresh` returns a Snapshot.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.exceptions import MaxRetryError, ReadTimeoutError, ResponseError
from urllib3.util import Retry

from decider.config import DeciderConfig, PrometheusSettings
from decider.facility import KINDS, DomainRef, Kind
from decider.giving_way import GIVE_WAY_SHARE, Pause, no_pause, paced
from decider.promql import format_duration
from decider.snapshot import INVENTORY_PARTS, PARTS, Condition, Part, ProfileFigures, Snapshot

log = logging.getLogger(__name__)

#: How old a rule's sample may be and still count as current: three evaluations of the
#: rules' 30 s groups, so one late evaluation or scrape hides nothing.
FRESH_WINDOW_S = 90.0
#: Retry backoff: the first retry is immediate, then 0.2 s, 0.4 s, at most 0.5 s.
BACKOFF_FACTOR_S = 0.1
BACKOFF_MAX_S = 0.5
RETRY_ON_STATUS = (500, 502, 503, 504)
#: How often a refresh that may be cancelled looks at its cancel event.
CANCEL_POLL_S = 0.05
#: The longest error text kept in a Part: enough to say what, short enough for a log line.
MAX_ERROR_CHARS = 300
#: The longest query text an error shows.
MAX_QUERY_CHARS = 100

#: One query per part; `{window}` is a PromQL duration.
QUERIES: dict[str, str] = {
    "membership": "last_over_time(llmgw:node_domain:membership[{window}])",
    "inventory": "last_over_time(llmgw_domain_info[{window}])",
    "measured": "last_over_time(llmgw_domain_measured_watts[{window}])",
    # Each domain's condition at 1; a domain with none at 1 (its state set read half written,
    # docs/rules.md) comes back as one series without a `condition` label. A plain `or` of
    # disjoint sets: VictoriaMetrics 1.79 answers `… or on (kind, domain) max by (…) (…)` with
    # the raw series of the right side.
    "conditions": "last_over_time(llmgw_domain_condition[{window}]) == 1 or "
    "max by (kind, domain) (last_over_time(llmgw_domain_condition[{window}])) < 1",
    "ages": "last_over_time(llmgw_domain_reading_age_seconds[{window}])",
    "gpus": "last_over_time(llmgw:node_gpus:count[{window}])",
    "limits": "max by (node) (last_over_time(llmgw_gpu_power_limit_watts[{window}]))",
    # One query for the four series of a profile, told apart by a `figure` label.
    "profiles": " or ".join(
        f'label_replace(last_over_time({series}[{{window}}]), "figure", "{figure}", "", "")'
        for figure, series in (
            ("tokens_per_joule", "llmgw:model_profile_tokens_per_joule:ratio5m"),
            ("tokens_per_second", "llmgw:model_profile_tokens:rate5m"),
            ("watts", "llmgw:model_profile_power_watts:avg5m"),
            ("units", "llmgw:model_profile_units:count"),
        )
    ),
    # Seconds since the domain's last evaluation that was not hot, else since its first in
    # the lookback: Prometheus' own record, so it survives a restart of the decider. Every
    # domain is answered; decider.shedding reads it only for domains hot now. The step is the
    # rules' evaluation interval, 30s, or less for a short lookback (`queries`). A subquery,
    # which Prometheus, VictoriaMetrics, Thanos and Mimir all run.
    "hot": "time() - max_over_time(timestamp(llmgw_domain_condition{{condition='hot'}} != 1)"
    "[{hot_lookback}:{hot_step}]) or on (kind, domain) time() - min_over_time(timestamp("
    "llmgw_domain_condition{{condition='hot'}})[{hot_lookback}:{hot_step}])",
}
assert QUERIES.keys() == PARTS.keys(), "one query per snapshot part"

#: A domain showing two conditions at once (two rulers, or a state set read half written
#: where a ruler's write is no transaction: vmalert, docs/rules.md)
#: counts as the worse one.
CONDITION_RANK: dict[str, int] = {"unknown": 0, "ok": 1, "warm": 2, "hot": 3}
#: How long a refresh waits to read the conditions again when a domain's state set was read
#: half written, with no condition at 1 (at most a quarter of the reader's budget). vmalert
#: writing into VictoriaMetrics has a rule's samples all searchable a second or two after the
#: first (docs/rules.md, "A state set can be read half written").
HALF_WRITTEN_REREAD_S = 2.0


class QueryError(Exception):
    """A query got no usable answer; the message says what went wrong, on one line."""


#: How far back the `hot` part looks when the facility file does not say (shedding.hot_for
#: 10m + interval 5m, the defaults).
HOT_LOOKBACK_S = 900.0


def queries(
    window_seconds: float,
    inventory_window_seconds: float | None = None,
    hot_lookback_seconds: float = HOT_LOOKBACK_S,
) -> dict[str, str]:
    """Each part's PromQL, reading samples at most `window_seconds` old; the inventory parts
    (snapshot.INVENTORY_PARTS: layout and hardware) at most `inventory_window_seconds`, so a
    node whose exporter is down keeps its domains and GPUs that long (decider.yaml
    `staleness.inventory`). The `hot` part looks `hot_lookback_seconds` back: a longer hot
    spell reads as that long (shedding.hot_for + interval, decider.service)."""
    window = format_duration(window_seconds)
    inventory = format_duration(inventory_window_seconds or window_seconds)
    lookback_s = max(hot_lookback_seconds, 1.0)
    # 30 steps over a short lookback (the demo's, its rules scaled in time), else the rules'
    # 30 s evaluation interval.
    step = format_duration(max(1.0, min(30.0, round(lookback_s / 30))))
    lookback = format_duration(lookback_s)
    return {
        part: text.format(
            window=inventory if part in INVENTORY_PARTS else window,
            hot_lookback=lookback,
            hot_step=step,
        )
        for part, text in QUERIES.items()
    }


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


# --- parsing -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Sample:
    labels: Mapping[str, str]
    value: float


def _samples(result: Any, pause: Pause = no_pause) -> list[_Sample]:
    """An instant vector's series, each with a finite value; raises QueryError otherwise.
    `pause` is called every PAUSE_EVERY series (decider.giving_way)."""
    if not isinstance(result, list):
        raise QueryError(
            f"the result is a {type(result).__name__}, not an instant vector (a list of series)"
        )
    samples: list[_Sample] = []
    for index, item in enumerate(paced(result, pause)):
        metric = item.get("metric") if isinstance(item, dict) else None
        pair = item.get("value") if isinstance(item, dict) else None
        if not isinstance(metric, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in metric.items()
        ):
            raise QueryError(f"series {index} has no `metric` object of string labels")
        if not isinstance(pair, list) or len(pair) != 2:
            raise QueryError(f"series {_show(metric)} has no `value` [time, value] pair")
        number = _finite(pair[1])
        if number is None:
            raise QueryError(f"series {_show(metric)} has value {pair[1]!r}, not a finite number")
        samples.append(_Sample(metric, number))
    return samples


def _finite(raw: Any) -> float | None:
    """A sample value (Prometheus sends it as a string) as a finite float, else None."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        number = float(raw)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _show(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{key}="{value}"' for key, value in sorted(labels.items())) + "}"


class _Dropped:
    """Series a part ignored for their labels: counted, the first shown."""

    def __init__(self) -> None:
        self.count = 0
        self.first = ""

    def add(self, sample: _Sample, why: str) -> None:
        if not self.count:
            self.first = f"{_show(sample.labels)}: {why}"
        self.count += 1

    def message(self) -> str | None:
        if not self.count:
            return None
        return f"ignored {self.count} series with bad labels, e.g. {self.first}"


def _domain(sample: _Sample, dropped: _Dropped) -> DomainRef | None:
    kind = sample.labels.get("kind", "")
    name = sample.labels.get("domain", "")
    if kind not in KINDS:
        dropped.add(sample, f"kind {kind!r} is not one of {', '.join(KINDS)}")
        return None
    if not name:
        dropped.add(sample, "no `domain` label")
        return None
    return DomainRef(cast(Kind, kind), name)


def _node(sample: _Sample, dropped: _Dropped) -> str | None:
    node = sample.labels.get("node", "")
    if not node:
        dropped.add(sample, "no `node` label")
    return node or None


def _per_domain(samples: list[_Sample], dropped: _Dropped) -> dict[DomainRef, float]:
    # A duplicate (two rulers writing one series) keeps the larger: more power, older age.
    values: dict[DomainRef, float] = {}
    for sample in samples:
        if (domain := _domain(sample, dropped)) is not None:
            values[domain] = max(sample.value, values.get(domain, sample.value))
    return values


def _per_node(samples: list[_Sample], dropped: _Dropped) -> dict[str, float]:
    values: dict[str, float] = {}
    for sample in samples:
        if (node := _node(sample, dropped)) is not None:
            values[node] = max(sample.value, values.get(node, sample.value))
    return values


def _parse(part: str, samples: list[_Sample], dropped: _Dropped, pause: Pause = no_pause) -> Any:
    """One part's data, from its query's series."""
    if part == "membership":  # 60,000 series at 10,000 nodes: it gives way as it goes
        nodes: dict[str, set[DomainRef]] = {}
        for sample in paced(samples, pause):
            node = _node(sample, dropped)
            domain = _domain(sample, dropped) if node is not None else None
            if node is not None and domain is not None:
                nodes.setdefault(node, set()).add(domain)
        return {node: tuple(sorted(domains)) for node, domains in nodes.items()}
    if part == "inventory":
        found = (_domain(sample, dropped) for sample in samples)
        return frozenset(domain for domain in found if domain is not None)
    if part == "conditions":
        conditions: dict[DomainRef, Condition] = {}
        half_written: set[DomainRef] = set()
        for sample in samples:
            if "condition" not in sample.labels:  # the query's mark: none at 1
                if (domain := _domain(sample, dropped)) is not None:
                    half_written.add(domain)
                continue
            condition = sample.labels["condition"]
            if condition not in CONDITION_RANK:
                dropped.add(sample, f"condition {condition!r} is not one of ok, warm, hot, unknown")
                continue
            domain = _domain(sample, dropped)
            if domain is None:
                continue
            held = conditions.get(domain)
            if held is None or CONDITION_RANK[condition] > CONDITION_RANK[held]:
                conditions[domain] = cast(Condition, condition)
        return _ConditionsRead(conditions, frozenset(half_written - conditions.keys()))
    if part in ("measured", "ages", "hot"):
        return _per_domain(samples, dropped)
    if part == "gpus":
        counts = _per_node(samples, dropped)
        for node, count in counts.items():
            if count < 0 or not count.is_integer():
                raise QueryError(f'node "{node}" has {count:g} GPUs, not a whole number')
        return {node: int(count) for node, count in counts.items()}
    if part == "limits":
        return _per_node(samples, dropped)
    if part == "profiles":
        return _profiles(samples)
    raise AssertionError(f"no parser for part {part!r}")


PROFILE_FIGURES = ("tokens_per_joule", "tokens_per_second", "watts", "units")


def _profiles(samples: list[_Sample]) -> dict[tuple[str, str], dict[str, float]]:
    """(model, profile) → {figure: value}; units with no model or profile name (docs/energy.md)
    are no profile anyone can ask for, and are left out without a note."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for sample in samples:
        model = sample.labels.get("model", "")
        profile = sample.labels.get("profile", "")
        figure = sample.labels.get("figure", "")
        if model and profile and figure in PROFILE_FIGURES:
            found.setdefault((model, profile), {})[figure] = sample.value
    return found


def _merge_profiles(
    read: Mapping[tuple[str, str], Mapping[str, float]],
    previous: Mapping[tuple[str, str], ProfileFigures],
    now: float,
    keep_seconds: float,
) -> dict[tuple[str, str], ProfileFigures]:
    """What was read now (those with a tokens per joule), and the profiles read before that
    Prometheus no longer has, with their old read time, for `keep_seconds`."""
    merged: dict[tuple[str, str], ProfileFigures] = {}
    for key, figures in read.items():
        ratio = figures.get("tokens_per_joule")
        if ratio is None:
            continue
        units = figures.get("units")
        merged[key] = ProfileFigures(
            tokens_per_joule=ratio,
            tokens_per_second=figures.get("tokens_per_second"),
            watts=figures.get("watts"),
            units=int(units) if units is not None and units >= 1 else None,
            read_at=now,
        )
    for key, old in previous.items():
        if key not in merged and now - old.read_at <= keep_seconds:
            merged[key] = old
    return merged


# --- refresh -------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 1] + "…"


def _shown(promql: str) -> str:
    """A query as an error names it: a long one (the profiles part's) cut short, so the
    reason after it is not what MAX_ERROR_CHARS cuts off."""
    return promql if len(promql) <= MAX_QUERY_CHARS else promql[: MAX_QUERY_CHARS - 1] + "…"


@dataclass(frozen=True)
class _ConditionsRead:
    """The conditions part as read: each domain's condition, and the domains whose state set
    was read half written (no condition at 1)."""

    conditions: dict[DomainRef, Condition]
    half_written: frozenset[DomainRef]


def _settle_conditions(
    read: _ConditionsRead, previous: Mapping[DomainRef, Condition]
) -> tuple[dict[DomainRef, Condition], str | None]:
    """The conditions to use: as read, and for a domain still read half written, the
    condition it had before (none: unknown), with a note saying so."""
    conditions = dict(read.conditions)
    if not read.half_written:
        return conditions, None
    for domain in read.half_written:
        if domain in previous:
            conditions[domain] = previous[domain]
    first = min(read.half_written)
    return conditions, (
        f"{len(read.half_written)} domain(s) read with no condition at 1 twice (a state set "
        f"half written), e.g. {first}: each keeps its previous condition, else unknown"
    )


def _read_part(
    reader: PrometheusReader, part: str, promql: str, pause: Pause = no_pause
) -> tuple[Any, str | None]:
    """(data, note) for one part; raises QueryError with the part and query named. A
    conditions answer with a state set read half written is read once more, a moment later."""
    data, note = _read_part_once(reader, part, promql, pause)
    if isinstance(data, _ConditionsRead) and data.half_written:
        time.sleep(min(HALF_WRITTEN_REREAD_S, reader.budget_s / 4))
        data, note = _read_part_once(reader, part, promql, pause)
    return data, note


def _read_part_once(
    reader: PrometheusReader, part: str, promql: str, pause: Pause = no_pause
) -> tuple[Any, str | None]:
    try:
        dropped = _Dropped()
        data = _parse(part, _samples(reader.query(promql), pause), dropped, pause)
    except QueryError as exc:
        raise QueryError(_one_line(f"{part} query `{_shown(promql)}`: {exc}")) from exc
    except Exception as exc:  # a parser bug must still not take the refresher down
        raise QueryError(
            _one_line(f"{part} query `{_shown(promql)}`: unexpected {type(exc).__name__}: {exc}")
        ) from exc
    note = dropped.message()
    return data, None if note is None else _one_line(f"{part} query `{_shown(promql)}`: {note}")


def _previous_data(previous: Snapshot, part: str) -> Any:
    return {
        "membership": previous.membership,
        "inventory": previous.domains,
        "measured": previous.measured_watts,
        "conditions": previous.conditions,
        "ages": previous.reading_ages,
        "gpus": previous.node_gpus,
        "limits": previous.gpu_limit_watts,
        "profiles": previous.profiles,
        "hot": previous.hot_seconds,
    }[part]


def _run_all(
    reader: PrometheusReader,
    texts: Mapping[str, str],
    cancel: threading.Event | None,
    pause: Pause = no_pause,
) -> dict[str, tuple[Any, str | None] | QueryError]:
    """Every part's outcome, queried in parallel and waited for at most the reader's budget."""
    outcomes: dict[str, tuple[Any, str | None] | QueryError] = {}
    executor = ThreadPoolExecutor(max_workers=len(texts), thread_name_prefix="prometheus-query")
    try:
        futures: dict[Future[tuple[Any, str | None]], str] = {
            executor.submit(_read_part, reader, part, text, pause): part
            for part, text in texts.items()
        }
        deadline = time.monotonic() + reader.budget_s
        pending: Iterable[Future[tuple[Any, str | None]]] = set(futures)
        while pending and (left := deadline - time.monotonic()) > 0:
            if cancel is not None and cancel.is_set():
                break
            step = left if cancel is None else min(left, CANCEL_POLL_S)
            _, pending = wait(pending, timeout=step, return_when=FIRST_COMPLETED)
        for future, part in futures.items():
            if not future.done():
                why = "cancelled" if cancel is not None and cancel.is_set() else "no answer"
                outcomes[part] = QueryError(
                    f"{part} query `{_shown(texts[part])}`: {why} within {reader.budget_s:g}s"
                )
                continue
            try:
                outcomes[part] = future.result()
            except QueryError as exc:
                outcomes[part] = exc
    finally:
        # Stragglers finish on their own (each read is bounded by the timeout); nobody waits.
        executor.shutdown(wait=False, cancel_futures=True)
    return outcomes


def refresh(
    previous: Snapshot,
    reader: PrometheusReader,
    window_seconds: float,
    now: float,
    *,
    cancel: threading.Event | None = None,
    inventory_window_seconds: float | None = None,
    hot_lookback_seconds: float = HOT_LOOKBACK_S,
    keep: frozenset[str] = frozenset(),
    pause: Pause = no_pause,
) -> Snapshot:
    """A new Snapshot: each part read anew, or, where its query failed, kept from `previous`;
    the parts in `keep` are not queried: their data, read time and note are `previous`'s.

    Returns within about the reader's budget (one query's timeout × attempts), or soon after
    `cancel` is set. Never raises. `domains` is the inventory and every member's domain;
    while the inventory query fails, the previous `domains` are kept, the current members'
    added.
    """
    try:
        texts = queries(window_seconds, inventory_window_seconds, hot_lookback_seconds)
        asked = {p: t for p, t in texts.items() if p not in keep}
        outcomes = _run_all(reader, asked, cancel, pause)
    except Exception as exc:  # e.g. no thread could be started: keep everything as it was
        message = _one_line(f"refresh failed before any query: {type(exc).__name__}: {exc}")
        outcomes = {part: QueryError(message) for part in PARTS if part not in keep}

    data: dict[str, Any] = {}
    parts: dict[str, Part] = {}
    for part in PARTS:
        if part in keep:
            data[part] = _previous_data(previous, part)
            parts[part] = previous.parts.get(part, Part())
            continue
        outcome = outcomes[part]
        if isinstance(outcome, QueryError):
            data[part] = _previous_data(previous, part)
            read_at = previous.parts.get(part, Part()).read_at
            parts[part] = Part(read_at=read_at, error=str(outcome))
        else:
            data[part], note = outcome
            if part == "conditions":
                data[part], settled = _settle_conditions(data[part], previous.conditions)
                note = "; ".join(text for text in (note, settled) if text) or None
            parts[part] = Part(read_at=now, error=note)
            if part == "profiles":
                remember = inventory_window_seconds or window_seconds
                data[part] = _merge_profiles(data[part], previous.profiles, now, remember)

    membership: Mapping[str, tuple[DomainRef, ...]] = data["membership"]
    members = {domain for domains in membership.values() for domain in domains}
    return Snapshot(
        membership=MappingProxyType(dict(membership)),
        domains=frozenset(data["inventory"]) | members,
        measured_watts=MappingProxyType(dict(data["measured"])),
        conditions=MappingProxyType(dict(data["conditions"])),
        reading_ages=MappingProxyType(dict(data["ages"])),
        node_gpus=MappingProxyType(dict(data["gpus"])),
        gpu_limit_watts=MappingProxyType(dict(data["limits"])),
        profiles=MappingProxyType(dict(data["profiles"])),
        hot_seconds=MappingProxyType(dict(data["hot"])),
        parts=MappingProxyType(parts),
        prometheus_up=not any(isinstance(outcome, QueryError) for outcome in outcomes.values()),
    )


class Refresher:
    """Owns the current Snapshot and keeps it fresh from a daemon thread.

    `snapshot` is replaced whole (one attribute assignment), so readers on other threads
    need no lock. Refreshes never overlap: the background loop and `refresh_now` take turns.
    """

    def __init__(
        self,
        settings: DeciderConfig,
        *,
        window_seconds: float = FRESH_WINDOW_S,
        inventory_window_seconds: float | None = None,
        on_refresh: Callable[[Snapshot], None] | None = None,
        give_way: Callable[[float], Pause] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_seconds = window_seconds
        self.inventory_window_seconds = inventory_window_seconds
        #: The `hot` part's lookback: shedding.hot_for + interval (decider.service).
        self.hot_lookback_seconds = HOT_LOOKBACK_S
        self.on_refresh = on_refresh
        #: A pause for parsing the answers, given its limit in seconds (decider.giving_way).
        self._give_way = give_way
        self._clock = clock
        self._settings = settings
        self._reader = PrometheusReader.from_settings(settings.prometheus)
        self.snapshot = Snapshot()
        self._refreshing = threading.Lock()
        self._configuring = threading.Lock()
        self._retired: list[PrometheusReader] = []
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_due = 0.0  # time.monotonic() of the next background refresh
        self._was_up: bool | None = None
        #: Inventory parts whose last attempt failed, and whether the next background
        #: refresh reads every part (after a reload): see `_kept`.
        self._failed: frozenset[str] = frozenset()
        self._read_all = True

    @property
    def settings(self) -> DeciderConfig:
        return self._settings

    @property
    def running(self) -> bool:
        """Whether the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Refresh at once, then every `refresh_interval`, on a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._next_due = 0.0
        self._thread = threading.Thread(target=self._run, name="prometheus-refresher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it; a refresh in flight is cancelled, not awaited."""
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the Prometheus refresher did not stop within %gs", timeout)

    def refresh_now(self) -> Snapshot:
        """Refresh synchronously (at reload, in tests), every part, and return the new
        snapshot."""
        return self._refresh(cancel=None, every_part=True)

    @property
    def inventory_every_seconds(self) -> float:
        """How old an inventory part's last read may be before a background refresh reads
        it again: half the readings' staleness limit, so the snapshot (its oldest part)
        stays younger than the readings may be."""
        return self.window_seconds / 2

    def _kept(self, now: float) -> frozenset[str]:
        """The inventory parts this background refresh does not query: read without a
        failure since, less than `inventory_every_seconds` ago, and not empty (a decider
        started before the rules' first evaluation reads nothing yet: no site to keep)."""
        if self._read_all:
            return frozenset()
        snapshot = self.snapshot
        return frozenset(
            name
            for name in INVENTORY_PARTS
            if name not in self._failed
            and (read_at := snapshot.parts.get(name, Part()).read_at) is not None
            and now - read_at < self.inventory_every_seconds
            and _previous_data(snapshot, name)
        )

    def reconfigure(self, settings: DeciderConfig) -> None:
        """Use a reloaded config: a new reader if the Prometheus settings changed, and the
        new interval from the next wait on."""
        # Not under the refresh lock: a reload must not wait for a hanging Prometheus. The
        # old reader is closed after the refresh that may still be using it.
        with self._configuring:
            old = self._settings
            self._settings = settings
            if settings.prometheus != old.prometheus:
                self._retired.append(self._reader)
                self._reader = PrometheusReader.from_settings(settings.prometheus)
                self._was_up = None  # a new Prometheus: log its state afresh
                self._next_due = 0.0  # read it at once
            self._next_due = min(self._next_due, time.monotonic() + settings.refresh_interval)
            self._read_all = True  # windows or the server may have changed: every part anew
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            left = self._next_due - time.monotonic()
            if left > 0:
                self._wake.wait(left)
                self._wake.clear()
                continue
            self._refresh(cancel=self._stopping)

    def _refresh(self, cancel: threading.Event | None, every_part: bool = False) -> Snapshot:
        with self._refreshing:
            with self._configuring:
                self._next_due = time.monotonic() + self._settings.refresh_interval
                reader = self._reader
                read_all, self._read_all = self._read_all, False
            now = self._clock()
            keep = frozenset() if every_part or read_all else self._kept(now)
            pause = no_pause
            if self._give_way is not None:  # well within the queries' own budget, too
                limit = min(self._settings.refresh_interval, reader.budget_s) * GIVE_WAY_SHARE
                pause = self._give_way(limit)
            try:
                snapshot = refresh(
                    self.snapshot,
                    reader,
                    self.window_seconds,
                    now,
                    cancel=cancel,
                    inventory_window_seconds=self.inventory_window_seconds,
                    hot_lookback_seconds=self.hot_lookback_seconds,
                    keep=keep,
                    pause=pause,
                )
            finally:
                with self._configuring:
                    retired, self._retired = self._retired, []
                for old in retired:  # no refresh uses them now: refreshes never overlap
                    old.close()
            if cancel is not None and cancel.is_set():
                return self.snapshot  # stopping: a cancelled refresh is not news
            if reader is not self._reader:
                return self.snapshot  # read from the Prometheus of the config before a reload
            self._failed = frozenset(
                name for name in INVENTORY_PARTS - keep if snapshot.parts[name].read_at != now
            )
            self.snapshot = snapshot
            self._log_change(snapshot)
            if self.on_refresh is not None:
                try:
                    self.on_refresh(snapshot)
                except Exception:
                    log.exception("on_refresh callback failed")
            return snapshot

    def _log_change(self, snapshot: Snapshot) -> None:
        if snapshot.prometheus_up == self._was_up:
            return
        url = self._reader.url
        if snapshot.prometheus_up:
            again = " again" if self._was_up is False else ""
            log.info("Prometheus at %s answers every query%s", url, again)
        else:
            errors = [part.error for part in snapshot.parts.values() if part.error]
            log.warning(
                "Prometheus at %s: queries fail, their parts keep their last data until it "
                "is stale: %s",
                url,
                "; ".join(error for error in errors if error),
            )
        self._was_up = snapshot.prometheus_up
