"""UnitsSource on AMD GPUs: amdkfd's process lists and topology, pid → cgroup → unit.

No recording of a `/sys/class/kfd` tree is public, so the KFD trees here are
**synthetic**, written in the formats the kernel prints them in:

- `kfd/proc/<pid>/vram_<gpu_id>` ("%llu\\n"), `queues/<qid>/gpuid` ("%u", no
  newline): drivers/gpu/drm/amd/amdkfd/kfd_process.c, kfd_procfs_show() and
  kfd_procfs_queue_show() (gregkh/linux @ 10d525b98aaa);
- `kfd/topology/nodes/<n>/gpu_id` ("%u\\n"), `properties` ("%s %u\\n" /
  "%s %llu\\n" lines, in node_show()'s order), `location_id` =
  pci_dev_id(pdev) | partition node id, partitions' `simd_count` = the GPU's
  over num_nodes: kfd_topology.c, node_show() and kfd_topology_add_device()
  (gregkh/linux @ 213edb4348e7), kfd_crat.c kfd_create_vcrat_image_gpu();
- `drm/card<N>/device/serial_number`, read by amd-smi as the board's
  `product_serial` (ROCm/amdsmi @ 8c97a384, src/amd_smi/amd_smi_utils.cc,
  smi_amdgpu_get_board_info()), which device-metrics-exporter labels
  `serial_number` (ROCm/device-metrics-exporter, pkg/amdgpu/gpuagent).

The figures are an MI300X's (304 CUs × 4 SIMDs = 1216 SIMDs; 152 per CPX
partition) at made-up PCI addresses with made-up serial numbers. The one
**recorded** AMD card is procfs' (prometheus/procfs @ 3c943fdb,
testdata/fixtures.ttar, `sys/class/drm/card0`: a Vega at 0000:09:00.0 whose
`serial_number` is empty, as on cards without a FRU EEPROM).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.nvml import Nvml
from exporter.samples import PartialReading, Sample
from exporter.sources.units import UnitsConfig, UnitsSource
from tests.conftest import FakeNvml
from tests.shared_fixtures import SHARED_FIXTURES
from tests.ttar import extract
from tests.units_helpers import BATCH, GLOB, H100, JOBS, OTHER, PATTERN, TASK, in_cgroup, shares

CEEMS = SHARED_FIXTURES / "ceems" / "bsd3"
PROCFS = SHARED_FIXTURES / "procfs" / "fixtures.ttar"
SIMDS = 1216  # MI300X: 304 CUs x 4
GPU0, GPU1 = "0000:c1:00.0", "0000:e1:00.0"
SERIAL0, SERIAL1 = "PCB052715-0071", "PCB052715-0102"
UNIQUE0, UNIQUE1 = 0x5F21E8A1D2A3C4E1, 0x5F21E8A1D2A3C4E2


def location_id(address: str, partition: int = 0) -> int:
    """pci_dev_id(pdev) = bus << 8 | devfn, the partition's node id OR-ed in."""
    _domain, bus, devfn = address.split(":")
    device, function = devfn.split(".")
    return int(bus, 16) << 8 | (int(device, 16) << 3 | int(function)) | partition


