"""How the CLI prints the decider's answers: kW figures, aligned tables, domains in site-to-pdu
order, the answer's missing data, and the raw JSON of `--json`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from decider.facility import KINDS


def kw(watts: float | None) -> str:
    """Watts as kW with one decimal; "-" for none. A shortfall under 50 W keeps its sign
    and more digits ("-0.044"), so that a refusal never reads as a headroom of -0.0."""
    if watts is None:
        return "-"
    text = f"{watts / 1000:.1f}"
    if text == "-0.0":
        text = f"{watts / 1000:.3f}".rstrip("0").rstrip(".")
    return "0.0" if text in ("-0", "-0.0") else text


def table(headers: Sequence[str], rows: list[list[str]], right: frozenset[int]) -> list[str]:
    """Aligned columns, two spaces apart; columns in `right` are right-aligned."""
    widths = [max(len(row[i]) for row in [list(headers), *rows]) for i in range(len(headers))]
    lines = []
    for row in [list(headers), *rows]:
        cells = [
            cell.rjust(width) if index in right else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def domain_order(entry: dict[str, Any]) -> tuple[int, str]:
    """Site, room, row, rack, pdu; by name within a kind."""
    kind = entry.get("kind", "")
    rank = KINDS.index(kind) if kind in KINDS else len(KINDS)
    return rank, str(entry.get("domain", ""))


def print_missing(missing: list[str]) -> None:
    if missing:
        print("missing:")
        for note in missing:
            print(f"  - {note}")


def show_json(answer: Any) -> None:
    print(json.dumps(answer, indent=2, ensure_ascii=False))
