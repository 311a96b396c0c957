"""Compute units (the replicas on this node): cgroup v2, NVML process lists, node totals.

A unit is a cgroup v2 directory under `cgroup_root` that `glob` selects and
whose path (relative to `cgroup_root`) `pattern` matches; the pattern's named
groups give `unit` (required), `model` and `profile` (optional, else "").

```yaml
sources:
  units:
    glob: "system.slice/llmgw-*.service"      # llmgw-<model>--<profile>--<replica>.service
    pattern: 'llmgw-(?P<model>.+)--(?P<profile>.+)--(?P<unit>.+)\\.service$'
```

Read per unit: CPU time from `cpu.stat` `usage_usec`, memory from
`memory.current`. GPUs from NVML: each physical GPU's compute processes (in MIG
mode each MIG device's), each pid placed in a unit by the v2 line of
`/proc/<pid>/cgroup` (the unit's directory or one below it). AMD GPUs the
same way from amdkfd's process lists in sysfs (`amd_kfd.py`: identified by
serial number, compute partitions as instances). Node totals,
which the rules divide by: non-idle CPU seconds from `/proc/stat` (user, nice,
system, irq, softirq: neither idle, iowait nor steal; guest time is already
inside user and nice) and used memory from `/proc/meminfo` (MemTotal −
MemAvailable).

`llmgw_unit_gpu_share` is what the unit holds of a GPU: 1 for a whole GPU, the
instance's fraction of the GPU's streaming multiprocessors for a MIG instance,
each divided by N when N units run on that GPU or instance. The SM fraction is
the instance's SM count over the GPU's (NVML's attributes of the physical GPU);
drivers that only answer that call for MIG handles get, per GPU, the largest of
`sm × max MIG devices ÷ slices` over its instances as the GPU's count, which
keeps the instances' SM ratios exact and reads 1/7 for a lone 1g instance.

Lines emitted:

    llmgw_unit_info{unit="r7",model="llama-70b",profile="tp4"} 1
    llmgw_unit_cpu_seconds_total{unit="r7"} 60491.070351
    llmgw_unit_memory_bytes{unit="r7"} 4111491072
    llmgw_unit_gpu_share{unit="r7",uuid="GPU-…",gpu_instance=""} 1
    llmgw_unit_gpu_share{unit="r8",uuid="GPU-…",gpu_instance="2"} 0.4545
    llmgw_node_cpu_seconds_total 4183.34
    llmgw_node_memory_used_bytes 16042172416

Missing-data policy (STYLE.md §3):
- no directory matches: no unit series (a node with no replica is normal); the
  node totals are still published;
- a unit directory that disappears during the poll (the replica stopped): its
  series are absent, quietly; a `cpu.stat` or `memory.current` that is missing
  (controller not enabled there) → that series absent, quietly; one that is
  there but unparseable → absent, and the source reads down naming the file
  (`PartialReading`); two directories giving the same unit name → the first
  (in path order) is kept and the source reads down naming both;
- `/proc/stat` or `/proc/meminfo` unreadable or without the lines needed →
  that node total is absent and the source reads down; `/proc/meminfo` without
  `MemAvailable` (kernels before 3.14) → used = MemTotal − MemFree − Buffers −
  Cached − SReclaimable, as `free` computed it then;
- no NVML library → no GPU shares, quietly (CPU-only nodes); NVML failing, or
  one GPU's process list failing (other than "not supported") → that GPU's
  shares absent and the source reads down; a pid that exited, or that is in no
  unit, is not counted;
- no amdkfd (`<sysfs>/class/kfd/kfd`): no AMD shares, quietly; AMD GPUs the
  source cannot name: `amd_kfd.py`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pynvml
from pydantic import ValidationInfo, field_validator, model_validator

from exporter.nvml import Nvml, NvmlAbsent, NvmlUnloadable
from exporter.samples import PartialReading, Sample
from exporter.sources.base import Source, SourceConfig
from exporter.sysfs import read_int, read_text

if TYPE_CHECKING:
    from exporter.sources.amd_kfd import KfdReader

log = logging.getLogger(__name__)

#: `/proc/stat` counts in USER_HZ, 100 on every Linux architecture Prometheus' procfs supports.
USER_HZ = 100
#: `/proc/stat` cpu columns that are busy time (guest is already inside user, guest_nice in nice).
_BUSY = {"user": 0, "nice": 1, "system": 2, "irq": 5, "softirq": 6}
_KIB = 1024

_NVML_QUIET = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
}


class UnitsConfig(SourceConfig):
    """`sources.units`: on as soon as `glob` is set, off otherwise."""

    #: cgroup v2 directories that may be units, relative to `cgroup_root`.
    glob: str | None = None
    #: Searched in each directory's path relative to `cgroup_root`; named groups
    #: `unit` (required), `model`, `profile`. Default: the directory's own name.
    pattern: str = r"(?P<unit>[^/]+)$"
    #: Where cgroup v2 is mounted; default: `<sysfs>/fs/cgroup`.
    cgroup_root: str | None = None
    #: Root of procfs (a container that mounts the host's elsewhere sets it).
    procfs: str = "/proc"
    #: Path of libnvidia-ml.so.1; default: the dynamic loader's search.
    library: str | None = None
    #: Read AMD GPUs' process lists from amdkfd's sysfs (`exporter/sources/amd_kfd.py`).
    amd_kfd: bool = True

    @model_validator(mode="before")
    @classmethod
    def _on_when_configured(cls, data: Any) -> Any:
        if isinstance(data, dict) and "enabled" not in data:
            return {**data, "enabled": data.get("glob") is not None}
        return data

    @model_validator(mode="after")
    def _glob_when_enabled(self) -> UnitsConfig:
        if self.enabled and self.glob is None:
            raise ValueError("the units source needs a `glob` naming the units' cgroups")
        return self

    @field_validator("glob")
    @classmethod
    def _relative_glob(cls, glob: str | None) -> str | None:
        if glob is None:
            return None
        glob = glob.strip("/")
        if not glob or ".." in Path(glob).parts:
            raise ValueError(f"{glob!r} must name directories below cgroup_root")
        return glob

    @field_validator("pattern")
    @classmethod
    def _pattern_has_unit(cls, pattern: str, info: ValidationInfo) -> str:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        if "unit" not in compiled.groupindex:
            raise ValueError("needs a named group `unit`: (?P<unit>...)")
        unknown = set(compiled.groupindex) - {"unit", "model", "profile"}
        if unknown:
            raise ValueError(f"unknown named groups {sorted(unknown)}: use unit, model, profile")
        return pattern


@dataclass(frozen=True, slots=True)
class Unit:
    name: str
    model: str
    profile: str
    path: Path  # the directory
    cgroup: str  # its path relative to the cgroup root, no leading "/"


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where processes run on one GPU: the whole GPU, or one MIG GPU instance."""

    uuid: str
    gpu_instance: str  # "" for a whole GPU
    fraction: float  # of the physical GPU's SMs
    pids: frozenset[int]


