"""The decider's recommendations: `profiles` (a model's profiles by tokens per joule),
`shedding` (the plan: which replicas would move off hot domains) and `failover` (what the loss
of one PDU would overload)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from decider.facility import DomainRef
from llmgw_facility.client import Decider
from llmgw_facility.output import kw, print_missing, show_json, table


def profiles(decider: Decider, model: str, as_json: bool) -> int:
    """GET /v1/profiles/{model}: the model's profiles, best tokens per joule first."""
    answer = decider.call("GET", f"/v1/profiles/{quote(model, safe='/')}")
    if as_json:
        show_json(answer)
        return 0

    def figure(value: Any, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    print(answer.get("summary", f"model {model}"))
    rows = [
        [
            "-" if entry.get("rank") is None else str(entry["rank"]),
            str(entry["profile"]),
            str(entry["status"]),
            figure(entry.get("tokens_per_joule"), 3),
            figure(entry.get("tokens_per_second"), 1),
            figure(entry.get("watts"), 1),
            "-" if entry.get("replicas") is None else str(entry["replicas"]),
            figure(entry.get("age_seconds"), 0),
        ]
        for entry in answer.get("profiles", [])
    ]
    headers = ("RANK", "PROFILE", "STATUS", "TOKENS/J", "TOKENS/S", "WATTS", "REPLICAS", "AGE S")
    for line in table(headers, rows, frozenset({0, 3, 4, 5, 6, 7})):
        print(line)
    print_missing(answer.get("missing", []))
    return 0


def shedding_plan(decider: Decider, as_json: bool) -> int:
    answer = decider.call("GET", "/v1/shedding")
    if as_json:
        show_json(answer)
        return 0
    print(answer["summary"])
    rows = []
    for entry in answer.get("plan", []):
        moves = entry.get("moves", [])
        hot = entry.get("hot_seconds")
        hot_text = "-" if hot is None else f"{hot / 60:.1f}m"
        for move in moves or [None]:
            rows.append(
                [
                    entry["domain"],
                    hot_text,
                    "-" if move is None else move["reservation"],
                    "-" if move is None else f"{move['model']} ({move['class'] or 'no class'})",
                    "-" if move is None else f"{move['from']} -> {move['to']}",
                    "-" if move is None else kw(move["estimate_watts"]),
                ]
            )
    if rows:
        headers = ("DOMAIN", "HOT FOR", "MOVE", "MODEL (CLASS)", "FROM -> TO", "KW")
        for line in table(headers, rows, frozenset({1, 5})):
            print(line)
    for entry in answer.get("plan", []):
        print(f"{entry['domain']}: {entry['reason']}")
        for skipped in entry.get("skipped", []):
            print(f"  skipped {skipped['reservation']}: {skipped['reason']}")
        if entry.get("power_capping"):
            print(f"  or cap instead: {entry['power_capping']['reason']}")
    for capping in answer.get("power_capping", []):
        print(f"cap {capping['kind']}/{capping['domain']}: {capping['reason']}")
    print_missing(answer.get("missing", []))
    return 0


def failover_report(decider: Decider, ref: DomainRef, as_json: bool) -> int:
    answer = decider.call("GET", "/v1/failover", params={"domain": str(ref)})
    if as_json:
        show_json(answer)
        return 0
    print(answer["summary"])
    rows = []
    for entry in answer.get("domains", []):
        survivors = ", ".join(feed["pdu"] for feed in entry.get("surviving_feeds", [])) or "none"
        rows.append(
            [
                entry["domain"],
                kw(entry["load_watts"]),
                survivors,
                kw(entry.get("share_watts")),
                kw(entry.get("limit_watts")),
                "UNPOWERED" if entry.get("unpowered") else "OVER" if entry["over"] else "ok",
            ]
        )
    if rows:
        headers = ("DOMAIN", "LOAD KW", "SURVIVING FEEDS", "PER FEED KW", "LIMIT KW", "")
        for line in table(headers, rows, frozenset({1, 3, 4})):
            print(line)
    for entry in answer.get("domains", []):
        if entry["over"]:
            print(f"{entry['domain']}: {entry['reason']}")
            for move in entry.get("moves", []):
                print(
                    f"  move {move['reservation']} ({move['model']}, {kw(move['estimate_watts'])}"
                    f" kW) {move['from']} -> {move['to']}"
                )
    print_missing(answer.get("missing", []))
    return 0
