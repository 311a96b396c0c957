"""Overrides of a domain's condition (docs/decider.md, "Overrides"): how one reads in the
answers. The facility team clears a condition it knows to be a sensor fault, with a reason
and an expiry; decider.store keeps it, decider.state drops it at expiry, and the View reads
the domain as `ok` meanwhile (decider.placement.view)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from decider.facility import DomainRef
from decider.snapshot import Condition
from decider.store import Override

#: The shortest override: a minute (the longest: decider.store.OVERRIDE_MAX_SECONDS).
OVERRIDE_MIN_SECONDS = 60.0


def until_text(expires_at: float, now: float) -> str:
    """`14:00 UTC` the same UTC day as `now`, else `2026-12-05 14:00 UTC`."""
    end, today = time.gmtime(expires_at), time.gmtime(now)
    same_day = end[:3] == today[:3]
    return time.strftime("%H:%M UTC" if same_day else "%Y-%m-%d %H:%M UTC", end)


def describe(ref: DomainRef, condition: Condition, override: Override, now: float) -> str:
    """ "row 12 hot, overridden by ops until 14:00 UTC: sensor fault": the condition the
    rules give (`condition`), and the override that clears it."""
    return (
        f"{ref.kind} {ref.name} {condition}, overridden by {override.by} until "
        f"{until_text(override.expires_at, now)}: {override.reason}"
    )


def notes(
    overrides: Mapping[DomainRef, Override],
    conditions: Mapping[DomainRef, Condition],
    now: float,
) -> list[str]:
    """One line per override in force, for every answer's `missing`: what the rules say of
    the domain (`conditions`, fresh; else unknown) and who cleared it until when."""
    return [
        describe(ref, conditions.get(ref, "unknown"), override, now)
        for ref, override in sorted(overrides.items())
        if override.active(now)
    ]