class UnitsSource(Source):
    name: ClassVar[str] = "units"
    default_interval: ClassVar[float] = 5.0
    default_deadline: ClassVar[float] = 5.0  # a cgroup glob and NVML process lists
    Config: ClassVar[type[SourceConfig]] = UnitsConfig
    reads_nvml: ClassVar[bool] = True
    config: UnitsConfig

    def __init__(
        self,
        sysfs: Path,
        config: SourceConfig,
        procfs: Path | None = None,
        nvml: Nvml | None = None,
    ) -> None:
        super().__init__(sysfs, config)
        root = self.config.cgroup_root
        self.cgroup_root = Path(root) if root else sysfs / "fs" / "cgroup"
        self.procfs = procfs if procfs is not None else Path(self.config.procfs)
        self.pattern = re.compile(self.config.pattern)
        #: The process's NVML (main() hands the one it shares with the gpu source);
        #: a source built alone gets its own, from its `library`.
        self.nvml_handle = nvml if nvml is not None else Nvml(self.config.library)
        self.nvml = self.nvml_handle.api
        self._nvml_absent = False
        self.amd: KfdReader | None = None
        if self.config.amd_kfd:
            # Imported with the source, not the table of sources: the units source is off
            # unless agent.yaml sets its glob (docs/benchmarks.md, "Where the memory goes").
            from exporter.sources.amd_kfd import KfdReader

            self.amd = KfdReader(sysfs)

    # ------------------------------------------------------------------ poll
    def poll(self) -> list[Sample]:
        problems: list[str] = []
        units = self.discover(problems)
        samples: list[Sample] = []
        for unit in units.values():
            samples += self._read_unit(unit, problems)
        samples += self._node_totals(problems)
        samples += self._gpu_shares(units, problems)
        if problems:
            raise PartialReading(samples, "; ".join(problems))
        return samples

    def discover(self, problems: list[str]) -> dict[str, Unit]:
        """The units under the glob, by name; the first directory wins a name."""
        assert self.config.glob is not None
        units: dict[str, Unit] = {}
        for path in sorted(self.cgroup_root.glob(self.config.glob)):
            if not path.is_dir():
                continue
            cgroup = path.relative_to(self.cgroup_root).as_posix()
            match = self.pattern.search(cgroup)
            if match is None or not match["unit"]:
                continue
            groups = match.groupdict()
            unit = Unit(
                match["unit"], groups.get("model") or "", groups.get("profile") or "", path, cgroup
            )
            if unit.name in units:
                problems.append(
                    f"units {units[unit.name].cgroup} and {cgroup} are both named {unit.name!r}"
                )
                continue
            units[unit.name] = unit
        return units

    def _read_unit(self, unit: Unit, problems: list[str]) -> list[Sample]:
        labels = {"unit": unit.name}
        samples = [
            Sample("llmgw_unit_info", 1, {**labels, "model": unit.model, "profile": unit.profile})
        ]
        usage = _read_keyed(unit.path / "cpu.stat", "usage_usec", problems)
        if usage is not None:
            samples.append(Sample("llmgw_unit_cpu_seconds_total", usage / 1e6, labels))
        memory = read_int(unit.path / "memory.current", problems)
        if memory is not None:
            samples.append(Sample("llmgw_unit_memory_bytes", float(memory), labels))
        if not unit.path.is_dir():  # gone while we read it: the replica stopped
            return []
        return samples

    # ------------------------------------------------------------ node totals
    def _node_totals(self, problems: list[str]) -> list[Sample]:
        samples = []
        busy = read_busy_cpu_seconds(self.procfs / "stat")
        if busy is None:
            problems.append(f"no cpu line in {self.procfs / 'stat'}")
        else:
            samples.append(Sample("llmgw_node_cpu_seconds_total", busy))
        used = read_used_memory_bytes(self.procfs / "meminfo")
        if used is None:
            problems.append(f"no MemTotal in {self.procfs / 'meminfo'}")
        else:
            samples.append(Sample("llmgw_node_memory_used_bytes", float(used)))
        return samples

    # ------------------------------------------------------------------ GPUs
    def _gpu_shares(self, units: dict[str, Unit], problems: list[str]) -> list[Sample]:
        if not units:
            return []
        slots: list[_Slot] = []
        try:
            with self.nvml_handle.session(self.name):
                slots = self._slots(problems)
        except NvmlAbsent:
            if not self._nvml_absent:
                log.info("units: no NVIDIA driver library on this node: no GPU shares")
            self._nvml_absent = True
        except (self.nvml.NVMLError, NvmlUnloadable) as exc:
            problems.append(f"NVML: {exc}")
        slots += self._amd_slots(problems)
        by_cgroup = {unit.cgroup: unit.name for unit in units.values()}
        samples = []
        for slot in slots:
            holders = sorted(
                {name for pid in slot.pids if (name := self._unit_of(pid, by_cgroup)) is not None}
            )
            for name in holders:
                labels = {"unit": name, "uuid": slot.uuid, "gpu_instance": slot.gpu_instance}
                samples.append(Sample("llmgw_unit_gpu_share", slot.fraction / len(holders), labels))
        return samples

    def _slots(self, problems: list[str]) -> list[_Slot]:
        """Every whole GPU and MIG GPU instance with the pids computing on it."""
        nvml = self.nvml
        slots: list[_Slot] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                if self._mig_enabled(handle):
                    slots += self._mig_slots(handle, uuid)
                else:
                    pids = self._pids(handle)
                    if pids is not None:
                        slots.append(_Slot(uuid, "", 1.0, pids))
            except nvml.NVMLError as exc:
                if self.nvml_handle.forget_if_driver_gone(exc):
                    raise
                problems.append(f"GPU {index}: {exc}")
        return slots

    def _amd_slots(self, problems: list[str]) -> list[_Slot]:
        """AMD GPUs and compute partitions from amdkfd (none without the amdgpu driver)."""
        if self.amd is None:
            return []
        return [_Slot(s.uuid, s.gpu_instance, s.fraction, s.pids) for s in self.amd.slots(problems)]

    @property
    def initialized(self) -> bool:
        return self.nvml_handle.initialized

    def close(self) -> None:
        self.nvml_handle.release(self.name)

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = self.nvml.nvmlDeviceGetMigMode(handle)
        except self.nvml.NVMLError as exc:
            if exc.value in _NVML_QUIET:
                return False
            raise
        return bool(current == self.nvml.NVML_DEVICE_MIG_ENABLE)

    def _pids(self, handle: Any) -> frozenset[int] | None:
        try:
            processes = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except self.nvml.NVMLError as exc:
            if exc.value in _NVML_QUIET:
                return None
            raise
        return frozenset(int(process.pid) for process in processes)

    def _mig_slots(self, parent: Any, uuid: str) -> list[_Slot]:
        """One slot per GPU instance; its compute instances' SMs and pids taken together."""
        nvml = self.nvml
        instances: dict[int, tuple[int, int, set[int]]] = {}  # gi → (SMs, slices, pids)
        for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
            except nvml.NVMLError_NotFound:
                continue
            gi = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
            attributes = nvml.nvmlDeviceGetAttributes_v2(mig)
            pids = self._pids(mig) or frozenset()
            sms, slices, seen = instances.get(gi, (0, 0, set()))
            instances[gi] = (
                sms + int(attributes.multiprocessorCount),
                max(slices, int(attributes.gpuInstanceSliceCount)),
                seen | pids,
            )
        total = self._total_sms(parent, instances.values())
        return [
            _Slot(uuid, str(gi), sms / total if total else 0.0, frozenset(pids))
            for gi, (sms, _slices, pids) in sorted(instances.items())
        ]

    def _total_sms(self, parent: Any, instances: Any) -> float:
        """The GPU's SM count: NVML's, else estimated from its instances (module docstring)."""
        nvml = self.nvml
        try:
            count = int(nvml.nvmlDeviceGetAttributes_v2(parent).multiprocessorCount)
            if count > 0:
                return float(count)
        except nvml.NVMLError as exc:
            if exc.value not in _NVML_QUIET | {nvml.NVML_ERROR_INVALID_ARGUMENT}:
                raise
        most = nvml.nvmlDeviceGetMaxMigDeviceCount(parent)
        return max((sms * most / slices for sms, slices, _pids in instances if slices), default=0.0)

    def _unit_of(self, pid: int, by_cgroup: dict[str, str]) -> str | None:
        """The unit whose cgroup holds the pid (its own directory or one below it)."""
        cgroup = read_v2_cgroup(self.procfs / str(pid) / "cgroup")
        while cgroup:
            if cgroup in by_cgroup:
                return by_cgroup[cgroup]
            cgroup = cgroup.rpartition("/")[0]
        return None


