"""The decider's view of Prometheus: a background refresher that rebuilds the Snapshot.

A placement never waits on Prometheus (DESIGN.md §5): a daemon thread reads the rules'
series (docs/rules.md) every `refresh_interval` and replaces the shared `Snapshot` whole.

- **Bounded.** Every query has the configured timeout and at most `retries` retries with a
  short backoff (decider.prometheus_reader). The queries of one refresh run in parallel,
  so a dead Prometheus costs one query's worth of time, not seven.
- **Fresh only.** Each series is read through `last_over_time(series[window])`: a restarted
  Prometheus otherwise serves the previous process's last sample for five minutes. Plain
  PromQL, so VictoriaMetrics, Thanos and Mimir run it too.
- **Per part.** Each part of `snapshot.PARTS` has its own query. One that fails keeps its
  previous data and read time, so it ages on its own; the error says which query failed and
  why. What a bad series does to its part: decider.prometheus_parse.
- **Inventory less often.** The inventory parts (`snapshot.INVENTORY_PARTS`: layout and
  hardware, which change rarely; membership alone is 60,000 series at 10,000 nodes) are
  read again once their last read is `staleness.readings / 2` old (a minute with the
  defaults), at every refresh after a failed attempt or an empty answer, and at the next
  refresh after a reload. The snapshot's age, the oldest part's, so stays below the
  readings' own limit, and a node added is seen within about a minute.
- **Never raises.** Whatever the server answers, `refresh` returns a Snapshot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from types import MappingProxyType
from typing import Any

from decider.config import DeciderConfig
from decider.facility import DomainRef
from decider.giving_way import GIVE_WAY_SHARE, Pause, no_pause
from decider.prometheus_parse import (
    ConditionsRead,
    Dropped,
    MeasuredRead,
    PeaksRead,
    merge_profiles,
    parse_part,
    read_samples,
    settle_conditions,
)
from decider.prometheus_reader import PrometheusReader, QueryError
from decider.promql import format_duration
from decider.snapshot import INVENTORY_PARTS, PARTS, Part, Snapshot

log = logging.getLogger(__name__)

#: A part's left-out series: the message naming them (None: none), and how many.
LeftOut = tuple[str | None, int]

#: How old a rule's sample may be and still count as current: three evaluations of the
#: rules' 30 s groups, so one late evaluation or scrape hides nothing.
FRESH_WINDOW_S = 90.0
#: How often a refresh that may be cancelled looks at its cancel event.
CANCEL_POLL_S = 0.05
#: How long past the reader's budget a refresh waits for a query: the reader ends each query
#: at its budget itself (decider.prometheus_reader), and its own message says more.
BUDGET_GRACE_S = 0.25
#: The longest error text kept in a Part: enough to say what, short enough for a log line.
MAX_ERROR_CHARS = 300
#: The longest query text an error shows.
MAX_QUERY_CHARS = 100

#: One query per part; `{window}` is a PromQL duration.
QUERIES: dict[str, str] = {
    "membership": "last_over_time(llmgw:node_domain:membership[{window}])",
    "inventory": "last_over_time(llmgw_domain_info[{window}])",
    # Each domain's, and each phase's of a three-phase pdu that a site signal measures
    # (rendered site rules): its `phase` label tells it apart (decider.prometheus_parse).
    "measured": "last_over_time(llmgw_domain_measured_watts[{window}]) or "
    "last_over_time(llmgw:domain_phase_site_power_watts[{window}])",
    # Each domain's condition at 1; a domain with none at 1 (its state set read half written,
    # docs/rules.md) comes back as one series without a `condition` label. A plain `or` of
    # disjoint sets: VictoriaMetrics 1.79 answers `… or on (kind, domain) max by (…) (…)` with
    # the raw series of the right side.
    "conditions": "last_over_time(llmgw_domain_condition[{window}]) == 1 or "
    "max by (kind, domain) (last_over_time(llmgw_domain_condition[{window}])) < 1",
    "ages": "last_over_time(llmgw_domain_reading_age_seconds[{window}])",
    "gpus": "last_over_time(llmgw:node_gpus:count[{window}])",
    "limits": "max by (node) (last_over_time(llmgw_gpu_power_limit_watts[{window}]))",
    # The largest minimum: one cap on every GPU of a node must suit each of its cards.
    "min_limits": "max by (node) (last_over_time(llmgw_gpu_power_limit_min_watts[{window}]))",
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
    # The exporter's series itself (no rule records it): one per node and model.
    "cpus": "max by (node, model) (last_over_time(llmgw_node_cpu_info[{window}]))",
    # What each warm or hot domain's condition rests on (rules/domain.yml, rules/conditions.yml),
    # one series per figure told apart by a `figure` label (decider.snapshot.Evidence): a
    # rack's own inlet, GPUs and thresholds, a parent's site signals and share of racks hot, a
    # cooling alarm about any of them; and how long it has been warm or hot, as the `hot`
    # part reads how long hot. Only for domains warm or hot now: what a refusal or a
    # down-score names. (The cooling alarm first: an error names the query's beginning.)
    "evidence": "("
    + " or ".join(
        f'label_replace(max by (kind, domain) (last_over_time({series}[{{window}}])), "figure", '
        f'"{figure}", "", "")'
        for figure, series in (
            ("cooling_alarm", "llmgw:domain_cooling_alarm"),
            ("inlet_celsius", 'llmgw_domain_inlet_temperature_celsius{{kind="rack"}}'),
            ("inlet_celsius", 'llmgw:domain_site_inlet_temperature_celsius{{kind!="rack"}}'),
            ("gpus", 'llmgw:domain_gpus:count{{kind="rack"}}'),
            (
                "gpus_thermally_throttled",
                'llmgw:domain_gpus_thermally_throttled:count{{kind="rack"}}',
            ),
            ("gpus_near_slowdown", 'llmgw:domain_gpus_near_slowdown:count{{kind="rack"}}'),
            ("racks_hot_ratio", "llmgw:domain_racks_hot:ratio"),
            ("racks_warm_ratio", "llmgw:domain_racks_warm:ratio"),
        )
    )
    + " or max by (kind, domain, figure) (label_replace(last_over_time(llmgw:domain_threshold:value"
    '{{threshold=~"inlet_warm_celsius|inlet_hot_celsius|throttled_hot_ratio|racks_hot_share|'
    'racks_warm_share"}}[{window}]), "figure", "$1", "threshold", "(.+)"))'
    " or label_replace(time() - max_over_time(timestamp(sum by (kind, domain) ("
    'llmgw_domain_condition{{condition=~"warm|hot"}}) != 1)[{hot_lookback}:{hot_step}]) or on '
    "(kind, domain) time() - min_over_time(timestamp(sum by (kind, domain) ("
    'llmgw_domain_condition{{condition=~"warm|hot"}}))[{hot_lookback}:{hot_step}]), "figure", '
    '"warm_seconds", "", "")'
    ') and on (kind, domain) (last_over_time(llmgw_domain_condition{{condition=~"warm|hot"}}'
    "[{window}]) == 1)",
}
assert QUERIES.keys() == PARTS.keys(), "one query per snapshot part"

#: How long a refresh waits to read the conditions again when a domain's state set was read
#: half written, with no condition at 1 (at most a quarter of the reader's budget). vmalert
#: writing into VictoriaMetrics has a rule's samples all searchable a second or two after the
#: first (docs/rules.md, "A state set can be read half written").
HALF_WRITTEN_REREAD_S = 2.0


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


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 1] + "…"


def _shown(promql: str) -> str:
    """A query as an error names it: a long one (the profiles part's) cut short, so the
    reason after it is not what MAX_ERROR_CHARS cuts off."""
    return promql if len(promql) <= MAX_QUERY_CHARS else promql[: MAX_QUERY_CHARS - 1] + "…"


def _read_part(
    reader: PrometheusReader, part: str, promql: str, pause: Pause = no_pause
) -> tuple[Any, LeftOut]:
    """(data, the series it left out) for one part; raises QueryError with the part and
    query named. A conditions answer with a state set read half written is read once more,
    a moment later."""
    data, left_out = _read_part_once(reader, part, promql, pause)
    if isinstance(data, ConditionsRead) and data.half_written:
        time.sleep(min(HALF_WRITTEN_REREAD_S, reader.budget_s / 4))
        data, left_out = _read_part_once(reader, part, promql, pause)
    return data, left_out


def _read_part_once(
    reader: PrometheusReader, part: str, promql: str, pause: Pause = no_pause
) -> tuple[Any, LeftOut]:
    try:
        dropped = Dropped()
        data = parse_part(part, read_samples(reader.query(promql), dropped, pause), dropped, pause)
    except QueryError as exc:
        raise QueryError(_one_line(f"{part} query `{_shown(promql)}`: {exc}")) from exc
    except Exception as exc:  # a parser bug must still not take the refresher down
        raise QueryError(
            _one_line(f"{part} query `{_shown(promql)}`: unexpected {type(exc).__name__}: {exc}")
        ) from exc
    left_out = dropped.message()
    return data, (None if left_out is None else _one_line(left_out), dropped.count)


def _previous_data(previous: Snapshot, part: str) -> Any:
    return {
        "membership": previous.membership,
        "inventory": previous.domains,
        "measured": MeasuredRead(
            dict(previous.measured_watts), dict(previous.phase_measured_watts)
        ),
        "conditions": previous.conditions,
        "ages": previous.reading_ages,
        "gpus": previous.node_gpus,
        "limits": previous.gpu_limit_watts,
        "min_limits": previous.gpu_min_limit_watts,
        "profiles": previous.profiles,
        "hot": previous.hot_seconds,
        "cpus": previous.cpu_models,
        "evidence": previous.evidence,
        "peaks": PeaksRead(dict(previous.domain_peaks), dict(previous.unit_peak_watts)),
    }[part]


def _run_all(
    reader: PrometheusReader,
    texts: Mapping[str, str],
    cancel: threading.Event | None,
    pause: Pause = no_pause,
) -> dict[str, tuple[Any, LeftOut] | QueryError]:
    """Every part's outcome, queried in parallel and waited for at most the reader's budget."""
    outcomes: dict[str, tuple[Any, LeftOut] | QueryError] = {}
    executor = ThreadPoolExecutor(max_workers=len(texts), thread_name_prefix="prometheus-query")
    try:
        futures: dict[Future[tuple[Any, LeftOut]], str] = {
            executor.submit(_read_part, reader, part, text, pause): part
            for part, text in texts.items()
        }
        deadline = time.monotonic() + reader.budget_s + BUDGET_GRACE_S
        pending: Iterable[Future[tuple[Any, LeftOut]]] = set(futures)
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
        # A straggler (a cancelled refresh's) ends by its query's own deadline; nobody waits.
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
    peaks_query: str | None = None,
) -> Snapshot:
    """A new Snapshot: each part read anew, or, where its query failed, kept from `previous`;
    the parts in `keep` are not queried: their data, read time and note are `previous`'s.
    `peaks_query`: the optional `peaks` part's (decider.peaks), read where given; None: the
    snapshot has no such part.

    Returns within about the reader's budget (one query's timeout × attempts), or soon after
    `cancel` is set. Never raises. `domains` is the inventory and every member's domain;
    while the inventory query fails, the previous `domains` are kept, the current members'
    added.
    """
    try:
        texts = queries(window_seconds, inventory_window_seconds, hot_lookback_seconds)
        if peaks_query is not None:
            texts["peaks"] = peaks_query
        asked = {p: t for p, t in texts.items() if p not in keep}
        outcomes = _run_all(reader, asked, cancel, pause)
    except Exception as exc:  # e.g. no thread could be started: keep everything as it was
        message = _one_line(f"refresh failed before any query: {type(exc).__name__}: {exc}")
        outcomes = {part: QueryError(message) for part in PARTS if part not in keep}
        if peaks_query is not None and "peaks" not in keep:
            outcomes["peaks"] = QueryError(message)

    data: dict[str, Any] = {}
    parts: dict[str, Part] = {}
    for part in (*PARTS, "peaks") if peaks_query is not None else PARTS:
        if part in keep:
            data[part] = _previous_data(previous, part)
            parts[part] = previous.parts.get(part, Part())
            continue
        outcome = outcomes[part]
        if isinstance(outcome, QueryError):
            data[part] = _previous_data(previous, part)
            before = previous.parts.get(part, Part())
            parts[part] = Part(
                read_at=before.read_at,
                error=str(outcome),
                left_out=before.left_out,
                left_out_count=before.left_out_count,
            )
        else:
            data[part], (left_out, left_out_count) = outcome
            note = None
            if part == "conditions":
                data[part], note = settle_conditions(data[part], previous.conditions)
            parts[part] = Part(
                read_at=now, error=note, left_out=left_out, left_out_count=left_out_count
            )
            if part == "profiles":
                remember = inventory_window_seconds or window_seconds
                data[part] = merge_profiles(data[part], previous.profiles, now, remember)

    membership: Mapping[str, tuple[DomainRef, ...]] = data["membership"]
    members = {domain for domains in membership.values() for domain in domains}
    return Snapshot(
        membership=MappingProxyType(dict(membership)),
        domains=frozenset(data["inventory"]) | members,
        measured_watts=MappingProxyType(dict(data["measured"].domains)),
        phase_measured_watts=MappingProxyType(dict(data["measured"].phases)),
        conditions=MappingProxyType(dict(data["conditions"])),
        reading_ages=MappingProxyType(dict(data["ages"])),
        node_gpus=MappingProxyType(dict(data["gpus"])),
        gpu_limit_watts=MappingProxyType(dict(data["limits"])),
        gpu_min_limit_watts=MappingProxyType(dict(data["min_limits"])),
        profiles=MappingProxyType(dict(data["profiles"])),
        hot_seconds=MappingProxyType(dict(data["hot"])),
        cpu_models=MappingProxyType(dict(data["cpus"])),
        evidence=MappingProxyType(dict(data["evidence"])),
        domain_peaks=MappingProxyType(dict(data["peaks"].domains) if "peaks" in data else {}),
        unit_peak_watts=MappingProxyType(dict(data["peaks"].units) if "peaks" in data else {}),
        parts=MappingProxyType(parts),
        prometheus_up=not any(isinstance(outcome, QueryError) for outcome in outcomes.values()),
    )


class Refresher:
    """Owns the current Snapshot and keeps it fresh from a daemon thread.

    `snapshot` is replaced whole (one attribute assignment), so readers on other threads
    need no lock. Refreshes never overlap (one lock): the background loop's, and those a
    test runs itself with `_refresh(cancel=None)` on a clock it steps.
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
        #: The optional `peaks` part's query (decider.peaks.query, set by decider.service);
        #: None: no domain opts in to oversubscription, and the part is not read.
        self.peaks_query: str | None = None
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
        with self._configuring:
            self._reader.close()  # its idle connections; a later query still works

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
        # The peaks part, a week's quantiles, at the inventory's pace too: it moves slowly.
        return frozenset(
            name
            for name in (*INVENTORY_PARTS, "peaks")
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

    def _refresh(self, cancel: threading.Event | None) -> Snapshot:
        with self._refreshing:
            with self._configuring:
                self._next_due = time.monotonic() + self._settings.refresh_interval
                reader = self._reader
                read_all, self._read_all = self._read_all, False
            now = self._clock()
            keep = frozenset() if read_all else self._kept(now)
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
                    peaks_query=self.peaks_query,
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
                name
                for name in (INVENTORY_PARTS | {"peaks"}) - keep
                if name in snapshot.parts and snapshot.parts[name].read_at != now
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
