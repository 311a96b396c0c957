"""The decider's HTTP API (DESIGN.md §5, docs/decider.md), with its OpenAPI document.

Reads (placements, headroom, domains) are `async` and read the current View without a lock;
writes run in the thread pool, because they wait for SQLite to reach the disk. Mutating
calls need `Authorization: Bearer <token>`. Every bad body gets a 4xx naming the field.
"""

from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic_core import to_json

from decider import power_capping, shedding
from decider import profiles as profile_ranking
from decider.facility import DomainRef
from decider.giving_way import CountInFlight
from decider.json_body_route import JSONBodyRoute
from decider.models import (
    HoldRequest,
    PlacementRequest,
    PlacementResponse,
    Refusal,
    Replica,
    ReservationOut,
    ReservationRequest,
)
from decider.placement import answers, capacity, phases, profile_choice
from decider.placement.view import View
from decider.store import StoreError

if TYPE_CHECKING:
    from decider.service import Service


def json_response(content: Any, status_code: int = 200) -> Response:
    # pydantic-core's serializer: several times faster than json.dumps on 10,000 verdicts.
    return Response(to_json(content), status_code=status_code, media_type="application/json")


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if part != "body") or "body"


def _problem(error: Mapping[str, Any]) -> str:
    """One validation error as `field.path: message`."""
    if error.get("type") == "json_invalid":  # loc is ("body", character offset)
        position = error["loc"][-1] if len(error["loc"]) > 1 else 0
        reason = error.get("ctx", {}).get("error", "JSON decode error")
        return f"body: not valid JSON at character {position}: {reason}"
    return f"{_field(tuple(error['loc']))}: {error['msg']}"


