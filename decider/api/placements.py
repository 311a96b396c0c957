"""POST /v1/placements: judge a replica against candidate nodes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from fastapi import APIRouter
from fastapi.responses import Response

from decider.api.http import json_response
from decider.json_body_route import JSONBodyRoute
from decider.models import PlacementRequest, PlacementResponse, Replica
from decider.placement import answers, profile_choice, tallies
from decider.placement.view import View
from decider.service import Service


def router(service: Service) -> APIRouter:
    routes = APIRouter()

    async def placements(body: PlacementRequest) -> Response:
        view = service.state.view()
        if body.profiles is not None:
            return placement_with_profiles(view, body)
        # decide's answer, its nodes' parts encoded once per View and replica shape; or,
        # with decider.yaml's placement_cache: false, from the rules at each request.
        place = answers.place if service.loaded.config.placement_cache else answers.uncached
        answer = place(view, body.replica, body.candidates)
        count(answer.judged, answer.refused, answer.applied_by_rule, answer.observed_by_rule)
        record_placement(body.replica, answer.summary, answer.order, answer.refusals)
        return Response(answer.body, media_type="application/json")

    # The body parsed by pydantic-core in one step (decider.json_body_route); the OpenAPI
    # document and the answers to a bad body are FastAPI's.
    routes.add_api_route(
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
        count(len(decision.verdicts), refused, *tallies(decision.verdicts))
        answer = decision.as_json()
        answer["profile_choice"] = choice
        record_placement(
            replica,
            answer["summary"],
            decision.order,
            [(v.node.node, reason) for v in decision.verdicts for _, reason in v.refusals],
        )
        return json_response(answer)

    def count(judged: int, refused: int, applied: Counter[str], observed: Counter[str]) -> None:
        """The decision counters: refusals applied, and those of observed concerns (the mode is
        per concern: one answer may have both)."""
        service.counters.count("placement", "enforce", judged, applied, refused)
        if observed:
            service.counters.count("placement", "observe", 0, observed, 0)

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

    return routes
