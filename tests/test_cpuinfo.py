"""cpuinfo source: the node's CPU model from /proc/cpuinfo (exporter/sources/cpuinfo.py).

The x86 file is procfs' recorded one (tests/fixtures/procfs, an Intel Core i7-8650U, eight
processors). The ARM64 files are written as the kernel's arch/arm64/kernel/cpuinfo.c
`c_show` prints them (an NVIDIA Grace is 72 Neoverse-V2 cores: implementer 0x41, part
0xd4f).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter.samples import NoData, Sample
from exporter.sources.cpuinfo import CpuInfoConfig, CpuInfoSource, cpu_models
from tests.shared_fixtures import SHARED_FIXTURES
from tests.ttar import extract


def arm64(cpus: int, implementer: str, part: str) -> str:
    return "".join(
        f"processor\t: {n}\n"
        "BogoMIPS\t: 2000.00\n"
        "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp\n"
        f"CPU implementer\t: {implementer}\n"
        "CPU architecture: 8\n"
        "CPU variant\t: 0x0\n"
        f"CPU part\t: {part}\n"
        "CPU revision\t: 0\n\n"
        for n in range(cpus)
    )


def poll(procfs: Path) -> list[Sample]:
    return CpuInfoSource(Path("/nonexistent-sys"), CpuInfoConfig(), procfs=procfs).poll()


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "cpuinfo").write_text(text)
    return tmp_path


def test_procfs_recorded_x86_file_names_its_model_once(tmp_path: Path) -> None:
    extract(SHARED_FIXTURES / "procfs" / "fixtures.ttar", tmp_path)
    assert poll(tmp_path / "fixtures" / "proc") == [
        Sample("llmgw_node_cpu_info", 1, {"model": "Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz"})
    ]


def test_grace_is_named_as_lscpu_names_its_cores(tmp_path: Path) -> None:
    procfs = write(tmp_path, arm64(72, "0x41", "0xd4f"))
    assert poll(procfs) == [Sample("llmgw_node_cpu_info", 1, {"model": "ARM Neoverse-V2"})]


def test_an_arm_core_not_in_the_table_is_given_as_read() -> None:
    assert cpu_models(arm64(2, "0xc0", "0xAC3")) == ["CPU implementer 0xc0 part 0xac3"]


def test_whitespace_runs_collapse_and_two_models_give_two_series(tmp_path: Path) -> None:
    text = (
        "processor\t: 0\nmodel name\t: AMD EPYC 9654  96-Core Processor   \n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 9654 96-Core Processor\n\n"
        "processor\t: 2\nmodel name\t: AMD EPYC 9754 128-Core Processor\n"
    )
    assert [s.labels["model"] for s in poll(write(tmp_path, text))] == [
        "AMD EPYC 9654 96-Core Processor",
        "AMD EPYC 9754 128-Core Processor",
    ]


def test_no_file_or_no_model_is_no_data(tmp_path: Path) -> None:
    with pytest.raises(NoData, match=f"^{re.escape(f'no {tmp_path}/cpuinfo')}$"):
        poll(tmp_path)
    power9 = "processor\t: 0\ncpu\t\t: POWER9, altivec supported\nclock\t\t: 2166.000000MHz\n"
    with pytest.raises(NoData, match="names no CPU model"):
        poll(write(tmp_path, power9))
    with pytest.raises(NoData, match="names no CPU model"):
        poll(write(tmp_path, "processor\t: 0\nmodel name\t:   \n"))


def test_an_unreadable_file_is_an_error_not_no_data(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").mkdir()  # reading a directory fails as a locked file would
    with pytest.raises(IsADirectoryError):
        poll(tmp_path)


def test_procfs_comes_from_agent_yaml() -> None:
    source = CpuInfoSource(Path("/sys"), CpuInfoConfig(procfs="/host/proc"))
    assert source.procfs == Path("/host/proc")
    assert CpuInfoSource(Path("/sys"), CpuInfoConfig()).procfs == Path("/proc")
