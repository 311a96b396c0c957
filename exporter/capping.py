"""The capping agent: applies the GPU power limits the decider leases to this node.

Opt-in per node (agent.yaml `capping`, exporter/config.py `CappingConfig`); off, nothing
here runs and `requests` is never imported. On, one thread of its own:

- **Leases.** `GET {decider_url}/v1/capping/leases/{node}` with the decider's bearer
  token, renewed every `lease_seconds / 3` (issue 20's contract, docs/exporter.md "The
  capping agent"). Each lease gives a per-GPU limit for every GPU of the node
  (`gpu_limit_watts`; null: no cap) and the node's **safe cap** (`safe_gpu_limit_watts`).
  The last lease is saved in `state_file` (written atomically) with the GPUs the agent
  set a limit on.
- **Fail-safe.** A lease runs out `lease_seconds` after it was issued (by the earlier of
  the decider's `issued_at` and this node's receipt, so a clock behind the decider's never
  stretches it). Past that without a renewal -- decider down, 5xx, 401, a body that is not
  a lease -- and at start before the first lease, every GPU gets the safe cap of the last
  saved lease. The agent never goes back to uncapped on its own: only a lease with a null
  limit, or the decider's 404 ("node in no oversubscribed domain"), restores a card's
  default limit, and only on the GPUs the agent itself capped. A 404 whose body is not the
  decider's JSON answer (a wrong URL, a decider without the capping API) is a failure.
- **Actuation** through the process's NVML (exporter/nvml.py):
  `nvmlDeviceSetPowerManagementLimit` in milliwatts, only where the card's limit differs
  from the one wanted. A limit outside the card's range
  (`nvmlDeviceGetPowerManagementLimitConstraints`) is refused and logged, and the GPU keeps
  what it had; an NVML error (no permission: the exporter is not root) is logged and
  published, never raised.
- **Deadlines.** The lease request and the NVML calls each run under a HangGuard
  (exporter/deadline.py): a decider or a driver that never answers costs this thread a
  deadline, never the readings, and the lease still runs out on time.
- **Logs:** every change of a GPU's limit, one line (GPU, from, to, why); a failure once
  per change of its reason, and its end.

Emits (exporter/collector.py adds `node`):

    llmgw_capping_agent_state{state="leased"|"safe"|"off"} 1 (0 for the other two)
    llmgw_capping_agent_up 1
    llmgw_capping_agent_failing{reason="decider"|"refused"|"nvml"} 1   (only while so)
    llmgw_gpu_power_cap_watts{gpu="0",uuid="GPU-…"} 410      (GPUs the agent holds capped)
    llmgw_capping_lease_expiry_timestamp_seconds 1764800060
    llmgw_capping_safe_gpu_limit_watts 450
    llmgw_capping_last_renewal_timestamp_seconds 1764800000
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from exporter.config import CappingConfig
from exporter.deadline import HangGuard, Hung
from exporter.nvml import Nvml, NvmlAbsent, NvmlUnloadable
from exporter.samples import Sample

log = logging.getLogger(__name__)

STATES = ("leased", "safe", "off")
FAILURES = ("decider", "refused", "nvml", "state")
#: The NVML user name of the agent's sessions (exporter/nvml.py counts its users).
NVML_USER = "capping"
#: A lease shorter than this could not be renewed at a third of it over a busy network.
MIN_LEASE_SECONDS = 1.0


class Lease(BaseModel):
    """One answer of `GET /v1/capping/leases/{node}` (issue 20's contract, section 3)."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, allow_inf_nan=False)

    node: str = Field(min_length=1)
    issued_at: float = Field(gt=0)
    lease_seconds: float = Field(ge=MIN_LEASE_SECONDS, le=86_400)
    #: Per GPU, every GPU of the node; None: no cap (the cards' default limits).
    gpu_limit_watts: float | None = Field(gt=0, le=100_000)
    safe_gpu_limit_watts: float = Field(gt=0, le=100_000)
    reason: str = ""
    domains: list[str] = []


@dataclass(frozen=True, slots=True)
class NotCapped:
    """The decider's 404: this node is in no oversubscribed domain."""

    message: str


class LeaseUnavailable(Exception):
    """No lease this time: the decider unreachable, refusing, or answering something else."""


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise LeaseUnavailable(f"cannot read the token file {path}: {exc.strerror}") from exc
    if not token:
        raise LeaseUnavailable(f"the token file {path} is empty")
    return token


class DeciderClient:
    """Asks the decider for this node's lease; every failure is a `LeaseUnavailable`."""

    def __init__(self, config: CappingConfig, node: str) -> None:
        assert config.decider_url is not None and config.token_file is not None
        self.url = f"{config.decider_url}/v1/capping/leases/{quote(node, safe='')}"
        self.token_file = config.token_file
        self.timeout = config.timeout
        self.node = node

    def fetch(self) -> Lease | NotCapped:
        # Imported here, not at start: only a node that runs the agent pays for requests
        # (about 4 MiB of the exporter's 40 MiB target, tests/test_exporter_memory.py).
        import requests

        token = read_token(self.token_file)
        try:
            response = requests.get(
                self.url,
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
                timeout=self.timeout,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            raise LeaseUnavailable(f"cannot reach the decider at {self.url}: {exc}") from exc
        with response:
            return self._answer(response.status_code, response.content)

    def _answer(self, status: int, body: bytes) -> Lease | NotCapped:
        try:
            data: Any = json.loads(body)
        except ValueError:
            data = None
        if status == 404:
            # The contract's `{"error": …}` (or FastAPI's `{"detail": …}`), naming the node;
            # a route that does not exist answers `{"detail": "Not Found"}`: a failure.
            message = data.get("error") or data.get("detail") if isinstance(data, dict) else None
            if isinstance(message, str) and message != "Not Found":
                return NotCapped(message)
            raise LeaseUnavailable(
                f"{self.url} answered 404 without the decider's answer (a wrong decider_url,"
                " or a decider without the capping API?)"
            )
        said = ""
        if isinstance(data, dict) and isinstance(data.get("error") or data.get("detail"), str):
            said = f": {str(data.get('error') or data.get('detail'))[:300]}"
        if status in (401, 403):
            raise LeaseUnavailable(
                f"the decider refused the token ({status}): check capping.token_file{said}"
            )
        if status != 200:
            raise LeaseUnavailable(f"the decider answered {status}{said}")
        try:
            lease = Lease.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}"
                for error in exc.errors()
            )
            raise LeaseUnavailable(f"the decider's answer is not a lease: {problems}") from exc
        if lease.node != self.node:
            raise LeaseUnavailable(f"the decider sent the lease of {lease.node!r}, not ours")
        return lease


