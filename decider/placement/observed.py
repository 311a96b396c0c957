"""What an observed concern would have refused, as one structured log line per decision.

DESIGN.md's observe mode is "computed, logged and shown": the answers carry `would_refuse`,
the metrics count `llmgw_decider_would_refuse_total`, and each decision that an observed
concern would have refused logs one line here, a JSON object after `would_refuse `:

    would_refuse {"call": "placement", "subject": "llama (4 GPUs)", "judged": 12,
                  "would_refuse": 3, "rules": {"hot": 3}, "reasons": ["rack r1 hot", …],
                  "suppressed": 0}

At most one line per `interval` seconds (a busy scheduler asks many times a second): the
decisions left unlogged meanwhile are counted in the next line's `suppressed`. Concerns that
are enforced log nothing here (their refusals are the answers' reasons).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

#: Seconds between two lines, at least.
INTERVAL = 10.0
#: Distinct reasons a line names, at most.
REASONS_SHOWN = 5


class WouldRefuseLog:
    """One line per decision that an observed concern would have refused, rate-limited."""

    def __init__(
        self, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._next = -float("inf")
        self._suppressed = 0

    def decision(
        self, call: str, subject: str, judged: int, observed: Iterable[tuple[str, str, str]]
    ) -> None:
        """`observed`: (node, rule, reason) an observed concern would have refused; nothing
        is logged when it is empty."""
        found = list(observed)
        if not found:
            return
        with self._lock:
            now = self._clock()
            if now < self._next:
                self._suppressed += 1
                return
            self._next = now + self._interval
            suppressed, self._suppressed = self._suppressed, 0
        nodes = {node for node, _, _ in found}
        rules = Counter(dict.fromkeys(((node, rule) for node, rule, _ in found), 1))
        by_rule = Counter(rule for _, rule in rules)
        line = {
            "call": call,
            "subject": subject,
            "judged": judged,
            "would_refuse": len(nodes),
            "rules": dict(by_rule.most_common()),
            "reasons": list(dict.fromkeys(reason for _, _, reason in found))[:REASONS_SHOWN],
            "suppressed": suppressed,
        }
        log.info("would_refuse %s", json.dumps(line, ensure_ascii=False))


#: The decider's: placements and reservations log through it.
WOULD_REFUSE = WouldRefuseLog()
