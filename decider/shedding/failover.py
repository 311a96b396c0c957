"""What the loss of one PDU does: each rack it feeds then carries its whole load on its
other feeds, shared evenly; a rack whose share passes a surviving feed's rating × derating
is listed with the figures and the replicas the shedding order would move
(`decider.shedding.moves`: as many as bring it back under), each with a destination outside
the racks the PDU feeds."""

from __future__ import annotations

from typing import Any

from decider.facility import DomainRef
from decider.placement.view import View
from decider.shedding.moves import (
    Counts,
    destination,
    in_domain,
    move_json,
    moved,
    order_key,
    untouchable,
)


def failover(view: View, pdu: str) -> dict[str, Any]:
    """What the loss of `pdu` does to the racks it feeds (see the module doc)."""
    facility = view.facility
    fed = [
        (ref, declared)
        for ref, declared in facility.declared()
        if any(feed.pdu == pdu for feed in declared.feeds)
    ]
    affected = {ref for ref, _ in fed} | {DomainRef("pdu", pdu)}
    counts = Counts.of(view)
    domains: list[dict[str, Any]] = []
    over = 0
    for ref, declared in fed:
        derating = facility.derating(ref.kind, ref.name)  # its own, else the site's
        domain = view.domain(ref)
        survivors = [feed for feed in declared.feeds if feed.pdu != pdu]
        load = domain.load
        entry: dict[str, Any] = {
            "domain": str(ref),
            "kind": ref.kind,
            "name": ref.name,
            "load_watts": round(load, 1),
            "load_basis": domain.load_basis,
            "reserved_watts": round(domain.reserved, 1),
            "measured_watts": domain.measured,
            "other_watts": domain.other_watts,
            "surviving_feeds": [
                {
                    "pdu": feed.pdu,
                    "rating_watts": feed.rating_watts,
                    "limit_watts": round(feed.rating_watts * derating, 1),
                }
                for feed in survivors
            ],
            "moves": [],
        }
        domains.append(entry)
        if not survivors:
            entry["over"] = True
            entry["unpowered"] = True
            entry["reason"] = f"{ref.kind} {ref.name}: fed by {pdu} alone, loses power"
            over += 1
            continue
        share = load / len(survivors)
        tightest = min(feed.rating_watts * derating for feed in survivors)
        entry["share_watts"] = round(share, 1)
        entry["limit_watts"] = round(tightest, 1)
        entry["unpowered"] = False
        entry["over"] = share > tightest
        names = ", ".join(feed.pdu for feed in survivors)
        figures = (
            f"{load / 1000:.1f} kW {domain.load_basis} on {names}: "
            f"{share / 1000:.1f} kW per feed of {tightest / 1000:.1f} kW "
            f"(rating × derating {derating:g})"
        )
        if not entry["over"]:
            entry["reason"] = f"{ref.kind} {ref.name} within its surviving feeds: {figures}"
            continue
        over += 1
        excess = (share - tightest) * len(survivors)  # watts off the rack to bring it under
        entry["excess_watts"] = round(excess, 1)
        freed = 0.0
        members = in_domain(view, ref)
        while freed < excess:
            choices = sorted(members, key=lambda r: order_key(view, r, counts))
            chosen = None
            for reservation in choices:
                if untouchable(view, reservation, counts) is not None:
                    continue
                verdict, rules = destination(view, reservation, affected)
                if verdict is not None:
                    chosen = (reservation, verdict, rules)
                    break
            if chosen is None:
                break
            reservation, verdict, rules = chosen
            entry["moves"].append(move_json(view, reservation, verdict, counts, rules))
            counts.moving[reservation.model] = counts.moving.get(reservation.model, 0) + 1
            freed += reservation.estimate_watts
            members = [r for r in members if r.id != reservation.id]
            view = moved(view, reservation, verdict)
        short = max(0.0, excess - freed)
        entry["short_watts"] = round(short, 1)
        tail = f"; moving {len(entry['moves'])} replica(s) frees {freed / 1000:.1f} kW" + (
            f", still {short / 1000:.1f} kW over: no more can move" if short > 0 else ""
        )
        entry["reason"] = f"{ref.kind} {ref.name} over its surviving feeds: {figures}{tail}"
    return {
        "pdu": pdu,
        "domains": domains,
        "over": over,
        "missing": list(view.all_missing()),
        "summary": (
            f"loss of pdu {pdu}: {len(fed)} domain(s) fed, {over} over what survives"
            if fed
            else f"loss of pdu {pdu}: no domain of the facility file is fed by it"
        ),
    }
