"""The decider's HTTP API (DESIGN.md §5, docs/decider.md), with its OpenAPI document.

One router per resource (placements, reservations, domains and holds, headroom, profiles,
power capping, shedding and failover, operations, reload), each built for the Service it
answers from. Reads (placements, headroom, domains) are `async` and read the current View
without a lock; writes run in the thread pool, because they wait for SQLite to reach the
disk. Mutating calls need `Authorization: Bearer <token>`, checked before the body is read
(decider.api.http.TokenFirstRoute); a body past its limit gets 413 before it is read whole
(decider.api.body_limit). Every bad body gets a 4xx naming the field.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from decider.api import (
    capping,
    domains,
    headroom,
    operations,
    placements,
    power_capping,
    profiles,
    reload,
    reservations,
    shedding,
)
from decider.api.body_limit import BodyLimit
from decider.api.http import RequireToken, problem
from decider.giving_way import CountInFlight
from decider.service import Service
from decider.store import StoreError


def create_app(service: Service) -> FastAPI:
    app = FastAPI(
        title="llmgw-facility decider",
        version="1",
        description="Facility-aware placement: power budgets, conditions, reservations "
        "(docs/decider.md).",
    )
    require_token = RequireToken(service)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_request: Request, exc: RequestValidationError) -> Response:
        problems = [problem(error) for error in exc.errors()]
        return JSONResponse({"detail": "; ".join(problems), "problems": problems}, status_code=422)

    @app.exception_handler(StoreError)
    async def _store_failed(_request: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"detail": f"nothing was changed: {exc}"}, status_code=503)

    for router in (
        placements.router(service),
        reservations.router(service, require_token),
        headroom.router(service),
        domains.router(service, require_token),
        profiles.router(service),
        power_capping.router(service),
        shedding.router(service),
        capping.router(service, require_token),
        reload.router(service, require_token),
        operations.router(service),
    ):
        app.include_router(router)

    app.add_middleware(BodyLimit)
    # Counts the requests in flight, for the refresher to give way to (decider.giving_way).
    app.add_middleware(CountInFlight, in_flight=service.in_flight)
    return app
