"""The HTTP API's bodies (docs/decider.md): validated on the way in, described in /openapi.json.

Shapes from the issue that introduced them; extend them, never change them. Strict types: a
scheduler that sends `"gpus": "4"` or `true` has a bug that should be seen, not guessed
around (a float field still takes a JSON integer). Ids, names and reasons keep to
decider.names.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from decider.names import ClassName, NodeName, PathName, Reason
from decider.overrides import OVERRIDE_MIN_SECONDS
from decider.store import OVERRIDE_MAX_SECONDS


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class Replica(_Body):
    """A replica to place. `power_watts`, when given, is its draw: the operator's figure wins."""

    model: PathName
    profile: PathName
    gpus: int = Field(ge=0, le=1024)
    cpu_cores: float | None = Field(None, gt=0, le=100_000)
    power_watts: float | None = Field(None, gt=0, le=10_000_000)
    class_: ClassName | None = Field(None, alias="class")


class ProfileOption(_Body):
    """Another profile the scheduler could run the replica as (docs/decider.md, "Placement
    with alternative profiles"). `gpus` may be left out for a profile the facility file
    declares; `power_watts`, when given, is its draw."""

    profile: PathName
    gpus: int | None = Field(None, ge=0, le=1024)
    cpu_cores: float | None = Field(None, gt=0, le=100_000)
    power_watts: float | None = Field(None, gt=0, le=10_000_000)


class PlacementRequest(_Body):
    # Not pydantic-core's cache of parsed strings: on a busy decider's cold CPU caches
    # looking each node name up in it costs more than making the string. With one set of
    # the names in _distinct_names: 0.28 against 0.43 ms at 1,000 candidates.
    model_config = ConfigDict(_Body.model_config, cache_strings=False)

    replica: Replica
    candidates: list[NodeName] = Field(
        max_length=100_000, description="node names, scheduler's order"
    )
    profiles: list[ProfileOption] | None = Field(
        None,
        max_length=16,
        description="alternative profiles; the replica's own stays the default",
    )

    @field_validator("profiles")
    @classmethod
    def _distinct_profiles(cls, profiles: list[ProfileOption] | None) -> list[ProfileOption] | None:
        names = [option.profile for option in profiles or []]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"profile {twice[0]!r} is offered more than once")
        return profiles

    @field_validator("candidates")
    @classmethod
    def _distinct_names(cls, candidates: list[str]) -> list[str]:
        names = set(candidates)
        if len(names) != len(candidates):
            seen: set[str] = set()
            twice = next(node for node in candidates if node in seen or seen.add(node))
            raise ValueError(f"node {twice!r} is listed more than once")
        return candidates


class NodeVerdict(_Body):
    node: str
    allowed: bool
    estimate_watts: float
    reasons: list[str] = Field(description="why it is refused (enforce mode); empty if allowed")
    would_refuse: list[str] | None = Field(
        None, description="observe mode: what enforce mode would have refused it for"
    )
    condition: Literal["ok", "warm", "hot", "unknown"]
    headroom_watts: float | None = Field(
        description="room left under the tightest budgeted domain's cap × (1 − margin) after "
        "this replica; negative: by how much it would pass; null: no budget"
    )
    scores: dict[str, float | None] | None = Field(
        None, description="the ordering keys of an allowed node, lower first"
    )
    condition_evidence: list[str] | None = Field(
        None,
        description="an allowed warm node: why it is placed after the ok ones, its warm "
        "domains' evidence in words",
    )


class ProfileConsidered(_Body):
    profile: str
    gpus: int
    status: Literal["measured", "stale", "unmeasured"]
    tokens_per_joule: float | None
    age_seconds: float | None
    allowed_nodes: int | None = Field(
        description="nodes enforce mode allows for it; null: not evaluated"
    )


class ProfileChoice(_Body):
    chosen: str
    default: str = Field(description="the replica's own profile")
    would_choose: str | None = Field(
        None, description="observe mode: what enforce mode would have chosen"
    )
    reason: str
    considered: list[ProfileConsidered]


class PlacementResponse(_Body):
    mode: Literal["observe", "enforce"]
    order: list[str]
    nodes: list[NodeVerdict]
    missing: list[str]
    summary: str
    profile_choice: ProfileChoice | None = Field(
        None, description="only when the request offers `profiles`: which one was judged, why"
    )


class ReservationRequest(_Body):
    # Names joined by '/' (decider.names): no '.' or '..' segment, which HTTP clients drop
    # from a URL, so that DELETE /v1/reservations/{id} reaches every id.
    id: PathName
    replica: Replica
    node: NodeName


class ReservationOut(_Body):
    id: str
    node: str
    replica: dict
    estimate_watts: float
    gpus: int
    domains: list[str]
    created_at: float
    expires_at: float | None
    confirmed_at: float | None
    confirmed: bool
    host_watts: float = Field(
        0.0,
        description="the rest of its node's share beyond its own GPUs' share, where its node "
        "held no reservation when it was made: the host it brought up",
    )
    would_refuse: list[str] | None = Field(
        None, description="observe mode: what enforce mode would have refused the node for"
    )
    missing: list[str] = Field([], description="what the decider did not know when it judged")


class Refusal(_Body):
    detail: str
    reasons: list[str]
    missing: list[str] = []


class HoldRequest(_Body):
    reason: Reason


class OverrideRequest(_Body):
    """Clear a domain's condition (a sensor known to be at fault) for `for_seconds`:
    placement reads it as `ok` until then (docs/decider.md, "Overrides")."""

    reason: Reason
    for_seconds: float = Field(
        ge=OVERRIDE_MIN_SECONDS,
        le=OVERRIDE_MAX_SECONDS,
        description="how long it lasts, from now: a minute to seven days",
    )
    by: NodeName = Field("ops", description="who sets it, shown with it")
