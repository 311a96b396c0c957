"""The week's figures side by side, and its plots (PNG, matplotlib's Agg backend)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from llmgw_sim.week.data import CLASSES, MODELS
from llmgw_sim.week.engine import STEP_S, WeekResult


class PlotError(RuntimeError):
    """The plots cannot be drawn here (matplotlib missing)."""


def _pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend (files only, no display). matplotlib is in
    the project's `test` extra: the table needs none of it, only the plots do."""
    try:
        import matplotlib
    except ImportError as error:
        raise PlotError(
            "the plots need matplotlib: pip install 'llmgw-facility[test]' (or run without --out)"
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


POWER_PLOT = "oversubscription-week-power.png"
DISTRIBUTION_PLOT = "oversubscription-week-distribution.png"
#: The variants whose power is plotted too, and their files.
PLOTTED_VARIANTS = {
    "the rule before: to the limit, 0.90/0.97, no guard": (
        "oversubscription-week-power-rule-before.png"
    ),
}
#: PNG files carry no date or version here, so that one seed writes the same bytes.
_PNG_METADATA = {"Software": None}


@dataclass(frozen=True)
class Figures:
    """One policy's line of the table."""

    replicas: int
    gpus: int
    seconds_above_rating: float
    events_above_cap: int
    longest_event_s: float
    capping_loss: float
    tokens_per_joule: float
    capped_share: float
    beyond_capacity: float
    served_tokens: float
    energy_mwh: float


def figures(result: WeekResult) -> Figures:
    events = [length for stats in result.stats for length in stats.events_above_cap]
    seconds = len(result.history) * STEP_S
    oversubscribed = [s for s in result.stats if s.domain.oversubscribe] or result.stats
    capped = sum(s.seconds_capped for s in oversubscribed) / (seconds * len(oversubscribed))
    return Figures(
        replicas=result.replicas_total,
        gpus=result.gpus_used,
        seconds_above_rating=sum(s.seconds_above_rating for s in result.stats),
        events_above_cap=len(events),
        longest_event_s=max(events, default=0.0),
        capping_loss=result.capping_loss_share,
        tokens_per_joule=result.tokens_per_joule,
        capped_share=capped,
        beyond_capacity=(
            result.tokens_beyond_capacity / result.tokens_demanded
            if result.tokens_demanded
            else 0.0
        ),
        served_tokens=result.tokens_served,
        energy_mwh=result.energy_joules / 3.6e9,
    )


def table(results: dict[str, WeekResult]) -> str:
    """The targets table (Markdown): one column per policy, today's first."""
    names = list(results)
    first = results[names[0]]
    found = {name: figures(result) for name, result in results.items()}
    base = found[names[0]].replicas
    reaction = first.latency.worst_case_s
    racks = sum(1 for d in first.domains if d.kind == "rack")
    rows = len(first.domains) - racks

    def line(label: str, cells: list[str], target: str) -> str:
        return f"| {label} | " + " | ".join(cells) + f" | {target} |"

    def more(f: Figures) -> str:
        return f", {f.replicas / base - 1:+.0%}" if base and f.replicas != base else ""

    lines = [
        "| | " + " | ".join(names) + " | target |",
        "|---" * (len(names) + 2) + "|",
        line(
            "replicas admitted (GPUs)",
            [f"{f.replicas} ({f.gpus}){more(f)}" for f in found.values()],
            ">= +30 %",
        ),
        line(
            f"seconds above any domain's or feed's rating ({racks} racks and their "
            f"{2 * racks} feeds, {rows} rows)",
            [f"{f.seconds_above_rating:g}" for f in found.values()],
            "0",
        ),
        line(
            "events above rating x derating; the longest",
            [f"{f.events_above_cap}; {f.longest_event_s:g} s" for f in found.values()],
            f"each <= the reaction time, {reaction:g} s",
        ),
        line(
            "longest lag from a GPU reading to its cap in this run",
            [
                f"{result.max_lag_s:g} s" if result.stats[0].domain.oversubscribe else "-"
                for result in results.values()
            ],
            f"<= {reaction:g} s (the chain's worst case)",
        ),
        line(
            "tokens lost to capping, at most (of what the replicas would serve uncapped)",
            [f"{f.capping_loss:.2%}" for f in found.values()],
            "<= 1 %",
        ),
        line(
            "the same, by class (the models' classes, lowest first)",
            [_by_class(result) for result in results.values()],
            "",
        ),
        line(
            "replicas' GPU energy the caps held back",
            [f"{result.withheld_share:.2%}" for result in results.values()],
            "",
        ),
        line(
            "tokens per joule of the site (tokens served / site energy)",
            [f"{f.tokens_per_joule:.3f}" for f in found.values()],
            "",
        ),
        line(
            "tokens served; site energy",
            [f"{f.served_tokens / 1e9:.1f} G; {f.energy_mwh:.2f} MWh" for f in found.values()],
            "",
        ),
        line(
            "share of domain-time capped (ladder at step 1 or 2)",
            [f"{f.capped_share:.2%}" for f in found.values()],
            "",
        ),
        line(
            "demand above the replicas' capacity (served by neither)",
            [f"{f.beyond_capacity:.2%}" for f in found.values()],
            "",
        ),
    ]
    return "\n".join(lines)


def _by_class(result: WeekResult) -> str:
    """Tokens lost to capping per class, as a share of what that class served uncapped."""
    parts = []
    for klass in CLASSES:
        names = [model.name for model in MODELS if model.klass == klass]
        lost = sum(result.lost_by_model[name] for name in names)
        served = sum(result.served_by_model[name] for name in names)
        parts.append(f"{klass} {lost / (served + lost) if served + lost else 0.0:.1%}")
    return ", ".join(parts)


def _per_minute_max(series: np.ndarray) -> np.ndarray:
    per = int(60 / STEP_S)
    usable = len(series) // per * per
    return series[:usable].reshape(-1, per).max(axis=1)


def representative(over: WeekResult) -> list[int]:
    """The domains to plot: the racks with the highest and the median p99 power over
    budget under oversubscription, and the row with the highest."""
    share = np.quantile(over.history, 0.99, axis=0) / np.array(
        [d.budget_watts for d in over.domains]
    )
    racks = [i for i, d in enumerate(over.domains) if d.kind == "rack"]
    rows = [i for i, d in enumerate(over.domains) if d.kind != "rack"]
    by_share = sorted(racks, key=lambda i: share[i])
    chosen = [by_share[-1], by_share[len(by_share) // 2]]
    if rows:
        chosen.append(max(rows, key=lambda i: share[i]))
    return chosen


def _lines(result: WeekResult) -> tuple[float, float]:
    """The ladder's first threshold and the admission line, shares of the budget."""
    settings = result.config.site.facility(True).oversubscription.ladder
    return settings.first_threshold, 1.0 if result.config.admit_to_limit else settings.admit_to


def plot_power(today: WeekResult, over: WeekResult, over_name: str, path: Path) -> None:
    """Each chosen domain's power (each minute's highest reading) over the run, today and
    one oversubscribed policy, against its rating, rating x derating, budget, the
    ladder's first threshold and the admission line."""
    plt = _pyplot()
    chosen = representative(over)
    threshold, admit_to = _lines(over)
    fig, axes = plt.subplots(len(chosen), 1, figsize=(12, 3.2 * len(chosen)), sharex=True)
    for ax, index in zip(np.atleast_1d(axes), chosen, strict=True):
        domain = over.domains[index]
        for result, colour, name in (
            (today, "tab:blue", "today"),
            (over, "tab:orange", over_name),
        ):
            kw = _per_minute_max(result.history[:, index]) / 1000
            hours = np.arange(len(kw)) / 60
            ax.plot(hours, kw, color=colour, linewidth=0.6, label=name)
        lines = [
            (domain.rating_watts, "k-", "rating"),
            (domain.cap_watts, "r--", "rating x derating (cap)"),
            (domain.budget_watts, "m-.", "budget: cap x (1 - margin)"),
            (domain.budget_watts * threshold, "g:", f"ladder's first threshold ({threshold:g})"),
        ]
        if admit_to < threshold:
            lines.append((domain.budget_watts * admit_to, "c:", f"admission line ({admit_to:g})"))
        for value, style, name in lines:
            ax.axhline(value / 1000, linestyle=style[1:], color=style[0], linewidth=1, label=name)
        ax.set_title(f"{domain.label}: power, each minute's highest 5-s reading")
        ax.set_ylabel("kW")
        ax.set_ylim(0, domain.rating_watts / 1000 * 1.05)
        ax.grid(alpha=0.3)
    axes_list = np.atleast_1d(axes)
    axes_list[0].legend(loc="lower left", fontsize=7, ncol=3)
    axes_list[-1].set_xlabel("hours of site time")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=_PNG_METADATA)
    plt.close(fig)


_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")


def plot_distribution(results: dict[str, WeekResult], path: Path) -> None:
    """The distribution of every rack's and every row's power as a share of its budget,
    every 5-s step, each policy."""
    plt = _pyplot()
    first = next(iter(results.values()))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=False)
    for ax, kind in zip(axes, ("rack", "row"), strict=True):
        columns = [i for i, d in enumerate(first.domains) if d.kind == kind]
        if not columns:
            ax.set_visible(False)
            continue
        budget = np.array([first.domains[i].budget_watts for i in columns])
        rating = first.domains[columns[0]].rating_watts / budget[0]
        cap = first.domains[columns[0]].cap_watts / budget[0]
        bins = np.linspace(0, max(rating * 1.02, 1.2), 120)
        for (name, result), colour in zip(results.items(), _COLOURS, strict=False):
            shares = (result.history[:, columns] / budget).ravel()
            ax.hist(shares, bins=bins, color=colour, histtype="step", density=True, label=name)
        for value, style, name in (
            (1.0, "m-.", "budget"),
            (cap, "r--", "rating x derating"),
            (rating, "k-", "rating"),
        ):
            ax.axvline(value, linestyle=style[1:], color=style[0], linewidth=1, label=name)
        ax.set_title(f"every {kind}'s power / its budget, every 5 s")
        ax.set_xlabel("power / budget")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=_PNG_METADATA)
    plt.close(fig)


def write_plots(results: dict[str, WeekResult], directory: Path) -> list[Path]:
    """The power of representative domains, today against each oversubscribed policy
    (the first file: the decider's rule; then one per variant), and the distribution of
    every domain's power under all of them."""
    directory.mkdir(parents=True, exist_ok=True)
    names = list(results)
    today = results[names[0]]
    written: list[Path] = []
    for number, name in enumerate(names[1:]):
        if number and name not in PLOTTED_VARIANTS:
            continue
        path = directory / (POWER_PLOT if not number else PLOTTED_VARIANTS[name])
        plot_power(today, results[name], name, path)
        written.append(path)
    distribution = directory / DISTRIBUTION_PLOT
    plot_distribution(
        {
            name: results[name]
            for name in names
            if name == names[0] or name == names[1] or name in PLOTTED_VARIANTS
        },
        distribution,
    )
    written.append(distribution)
    return written
