"""The week's engine: a site, its traffic, one admission policy, in 5-second steps.

No Prometheus, no HTTP: the path from a GPU's power to the ladder's cap on that GPU is
simulated as what it is, a chain of periodic samplers (`Latency`), each reading the last
value the stage before it wrote:

    GPU poll (5 s) -> scrape (15 s) -> node rules (30 s) -> domain rules (30 s)
        -> decider refresh (15 s, the ladder runs here) -> node agent's lease poll (lease/3)

Each stage has a phase of its own (drawn from the seed), so the lag varies from step to
step as it does for real; `Latency.worst_case_s` is its bound (115 s with the defaults).

**Policies.** `today`: a replica is admitted to a node while every domain of it (its rack,
its row) keeps max(reserved, measured) + other_watts + the replica's estimate within the
budget (DESIGN.md §5; the estimate is GPUs x the card's 700 W limit + the node share of
those GPUs). `oversubscribe`: helper A's rule, the decider's own pure function
(`decider.placement.predicted_peak.predicted_peak_fits`): with at least `min_history` of
measurements, max(the domain's measured power at `percentile` over `window`, sampled at
the rules' 30 s, and its measured power now) + the peaks of the replicas admitted less
than `min_history` ago + other_watts + the new replica's peak (its model's most on its
ML.ENERGY curve up to its serving configuration, plus the node share) within the admission
line (the ladder's first threshold less its admission headroom) x the budget, and the safe
per-GPU limit at the estimates not below the card's minimum; with less history, or a
domain whose ladder was capped for more than (1 - percentile) of the window's samples (the
capped guard, `predicted_peak.capped_guard`, fed the share of the 30-s samples at step 1
or 2, as the decider reads it from llmgw_decider_capping_step), today's rule. In both, a
domain the ladder has capped admits nothing (as a domain over its cap admits nothing
today). A replica on a node with no replica yet counts the rest of the node share on top
of its peak (`predicted_peak.first_on_node`, as the decider's placement does), and keeps
counting it while unseen (the decider's `Reservation.host_watts`): a node with no replica
is off here, and its host comes up with its first.
`WeekConfig.capped_guard`, `first_host` and `admit_to_limit` turn parts of the rule off:
the variants of docs/oversubscription-week.md.

**The ladder** is helper B's pure `decider.capping.ladder.advance`, fed as the decider's
driver (decider.capping.driver) feeds it: at each refresh, each oversubscribed domain's
power as the decider sees it (the chain's lag), its budget, every GPU of its powered nodes
under the node's highest class, and besides the GPUs its other_watts plus the node share
per node. Each agent applies to every GPU of its node the lowest cap among its domains.

**The scheduler** has more replicas to place than the site holds: every `place_every` it
offers the models in turn, each to the rack with the most room after it (DESIGN.md §5's
order), on that rack's fullest node that fits, until a full round places nothing.

**Traffic.** The k-th replica of a model gets the same traffic under both policies: its
trace (conversation or code), rotated by an offset of its own each hour, times the daily
shape of one of Google's PDUs (its own, from the 31 days starting at the run's start day),
scaled so that its busiest minutes of the trace at the day's peak fill its capacity.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from decider.capping import ladder
from decider.facility import Facility
from decider.placement.predicted_peak import (
    NewReplica,
    capped_guard,
    host_rest_watts,
    min_gpu_limit,
    predicted_peak_fits,
)
from llmgw_sim.week.data import (
    CLASSES,
    GOOGLE_STEP_SECONDS,
    H100,
    MODELS,
    TRACE_BIN_SECONDS,
    Traces,
)
from llmgw_sim.week.site import Domain, SiteSpec, domains, host_watts

Policy = Literal["today", "oversubscribe"]
STEP_S = 5.0
#: Tokens of the trace are counted in the bin of their request's arrival; a replica serves
#: them over the generation that follows (seconds): the demand is the mean over 30 s.
SMOOTH_BINS = 3
#: The quantile of a trace's per-minute demand that fills a replica's capacity at the day's
#: peak: replicas are provisioned for their busy minutes, not for their mean.
PROVISION_QUANTILE = 0.99


@dataclass(frozen=True)
class Latency:
    """The stages between a GPU's power and its cap, each a period in seconds
    (docs/exporter.md: sources poll every 5 s; examples/prometheus-scrape.yml: 15 s
    scrapes; rules/node.yml and rules/domain.yml: 30 s groups; docs/decider.md:
    refresh_interval 15 s; the agent renews its lease at lease / 3)."""

    poll_s: float = 5.0
    scrape_s: float = 15.0
    node_rules_s: float = 30.0
    domain_rules_s: float = 30.0
    refresh_s: float = 15.0
    agent_s: float = 20.0

    @property
    def worst_case_s(self) -> float:
        """The longest a change of power takes to reach a GPU's limit: each stage's
        period, one after the other."""
        return (
            self.poll_s
            + self.scrape_s
            + self.node_rules_s
            + self.domain_rules_s
            + self.refresh_s
            + self.agent_s
        )


@dataclass(frozen=True)
class WeekConfig:
    site: SiteSpec = field(default_factory=SiteSpec)
    days: float = 7.0
    seed: int = 1
    start_day: int = 0
    """The first of Google's 31 days the week follows."""
    place_every_s: float = 900.0
    ladder: bool = True
    """The oversubscribed policy's capping ladder; False shows what it saves the site from."""
    capped_guard: bool = True
    """The decider's capped guard (decider.placement.predicted_peak.capped_guard); False:
    admit on a percentile the caps held down (the rule before, a variant)."""
    first_host: bool = True
    """Count the rest of the node share for a replica on a node with no replica yet
    (`predicted_peak.first_on_node`); False: its own GPUs' share alone (the rule before, a
    variant)."""
    admit_to_limit: bool = False
    """Admit up to the budget itself, not to the admission line of it (the rule
    before, a variant)."""
    load_shape: tuple[tuple[float, float], ...] = ()
    """(seconds, factor) points: every replica's demand times the factor interpolated
    between them (a quiet spell, a heavy day), served up to capacity; () for none."""


