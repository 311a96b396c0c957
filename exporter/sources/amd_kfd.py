"""AMD GPUs' compute processes for the units source: amdkfd's sysfs, pid → GPU serial number.

NVML gives the units source each NVIDIA GPU's processes; for AMD GPUs the
kernel's amdkfd driver publishes the same under `<sysfs>/class/kfd/kfd`, and
this module reads it (no ROCm library needed). File formats as the kernel
writes them (drivers/gpu/drm/amd/amdkfd/kfd_process.c and kfd_topology.c):

- `proc/<pid>/`: one directory per process that opened `/dev/kfd`, named by
  its pid in the host's PID namespace (`lead_thread->pid`). In it
  `queues/<queue id>/gpuid` (`%u`, no newline) for each queue the process
  created, and `vram_<gpu_id>` (`%llu\\n`, bytes) for every GPU the device
  cgroup lets it open. Opening `/dev/kfd` alone creates `vram_<gpu_id>` for
  *every* permitted GPU, so a process counts on a GPU only when it has a queue
  there or holds VRAM there (> 0). Secondary contexts (`context_<id>/` inside,
  or `pid:<pid>-id:<n>` beside, as ROCm SMI reads them) count for the same pid.
- `topology/nodes/<n>/gpu_id` (`%u\\n`; 0 for a CPU node) and `properties`
  (`name value` lines): `domain` and `location_id` place the node on the PCI
  bus (`location_id` = bus << 8 | devfn, with the partition's node id OR-ed
  in when the GPU is partitioned), `simd_count` is its compute, `unique_id`
  its ASIC id (decimal; the card's `unique_id` file has it in hex).

A GPU's identity is the serial number AMD's device-metrics-exporter labels
its series with (`serial_number`): amd-smi's board `product_serial`, which is
the PCI device's `serial_number` file (the FRU's, amdgpu_fru_eeprom.c),
whitespace trimmed. The card is found among `<sysfs>/class/drm/card<N>` by
the `PCI_SLOT_NAME` of its `device/uevent`, vendor 0x1002, matched to the KFD
node by PCI domain, bus and device (not function: the partition id sits in
those bits), as device-metrics-exporter gives every partition its parent
GPU's serial. Several KFD nodes on one GPU are its compute partitions (MI300
CPX, DPX, QPX): each is a slot, `gpu_instance` its place among them (0 … n−1,
by `location_id`: the kernel's partition node id), its fraction its SIMDs
over the GPU's (equal partitions: 1/n each). A GPU with a single KFD node is
a whole GPU, `gpu_instance=""`, fraction 1.

Missing data (never a share on a GPU it could not name):
- no `class/kfd/kfd` (no amdgpu driver): nothing, quietly;
- a process that exits while it is read: skipped, quietly;
- a process file that cannot be read or parsed: that file is left out and
  the problem is reported (the source reads down); a topology node that
  cannot be (the device cgroup refusing a GPU's files to the reader: EPERM):
  no AMD share at all that poll, reported, since a partition missing from its
  GPU would change the others' fractions;
- a process on a `gpu_id` no topology node has, a node with no amdgpu card at
  its PCI address, or a node whose `unique_id` disagrees with the card's: no
  share for it, reported;
- a card with no serial number (no FRU EEPROM: most Radeon cards): its GPU's
  power cannot be joined to the exporter's series, so no share, and a warning
  logged once per card (not a read-down: it is the hardware, not a fault).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from exporter.sysfs import read_int, read_text

log = logging.getLogger(__name__)

AMD_VENDOR = 0x1002
_PROC_ENTRY = re.compile(r"(\d+)|pid:(\d+)-id:\d+")
_CARD = re.compile(r"card\d+")
_PCI_ADDRESS = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.[0-7]")

#: PCI domain, bus, device: a physical GPU, whatever partition (function bits) a node is.
PciSlot = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class KfdSlot:
    """Where processes run on one AMD GPU: the whole GPU, or one compute partition."""

    uuid: str  # the GPU's serial number
    gpu_instance: str  # "" for a whole GPU, else the partition's index
    fraction: float  # of the GPU's SIMDs
    pids: frozenset[int]


@dataclass(frozen=True, slots=True)
class KfdNode:
    """A GPU node of the KFD topology."""

    index: int  # its directory under topology/nodes
    gpu_id: int
    domain: int
    location_id: int
    simd_count: int
    unique_id: int | None  # absent on kernels and GPUs without one

    @property
    def pci_slot(self) -> PciSlot:
        return (self.domain, (self.location_id >> 8) & 0xFF, (self.location_id & 0xFF) >> 3)


@dataclass(frozen=True, slots=True)
class AmdCard:
    """An amdgpu PCI device, from `class/drm/card<N>/device`."""

    address: str  # PCI_SLOT_NAME, e.g. 0000:c1:00.0
    serial: str  # "" when the card has none
    unique_id: int | None


class KfdReader:
    """Reads the KFD process lists and topology under one sysfs root."""

    def __init__(self, sysfs: Path) -> None:
        self.kfd = sysfs / "class" / "kfd" / "kfd"
        self.drm = sysfs / "class" / "drm"
        self._warned: set[str] = set()

    def slots(self, problems: list[str]) -> list[KfdSlot]:
        """Every AMD GPU (or partition) with processes computing on it."""
        if not self.kfd.is_dir():
            return []
        used = self._processes(problems)
        if not used:
            return []
        nodes, complete = self._topology(problems)
        if not complete:
            # A partition missing from its GPU would change the others' fractions and indices.
            problems.append("KFD topology not wholly readable: no AMD GPU shares this poll")
            return []
        by_gpu_id = {node.gpu_id: node for node in nodes}
        for gpu_id in sorted(set(used) - set(by_gpu_id)):
            pids = ", ".join(str(pid) for pid in sorted(used[gpu_id]))
            problems.append(f"KFD gpu_id {gpu_id} (pids {pids}) has no topology node")
        cards = self._cards(problems)
        groups: dict[PciSlot, list[KfdNode]] = {}
        for node in nodes:
            groups.setdefault(node.pci_slot, []).append(node)
        slots: list[KfdSlot] = []
        for key, group in sorted(groups.items()):
            if not any(node.gpu_id in used for node in group):
                continue
            serial = self._identify(key, group, cards, problems)
            if serial is not None:
                slots += self._partition_slots(serial, group, used, problems)
        return slots

    # ------------------------------------------------------------- processes
    def _processes(self, problems: list[str]) -> dict[int, set[int]]:
        """gpu_id → pids with a queue or VRAM on it."""
        used: dict[int, set[int]] = {}
        root = self.kfd / "proc"
        try:
            entries = sorted(root.iterdir())
        except FileNotFoundError:  # kernels before 5.8 publish no process list
            return used
        except OSError as exc:
            problems.append(f"{root}: {exc.strerror}")
            return used
        for entry in entries:
            match = _PROC_ENTRY.fullmatch(entry.name)
            if match is None:
                continue
            pid = int(match[1] or match[2])
            contexts = [entry, *sorted(entry.glob("context_*"))]
            for directory in contexts:
                for gpu_id in self._gpus_in_use(directory, problems):
                    used.setdefault(gpu_id, set()).add(pid)
        return used

    def _gpus_in_use(self, directory: Path, problems: list[str]) -> set[int]:
        gpus: set[int] = set()
        for gpuid in sorted(directory.glob("queues/*/gpuid")):
            value = read_int(gpuid, problems)
            if value is not None:
                gpus.add(value)
        for vram in sorted(directory.glob("vram_*")):
            suffix = vram.name.removeprefix("vram_")
            if not suffix.isdigit():
                continue
            held = read_int(vram, problems)
            if held:
                gpus.add(int(suffix))
        return gpus

    # -------------------------------------------------------------- topology
    def _topology(self, problems: list[str]) -> tuple[list[KfdNode], bool]:
        """The GPU nodes, and whether every node could be read."""
        root = self.kfd / "topology" / "nodes"
        try:
            names = [path.name for path in root.iterdir() if path.name.isdigit()]
        except OSError as exc:
            problems.append(f"{root}: {exc.strerror}")
            return [], False
        nodes = []
        complete = True
        for index in sorted(int(name) for name in names):
            directory = root / str(index)
            gpu_id = read_int(directory / "gpu_id", problems)
            if gpu_id == 0:  # a CPU node
                continue
            text = read_text(directory / "properties", problems) if gpu_id else None
            props = _properties(text or "")
            missing = [key for key in ("domain", "location_id", "simd_count") if key not in props]
            if text is not None and missing:
                problems.append(f"{directory / 'properties'}: no {', '.join(missing)}")
            if gpu_id is None or missing:
                complete = False  # unreadable or gone mid-read: reported above, or a race
                continue
            nodes.append(
                KfdNode(
                    index,
                    gpu_id,
                    props["domain"],
                    props["location_id"],
                    props["simd_count"],
                    props.get("unique_id") or None,
                )
            )
        return nodes, complete

    def _cards(self, problems: list[str]) -> dict[PciSlot, list[AmdCard]]:
        """The amdgpu PCI devices by PCI slot (partitions' own DRM cards are not PCI: skipped)."""
        cards: dict[PciSlot, list[AmdCard]] = {}
        try:
            names = sorted(path.name for path in self.drm.iterdir() if _CARD.fullmatch(path.name))
        except OSError:
            return cards
        for name in names:
            device = self.drm / name / "device"
            uevent = read_text(device / "uevent", problems)
            vendor = read_text(device / "vendor", problems)
            if uevent is None or vendor is None or _hex(vendor) != AMD_VENDOR:
                continue
            address = _uevent(uevent).get("PCI_SLOT_NAME", "")
            match = _PCI_ADDRESS.fullmatch(address)
            if match is None:
                continue
            serial = read_text(device / "serial_number", problems)
            unique = read_text(device / "unique_id", problems)
            slot = (int(match[1], 16), int(match[2], 16), int(match[3], 16))
            cards.setdefault(slot, []).append(
                AmdCard(address.lower(), (serial or "").strip(), _hex(unique or ""))
            )
        return cards

    def _identify(
        self,
        key: PciSlot,
        group: list[KfdNode],
        cards: dict[PciSlot, list[AmdCard]],
        problems: list[str],
    ) -> str | None:
        """The serial number of the GPU a group of KFD nodes is on, or None (and why)."""
        nodes = ", ".join(f"{node.index} (gpu_id {node.gpu_id})" for node in group)
        where = "{:04x}:{:02x}:{:02x}".format(*key)
        found = cards.get(key, [])
        if len(found) != 1:
            what = "no amdgpu card" if not found else f"{len(found)} amdgpu cards"
            problems.append(f"KFD nodes {nodes}: {what} at PCI {where}, not attributed")
            return None
        card = found[0]
        for node in group:
            if node.unique_id and card.unique_id and node.unique_id != card.unique_id:
                problems.append(
                    f"KFD node {node.index} has unique_id {node.unique_id:016x}, the card at "
                    f"{card.address} {card.unique_id:016x}: not attributed"
                )
                return None
        if not card.serial:
            if card.address not in self._warned:
                self._warned.add(card.address)
                log.warning(
                    "units: the AMD GPU at %s has no serial number: its units get no GPU share",
                    card.address,
                )
            return None
        return card.serial

    def _partition_slots(
        self, serial: str, group: list[KfdNode], used: dict[int, set[int]], problems: list[str]
    ) -> list[KfdSlot]:
        if len(group) == 1:
            return [KfdSlot(serial, "", 1.0, frozenset(used.get(group[0].gpu_id, ())))]
        total = sum(node.simd_count for node in group)
        if total <= 0:
            problems.append(f"GPU {serial}: its KFD partitions report no SIMDs, not attributed")
            return []
        ordered = sorted(group, key=lambda node: (node.location_id, node.index))
        return [
            KfdSlot(serial, str(place), node.simd_count / total, frozenset(used[node.gpu_id]))
            for place, node in enumerate(ordered)
            if node.gpu_id in used
        ]


# ---------------------------------------------------------------- file parsers
def _properties(text: str) -> dict[str, int]:
    """KFD's `name value` lines (values are decimal)."""
    props = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            props[name] = int(value)
    return props


def _uevent(text: str) -> dict[str, str]:
    return dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)


def _hex(text: str) -> int | None:
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None
