"""Properties of the placement rules (hypothesis), in-process, over generated sites.

A generated site: 1 to 4 racks of 1 to 3 nodes, each rack fed by one or two PDUs (a node on one of
them or on both: dual-fed), racks spread over 1 or 2 rows, one site domain. Every domain may
have a budget (`cap_watts`; a rack may instead or as well list its PDUs as feeds), an
`other_watts` below its cap, a measured reading (up to 110% of its cap), a condition, a
hold. Nodes may report a GPU count and a GPU power limit. The site starts with reservations
made outside these rules (they may already pass any budget), and then tries a sequence of
reservations and placements, with declared, profile or derived estimates.

What holds, exactly (`limit` is a domain's cap × (1 − margin), `load` its
max(reserved, measured) + other_watts, figures compared with a 1e-6 relative tolerance):

(a) With fresh data, in enforce mode: after a reservation is accepted, every budgeted
    domain of its node has load ≤ limit; so every budgeted domain that has taken an
    accepted reservation stays at load ≤ limit, and in particular reserved + other_watts ≤
    limit, whatever was reserved before. A domain whose load is already past its limit
    (measured above it, or reservations made before a cap was lowered) takes no reservation
    at all, even one of no estimated draw. A node is accepted exactly when none of its
    domains is held or hot and the replica fits under every budgeted domain's limit; and
    `POST /v1/placements` (decide) and `POST /v1/reservations` (State.reserve) agree.
(b) With the readings (measured power, conditions, ages) stale or never read, and the
    inventory parts fresh, stale or never read, or with no snapshot at all: no node is
    refused for being hot, and every refusal is explained by a hold or by reserved power:
    a held domain, or a budgeted domain where reserved + other_watts + the estimate passes
    the limit. So with nothing held or reserved, a replica that fits every empty domain is
    refused nowhere: never every candidate refused for lack of data.
(c) In observe mode nothing is refused, the order is the scheduler's, and `would_refuse`
    is what enforce mode gives as `reasons` on the same view; every reservation is made.
(d) In enforce mode the order is a permutation of exactly the allowed candidates, sorted
    by their scores; a node is allowed exactly when it has no refusal.
(e) After any sequence of reservations, releases, confirmations, holds and releases of
    holds, the view State keeps (updated in place of the one before: View.settle) answers
    every placement as a view built from scratch over the same state, and holds the same
    domain and node figures. Two differences are allowed until the next refresh rebuilds
    the view: a domain that only a released hold or reservation named stays listed (with
    nothing reserved or held), and the per-domain "no fresh condition / measured power"
    notes in `missing` are those of the view before the change.

The Store is SQLite in memory here (hypothesis runs many examples; tests/test_placement.py
covers the store on disk). Settings are derandomized: every run tries the same examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, composite

from decider.facility import DomainRef, Facility, Modes, limit_watts
from decider.models import Replica, ReservationRequest
from decider.placement import Decision, answers, decide
from decider.placement.rules import concern_of
from decider.placement.view import View
from decider.snapshot import INVENTORY_PARTS, PARTS, Snapshot
from decider.state import State
from decider.store import Reservation
from tests.placement_helpers import NOW, SETTINGS, SiteSpec, scratch, state_of

READINGS = frozenset(PARTS) - INVENTORY_PARTS
PROFILES = {
    "declared": {"gpus": 4, "power_watts": 2_900},
    "derived": {"gpus": 1},
    "cpu": {"gpus": 0, "cpu_cores": 16},
}


def tolerance(limit: float) -> float:
    return 1e-6 * max(1.0, abs(limit))


# --- generated sites --------------------------------------------------------------------------


@composite
def site_specs(
    draw: DrawFn, *, reservations: bool = True, holds: bool = True, mode: str = "enforce"
) -> SiteSpec:
    derating = draw(st.sampled_from([0.8, 1.0]))
    rows = draw(st.integers(1, 2))
    membership: dict[str, tuple[DomainRef, ...]] = {}
    pdus_of: dict[str, list[str]] = {}
    for r in range(draw(st.integers(1, 4))):
        pdus = [f"r{r}-a", f"r{r}-b"][: draw(st.integers(1, 2))]
        pdus_of[f"r{r}"] = pdus
        row = str(draw(st.integers(0, rows - 1)))
        for k in range(draw(st.integers(1, 3))):
            fed = draw(st.sampled_from([pdus, pdus[:1], pdus[-1:]]))
            refs = [DomainRef("rack", f"r{r}"), DomainRef("row", row), DomainRef("site", "s")]
            refs += [DomainRef("pdu", p) for p in fed]
            membership[f"n{r}-{k}"] = tuple(sorted(set(refs)))
    all_refs = sorted({ref for refs in membership.values() for ref in refs})

    domains: dict[str, Any] = {}
    caps: dict[DomainRef, float] = {}
    for ref in all_refs:
        scale = {"pdu": 1, "rack": 1, "row": 4, "site": 8}[ref.kind]
        spec: dict[str, Any] = {}
        how = draw(
            st.sampled_from(
                ["none", "cap", "feeds", "both"] if ref.kind == "rack" else ["none", "cap"]
            )
        )
        cap: float | None = None
        if how in ("cap", "both"):
            spec["cap_watts"] = cap = float(draw(st.integers(2_000, 30_000)) * scale)
        if how in ("feeds", "both"):
            ratings = [draw(st.integers(1_000, 30_000)) for _ in pdus_of[ref.name]]
            spec["feeds"] = [
                {"pdu": p, "rating_watts": w}
                for p, w in zip(pdus_of[ref.name], ratings, strict=True)
            ]
            feed_cap = min(ratings) * derating
            cap = feed_cap if cap is None else min(cap, feed_cap)
        fraction = draw(st.sampled_from([0.0, 0.0, 0.1, 0.35, 0.7]))
        if cap is not None:
            caps[ref] = cap
            if fraction:
                spec["other_watts"] = round(fraction * cap, 1)
        elif fraction and draw(st.booleans()):
            spec["other_watts"] = 900.0  # declared without a budget: counted, never limits
        if spec:
            domains[str(ref)] = spec

    measured: dict[DomainRef, float] = {}
    conditions: dict[DomainRef, str] = {}
    ages: dict[DomainRef, float] = {}
    for ref in all_refs:
        if draw(st.integers(0, 2)) == 0:
            top = caps.get(ref, 20_000.0) * 1.1
            measured[ref] = draw(st.floats(0, top, allow_nan=False, allow_infinity=False))
        state = draw(st.sampled_from([None] * 8 + ["ok"] * 8 + ["warm"] * 3 + ["hot"]))
        if state is not None:
            conditions[ref] = state
            ages[ref] = float(draw(st.integers(0, 600)))
    gpus = {n: draw(st.integers(0, 8)) for n in membership if draw(st.booleans())}
    limits = {
        n: float(draw(st.sampled_from([300, 400, 700, 1000])))
        for n in membership
        if draw(st.booleans())
    }
    existing = []
    if reservations:
        for i in range(draw(st.integers(0, 4))):
            node = draw(st.sampled_from(sorted(membership)))
            existing.append(
                Reservation(
                    id=f"old-{i}",
                    node=node,
                    replica={"model": draw(st.sampled_from("ab")), "profile": "x", "gpus": 1},
                    estimate_watts=float(draw(st.integers(0, 4_000))),
                    gpus=1,
                    domains=membership[node],
                    created_at=NOW - 100,
                    expires_at=None,
                    confirmed_at=NOW - 50,
                )
            )
    held: dict[DomainRef, str] = {}
    if holds:
        held = {ref: "maintenance" for ref in all_refs if draw(st.integers(0, 24)) == 0}
    facility = {
        "mode": mode,
        "defaults": {
            "margin": draw(st.sampled_from([0.0, 0.05, 0.1, 0.25])),
            "derating": derating,
        },
        "domains": domains,
        "profiles": PROFILES,
        "node_share_watts": draw(st.sampled_from([0, 350])),
    }
    return SiteSpec(facility, membership, measured, conditions, ages, gpus, limits, existing, held)


replicas = st.builds(
    Replica,
    model=st.sampled_from(["a", "b"]),
    profile=st.sampled_from(["declared", "derived", "cpu", "unlisted"]),
    gpus=st.integers(0, 8),
    cpu_cores=st.none() | st.integers(1, 64).map(float),
    power_watts=st.none() | st.floats(1, 8_000, allow_nan=False, allow_infinity=False),
)


@composite
def candidate_lists(draw: DrawFn, nodes: list[str]) -> list[str]:
    pool = [*nodes, "ghost-1", "ghost-2"]  # nodes no membership knows
    return draw(
        st.permutations(pool).flatmap(lambda p: st.integers(0, len(p)).map(lambda k: p[:k]))
    )


def domains_of(view: View, node: str) -> list[Any]:
    """Every domain of the node in this view (its rack and PDUs, row, room and site)."""
    return [view.domain(ref) for ref in view.membership(node) or ()]


def budgeted(view: View, node: str) -> Iterable[DomainRef]:
    return (domain.ref for domain in domains_of(view, node) if domain.limit is not None)


# --- (a) fresh data: no accepted reservation passes a limit -----------------------------------


#: An attempt: a node, a replica, and `fill`: None, or declare the node's least room + fill.
Attempt = tuple[str, Replica, float | None]


@composite
def sites_and_attempts(draw: DrawFn) -> tuple[SiteSpec, list[Attempt]]:
    spec = draw(site_specs())
    nodes = [*spec.nodes, "ghost"]
    fill = st.none() | st.sampled_from([0.0, 0.0, 1e-9, 0.5, -0.5, -100.0])
    return spec, draw(st.lists(st.tuples(st.sampled_from(nodes), replicas, fill), max_size=12))


def oracle(
    spec: SiteSpec, facility: Facility, view: View, node: str, watts: float
) -> tuple[bool, list[tuple[float, float]], bool]:
    """From the raw figures, not the view's: (a domain held or hot, [(limit − load − watts,
    limit)] of the budgeted domains, a budgeted domain already past its limit)."""
    blocked = past = False
    slack = []
    for ref in spec.membership.get(node, ()):
        blocked |= ref in spec.holds or spec.conditions.get(ref) == "hot"
        limit = limit_watts(
            facility.cap_watts(ref.kind, ref.name), facility.margin(ref.kind, ref.name)
        )
        if limit is None:
            continue
        declared = facility.domain(ref.kind, ref.name)
        other = declared.other_watts if declared is not None else 0.0
        reserved = sum(
            r.estimate_watts
            for r in view.reservations.values()
            if ref in spec.membership.get(r.node, r.domains)
        )
        load = max(reserved, spec.measured.get(ref, 0.0)) + other
        slack.append((limit - load - watts, limit))
        past |= load > limit + tolerance(limit)
    return blocked, slack, past


@SETTINGS
@given(sites_and_attempts())
def test_fresh_data_no_accepted_reservation_passes_a_limit(
    case: tuple[SiteSpec, list[Attempt]],
) -> None:
    spec, attempts = case
    with state_of(spec, spec.snapshot()) as state:
        touched: set[DomainRef] = set()
        for i, (node, rep, fill) in enumerate(attempts):
            before = state.view()
            room = before.node(node).room
            if fill is not None and room is not None and room + fill > 0:
                rep = rep.model_copy(update={"power_watts": room + fill})  # the boundary
            placement = decide(before, rep, [node]).as_json()["nodes"][0]
            outcome = state.reserve(ReservationRequest(id=f"try-{i}", replica=rep, node=node))
            assert outcome.conflict is None
            assert outcome.verdict is not None
            watts = outcome.verdict.estimate.watts
            accepted = outcome.reservation is not None
            assert accepted == outcome.created == placement["allowed"]
            assert abs(placement["estimate_watts"] - watts) <= 0.05  # as shown

            event("accepted" if accepted else "refused")
            for rule in sorted({rule for rule, _ in outcome.verdict.refusals}):
                event(f"refused by {rule}")
            blocked, slack, past = oracle(spec, state.facility, before, node, watts)
            if past:
                event("a domain of the node already past its limit")
                assert not accepted, "a domain past its limit took a reservation"
            if not any(abs(room) <= tolerance(limit) for room, limit in slack):
                expected = not blocked and all(room >= 0 for room, _ in slack)
                assert accepted == expected, (node, rep, slack, outcome.verdict.refusals)

            if accepted:
                touched.update(budgeted(before, node))
            after = state.view()
            for ref in touched:
                domain = after.domain(ref)
                assert domain.limit is not None
                allowed = domain.limit + tolerance(domain.limit)
                assert domain.load <= allowed, (ref, domain)
                assert domain.reserved + domain.other_watts <= allowed, (ref, domain)
                if accepted and domain.room is not None and domain.room < 0.05 * domain.limit:
                    event("accepted to within 5% of a limit")


# --- (b) stale or missing data: refusals come from holds and reservations alone ---------------

freshness = st.fixed_dictionaries(
    {name: st.sampled_from(["stale", "never"]) for name in sorted(READINGS)}
    | {
        name: st.sampled_from(["fresh", "fresh", "stale", "never"])
        for name in sorted(INVENTORY_PARTS)
    }
)


@composite
def stale_cases(draw: DrawFn, **site: bool) -> tuple[SiteSpec, Snapshot | None, Replica, list[str]]:
    spec = draw(site_specs(**site))
    snapshot = None if draw(st.integers(0, 9)) == 9 else spec.snapshot(draw(freshness))
    return spec, snapshot, draw(replicas), draw(candidate_lists(spec.nodes))


def explained(view: View, verdict: Any) -> bool:
    """A hold (on the node's domains, or with no fresh membership on its last known ones:
    the snapshot's, its reservations'), or reserved power with this replica past a
    budgeted domain's limit."""
    last_known = set(view.snapshot.membership.get(verdict.node.node, ()))
    for reservation in view.reservations.values():
        if reservation.node == verdict.node.node:
            last_known.update(reservation.domains)
    if any(ref in view.holds for ref in last_known):
        return True
    for domain in domains_of(view, verdict.node.node):
        if domain.held is not None:
            return True
        if domain.limit is not None:
            assert domain.measured is None and domain.condition == "unknown"
            need = domain.reserved + domain.other_watts + verdict.estimate.watts
            if need > domain.limit - tolerance(domain.limit):
                return True
    return False


