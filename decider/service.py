"""The running decider: configuration, database, snapshot refresher, expiry sweeper, and the
reload that swaps a new configuration in whole or keeps the old one (DESIGN.md §5)."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape
from prometheus_client import CollectorRegistry, disable_created_metrics

from decider import config as decider_config
from decider import facility as facility_file
from decider import peaks
from decider.capping.collector import CappingCollector
from decider.capping.driver import Capper
from decider.config import DeciderConfig
from decider.decisions import DecisionLog
from decider.domains_json import domain_json
from decider.facility import Facility
from decider.giving_way import GIVE_WAY_SHARE, Collector, InFlight
from decider.metrics import DatabaseCollector, DecisionCounters, DomainCollector
from decider.refresher import Refresher
from decider.shedding.collector import SheddingCollector
from decider.shedding.shedder import Shedder
from decider.state import State
from decider.store import Store, StoreError
from llmgw_common.yamlfile import ConfigError

log = logging.getLogger(__name__)

#: How often unconfirmed reservations past their TTL are dropped.
SWEEP_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Loaded:
    config: DeciderConfig
    facility: Facility
    token: str | None


class FilesError(ConfigError):
    """Problems in several files at once: `str()` lists each as `file:line: field: reason`,
    one a line, as a single file's ConfigError does."""

    def __init__(self, errors: list[ConfigError]) -> None:
        lines = [line for error in errors for line in str(error).splitlines()]
        Exception.__init__(self, "\n".join(lines))
        self.path = errors[0].path
        self.problems = lines


def read_token(path: Path) -> str:
    """The bearer token: the file's first line, stripped. Raises ConfigError.

    As ssh with a private key: a token file that users other than its owner can write is
    refused (whoever writes it chooses the token), one that every user can read is taken
    with a warning (anyone on the host can then make reservations and holds)."""
    try:
        token = path.read_text(encoding="utf-8").strip()
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, [f"1: cannot read the token file: {exc}"]) from exc
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        writers = " and ".join(
            who
            for who, bit in (("its group", stat.S_IWGRP), ("every user", stat.S_IWOTH))
            if mode & bit
        )
        raise ConfigError(
            path,
            [
                f"1: the token file is writable by {writers} (mode {mode:04o}): whoever can "
                f"write it chooses the token; chmod 600 {path}"
            ],
        )
    if mode & stat.S_IROTH:
        log.warning(
            "%s: the token file is readable by every user (mode %04o): anyone on this host "
            "can make reservations and holds; chmod 600 it",
            path,
            mode,
        )
    if not token or "\n" in token or len(token) < 16 or not token.isascii():
        raise ConfigError(path, ["1: the token must be one line of at least 16 ASCII characters"])
    return token


def load_all(config_path: Path) -> Loaded:
    """decider.yaml, then the facility file and the token it names: all or nothing.

    Raises ConfigError; with several bad files, every problem of every file at once."""
    config = decider_config.load(config_path)
    errors: list[ConfigError] = []
    facility: Facility | None = None
    token: str | None = None
    try:
        facility = facility_file.load(config.facility)
    except ConfigError as exc:
        errors.append(exc)
    if config.token_file is not None:
        try:
            token = read_token(config.token_file)
        except ConfigError as exc:
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise FilesError(errors)
    assert facility is not None
    return Loaded(config, facility, token)


def budgets_dropped(running: Facility, new: Facility) -> str | None:
    """Why a new facility file must not replace the running one unforced: it budgets none of
    the domains the running one budgets, which would switch every power check off at once (a
    truncated or wrong file). None: it keeps at least one of them, or nothing was budgeted."""
    budgeted = [
        key
        for key, domain in running.domains.items()
        if domain.cap(running.defaults.derating) is not None
    ]
    if not budgeted or any(new.cap_watts(*key.split("/", 1)) is not None for key in budgeted):
        return None
    named = ", ".join(budgeted[:3]) + (f" and {len(budgeted) - 3} more" * (len(budgeted) > 3))
    return f"it budgets none of the {len(budgeted)} domains the running file budgets ({named})"


def hot_lookback(facility: Facility) -> float:
    """How far back the `hot` part reads: enough to see a domain hot past shedding.hot_for."""
    return facility.shedding.hot_for + facility.shedding.interval


