"""The facility file (`facility.yaml`): domains with budgets and thresholds (DESIGN.md §5, §6).

```yaml
defaults:
  margin: 0.10            # refuse past cap * (1 - margin)
  derating: 0.80          # a feed carries at most rating * derating
  thresholds: {inlet_warm_c: 27, inlet_hot_c: 32}
domains:
  rack/r12-07:
    feeds: [{pdu: r12-07-a, rating_watts: 17300}, {pdu: r12-07-b, rating_watts: 17300}]
    other_watts: 900      # switches, storage: draw that no node reports
  pdu/r12-07-a: {cap_watts: 13840}
  row/12: {cap_watts: 120000, thresholds: {inlet_warm_c: 26}}
profiles:
  llama-70b-tp4: {gpus: 4, power_watts: 2900}
node_share_watts: 350
cpu_watts_per_core: {default: 6}
mode: observe             # observe | enforce, or per concern: {power: enforce, thermal: observe}
shedding: {enabled: false, hot_for: 10m, interval: 5m}
classes: [batch, interactive]   # lowest first: shed first (decider.shedding)
models:
  llama-70b: {class: interactive, minimum_replicas: 2, critical: true}
signals:
  inlet_temp_c: {query: 'max by (rack) (dcim_rack_inlet_temperature_celsius)', domain_label: rack}
```

Everything the facility team decides (budgets, derating, thresholds: DESIGN.md §9)
comes from this file and nothing else; docs/facility.md explains every key to
them. The rules for what the file means live here as methods, so the decider
and `llmgw-facility rules render` cannot disagree:

- a domain's cap (`Domain.cap`, `Facility.cap_watts`): see `Domain.cap`;
- the thresholds in force for a domain (`Facility.thresholds`): the domain's
  own, else `defaults.thresholds`, else the built-in defaults of docs/rules.md;
- a domain is named `kind/name` (docs/rules.md's naming rule): the name is the
  label value exactly as the nodes declare it in agent.yaml.

A bad file is refused whole, every problem at once with its file and line
(`llmgw_common.yamlfile.load_model`). This module reads the file and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, cast, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from decider import names, promql
from llmgw_common.yamlfile import Duration, load_model

Kind = Literal["site", "room", "row", "rack", "pdu"]
KINDS: tuple[Kind, ...] = get_args(Kind)
Mode = Literal["observe", "enforce"]
#: What a mode is set for (decider.placement.rules: each rule serves one, or `always`).
CONCERNS: tuple[str, ...] = ("power", "thermal")

#: Built-in thresholds (docs/rules.md): what the committed rules use for a domain without an
#: override, and what this file falls back to when it sets none.
BUILTIN_THRESHOLDS: dict[str, float] = {
    "inlet_warm_c": 27.0,  # ASHRAE A1 recommended upper limit
    "inlet_hot_c": 32.0,  # ASHRAE A1 allowable upper limit
    "throttled_hot_ratio": 0.25,
    "gpu_slowdown_margin_c": 5.0,
}
#: The file's threshold keys and the `threshold` label values of the rules' series.
THRESHOLD_LABELS: dict[str, str] = {
    "inlet_warm_c": "inlet_warm_celsius",
    "inlet_hot_c": "inlet_hot_celsius",
    "throttled_hot_ratio": "throttled_hot_ratio",
    "gpu_slowdown_margin_c": "gpu_slowdown_margin_celsius",
}
#: Built-in shares of its racks that make a row, room or site hot (more than `racks_hot_share`
#: of them hot) or warm (more than `racks_warm_share` warm or hot) (docs/rules.md "Kind, signals,
#: condition"): any warm rack makes its row warm; a room or site takes more than half.
BUILTIN_RACK_SHARES: dict[str, dict[str, float]] = {
    "row": {"racks_hot_share": 0.5, "racks_warm_share": 0.0},
    "room": {"racks_hot_share": 0.5, "racks_warm_share": 0.5},
    "site": {"racks_hot_share": 0.5, "racks_warm_share": 0.5},
}
#: Above this an inlet threshold is most likely written in °F.
MAX_INLET_C = 60.0
#: No budget, rating or draw of the file is larger: ten times the largest campus there is.
MAX_WATTS = 1e10

_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _name_from_yaml(value: Any) -> Any:
    # YAML reads `pdu: 12` as an int; a name is text either way (as in agent.yaml).
    return str(value) if type(value) in (int, float) else value


def check_name(name: str, kind: str | None = None) -> str:
    """A domain or feed name: a label value as agent.yaml writes it, usable in `kind/name`."""
    if not name:
        raise ValueError("the name is empty")
    if name != name.strip():
        raise ValueError(f"{name!r} starts or ends with a space")
    if "/" in name:
        raise ValueError(f"{name!r} contains '/', which separates kind from name")
    if any(ord(char) < 32 or ord(char) == 127 for char in name):
        raise ValueError(f"{name!r} contains a control character")
    if kind == "pdu" and "," in name:
        raise ValueError(f"{name!r} contains ',', which separates feeds in llmgw.io/pdu")
    # And what the API can name in a URL (`rack/..` could not be): decider.names.
    return names.check_name(name)


class DomainRef(NamedTuple):
    """A domain's identity: `rack/r12-07` is DomainRef("rack", "r12-07")."""

    kind: Kind
    name: str

    @classmethod
    def parse(cls, key: str) -> DomainRef:
        """`kind/name`, kind one of KINDS; raises ValueError saying what is wrong."""
        kind, slash, name = key.partition("/")
        if not slash or kind not in KINDS:
            raise ValueError(f"{key!r} is not kind/name with kind one of {', '.join(KINDS)}")
        return cls(cast(Kind, kind), check_name(name, kind))

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def _check_domain_key(key: str) -> str:
    DomainRef.parse(key)
    return key