@SETTINGS
@given(stale_cases())
def test_stale_data_refuses_only_for_holds_and_reservations(
    case: tuple[SiteSpec, Snapshot | None, Replica, list[str]],
) -> None:
    spec, snapshot, rep, candidates = case
    with state_of(spec, snapshot) as state:
        view = state.view()
        assert not view.fresh & READINGS
        decision = decide(view, rep, candidates)
        event(
            "no snapshot"
            if snapshot is None
            else "membership " + ("known" if "membership" in view.fresh else "unknown")
        )
        for verdict in decision.verdicts:
            assert verdict.node.condition == "unknown"
            assert {rule for rule, _ in verdict.refusals} <= {"held", "over_cap", "power_cap"}
            if verdict.refusals:
                event("a candidate refused")
                assert explained(view, verdict), verdict


@SETTINGS
@given(stale_cases(reservations=False, holds=False))
def test_stale_data_without_holds_or_reservations_refuses_no_replica_that_fits(
    case: tuple[SiteSpec, Snapshot | None, Replica, list[str]],
) -> None:
    spec, snapshot, rep, candidates = case
    with state_of(spec, snapshot) as state:
        view = state.view()
        decision = decide(view, rep, candidates)
        for verdict in decision.verdicts:
            fits_empty = all(
                verdict.estimate.watts <= domain.limit - domain.other_watts
                for domain in domains_of(view, verdict.node.node)
                if domain.limit is not None
            )
            if fits_empty:
                assert verdict.refusals == [], verdict
        if candidates and all(v.refusals == [] for v in decision.verdicts):
            assert decision.order != []


