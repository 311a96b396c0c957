"""GET /v1/profiles/{model}: a model's profiles ranked by measured tokens per joule."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from decider import profiles as profile_ranking
from decider.api.http import json_response
from decider.service import Service


def router(service: Service) -> APIRouter:
    routes = APIRouter()

    # `:path`: model names hold slashes ("meta-llama/Llama-3.3-70B-Instruct").
    @routes.get(
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

    return routes