def _check_label_name(label: str) -> str:
    if not _LABEL_NAME.match(label):
        raise ValueError(f"{label!r} is not a Prometheus label name")
    return label


def _check_query(query: str) -> str:
    promql.check(query)
    return query


Name = Annotated[str, BeforeValidator(_name_from_yaml), AfterValidator(check_name)]
#: `kind/name`, e.g. `rack/r12-07`, `row/hall-b.12`.
DomainKey = Annotated[str, AfterValidator(_check_domain_key)]
LabelName = Annotated[str, AfterValidator(_check_label_name)]
Query = Annotated[str, AfterValidator(_check_query)]


class _Model(BaseModel):
    # Strict: a quoted '0.1' is text and `true` is not 1 (a typo is seen, not guessed around);
    # YAML's plain ints are numbers where a field takes floats. Each tuple field is
    # `strict=False`, for a YAML list to be read as a tuple; its items keep their own types.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Thresholds(_Model):
    """Thresholds as written; a key left out is None and falls back (see `Facility.thresholds`)."""

    inlet_warm_c: float | None = None
    inlet_hot_c: float | None = None
    throttled_hot_ratio: float | None = Field(None, gt=0, le=1)
    gpu_slowdown_margin_c: float | None = Field(None, ge=0, le=50)

    @field_validator("inlet_warm_c", "inlet_hot_c")
    @classmethod
    def _celsius(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value <= MAX_INLET_C:
            hint = " (°F? thresholds are °C)" if value > MAX_INLET_C else ""
            raise ValueError(f"{value:g} °C is not an inlet temperature{hint}")
        return value

    def written(self) -> dict[str, float]:
        """The thresholds this section sets, by file key."""
        return {key: value for key, value in self.model_dump().items() if value is not None}


class ResolvedThresholds(_Model):
    """The thresholds in force for one domain, every one of them known."""

    inlet_warm_c: float
    inlet_hot_c: float
    throttled_hot_ratio: float
    gpu_slowdown_margin_c: float


def _error(loc: tuple[str, ...], message: str, value: Any) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError("facility", message),  # no braces: nothing to format
        loc=loc,
        input=value,
    )


def _order_problem(*layers: tuple[str, dict[str, float]]) -> str | None:
    """Warm must be below hot once every layer (lowest first, `(where, thresholds)`) applies."""
    found: dict[str, tuple[float, str]] = {}
    for where, thresholds in layers:
        found |= {key: (value, where) for key, value in thresholds.items()}
    (warm, warm_from), (hot, hot_from) = found["inlet_warm_c"], found["inlet_hot_c"]
    if warm < hot:
        return None
    return f"inlet_warm_c {warm:g}{warm_from} must be below inlet_hot_c {hot:g}{hot_from}"


_BUILTIN = (" (built-in)", BUILTIN_THRESHOLDS)


class KindDefaults(_Model):
    """Defaults for every domain of one kind (`defaults.kinds.row`): its thresholds, over the
    site-wide ones, and for a row, room or site the shares of its racks that make it hot or
    warm (`BUILTIN_RACK_SHARES` where left out)."""

    racks_hot_share: float | None = Field(None, ge=0, lt=1)
    racks_warm_share: float | None = Field(None, ge=0, lt=1)
    thresholds: Thresholds = Thresholds()

    def written_shares(self) -> dict[str, float]:
        """The shares this section sets, by file key (= the rules' `threshold` label)."""
        shares = self.model_dump(include={"racks_hot_share", "racks_warm_share"})
        return {key: value for key, value in shares.items() if value is not None}