def create_app(service: Service) -> FastAPI:
    app = FastAPI(
        title="llmgw-facility decider",
        version="1",
        description="Facility-aware placement: power budgets, conditions, reservations "
        "(docs/decider.md).",
    )

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI parses the body before it runs the route's dependencies: a caller without
        # the token learns nothing about its body, it gets the 401 (or 403) first.
        route = request.scope.get("route")
        if isinstance(route, APIRoute) and any(
            dependency.dependency is require_token for dependency in route.dependencies
        ):
            try:
                require_token(request.headers.get("authorization"))
            except HTTPException as denied:
                return await http_exception_handler(request, denied)
        problems = [_problem(error) for error in exc.errors()]
        return JSONResponse({"detail": "; ".join(problems), "problems": problems}, status_code=422)

    @app.exception_handler(StoreError)
    async def _store_failed(_request: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"detail": f"nothing was changed: {exc}"}, status_code=503)

    def require_token(authorization: Annotated[str | None, Header()] = None) -> None:
        token = service.token
        if token is None:
            raise HTTPException(
                403, "mutating calls are disabled: the decider has no token_file configured"
            )
        scheme, _, given = (authorization or "").partition(" ")
        # Bytes: compare_digest refuses str with non-ASCII characters (a 500, not a 401).
        presented = given.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented, token.encode()):
            raise HTTPException(
                401,
                "a bearer token is required: Authorization: Bearer <token_file's token>",
                headers={"WWW-Authenticate": "Bearer"},
            )

    mutating = [Depends(require_token)]

    # --- placement ----------------------------------------------------------------------------

    async def placements(body: PlacementRequest) -> Response:
        view = service.state.view()
        if body.profiles is not None:
            return placement_with_profiles(view, body)
        # decide's answer, its nodes' parts encoded once per View and replica shape.
        answer = answers.place(view, body.replica, body.candidates)
        service.counters.count(
            "placement", view.mode, answer.judged, answer.refusals_by_rule, answer.refused
        )
        record_placement(body.replica, answer.summary, answer.order, answer.refusals)
        return Response(answer.body, media_type="application/json")

    # The body parsed by pydantic-core in one step (decider.json_body_route); the OpenAPI
    # document and the answers to a bad body are FastAPI's.
    app.router.add_api_route(
        "/v1/placements",
        placements,
        methods=["POST"],
        response_model=PlacementResponse,
        summary="Judge a replica against candidate nodes: allowed, ordered, with reasons",
        route_class_override=JSONBodyRoute,
    )

    def placement_with_profiles(view: View, body: PlacementRequest) -> Response:
        """Alternative profiles offered: each judged by `decide` (decider.placement.
        profile_choice); the cache of `answers` holds one replica shape per request."""
        try:
            decision, replica, choice = profile_choice.choose(view, body)
        except profile_choice.BadOption as exc:
            return json_response({"detail": str(exc), "problems": [str(exc)]}, 422)
        refused = sum(1 for verdict in decision.verdicts if verdict.refusals)
        service.counters.count(
            "placement", view.mode, len(decision.verdicts), decision.refusals_by_rule, refused
        )
        answer = decision.as_json()
        answer["profile_choice"] = choice
        record_placement(
            replica,
            answer["summary"],
            decision.order,
            [(v.node.node, reason) for v in decision.verdicts for _, reason in v.refusals],
        )
        return json_response(answer)

    def record_placement(
        replica: Replica, summary: str, order: list[str], refusals: Sequence[tuple[str, str]]
    ) -> None:
        service.decisions.record(
            "placement",
            f"{replica.model} ({replica.profile}, {replica.gpus} GPUs)",
            summary + (f"; first: {order[0]}" if order else "; no node allowed"),
            allowed=bool(order),
            refusals=refusals,
        )

    # --- reservations -------------------------------------------------------------------------

    @app.post(
        "/v1/reservations",
        status_code=201,
        response_model=ReservationOut,
        responses={
            200: {"model": ReservationOut, "description": "the same reservation already exists"},
            409: {"model": Refusal, "description": "refused, with the reasons"},
        },
        dependencies=mutating,
        summary="Check and reserve in one step",
    )
    def reserve(body: ReservationRequest) -> Response:
        outcome = service.state.reserve(body)
        subject = f"{body.id} on {body.node}"
        if outcome.conflict is not None:
            service.decisions.record("reservation", subject, outcome.conflict, allowed=False)
            return json_response({"detail": outcome.conflict, "reasons": []}, 409)
        verdict = outcome.verdict
        if verdict is not None:
            mode = service.state.view().mode
            rules = Counter(dict.fromkeys((rule for rule, _ in verdict.refusals), 1))
            service.counters.count("reservation", mode, 1, rules, 1 if verdict.refusals else 0)
        if outcome.reservation is None:
            assert verdict is not None
            reasons = [reason for _, reason in verdict.refusals]
            service.decisions.record(
                "reservation",
                subject,
                f"refused on {body.node}",
                allowed=False,
                refusals=((body.node, reason) for reason in reasons),
            )
            return json_response(
                {
                    "detail": f"node {body.node} refused: {'; '.join(reasons)}",
                    "reasons": reasons,
                    "missing": list(outcome.missing),
                },
                409,
            )
        content = outcome.reservation.as_json()
        if verdict is not None and verdict.refusals:  # observe mode
            content["would_refuse"] = [reason for _, reason in verdict.refusals]
        content["missing"] = list(outcome.missing)
        would = content.get("would_refuse", [])
        service.decisions.record(
            "reservation",
            subject,
            ("reserved" if outcome.created else "already reserved")
            + (" (observe mode: would be refused)" if would else ""),
            allowed=True,
            refusals=((body.node, reason) for reason in would),
        )
        return json_response(content, 201 if outcome.created else 200)

    @app.get("/v1/reservations", summary="Every reservation, oldest first")
    async def reservations() -> Response:
        return json_response({"reservations": [r.as_json() for r in service.state.reservations()]})

    # `:path`: an id may hold a slash ("team-a/llama-0"), sent as is or as %2F.
    @app.delete("/v1/reservations/{reservation_id:path}", status_code=204, dependencies=mutating)
    def release(reservation_id: str) -> Response:
        if not service.state.release(reservation_id):
            raise HTTPException(404, f"no reservation {reservation_id!r}")
        return Response(status_code=204)

    @app.post(
        "/v1/reservations/{reservation_id:path}/confirm",
        response_model=ReservationOut,
        dependencies=mutating,
        summary="Keep the reservation past its TTL: the replica is running",
    )
    def confirm(reservation_id: str) -> Response:
        reservation = service.state.confirm(reservation_id)
        if reservation is None:
            raise HTTPException(404, f"no reservation {reservation_id!r} (expired or released?)")
        return json_response(reservation.as_json())

    # --- headroom and domains -----------------------------------------------------------------

    @app.get("/v1/headroom", summary="How many more replicas of a profile fit, per domain")
    async def headroom(profile: Annotated[str, Query(min_length=1)]) -> Response:
        view = service.state.view()
        declared = view.facility.profiles.get(profile)
        if declared is None:
            known = ", ".join(sorted(view.facility.profiles)) or "none"
            raise HTTPException(
                404, f"no profile {profile!r} in the facility file (profiles: {known})"
            )
        fits = capacity.fits(view, profile, declared)
        by_phase = capacity.phase_fits(view, profile, declared)
        entries = []
        for fit in fits:
            entry = {"kind": fit.domain.kind, "domain": fit.domain.name, **fit_json(fit)}
            if fit.domain.kind == "pdu" and fit.domain.name in by_phase:
                entry["phases"] = [
                    {"phase": each.phase, **fit_json(each.fit)}
                    for each in by_phase[fit.domain.name]
                ]
            entries.append(entry)
        return json_response(
            {"profile": profile, "domains": entries, "missing": list(view.missing)}
        )

    @app.get("/v1/domains", summary="Every known domain: budget, load, condition, hold")
    async def domains() -> Response:
        view = service.state.view()
        return json_response(
            {
                "domains": [domain_json(view, ref) for ref in sorted(view.domain_refs)],
                "missing": list(view.missing),
            }
        )

    def known(view: View, kind: str, name: str) -> DomainRef:
        try:
            ref = DomainRef.parse(f"{kind}/{name}")
        except ValueError as exc:
            raise HTTPException(404, str(exc)) from exc
        if ref not in view.domain_refs:
            raise HTTPException(
                404,
                f"no domain {ref}: neither in the facility file nor among the nodes' domains",
            )
        return ref

    @app.get("/v1/domains/{kind}/{name}", summary="One domain, its nodes and reservations")
    async def one_domain(kind: str, name: str) -> Response:
        view = service.state.view()
        ref = known(view, kind, name)
        content = domain_json(view, ref)
        content["nodes"] = (
            sorted(node for node, refs in view.snapshot.membership.items() if ref in refs)
            if "membership" in view.fresh
            else []
        )
        content["reservations"] = [
            r.as_json() for r in view.reservations.values() if ref in view.reservation_domains(r)
        ]
        if "phases" in content:  # which nodes the file puts on each phase
            by_phase = phases.phase_members(view, ref.name)
            for entry in content["phases"]:
                entry["nodes"] = by_phase.get(entry["phase"], [])
            content["nodes_without_phase"] = by_phase.get(None, [])
        content["missing"] = list(view.missing)
        return json_response(content)

    @app.post(
        "/v1/domains/{kind}/{name}/hold",
        dependencies=mutating,
        summary="Hold a domain: no new placements until released",
    )
    def hold(kind: str, name: str, body: HoldRequest) -> Response:
        ref = known(service.state.view(), kind, name)
        service.state.hold(ref, body.reason)
        return json_response(domain_json(service.state.view(), ref))

    @app.post(
        "/v1/domains/{kind}/{name}/release",
        dependencies=mutating,
        summary="Release a held domain (a domain not held is left as it is)",
    )
    def release_hold(kind: str, name: str) -> Response:
        ref = known(service.state.view(), kind, name)
        service.state.release_hold(ref)
        return json_response(domain_json(service.state.view(), ref))

    # --- profiles -----------------------------------------------------------------------------

    # `:path`: model names hold slashes ("meta-llama/Llama-3.3-70B-Instruct").
    @app.get(
        "/v1/profiles/{model:path}",
        summary="A model's profiles ranked by measured tokens per joule",
    )
    async def model_profiles(model: str) -> Response:
        view = service.state.view()
        ranked = profile_ranking.standings(view, model)
        if not ranked:
            known = ", ".join(profile_ranking.known_models(view)) or "none"
            raise HTTPException(
                404,
                f"no profile of model {model!r} is measured or declared in the facility file "
                f"(models known: {known})",
            )
        return json_response(profile_ranking.answer(view, model, ranked))

    # --- power capping ------------------------------------------------------------------------

    @app.get(
        "/v1/power-capping",
        summary="The GPU power limit that would bring each warm, hot or over-budget domain "
        "back under its target (a recommendation; nothing is actuated)",
    )
    async def power_capping_recommendations(
        domain: Annotated[str | None, Query(description="kind/name: one domain only")] = None,
    ) -> Response:
        view = service.state.view()
        if domain is None:
            found = power_capping.recommendations(view)
        else:
            kind, _, name = domain.partition("/")
            ref = known(view, kind, name)
            one = power_capping.recommend(view, ref)
            found = [] if one is None else [one]
        return json_response(
            {
                "recommendations": [recommendation.as_json() for recommendation in found],
                "actuated": False,
                "missing": list(view.missing),
            }
        )

    # --- shedding and failover ----------------------------------------------------------------

    @app.get("/v1/shedding", summary="The shedding plan: replicas to move off hot domains")
    def shedding_plan() -> Response:
        # Not async: the plan records its pacing in SQLite (decider.shedding.Shedder).
        settings = service.state.facility.shedding
        result = service.shedder.plan()
        return json_response(result.as_json(settings.hot_for, settings.interval))

    @app.get("/v1/failover", summary="What the loss of one PDU (feed) would overload")
    async def failover(domain: Annotated[str, Query(min_length=1)]) -> Response:
        try:
            ref = DomainRef.parse(domain)
        except ValueError as exc:
            raise HTTPException(422, f"domain: {exc}") from exc
        if ref.kind != "pdu":
            raise HTTPException(422, f"domain: {ref} is not a pdu; give pdu/NAME")
        view = service.state.view()
        feeds = {feed.pdu for _, declared in view.facility.declared() for feed in declared.feeds}
        if ref.name not in feeds and ref not in view.domain_refs:
            known = ", ".join(sorted(feeds)) or "none"
            raise HTTPException(
                404, f"no pdu {ref.name!r}: no domain's feeds name it (feeds: {known})"
            )
        return json_response(shedding.failover(view, ref.name))

    # --- operations ---------------------------------------------------------------------------

    @app.post("/-/reload", dependencies=mutating, summary="Re-read decider.yaml and facility.yaml")
    def reload() -> Response:
        problems = service.reload()
        if problems:
            return json_response(
                {"detail": "kept the running configuration", "problems": problems}, 400
            )
        return json_response({"detail": "reloaded"})

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", summary="Liveness: the process serves")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz", summary="Readiness: the first refresh from Prometheus was attempted")
    async def readyz() -> Response:
        view = service.state.view()
        ready = service.refreshed_once
        body = {
            "ready": ready,
            "prometheus_up": view.snapshot.prometheus_up,
            "missing": list(view.missing),
        }
        return json_response(body, 200 if ready else 503)

    @app.get("/", include_in_schema=False)
    async def status_page() -> HTMLResponse:
        return HTMLResponse(service.render_status_page())

    # Counts the requests in flight, for the refresher to give way to (decider.giving_way).
    app.add_middleware(CountInFlight, in_flight=service.in_flight)
    return app


