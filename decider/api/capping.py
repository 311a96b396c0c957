"""GET /v1/capping (each oversubscribed domain's ladder: step, caps, reason, since) and
GET /v1/capping/leases/{node} (the node agent's lease of its GPU limits, with the token of
mutating calls: issue 20 §3, docs/oversubscription.md "Leases")."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from decider import names
from decider.api.http import RequireToken, TokenFirstRoute, json_response
from decider.capping.driver import NotYetKnown
from decider.service import Service


def router(service: Service, require_token: RequireToken) -> APIRouter:
    routes = APIRouter(route_class=TokenFirstRoute)

    @routes.get(
        "/v1/capping",
        summary="Each oversubscribed domain's capping ladder: step, per-class GPU caps, "
        "reason, since when",
    )
    async def capping() -> Response:
        domains = [capping.as_json() for capping in service.capper.domains()]
        capped = [d for d in domains if d["step"] > 0]
        return json_response(
            {
                "domains": domains,
                "lease_seconds": service.state.facility.oversubscription.lease,
                "summary": f"{len(domains)} oversubscribed domain(s), {len(capped)} capped"
                if domains
                else "no domain sets oversubscribe: true: nothing is capped",
            }
        )

    @routes.get(
        "/v1/capping/leases/{node}",
        dependencies=[Depends(require_token)],
        summary="A node agent's lease of its GPUs' power limit, and the safe limit it "
        "falls to when the lease runs out (bearer token)",
    )
    async def lease(node: str) -> Response:
        try:
            names.check_name(node)
        except ValueError as exc:
            return json_response({"error": f"node: {exc}"}, 422)
        try:
            found = service.capper.lease(node)
        except NotYetKnown as exc:
            return json_response({"error": str(exc)}, 503)
        if found is None:
            return json_response({"error": f"node {node} is in no oversubscribed domain"}, 404)
        return json_response(found.as_json())

    return routes
