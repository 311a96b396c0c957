"""A model's profiles ranked by measured tokens per joule (`GET /v1/profiles/{model}`).

The figures are rules/energy.yml's, per model and profile over the units that count tokens
(`llmgw:model_profile_tokens_per_joule:ratio5m` and its sums), read into the snapshot's
`profiles` part (decider.refresher). A profile is:

- `measured`: in the part's latest successful read, and that read is fresh
  (`staleness.readings`): ranked, best (most tokens per joule) first, ties by name;
- `stale`: read before but not now (no replica of it counts tokens any more, or the part is
  stale): its last figures are shown with their age, never ranked;
- `unmeasured`: declared in the facility file for the model (`profiles.<name>.models`) and
  never read since the decider started: listed, never ranked.

Per-replica figures are the profile's sums over its `units`. `age_seconds` runs from the
decider's last read of the figure; the figure itself is a 5-minute ratio whose sample was
at most the query window (`staleness.readings`) old at that read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from decider.placement.view import View
from decider.snapshot import ProfileFigures

Status = Literal["measured", "stale", "unmeasured"]
_STATUS_ORDER: dict[str, int] = {"measured": 0, "stale": 1, "unmeasured": 2}


def fresh_figures(view: View, model: str, profile: str) -> ProfileFigures | None:
    """The profile's figures if they are from the part's latest read and that read is fresh."""
    figures = view.snapshot.profiles.get((model, profile))
    if figures is None or "profiles" not in view.fresh:
        return None
    return figures if figures.read_at == view.snapshot.parts["profiles"].read_at else None


@dataclass(frozen=True, slots=True)
class Standing:
    """One profile of a model: its figures (None where unknown), status and rank."""

    profile: str
    status: Status
    declared: bool  # in the facility file with this model among its `models`
    gpus: int | None  # the facility file's, where it declares the profile
    tokens_per_joule: float | None = None
    tokens_per_second: float | None = None  # per replica
    watts: float | None = None  # per replica
    replicas: int | None = None  # the units the figures are over
    age_seconds: float | None = None
    rank: int | None = None  # 1 = best; None: not ranked (stale or unmeasured)

    def as_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "rank": self.rank,
            "status": self.status,
            "tokens_per_joule": _round(self.tokens_per_joule, 4),
            "tokens_per_second": _round(self.tokens_per_second, 1),
            "watts": _round(self.watts, 1),
            "replicas": self.replicas,
            "age_seconds": _round(self.age_seconds, 1),
            "declared": self.declared,
            "gpus": self.gpus,
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _standing(view: View, model: str, profile: str, figures: ProfileFigures | None) -> Standing:
    declared = view.facility.profiles.get(profile)
    is_declared = declared is not None and model in declared.models
    gpus = declared.gpus if declared is not None else None
    if figures is None:
        return Standing(profile, "unmeasured", is_declared, gpus)
    units = figures.units

    def per_replica(total: float | None) -> float | None:
        return None if total is None or not units else total / units

    fresh = fresh_figures(view, model, profile) is not None
    return Standing(
        profile=profile,
        status="measured" if fresh else "stale",
        declared=is_declared,
        gpus=gpus,
        tokens_per_joule=figures.tokens_per_joule,
        tokens_per_second=per_replica(figures.tokens_per_second),
        watts=per_replica(figures.watts),
        replicas=units,
        age_seconds=max(0.0, view.now - figures.read_at),
    )


def standings(view: View, model: str) -> list[Standing]:
    """Every profile known for `model`, measured ones ranked first; empty: an unknown model."""
    found: dict[str, ProfileFigures | None] = {
        profile: figures
        for (measured_model, profile), figures in view.snapshot.profiles.items()
        if measured_model == model
    }
    for name, declared in view.facility.profiles.items():
        if model in declared.models:
            found.setdefault(name, None)
    listed = [_standing(view, model, name, figures) for name, figures in found.items()]
    listed.sort(key=lambda s: (_STATUS_ORDER[s.status], -(s.tokens_per_joule or 0.0), s.profile))
    ranked = []
    for position, standing in enumerate(listed, start=1):
        if standing.status == "measured":
            standing = Standing(**{**_fields(standing), "rank": position})
        ranked.append(standing)
    return ranked


def _fields(standing: Standing) -> dict[str, Any]:
    return {name: getattr(standing, name) for name in Standing.__slots__}


def known_models(view: View) -> list[str]:
    """Models with a measurement or a declared profile: what an unknown model's answer lists."""
    models = {model for model, _ in view.snapshot.profiles}
    for declared in view.facility.profiles.values():
        models.update(declared.models)
    return sorted(models)


def summary(model: str, ranked: list[Standing]) -> str:
    """One line: the best profile and its figures, or why there is none."""
    measured = [s for s in ranked if s.status == "measured"]
    others = len(ranked) - len(measured)
    rest = f"; {others} not ranked (no fresh measurement)" if others else ""
    if not measured:
        return f"{model}: no profile has a fresh measurement{rest}"
    best = measured[0]
    head = f"{model}: best {best.profile}, {best.tokens_per_joule:.3g} tokens/J"
    if len(measured) > 1:
        runner = measured[1]
        head += f" (next {runner.profile}, {runner.tokens_per_joule:.3g})"
    return head + rest


def answer(view: View, model: str, ranked: list[Standing]) -> dict[str, Any]:
    """GET /v1/profiles/{model}'s body."""
    measured = [s for s in ranked if s.status == "measured"]
    missing = [line for line in view.missing if line.startswith("measured tokens per joule")]
    return {
        "model": model,
        "best": measured[0].profile if measured else None,
        "profiles": [standing.as_json() for standing in ranked],
        "summary": summary(model, ranked),
        "missing": missing,
    }