# --- (c) observe mode never refuses -----------------------------------------------------------

any_freshness = st.none() | st.fixed_dictionaries(
    {name: st.sampled_from(["fresh", "fresh", "stale", "never"]) for name in sorted(PARTS)}
)


@composite
def observe_cases(draw: DrawFn) -> tuple[SiteSpec, Snapshot, Replica, list[str]]:
    spec = draw(site_specs(mode="observe"))
    return (
        spec,
        spec.snapshot(draw(any_freshness)),
        draw(replicas),
        draw(candidate_lists(spec.nodes)),
    )


@SETTINGS
@given(observe_cases())
def test_observe_refuses_only_holds_and_keeps_the_scheduler_order(
    case: tuple[SiteSpec, Snapshot, Replica, list[str]],
) -> None:
    spec, snapshot, rep, candidates = case
    with state_of(spec, snapshot) as state:
        view = state.view()
        answer = decide(view, rep, candidates).as_json()
        assert answer["mode"] == "observe"
        allowed = [node["node"] for node in answer["nodes"] if node["allowed"]]
        assert answer["order"] == allowed  # the scheduler's order, less the held
        assert all(" held: " in reason for node in answer["nodes"] for reason in node["reasons"])
        enforce = dataclasses.replace(
            view, facility=view.facility.model_copy(update={"mode": "enforce"})
        )
        enforced = decide(enforce, rep, candidates).as_json()
        assert [sorted(n["reasons"] + n["would_refuse"]) for n in answer["nodes"]] == [
            sorted(n["reasons"]) for n in enforced["nodes"]
        ]
        for i, node in enumerate(answer["nodes"]):
            request = ReservationRequest(id=f"o-{i}", replica=rep, node=node["node"])
            assert state.reserve(request).created == node["allowed"]


