"""The whole exporter, as a node runs it: a process, a sysfs tree, an NVML library, HTTP.

Like node_exporter's end-to-end test: the exporter reads node_exporter's own
`sys.ttar` and the fake NVML library driven by a real H100 capture, and its
whole `/metrics` is diffed against a golden file, then checked by
`promtool check metrics`. Regenerate the golden file with
`UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_exporter_e2e.py` and
review the diff.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.exporter_helpers import serving_exporter
from tests.fake_nvml.build import ensure_built
from tests.shared_fixtures import SHARED_FIXTURES
from tests.ttar import extract

SHARED = SHARED_FIXTURES
HERE = Path(__file__).parent
GOLDEN = HERE / "golden" / "exporter-e2e.txt"
# Values that change from run to run; the golden file keeps the series, not these values.
VOLATILE = re.compile(
    r"^(llmgw_exporter_source_(duration_seconds|last_success_timestamp_seconds)\{[^}]*\}) .*$",
    re.MULTILINE,
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("node")
    extract(SHARED / "node_exporter" / "sys.ttar", root)
    extract(SHARED / "procfs" / "fixtures.ttar", root / "procfs")  # its /proc/cpuinfo
    nvml_config = json.loads((HERE / "fixtures" / "nvml" / "h100.json").read_text())
    (root / "nvml.json").write_text(json.dumps(nvml_config))
    agent = root / "agent.yaml"
    agent.write_text(
        "node: gpu-r12-07-03\n"
        "labels:\n"
        "  llmgw.io/site: sto1\n  llmgw.io/room: hall-b\n  llmgw.io/row: '12'\n"
        "  llmgw.io/rack: r12-07\n  llmgw.io/pdu: r12-07-a,r12-07-b\n"
        "overhead_watts: 250\n"
        "sources:\n"
        f"  gpu: {{interval: 1s, library: {ensure_built()}}}\n"
        "  hwmon: {interval: 1s}\n"
        "  rapl: {interval: 1s}\n"
        f"  cpuinfo: {{procfs: {root / 'procfs' / 'fixtures' / 'proc'}}}\n"
    )
    return {"sysfs": root / "sys", "agent": agent, "nvml": root / "nvml.json"}


def exporter_command(node: dict[str, Path], *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "exporter",
        "--config",
        str(node["agent"]),
        "--sysfs",
        str(node["sysfs"]),
        *extra,
    ]


def environment(node: dict[str, Path]) -> dict[str, str]:
    return {**os.environ, "FAKE_NVML_CONFIG": str(node["nvml"])}


@pytest.fixture(scope="module")
def served(node: dict[str, Path]) -> Iterator[str]:
    args = ["--config", str(node["agent"]), "--sysfs", str(node["sysfs"])]
    log = node["agent"].with_name("exporter.log")
    # Ready once RAPL's second sample is in.
    with serving_exporter(
        args, environment(node), log, lambda body: "llmgw_node_cpu_power_watts" in body, 20
    ) as url:
        yield url


def ours(exposition: str) -> str:
    """Our llmgw_* families only (the process collector's values change every scrape)."""
    blocks = re.split(r"(?=^# HELP )", exposition, flags=re.MULTILINE)
    kept = "".join(block for block in blocks if block.startswith("# HELP llmgw_"))
    return VOLATILE.sub(r"\1 <volatile>", kept)


def check_golden(text: str) -> None:
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "exposition differs from tests/golden/exporter-e2e.txt"


def test_metrics_match_the_golden_exposition(served: str):
    check_golden(ours(requests.get(f"{served}/metrics", timeout=5).text))


def test_metrics_pass_promtool_check_metrics(served: str):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make test` installs Debian's prometheus package")
    body = requests.get(f"{served}/metrics", timeout=5).text
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, text=True, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_status_page_lists_what_this_node_reads(served: str):
    page = requests.get(f"{served}/", timeout=5)
    assert page.status_code == 200
    assert "llmgw exporter on gpu-r12-07-03" in page.text
    assert "site sto1, room hall-b, row 12, rack r12-07" in page.text
    for source in ("gpu", "hwmon", "rapl"):
        assert f"<td>{source}</td>" in page.text
    assert requests.get(f"{served}/nonsense", timeout=5).status_code == 404


def test_once_prints_the_same_exposition_and_exits(node: dict[str, Path]):
    result = subprocess.run(
        exporter_command(node, "--once"),
        env=environment(node),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    check_golden(ours(result.stdout))


def test_a_bad_config_is_refused_with_file_line_and_reason(tmp_path: Path):
    agent = tmp_path / "agent.yaml"
    agent.write_text("node: n1\nsources:\n  rapl: {interval: never}\n")
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "--config", str(agent), "--once"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert f"{agent}:3: sources.rapl.interval: Value error, 'never' is not a duration" in (
        result.stderr
    )
    assert result.stdout == ""


def test_a_node_without_nvidia_driver_says_so_once_and_publishes_no_gpu_series(tmp_path: Path):
    agent = tmp_path / "agent.yaml"
    agent.write_text("node: cpu-01\nsources: {hwmon: {enabled: false}, rapl: {enabled: false}}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("FAKE_NVML_CONFIG", "LD_LIBRARY_PATH")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            "--config",
            str(agent),
            "--sysfs",
            str(tmp_path),
            "--once",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    if "libnvidia-ml.so.1" not in result.stderr:
        pytest.skip("this machine has an NVIDIA driver library: the absent case cannot be shown")
    assert result.stderr.count("no NVIDIA driver library (libnvidia-ml.so.1)") == 1
    assert 'llmgw_exporter_source_up{node="cpu-01",source="gpu"} 1.0' in result.stdout
    assert "llmgw_gpu_" not in result.stdout
