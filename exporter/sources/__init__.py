"""The table of sources: each registered once, each switchable in agent.yaml."""

from __future__ import annotations

from exporter.sources.base import Source
from exporter.sources.gpu import GpuSource
from exporter.sources.hwmon import HwmonSource
from exporter.sources.rapl import RaplSource

SOURCES: dict[str, type[Source]] = {
    source.name: source for source in (GpuSource, HwmonSource, RaplSource)
}
