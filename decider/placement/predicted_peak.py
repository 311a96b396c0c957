"""Refuse a node if the replica would take an oversubscribed domain's predicted peak past its
limit, or past what the capping ladder can bring back (issue 20; docs/facility.md
"Oversubscription"). Concern `power`.

A domain that sets `oversubscribe: true` admits against what its replicas draw instead of
the sum of their estimates. Its basis is `predicted` while the `peaks` part (decider.peaks)
is fresh, holds at least `min_history` of the domain's measurements and passes the capped
guard (below); else `reserved`, today's rule (power_cap and over_cap on the larger of
reserved and measured), and the domain's answers say why. On the predicted basis:

- **Predicted peak** = max(measured power at `percentile` over `window`, measured power now)
  + the peaks of the reservations the measurement cannot see yet + `other_watts`. A
  reservation is seen once its replica has been confirmed for `min_history` before the
  peaks were read: until then its replica may not run yet, or not have met its busiest hour
  (a day holds one of each), and it counts on top at its peak. So a burst of reservations in
  one refresh counts whole, each at its peak, and never passes on an old quantile.
- **A replica's peak**: its model profile's measured peak per replica, the largest of its
  units' power at `percentile` over `window` (llmgw:unit_power_watts), where Prometheus has
  one; else its estimate (decider.placement.estimate), as today. On a node that holds no
  reservation yet, plus the rest of the node's share (`first_on_node`): its host comes up
  with it.
- **Admitted** while predicted peak + the replica's peak ≤ the admission line,
  `ladder.admit_to` (first_threshold − admission_headroom) × the domain's limit, cap × (1 −
  margin) (decider.facility.limit_watts, as every rule): admitting to the limit itself would
  fill the domain into the band where the ladder caps, and a full domain would sit capped
  every busy hour (docs/oversubscription-week.md measured 23 % of tokens lost so); admitting
  to the first threshold itself leaves a full domain at the ladder's line for the 1 % of
  the time a p99 leaves over, its lowest class capped; **and** the capping ladder can
  bring the domain back: with the replica, the one per-GPU limit at which every reserved
  GPU fits the limit at the estimates (decider.capping.ladder.safe_gpu_limit) is at least
  the cards' minimum (decider.card_minimum, as the ladder and decider.power_capping take
  it) and the ladder's `floor_gpu_watts`. A domain
  with no GPU to cap must fit at the estimates outright.
- **The capped guard.** A percentile of power the ladder held down is what the caps
  allowed, not what the replicas want: admitting on it fills the domain further, and it is
  capped longer still. A domain whose ladder was at step 1 or 2 for more than (1 −
  `percentile`) of the samples of its window (`capped_share` of the peaks part, from the
  decider's own `llmgw_decider_capping_step`: decider.peaks) is judged by today's rule,
  and says so. With no record of its ladder in the window (the decider not scraped), the
  same: the guard cannot tell, so it errs towards capped.

`predicted_peak_fits` is the pure computation (no View, no I/O): the week simulator calls
it too. `prediction` works out one domain's figures from plain data; `refuse` is the filter
`judge` calls on each oversubscribed domain of a node on the predicted basis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from decider.capping.ladder import safe_gpu_limit
from decider.card_minimum import MIN_LIMIT_FRACTION, card_minimum
from decider.facility import Oversubscription
from decider.snapshot import DomainPeak
from decider.store import Reservation

name = "predicted_peak"
concern = "power"
reads = frozenset({"prediction", "limit", "cap", "margin", "other_watts"})

Basis = Literal["predicted", "reserved"]
#: How the lowest per-GPU limit is named where it is the ladder's floor.
FLOOR_FROM = "the ladder's floor_gpu_watts"


@dataclass(frozen=True, slots=True)
class NewReplica:
    """The replica being placed, as the predicted basis counts it: its peak (`peak_from`
    says where the figure comes from), its GPUs, and its estimate less its GPUs at their
    limit (what no GPU cap lowers)."""

    peak_watts: float
    gpus: int
    non_gpu_watts: float
    peak_from: str = "estimate"


@dataclass(frozen=True, slots=True)
class Fit:
    """What `predicted_peak_fits` found: the predicted peak with and without the replica,
    the safe per-GPU limit with it (None: none fits, or no GPU), and why it does not fit
    (None: it fits; `peak` past the limit, `safe_cap` past what the ladder brings back)."""

    predicted_watts: float
    after_watts: float
    safe_gpu_limit_watts: float | None
    safe_reason: str
    refused: Literal["peak", "safe_cap"] | None


def predicted_peak_fits(
    limit_watts: float,
    other_watts: float,
    measured_peak_watts: float,
    unseen_watts: float,
    reserved_gpus: int,
    reserved_non_gpu_watts: float,
    min_gpu_limit_watts: float,
    replica: NewReplica,
    *,
    admit_to: float,
) -> Fit:
    """Whether one more `replica` fits an oversubscribed domain (module docstring).

    `limit_watts`: cap × (1 − margin); `measured_peak_watts`: max(the measured quantile over
    the window, measured now); `unseen_watts`: the peaks of the reservations the measurement
    cannot see yet; `reserved_gpus`, `reserved_non_gpu_watts`: every reservation's GPUs, and
    its estimate less its GPUs at their limit, summed; `min_gpu_limit_watts`: the lowest
    per-GPU limit the ladder may set (the card's minimum, or the floor where higher);
    `admit_to`: the admission line as a share of `limit_watts` (the ladder's first
    threshold less its admission headroom): the predicted peak with the replica must stay
    under it."""
    predicted = measured_peak_watts + unseen_watts + other_watts
    after = predicted + replica.peak_watts
    gpus = reserved_gpus + replica.gpus
    fixed = other_watts + reserved_non_gpu_watts + replica.non_gpu_watts
    safe: float | None
    if gpus > 0:
        safe, safe_reason = safe_gpu_limit(limit_watts, fixed, gpus, min_gpu_limit_watts)
        bounded = safe is not None
    else:  # nothing to cap: the estimates must fit as they are
        safe, bounded = None, fixed <= limit_watts
        safe_reason = f"no GPU to cap: {fixed / 1000:.1f} kW at the estimates" + (
            "" if bounded else f" past the {limit_watts / 1000:.1f} kW limit"
        )
    refused: Literal["peak", "safe_cap"] | None = None
    if after > admit_to * limit_watts:
        refused = "peak"
    elif not bounded:
        refused = "safe_cap"
    return Fit(predicted, after, safe, safe_reason, refused)


@dataclass(frozen=True, slots=True)
class Prediction:
    """One oversubscribed domain's admission basis and its figures, as the View works them
    out and /v1/domains shows them (`as_json`). On the `reserved` basis, `why` says what is
    missing; the figures known are kept."""

    basis: Basis
    why: str  # the basis in words, with its figures
    percentile: float
    window_seconds: float
    min_history_seconds: float
    history_seconds: float | None
    quantile_watts: float | None  # measured power at `percentile` over the window
    measured_watts: float | None  # measured now
    unseen_count: int  # reservations the measurement cannot see yet
    unseen_watts: float  # their peaks
    reserved_gpus: int
    reserved_non_gpu_watts: float
    min_gpu_limit_watts: float | None  # the card's minimum, or the ladder's floor if higher
    min_gpu_limit_from: str
    admit_to: float  # the admission line: admission fills the limit to this share
    capped_share: float | None  # of the window's samples, the share its ladder was capped

    @property
    def predicted(self) -> bool:
        return self.basis == "predicted"

    @property
    def min_from_floor(self) -> bool:
        """Whether the lowest per-GPU limit is the ladder's floor, not the card's minimum."""
        return self.min_gpu_limit_from.startswith(FLOOR_FROM)

    @property
    def measured_peak_watts(self) -> float:
        """The larger of the measured quantile and the measured power now."""
        return max(self.quantile_watts or 0.0, self.measured_watts or 0.0)

    @property
    def load_watts(self) -> float:
        """What the domain is predicted to draw at its peak, `other_watts` aside."""
        return self.measured_peak_watts + self.unseen_watts

    def as_json(self, limit_watts: float | None, other_watts: float) -> dict[str, object]:
        safe = None
        if self.predicted and limit_watts is not None and self.reserved_gpus:
            fixed = other_watts + self.reserved_non_gpu_watts
            safe, _ = safe_gpu_limit(limit_watts, fixed, self.reserved_gpus, 0.0)
        return {
            "basis": self.basis,
            "why": self.why,
            "percentile": self.percentile,
            "window_seconds": self.window_seconds,
            "min_history_seconds": self.min_history_seconds,
            "history_seconds": _rounded(self.history_seconds),
            "quantile_watts": _rounded(self.quantile_watts),
            "measured_watts": _rounded(self.measured_watts),
            "unseen_reservations": self.unseen_count,
            "unseen_watts": round(self.unseen_watts, 1),
            "predicted_watts": round(self.load_watts + other_watts, 1) if self.predicted else None,
            "admit_to_watts": (
                None if limit_watts is None else round(self.admit_to * limit_watts, 1)
            ),
            "capped_share": None if self.capped_share is None else round(self.capped_share, 4),
            "reserved_gpus": self.reserved_gpus,
            "safe_gpu_limit_watts": safe,
            "min_gpu_limit_watts": _rounded(self.min_gpu_limit_watts),
        }


@dataclass(frozen=True, slots=True)
class ReservedFigures:
    """What the predicted basis counts of one domain's reservations (the View keeps it per
    domain and updates it with each reservation)."""

    gpus: int = 0
    non_gpu_watts: float = 0.0
    unseen_count: int = 0
    unseen_watts: float = 0.0

    def plus(self, other: ReservedFigures, sign: int = 1) -> ReservedFigures:
        return ReservedFigures(
            self.gpus + sign * other.gpus,
            max(0.0, self.non_gpu_watts + sign * other.non_gpu_watts),
            self.unseen_count + sign * other.unseen_count,
            max(0.0, self.unseen_watts + sign * other.unseen_watts),
        )


def seen_before(peaks_read_at: float | None, settings: Oversubscription) -> float | None:
    """Reservations confirmed at or before this time are in the measurements the peaks were
    read from; None: no peaks read, none is."""
    return None if peaks_read_at is None else peaks_read_at - settings.min_history


def replica_peak(
    model: str,
    profile: str,
    estimate_watts: float,
    unit_peaks: Mapping[tuple[str, str], float],
    settings: Oversubscription,
) -> tuple[float, str]:
    """A replica's peak and where it comes from: its profile's measured peak per replica,
    else its estimate."""
    measured = unit_peaks.get((model, profile))
    if measured is not None:
        return measured, f"measured p{_pct(settings.percentile)} of {model}/{profile}"
    return estimate_watts, "estimate"


def host_rest_watts(
    replica_gpus: int, node_gpus: int | None, node_reserved_gpus: int, node_share_watts: float
) -> float:
    """The rest of the node's share a replica brings up beyond its own GPUs' share: all of
    it but those GPUs' on a node that holds no reservation yet, else 0 (the host is up, or
    in the estimate already where the node's GPUs are unknown). Kept with the reservation
    (`Reservation.host_watts`) so that it counts while the measurement cannot see it."""
    if node_reserved_gpus > 0 or node_gpus is None or node_gpus <= 0:
        return 0.0
    return node_share_watts * max(0, node_gpus - replica_gpus) / node_gpus


def first_on_node(
    peak_watts: float,
    peak_from: str,
    replica_gpus: int,
    node_gpus: int | None,
    node_reserved_gpus: int,
    node_share_watts: float,
) -> tuple[float, str]:
    """A replica's peak on a node that holds no reservation yet: its peak plus the rest of
    the node's share (`node_share_watts` x the node's other GPUs / its GPUs), and where the
    figure comes from. Its peak counts its own GPUs' share of the host; the node's first
    replica brings up the whole host where a node with no replica is off, and that is in no
    measurement yet (docs/oversubscription-week.md: a rack admitted a 1-GPU replica onto an
    empty node at its 0.84 kW, the node then drew up to 2.1 kW, and the rack sat capped 80 %
    of the rest of the week). Where the node idles powered, its host is in the measurement
    already and this counts it twice: the safe side, once per node. A node whose GPUs are
    unknown: unchanged (its estimate takes the whole share then, decider.placement.estimate)."""
    rest = host_rest_watts(replica_gpus, node_gpus, node_reserved_gpus, node_share_watts)
    if rest <= 0:
        return peak_watts, peak_from
    return peak_watts + rest, (
        f"{peak_from} + {rest / 1000:.1f} kW, the rest of the node share of a node with no "
        "reservation yet"
    )


def non_gpu_watts(estimate_watts: float, gpus: int, gpu_limit_watts: float | None) -> float:
    """The part of an estimate no GPU cap lowers: the estimate less its GPUs at their limit
    (an unknown limit: all of it, the safe side)."""
    if gpu_limit_watts is None:
        return estimate_watts
    return max(0.0, estimate_watts - gpus * gpu_limit_watts)


def reservation_figures(
    reservation: Reservation,
    gpu_limit_watts: float | None,
    seen_before_time: float | None,
    unit_peaks: Mapping[tuple[str, str], float],
    settings: Oversubscription,
) -> ReservedFigures:
    """One reservation's share of its domains' ReservedFigures."""
    confirmed = reservation.confirmed_at
    seen = confirmed is not None and seen_before_time is not None and confirmed <= seen_before_time
    peak = 0.0
    if not seen:
        profile = str(reservation.replica.get("profile", ""))
        peak, _ = replica_peak(
            reservation.model, profile, reservation.estimate_watts, unit_peaks, settings
        )
        peak += reservation.host_watts  # the host it brought up, as admission counted it
    return ReservedFigures(
        gpus=reservation.gpus,
        non_gpu_watts=non_gpu_watts(reservation.estimate_watts, reservation.gpus, gpu_limit_watts),
        unseen_count=0 if seen else 1,
        unseen_watts=peak,
    )


def min_gpu_limit(
    nodes: Iterable[tuple[float | None, float | None]], floor_watts: float | None
) -> tuple[float | None, str]:
    """The lowest per-GPU limit the ladder may set on every GPU of the domain, from its
    nodes' (enforced GPU limit, published minimum), either None where unknown: the cards'
    minimum (decider.card_minimum, as decider.capping.driver takes it), or the ladder's
    floor where higher."""
    card = card_minimum(nodes)
    if floor_watts is not None and (card is None or floor_watts > card.watts):
        return floor_watts, f"{FLOOR_FROM} {floor_watts:g} W"
    if card is None:
        return None, "no GPU limit known"
    if card.read:
        return card.watts, f"the card minimum {card.watts:g} W (read)"
    return card.watts, (
        f"the card minimum {card.watts:g} W ({MIN_LIMIT_FRACTION:.0%} of "
        f"{card.estimated_from_watts:g} W)"
    )


def prediction(
    settings: Oversubscription,
    peak: DomainPeak | None,
    peaks_fresh: bool,
    measured_watts: float | None,
    reserved: ReservedFigures,
    min_limit: tuple[float | None, str],
) -> Prediction:
    """One oversubscribed domain's basis and figures (module docstring)."""
    history = None if peak is None else peak.history_seconds
    quantile = None if peak is None else peak.peak_watts
    capped = None if peak is None else peak.capped_share
    fallback = _fallback(settings, peaks_fresh, quantile, history, min_limit[0])
    if fallback is None:
        fallback = capped_guard(capped, settings.percentile)
    if fallback is not None:
        why = f"today's rule (reserved estimates): {fallback}"
    else:
        assert quantile is not None and history is not None
        why = f"p{_pct(settings.percentile)} over {_duration(history)} of history " + (
            f"{quantile / 1000:.1f} kW"
        )
        if measured_watts is not None and measured_watts > quantile:
            why += f", measured now {measured_watts / 1000:.1f} kW"
        if reserved.unseen_count:
            why += (
                f" + {reserved.unseen_count} reservation(s) not yet measured "
                f"{reserved.unseen_watts / 1000:.1f} kW"
            )
    return Prediction(
        basis="reserved" if fallback is not None else "predicted",
        why=why,
        percentile=settings.percentile,
        window_seconds=settings.window,
        min_history_seconds=settings.min_history,
        history_seconds=history,
        quantile_watts=quantile,
        measured_watts=measured_watts,
        unseen_count=reserved.unseen_count,
        unseen_watts=reserved.unseen_watts,
        reserved_gpus=reserved.gpus,
        reserved_non_gpu_watts=reserved.non_gpu_watts,
        min_gpu_limit_watts=min_limit[0],
        min_gpu_limit_from=min_limit[1],
        admit_to=settings.ladder.admit_to,
        capped_share=capped,
    )