@dataclass
class DomainStats:
    domain: Domain
    seconds_above_rating: float = 0.0
    events_above_cap: list[float] = field(default_factory=list)
    """Each event above rating x derating, its length in seconds."""
    seconds_capped: float = 0.0
    seconds_capped_all: float = 0.0
    """Seconds at the ladder's step 2 (every class capped)."""


@dataclass
class WeekResult:
    policy: Policy
    config: WeekConfig
    latency: Latency
    domains: list[Domain]
    stats: list[DomainStats]
    replicas: dict[str, int]
    gpus_used: int
    tokens_demanded: float
    tokens_served: float
    tokens_lost_capping: float
    lost_by_model: dict[str, float]
    served_by_model: dict[str, float]
    gpu_energy_joules: float
    """What the replicas' GPUs drew."""
    gpu_energy_withheld_joules: float
    """What they would have drawn more uncapped: the caps' effect, whatever the throughput
    model says it cost."""
    """Tokens lost to capping per model."""
    tokens_beyond_capacity: float
    energy_joules: float
    history: np.ndarray
    """Domain power (W) at each step: steps x domains, float32."""
    max_lag_s: float
    """The longest lag seen from a GPU reading to the decider's refresh, plus the agent's
    poll period: how late a cap reached a GPU at most in this run."""
    admitted_at: list[float]
    reserved_watts: np.ndarray
    """Per domain, the estimates of its replicas added up, with its other_watts."""

    @property
    def replicas_total(self) -> int:
        return sum(self.replicas.values())

    @property
    def tokens_per_joule(self) -> float:
        return self.tokens_served / self.energy_joules if self.energy_joules else 0.0

    @property
    def withheld_share(self) -> float:
        """The replicas' GPU energy the caps held back, of what they would have drawn."""
        uncapped = self.gpu_energy_joules + self.gpu_energy_withheld_joules
        return self.gpu_energy_withheld_joules / uncapped if uncapped else 0.0

    @property
    def capping_loss_share(self) -> float:
        """Tokens lost to capping over what the replicas would have served uncapped."""
        servable = self.tokens_served + self.tokens_lost_capping
        return self.tokens_lost_capping / servable if servable else 0.0


