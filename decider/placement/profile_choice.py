"""Placement with alternative profiles: prefer the one that makes more tokens per joule.

A placement request may offer `profiles`, other shapes the scheduler could run the replica
as. The replica's own profile stays the default; an alternative replaces it only when

1. both have a fresh measurement (decider.profiles.fresh_figures: the snapshot's latest
   `profiles` read, itself fresh) and the alternative's tokens per joule is higher, and
2. at least one candidate node allows it (every rule judges it with its own estimate: a
   profile with another GPU count or draw changes the estimate, so the room it needs).

Alternatives are tried best first; the first one some node allows wins; if none does, the
default is answered. A missing or stale measurement never moves a replica off its
profile: without figures for both there is nothing to compare. In `observe` mode the
default is always answered and `would_choose` says what enforce mode would have picked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from decider.models import PlacementRequest, Replica
from decider.placement import Decision, decide
from decider.placement.view import View
from decider.profiles import fresh_figures
from decider.snapshot import ProfileFigures

name = "profile_choice"


class BadOption(ValueError):
    """An offered profile that cannot be judged; `field` is its path in the request body."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass
class Option:
    replica: Replica
    figures: ProfileFigures | None  # fresh figures only
    status: str  # measured | stale | unmeasured
    decision: Decision | None = None

    @property
    def profile(self) -> str:
        return self.replica.profile

    def allowed(self) -> int | None:
        if self.decision is None:
            return None
        return sum(1 for verdict in self.decision.verdicts if not verdict.refusals)


def options(view: View, request: PlacementRequest) -> list[Option]:
    """The default (the replica's own profile) first, then each alternative offered.

    Raises BadOption for an alternative without a GPU count that the facility file does not
    declare, or one naming the replica's own profile with another GPU count."""
    replica = request.replica
    replicas = [replica]
    for index, offered in enumerate(request.profiles or []):
        field = f"profiles.{index}"
        if offered.profile == replica.profile:
            if offered.gpus is not None and offered.gpus != replica.gpus:
                raise BadOption(
                    f"{field}.gpus",
                    f"{offered.gpus} GPUs, but the replica's own profile {replica.profile!r} "
                    f"has {replica.gpus}",
                )
            continue  # the default is always considered
        gpus = offered.gpus
        if gpus is None:
            declared = view.facility.profiles.get(offered.profile)
            if declared is None:
                raise BadOption(
                    f"{field}.gpus",
                    f"required: profile {offered.profile!r} is not in the facility file",
                )
            gpus = declared.gpus
        replicas.append(
            Replica(
                model=replica.model,
                profile=offered.profile,
                gpus=gpus,
                cpu_cores=offered.cpu_cores,
                power_watts=offered.power_watts,
                class_=replica.class_,
            )
        )
    found = []
    for candidate in replicas:
        figures = fresh_figures(view, candidate.model, candidate.profile)
        if figures is not None:
            status = "measured"
        elif (candidate.model, candidate.profile) in view.snapshot.profiles:
            status = "stale"
        else:
            status = "unmeasured"
        found.append(Option(candidate, figures, status))
    return found


def _placeable(decision: Decision) -> bool:
    return any(not verdict.refusals for verdict in decision.verdicts)


def choose(view: View, request: PlacementRequest) -> tuple[Decision, Replica, dict[str, Any]]:
    """The decision to answer, the replica it judged, and the `profile_choice` body."""
    offered = options(view, request)
    default = offered[0]
    candidates = request.candidates
    better: list[Option] = []
    if default.figures is not None:
        floor = default.figures.tokens_per_joule
        better = sorted(
            (o for o in offered[1:] if o.figures and o.figures.tokens_per_joule > floor),
            key=lambda o: (-(o.figures.tokens_per_joule if o.figures else 0.0), o.profile),
        )
    pick = default
    for option in [*better, default]:
        option.decision = decide(view, option.replica, candidates)
        if _placeable(option.decision):
            pick = option
            break
    if default.decision is None:
        default.decision = decide(view, default.replica, candidates)
    reason = _reason(default, pick, better, offered)
    observe = view.mode == "observe"
    answered = default if observe else pick
    assert answered.decision is not None
    choice = {
        "chosen": answered.profile,
        "default": default.profile,
        "would_choose": pick.profile if observe else None,
        "reason": (f"observe mode, the replica's own profile is answered; {reason}")
        if observe and pick is not default
        else reason,
        "considered": [
            {
                "profile": o.profile,
                "gpus": o.replica.gpus,
                "status": o.status,
                "tokens_per_joule": None if o.figures is None else o.figures.tokens_per_joule,
                "age_seconds": None
                if o.figures is None
                else round(max(0.0, view.now - o.figures.read_at), 1),
                "allowed_nodes": o.allowed(),
            }
            for o in offered
        ],
    }
    return answered.decision, answered.replica, choice


def _tpj(option: Option) -> str:
    assert option.figures is not None
    return f"{option.figures.tokens_per_joule:.3g}"


def _reason(default: Option, pick: Option, better: list[Option], offered: list[Option]) -> str:
    unmeasured = [o.profile for o in offered[1:] if o.figures is None]
    not_compared = (
        f"; not compared, no fresh measurement: {', '.join(unmeasured)}" if unmeasured else ""
    )
    if default.figures is None:
        return (
            f"kept {default.profile}, the replica's own profile: it has no fresh measurement "
            f"({default.status}), so no alternative is compared with it"
        )
    if pick is not default:
        skipped = better[: better.index(pick)]
        passed = (
            f"; {', '.join(o.profile for o in skipped)} measure better but no candidate node "
            "allows them"
            if skipped
            else ""
        )
        return (
            f"{pick.profile} chosen over {default.profile} (the replica's own): "
            f"{_tpj(pick)} vs {_tpj(default)} tokens/J, both freshly measured{passed}"
            f"{not_compared}"
        )
    if better:
        return (
            f"kept {default.profile} ({_tpj(default)} tokens/J): "
            + ", ".join(f"{o.profile} ({_tpj(o)})" for o in better)
            + " measure better but no candidate node allows them"
            + not_compared
        )
    return (
        f"kept {default.profile} ({_tpj(default)} tokens/J): no alternative with a fresh "
        f"measurement does better{not_compared}"
    )
