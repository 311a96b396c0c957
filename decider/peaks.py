"""The `peaks` part's query (decider.snapshot.OPTIONAL_PARTS): what admission against a
predicted peak reads (decider.placement.predicted_peak, docs/facility.md "Oversubscription").

Asked only where some domain of the facility file sets `oversubscribe: true`, and only about
those domains, so a site that does not opt in runs no query of it. One query, its series
told apart by a `figure` label (decider.prometheus_parse reads them):

- `peak_watts` {kind, domain}: the domain's measured power at `oversubscription.percentile`
  over `window`, `quantile_over_time` of llmgw_domain_measured_watts (what the rules record
  for each domain, docs/rules.md);
- `history_seconds` {kind, domain}: how much of the window holds measurements, since the
  first sample in it, to the subquery's step (a 2,016th of the window: 5 min of 7 days);
- `capped_share` {kind, domain}: the share of the window's samples (the same subquery's
  steps) at which the domain's capping ladder was at step 1 or 2, from the decider's own
  `llmgw_decider_capping_step` (decider.capping.collector: the decider must be scraped);
  samples where no decider reported the domain count for nothing either way, and a domain
  with none in the window has no figure (admission then errs towards capped: the capped
  guard of decider.placement.predicted_peak). Prometheus keeps it across the decider's
  restarts, which an in-memory record would not;
- `unit_peak_watts` {model, profile}: one replica's peak, the largest of its units' power
  at the same percentile over the window (llmgw:unit_power_watts, rules/energy.yml).

Plain PromQL, so VictoriaMetrics, Thanos and Mimir run it too. Its cost is one read of each
opted-in domain's and each unit's samples over the window; the refresher reads it at the
inventory parts' pace, not every refresh (decider.refresher).
"""

from __future__ import annotations

from decider.facility import Facility, Kind
from decider.promql import format_duration

#: The history subquery's steps over the window: 5 min steps over 7 days.
HISTORY_STEPS = 2016
DOMAIN_SERIES = "llmgw_domain_measured_watts"
STEP_SERIES = "llmgw_decider_capping_step"
UNIT_SERIES = "llmgw:unit_power_watts"


def oversubscribed(facility: Facility) -> dict[Kind, list[str]]:
    """The domains that opt in, their names by kind, in the file's order."""
    found: dict[Kind, list[str]] = {}
    for ref, domain in facility.declared():
        if domain.oversubscribe:
            found.setdefault(ref.kind, []).append(ref.name)
    return found


def query(facility: Facility) -> str | None:
    """The peaks part's PromQL for this facility file; None where no domain opts in."""
    domains = oversubscribed(facility)
    if not domains:
        return None
    settings = facility.oversubscription
    percentile = f"{settings.percentile:g}"
    window = format_duration(settings.window)
    step = format_duration(max(1.0, round(settings.window / HISTORY_STEPS)))
    figures: list[str] = []
    for kind, names in domains.items():
        # Names are letters, digits and . _ : - (decider.names): only `.` means more in RE2.
        alternation = "|".join(name.replace(".", "\\\\.") for name in names)
        matchers = f'{{kind="{kind}",domain=~"{alternation}"}}'
        selector = f"{DOMAIN_SERIES}{matchers}"
        figures.append(
            _labelled(
                "peak_watts",
                f"max by (kind, domain) (quantile_over_time({percentile}, {selector}[{window}]))",
            )
        )
        figures.append(
            _labelled(
                "history_seconds",
                f"time() - min by (kind, domain) (min_over_time(timestamp({selector})"
                f"[{window}:{step}]))",
            )
        )
        figures.append(
            _labelled(
                "capped_share",
                f"avg_over_time((max by (kind, domain) ({STEP_SERIES}{matchers}) > bool 0)"
                f"[{window}:{step}])",
            )
        )
    figures.append(
        _labelled(
            "unit_peak_watts",
            f"max by (model, profile) (quantile_over_time({percentile}, {UNIT_SERIES}[{window}]))",
        )
    )
    return " or ".join(figures)


def _labelled(figure: str, expression: str) -> str:
    return f'label_replace({expression}, "figure", "{figure}", "", "")'
