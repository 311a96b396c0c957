"""GET /v1/headroom: how many more replicas of a profile fit, per domain."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from decider.api.http import json_response
from decider.placement import capacity
from decider.service import Service


def fit_json(fit: capacity.Fit) -> dict[str, Any]:
    """A headroom figure: how many more fit, and what binds."""
    return {
        "fits": fit.replicas,
        "binds": [{"reason": why, "nodes": count} for why, count in fit.binds],
    }


def router(service: Service) -> APIRouter:
    routes = APIRouter()

    @routes.get("/v1/headroom", summary="How many more replicas of a profile fit, per domain")
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

    return routes
