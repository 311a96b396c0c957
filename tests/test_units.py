"""UnitsSource over CEEMS' cgroup v2 and /proc trees, with the fake NVML library for GPUs.

CEEMS' tree (tests/fixtures/ceems/bsd3) holds three Slurm jobs under
`system.slice/slurmstepd.scope/job_*`; its expected /metrics
(`expected/e2e-test-cgroupsv2-all-metrics-output.txt`) is the oracle for what
we read from the same files: per job CPU time and memory, the node's CPU modes,
MemTotal, and the number of units.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from pydantic import ValidationError

from exporter.config import AgentConfig
from exporter.nvml import Nvml
from exporter.samples import PartialReading, Sample
from exporter.sources import SOURCES
from exporter.sources.units import (
    UnitsConfig,
    UnitsSource,
    read_busy_cpu_seconds,
    read_used_memory_bytes,
)
from tests.conftest import FakeNvml
from tests.shared_fixtures import SHARED_FIXTURES
from tests.ttar import extract
from tests.units_helpers import BATCH, GLOB, H100, JOBS, OTHER, PATTERN, TASK, in_cgroup, shares

CEEMS = SHARED_FIXTURES / "ceems" / "bsd3"
ORACLE = CEEMS / "expected" / "e2e-test-cgroupsv2-all-metrics-output.txt"
SECOND = "GPU-11111111-1111-1111-1111-111111111111"


@pytest.fixture(scope="module")
def ceems(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ceems")
    extract(CEEMS / "sys.ttar", root)
    extract(CEEMS / "proc.ttar", root)
    return root


@pytest.fixture
def node(ceems: Path, tmp_path: Path) -> Path:
    """A writable copy of the parts of CEEMS' trees the source reads."""
    shutil.copytree(ceems / "sys" / "fs" / "cgroup" / JOBS, tmp_path / "sys/fs/cgroup" / JOBS)
    (tmp_path / "proc").mkdir()
    for name in ("stat", "meminfo"):
        shutil.copy(ceems / "proc" / name, tmp_path / "proc" / name)
    return tmp_path


@pytest.fixture(autouse=True)
def clean(fake_nvml: FakeNvml):
    fake_nvml.reset()
    fake_nvml.configure({"devices": []})
    yield
    fake_nvml.reset()


def source(root: Path, **config: Any) -> UnitsSource:
    config = {"glob": GLOB, "pattern": PATTERN, **config}
    return UnitsSource(root / "sys", UnitsConfig(**config), procfs=root / "proc")


def series(samples: list[Sample]) -> dict[tuple, float]:
    out = {(s.metric, *sorted(s.labels.items())): s.value for s in samples}
    assert len(out) == len(samples), "a series was emitted twice"
    return out


def unit_names(got: dict[tuple, float]) -> set[str]:
    return {dict(k[1:])["unit"] for k in got if k[0] == "llmgw_unit_info"}


def oracle() -> dict[str, dict[str, float]]:
    """CEEMS' expected values by metric, keyed by the job number (or mode)."""
    found: dict[str, dict[str, float]] = {}
    line = re.compile(r"^(ceems_\w+)\{([^}]*)\} (\S+)$")
    for text in ORACLE.read_text().splitlines():
        match = line.match(text)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match[2]))
        key = labels.get("mode") or labels.get("uuid") or ""
        found.setdefault(match[1], {})[key] = float(match[3])
    return found


# --- the CEEMS tree and its oracle ----------------------------------------------------------------


def test_ceems_jobs_read_as_ceems_reads_them(ceems: Path):
    got = series(source(ceems).poll())
    expected = oracle()
    jobs = ("1009248", "1009249", "1009250")
    assert unit_names(got) == set(jobs)
    assert len(jobs) == expected["ceems_compute_units"][""]
    # CEEMS publishes user and system seconds; usage_usec is their sum (within its 1 µs).
    user = next(iter(expected["ceems_compute_unit_cpu_user_seconds_total"].values()))
    system = next(iter(expected["ceems_compute_unit_cpu_system_seconds_total"].values()))
    used = next(iter(expected["ceems_compute_unit_memory_used_bytes"].values()))
    for job in jobs:
        unit = (("unit", job),)
        assert got[("llmgw_unit_cpu_seconds_total", *unit)] == pytest.approx(
            user + system, abs=1.5e-6
        )
        assert got[("llmgw_unit_cpu_seconds_total", *unit)] == 60491.070351
        assert got[("llmgw_unit_memory_bytes", *unit)] == used == 4111491072
        assert got[("llmgw_unit_info", ("model", ""), ("profile", ""), *unit)] == 1