def _smoothed(tokens: np.ndarray) -> np.ndarray:
    """The trailing 30-s mean of a trace's tokens per second, circular."""
    return sum(np.roll(tokens, shift) for shift in range(SMOOTH_BINS)) / SMOOTH_BINS


def _provision_level(tokens: np.ndarray) -> float:
    """The trace's demand at its PROVISION_QUANTILE minute (tokens/s)."""
    per_minute = int(60 / TRACE_BIN_SECONDS)
    usable = len(tokens) // per_minute * per_minute
    minutes = tokens[:usable].reshape(-1, per_minute).mean(axis=1)
    return float(np.quantile(minutes, PROVISION_QUANTILE))


class _Chain:
    """When each stage last ran at or before a time: floor to its period and phase."""

    def __init__(self, latency: Latency, rng: np.random.Generator) -> None:
        self.latency = latency

        def phase(period: float) -> float:
            return float(rng.integers(0, int(period // STEP_S))) * STEP_S

        self.phases = {
            "poll": 0.0,
            "scrape": phase(latency.scrape_s),
            "node": phase(latency.node_rules_s),
            "domain": phase(latency.domain_rules_s),
            "refresh": phase(latency.refresh_s),
        }

    @staticmethod
    def _last(t: float, period: float, phase: float) -> float:
        return math.floor((t - phase) / period) * period + phase

    def seen_at(self, t: float) -> float:
        """The time of the GPU reading that the decider's refresh at `t` sees."""
        lat, ph = self.latency, self.phases
        t = self._last(t, lat.domain_rules_s, ph["domain"])
        t = self._last(t, lat.node_rules_s, ph["node"])
        t = self._last(t, lat.scrape_s, ph["scrape"])
        return self._last(t, lat.poll_s, ph["poll"])

    def is_refresh(self, t: float) -> bool:
        return self._last(t, self.latency.refresh_s, self.phases["refresh"]) == t


@dataclass
class _Replicas:
    """The admitted replicas, as arrays the step loop reads."""

    model: list[int] = field(default_factory=list)
    node: list[int] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    diurnal: list[int] = field(default_factory=list)
    trace: list[int] = field(default_factory=list)
    """0: conversation, 1: code."""
    offsets: list[np.ndarray] = field(default_factory=list)
    """Per hour of the run, where in its trace the replica's traffic starts (bins)."""
    admitted_at: list[float] = field(default_factory=list)
    host: list[float] = field(default_factory=list)
    """The rest of the node share each brought up (`predicted_peak.host_rest_watts`), counted
    with its peak while unseen, as the decider's Reservation.host_watts."""


class Week:
    """One policy over the site for `config.days`."""

    def __init__(
        self, config: WeekConfig, traces: Traces, policy: Policy, latency: Latency | None = None
    ) -> None:
        self.config = config
        self.traces = traces
        self.policy = policy
        self.latency = latency or Latency()
        spec = config.site
        self.spec = spec
        self.facility: Facility = spec.facility(oversubscribe=policy == "oversubscribe")
        self.settings = self.facility.oversubscription
        self.domains = domains(spec, self.facility)
        racks = [d for d in self.domains if d.kind == "rack"]
        rows = [d for d in self.domains if d.kind == "row"]
        self.n_racks = len(racks)
        self.n_nodes = self.n_racks * spec.nodes_per_rack
        self.node_rack = np.repeat(np.arange(self.n_racks), spec.nodes_per_rack)
        self.rack_row = np.array([spec.row_names.index(r.name.split("-")[0][1:]) for r in racks])
        self.rack_other = np.array([r.other_watts for r in racks])
        self.n_rows = len(rows)
        # node -> the indices of its domains in self.domains (its rack, its row)
        self.node_domains = [
            (int(self.node_rack[n]), self.n_racks + int(self.rack_row[self.node_rack[n]]))
            for n in range(self.n_nodes)
        ]
        self.budget = np.array([d.budget_watts for d in self.domains])
        self.free_gpus = np.full(self.n_nodes, spec.gpus_per_node)
        self.reserved = np.zeros(len(self.domains))
        self.reserved_gpus = np.zeros(len(self.domains), dtype=int)
        self.reserved_non_gpu = np.zeros(len(self.domains))
        self.min_gpu_limit = (
            min_gpu_limit([(H100.power_limit_watts, None)], self.settings.ladder.floor_gpu_watts)[0]
            or 0.0
        )
        self.replicas = _Replicas()
        self.per_model_count = [0] * len(MODELS)
        self.curves = [traces.curves[m.name] for m in MODELS]
        self.chain = _Chain(self.latency, np.random.default_rng([config.seed, 1]))
        # traffic
        self.trace_names = ("conv", "code")
        smoothed = [_smoothed(traces.tokens[name]) for name in self.trace_names]
        self.trace_len = min(len(s) for s in smoothed)
        self.trace_flat = np.concatenate([s[: self.trace_len] for s in smoothed])
        self.trace_level = [_provision_level(traces.tokens[name]) for name in self.trace_names]
        steps_per_day = int(86400 / GOOGLE_STEP_SECONDS)
        first = config.start_day * steps_per_day
        span = math.ceil(config.days * 86400 / GOOGLE_STEP_SECONDS) + 1
        shape = traces.diurnal[first : first + span]
        if len(shape) < span:
            raise ValueError(
                f"start_day {config.start_day} + {config.days:g} days runs past Google's "
                f"{len(traces.diurnal) // steps_per_day} days"
            )
        self.diurnal = shape / shape.max(axis=0)  # each PDU's busiest 5 min of the run: 1
        self.ladders: dict[int, ladder.LadderState] = {}
        self.admit_to = self.settings.ladder.admit_to
        self.hours = math.ceil(config.days * 24) + 1

    # --- admission --------------------------------------------------------------------------

    def _estimate(self, model: int) -> float:
        gpus = MODELS[model].gpus
        share = self.spec.node_share_watts * gpus / self.spec.gpus_per_node
        return gpus * H100.power_limit_watts + share

    def _peak(self, model: int) -> float:
        gpus = MODELS[model].gpus
        share = self.spec.node_share_watts * gpus / self.spec.gpus_per_node
        return self.curves[model].peak_watts + share

    def _today_fits(self, domain: int, model: int, measured_nodes: np.ndarray) -> bool:
        """Today's rule: max(reserved, measured) + other_watts + the estimate <= budget."""
        load = max(self.reserved[domain], measured_nodes[domain])
        load += self.domains[domain].other_watts + self._estimate(model)
        return load <= self.budget[domain]

    def _predicted_fits(
        self, domain: int, model: int, measured_peak: np.ndarray, now: float, node: int
    ) -> bool:
        """Helper A's rule (decider.placement.predicted_peak.predicted_peak_fits), fed the
        figures the decider would read: the measured quantile and power now, the peaks of the
        replicas confirmed less than min_history ago, the reservations' GPUs and non-GPU
        estimates; the new replica's peak on `node` as the decider's placement counts it
        (`first_on_node`'s addition: the rest of the node share where the node has no replica
        yet)."""
        unseen = sum(
            self._peak(m) + host
            for m, admitted, host in self._members(domain)
            if now - admitted < self.settings.min_history
        )
        spec = MODELS[model]
        peak = self._peak(model) + self._host_rest(model, node)
        fit = predicted_peak_fits(
            limit_watts=float(self.budget[domain]),
            other_watts=self.domains[domain].other_watts,
            measured_peak_watts=float(measured_peak[domain]),
            unseen_watts=unseen,
            reserved_gpus=int(self.reserved_gpus[domain]),
            reserved_non_gpu_watts=float(self.reserved_non_gpu[domain]),
            min_gpu_limit_watts=self.min_gpu_limit,
            replica=NewReplica(
                peak_watts=peak,
                gpus=spec.gpus,
                non_gpu_watts=self._estimate(model) - spec.gpus * H100.power_limit_watts,
                peak_from="measured",
            ),
            admit_to=1.0 if self.config.admit_to_limit else self.admit_to,
        )
        return fit.refused is None

    def _host_rest(self, model: int, node: int) -> float:
        """What a replica of `model` on `node` brings up beyond its own share of the node:
        the decider's `host_rest_watts` (what `first_on_node` adds), 0 in the variant
        without the first replica's host."""
        if not self.config.first_host:
            return 0.0
        reserved_on_node = self.spec.gpus_per_node - int(self.free_gpus[node])
        return host_rest_watts(
            MODELS[model].gpus,
            self.spec.gpus_per_node,
            reserved_on_node,
            self.spec.node_share_watts,
        )

    def _members(self, domain: int) -> list[tuple[int, float, float]]:
        """The domain's replicas: each one's model, when admitted, the host it brought up."""
        r = self.replicas
        return [
            (r.model[i], r.admitted_at[i], r.host[i])
            for i in range(len(r.model))
            if domain in self.node_domains[r.node[i]]
        ]

    def _place(self, now: float, history: np.ndarray) -> None:
        """Offer the models in turn until a whole round places nothing."""
        seen = int(self.chain.seen_at(now) / STEP_S)
        others = np.array([d.other_watts for d in self.domains])
        measured = history[seen] if seen >= 0 else others
        measured_nodes = np.maximum(measured - others, 0.0)
        predicted = self.policy == "oversubscribe" and now >= self.settings.min_history
        full: set[int] = set()
        guarded: set[int] = set()  # on today's rule by the capped guard
        if predicted:
            window = int(self.settings.window / STEP_S)
            every = int(self.latency.node_rules_s / STEP_S)  # the recorded series' resolution
            start = max(0, seen - window)
            sampled = history[start : seen + 1 : every] - others
            quantile = np.quantile(sampled, self.settings.percentile, axis=0)
            measured_peak = np.maximum(quantile, measured_nodes)
            if self.config.capped_guard:
                # The decider's guard: a domain capped for longer than the percentile leaves
                # over (1 % of the window at p99) falls to today's rule. The share of the
                # same 30-s samples as the quantile's, as the decider's peaks query has it.
                shares = self.capped[start : seen + 1 : every].mean(axis=0)
                guarded = {
                    d
                    for d, share in enumerate(shares)
                    if capped_guard(float(share), self.settings.percentile) is not None
                }
        # A domain the ladder has capped admits nothing, as a domain over its cap today.
        full |= {d for d, state in self.ladders.items() if state.step > ladder.UNCAPPED}
        placed_any = True
        while placed_any:
            placed_any = False
            for model, spec in enumerate(MODELS):
                best: tuple[float, int] | None = None
                for rack in range(self.n_racks):
                    fits = (self.node_rack == rack) & (self.free_gpus >= spec.gpus)
                    nodes = np.flatnonzero(fits)
                    if len(nodes) == 0:
                        continue
                    node = int(nodes[np.argmin(self.free_gpus[nodes])])
                    doms = self.node_domains[node]
                    if any(d in full for d in doms):
                        continue
                    ok = all(
                        self._predicted_fits(d, model, measured_peak, now, node)
                        if predicted and d not in guarded
                        else self._today_fits(d, model, measured_nodes)
                        for d in doms
                    )
                    if not ok:
                        continue
                    rack_domain = doms[0]
                    room = self.budget[rack_domain] - max(
                        self.reserved[rack_domain], measured_nodes[rack_domain]
                    )
                    if best is None or room > best[0]:
                        best = (room, node)
                if best is None:
                    continue
                node = best[1]
                for d in self.node_domains[node]:
                    self.reserved[d] += self._estimate(model)
                    self.reserved_gpus[d] += spec.gpus
                    self.reserved_non_gpu[d] += (
                        self._estimate(model) - spec.gpus * H100.power_limit_watts
                    )
                self._admit(model, node, now)
                placed_any = True

    def _admit(self, model: int, node: int, now: float) -> None:
        ordinal = self.per_model_count[model]
        self.per_model_count[model] += 1
        rng = np.random.default_rng([self.config.seed, 2, model, ordinal])
        trace = 0 if MODELS[model].trace == "conv" else 1
        curve = self.curves[model]
        host = self._host_rest(model, node)
        self.free_gpus[node] -= MODELS[model].gpus
        r = self.replicas
        r.host.append(host)
        r.model.append(model)
        r.node.append(node)
        r.scale.append(curve.capacity / self.trace_level[trace])
        r.diurnal.append(int(rng.integers(0, self.diurnal.shape[1])))
        r.trace.append(trace)
        r.offsets.append(rng.integers(0, self.trace_len, size=self.hours))
        r.admitted_at.append(now)
        self._arrays_stale = True

    # --- the run ----------------------------------------------------------------------------

    def _arrays(self) -> None:
        r = self.replicas
        self.a_model = np.array(r.model, dtype=int)
        self.a_node = np.array(r.node, dtype=int)
        self.a_gpus = np.array([MODELS[m].gpus for m in r.model], dtype=float)
        self.a_scale = np.array(r.scale)
        self.a_diurnal = np.array(r.diurnal, dtype=int)
        self.a_offsets = np.array(r.offsets, dtype=int).reshape(len(r.model), self.hours)
        self.a_trace_base = np.array(r.trace, dtype=int) * self.trace_len
        self.a_capacity = np.array([self.curves[m].capacity for m in r.model])
        self.a_class = np.array([CLASSES.index(MODELS[m].klass) for m in r.model], dtype=int)
        self.by_model = [np.flatnonzero(self.a_model == m) for m in range(len(MODELS))]
        self.used_gpus = np.bincount(self.a_node, self.a_gpus, self.n_nodes)
        self.cap_w = np.full(len(r.model), np.inf)  # per GPU, as the agent applied it
        self.cap_throughput = np.full(len(r.model), np.inf)
        self.node_replicas = [np.flatnonzero(self.a_node == n) for n in range(self.n_nodes)]
        self._groups()
        self._arrays_stale = False

    def _groups(self) -> None:
        """As the decider's driver (decider.capping.driver) sees each domain: every GPU of
        a powered member node under its highest class (rank: class_rank + 1), and besides
        the GPUs the domain's other_watts plus node_share_watts per such node."""
        rank_of = {name: rank + 1 for rank, name in enumerate(CLASSES)}
        self.node_class = ["" for _ in range(self.n_nodes)]
        for n in range(self.n_nodes):
            names = {CLASSES[self.a_class[i]] for i in self.node_replicas[n]}
            if names:
                self.node_class[n] = max(names, key=rank_of.__getitem__)
        self.groups: dict[int, list[ladder.ClassGpus]] = {}
        self.besides_gpus = np.zeros(len(self.domains))
        for d, domain in enumerate(self.domains):
            counts: dict[str, int] = {}
            nodes = 0
            for n in range(self.n_nodes):
                if self.node_class[n] and d in self.node_domains[n]:
                    counts[self.node_class[n]] = (
                        counts.get(self.node_class[n], 0) + self.spec.gpus_per_node
                    )
                    nodes += 1
            self.groups[d] = [
                ladder.ClassGpus(
                    name, rank_of[name], gpus, H100.power_limit_watts, self.min_gpu_limit
                )
                for name, gpus in sorted(counts.items())
            ]
            self.besides_gpus[d] = domain.other_watts + self.spec.node_share_watts * nodes

    def _demand(self, t: float) -> np.ndarray:
        hour = int(t // 3600)
        shift = self.a_offsets[:, hour] + int(t // TRACE_BIN_SECONDS)
        position = self.a_trace_base + shift % self.trace_len
        tokens = self.trace_flat[position]
        at = t / GOOGLE_STEP_SECONDS
        low = int(at)
        frac = at - low
        shape = (1 - frac) * self.diurnal[low, self.a_diurnal] + frac * self.diurnal[
            low + 1, self.a_diurnal
        ]
        demand = self.a_scale * shape * tokens
        if self.config.load_shape:
            times, factors = zip(*self.config.load_shape, strict=True)
            demand = demand * float(np.interp(t, times, factors))
        return demand

    def _apply_caps(self, t: float) -> None:
        """The agents whose lease poll falls at `t` apply, to every GPU of their node, the
        lowest cap of the decider's last refresh among the node's domains."""
        agent = self.latency.agent_s
        polls = int(agent // STEP_S)
        for n in range(self.n_nodes):
            if not self.node_class[n] or (t / STEP_S - n) % polls:
                continue
            cap = min(
                (
                    self.ladders[d].caps.get(self.node_class[n], math.inf)
                    for d in self.node_domains[n]
                    if d in self.ladders
                ),
                default=math.inf,
            )
            for index in self.node_replicas[n]:
                if cap != self.cap_w[index]:
                    self.cap_w[index] = cap
                    curve = self.curves[self.a_model[index]]
                    self.cap_throughput[index] = (
                        math.inf
                        if math.isinf(cap)
                        else float(curve.throughput_at_power(cap * self.a_gpus[index]))
                    )

    def run(self) -> WeekResult:
        config = self.config
        steps = int(config.days * 86400 / STEP_S)
        history = np.zeros((steps, len(self.domains)), dtype=np.float32)
        self.capped = np.zeros((steps, len(self.domains)), dtype=bool)
        stats = [DomainStats(d) for d in self.domains]
        rating = np.array([d.rating_watts for d in self.domains])
        cap_line = np.array([d.cap_watts for d in self.domains])
        over_since: list[float | None] = [None] * len(self.domains)
        demanded = served_total = lost_capping = beyond = energy = 0.0
        lost_by_model = np.zeros(len(MODELS))
        gpu_energy = withheld = 0.0
        served_by_model = np.zeros(len(MODELS))
        max_lag = 0.0
        ladder_on = self.policy == "oversubscribe" and config.ladder
        self._arrays_stale = True
        self._place(0.0, history)
        self._arrays()
        place_every = int(config.place_every_s / STEP_S)
        for step in range(steps):
            t = step * STEP_S
            if step and step % place_every == 0:
                before = len(self.replicas.model)
                self._place(t, history)
                if len(self.replicas.model) != before:
                    caps, throughput = self.cap_w, self.cap_throughput
                    self._arrays()
                    self.cap_w[: len(caps)] = caps
                    self.cap_throughput[: len(throughput)] = throughput
            demand = self._demand(t)
            servable = np.minimum(demand, self.a_capacity)
            gpu_power = np.empty_like(servable)
            for m, members in enumerate(self.by_model):
                if len(members):
                    gpu_power[members] = self.curves[m].power_at(servable[members])
            cap_total = self.cap_w * self.a_gpus
            over = gpu_power > cap_total
            if over.any():
                withheld += float((gpu_power - cap_total)[over].sum()) * STEP_S
                gpu_power = np.where(over, cap_total, gpu_power)
                served = np.where(over, np.minimum(servable, self.cap_throughput), servable)
            else:
                served = servable
            node_gpu = np.bincount(self.a_node, gpu_power, self.n_nodes)
            node_load = (
                np.bincount(self.a_node, served / self.a_capacity * self.a_gpus, self.n_nodes)
                / self.spec.gpus_per_node
            )
            powered = self.used_gpus > 0
            node_power = powered * (
                node_gpu
                + (self.spec.gpus_per_node - self.used_gpus) * H100.idle_watts
                + host_watts(node_load)
            )
            racks = np.bincount(self.node_rack, node_power, self.n_racks) + self.rack_other
            rows = np.bincount(self.rack_row, racks, self.n_rows)
            power = np.concatenate([racks, rows])
            history[step] = power
            demanded += float(demand.sum()) * STEP_S
            served_total += float(served.sum()) * STEP_S
            gpu_energy += float(gpu_power.sum()) * STEP_S
            served_by_model += np.bincount(self.a_model, served, len(MODELS)) * STEP_S
            if over.any():
                lost = (servable - served) * STEP_S
                lost_capping += float(lost.sum())
                lost_by_model += np.bincount(self.a_model, lost, len(MODELS))
            beyond += float((demand - servable).sum()) * STEP_S
            energy += float(racks.sum()) * STEP_S
            for d in np.flatnonzero(power > cap_line):
                if over_since[d] is None:
                    over_since[d] = t
            for d in np.flatnonzero(power <= cap_line):
                if over_since[d] is not None:
                    stats[d].events_above_cap.append(t - over_since[d])
                    over_since[d] = None
            for d in np.flatnonzero(power > rating):
                stats[d].seconds_above_rating += STEP_S
            for d, state in self.ladders.items():
                if state.step > ladder.UNCAPPED:
                    stats[d].seconds_capped += STEP_S
                    self.capped[step, d] = True
                if state.step == ladder.ALL_CAPPED:
                    stats[d].seconds_capped_all += STEP_S
            if ladder_on and self.chain.is_refresh(t):
                seen = self.chain.seen_at(t)
                max_lag = max(max_lag, t - seen)
                view = history[int(seen / STEP_S)] if seen >= 0 else np.zeros(len(power))
                for d, domain in enumerate(self.domains):
                    if not domain.oversubscribe:
                        continue
                    state = self.ladders.get(d) or ladder.initial(t)
                    self.ladders[d] = ladder.advance(
                        state,
                        t,
                        float(view[d]),
                        domain.budget_watts,
                        self.groups[d],
                        self.settings.ladder,
                        other_watts=float(self.besides_gpus[d]),
                        label=domain.label,
                        ceiling_watts=domain.cap_watts,
                    )
            if ladder_on and self.ladders:
                self._apply_caps(t)
        end = steps * STEP_S
        for d, since in enumerate(over_since):
            if since is not None:
                stats[d].events_above_cap.append(end - since)
        return WeekResult(
            policy=self.policy,
            config=config,
            latency=self.latency,
            domains=self.domains,
            stats=stats,
            replicas={m.name: self.per_model_count[i] for i, m in enumerate(MODELS)},
            gpus_used=int(self.used_gpus.sum()),
            tokens_demanded=demanded,
            tokens_served=served_total,
            tokens_lost_capping=lost_capping,
            lost_by_model={m.name: float(lost_by_model[i]) for i, m in enumerate(MODELS)},
            gpu_energy_joules=gpu_energy,
            gpu_energy_withheld_joules=withheld,
            served_by_model={m.name: float(served_by_model[i]) for i, m in enumerate(MODELS)},
            tokens_beyond_capacity=beyond,
            energy_joules=energy,
            history=history,
            max_lag_s=max_lag + self.latency.agent_s,
            admitted_at=list(self.replicas.admitted_at),
            reserved_watts=self.reserved + np.array([d.other_watts for d in self.domains]),
        )


def _thresholds(
    config: WeekConfig, first: float, second: float, headroom: float = 0.0
) -> WeekConfig:
    settings = dict(config.site.oversubscription)
    settings["ladder"] = {
        **settings.get("ladder", {}),
        "first_threshold": first,
        "second_threshold": second,
        "admission_headroom": headroom,
    }
    return replace(config, site=replace(config.site, oversubscription=settings))


#: The names of the columns `run_policies` returns.
TODAY = "today"
DECIDER = "oversubscription (the decider's rule)"
#: Variants of the admission rule and the ladder's settings besides the decider's as it
#: is, each a change of the run's configuration (docs/oversubscription-week.md).
VARIANTS: dict[str, Callable[[WeekConfig], WeekConfig]] = {
    "without the capped guard": lambda config: replace(config, capped_guard=False),
    "admitting to the first threshold, 0.95/0.99": lambda config: _thresholds(config, 0.95, 0.99),
    "the same without the first replica's host": lambda config: replace(
        _thresholds(config, 0.95, 0.99), first_host=False
    ),
    "the rule before: to the limit, 0.90/0.97, no guard": lambda config: replace(
        _thresholds(config, 0.90, 0.97), capped_guard=False, admit_to_limit=True, first_host=False
    ),
}


def run_policies(
    config: WeekConfig, traces: Traces, variants: bool = False
) -> dict[str, WeekResult]:
    """Today's policy and oversubscription (helper A's rule, the ladder as configured) on
    the same site and the same traffic; with `variants`, the VARIANTS too."""
    results = {
        TODAY: Week(config, traces, "today").run(),
        DECIDER: Week(config, traces, "oversubscribe").run(),
    }
    if variants:
        for name, change in VARIANTS.items():
            results[name] = Week(change(config), traces, "oversubscribe").run()
    return results
