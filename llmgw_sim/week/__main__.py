"""`python -m llmgw_sim.week --out docs/img`: a week of site time under both policies.

Prints the targets table (Markdown) and writes the plots; seeded, deterministic.
docs/oversubscription-week.md explains the model and holds one full run's figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from llmgw_sim.week import data
from llmgw_sim.week.engine import WeekConfig, run_policies
from llmgw_sim.week.report import PlotError, table, write_plots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmgw_sim.week",
        description="A week of real traffic on a simulated site, today's admission against "
        "oversubscription with the capping ladder (docs/oversubscription-week.md).",
    )
    parser.add_argument("--out", type=Path, help="write the PNG plots into this folder")
    parser.add_argument("--days", type=float, default=7.0, help="site time (default 7)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--start-day", type=int, default=0, help="first of Google's 31 days (default 0)"
    )
    parser.add_argument(
        "--no-ladder", action="store_true", help="oversubscribe without the capping ladder"
    )
    parser.add_argument(
        "--variants",
        action="store_true",
        help="also run the admission rule's variants (without the capped guard; admitting "
        "to the first threshold, 0.95/0.99, with and without the first replica's host; the "
        "rule before: to the limit, thresholds 0.90/0.97, no guard)",
    )
    parser.add_argument("--traces", type=Path, default=data.TRACES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 < args.days <= 31:
        parser.error(f"--days {args.days:g}: between 0 and 31 (Google's trace has 31 days)")
    try:
        traces = data.load(args.traces)
        config = WeekConfig(
            days=args.days, seed=args.seed, start_day=args.start_day, ladder=not args.no_ladder
        )
        started = time.monotonic()
        results = run_policies(config, traces, variants=args.variants)
    except (data.DataError, ValueError) as error:
        print(f"llmgw_sim.week: {error}", file=sys.stderr)
        return 2
    elapsed = time.monotonic() - started
    print(table(results))
    print(
        f"\n{args.days:g} days of site time, seed {args.seed}, start day {args.start_day}: "
        f"{elapsed:.0f} s of wall time"
    )
    if args.out is not None:
        try:
            written = write_plots(results, args.out)
        except (PlotError, OSError) as error:
            print(f"llmgw_sim.week: {error}", file=sys.stderr)
            return 2
        for path in written:
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