# --- (d) the order is a permutation of the allowed candidates ---------------------------------


@composite
def enforce_cases(draw: DrawFn) -> tuple[SiteSpec, Snapshot, Replica, list[str]]:
    spec = draw(site_specs())
    return (
        spec,
        spec.snapshot(draw(any_freshness)),
        draw(replicas),
        draw(candidate_lists(spec.nodes)),
    )


def check_order(decision: Decision, candidates: list[str]) -> None:
    answer = decision.as_json()
    allowed = [n["node"] for n in answer["nodes"] if n["allowed"]]
    assert [n["node"] for n in answer["nodes"]] == candidates
    assert sorted(answer["order"]) == sorted(allowed)
    assert len(set(answer["order"])) == len(answer["order"])
    for node, verdict in zip(answer["nodes"], decision.verdicts, strict=True):
        assert node["allowed"] == (not verdict.refusals) == ("scores" in node)
        assert node["reasons"] == [reason for _, reason in verdict.refusals]
    keys = {v.node.node: v.key for v in decision.verdicts}
    ranked = [keys[node] for node in answer["order"]]
    assert ranked == sorted(ranked)
    assert [key[-1] for key in ranked if key[:-1] == ranked[0][:-1]] == sorted(
        key[-1] for key in ranked if key[:-1] == ranked[0][:-1]
    )