class Defaults(_Model):
    """Site-wide figures: `margin` and `derating` apply to every domain, `thresholds` to every
    domain that does not set its own, `kinds` to every domain of a kind over `thresholds`."""

    margin: float = Field(0.10, ge=0, lt=1)
    derating: float = Field(0.80, gt=0, le=1)
    thresholds: Thresholds = Thresholds()
    kinds: dict[Kind, KindDefaults] = {}

    @field_validator("thresholds")
    @classmethod
    def _warm_below_hot(cls, thresholds: Thresholds) -> Thresholds:
        problem = _order_problem(_BUILTIN, ("", thresholds.written()))
        if problem:
            raise ValueError(problem)
        return thresholds

    @model_validator(mode="after")
    def _kinds_consistent(self) -> Defaults:
        problems: list[InitErrorDetails] = []
        for kind, defaults in self.kinds.items():
            if kind not in BUILTIN_RACK_SHARES and defaults.written_shares():
                problems.append(
                    _error(
                        ("kinds", kind),
                        f"a {kind} has no racks: racks shares are for a row, room or site",
                        defaults.written_shares(),
                    )
                )
            problem = _order_problem(
                _BUILTIN,
                (" (from defaults)", self.thresholds.written()),
                ("", defaults.thresholds.written()),
            )
            if problem:
                problems.append(_error(("kinds", kind, "thresholds"), problem, kind))
        if problems:
            raise ValidationError.from_exception_data(type(self).__name__, problems)
        return self


#: The defaults of the file being validated, for its domains' checks (see Facility).
_DEFAULTS: ContextVar[Defaults | None] = ContextVar("facility_defaults", default=None)


class Feed(_Model):
    pdu: Annotated[str, BeforeValidator(_name_from_yaml)]
    rating_watts: float = Field(gt=0, le=MAX_WATTS)

    @field_validator("pdu")
    @classmethod
    def _pdu_name(cls, pdu: str) -> str:
        return check_name(pdu, "pdu")


#: The phases of a three-phase PDU, as the facility file names them (docs/facility.md).
PHASES: tuple[str, ...] = ("L1", "L2", "L3")


def _check_phase(name: str) -> str:
    if name not in PHASES:
        raise ValueError(f"{name!r} is not a phase: L1, L2 or L3")
    return name


PhaseName = Annotated[str, BeforeValidator(_name_from_yaml), AfterValidator(_check_phase)]


class Phase(_Model):
    """One phase of a three-phase PDU: its breaker's rating, derated as a feed is, and the
    draw on it that no node reports (None: see `Domain.phase_other_watts`)."""

    rating_watts: float = Field(gt=0, le=MAX_WATTS)
    other_watts: float | None = Field(None, ge=0, le=MAX_WATTS)