def test_ceems_node_cpu_is_the_non_idle_modes_of_its_oracle(ceems: Path):
    got = series(source(ceems).poll())
    modes = oracle()["ceems_cpu_seconds_total"]
    # CEEMS' rules divide by mode!~"idle|iowait|steal": user, nice, system, irq, softirq.
    busy = sum(v for mode, v in modes.items() if mode not in ("idle", "iowait", "steal"))
    assert busy == pytest.approx(4183.34)
    assert got[("llmgw_node_cpu_seconds_total",)] == pytest.approx(busy, abs=1e-9)


def test_ceems_meminfo_without_memavailable_falls_back_to_free(ceems: Path):
    """CEEMS reads the absent MemAvailable as 0 (used = MemTotal); we compute what `free` did."""
    expected = oracle()
    total = expected["ceems_meminfo_MemTotal_bytes"][""]
    assert total == 15666184 * 1024
    assert expected["ceems_meminfo_MemAvailable_bytes"][""] == 0
    got = series(source(ceems).poll())
    # MemTotal - MemFree - Buffers - Cached - SReclaimable, in kB, from the fixture.
    used = (15666184 - 440324 - 1020128 - 12007640 - 1738124) * 1024
    assert got[("llmgw_node_memory_used_bytes",)] == used


def test_meminfo_with_memavailable(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 600 kB\nCached: 50 kB\n")
    assert read_used_memory_bytes(meminfo) == 400 * 1024
    meminfo.write_text("MemFree: 100 kB\n")
    assert read_used_memory_bytes(meminfo) is None


def test_proc_stat_busy_columns(tmp_path: Path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 20 30 9000 500 7 3 400 50 5\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert read_busy_cpu_seconds(stat) == (100 + 20 + 30 + 7 + 3) / 100
    stat.write_text("intr 1 2 3\n")
    assert read_busy_cpu_seconds(stat) is None


def test_unit_model_profile_from_the_pattern(node: Path):
    base = node / "sys/fs/cgroup" / JOBS
    (base / "job_1009248").rename(base / "llama-70b--tp4--r1")
    got = series(
        source(
            node,
            glob=f"{JOBS}/*",
            pattern=r"(?P<model>[^/]+)--(?P<profile>[^/]+)--(?P<unit>[^/]+)$",
        ).poll()
    )
    info = {k: v for k, v in got.items() if k[0] == "llmgw_unit_info"}
    assert info == {
        ("llmgw_unit_info", ("model", "llama-70b"), ("profile", "tp4"), ("unit", "r1")): 1
    }
    assert got[("llmgw_unit_cpu_seconds_total", ("unit", "r1"))] == 60491.070351


# --- missing data ---------------------------------------------------------------------------------


def test_no_unit_still_publishes_the_node_totals(node: Path):
    got = series(source(node, glob="no/such/*").poll())
    assert set(got) == {("llmgw_node_cpu_seconds_total",), ("llmgw_node_memory_used_bytes",)}


def test_missing_controller_file_is_quiet_and_a_garbled_one_is_reported(node: Path):
    jobs = node / "sys/fs/cgroup" / JOBS
    (jobs / "job_1009248" / "memory.current").unlink()
    (jobs / "job_1009249" / "memory.current").write_text("max\n")
    with pytest.raises(PartialReading) as caught:
        source(node).poll()
    assert "job_1009249/memory.current: not a number" in str(caught.value)
    got = series(caught.value.samples)
    assert ("llmgw_unit_memory_bytes", ("unit", "1009248")) not in got
    assert ("llmgw_unit_memory_bytes", ("unit", "1009249")) not in got
    assert got[("llmgw_unit_memory_bytes", ("unit", "1009250"))] == 4111491072
    assert got[("llmgw_unit_cpu_seconds_total", ("unit", "1009248"))] == 60491.070351


def test_a_unit_that_vanishes_mid_poll_is_dropped_quietly(node: Path, monkeypatch):
    jobs = node / "sys/fs/cgroup" / JOBS
    units = source(node)
    real = units._read_unit

    def vanish(unit, problems):
        if unit.name == "1009249":
            shutil.rmtree(unit.path)
        return real(unit, problems)

    monkeypatch.setattr(units, "_read_unit", vanish)
    got = series(units.poll())
    assert unit_names(got) == {"1009248", "1009250"}
    assert not (jobs / "job_1009249").exists()


def test_duplicate_unit_names(node: Path):
    with pytest.raises(PartialReading) as caught:
        source(node, pattern=r"job_10092(?P<unit>\d)\d$").poll()
    assert "are both named '4'" in str(caught.value)
    got = series(caught.value.samples)
    assert unit_names(got) == {"4", "5"}


def test_unreadable_proc_is_reported_with_the_units_served(node: Path):
    (node / "proc" / "stat").unlink()
    with pytest.raises(PartialReading) as caught:
        source(node).poll()
    assert "no cpu line" in str(caught.value)
    got = series(caught.value.samples)
    assert ("llmgw_node_memory_used_bytes",) in got
    assert len(unit_names(got)) == 3


# --- GPUs -----------------------------------------------------------------------------------------


def two_gpus(fake_nvml: FakeNvml) -> dict:
    config = fake_nvml.load_fixture("h100")
    second = fake_nvml.load_fixture("h100")["devices"][0]
    second["uuid"] = SECOND
    config["devices"].append(second)
    return config


def test_whole_gpus_one_unit_each_and_time_shared(node: Path, fake_nvml: FakeNvml):
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248/step_batch/slurm")
    in_cgroup(node, TASK, f"{JOBS}/job_1009249/step_batch/user/task_0")
    in_cgroup(node, OTHER, f"{JOBS}/job_1009250")
    in_cgroup(node, 77, "system.slice/nvidia-persistenced.service")  # in no unit
    config = two_gpus(fake_nvml)
    config["devices"][0]["processes"] = [
        {"pid": BATCH, "used_memory_bytes": 1},
        {"pid": BATCH + 100000, "used_memory_bytes": 1},  # already exited: no /proc entry
        {"pid": 77, "used_memory_bytes": 1},
    ]
    config["devices"][1]["processes"] = [
        {"pid": TASK, "used_memory_bytes": None},
        {"pid": OTHER, "used_memory_bytes": 1},
    ]
    fake_nvml.configure(config)
    units = source(node)
    try:
        got = shares(units.poll())
    finally:
        units.close()
    assert got == {
        ("1009248", H100, ""): 1.0,
        ("1009249", SECOND, ""): 0.5,
        ("1009250", SECOND, ""): 0.5,
    }


def test_mig_instances_by_sm_fraction_and_sharers(node: Path, fake_nvml: FakeNvml):
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    in_cgroup(node, TASK, f"{JOBS}/job_1009249/step_3")
    in_cgroup(node, OTHER, f"{JOBS}/job_1009250")
    config = fake_nvml.load_fixture("h100-mig")
    instances = config["devices"][0]["mig_instances"]
    instances[0]["processes"] = [{"pid": BATCH, "used_memory_bytes": 1}]  # GI 2, 60 SMs
    instances[2]["processes"] = [  # GI 9, 16 SMs, two units
        {"pid": TASK, "used_memory_bytes": 1},
        {"pid": OTHER, "used_memory_bytes": 1},
    ]
    fake_nvml.configure(config)
    units = source(node)
    try:
        got = shares(units.poll())
    finally:
        units.close()
    assert got == {
        ("1009248", H100, "2"): 60 / 132,
        ("1009249", H100, "9"): 16 / 132 / 2,
        ("1009250", H100, "9"): 16 / 132 / 2,
    }


def test_mig_when_the_driver_refuses_the_whole_gpus_attributes(node: Path, fake_nvml: FakeNvml):
    """Real drivers answer nvmlDeviceGetAttributes_v2 for MIG handles only."""
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    in_cgroup(node, TASK, f"{JOBS}/job_1009249")
    config = fake_nvml.load_fixture("h100-mig")
    device = config["devices"][0]
    device["errors"] = {"nvmlDeviceGetAttributes_v2": "NOT_SUPPORTED"}
    for instance in device["mig_instances"]:
        instance["errors"] = {"nvmlDeviceGetAttributes_v2": 0}
    device["mig_instances"][0]["processes"] = [{"pid": BATCH, "used_memory_bytes": 1}]
    device["mig_instances"][3]["processes"] = [{"pid": TASK, "used_memory_bytes": 1}]
    fake_nvml.configure(config)
    units = source(node)
    try:
        got = shares(units.poll())
    finally:
        units.close()
    # The GPU's count: max(60 x 7 / 3, 32 x 7 / 2, 16 x 7 / 1) = 140; SM ratios stay exact.
    assert got == {("1009248", H100, "2"): 60 / 140, ("1009249", H100, "10"): 16 / 140}


def test_one_gpu_failing_keeps_the_others_and_reads_down(node: Path, fake_nvml: FakeNvml):
    in_cgroup(node, BATCH, f"{JOBS}/job_1009248")
    config = two_gpus(fake_nvml)
    config["devices"][0]["errors"] = {"nvmlDeviceGetComputeRunningProcesses": "GPU_IS_LOST"}
    config["devices"][1]["processes"] = [{"pid": BATCH, "used_memory_bytes": 1}]
    fake_nvml.configure(config)
    units = source(node)
    try:
        with pytest.raises(PartialReading) as caught:
            units.poll()
    finally:
        units.close()
    assert "GPU 0" in str(caught.value)
    assert shares(caught.value.samples) == {("1009248", SECOND, ""): 1.0}


def test_process_lists_not_supported_are_quiet(node: Path, fake_nvml: FakeNvml):
    config = two_gpus(fake_nvml)
    config["errors"] = {"nvmlDeviceGetComputeRunningProcesses": "NOT_SUPPORTED"}
    fake_nvml.configure(config)
    units = source(node)
    try:
        got = units.poll()
    finally:
        units.close()
    assert shares(got) == {}


def test_no_nvidia_library_means_no_shares_and_no_failure(node: Path):
    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    nvml = Nvml(api=SimpleNamespace(**{**vars(pynvml), "nvmlInit": missing}))
    units = UnitsSource(node / "sys", UnitsConfig(glob=GLOB), procfs=node / "proc", nvml=nvml)
    got = series(units.poll())
    assert len(unit_names(got)) == 3
    assert not units.initialized
    units.poll()  # tries again each poll, quietly


def test_nvml_failing_as_a_whole_reads_down_with_the_rest_served(node: Path, fake_nvml: FakeNvml):
    fake_nvml.configure({"errors": {"nvmlDeviceGetCount": "UNKNOWN"}, "devices": []})
    units = source(node)
    try:
        with pytest.raises(PartialReading) as caught:
            units.poll()
    finally:
        units.close()
    assert str(caught.value).startswith("NVML:")
    assert len([s for s in caught.value.samples if s.metric == "llmgw_unit_info"]) == 3


# --- config ---------------------------------------------------------------------------------------


def test_registered_and_off_until_a_glob_is_set():
    assert SOURCES["units"] is UnitsSource
    assert AgentConfig().source("units").enabled is False
    on = AgentConfig.model_validate({"sources": {"units": {"glob": "kubepods.slice/*/*"}}})
    assert on.source("units").enabled is True
    assert on.interval("units") == 5.0


@pytest.mark.parametrize(
    ("section", "reason"),
    [
        ({"enabled": True}, "needs a `glob`"),
        ({"glob": "a/*", "pattern": "(?P<model>x)"}, "needs a named group `unit`"),
        ({"glob": "a/*", "pattern": "(?P<unit>x)(?P<job>y)"}, "unknown named groups ['job']"),
        ({"glob": "a/*", "pattern": "(?P<unit>"}, "not a regular expression"),
        ({"glob": "../etc/*"}, "must name directories below cgroup_root"),
        ({"glob": "a/*", "colour": "red"}, "Extra inputs are not permitted"),
    ],
)
def test_bad_sections_are_refused(section: dict, reason: str):
    with pytest.raises(ValidationError, match=re.escape(reason)):
        AgentConfig.model_validate({"sources": {"units": section}})