def capped_guard(capped_share: float | None, percentile: float) -> str | None:
    """Why a domain's measured percentile cannot be admitted on (the capped guard, module
    docstring); None: it can. `capped_share`: the share of the window's samples at which its
    ladder was at step 1 or 2; None: no record of its ladder in the window."""
    if capped_share is None:
        return (
            "no record of its capping ladder in the window (llmgw_decider_capping_step: is "
            "the decider scraped?), so no telling whether its measured power was held down"
        )
    allowed = 1.0 - percentile
    if capped_share > allowed + 1e-9:
        return (
            f"capped {capped_share:.1%} of its window, more than the {allowed:.1%} its "
            f"p{_pct(percentile)} leaves over: its measured power is what the caps allowed"
        )
    return None


def _fallback(
    settings: Oversubscription,
    peaks_fresh: bool,
    quantile: float | None,
    history: float | None,
    min_limit: float | None,
) -> str | None:
    """Why a domain that opts in is judged by today's rule; None: it is not."""
    if not peaks_fresh:
        return "no fresh peaks part from Prometheus"
    if quantile is None or history is None:
        return "no measured power in the window yet"
    if history < settings.min_history:
        return (
            f"{_duration(history)} of history, less than min_history "
            f"{_duration(settings.min_history)}"
        )
    if min_limit is None:
        return "no GPU power limit known among its nodes, so no safe cap bounds it"
    return None


