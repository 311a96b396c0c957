"""`facility` (the domain table), `hold`, `release` and `override`: the domains as the decider
sees them, and the operator's say over them."""

from __future__ import annotations

import argparse
from typing import Any

from decider.facility import DomainRef
from llmgw_facility.client import Decider, domain_path
from llmgw_facility.output import domain_order, kw, print_missing, show_json, table


def facility_table(decider: Decider, as_json: bool) -> int:
    answer = decider.call("GET", "/v1/domains")
    if as_json:
        show_json(answer)
        return 0
    domains = sorted(answer.get("domains", []), key=domain_order)
    if not domains:
        print("no domains: the facility file declares none and Prometheus names none")
    else:
        rows = []
        for entry in domains:
            held = entry.get("held")
            rows.append(
                [
                    f"{entry['kind']}/{entry['domain']}",
                    entry.get("condition", "unknown"),
                    kw(entry.get("cap_watts")),
                    kw(entry.get("reserved_watts")),
                    kw(entry.get("measured_watts")),
                    kw(entry.get("room_watts")),
                    kw(entry.get("headroom_watts")),
                    held["reason"] if held else "-",
                ]
            )
            rows += phase_rows(entry)
        # HEADROOM is what placement allows: limit - load, the limit being cap * (1 - margin).
        # cap - load is what is left before the cap itself, named as such.
        headers = (
            "DOMAIN",
            "CONDITION",
            "CAP kW",
            "RESERVED kW",
            "MEASURED kW",
            "HEADROOM kW",
            "CAP-LOAD kW",
            "HELD",
        )
        for line in table(headers, rows, frozenset({2, 3, 4, 5, 6})):
            print(line)
        for entry in domains:  # each override in force, with what the rules say
            if entry.get("override"):
                print(f"{entry['kind']}/{entry['domain']}: {entry['override']['text']}")
    print_missing(answer.get("missing", []))
    return 0


def phase_rows(entry: dict[str, Any]) -> list[list[str]]:
    """A three-phase pdu's phases under its row: cap, reserved, headroom (limit - load) and
    cap - load; nothing measured."""
    return [
        [
            f"  phase {phase['phase']}",
            "",
            kw(phase.get("cap_watts")),
            kw(phase.get("reserved_watts")),
            "-",
            kw(phase.get("room_watts")),
            kw(phase.get("headroom_watts")),
            "",
        ]
        for phase in entry.get("phases") or []
    ]


def hold(decider: Decider, ref: DomainRef, reason: str) -> int:
    answer = decider.call(
        "POST", f"{domain_path(ref)}/hold", body={"reason": reason}, mutating=True
    )
    held = answer.get("held") or {}
    print(f"held {ref}: {held.get('reason', reason)} (no new placements on its nodes)")
    return 0


def release(decider: Decider, ref: DomainRef) -> int:
    before = decider.call("GET", domain_path(ref))
    if not before.get("held"):
        print(f"{ref} is not held; nothing to release")
        return 0
    decider.call("POST", f"{domain_path(ref)}/release", mutating=True)
    print(f"released {ref} (it was held: {before['held']['reason']})")
    return 0


def override(decider: Decider, ref: DomainRef, args: argparse.Namespace) -> int:
    """Clear a domain's condition known to be a sensor fault (`--for`, `--reason`), or end
    its override (`--end`)."""
    if args.end:
        before = decider.call("GET", domain_path(ref))
        if not before.get("override"):
            print(f"{ref} has no override; nothing to end")
            return 0
        decider.call("POST", f"{domain_path(ref)}/override/release", mutating=True)
        print(f"ended the override of {ref} ({before['override']['text']})")
        print(f"its condition is now the rules' own: {before['override']['condition']}")
        return 0
    body: dict[str, Any] = {"reason": args.reason, "for_seconds": args.for_seconds}
    if args.by is not None:
        body["by"] = args.by
    answer = decider.call("POST", f"{domain_path(ref)}/override", body=body, mutating=True)
    shown = answer.get("override") or {}
    print(f"overrode {ref}: {shown.get('text', args.reason)}")
    print(f"placement reads it as {answer.get('condition', 'ok')} until then")
    return 0