class Domain(_Model):
    """One declared domain: its budget, what no node reports, and its own thresholds.

    Inside a Facility it is also checked against the file's defaults: its warm threshold
    below its hot one, and `other_watts` below its cap.
    """

    cap_watts: float | None = Field(None, gt=0, le=MAX_WATTS)
    feeds: tuple[Feed, ...] = Field((), strict=False)
    #: This domain's own margin and derating; None: the site's (`defaults`).
    margin: float | None = Field(None, ge=0, lt=1)
    derating: float | None = Field(None, gt=0, le=1)
    #: Shedding for this domain: None follows `shedding.enabled`; false keeps it off where the
    #: site has it on; true turns it on here alone (decider.shedding).
    shedding: bool | None = None
    other_watts: float = Field(0.0, ge=0, le=MAX_WATTS)
    #: The site's meter for this domain (signals.power_watts) already includes `other_watts`:
    #: the rules take them off the meter, so the decider's load counts them once.
    measured_includes_other: bool = False
    thresholds: Thresholds = Thresholds()
    #: A three-phase PDU's phases (only on `pdu/…`): each one a limit of its own.
    phases: dict[PhaseName, Phase] = {}
    #: Admit against the predicted peak (`Facility.oversubscription`) instead of the sum of
    #: estimates, with GPU capping as the safety net (docs/facility.md "Oversubscription").
    oversubscribe: bool = False

    @field_validator("feeds")
    @classmethod
    def _one_entry_per_feed(cls, feeds: tuple[Feed, ...]) -> tuple[Feed, ...]:
        names = [feed.pdu for feed in feeds]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"feed {', '.join(repeated)} is listed more than once")
        return feeds

    def feed_cap_watts(self, derating: float) -> float | None:
        """What the feeds can carry: the smallest rating * derating; None without feeds."""
        if not self.feeds:
            return None
        return min(feed.rating_watts for feed in self.feeds) * derating

    def cap(self, derating: float) -> float | None:
        """The domain's cap in watts, or None: a domain with no budget.

        - `feeds` alone: the smallest feed's rating * derating, never the sum. A dual-fed
          rack must survive the loss of either feed, and then one feed carries it all.
        - `cap_watts` alone: as given, already derated (the facility team's figure).
        - both: the smaller of the two. `cap_watts` may hold a domain below what its feeds
          carry (cooling, a contract), never above: the feeds are the physical limit.
        """
        caps = [cap for cap in (self.cap_watts, self.feed_cap_watts(derating)) if cap is not None]
        return min(caps) if caps else None

    def phase_other_watts(self, phase: str) -> float:
        """What no node reports on the phase. Where any phase sets `other_watts`, each phase
        counts its own (0 where it sets none); where none does, the PDU's whole
        `other_watts` counts on every phase: nobody said on which it is, and the safe side
        is all of them."""
        if any(declared.other_watts is not None for declared in self.phases.values()):
            declared = self.phases.get(phase)
            return (declared.other_watts or 0.0) if declared is not None else 0.0
        return self.other_watts

    @model_validator(mode="after")
    def _consistent_with_defaults(self) -> Domain:
        defaults = _DEFAULTS.get()
        if defaults is None:  # validated on its own, or the defaults are refused
            return self
        problems: list[InitErrorDetails] = []
        written = self.thresholds.written()
        if written.keys() & {"inlet_warm_c", "inlet_hot_c"}:
            problem = _order_problem(
                _BUILTIN, (" (from defaults)", defaults.thresholds.written()), ("", written)
            )
            if problem:
                problems.append(_error(("thresholds",), problem, written))
        derating = defaults.derating if self.derating is None else self.derating
        cap = self.cap(derating)
        if cap is not None and self.other_watts >= cap:
            problems.append(
                _error(
                    ("other_watts",),
                    f"other_watts {self.other_watts:g} leaves no room under the cap of {cap:g} W",
                    self.other_watts,
                )
            )
        if self.oversubscribe and cap is None:
            problems.append(
                _error(
                    ("oversubscribe",),
                    "no budget to oversubscribe: give the domain cap_watts or feeds",
                    True,
                )
            )
        problems += self._phase_problems(derating)
        if problems:
            raise ValidationError.from_exception_data(type(self).__name__, problems)
        return self

    def _phase_problems(self, derating: float) -> list[InitErrorDetails]:
        if not self.phases:
            return []
        problems: list[InitErrorDetails] = []
        absent = [phase for phase in PHASES if phase not in self.phases]
        if absent:
            problems.append(
                _error(
                    ("phases",),
                    f"a three-phase PDU lists L1, L2 and L3; {', '.join(absent)} "
                    f"{'is' if len(absent) == 1 else 'are'} missing",
                    sorted(self.phases),
                )
            )
        for phase, declared in self.phases.items():
            cap = declared.rating_watts * derating
            if declared.other_watts is not None and declared.other_watts >= cap:
                problems.append(
                    _error(
                        ("phases", phase, "other_watts"),
                        f"other_watts {declared.other_watts:g} leaves no room under phase "
                        f"{phase}'s cap of {cap:g} W (rating_watts × derating)",
                        declared.other_watts,
                    )
                )
        return problems


class Profile(_Model):
    """A replica's shape; `power_watts`, when given, is its draw (the operator's figure wins).

    `models`: the models this profile serves, so GET /v1/profiles/{model} lists it even while
    nothing measures it. `tokens_per_second_at_gpu_limit`: a replica's measured throughput at
    per-GPU power limits (watts → tokens/s, from a power-limit sweep), for the throughput a
    power cap would cost (decider.power_capping); never extrapolated past its points.
    """

    gpus: int = Field(ge=0)
    power_watts: float | None = Field(None, gt=0, le=MAX_WATTS)
    cpu_cores: float | None = Field(None, gt=0)
    models: tuple[Annotated[str, Field(min_length=1, max_length=256)], ...] = Field(
        (), strict=False
    )
    tokens_per_second_at_gpu_limit: dict[
        Annotated[float, Field(gt=0, le=5000)], Annotated[float, Field(ge=0)]
    ] = {}

    @model_validator(mode="after")
    def _estimable(self) -> Profile:
        if self.gpus == 0 and self.power_watts is None and self.cpu_cores is None:
            raise ValueError("a profile with no GPUs needs cpu_cores or power_watts")
        return self


#: A core's watts past this is a typo (a whole package's figure, or kW): the most per core of
#: a server part is about 44 W (an 8-core, 350 W Xeon).
MAX_WATTS_PER_CORE = 100.0
WattsPerCore = Annotated[float, Field(gt=0, le=MAX_WATTS_PER_CORE)]


