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
        selector = f'{DOMAIN_SERIES}{{kind="{kind}",domain=~"{alternation}"}}'
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
            "unit_peak_watts",
            f"max by (model, profile) (quantile_over_time({percentile}, {UNIT_SERIES}[{window}]))",
        )
    )
    return " or ".join(figures)


def _labelled(figure: str, expression: str) -> str:
    return f'label_replace({expression}, "figure", "{figure}", "", "")'
