"""What the placement rules read: one domain's, one phase's and one node's figures in a View.

Plain data: this module imports no rule and no cache. The View (decider.placement.view)
builds these from the facility file, the snapshot, the reservations and the holds; the rule
modules read them; `judge` (decider.placement) calls the rules on them. No state holds a rule's
answer: the refusals are `judge`'s to work out (the View remembers them per state, a speed
layer: decider.placement.refusal_memo). The limit past which
a placement is refused, cap × (1 − margin), is worked out by `decider.facility.limit_watts`
alone, for every domain and phase as they are built here, with the domain's own margin
(the domain's, else the site's: decider.facility).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from decider.facility import DomainRef, limit_watts
from decider.placement.predicted_peak import Prediction
from decider.snapshot import Condition, Evidence
from decider.store import Hold

#: Kinds a node's cached state covers; a node's row, room and site are read per request.
FINE_KINDS = frozenset({"rack", "pdu"})
#: Worst first: a node takes the worst condition among its domains.
CONDITION_RANK: dict[Condition, int] = {"hot": 3, "warm": 2, "ok": 1, "unknown": 0}
#: (rule, reason): one refusal, the rule's name being its reason code in metrics.
Refusal = tuple[str, str]


@dataclass(frozen=True, slots=True)
class DomainState:
    """One domain's figures in this view. Watts; None where there is no figure.

    Derived figures are worked out once, when the view builds the domain (`build`):
    - `load`: the larger of reserved and measured, plus what no node reports (DESIGN.md §5);
      `load_basis` says which of the two it is; an oversubscribed domain on its predicted
      basis (`prediction`, decider.placement.predicted_peak): its predicted peak, `predicted`;
    - `room`: watts left under the limit (negative: past it); None without a budget;
    - `headroom`: watts left under the cap itself (what /metrics publishes).
    """

    ref: DomainRef
    cap: float | None  # the facility file's cap (DESIGN.md §5); None: no budget
    limit: float | None  # cap * (1 - margin): past this, placements are refused
    other_watts: float
    reserved: float
    measured: float | None  # None: no fresh measurement
    condition: Condition
    reading_age: float | None
    held: Hold | None
    load: float = 0.0
    load_basis: str = "reserved"
    room: float | None = None
    headroom: float | None = None
    margin: float = 0.0  # the domain's (its own, else the site's: decider.facility)
    #: What a warm or hot domain's condition rests on, and for how long (the evidence and
    #: hot parts: decider.placement.evidence.of); None for any other.
    evidence: Evidence | None = None
    #: An oversubscribed domain's admission basis and figures; None: not oversubscribed.
    prediction: Prediction | None = None

    @property
    def label(self) -> str:
        """How reasons name it: `rack r12-07`."""
        return f"{self.ref.kind} {self.ref.name}"

    @classmethod
    def build(
        cls,
        ref: DomainRef,
        cap: float | None,
        margin: float,
        other_watts: float,
        reserved: float,
        measured: float | None,
        condition: Condition,
        reading_age: float | None,
        held: Hold | None,
        evidence: Evidence | None = None,
        prediction: Prediction | None = None,
    ) -> DomainState:
        """The figures; no rule is run here (`judge` runs them)."""
        basis = "measured" if measured is not None and measured > reserved else "reserved"
        load = max(reserved, measured if measured is not None else 0.0) + other_watts
        if prediction is not None and prediction.predicted:
            basis, load = "predicted", prediction.load_watts + other_watts
        limit = limit_watts(cap, margin)
        return cls(
            ref=ref,
            cap=cap,
            limit=limit,
            other_watts=other_watts,
            reserved=reserved,
            measured=measured,
            condition=condition,
            reading_age=reading_age,
            held=held,
            evidence=evidence,
            load=load,
            load_basis=basis,
            room=None if limit is None else limit - load,
            headroom=None if cap is None else cap - load,
            margin=margin,
            prediction=prediction,
        )


@dataclass(frozen=True, slots=True)
class PhaseState:
    """One phase of a three-phase pdu in a view, watts (decider.placement.phases): read by
    the power rules as a domain is, its load the larger of reserved and measured (where a
    site signal measures the phase) plus `other_watts`, never held or hot of its own (its
    pdu is)."""

    pdu: DomainRef
    phase: str
    rating: float
    cap: float
    limit: float
    other_watts: float
    reserved: float
    load: float
    room: float  # under the limit; negative: past it
    headroom: float  # under the cap
    load_basis: str = "reserved"
    margin: float = 0.0
    measured: float | None = None  # None: no fresh phase reading (decider.placement.phases)
    held: Hold | None = None
    evidence: Evidence | None = None  # a phase has no condition of its own (its pdu has)
    condition: Condition = "unknown"
    reading_age: float | None = None
    prediction: Prediction | None = None  # a phase keeps today's rule (docs/facility.md)

    @property
    def label(self) -> str:
        """How reasons name it: `pdu r12-07-a phase L2`."""
        return f"pdu {self.pdu.name} phase {self.phase}"

    @property
    def ref(self) -> DomainRef:
        return self.pdu

    @classmethod
    def build(
        cls,
        pdu: DomainRef,
        phase: str,
        rating: float,
        derating: float,
        margin: float,
        other_watts: float,
        reserved: float,
        measured: float | None = None,
    ) -> PhaseState:
        cap = rating * derating
        limit = limit_watts(cap, margin)
        assert limit is not None  # a phase always has a cap
        basis = "measured" if measured is not None and measured > reserved else "reserved"
        load = max(reserved, measured if measured is not None else 0.0) + other_watts
        return cls(
            pdu=pdu,
            phase=phase,
            rating=rating,
            cap=cap,
            limit=limit,
            other_watts=other_watts,
            reserved=reserved,
            load=load,
            room=limit - load,
            headroom=cap - load,
            load_basis=basis,
            margin=margin,
            measured=measured,
        )


#: What the filters read of a domain or a phase alike.
Budgeted = DomainState | PhaseState


@dataclass(frozen=True, slots=True)
class NodeState:
    """A candidate node in this view: its domains and what they say before any estimate."""

    node: str
    domains: tuple[DomainState, ...]  # empty: the node's membership is unknown
    condition: Condition  # the worst among its domains
    room: float | None  # the least room among its budgeted domains and phases
    rack: DomainState | None
    gpus: int | None  # physical GPUs, from the snapshot
    gpu_limit_watts: float | None  # the largest enforced GPU power limit, from the snapshot
    reserved_gpus: int
    #: The node's row, room and site. A view builds `domains` and `room` from the
    #: node's rack and pdus alone and reads these shared domains at each request: a
    #: reservation changes them for every node, and rebuilding 10,000 nodes' states for it
    #: would cost more than the placement. Empty: `domains` holds every domain.
    coarse: tuple[DomainRef, ...] = ()
    #: The phases its load counts against, of its three-phase pdus (decider.placement.phases);
    #: their rooms are in `room`.
    phases: tuple[PhaseState, ...] = ()
    #: Its CPU models (the snapshot's `cpus` part): a CPU replica's watts per core.
    cpu_models: tuple[str, ...] = ()
    #: A warm node: why, its warm domains' evidence in words (decider.placement.condition).
    warm_evidence: tuple[str, ...] = ()
    #: Its membership unknown (no fresh membership part): the holds on the domains it was
    #: last known in (the snapshot's, else its reservations'), which refuse it (held.py).
    last_known_holds: tuple[tuple[DomainRef, Hold], ...] = ()


@dataclass(frozen=True, slots=True)
class Ask:
    """What the ordering scores read of the request: the replica's estimated watts on the
    node, and the reserved replicas of its model per rack and pdu (View.spread_counts)."""

    watts: float
    spread_counts: Mapping[DomainRef, int]


def kw(watts: float) -> str:
    """Watts as kW to one decimal, as every reason shows them."""
    return f"{watts / 1000:.1f}"


def some(names: list[str], noun: str = "node", shown: int = 5) -> str:
    """`node n1`, `nodes n1, n2`, or `12 nodes (n1, …, n5, …)`: how notes name a few."""
    if len(names) <= shown:
        return f"{noun}{'s' if len(names) > 1 else ''} {', '.join(names)}"
    return f"{len(names)} {noun}s ({', '.join(names[:shown])}, …)"
