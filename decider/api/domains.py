"""/v1/domains: every domain, one domain with its nodes and reservations, holds, overrides."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from decider.api.http import RequireToken, TokenFirstRoute, json_response, known_domain
from decider.domains_json import domain_json
from decider.models import HoldRequest, OverrideRequest
from decider.placement import phases
from decider.service import Service


def router(service: Service, require_token: RequireToken) -> APIRouter:
    # Every mutating call's token checked before its body is read.
    routes = APIRouter(route_class=TokenFirstRoute)
    mutating = [Depends(require_token)]

    @routes.get("/v1/domains", summary="Every known domain: budget, load, condition, hold")
    async def domains() -> Response:
        view = service.state.view()
        return json_response(
            {
                "domains": [domain_json(view, ref) for ref in sorted(view.domain_refs)],
                "missing": list(view.missing),
            }
        )

    @routes.get("/v1/domains/{kind}/{name}", summary="One domain, its nodes and reservations")
    async def one_domain(kind: str, name: str) -> Response:
        view = service.state.view()
        ref = known_domain(view, kind, name)
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

    @routes.post(
        "/v1/domains/{kind}/{name}/hold",
        dependencies=mutating,
        summary="Hold a domain: no new placements until released",
    )
    def hold(kind: str, name: str, body: HoldRequest) -> Response:
        ref = known_domain(service.state.view(), kind, name)
        service.state.hold(ref, body.reason)
        return json_response(domain_json(service.state.view(), ref))

    @routes.post(
        "/v1/domains/{kind}/{name}/release",
        dependencies=mutating,
        summary="Release a held domain (a domain not held is left as it is)",
    )
    def release_hold(kind: str, name: str) -> Response:
        ref = known_domain(service.state.view(), kind, name)
        service.state.release_hold(ref)
        return json_response(domain_json(service.state.view(), ref))

    @routes.post(
        "/v1/domains/{kind}/{name}/override",
        dependencies=mutating,
        summary="Clear a domain's condition (a sensor fault) for a while: read as ok until then",
    )
    def override(kind: str, name: str, body: OverrideRequest) -> Response:
        ref = known_domain(service.state.view(), kind, name)
        service.state.override(ref, body.reason, body.for_seconds, body.by)
        return json_response(domain_json(service.state.view(), ref))

    def end_override(kind: str, name: str) -> Response:
        ref = known_domain(service.state.view(), kind, name)
        service.state.end_override(ref)
        return json_response(domain_json(service.state.view(), ref))

    summary = "End a domain's override now (a domain with none is left as it is)"
    routes.add_api_route(
        "/v1/domains/{kind}/{name}/override/release",
        end_override,
        methods=["POST"],
        dependencies=mutating,
        summary=summary,
    )
    routes.add_api_route(
        "/v1/domains/{kind}/{name}/override",
        end_override,
        methods=["DELETE"],
        dependencies=mutating,
        summary=summary,
        operation_id="end_override_delete",
    )

    return routes
