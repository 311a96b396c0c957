"""GET /v1/shedding (the plan: replicas to move off hot domains) and GET /v1/failover (what
the loss of one PDU feed would overload)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from decider.api.http import json_response
from decider.facility import DomainRef
from decider.service import Service
from decider.shedding.failover import failover as failover_of


def router(service: Service) -> APIRouter:
    routes = APIRouter()

    @routes.get("/v1/shedding", summary="The shedding plan: replicas to move off hot domains")
    def shedding_plan() -> Response:
        # Not async: the plan records its pacing in SQLite (decider.shedding.shedder.Shedder).
        settings = service.state.facility.shedding
        result = service.shedder.plan()
        return json_response(result.as_json(settings.hot_for, settings.interval))

    @routes.get("/v1/failover", summary="What the loss of one PDU (feed) would overload")
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
        return json_response(failover_of(view, ref.name))

    return routes
