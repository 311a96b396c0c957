"""GET /v1/power-capping: the GPU power limits that would bring domains back under target."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from decider import power_capping
from decider.api.http import json_response, known_domain
from decider.service import Service


def router(service: Service) -> APIRouter:
    routes = APIRouter()

    @routes.get(
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
            ref = known_domain(view, kind, name)
            one = power_capping.recommend(view, ref)
            found = [] if one is None else [one]
        return json_response(
            {
                "recommendations": [recommendation.as_json() for recommendation in found],
                "actuated": False,
                "missing": list(view.missing),
            }
        )

    return routes
