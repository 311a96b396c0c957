"""A lost feed of an oversubscribed domain, and what its surviving feeds carry (issue 20,
item 4; docs/oversubscription.md "Feeds").

**Lost**, for a domain that declares two feeds or more: its pdu's measured power (the
snapshot's `measured` part, fresh) reads zero or nothing at all while another feed of the
same domain reads more than zero. A meter that stops answering is taken for a lost feed:
the decider cannot tell the two apart, and the cost of the mistake is a cap, never an
outage. Without a fresh `measured` part, or with every feed reading nothing, no feed is
lost: nothing says that one carries the load the other dropped.

**What survives** comes from the failover analysis itself (`decider.shedding.failover`, the
answer of GET /v1/failover): the surviving feeds' `rating × derating`, the load shared evenly
over them, so the domain fits while its load is at most the tightest survivor's limit times
their number. The ladder (decider.capping.ladder, `LostFeed`) then caps the worst case
under that at once, whatever the measured power says.

Only a site meter (facility file `signals.power_watts` for pdus) reads a feed's own power:
where a pdu's measured power is its nodes' sum (the rules' default), a node on two feeds
counts fully against each and both feeds read the same, so a lost feed cannot be seen and
the domain's own cap (its smallest feed's rating × derating, docs/facility.md) is what
keeps it within one feed.
"""

from __future__ import annotations

from decider.capping.ladder import LostFeed
from decider.facility import DomainRef
from decider.placement.view import View
from decider.shedding.failover import failover


def feed_readings(view: View, ref: DomainRef) -> dict[str, float | None] | None:
    """Each declared feed's pdu reading (None: no reading); None without a fresh `measured`
    part or fewer than two feeds."""
    declared = view.facility.domain(ref.kind, ref.name)
    if declared is None or len(declared.feeds) < 2 or "measured" not in view.fresh:
        return None
    measured = view.snapshot.measured_watts
    return {feed.pdu: measured.get(DomainRef("pdu", feed.pdu)) for feed in declared.feeds}


def lost_feed(view: View, ref: DomainRef) -> LostFeed | None:
    """The domain's lost feeds and what the survivors carry; None: no feed is lost."""
    readings = feed_readings(view, ref)
    if readings is None:
        return None
    lost = tuple(pdu for pdu, watts in readings.items() if watts is None or watts <= 0)
    if not lost or len(lost) == len(readings):
        return None
    survivors: dict[str, float] | None = None
    for pdu in lost:
        entry = next(
            (each for each in failover(view, pdu)["domains"] if each["domain"] == str(ref)),
            None,
        )
        if entry is None:  # the file no longer says the pdu feeds it: not this domain's
            continue
        limits = {feed["pdu"]: feed["limit_watts"] for feed in entry["surviving_feeds"]}
        survivors = (
            limits
            if survivors is None
            else {pdu: watts for pdu, watts in survivors.items() if pdu in limits}
        )
    if survivors is None:
        return None
    # Not empty: a feed that reads more than zero is in every entry's survivors.
    survivors = {pdu: watts for pdu, watts in survivors.items() if pdu not in lost}
    return LostFeed(lost, min(survivors.values()) * len(survivors))
