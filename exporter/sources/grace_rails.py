"""NVIDIA Grace's per-socket power rails as CPU package and DRAM power (no RAPL on Grace).

Grace's firmware publishes four ACPI power meters per socket (NVIDIA's
edk2-nvidia SSDT for TH500; NVIDIA's Grace performance tuning guide, "Power
Telemetry"), told apart by their `power1_oem_info`:

- `Module Power Socket N` (GH200 only): the whole module, Grace, Hopper,
  their memory and the regulators' loss;
- `Grace Power Socket N`: the Grace socket, its CPU and SoC rails and (as
  Alumet's DRAM estimate, Grace − CPU − SysIO, takes it) its LPDDR5X;
- `CPU Power Socket N`: the CPU cores' rail;
- `SysIO Power Socket N`: the SoC rail (fabric and L3, memory controllers, I/O).

RAPL's package domain is the cores and the uncore (L3, mesh, memory
controllers, I/O) without the DRAM, so a socket's package is its CPU rail plus
its SysIO rail, and its DRAM what the Grace meter measures beyond those two
(clamped at 0: the meters average over their own windows). The rules then take
a Grace node the way they take a RAPL one (docs/energy.md). The module meter is
the node's, read by `hwmon_power` itself.

Emits, per socket (power only: the meters keep no energy counter):

    llmgw_node_cpu_power_watts{package="0"} 220.0
    llmgw_node_dram_power_watts{package="0"} 30.0

Missing data:
- no Grace rail meter → nothing;
- a socket's CPU or SysIO meter missing or unreadable → no package series for
  any socket, and the reason (a partial sum would understate the CPU pool);
- a socket's Grace meter missing or unreadable → no DRAM series for any socket
  (and the reason where it is there but unreadable); the packages are served.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from exporter.samples import Sample

CPU_POWER_METRIC = "llmgw_node_cpu_power_watts"
DRAM_POWER_METRIC = "llmgw_node_dram_power_watts"

_RAIL = re.compile(r"(module|grace|cpu|sysio) power socket (\d+)", re.IGNORECASE)
_PACKAGE_RAILS = ("cpu", "sysio")
_RAIL_NAMES = {"grace": "Grace", "cpu": "CPU", "sysio": "SysIO"}


def grace_rail_samples(
    meters: Iterable[tuple[str, float | None]],
) -> tuple[list[Sample], str | None]:
    """(samples, why some are missing) from (oem_info, watts or None) of the power meters."""
    rails: dict[int, dict[str, float | None]] = {}
    for label, watts in meters:
        if match := _RAIL.fullmatch(label.strip()):
            rails.setdefault(int(match[2]), {})[match[1].lower()] = watts
    sockets = sorted(socket for socket, found in rails.items() if found.keys() - {"module"})
    if not sockets:
        return [], None
    short = [
        f"{_RAIL_NAMES[rail]} Power Socket {socket}"
        for socket in sockets
        for rail in _PACKAGE_RAILS
        if rails[socket].get(rail) is None
    ]
    if short:
        return [], (
            f"cannot read {', '.join(short)}: no Grace CPU package power"
            " (a partial sum would understate it)"
        )
    packages = {
        socket: sum(rails[socket][rail] or 0.0 for rail in _PACKAGE_RAILS) for socket in sockets
    }
    samples = [Sample(CPU_POWER_METRIC, packages[s], {"package": str(s)}) for s in sockets]
    unread = [
        f"Grace Power Socket {s}"
        for s in sockets
        if "grace" in rails[s] and rails[s]["grace"] is None
    ]
    if unread:
        return samples, f"cannot read {', '.join(unread)}: no Grace DRAM power"
    if all(rails[s].get("grace") is not None for s in sockets):
        samples += [
            Sample(
                DRAM_POWER_METRIC,
                max((rails[s]["grace"] or 0.0) - packages[s], 0.0),
                {"package": str(s)},
            )
            for s in sockets
        ]
    return samples, None
