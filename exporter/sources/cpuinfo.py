"""The node's CPU model, from `/proc/cpuinfo`: what the decider's CPU profiles are keyed on.

A replica without GPUs is estimated as its cores × the watts per core of the node's CPU
model (DESIGN.md §5, the facility file's `cpu_watts_per_core`); this source tells the
decider which model that is.

x86 names its model on each processor's `model name` line. ARM64 has no such line: its
`CPU implementer` and `CPU part` identify the core, named here as util-linux's `lscpu`
names Arm's own Neoverse server cores (sys-utils/lscpu-arm.c), else given as read
(`CPU implementer 0xc0 part 0xac3`), which a facility file can key on as well. Runs of
whitespace in a name are collapsed to one space. A node with two models (rare: sockets
of different parts) has a series for each; the decider takes the larger per-core figure.

Lines emitted:

    llmgw_node_cpu_info{model="Intel(R) Xeon(R) Platinum 8480+"} 1
    llmgw_node_cpu_info{model="ARM Neoverse-V2"} 1

Missing-data policy (STYLE.md §3):
- no `<procfs>/cpuinfo` (not Linux, procfs not mounted in the container) → `NoData`;
- a file that names no model (no `model name`, no ARM identifiers: POWER, s390) →
  `NoData`, and the decider keeps `cpu_watts_per_core.default` for the node;
- a file that cannot be read (permissions) → the error: the source is down.
"""

from __future__ import annotations

import re
from pathlib import Path

from exporter.samples import NoData, Sample
from exporter.sources.base import Source, SourceConfig

METRIC = "llmgw_node_cpu_info"

#: Arm Ltd's (implementer 0x41) server cores, by `CPU part`, as lscpu names them.
ARM_NEOVERSE = {
    "0xd0c": "Neoverse-N1",
    "0xd40": "Neoverse-V1",
    "0xd49": "Neoverse-N2",
    "0xd4f": "Neoverse-V2",
    "0xd84": "Neoverse-V3",
    "0xd8e": "Neoverse-N3",
}
_FIELD = re.compile(r"^([^:\t]+?)\s*:\s*(.*)$")


class CpuInfoConfig(SourceConfig):
    """`sources.cpuinfo`."""

    #: Root of procfs (a container that mounts the host's elsewhere sets it).
    procfs: str = "/proc"


def cpu_models(text: str) -> list[str]:
    """The distinct CPU models `/proc/cpuinfo`'s text names, in the order first seen."""
    models: dict[str, None] = {}
    arm: dict[str, str] = {}
    for line in [*text.splitlines(), ""]:  # a blank line ends a processor's block
        match = _FIELD.match(line)
        if match is None:
            if "CPU implementer" in arm and "CPU part" in arm:
                models[_arm_name(arm["CPU implementer"], arm["CPU part"])] = None
            arm = {}
            continue
        key, value = match.group(1).strip(), " ".join(match.group(2).split())
        if key == "model name" and value:
            models[value] = None
        elif key in ("CPU implementer", "CPU part"):
            arm[key] = value.lower()
    return list(models)


def _arm_name(implementer: str, part: str) -> str:
    if implementer == "0x41" and part in ARM_NEOVERSE:
        return f"ARM {ARM_NEOVERSE[part]}"
    return f"CPU implementer {implementer} part {part}"


class CpuInfoSource(Source):
    name = "cpuinfo"
    #: The model never changes while the node runs; a read costs microseconds.
    default_interval = 30.0
    Config = CpuInfoConfig
    config: CpuInfoConfig

    def __init__(self, sysfs: Path, config: SourceConfig, procfs: Path | None = None) -> None:
        super().__init__(sysfs, config)
        self.procfs = procfs if procfs is not None else Path(self.config.procfs)

    def poll(self) -> list[Sample]:
        path = self.procfs / "cpuinfo"
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NoData(f"no {path}") from exc
        models = cpu_models(text)
        if not models:
            raise NoData(f"{path} names no CPU model (no `model name`, no ARM CPU part)")
        return [Sample(METRIC, 1, {"model": model}) for model in models]