class _Predicted:
    """What `refuse` reads of a domain or phase state (decider.placement.states)."""

    label: str
    prediction: Prediction | None
    limit: float | None
    cap: float | None
    margin: float
    other_watts: float


def refuse(domain: _Predicted, replica: NewReplica) -> str | None:
    """The reason the replica does not fit the domain on its predicted basis; None: it fits,
    or the domain is not on that basis (power_cap and over_cap judge it then)."""
    found = domain.prediction
    if found is None or not found.predicted or domain.limit is None or domain.cap is None:
        return None
    fit = predicted_peak_fits(
        domain.limit,
        domain.other_watts,
        found.measured_peak_watts,
        found.unseen_watts,
        found.reserved_gpus,
        found.reserved_non_gpu_watts,
        found.min_gpu_limit_watts or 0.0,
        replica,
        admit_to=found.admit_to,
    )
    if fit.refused is None:
        return None
    limit = (
        f"limit {domain.limit / 1000:.1f} kW (cap {domain.cap / 1000:.1f}, "
        f"margin {domain.margin * 100:g}%)"
    )
    line = f"its admission line {found.admit_to:g} of its {limit}"
    if fit.refused == "peak":
        return (
            f"{domain.label}: predicted peak {fit.predicted_watts / 1000:.1f} kW ({found.why}"
            + (f", incl. {domain.other_watts / 1000:.1f} other" if domain.other_watts else "")
            + f") + replica's peak ~{replica.peak_watts / 1000:.1f} kW ({replica.peak_from}) "
            f"= {fit.after_watts / 1000:.1f} kW, past {line}"
        )
    return (
        f"{domain.label}: predicted peak {fit.after_watts / 1000:.1f} kW with the replica fits "
        f"{line}, but the capping ladder could not bring it back at the estimates: "
        f"{fit.safe_reason}"
        # safe_gpu_limit names the lowest limit the card minimum; say where it is the floor.
        + (f" (the lowest: {found.min_gpu_limit_from})" if found.min_from_floor else "")
    )


def _pct(percentile: float) -> str:
    return f"{percentile * 100:g}"


def _duration(seconds: float) -> str:
    """`7.0 d`, `5.5 h`, `12 min`, `0.5 s`: a history as reasons show it."""
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.3g} s"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
