"""What an operator and a load balancer read: /metrics, /healthz, /readyz, the status page."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from decider.api.http import json_response
from decider.service import Service


def router(service: Service) -> APIRouter:
    routes = APIRouter()

    @routes.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)

    @routes.get("/healthz", summary="Liveness: the process serves")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @routes.get("/readyz", summary="Readiness: the first refresh from Prometheus was attempted")
    async def readyz() -> Response:
        view = service.state.view()
        database = service.database_problem()  # None: writes reach the file a start reads
        ready = service.refreshed_once and database is None
        body = {
            "ready": ready,
            "prometheus_up": view.snapshot.prometheus_up,
            "missing": list(view.missing),
            "database": database or "ok",
        }
        return json_response(body, 200 if ready else 503)

    @routes.get("/", include_in_schema=False)
    async def status_page() -> HTMLResponse:
        return HTMLResponse(service.render_status_page())

    return routes