class Service:
    def __init__(self, config_path: Path, loaded: Loaded) -> None:
        self.config_path = config_path
        self.loaded = loaded
        config = loaded.config
        self.store = Store(config.database)
        self.in_flight = InFlight()  # counted by the API's middleware (decider.giving_way)
        # The runtime policy (decider.giving_way): pacing above, the collector here.
        self.state = State(
            loaded.facility,
            self.store,
            config.reservation_ttl,
            config.staleness,
            collector=Collector(),
        )
        self.refreshed_once = False
        self.refresher = Refresher(
            config,
            window_seconds=config.staleness.readings,
            inventory_window_seconds=config.staleness.inventory,
            on_refresh=self._on_refresh,
            give_way=self.in_flight.budget,
        )
        disable_created_metrics()  # `_created` series say nothing an operator reads
        self.registry = CollectorRegistry()
        self.counters = DecisionCounters(self.registry)
        self.decisions = DecisionLog()  # the status page's recent decisions
        self.registry.register(DomainCollector(self.state.view))
        self.refresher.hot_lookback_seconds = hot_lookback(loaded.facility)
        self.refresher.peaks_query = peaks.query(loaded.facility)
        self.shedder = Shedder(self.store, self.state.view, time.time, self.state.record_proposals)
        self.registry.register(SheddingCollector(self.shedder))
        self.capper = Capper()  # the capping ladders, in memory (docs/oversubscription.md)
        self.registry.register(CappingCollector(self.capper))
        self._database_problem: str | None = None
        self.registry.register(DatabaseCollector(self.database_problem))
        self._reload_lock = threading.Lock()
        self._stopping = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep, name="reservation-expiry", daemon=True)
        self._templates = Environment(
            loader=PackageLoader("decider"), autoescape=select_autoescape(["html", "j2"])
        )

    @property
    def token(self) -> str | None:
        return self.loaded.token

    def start(self) -> None:
        self.refresher.start()
        self._sweeper.start()

    def stop(self) -> None:
        """Stop the refresher and the sweeper, close the database; a second call does nothing."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self.refresher.stop()
        if self._sweeper.is_alive():
            self._sweeper.join(timeout=5)
        self.store.close()
        log.info("stopped; %s closed", self.store.path)

    def _on_refresh(self, snapshot: object) -> None:
        # The new View is worked out giving way to requests, for at most a quarter of a
        # refresh interval in all (as the answers' parsing): past it the refresh goes on
        # regardless (decider.giving_way).
        pause = self.in_flight.budget(self.loaded.config.refresh_interval * GIVE_WAY_SHARE)
        self.state.set_snapshot(self.refresher.snapshot, pause)
        self.refreshed_once = True
        try:  # a failing ladder must not stop the snapshot; a lease a whole
            # lease_seconds past the last good refresh gives the safe limit (decider.capping)
            self.capper.refresh(self.state.view())
        except Exception:
            log.exception("the capping ladders failed to move at this refresh")

    def _sweep(self) -> None:
        failing: str | None = None
        while not self._stopping.wait(SWEEP_INTERVAL_S):
            try:
                self.state.expire()
                failing = None
            except StoreError as exc:  # a full disk must not end expiry for good
                if str(exc) != failing:  # once per cause, not every second
                    log.error("expiring reservations failed; retrying every second: %s", exc)
                failing = str(exc)
            except Exception:
                log.exception("expiring reservations failed; retrying")

    def database_problem(self) -> str | None:
        """None while the database the decider writes is the file the next start reads; else
        why not (`FILE: reason`): writes are refused (503), /readyz is not ready and
        llmgw_decider_database_ok is 0 (decider.store)."""
        problem = self.store.problem()
        described = None if problem is None else f"{self.store.path}: {problem}"
        if described != self._database_problem:
            if described is not None:
                log.error("the database cannot be written: %s", described)
            else:
                log.info("the database %s is the file at its path again", self.store.path)
            self._database_problem = described
        return described

    def reload(self, force: bool = False) -> list[str]:
        """Re-read every file; apply all of it, or on any problem none of it (the problems).

        A facility file that budgets none of the domains the running one budgets is refused
        unless `force` (POST /-/reload?force=true; SIGHUP never forces)."""
        with self._reload_lock:
            try:
                loaded = load_all(self.config_path)
            except ConfigError as exc:
                problems = str(exc).splitlines()
                log.error("reload refused, the running configuration stays:\n%s", exc)
                return problems
            dropped = budgets_dropped(self.loaded.facility, loaded.facility)
            if dropped is not None and not force:
                problem = (
                    f"{loaded.config.facility}: {dropped}: a truncated or wrong file? To apply "
                    "it anyway, POST /-/reload?force=true (SIGHUP never forces)"
                )
                log.error("reload refused, the running configuration stays:\n%s", problem)
                return [problem]
            if dropped is not None:
                log.warning("reload forced: %s: %s", loaded.config.facility, dropped)
            old = self.loaded.config
            unchanged = ("listen", "database")
            ignored = [
                name for name in unchanged if getattr(old, name) != getattr(loaded.config, name)
            ]
            self.loaded = loaded
            self.state.set_facility(
                loaded.facility, loaded.config.reservation_ttl, loaded.config.staleness
            )
            self.refresher.window_seconds = loaded.config.staleness.readings
            self.refresher.inventory_window_seconds = loaded.config.staleness.inventory
            self.refresher.hot_lookback_seconds = hot_lookback(loaded.facility)
            self.refresher.peaks_query = peaks.query(loaded.facility)
            self.refresher.reconfigure(loaded.config)
            for name in ignored:
                log.warning("reload: %s changed; it takes effect at the next restart", name)
            log.info("reloaded %s and %s", self.config_path, loaded.config.facility)
            return []

    def render_status_page(self) -> str:
        view = self.state.view()
        # The page shows the figures the API's answers show (decider.domains_json).
        domains = [domain_json(view, ref) for ref in sorted(view.domain_refs)]
        racks = [d for d in domains if d["kind"] == "rack"]
        snapshot = view.snapshot
        nodes = []
        if "membership" in view.fresh:
            for node, refs in sorted(snapshot.membership.items()):
                rack = next((ref.name for ref in refs if ref.kind == "rack"), None)
                held = [str(ref) for ref in refs if view.domain(ref).held]
                reserved = sum(int(r.gpus) for r in view.reservations.values() if r.node == node)
                nodes.append({"node": node, "rack": rack, "held": held, "reserved_gpus": reserved})
        return self._templates.get_template("status.html.j2").render(
            racks=racks,
            domains=[d for d in domains if d["kind"] != "rack"],
            nodes=nodes,
            decisions=self.decisions.recent(),
            now=time.time(),
            mode=view.mode,
            missing=view.missing,
            prometheus_up=snapshot.prometheus_up,
            age=snapshot.age_seconds(time.time()),
            reservations=len(view.reservations),
            capping=[capping.as_json() for capping in self.capper.domains()],
        )
