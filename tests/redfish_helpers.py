"""What the Redfish tests over HTTP (tests/test_redfish.py) and HTTPS (tests/test_redfish_tls.py)
share: a clock the test moves, and the samples read as a table."""

from __future__ import annotations

from exporter.samples import Sample

POWER = "llmgw_node_power_watts"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def values(samples: list[Sample]) -> dict[tuple[str, str], float]:
    out = {
        (s.metric, s.labels.get("source") or s.labels.get("sensor", "")): s.value for s in samples
    }
    assert len(out) == len(samples)
    return out
