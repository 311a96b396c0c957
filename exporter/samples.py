"""What a source hands back from one poll: samples of metrics named in `metrics.py`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of one metric. `node` is added by the collector, never by a source."""

    metric: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


class NoData(Exception):
    """The hardware a source reads is not on this machine: a quiet, expected outcome.

    The source is reported up (it looked, and found nothing to read) and
    publishes no series; the reason is logged once.
    """


class PartialReading(Exception):
    """Some devices of a source were read and some failed: serve what was read.

    The source is reported down, so the failure is visible, while the devices
    that answered keep their series (one lost GPU never hides the others).
    """

    def __init__(self, samples: list[Sample], reason: str) -> None:
        super().__init__(reason)
        self.samples = samples