class CpuWattsPerCore(_Model):
    """Watts per CPU core for CPU profiles (DESIGN.md §5): `default`, and a figure per CPU
    model, keyed on the model as the node's exporter publishes it (`llmgw_node_cpu_info`,
    from /proc/cpuinfo: `AMD EPYC 9654 96-Core Processor`, `ARM Neoverse-V2`), runs of
    whitespace counting as one space. A bare number means `default`.

    ```yaml
    cpu_watts_per_core: {default: 6, "AMD EPYC 9654 96-Core Processor": 3.7}
    ```
    """

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, WattsPerCore] = Field(init=False)

    default: WattsPerCore = 6.0

    @model_validator(mode="before")
    @classmethod
    def _bare_number_or_models(cls, data: Any) -> Any:
        if type(data) in (int, float):
            return {"default": data}
        if not isinstance(data, dict):
            return data
        models: dict[str, Any] = {}
        for key, value in data.items():
            name = " ".join(key.split()) if isinstance(key, str) else ""
            if not name or len(name) > 256:
                raise ValueError(
                    f"{key!r} is not a CPU model: the text of /proc/cpuinfo's `model name`"
                    " (llmgw_node_cpu_info's model label), 1-256 characters"
                )
            if name in models:
                raise ValueError(f"CPU model {name!r} is given twice")
            models[name] = value
        return models

    @property
    def models(self) -> dict[str, float]:
        """The per-model figures, `default` aside."""
        return dict(self.model_extra or {})

    def for_models(self, models: Iterable[str]) -> tuple[float, str | None]:
        """The watts per core of a node with these CPU models, and the model it is for: the
        largest figure this file gives one of them (a node of two models errs high), else
        `default` with None."""
        found = [(watts, name) for name in models if (watts := self.models.get(name))]
        if not found:
            return self.default, None
        return max(found)


def limit_watts(cap: float | None, margin: float) -> float | None:
    """Past this load a placement is refused: cap × (1 − margin); None: no budget. The one
    place the limit is worked out (decider.placement.states builds every domain's and
    phase's with it)."""
    return None if cap is None else cap * (1 - margin)


class Modes(_Model):
    """`mode` per concern, for a staged rollout (power budgets enforced while thermal is
    observed): each rule serves one concern (decider.placement.rules); a hold is always
    enforced."""

    power: Mode
    thermal: Mode

    def __str__(self) -> str:
        return f"power {self.power}, thermal {self.thermal}"


class Shedding(_Model):
    """Opt-in plans to move load off a domain `hot` for longer than `hot_for`, at most one
    replica per domain per `interval` (DESIGN.md §5)."""

    enabled: bool = False
    hot_for: Duration = 600.0
    interval: Duration = 300.0


#: The shortest lease of GPU limits: an agent renews at a third of it, and a renewal more
#: often than every ~2 s would put the decider's refresh on the node agents' path.
MIN_LEASE_S = 5.0


class Ladder(_Model):
    """The capping ladder of an oversubscribed domain (decider.capping.ladder), as shares of
    the domain's budget: past `first_threshold` the lowest class is capped, past
    `second_threshold` every class; a step is released after power has stayed below
    (threshold − `release_margin`) × budget for `hold`. `floor_gpu_watts`: no GPU is capped
    below it (None: the card's minimum alone). Admission on the predicted basis fills a
    domain to `admit_to` = first_threshold − `admission_headroom` of its limit, not to the
    limit nor to the first threshold (decider.placement.predicted_peak): a p99 leaves a
    domain filled to the ladder's line above it 1 % of the time by construction, capped.
    0.95 admission under 0.97/0.99 is what the simulated week supports
    (docs/oversubscription-week.md: at 0.90/0.97 the band under the limit was capped away;
    admission at the first threshold 0.95 itself lost 0.24-0.33 % of tokens to capping in
    three weeks, 2 points below it 0.01-0.04 %, with as many replicas or more)."""

    first_threshold: float = Field(0.97, gt=0, le=1)
    second_threshold: float = Field(0.99, gt=0, le=1)
    release_margin: float = Field(0.05, ge=0, lt=1)
    hold: Duration = 600.0
    floor_gpu_watts: float | None = Field(None, gt=0, le=5000)
    admission_headroom: float = Field(0.02, ge=0, lt=1)

    @property
    def admit_to(self) -> float:
        """The share of a domain's limit that admission on the predicted basis fills to."""
        return self.first_threshold - self.admission_headroom

    @model_validator(mode="after")
    def _ordered(self) -> Ladder:
        if not self.first_threshold < self.second_threshold:
            raise ValueError(
                f"first_threshold {self.first_threshold:g} must be below second_threshold "
                f"{self.second_threshold:g}: the lowest class is capped first"
            )
        if not self.release_margin < self.first_threshold:
            raise ValueError(
                f"release_margin {self.release_margin:g} must be below first_threshold "
                f"{self.first_threshold:g}: power could never go that far below it"
            )
        if not self.admission_headroom < self.first_threshold:
            raise ValueError(
                f"admission_headroom {self.admission_headroom:g} must be below first_threshold "
                f"{self.first_threshold:g}: admission would fill nothing"
            )
        return self