@SETTINGS
@given(enforce_cases())
def test_enforce_order_is_a_permutation_of_the_allowed(
    case: tuple[SiteSpec, Snapshot, Replica, list[str]],
) -> None:
    spec, snapshot, rep, candidates = case
    with state_of(spec, snapshot) as state:
        decision = decide(state.view(), rep, candidates)
        assert decision.mode == "enforce"
        shares = {0: "none", len(candidates): "all"}
        event(f"allowed: {shares.get(len(decision.order), 'some')}")
        check_order(decision, candidates)
        refused = sum(1 for v in decision.verdicts if v.refusals)
        assert decision.summary().startswith(f"{len(candidates) - refused}/{len(candidates)} ")


# --- (e) a view updated after a change answers as one built from scratch ---------------------

#: A change to the state: ("reserve", node, watts, model, gpus), ("release", index),
#: ("confirm", index), ("hold", domain index), ("unhold", domain index).
Change = tuple[Any, ...]


@composite
def changes(draw: DrawFn) -> tuple[SiteSpec, list[tuple[Change, str]]]:
    spec = draw(site_specs())
    nodes = [*spec.nodes, "ghost"]
    refs = sorted({ref for refs in spec.membership.values() for ref in refs})
    refs.append(DomainRef("rack", "elsewhere"))  # a domain nothing else names
    change = st.one_of(
        st.tuples(
            st.just("reserve"),
            st.sampled_from(nodes),
            st.integers(1, 6_000),  # whole watts: sums are exact, in any order
            st.sampled_from(["a", "b"]),
            st.integers(0, 4),
        ),
        st.tuples(st.sampled_from(["release", "confirm"]), st.integers(0, 20)),
        st.tuples(st.sampled_from(["hold", "unhold"]), st.sampled_from(refs)),
    )
    warmth = st.sampled_from(["none", "domains", "placement", "all"])
    return spec, draw(st.lists(st.tuples(change, warmth), min_size=1, max_size=15))


