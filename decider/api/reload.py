"""POST /-/reload: re-read decider.yaml and facility.yaml, all of it or none."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from decider.api.http import RequireToken, TokenFirstRoute, json_response
from decider.service import Service


def router(service: Service, require_token: RequireToken) -> APIRouter:
    # Every mutating call's token checked before its body is read.
    routes = APIRouter(route_class=TokenFirstRoute)

    @routes.post(
        "/-/reload",
        dependencies=[Depends(require_token)],
        summary="Re-read decider.yaml and facility.yaml",
    )
    def reload(force: bool = False) -> Response:
        # force=true applies a facility file that drops every running budget (Service.reload)
        problems = service.reload(force=force)
        if problems:
            return json_response(
                {"detail": "kept the running configuration", "problems": problems}, 400
            )
        return json_response({"detail": "reloaded"})

    return routes
