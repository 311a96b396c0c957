"""`explain-placement` (a replica judged against candidate nodes, and why) and `headroom` (how
many more replicas of a profile fit, per domain, and what binds)."""

from __future__ import annotations

import argparse
from typing import Any

from llmgw_facility.client import Decider
from llmgw_facility.output import domain_order, kw, print_missing, show_json, table


def explain_placement(decider: Decider, args: argparse.Namespace) -> int:
    replica: dict[str, Any] = {"model": args.model, "profile": args.profile, "gpus": args.gpus}
    if args.power_watts is not None:
        replica["power_watts"] = args.power_watts
    if args.cpu_cores is not None:
        replica["cpu_cores"] = args.cpu_cores
    if args.replica_class is not None:
        replica["class"] = args.replica_class
    answer = decider.call(
        "POST", "/v1/placements", body={"replica": replica, "candidates": args.nodes}
    )
    if args.json:
        show_json(answer)
        return 0
    mode = answer.get("mode", "?")
    order = answer.get("order", [])
    rank = {node: index for index, node in enumerate(order, start=1)}
    gpus = f"{args.gpus} GPU{'' if args.gpus == 1 else 's'}"
    print(
        f"{mode} mode: a replica of {args.model} (profile {args.profile}, {gpus}) on "
        f"{len(args.nodes)} candidate{'' if len(args.nodes) == 1 else 's'}"
    )
    nodes = answer.get("nodes", [])
    rows = []
    for entry in nodes:
        headroom = entry.get("headroom_watts")
        rows.append(
            [
                entry["node"],
                "allowed" if entry.get("allowed") else "refused",
                f"~{kw(entry.get('estimate_watts'))} kW",
                f"condition {entry.get('condition', 'unknown')}",
                "no budget" if headroom is None else f"headroom {kw(headroom)} kW",
                f"rank {rank[entry['node']]}" if entry["node"] in rank else "",
            ]
        )
    lines = table(("NODE", "VERDICT", "ESTIMATE", "CONDITION", "HEADROOM", ""), rows, frozenset())
    print(lines[0])
    for entry, line in zip(nodes, lines[1:], strict=True):
        print(line)
        for reason in entry.get("reasons", []):
            print(f"    - {reason}")
        for reason in entry.get("would_refuse") or []:
            print(f"    - would refuse: {reason}")
        for words in entry.get("condition_evidence") or []:
            print(f"    - placed after ok nodes: {words}")
    print(f"order, best first: {', '.join(order) if order else 'none'}")
    print(answer.get("summary", ""))
    print_missing(answer.get("missing", []))
    return 0


def headroom(decider: Decider, profile: str, as_json: bool) -> int:
    answer = decider.call("GET", "/v1/headroom", params={"profile": profile})
    if as_json:
        show_json(answer)
        return 0
    print(f"profile {profile}: how many more replicas fit, per domain")
    rows = []
    for entry in sorted(answer.get("domains", []), key=domain_order):
        rows.append(fit_row(f"{entry['kind']}/{entry['domain']}", entry))
        rows += [fit_row(f"  phase {phase['phase']}", phase) for phase in entry.get("phases") or []]
    for line in table(("DOMAIN", "FITS", "WHAT BINDS"), rows, frozenset({1})):
        print(line)
    print_missing(answer.get("missing", []))
    return 0


def fit_row(label: str, entry: dict[str, Any]) -> list[str]:
    """One headroom row (a domain, or a three-phase pdu's phase): what fits, what binds."""
    fits = entry.get("fits")
    binds = "; ".join(
        bind["reason"] if bind.get("nodes", 1) <= 1 else f"{bind['reason']} ({bind['nodes']} nodes)"
        for bind in entry.get("binds", [])
    )
    return [label, "unbounded" if fits is None else str(fits), binds or "-"]