# ---------------------------------------------------------------- file parsers
def _read_keyed(path: Path, key: str, problems: list[str]) -> int | None:
    """`key`'s value in a `key value` file (cgroup's `cpu.stat`); None when absent."""
    text = read_text(path, problems)
    if text is None:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value.strip())
            except ValueError:
                break
    problems.append(f"{path}: no {key}")
    return None


def read_busy_cpu_seconds(path: Path) -> float | None:
    """Non-idle CPU seconds of all CPUs from `/proc/stat`'s `cpu` line."""
    text = read_text(path)
    for line in (text or "").splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            try:
                ticks = [int(value) for value in fields[1:]]
                return sum(ticks[column] for column in _BUSY.values()) / USER_HZ
            except (ValueError, IndexError):
                return None
    return None


def read_used_memory_bytes(path: Path) -> int | None:
    """MemTotal − MemAvailable from `/proc/meminfo`, in bytes (fallback: module docstring)."""
    text = read_text(path)
    kib: dict[str, int] = {}
    for line in (text or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kib[name] = int(parts[0])
    if "MemTotal" not in kib:
        return None
    if "MemAvailable" in kib:
        return (kib["MemTotal"] - kib["MemAvailable"]) * _KIB
    cache = sum(kib.get(name, 0) for name in ("MemFree", "Buffers", "Cached", "SReclaimable"))
    return max(kib["MemTotal"] - cache, 0) * _KIB


def read_v2_cgroup(path: Path) -> str | None:
    """The cgroup v2 path (`0::/…` line) of `/proc/<pid>/cgroup`, without its leading "/"."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # the process exited, or is not ours to read
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip().strip("/") or None
    return None