def apply(state: State, change: Change, step: int) -> None:
    kind = change[0]
    if kind == "reserve":
        _, node, watts, model, gpus = change
        rep = Replica(model=model, profile="unlisted", gpus=gpus, power_watts=float(watts))
        state.reserve(ReservationRequest(id=f"e-{step}", replica=rep, node=node))
    elif kind in ("release", "confirm"):
        ids = [r.id for r in state.reservations()]
        if ids:
            rid = ids[change[1] % len(ids)]
            if kind == "release":
                state.release(rid)
            else:
                state.confirm(rid)
    elif kind == "hold":
        state.hold(change[1], "maintenance")
    else:
        state.release_hold(change[1])


def warm(view: View, nodes: list[str], how: str) -> None:
    """Work out some of the view's figures, so that the next view has those to carry over:
    none, the domains alone (as GET /v1/domains does), a placement's, or everything."""
    if how in ("domains", "all"):
        for ref in view.domain_refs:
            view.domain(ref)
    if how in ("placement", "all"):
        decide(view, Replica(model="a", profile="unlisted", gpus=1, power_watts=1.0), nodes)


GAP_NOTES = ("no fresh condition for ", "no fresh measured power for ")


def without_gaps(answer: dict[str, Any]) -> dict[str, Any]:
    notes = [note for note in answer["missing"] if not note.startswith(GAP_NOTES)]
    return answer | {"missing": notes}


@SETTINGS
@given(changes())
def test_a_view_after_a_change_answers_as_one_built_from_scratch(
    case: tuple[SiteSpec, list[tuple[Change, str]]],
) -> None:
    spec, steps = case
    nodes = [*spec.nodes, "ghost"]
    probes = [
        Replica(model="a", profile="unlisted", gpus=1, power_watts=1_500.0),
        Replica(model="b", profile="derived", gpus=2),
    ]
    with state_of(spec, spec.snapshot()) as state:
        for step, (change, how) in enumerate(steps):
            warm(state.view(), nodes, how)
            apply(state, change, step)
            view = state.view()
            anew = scratch(view)
            for probe in probes:
                settled, built = (
                    decide(view, probe, nodes).as_json(),
                    decide(anew, probe, nodes).as_json(),
                )
                assert without_gaps(settled) == without_gaps(built)
            for ref in anew.domain_refs:
                assert view.domain(ref) == anew.domain(ref), ref
            assert anew.domain_refs <= view.domain_refs
            for ref in view.domain_refs - anew.domain_refs:  # kept until the next refresh
                assert view.domain(ref).reserved == 0 and view.domain(ref).held is None, ref
            for ref, domain in view.domains.items():
                assert domain == anew.domain(ref), ref
            for node in nodes:
                assert view.node(node) == anew.node(node), node


# --- (h) the answer cache and the rules answer alike, in every mode ---------------------------

MODES = st.sampled_from(
    [
        "enforce",
        "observe",
        Modes(power="enforce", thermal="observe"),
        Modes(power="observe", thermal="enforce"),
    ]
)


@SETTINGS
@given(enforce_cases(), MODES)
def test_the_answer_cache_and_the_rules_answer_alike_in_every_mode(
    case: tuple[SiteSpec, Snapshot, Replica, list[str]], mode: Any
) -> None:
    """decider.yaml's placement_cache, on (answers.place) or off (answers.uncached): one
    answer, byte for byte; and an observed concern's refusals are would_refuse alone."""
    spec, snapshot, rep, candidates = case
    with state_of(spec, snapshot) as state:
        base = state.view()
        view = dataclasses.replace(base, facility=base.facility.model_copy(update={"mode": mode}))
        cached = answers.place(view, rep, candidates)
        direct = answers.uncached(view, rep, candidates)
        assert cached.body == direct.body
        assert (cached.order, cached.summary, cached.refused) == (
            direct.order,
            direct.summary,
            direct.refused,
        )
        enforced = view.enforced
        for verdict in decide(view, rep, candidates).verdicts:
            assert all(concern_of(rule) in enforced for rule, _ in verdict.refusals)
            assert all(concern_of(rule) not in enforced for rule, _ in verdict.would_refuse)