def domain_json(view: View, ref: DomainRef) -> dict[str, Any]:
    domain = view.domain(ref)
    held = domain.held
    return {
        "kind": ref.kind,
        "domain": ref.name,
        "declared": view.facility.domain(ref.kind, ref.name) is not None,
        "cap_watts": domain.cap,
        "limit_watts": domain.limit,
        "other_watts": domain.other_watts,
        "reserved_watts": round(domain.reserved, 1),
        "measured_watts": domain.measured,
        "load_watts": round(domain.load, 1),
        "load_basis": domain.load_basis,
        "headroom_watts": None if domain.headroom is None else round(domain.headroom, 1),
        "condition": domain.condition,
        "reading_age_seconds": domain.reading_age,
        "held": None if held is None else {"reason": held.reason, "since": held.held_at},
    } | phases_json(view, ref)


def fit_json(fit: capacity.Fit) -> dict[str, Any]:
    """A headroom figure: how many more fit, and what binds."""
    return {
        "fits": fit.replicas,
        "binds": [{"reason": why, "nodes": count} for why, count in fit.binds],
    }


def phases_json(view: View, ref: DomainRef) -> dict[str, Any]:
    """A three-phase pdu's phases (decider.placement.phases); nothing for any other domain."""
    if ref.kind != "pdu" or ref.name not in view.phased_pdus:
        return {}
    return {
        "phases": [
            {
                "phase": state.phase,
                "rating_watts": state.rating,
                "cap_watts": state.cap,
                "limit_watts": state.limit,
                "other_watts": state.other_watts,
                "reserved_watts": round(state.reserved, 1),
                "load_watts": round(state.load, 1),
                "load_basis": state.load_basis,
                "headroom_watts": round(state.headroom, 1),
            }
            for state in phases.pdu_phases(view, ref.name)
        ]
    }
