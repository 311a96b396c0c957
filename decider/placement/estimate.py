"""A replica's estimated draw on one node (DESIGN.md §5).

Declared first: the request's `power_watts`, else the facility file's profile figure. Else
derived: GPUs × the node's enforced GPU power limit + the node share for those GPUs
(`node_share_watts` × gpus / the node's GPUs); a replica with no GPUs: CPU cores × the
watts per core of the node's CPU model (`cpu_watts_per_core`, keyed on the models the node's
`llmgw_node_cpu_info` names, the largest where it names two), else of `default`: where the
model is unknown, or the file gives it no figure. Where the node's limit is unknown the
site's largest known limit stands in, and where its GPU count is unknown the replica takes
the whole node share: both err high, and both are said in `missing`. Where no node's
limit is known, the facility file's `fallback_gpu_watts` stands in; without it the estimate
is the node share alone, too low, and `missing` says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from decider.facility import Facility
from decider.models import Replica
from decider.placement.view import NodeState


@dataclass(frozen=True, slots=True)
class Estimate:
    watts: float
    basis: str  # declared | profile | derived
    gaps: tuple[str, ...] = ()  # what was unknown, for `missing`: "limit" or "no-limit", "gpus"


def estimate(
    replica: Replica,
    node: NodeState,
    facility: Facility,
    site_limit: float | None,
    cpu_models: Iterable[str] | None = None,
) -> Estimate:
    """The replica's draw on `node`; `cpu_models`, for a replica with no GPUs: the node's
    CPU models where not its state's own (NodeState.cpu_models, from the `cpus` part)."""
    if replica.power_watts is not None:
        return Estimate(replica.power_watts, "declared")
    profile = facility.profiles.get(replica.profile)
    if profile is not None and profile.power_watts is not None:
        return Estimate(profile.power_watts, "profile")
    if replica.gpus == 0:
        cores = replica.cpu_cores
        if cores is None and profile is not None:
            cores = profile.cpu_cores
        models = node.cpu_models if cpu_models is None else cpu_models
        per_core, _ = facility.cpu_watts_per_core.for_models(models)
        return Estimate((cores or 0.0) * per_core, "derived")
    gaps: tuple[str, ...] = ()
    limit = node.gpu_limit_watts
    if limit is None:
        if site_limit is not None:
            limit, gaps = site_limit, ("limit",)
        elif facility.fallback_gpu_watts is not None:
            limit, gaps = facility.fallback_gpu_watts, ("fallback",)
        else:
            limit, gaps = 0.0, ("no-limit",)
    share = facility.node_share_watts
    if node.gpus is None:
        gaps += ("gpus",)
    elif node.gpus > 0:  # a node that reports no GPUs keeps its whole share
        share *= min(1.0, replica.gpus / node.gpus)
    return Estimate(replica.gpus * limit + share, "derived", gaps)
