"""/v1/reservations: check and reserve in one step, list, confirm, release."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import Response

from decider.api.http import RequireToken, TokenFirstRoute, json_response
from decider.models import Refusal, ReservationOut, ReservationRequest
from decider.placement import tallies
from decider.service import Service


def router(service: Service, require_token: RequireToken) -> APIRouter:
    # Every mutating call's token checked before its body is read.
    routes = APIRouter(route_class=TokenFirstRoute)
    mutating = [Depends(require_token)]

    @routes.post(
        "/v1/reservations",
        status_code=201,
        response_model=ReservationOut,
        responses={
            200: {"model": ReservationOut, "description": "the same reservation already exists"},
            409: {"model": Refusal, "description": "refused, with the reasons"},
        },
        dependencies=mutating,
        summary="Check and reserve in one step",
    )
    def reserve(body: ReservationRequest) -> Response:
        outcome = service.state.reserve(body)
        subject = f"{body.id} on {body.node}"
        if outcome.conflict is not None:
            service.decisions.record("reservation", subject, outcome.conflict, allowed=False)
            return json_response({"detail": outcome.conflict, "reasons": []}, 409)
        verdict = outcome.verdict
        if verdict is not None:
            # Refusals applied, and those of observed concerns (the mode is per concern).
            applied, observed = tallies([verdict])
            refused = 1 if verdict.refusals else 0
            service.counters.count("reservation", "enforce", 1, applied, refused)
            if observed:
                service.counters.count("reservation", "observe", 0, observed, 0)
        if outcome.reservation is None:
            assert verdict is not None
            reasons = [reason for _, reason in verdict.refusals]
            service.decisions.record(
                "reservation",
                subject,
                f"refused on {body.node}",
                allowed=False,
                refusals=((body.node, reason) for reason in reasons),
            )
            return json_response(
                {
                    "detail": f"node {body.node} refused: {'; '.join(reasons)}",
                    "reasons": reasons,
                    "missing": list(outcome.missing),
                },
                409,
            )
        content = outcome.reservation.as_json()
        if verdict is not None and verdict.would_refuse:  # an observed concern's
            content["would_refuse"] = [reason for _, reason in verdict.would_refuse]
        content["missing"] = list(outcome.missing)
        would = content.get("would_refuse", [])
        service.decisions.record(
            "reservation",
            subject,
            ("reserved" if outcome.created else "already reserved")
            + (" (observe mode: would be refused)" if would else ""),
            allowed=True,
            refusals=((body.node, reason) for reason in would),
        )
        return json_response(content, 201 if outcome.created else 200)

    @routes.get("/v1/reservations", summary="Every reservation, oldest first")
    async def reservations() -> Response:
        return json_response({"reservations": [r.as_json() for r in service.state.reservations()]})

    # `:path`: an id may hold a slash ("team-a/llama-0"), sent as is or as %2F.
    @routes.delete("/v1/reservations/{reservation_id:path}", status_code=204, dependencies=mutating)
    def release(reservation_id: str) -> Response:
        if not service.state.release(reservation_id):
            raise HTTPException(404, f"no reservation {reservation_id!r}")
        return Response(status_code=204)

    @routes.post(
        "/v1/reservations/{reservation_id:path}/confirm",
        response_model=ReservationOut,
        dependencies=mutating,
        summary="Keep the reservation past its TTL: the replica is running",
    )
    def confirm(reservation_id: str) -> Response:
        reservation = service.state.confirm(reservation_id)
        if reservation is None:
            raise HTTPException(404, f"no reservation {reservation_id!r} (expired or released?)")
        return json_response(reservation.as_json())

    return routes
