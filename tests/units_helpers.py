"""CEEMS' Slurm jobs as compute units: the names, pids and writers that the units tests of
NVIDIA (tests/test_units.py) and AMD (tests/test_units_amd.py) GPUs share."""

from __future__ import annotations

from pathlib import Path

from exporter.samples import Sample

JOBS = "system.slice/slurmstepd.scope"
GLOB = f"{JOBS}/job_*"
PATTERN = r"job_(?P<unit>\d+)$"
H100 = "GPU-00000000-0000-0000-0000-000000000000"
# pids of CEEMS' proc tree; the tree has no /proc/<pid>/cgroup, the tests write them.
BATCH, TASK, OTHER = 3346567, 3346596, 3346674


def in_cgroup(root: Path, pid: int, cgroup: str) -> None:
    (root / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / "proc" / str(pid) / "cgroup").write_text(
        f"12:memory:/{cgroup}\n1:name=systemd:/{cgroup}\n0::/{cgroup}\n"
    )


def shares(samples: list[Sample]) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["unit"], s.labels["uuid"], s.labels["gpu_instance"]): s.value
        for s in samples
        if s.metric == "llmgw_unit_gpu_share"
    }