@dataclass(frozen=True, slots=True)
class Target:
    """What every GPU should hold: `watts`, or None for the card's default limit
    (restored only on the GPUs the agent capped)."""

    watts: float | None
    why: str  # for the change's log line: changes with every lease
    what: str = "the lease's cap"  # for a refusal's, logged once per change of its text


@dataclass(frozen=True, slots=True)
class Applied:
    """What one pass over the GPUs left: each capped GPU's limit, and the problems."""

    caps: dict[str, tuple[int, float]]  # uuid -> (index, W) of GPUs the agent holds capped
    refused: dict[str, str]  # uuid or "" -> why a limit was refused
    nvml: dict[str, str]  # uuid or "" -> the NVML error


class Actuator:
    """Sets the GPUs' power limits through the process's NVML; every change is logged."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml

    def apply(self, target: Target, capped: dict[str, float]) -> Applied:
        """Bring every GPU to `target`; `capped` (uuid -> W the agent set) is updated."""
        caps: dict[str, tuple[int, float]] = {}
        refused: dict[str, str] = {}
        failed: dict[str, str] = {}
        try:
            with self.nvml.session(NVML_USER) as api:
                for index in range(api.nvmlDeviceGetCount()):
                    uuid = ""
                    try:
                        handle = api.nvmlDeviceGetHandleByIndex(index)
                        uuid = api.nvmlDeviceGetUUID(handle)
                        outcome = self._apply_one(api, handle, index, uuid, target, capped)
                    except api.NVMLError as exc:
                        self.nvml.forget_if_driver_gone(exc)
                        failed[uuid or f"gpu{index}"] = f"GPU {index}: {nvml_reason(api, exc)}"
                        if uuid in capped:  # as far as the agent knows, what it set before
                            caps[uuid] = (index, capped[uuid])
                        continue
                    if isinstance(outcome, str):
                        refused[uuid] = outcome
                        if uuid in capped:  # it keeps the limit the agent set before
                            caps[uuid] = (index, capped[uuid])
                    elif outcome is not None:
                        caps[uuid] = (index, outcome)
        except (NvmlAbsent, NvmlUnloadable) as exc:
            failed[""] = str(exc)
        except Exception as exc:  # NVML init failing: reported, never raised into the loop
            failed[""] = f"NVML: {exc}"
        return Applied(caps, refused, failed)

    def _apply_one(
        self, api: Any, handle: Any, index: int, uuid: str, target: Target, capped: dict[str, float]
    ) -> float | str | None:
        """The W the GPU is held at, None when the agent leaves it alone, or a refusal."""
        current_mw = api.nvmlDeviceGetPowerManagementLimit(handle)
        if target.watts is None:
            if uuid not in capped:
                return None  # never capped by the agent: not its to restore
            wanted_mw = api.nvmlDeviceGetPowerManagementDefaultLimit(handle)
        else:
            wanted_mw = round(target.watts * 1000)
            low_mw, high_mw = api.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            if not low_mw <= wanted_mw <= high_mw:
                return (
                    f"GPU {index} ({uuid}): refusing {watts(wanted_mw)}: outside the card's"
                    f" range {watts(low_mw)} to {watts(high_mw)}; keeping {watts(current_mw)}"
                    f" ({target.what})"
                )
        if wanted_mw != current_mw:
            api.nvmlDeviceSetPowerManagementLimit(handle, wanted_mw)
            log.info(
                "capping: GPU %d (%s) power limit %s -> %s: %s",
                index,
                uuid,
                watts(current_mw),
                watts(wanted_mw),
                target.why,
            )
        if target.watts is None:
            capped.pop(uuid, None)
            return None
        capped[uuid] = wanted_mw / 1000
        return wanted_mw / 1000


def watts(milliwatts: float) -> str:
    return f"{milliwatts / 1000:g} W"


def nvml_reason(api: Any, exc: Exception) -> str:
    if getattr(exc, "value", None) == api.NVML_ERROR_NO_PERMISSION:
        return (
            f"NVML refused to set the power limit ({exc}): setting a GPU's limit needs root;"
            " the exporter runs without it"
        )
    return f"NVML: {exc}"


@dataclass(frozen=True, slots=True)
class AgentView:
    """What the agent publishes; replaced whole after each pass, never mutated."""

    state: str = "off"
    failing: frozenset[str] = frozenset()
    caps: dict[str, tuple[int, float]] = field(default_factory=dict)
    lease_expiry: float | None = None
    safe_watts: float | None = None
    last_renewal: float | None = None


class CappingAgent:
    """The agent's thread, its lease and what it applied. `fetch` and `clock` are
    injectable (tests); main() builds it with the process's NVML."""

    def __init__(
        self,
        config: CappingConfig,
        node: str,
        nvml: Nvml,
        *,
        fetch: Callable[[], Lease | NotCapped] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.node = node
        self.fetch = fetch or DeciderClient(config, node).fetch
        self.actuator = Actuator(nvml)
        self.nvml = nvml
        self.clock = clock
        self.decider_guard = HangGuard("capping: the decider", config.timeout)
        self.nvml_guard = HangGuard("capping: NVML", config.nvml_deadline)
        self.lease: Lease | None = None
        self.received_at: float | None = None  # None: a lease saved by an earlier process
        self.last_renewal: float | None = None
        self.capped: dict[str, float] = {}
        self.view = AgentView()
        self._decider_problem = ""
        self._state_unwritable = False
        self._logged: dict[str, str] = {}  # problem key -> its last logged text
        self._thread: threading.Thread | None = None
        self._load_state()

    # --- the state file ---------------------------------------------------------------------

    def _load_state(self) -> None:
        path = self.config.state_file
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.error(
                "capping: the state file %s cannot be read (%s): no safe cap until the first lease",
                path,
                exc,
            )
            return
        try:
            lease = data.get("lease")
            self.lease = None if lease is None else Lease.model_validate(lease)
            self.capped = {str(uuid): float(w) for uuid, w in dict(data.get("capped", {})).items()}
        except (AttributeError, TypeError, ValueError) as exc:  # ValidationError is one
            log.error(
                "capping: the state file %s is not the agent's (%s): no safe cap until"
                " the first lease",
                path,
                exc,
            )
            self.lease, self.capped = None, {}
            return
        if self.lease is not None and self.lease.node != self.node:
            log.error(
                "capping: the state file %s holds the lease of %r, not of %r: ignored",
                path,
                self.lease.node,
                self.node,
            )
            self.lease = None

    def _save_state(self) -> None:
        """Write the lease and the capped GPUs to a temporary file, then rename it over the
        state file: a crash leaves the old file or the new, never half of one."""
        path = self.config.state_file
        data = {
            "node": self.node,
            "lease": None if self.lease is None else self.lease.model_dump(),
            "capped": self.capped,
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as handle:
                    json.dump(data, handle, indent=1)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            self._problem("state", f"cannot write the state file {path}: {exc}")
            self._state_unwritable = True
        else:
            self._problem("state", "")
            self._state_unwritable = False

    # --- one pass ---------------------------------------------------------------------------

    def expiry(self) -> float | None:
        """When the lease held runs out; None without a lease received by this process."""
        if self.lease is None or self.received_at is None:
            return None
        return min(self.lease.issued_at, self.received_at) + self.lease.lease_seconds

    def start_safe(self) -> None:
        """At start, before the first lease: the safe cap of the lease saved, if any."""
        if self.lease is not None:
            self._apply(
                Target(
                    self.lease.safe_gpu_limit_watts,
                    "safe cap of the last lease saved, at start before the first lease",
                    "the safe cap",
                ),
                "safe",
            )

    def cycle(self) -> float:
        """Ask for a lease, apply what follows; the seconds until the next pass."""
        not_capped: NotCapped | None = None
        renewed = False
        try:
            answer = self.decider_guard.call(self.fetch)
        except (LeaseUnavailable, Hung) as exc:
            self._decider_failed(str(exc))
        except Exception as exc:  # whatever went wrong, it is a renewal that did not happen
            self._decider_failed(f"{type(exc).__name__}: {exc}")
        else:
            self._decider_failed("")
            now = self.clock()
            if isinstance(answer, NotCapped):
                not_capped = answer
                if self.lease is not None:
                    self.lease, self.received_at = None, None
                    self._save_state()
            else:
                renewed = True
                changed = answer != self.lease
                self.lease, self.received_at, self.last_renewal = answer, now, now
                late = now - answer.issued_at >= answer.lease_seconds
                self._problem(
                    "clock",
                    f"the lease issued at {answer.issued_at:.0f} arrived already run out (this"
                    f" node's clock is {now - answer.issued_at:.0f} s past it): is the node's"
                    " clock or the decider's wrong?"
                    if late
                    else "",
                )
                if changed:
                    self._save_state()
        now = self.clock()
        expiry = self.expiry()
        if not_capped is not None:
            self._apply(Target(None, f"the decider: {not_capped.message}"), "off")
        elif self.lease is not None and expiry is not None and now < expiry:
            lease = self.lease
            until = time.strftime("%H:%M:%S", time.localtime(expiry))
            why = f"lease until {until}: {lease.reason or 'no reason given'}"
            self._apply(Target(lease.gpu_limit_watts, why), "leased")
        elif self.lease is not None:
            ran_out = (
                "before this start"
                if expiry is None
                else f"at {time.strftime('%H:%M:%S', time.localtime(expiry))}"
            )
            why = (
                f"safe cap: no lease renewed ({self._decider_problem or 'none yet'});"
                f" the last one ran out {ran_out}"
            )
            self._apply(Target(self.lease.safe_gpu_limit_watts, why, "the safe cap"), "safe")
        else:
            self._publish("off", self.view.caps, None)  # nothing leased yet, nothing saved
        return self._next_wait(renewed, now)

    def _next_wait(self, renewed: bool, now: float) -> float:
        if self.lease is None:
            return self.config.retry
        every = self.lease.lease_seconds / 3
        expiry = self.expiry()
        if not renewed and expiry is not None and now < expiry:
            return max(0.05, min(every, expiry - now))  # wake when the lease runs out
        return every

    def _apply(self, target: Target, state: str) -> None:
        # On a copy: a call abandoned past its deadline may still return, later, into it.
        capped = dict(self.capped)
        try:
            applied = self.nvml_guard.call(lambda: self.actuator.apply(target, capped))
        except Hung as exc:
            applied = Applied(self.view.caps, {}, {"": str(exc)})
        else:
            if capped != self.capped:
                self.capped = capped
                self._save_state()
        self._report(applied)
        self._publish(state, applied.caps, applied)

    def _report(self, applied: Applied) -> None:
        problems = {f"refused:{k}": v for k, v in applied.refused.items()}
        problems |= {f"nvml:{k}": v for k, v in applied.nvml.items()}
        for key in [k for k in self._logged if k.startswith(("refused:", "nvml:"))]:
            if key not in problems:
                self._problem(key, "")
        for key, text in problems.items():
            self._problem(key, text)

    def _problem(self, key: str, text: str) -> None:
        """Log a problem once per change of its text, and its end."""
        before = self._logged.get(key, "")
        if text == before:
            return
        if text:
            log.error("capping: %s", text)
            self._logged[key] = text
        else:
            log.info("capping: resolved: %s", before)
            del self._logged[key]

    def _decider_failed(self, reason: str) -> None:
        if reason != self._decider_problem:
            if reason:
                log.warning("capping: no lease: %s", reason)
            else:
                log.info("capping: the decider answers again")
        self._decider_problem = reason

    def _publish(
        self, state: str, caps: dict[str, tuple[int, float]], applied: Applied | None
    ) -> None:
        failing = set()
        if self._decider_problem:
            failing.add("decider")
        if self._state_unwritable:
            failing.add("state")
        if applied is not None:
            if applied.refused:
                failing.add("refused")
            if applied.nvml:
                failing.add("nvml")
        else:
            failing |= set(self.view.failing) - {"decider", "state"}
        self.view = AgentView(
            state=state,
            failing=frozenset(failing),
            caps=dict(caps),
            lease_expiry=self.expiry(),
            safe_watts=None if self.lease is None else self.lease.safe_gpu_limit_watts,
            last_renewal=self.last_renewal,
        )

    # --- what /metrics serves ---------------------------------------------------------------

    def samples(self) -> list[Sample]:
        view = self.view
        samples = [
            Sample("llmgw_capping_agent_state", 1 if view.state == state else 0, {"state": state})
            for state in STATES
        ]
        samples.append(Sample("llmgw_capping_agent_up", 0 if view.failing else 1))
        samples += [
            Sample("llmgw_capping_agent_failing", 1, {"reason": reason})
            for reason in FAILURES
            if reason in view.failing
        ]
        samples += [
            Sample("llmgw_gpu_power_cap_watts", cap, {"gpu": str(index), "uuid": uuid})
            for uuid, (index, cap) in sorted(view.caps.items(), key=lambda item: item[1][0])
        ]
        for metric, value in (
            ("llmgw_capping_lease_expiry_timestamp_seconds", view.lease_expiry),
            ("llmgw_capping_safe_gpu_limit_watts", view.safe_watts),
            ("llmgw_capping_last_renewal_timestamp_seconds", view.last_renewal),
        ):
            if value is not None and math.isfinite(value):
                samples.append(Sample(metric, value))
        return samples

    # --- the thread -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        self.start_safe()
        while not stop.is_set():
            try:
                wait = self.cycle()
            except Exception:  # a bug here must not end capping silently: logged, retried
                log.exception("capping: a pass failed; trying again")
                wait = self.config.retry
            stop.wait(wait)

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(
            target=self.run, args=(stop,), name="capping-agent", daemon=True
        )
        self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """After `stop` is set: wait a little for the pass in flight, then let NVML go.

        A pass still waiting on the decider or on NVML is left to its daemon thread (its
        deadlines end it): the process is ending, and SIGTERM must not wait on a decider.
        """
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("capping: stopping with a pass still waiting on the decider or NVML")
                return
        if not self.nvml_guard.busy:
            self.nvml.release(NVML_USER)