@pytest.fixture(scope="module")
def ceems(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ceems")
    extract(CEEMS / "sys.ttar", root)
    return root


@pytest.fixture
def node(ceems: Path, tmp_path: Path) -> Path:
    """CEEMS' three Slurm jobs as units, and an empty KFD tree (the amdgpu driver, no GPU yet)."""
    shutil.copytree(ceems / "sys" / "fs" / "cgroup" / JOBS, tmp_path / "sys/fs/cgroup" / JOBS)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "stat").write_text("cpu  100 0 50 1000 0 0 0 0 0 0\n")
    (tmp_path / "proc" / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 500 kB\n")
    write_cpu_node(tmp_path / "sys")
    (kfd(tmp_path / "sys") / "proc").mkdir(parents=True)
    return tmp_path


def kfd(sysfs: Path) -> Path:
    return sysfs / "class" / "kfd" / "kfd"


def write_cpu_node(sysfs: Path) -> None:
    directory = kfd(sysfs) / "topology" / "nodes" / "0"
    directory.mkdir(parents=True)
    (directory / "gpu_id").write_text("0\n")
    (directory / "name").write_text("\n")
    (directory / "properties").write_text(
        "cpu_cores_count 96\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\n"
        "io_links_count 8\np2p_links_count 0\ncpu_core_id_base 0\nsimd_id_base 0\n"
        "max_waves_per_simd 0\nlds_size_in_kb 0\ngds_size_in_kb 0\nnum_gws 0\n"
        "wave_front_size 0\narray_count 0\nsimd_arrays_per_engine 0\ncu_per_simd_array 0\n"
        "simd_per_cu 0\nmax_slots_scratch_cu 0\ngfx_target_version 0\nvendor_id 0\n"
        "device_id 0\nlocation_id 0\ndomain 0\ndrm_render_minor 0\nhive_id 0\n"
        "num_sdma_engines 0\nnum_sdma_xgmi_engines 0\nnum_sdma_queues_per_engine 0\n"
        "num_cp_queues 0\nmax_engine_clk_ccompute 3700\n"
    )


def write_gpu_node(
    sysfs: Path,
    index: int,
    gpu_id: int,
    address: str,
    *,
    partition: int = 0,
    simds: int = SIMDS,
    unique_id: int | None = UNIQUE0,
) -> None:
    """A GPU node's gpu_id and properties, every line node_show() prints for a GPU."""
    directory = kfd(sysfs) / "topology" / "nodes" / str(index)
    directory.mkdir(parents=True)
    (directory / "gpu_id").write_text(f"{gpu_id}\n")
    (directory / "name").write_text("ip discovery\n")
    domain = int(address.split(":")[0], 16)
    lines = [
        "cpu_cores_count 0",
        f"simd_count {simds}",
        "mem_banks_count 1",
        "caches_count 206",
        "io_links_count 1",
        "p2p_links_count 7",
        "cpu_core_id_base 0",
        "simd_id_base 2147487744",
        "max_waves_per_simd 8",
        "lds_size_in_kb 64",
        "gds_size_in_kb 0",
        "num_gws 64",
        "wave_front_size 64",
        f"array_count {simds // 38}",
        "simd_arrays_per_engine 1",
        "cu_per_simd_array 10",
        "simd_per_cu 4",
        "max_slots_scratch_cu 32",
        "gfx_target_version 90402",
        "vendor_id 4098",
        "device_id 29857",
        f"location_id {location_id(address, partition)}",
        f"domain {domain}",
        f"drm_render_minor {128 + index}",
        "hive_id 0",
        "num_sdma_engines 2",
        "num_sdma_xgmi_engines 14",
        "num_sdma_queues_per_engine 8",
        "num_cp_queues 24",
        "max_engine_clk_fcompute 2100",
        "local_mem_size 0",
        "fw_version 177",
        "capability 746244736",
        "debug_prop 1495",
        "sdma_fw_version 22",
    ]
    if unique_id is not None:
        lines.append(f"unique_id {unique_id}")
    lines += [f"num_xcc {simds // 152}", "max_engine_clk_ccompute 3700"]
    (directory / "properties").write_text("".join(f"{line}\n" for line in lines))


def write_card(
    sysfs: Path,
    number: int,
    address: str,
    serial: str,
    unique_id: int | None = UNIQUE0,
    vendor: str = "0x1002",
) -> None:
    device = sysfs / "class" / "drm" / f"card{number}" / "device"
    device.mkdir(parents=True)
    (device / "vendor").write_text(f"{vendor}\n")
    (device / "uevent").write_text(
        f"DRIVER=amdgpu\nPCI_CLASS=38000\nPCI_ID=1002:74A1\nPCI_SUBSYS_ID=1002:74A1\n"
        f"PCI_SLOT_NAME={address}\nMODALIAS=pci:v00001002d000074A1sv00001002sd000074A1bc03sc80i00\n"
    )
    (device / "serial_number").write_text(f"{serial}\n")
    if unique_id is not None:
        (device / "unique_id").write_text(f"{unique_id:016x}\n")


def write_partition_card(sysfs: Path, number: int, partition: int) -> None:
    """A partition's own DRM card: a platform device (amdgpu_xcp), not a PCI one."""
    device = sysfs / "class" / "drm" / f"card{number}" / "device"
    device.mkdir(parents=True)
    (device / "uevent").write_text("DRIVER=amdgpu_xcp_drv\nMODALIAS=platform:amdgpu_xcp\n")
    (device / "vendor").write_text("0x1002\n")  # not a platform device's file: ignored anyway
    (device / "modalias").write_text(f"platform:amdgpu_xcp.{partition}\n")


def write_process(
    sysfs: Path,
    pid: int | str,
    vram: dict[int, int],
    queues: dict[int, int] | None = None,
) -> Path:
    """proc/<pid>: vram_<gpu_id> for every GPU it may open, a queue directory per queue."""
    directory = kfd(sysfs) / "proc" / str(pid)
    directory.mkdir(parents=True)
    (directory / "pasid").write_text("32770\n")
    (directory / "queues").mkdir()
    for gpu_id, held in vram.items():
        (directory / f"vram_{gpu_id}").write_text(f"{held}\n")
        (directory / f"sdma_{gpu_id}").write_text("0\n")
        (directory / f"stats_{gpu_id}").mkdir()
        (directory / f"stats_{gpu_id}" / "evicted_ms").write_text("0\n")
    for queue, gpu_id in (queues or {}).items():
        (directory / "queues" / str(queue)).mkdir()
        (directory / "queues" / str(queue) / "gpuid").write_text(str(gpu_id))
        (directory / "queues" / str(queue) / "type").write_text("2")
        (directory / "queues" / str(queue) / "size").write_text("1048576")
    return directory


def two_mi300x(sysfs: Path) -> tuple[int, int]:
    write_gpu_node(sysfs, 1, 53895, GPU0)
    write_gpu_node(sysfs, 2, 8218, GPU1, unique_id=UNIQUE1)
    write_card(sysfs, 0, GPU0, SERIAL0)
    write_card(sysfs, 1, GPU1, SERIAL1, UNIQUE1)
    return 53895, 8218


def no_nvml() -> Nvml:
    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    return Nvml(api=SimpleNamespace(**{**vars(pynvml), "nvmlInit": missing}))


def source(root: Path, nvml: Any = None, **config: Any) -> UnitsSource:
    config = {"glob": GLOB, "pattern": PATTERN, **config}
    return UnitsSource(
        root / "sys", UnitsConfig(**config), procfs=root / "proc", nvml=nvml or no_nvml()
    )


def poll(root: Path, **config: Any) -> list[Sample]:
    units = source(root, **config)
    try:
        return units.poll()
    finally:
        units.close()


# --- shares --------------------------------------------------------------------------------------


def test_whole_gpus_by_serial_number_one_unit_and_time_shared(node: Path):
    sysfs = node / "sys"
    gpu0, gpu1 = two_mi300x(sysfs)
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248/step_batch")
    in_cgroup(node, TASK, f"{JOBS}/job_1009249/step_0/task_0")
    in_cgroup(node, OTHER, f"{JOBS}/job_1009250")
    in_cgroup(node, 77, "system.slice/rocm-smi-exporter.service")  # in no unit
    in_cgroup(node, 78, f"{JOBS}/job_1009248")  # opened /dev/kfd, uses nothing
    write_process(sysfs, BATCH, {gpu0: 17_179_869_184, gpu1: 0}, {0: gpu0, 1: gpu0})
    write_process(sysfs, TASK, {gpu0: 0, gpu1: 8_589_934_592}, {0: gpu1})  # VRAM and a queue
    write_process(sysfs, OTHER, {gpu0: 0, gpu1: 4_096})  # VRAM, no queue yet
    write_process(sysfs, 77, {gpu0: 2_097_152, gpu1: 0})
    write_process(sysfs, 78, {gpu0: 0, gpu1: 0})
    write_process(sysfs, BATCH + 100000, {gpu0: 1_048_576, gpu1: 0})  # no /proc entry: exited
    assert shares(poll(node)) == {
        ("1009248", SERIAL0, ""): 1.0,
        ("1009249", SERIAL1, ""): 0.5,
        ("1009250", SERIAL1, ""): 0.5,
    }


def test_cpx_partitions_are_instances_of_the_gpu_by_simd_fraction(node: Path):
    """MI300X in CPX: eight KFD nodes on one PCI device, 152 SIMDs each; the serial is the GPU's."""
    sysfs = node / "sys"
    ids = [40000 + partition for partition in range(8)]
    for partition, gpu_id in enumerate(ids):
        write_gpu_node(sysfs, 1 + partition, gpu_id, GPU0, partition=partition, simds=152)
    write_card(sysfs, 0, GPU0, SERIAL0)
    for partition in range(1, 8):
        write_partition_card(sysfs, partition, partition)
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    in_cgroup(node, TASK, f"{JOBS}/job_1009249")
    in_cgroup(node, OTHER, f"{JOBS}/job_1009250")
    vram_everywhere = dict.fromkeys(ids, 0)
    write_process(sysfs, BATCH, {**vram_everywhere, ids[0]: 1 << 30}, {0: ids[0]})
    write_process(sysfs, TASK, {**vram_everywhere, ids[3]: 1 << 30}, {0: ids[3]})
    write_process(sysfs, OTHER, vram_everywhere, {0: ids[3]})
    assert shares(poll(node)) == {
        ("1009248", SERIAL0, "0"): 1 / 8,
        ("1009249", SERIAL0, "3"): 1 / 8 / 2,
        ("1009250", SERIAL0, "3"): 1 / 8 / 2,
    }


def test_secondary_contexts_count_for_their_process(node: Path):
    sysfs = node / "sys"
    gpu0, gpu1 = two_mi300x(sysfs)
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    in_cgroup(node, TASK, f"{JOBS}/job_1009249")
    primary = write_process(sysfs, BATCH, {gpu0: 0, gpu1: 0})
    context = primary / "context_1"
    context.mkdir()
    (context / f"vram_{gpu1}").write_text("65536\n")
    write_process(sysfs, f"pid:{TASK}-id:1", {gpu0: 0, gpu1: 0}, {3: gpu0})
    assert shares(poll(node)) == {("1009248", SERIAL1, ""): 1.0, ("1009249", SERIAL0, ""): 1.0}


def test_a_unit_on_both_vendors_gets_a_share_of_each(node: Path, fake_nvml: FakeNvml):
    sysfs = node / "sys"
    gpu0, _gpu1 = two_mi300x(sysfs)
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    in_cgroup(node, TASK, f"{JOBS}/job_1009248/step_1")
    in_cgroup(node, OTHER, f"{JOBS}/job_1009250")
    config = fake_nvml.load_fixture("h100")
    config["devices"][0]["processes"] = [
        {"pid": BATCH, "used_memory_bytes": 1},
        {"pid": OTHER, "used_memory_bytes": 1},
    ]
    fake_nvml.configure(config)
    write_process(sysfs, TASK, {gpu0: 1 << 20}, {0: gpu0})
    try:
        got = shares(poll(node, nvml=Nvml()))
    finally:
        fake_nvml.reset()
    assert got == {
        ("1009248", H100, ""): 0.5,
        ("1009250", H100, ""): 0.5,
        ("1009248", SERIAL0, ""): 1.0,
    }


# --- what cannot be named gets no share ----------------------------------------------------------


def test_no_kfd_means_no_amd_shares_and_no_failure(node: Path):
    shutil.rmtree(kfd(node / "sys"))
    got = poll(node)
    assert shares(got) == {}
    assert len([s for s in got if s.metric == "llmgw_unit_info"]) == 3


def test_amd_kfd_off_reads_no_kfd(node: Path):
    sysfs = node / "sys"
    gpu0, _gpu1 = two_mi300x(sysfs)
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    write_process(sysfs, BATCH, {gpu0: 1 << 20})
    assert shares(poll(node, amd_kfd=False)) == {}
    assert shares(poll(node)) == {("1009248", SERIAL0, ""): 1.0}


def test_a_gpu_id_with_no_topology_node_is_reported_and_the_rest_served(node: Path):
    sysfs = node / "sys"
    gpu0, _gpu1 = two_mi300x(sysfs)
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    in_cgroup(node, TASK, f"{JOBS}/job_1009249")
    write_process(sysfs, BATCH, {gpu0: 1 << 20})
    write_process(sysfs, TASK, {}, {0: 61000})  # a GPU that left the topology
    with pytest.raises(PartialReading) as caught:
        poll(node)
    assert f"KFD gpu_id 61000 (pids {TASK}) has no topology node" in str(caught.value)
    assert shares(caught.value.samples) == {("1009248", SERIAL0, ""): 1.0}


def test_unreadable_topology_gives_no_amd_share_naming_the_file(node: Path, monkeypatch):
    """The device cgroup refuses a GPU's topology files to a reader it does not admit (EPERM).

    The node might have been one of GPU0's partitions: GPU0's share cannot be trusted either.
    """
    sysfs = node / "sys"
    gpu0, gpu1 = two_mi300x(sysfs)
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    in_cgroup(node, TASK, f"{JOBS}/job_1009249")
    write_process(sysfs, BATCH, {gpu0: 1 << 20, gpu1: 0})
    write_process(sysfs, TASK, {gpu0: 0, gpu1: 1 << 20})
    refused = kfd(sysfs) / "topology" / "nodes" / "2" / "properties"
    real = Path.read_text

    def read_text(path: Path, *args: Any, **kwargs: Any) -> str:
        if path == refused:
            raise PermissionError(1, "Operation not permitted", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.raises(PartialReading) as caught:
        poll(node)
    message = str(caught.value)
    assert f"{refused}: Operation not permitted" in message
    assert "KFD topology not wholly readable: no AMD GPU shares this poll" in message
    assert shares(caught.value.samples) == {}
    assert len([s for s in caught.value.samples if s.metric == "llmgw_unit_info"]) == 3
    monkeypatch.undo()
    assert shares(poll(node)) == {("1009248", SERIAL0, ""): 1.0, ("1009249", SERIAL1, ""): 1.0}


def test_garbled_process_file_is_reported(node: Path):
    sysfs = node / "sys"
    gpu0, gpu1 = two_mi300x(sysfs)
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    in_cgroup(node, TASK, f"{JOBS}/job_1009249")
    write_process(sysfs, BATCH, {gpu0: 1 << 20})
    broken = write_process(sysfs, TASK, {gpu1: 0})
    (broken / f"vram_{gpu1}").write_text("lots\n")
    with pytest.raises(PartialReading) as caught:
        poll(node)
    assert f"{broken / f'vram_{gpu1}'}: not a number" in str(caught.value)
    assert shares(caught.value.samples) == {("1009248", SERIAL0, ""): 1.0}


def test_no_amd_card_at_the_nodes_pci_address(node: Path):
    sysfs = node / "sys"
    write_gpu_node(sysfs, 1, 53895, GPU0)
    write_card(sysfs, 0, GPU1, SERIAL1)  # another GPU's card; GPU0's is missing
    write_card(sysfs, 1, GPU0, "1324NVIDIA0001", vendor="0x10de")  # not AMD's
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    write_process(sysfs, BATCH, {53895: 1 << 20})
    with pytest.raises(PartialReading) as caught:
        poll(node)
    assert "KFD nodes 1 (gpu_id 53895): no amdgpu card at PCI 0000:c1:00, not attributed" in str(
        caught.value
    )
    assert shares(caught.value.samples) == {}


def test_unique_id_disagreeing_with_the_card_is_not_attributed(node: Path):
    sysfs = node / "sys"
    write_gpu_node(sysfs, 1, 53895, GPU0, unique_id=UNIQUE1)
    write_card(sysfs, 0, GPU0, SERIAL0, UNIQUE0)
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    write_process(sysfs, BATCH, {53895: 1 << 20})
    with pytest.raises(PartialReading) as caught:
        poll(node)
    assert f"KFD node 1 has unique_id {UNIQUE1:016x}, the card at {GPU0} {UNIQUE0:016x}" in str(
        caught.value
    )
    assert shares(caught.value.samples) == {}


def test_a_card_without_serial_number_gets_no_share_and_a_warning(
    node: Path, tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
):
    """procfs' recorded Vega card at 0000:09:00.0: empty serial_number, a unique_id."""
    recorded = tmp_path_factory.mktemp("procfs")
    extract(PROCFS, recorded)
    sysfs = node / "sys"
    shutil.copytree(
        recorded / "fixtures/sys/class/drm/card0", sysfs / "class/drm/card0", symlinks=True
    )
    assert (sysfs / "class/drm/card0/device/serial_number").read_text() == "\n"
    write_gpu_node(sysfs, 1, 4460, "0000:09:00.0", simds=256, unique_id=0x0123456789ABCDEF)
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    write_process(sysfs, BATCH, {4460: 1 << 20}, {0: 4460})
    units = source(node)
    with caplog.at_level(logging.WARNING):
        first = units.poll()  # no PartialReading: the card has no serial, nothing is broken
        units.poll()
    assert shares(first) == {}
    warnings = [r.getMessage() for r in caplog.records if "no serial number" in r.getMessage()]
    assert warnings == [
        "units: the AMD GPU at 0000:09:00.0 has no serial number: its units get no GPU share"
    ]


# --- property: any partition mode, any placement -------------------------------------------------

UNIT_PIDS = {"1009248": BATCH, "1009249": TASK, "1009250": OTHER}


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    partitions=st.sampled_from([1, 2, 4, 8]),  # SPX, DPX, QPX, CPX
    placement=st.lists(st.integers(0, 7), min_size=3, max_size=3),
    shuffled=st.permutations(range(8)),
)
def test_any_partition_mode_and_placement(
    ceems: Path, partitions: int, placement: list[int], shuffled: list[int]
):
    """Each unit gets 1/n of the GPU over the units on its partition; gpu_instance is the partition.

    KFD nodes are numbered in an arbitrary order (`shuffled`): the partition index comes from
    location_id, not from the node's directory.
    """
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for unit in UNIT_PIDS:  # the three jobs' directories, only what the source reads
            job = root / "sys/fs/cgroup" / JOBS / f"job_{unit}"
            job.mkdir(parents=True)
            shutil.copy(ceems / "sys/fs/cgroup" / JOBS / f"job_{unit}" / "cpu.stat", job)
        (root / "proc").mkdir()
        (root / "proc" / "stat").write_text("cpu  100 0 50 1000 0 0 0 0 0 0\n")
        (root / "proc" / "meminfo").write_text("MemTotal: 1000 kB\nMemAvailable: 500 kB\n")
        sysfs = root / "sys"
        write_cpu_node(sysfs)
        ids = [30000 + 17 * partition for partition in range(partitions)]
        order = [p for p in shuffled if p < partitions]
        for index, partition in enumerate(order, start=1):
            write_gpu_node(
                sysfs, index, ids[partition], GPU0, partition=partition, simds=SIMDS // partitions
            )
        write_card(sysfs, 0, GPU0, SERIAL0)
        on = {unit: place % partitions for unit, place in zip(UNIT_PIDS, placement, strict=True)}
        for unit, pid in UNIT_PIDS.items():
            in_cgroup(root, pid, f"{JOBS}/job_{unit}")
            vram = dict.fromkeys(ids, 0)
            write_process(sysfs, pid, {**vram, ids[on[unit]]: 1 << 30}, {0: ids[on[unit]]})
        got = shares(poll(root))
    sharers = {p: sum(1 for q in on.values() if q == p) for p in on.values()}
    instance = (lambda p: "") if partitions == 1 else str
    assert got == pytest.approx(
        {(unit, SERIAL0, instance(p)): 1 / partitions / sharers[p] for unit, p in on.items()}
    )
