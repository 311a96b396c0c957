"""A domain as the API's answers and the status page show it: budget, load, condition and
its evidence, hold, override, a three-phase pdu's phases, and an oversubscribed domain's
admission basis. Below both, so that the service never imports the API."""

from __future__ import annotations

from typing import Any

from decider import overrides
from decider.facility import DomainRef
from decider.placement import evidence as thermal_evidence
from decider.placement import phases
from decider.placement.predicted_peak import Prediction
from decider.placement.view import View
from decider.snapshot import Condition


def domain_json(view: View, ref: DomainRef) -> dict[str, Any]:
    domain = view.domain(ref)
    held = domain.held
    return (
        {
            "kind": ref.kind,
            "domain": ref.name,
            "declared": view.facility.domain(ref.kind, ref.name) is not None,
            "cap_watts": domain.cap,
            "limit_watts": domain.limit,
            "other_watts": domain.other_watts,
            "reserved_watts": round(domain.reserved, 1),
            "measured_watts": domain.measured,
            "load_watts": round(domain.load, 1),
            "load_basis": domain.load_basis,
            # room_watts: limit - load, what placement allows; headroom_watts: cap - load.
            "room_watts": None if domain.room is None else round(domain.room, 1),
            "headroom_watts": None if domain.headroom is None else round(domain.headroom, 1),
            "condition": domain.condition,
            "reading_age_seconds": domain.reading_age,
            "held": None if held is None else {"reason": held.reason, "since": held.held_at},
            "override": override_json(view, ref),
            "evidence": evidence_words(view, ref, domain.condition),
        }
        | phases_json(view, ref)
        | admission_json(domain.prediction, domain.limit, domain.other_watts)
    )


def admission_json(
    prediction: Prediction | None, limit: float | None, other_watts: float
) -> dict[str, Any]:
    """An oversubscribed domain's admission basis, `predicted` or `reserved` (today's rule),
    with its figures (decider.placement.predicted_peak); nothing for any other domain."""
    if prediction is None:
        return {}
    return {"admission": prediction.as_json(limit, other_watts)}


def evidence_words(view: View, ref: DomainRef, condition: Condition) -> str | None:
    """What holds a warm or hot domain there, with its figures and for how long
    (decider.placement.evidence); None for any other, or without the evidence part."""
    if condition not in ("warm", "hot"):
        return None
    found = view.snapshot.evidence.get(ref) if "evidence" in view.fresh else None
    hot_seconds = view.snapshot.hot_seconds.get(ref) if "hot" in view.fresh else None
    return thermal_evidence.words(
        ref, condition, thermal_evidence.of(condition, found, hot_seconds)
    )


def override_json(view: View, ref: DomainRef) -> dict[str, Any] | None:
    """The override in force on the domain (docs/decider.md, "Overrides"): `condition` is
    what the rules say, the domain's own `condition` what placement reads (`ok`)."""
    override = view.overrides.get(ref)
    if override is None or not override.active(view.now):
        return None
    conditions = view.snapshot.conditions if "conditions" in view.fresh else {}
    condition = conditions.get(ref, "unknown")
    return {
        "reason": override.reason,
        "by": override.by,
        "since": override.set_at,
        "until": override.expires_at,
        "condition": condition,
        "text": overrides.describe(ref, condition, override, view.now),
    }


def phases_json(view: View, ref: DomainRef) -> dict[str, Any]:
    """A three-phase pdu's phases (decider.placement.phases); nothing for any other domain."""
    if ref.kind != "pdu" or ref.name not in view.phased_pdus:
        return {}
    return {
        "phases": [
            {
                "phase": state.phase,
                "rating_watts": state.rating,
                "cap_watts": state.cap,
                "limit_watts": state.limit,
                "other_watts": state.other_watts,
                "reserved_watts": round(state.reserved, 1),
                "measured_watts": state.measured,
                "load_watts": round(state.load, 1),
                "load_basis": state.load_basis,
                "room_watts": round(state.room, 1),
                "headroom_watts": round(state.headroom, 1),
            }
            for state in phases.pdu_phases(view, ref.name)
        ]
    }
