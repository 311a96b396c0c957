"""The table of sources: each registered once, each switchable in agent.yaml."""

from __future__ import annotations

from exporter.sources.base import Source
from exporter.sources.cpuinfo import CpuInfoSource
from exporter.sources.cray import CraySource
from exporter.sources.gpu import GpuSource
from exporter.sources.hwmon import HwmonSource
from exporter.sources.hwmon_power import HwmonPowerSource
from exporter.sources.ipmi import IpmiSource
from exporter.sources.rapl import RaplSource
from exporter.sources.redfish import RedfishSource
from exporter.sources.units import UnitsSource

SOURCES: dict[str, type[Source]] = {
    source.name: source
    for source in (
        GpuSource,
        HwmonSource,
        RaplSource,
        UnitsSource,
        IpmiSource,
        RedfishSource,
        CraySource,
        HwmonPowerSource,
        CpuInfoSource,
    )
}