class Oversubscription(_Model):
    """Site-wide settings of oversubscription, used only by the domains that opt in
    (`Domain.oversubscribe`): the admission basis (the domain's measured power at
    `percentile` over `window`, today's rule with less than `min_history` of it), the
    capping ladder, and how long a node agent's lease of its GPU limits lasts."""

    percentile: float = Field(0.99, gt=0, le=1)
    window: Duration = 7 * 86400.0
    min_history: Duration = 86400.0
    ladder: Ladder = Ladder()
    lease: Duration = 60.0

    @model_validator(mode="after")
    def _history_within_window(self) -> Oversubscription:
        if self.min_history > self.window:
            raise ValueError(
                f"min_history {_seconds_text(self.min_history)} is longer than window "
                f"{_seconds_text(self.window)}: the window never holds that much history"
            )
        return self

    @field_validator("lease")
    @classmethod
    def _lease_long_enough(cls, seconds: float) -> float:
        if seconds < MIN_LEASE_S:
            raise ValueError(
                f"a lease of {seconds:g}s is shorter than {MIN_LEASE_S:g}s: agents renew at a "
                "third of it"
            )
        return seconds


def _seconds_text(seconds: float) -> str:
    """A duration as the file would write it: `7d`, `36h`, `90m`, `45s`."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


ClassName = Annotated[str, Field(min_length=1, max_length=64)]


class ModelSettings(_Model):
    """One model's shedding settings (DESIGN.md §5): its class (a name of `classes`), how
    many replicas it must keep running, and whether that minimum is never to be touched."""

    class_: ClassName | None = Field(None, alias="class")
    minimum_replicas: int = Field(0, ge=0, le=100_000)
    critical: bool = False


def _distinct_classes(classes: tuple[str, ...]) -> tuple[str, ...]:
    repeated = sorted({name for name in classes if classes.count(name) > 1})
    if repeated:
        raise ValueError(f"class {', '.join(repeated)} is listed more than once")
    return classes


class Signal(_Model):
    """A site reading mapped onto domains (DESIGN.md §6); rendered into recording rules.

    `kind` defaults to `domain_label` when that is a kind (`domain_label: rack` → racks).
    `stale_after`: a reading older than this is dropped; None keeps Prometheus' own
    staleness (a series ends on a failed scrape or after the 5-minute lookback).
    """

    query: Query
    domain_label: LabelName
    kind: Kind
    stale_after: Duration | None = None

    @model_validator(mode="before")
    @classmethod
    def _kind_from_label(cls, data: Any) -> Any:
        if isinstance(data, dict) and "kind" not in data:
            label = data.get("domain_label")
            if label in KINDS:
                return {**data, "kind": label}
            if isinstance(label, str) and _LABEL_NAME.match(label):
                raise ValueError(
                    f"kind is required: domain_label {label!r} is not one of {', '.join(KINDS)}"
                )
            # domain_label itself is refused below; a stand-in kind keeps that the one reason
            return {**data, "kind": KINDS[0]}
        return data

    @field_validator("stale_after")
    @classmethod
    def _at_least_a_second(cls, seconds: float | None) -> float | None:
        if seconds is not None and seconds < 1:
            raise ValueError(f"{seconds:g}s is shorter than any scrape interval; at least 1s")
        return seconds

    def bounded_query(self) -> str:
        """The query as the rules run it: every instant selector limited to `stale_after`."""
        if self.stale_after is None:
            return self.query
        return promql.bound_age(self.query, self.stale_after)


class PhaseSignal(Signal):
    """A site reading per phase of three-phase pdus (a metered PDU's per-phase active power):
    `phase_label` is the label of the query's result that holds the phase, `L1`, `L2` or
    `L3` as the facility file names them (docs/facility.md "Phases"). Only pdus have phases,
    so its kind is `pdu`."""

    phase_label: LabelName

    @field_validator("kind")
    @classmethod
    def _pdus_only(cls, kind: Kind) -> Kind:
        if kind != "pdu":
            raise ValueError(f"only a pdu has phases: kind {kind!r} is not pdu")
        return kind

    @model_validator(mode="after")
    def _two_labels(self) -> PhaseSignal:
        if self.phase_label == self.domain_label:
            raise ValueError(
                f"phase_label and domain_label are both {self.phase_label!r}: the pdu's name "
                "and its phase are two labels"
            )
        return self


class Signals(_Model):
    """The site's own readings; each one configured becomes one recording rule."""

    inlet_temp_c: Signal | None = None  # °C: the hottest reading per domain
    power_watts: Signal | None = None  # W: summed per domain
    cooling_alarm: Signal | None = None  # above 0 while a cooling unit is in alarm
    #: W per phase of a three-phase pdu, summed per pdu and phase (decider.placement.phases)
    phase_power_watts: PhaseSignal | None = None

    def configured(self) -> dict[str, Signal]:
        """The signals the file sets, by key, in the order above."""
        return {
            name: signal
            for name in type(self).model_fields
            if (signal := getattr(self, name)) is not None
        }


class NodeWiring(_Model):
    """How one node is wired: the phase of each three-phase PDU it draws from (`phases`,
    by PDU name as in `pdu/NAME`)."""

    phases: dict[Name, PhaseName] = {}


class Facility(_Model):
    """The whole facility file. Domains keep the file's order."""

    defaults: Defaults = Defaults()
    domains: dict[DomainKey, Domain] = {}
    profiles: dict[Annotated[str, Field(min_length=1)], Profile] = {}
    node_share_watts: float = Field(350.0, ge=0, le=MAX_WATTS)
    #: W per GPU for estimates when Prometheus knows no node's enforced GPU power limit
    #: (decider.placement.estimate); None: the node share alone, said in `missing`.
    fallback_gpu_watts: float | None = Field(None, gt=0, le=5000)
    cpu_watts_per_core: CpuWattsPerCore = CpuWattsPerCore()
    #: One mode for every concern, or one per concern (`Modes`); required in a file: `load`.
    mode: Annotated[
        Annotated[Mode, Tag("one")] | Annotated[Modes, Tag("per_concern")],
        Discriminator(lambda value: "one" if isinstance(value, str) else "per_concern"),
    ] = "observe"

    @field_validator("mode", mode="wrap")
    @classmethod
    def _one_mode_or_one_per_concern(
        cls, value: Any, handler: ValidatorFunctionWrapHandler
    ) -> Mode | Modes:
        # A word is one of the two modes, said as such, not as a failed match of `Modes`.
        if isinstance(value, str) and value not in get_args(Mode):
            raise PydanticCustomError(
                "literal_error",
                "Input should be 'observe' or 'enforce' (or one per concern: "
                "{power: observe|enforce, thermal: observe|enforce})",
            )
        return cast(Mode | Modes, handler(value))

    shedding: Shedding = Shedding()
    #: Site-wide settings for the domains that set `oversubscribe: true` (docs/facility.md).
    oversubscription: Oversubscription = Oversubscription()
    signals: Signals = Signals()
    #: Per node: the phase it draws from on each three-phase PDU (docs/facility.md "Phases").
    nodes: dict[Name, NodeWiring] = {}

    @model_validator(mode="after")
    def _phases_where_they_belong(self) -> Facility:
        problems: list[InitErrorDetails] = []
        for key, domain in self.domains.items():
            kind = key.partition("/")[0]
            if domain.phases and kind != "pdu":
                problems.append(
                    _error(
                        ("domains", key, "phases"),
                        f"only a pdu has phases; {key} is a {kind} (give them to its pdus)",
                        sorted(domain.phases),
                    )
                )
        for node, wiring in self.nodes.items():
            for pdu, phase in wiring.phases.items():
                domain = self.domain("pdu", pdu)
                if domain is None:
                    reason = f"no domain pdu/{pdu} in domains: declare it, with its phases"
                elif not domain.phases:
                    reason = f"pdu/{pdu} declares no phases: give it L1, L2 and L3"
                else:
                    continue
                problems.append(_error(("nodes", node, "phases", pdu), reason, phase))
        meter = self.signals.power_watts
        for key, domain in self.domains.items():
            kind = key.partition("/")[0]
            if domain.measured_includes_other and (meter is None or meter.kind != kind):
                problems.append(
                    _error(
                        ("domains", key, "measured_includes_other"),
                        f"only a site meter includes other_watts, and signals.power_watts "
                        f"{'is not set' if meter is None else f'meters {meter.kind}s'}: "
                        f"{key}'s power is its nodes' sum, which never includes them",
                        True,
                    )
                )
        if problems:
            raise ValidationError.from_exception_data(type(self).__name__, problems)
        return self

    #: Replica classes, lowest first: shedding moves the lowest class first (decider.shedding).
    classes: Annotated[tuple[ClassName, ...], AfterValidator(_distinct_classes)] = Field(
        (), strict=False
    )
    #: Per model (a replica's `model`): its class, minimum replicas and criticality.
    models: dict[Annotated[str, Field(min_length=1, max_length=256)], ModelSettings] = {}

    @model_validator(mode="after")
    def _model_classes_listed(self) -> Facility:
        problems = [
            _error(
                ("models", model, "class"),
                f"class {settings.class_!r} is not one of classes ({', '.join(self.classes)})"
                if self.classes
                else f"class {settings.class_!r} given but the file lists no classes",
                settings.class_,
            )
            for model, settings in self.models.items()
            if settings.class_ is not None and settings.class_ not in self.classes
        ]
        if problems:
            raise ValidationError.from_exception_data(type(self).__name__, problems)
        return self

    def class_rank(self, name: str | None) -> int:
        """A class's place in `classes`, lowest (shed first) 0; -1: no class, or one the
        file does not list (shed before every listed class: decider.shedding)."""
        if name is None or name not in self.classes:
            return -1
        return self.classes.index(name)

    @model_validator(mode="wrap")
    @classmethod
    def _defaults_first(cls, data: Any, handler: ModelWrapValidatorHandler[Facility]) -> Facility:
        # Each domain is checked against the defaults (derating, thresholds) as it is
        # validated, so its problems are reported with every other one, at their lines.
        defaults: Defaults | None = None
        raw = data.get("defaults", {}) if isinstance(data, dict) else None
        if isinstance(raw, dict):
            try:  # a bad margin does not matter to the domains' checks
                defaults = Defaults.model_validate({k: v for k, v in raw.items() if k != "margin"})
            except ValidationError:
                defaults = None  # the handler reports these, at their lines
        token = _DEFAULTS.set(defaults)
        try:
            return handler(data)
        finally:
            _DEFAULTS.reset(token)

    # --- what the file means ------------------------------------------------------------------

    def declared(self) -> list[tuple[DomainRef, Domain]]:
        """Every declared domain, in the file's order."""
        return [(DomainRef.parse(key), domain) for key, domain in self.domains.items()]

    def domain(self, kind: str, name: str) -> Domain | None:
        """The declared domain, or None: a domain the nodes name but the file does not."""
        return self.domains.get(f"{kind}/{name}")

    def cap_watts(self, kind: str, name: str) -> float | None:
        """The domain's cap (`Domain.cap` with its derating); None: no budget."""
        domain = self.domain(kind, name)
        return None if domain is None else domain.cap(self.derating(kind, name))

    def margin(self, kind: str, name: str) -> float:
        """The domain's margin: its own, else `defaults.margin`."""
        domain = self.domain(kind, name)
        own = None if domain is None else domain.margin
        return self.defaults.margin if own is None else own

    def derating(self, kind: str, name: str) -> float:
        """The domain's derating (its feeds' and phases'): its own, else `defaults.derating`."""
        domain = self.domain(kind, name)
        own = None if domain is None else domain.derating
        return self.defaults.derating if own is None else own

    def mode_of(self, concern: str) -> Mode:
        """The mode of one concern (`power`, `thermal`)."""
        return self.mode if isinstance(self.mode, str) else getattr(self.mode, concern)

    def enforced(self) -> frozenset[str]:
        """The concerns enforced, and `always` (a hold) with them. With every concern
        observed nothing is refused, a hold neither (DESIGN.md §5: observe mode computes and
        reports everything and refuses nothing); a hold is enforced as soon as one is."""
        concerns = {concern for concern in CONCERNS if self.mode_of(concern) == "enforce"}
        return frozenset({"always", *concerns} if concerns else ())

    def overall_mode(self) -> Mode:
        """`enforce` where any concern is enforced, else `observe` (the answers' `mode`)."""
        return "enforce" if self.enforced() else "observe"

    def sheds(self, kind: str, name: str) -> bool:
        """Whether shedding plans moves off this domain: its own `shedding`, else the site's
        `shedding.enabled`."""
        domain = self.domain(kind, name)
        own = None if domain is None else domain.shedding
        return self.shedding.enabled if own is None else own

    def written_thresholds(self, kind: str, name: str) -> dict[str, float]:
        """The thresholds the file sets for the domain: its own, else its kind's
        (`defaults.kinds`), else `defaults.thresholds`.

        Thresholds the file sets nowhere are absent: the rules' built-in defaults apply.
        """
        domain = self.domain(kind, name)
        own = domain.thresholds.written() if domain is not None else {}
        kind_defaults = self.defaults.kinds.get(cast(Kind, kind))
        of_kind = kind_defaults.thresholds.written() if kind_defaults is not None else {}
        return self.defaults.thresholds.written() | of_kind | own

    def rack_shares(self, kind: str) -> dict[str, float]:
        """A row's, room's or site's shares of racks (`racks_hot_share`, `racks_warm_share`):
        `defaults.kinds`, else the built-ins; empty for a rack or pdu, which has no racks."""
        builtin = BUILTIN_RACK_SHARES.get(kind)
        if builtin is None:
            return {}
        kind_defaults = self.defaults.kinds.get(cast(Kind, kind))
        return builtin | (kind_defaults.written_shares() if kind_defaults is not None else {})

    def thresholds(self, kind: str, name: str) -> ResolvedThresholds:
        """The thresholds in force: the domain's own, else defaults, else the built-ins."""
        return ResolvedThresholds(**(BUILTIN_THRESHOLDS | self.written_thresholds(kind, name)))

    def phased_pdus(self) -> dict[str, Domain]:
        """The declared pdus that have phases, by name."""
        return {
            key.partition("/")[2]: domain
            for key, domain in self.domains.items()
            if domain.phases and key.startswith("pdu/")
        }

    def node_phase(self, node: str, pdu: str) -> str | None:
        """The node's phase on the pdu, as the file gives it; None: not given."""
        wiring = self.nodes.get(node)
        return None if wiring is None else wiring.phases.get(pdu)


def load(path: Path) -> Facility:
    """Read and validate facility.yaml. Raises llmgw_common.yamlfile.ConfigError listing every
    problem as `path:line: field: reason`.

    `mode` is required in the file, so that an empty or truncated file is refused rather than
    read as "observe, no budgets" (issue 16); a Facility built in code (tests, the simulator)
    keeps observe as its default."""
    return load_model(path, Facility, required=("mode",))
