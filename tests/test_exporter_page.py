"""The exporter's node page (`/`, exporter/web.py, docs/exporter.md) over real HTTP.

The exporter runs as a node runs it, a process on a loopback port, over node_exporter's
`sys.ttar` (two coretemp packages, RAPL) with an inlet sensor (a Nuvoton SYSTIN) and an
ACPI power meter added, and the fake NVML library with two GPUs: one idle, one hot and
thermally throttled. The page must show those readings, as `/metrics` serves them, beside
each source's health; the node's name and labels carry markup, which must arrive escaped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
import requests

from tests.exporter_helpers import serving_exporter
from tests.fake_nvml.build import ensure_built
from tests.node_power_helpers import acpi_meter
from tests.shared_fixtures import SHARED_FIXTURES
from tests.ttar import extract

NODE = 'gpu-r12-07-03<script>alert("node")</script>'
RACK = "r12-07 <b>&</b>"
#: NVML clock event reason bits (nvml.h): sw_power_cap 0x4, hw_thermal 0x40; 511 = all known.
SW_POWER_CAP, HW_THERMAL, GPU_IDLE = 0x4, 0x40, 0x1


def gpu(index: int, temperature: int, power_mw: int, reasons: int) -> dict[str, object]:
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-0000000{index}-0000-0000-0000-000000000000",
        "temperature_c": temperature,
        "memory_temperature_c": temperature + 7,
        "slowdown_temperature_c": 89,
        "shutdown_temperature_c": 95,
        "power_mw": power_mw,
        "enforced_power_limit_mw": 700_000,
        "total_energy_mj": 1_000_000_000,
        "clocks_event_reasons": reasons,
        "supported_clocks_event_reasons": 511,
        "multiprocessor_count": 132,
        "memory_size_mb": 81559,
        "mig_mode": [0, 0],
        "max_mig_device_count": 7,
        "processes": [],
    }


def inlet_chip(sysfs: Path, millidegrees: int) -> None:
    """A Nuvoton Super-I/O chip with its SYSTIN sensor, as /sys/class/hwmon links it."""
    device = sysfs / "devices" / "platform" / "nct6775.656"
    hwmon = device / "hwmon" / "hwmon31"
    hwmon.mkdir(parents=True)
    (hwmon / "device").symlink_to(os.path.relpath(device, hwmon))
    (hwmon / "name").write_text("nct6775\n")
    (hwmon / "temp1_label").write_text("SYSTIN\n")
    (hwmon / "temp1_input").write_text(f"{millidegrees}\n")
    link = sysfs / "class" / "hwmon" / "hwmon31"
    link.symlink_to(os.path.relpath(hwmon, link.parent))


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("node")
    extract(SHARED_FIXTURES / "node_exporter" / "sys.ttar", root)
    sysfs = root / "sys"
    inlet_chip(sysfs, 24_500)
    acpi_meter(sysfs, 30, 1_431_000_000, None)  # 1431 W, the GPUs included
    (root / "proc").mkdir()
    (root / "proc" / "cpuinfo").write_text(
        "".join(
            f"processor\t: {n}\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n\n" for n in range(4)
        )
    )
    nvml = root / "nvml.json"
    nvml.write_text(
        json.dumps(
            {
                "driver_version": "590.48.01",
                "nvml_version": "13.590.48.01",
                "devices": [
                    gpu(0, 41, 250_000, GPU_IDLE),
                    gpu(1, 87, 700_000, HW_THERMAL | SW_POWER_CAP),
                ],
            }
        )
    )
    agent = root / "agent.yaml"
    agent.write_text(
        f"node: {json.dumps(NODE)}\n"
        "labels:\n"
        f"  llmgw.io/site: sto1\n  llmgw.io/row: '12'\n  llmgw.io/rack: {json.dumps(RACK)}\n"
        "  llmgw.io/pdu: r12-07-a,r12-07-b\n"
        "overhead_watts: 250\n"
        "bmc_includes_gpus: true\n"
        "sources:\n"
        f"  gpu: {{interval: 1s, library: {ensure_built()}}}\n"
        "  hwmon: {interval: 1s}\n"
        "  rapl: {interval: 1s}\n"
        "  hwmon_power: {interval: 1s}\n"
        "  cray: {enabled: false}\n"
        f"  cpuinfo: {{procfs: {root / 'proc'}}}\n"
    )
    args = ["--config", str(agent), "--sysfs", str(sysfs)]
    env = {**os.environ, "FAKE_NVML_CONFIG": str(nvml)}

    def ready(body: str) -> bool:  # RAPL's second sample is in, and the GPUs
        return "llmgw_node_cpu_power_watts" in body and "llmgw_gpu_power_watts" in body

    with serving_exporter(args, env, root / "exporter.log", ready) as url:
        yield url


class _Rows(HTMLParser):
    """Each table row's cells as text, by the row's id or class; every tag seen."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[list[str]]] = {}
        self.tags: set[str] = set()
        self.spans: list[tuple[str, str]] = []  # (class, text)
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._span: tuple[str, list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        values = {k: v or "" for k, v in attrs}
        if tag == "tr":
            key = values.get("id") or values.get("class") or ""
            self._row = []
            self.rows.setdefault(key, []).append(self._row)
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "span":
            self._span = (values.get("class", ""), [])

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "span" and self._span is not None:
            self.spans.append((self._span[0], "".join(self._span[1])))
            self._span = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._span is not None:
            self._span[1].append(data)


@pytest.fixture(scope="module")
def page(exporter: str) -> tuple[str, _Rows]:
    response = requests.get(f"{exporter}/", timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    parsed = _Rows()
    parsed.feed(response.text)
    return response.text, parsed


def test_each_gpu_shows_temperature_power_limit_and_throttling(page):
    _, rows = page
    assert rows.rows["gpu-0"] == [
        ["0", "NVIDIA H100 80GB HBM3", "41 °C", "89 °C", "250.0 W", "700 W", "no"]
    ]
    assert rows.rows["gpu-1"] == [
        [
            "1",
            "NVIDIA H100 80GB HBM3",
            "87 °C",
            "89 °C",
            "700.0 W",
            "700 W",
            "hw_thermal, sw_power_cap",
        ]
    ]
    # a reason that means heat is marked; power capping alone would not be
    assert ("thermal", "hw_thermal, sw_power_cap") in rows.spans


def test_cpus_inlet_and_node_power_are_shown(page):
    text, rows = page
    assert '<p id="cpu-model">Model: Intel(R) Xeon(R) Platinum 8480+</p>' in text
    # node_exporter's tree: coretemp on two sockets at 55 °C
    assert ["platform_coretemp_0 Physical id 0", "55 °C"] in rows.rows["cpu-temperature"]
    assert ["platform_coretemp_1 Physical id 0", "55 °C"] in rows.rows["cpu-temperature"]
    # its energy counter stands still (a recorded tree): 0 W; it has no DRAM zone
    assert rows.rows["cpu-power"] == [["0", "0.0 W", "-"]]
    assert rows.rows["inlet"] == [["platform_nct6775_656 SYSTIN", "24.5 °C"]]
    assert rows.rows["node-power"] == [["hwmon_power", "1431.0 W", "GPUs included"]]


def test_the_readings_are_those_metrics_serves(exporter, page):
    """Every GPU, CPU package, inlet and node power series of /metrics is on the page."""
    metrics = requests.get(f"{exporter}/metrics", timeout=5).text
    _, rows = page
    for name, key in (
        ("llmgw_gpu_info", None),
        ("llmgw_node_cpu_temperature_celsius", "cpu-temperature"),
        ("llmgw_node_cpu_power_watts", "cpu-power"),
        ("llmgw_node_inlet_temperature_celsius", "inlet"),
        ("llmgw_node_power_watts", "node-power"),
    ):
        count = sum(1 for line in metrics.splitlines() if line.startswith(name + "{"))
        shown = (
            len([k for k in rows.rows if k.startswith("gpu-")])
            if key is None
            else len(rows.rows.get(key, []))
        )
        assert count and shown == count, name


def test_sources_are_listed_with_their_health(page):
    _, rows = page
    for source in ("gpu", "hwmon", "rapl", "hwmon_power"):
        (row,) = rows.rows[f"source-{source}"]
        assert row[0] == source and row[1] == "1s" and row[2] == "ok", row
        assert row[4].endswith("s ago"), row
    assert rows.rows["source-cray"] == [["cray", "", "disabled in agent.yaml", "0", ""]]


def test_names_with_markup_arrive_escaped_and_the_page_needs_no_script(page):
    text, rows = page
    assert "<script" not in text
    assert "&lt;script&gt;alert(&#34;node&#34;)&lt;/script&gt;" in text
    assert "r12-07 &lt;b&gt;&amp;&lt;/b&gt;" in text
    assert "b" not in rows.tags  # the rack's <b> is text, not markup
    assert 'name="viewport"' in text  # laid out for a phone's width
