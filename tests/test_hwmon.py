"""hwmon source: node_exporter's own tree and output as the oracle, then synthetic trees."""

from __future__ import annotations

import errno
import os
import re
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.base import SourceConfig
from exporter.sources.hwmon import (
    CPU_DRIVERS,
    CPU_MAX_CELSIUS,
    CPU_METRIC,
    CPU_MIN_CELSIUS,
    INLET_MAX_CELSIUS,
    INLET_METRIC,
    INLET_MIN_CELSIUS,
    HwmonSource,
    chip_names,
)
from tests.shared_fixtures import SHARED_FIXTURES
from tests.ttar import extract

SHARED = SHARED_FIXTURES
NODE_EXPORTER = SHARED / "node_exporter"
KEPLER_SYS = SHARED / "kepler" / "sys"
CEEMS_TTAR = SHARED / "ceems" / "bsd3" / "sys.ttar"

_LINE = re.compile(r"^(node_hwmon_\w+)\{([^}]*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def series(samples: list[Sample]) -> set[tuple[str, str, str, float]]:
    return {(s.metric, s.labels["chip"], s.labels["sensor"], s.value) for s in samples}


def poll(sysfs: Path) -> list[Sample]:
    return HwmonSource(sysfs, SourceConfig()).poll()


# --- node_exporter's tree and its expected /metrics -----------------------------------


class Oracle:
    """node_exporter's hwmon series from e2e-output.txt, for the same sys.ttar."""

    def __init__(self, path: Path) -> None:
        self.temps: dict[tuple[str, str], float] = {}
        self.labels: dict[tuple[str, str], str] = {}  # (chip, tempN) -> label text
        self.chip_names: dict[str, str] = {}
        self.chips: set[str] = set()
        for line in path.read_text().splitlines():
            match = _LINE.match(line)
            if not match:
                continue
            metric, labels, value = match[1], dict(_LABEL.findall(match[2])), match[3]
            self.chips.add(labels["chip"])
            if metric == "node_hwmon_temp_celsius":
                self.temps[labels["chip"], labels["sensor"]] = float(value)
            elif metric == "node_hwmon_sensor_label":
                self.labels[labels["chip"], labels["sensor"]] = labels["label"]
            elif metric == "node_hwmon_chip_names":
                self.chip_names[labels["chip"]] = labels["chip_name"]

    def attr(self, chip: str, sensor: str) -> str:
        """The tempN attribute our `sensor` value stands for (node_exporter keeps tempN)."""
        if (chip, sensor) in self.temps:
            return sensor
        (attr,) = [s for (c, s), lab in self.labels.items() if c == chip and lab == sensor]
        return attr


@pytest.fixture(scope="session")
def ne_sys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("node_exporter")
    extract(NODE_EXPORTER / "sys.ttar", dest)
    return dest / "sys"


@pytest.fixture(scope="session")
def oracle() -> Oracle:
    return Oracle(NODE_EXPORTER / "e2e-output.txt")


def test_node_exporter_tree_publishes_package_temperatures(ne_sys: Path, oracle: Oracle) -> None:
    samples = poll(ne_sys)
    # Two coretemp chips, each with "Physical id 0" (55 °C) and Core 0..3 (54, 52, 53, 50 °C).
    assert series(samples) == {
        (CPU_METRIC, "platform_coretemp_0", "Physical id 0", 55.0),
        (CPU_METRIC, "platform_coretemp_1", "Physical id 0", 55.0),
    }
    for sample in samples:
        chip, sensor = sample.labels["chip"], sample.labels["sensor"]
        attr = oracle.attr(chip, sensor)
        assert sample.value == oracle.temps[chip, attr]
        # The package sensor, not a core: node_exporter labels it too.
        assert re.fullmatch(r"(Package|Physical) id \d+", oracle.labels[chip, attr])


def test_node_exporter_tree_one_series_per_cpu_chip(ne_sys: Path, oracle: Oracle) -> None:
    cpu_chips = {chip for chip, name in oracle.chip_names.items() if name in CPU_DRIVERS}
    published = [s.labels["chip"] for s in poll(ne_sys) if s.metric == CPU_METRIC]
    assert sorted(published) == sorted(cpu_chips) == ["platform_coretemp_0", "platform_coretemp_1"]


def test_node_exporter_tree_other_chips_publish_nothing(ne_sys: Path, oracle: Oracle) -> None:
    # node_exporter has temperatures for hwmon4 ("foosensor") and three wifi PHYs
    # (unlabelled): neither a CPU nor an inlet. nct6779 and applesmc have no temp files.
    others = {chip for chip, _ in oracle.temps} - {"platform_coretemp_0", "platform_coretemp_1"}
    assert others == {
        "hwmon4",
        "ieee80211_phy0_mt7996_phy0_0",
        "ieee80211_phy0_mt7996_phy0_1",
        "ieee80211_phy0_mt7996_phy0_2",
    }
    assert not {s.labels["chip"] for s in poll(ne_sys)} & others
    assert not [s for s in poll(ne_sys) if s.metric == INLET_METRIC]


def test_chip_names_equal_node_exporters(ne_sys: Path, oracle: Oracle) -> None:
    names = chip_names(sorted((ne_sys / "class" / "hwmon").glob("hwmon*")))
    by_dir = {path.name: chip for path, chip in names.items()}
    # end-to-end-test.sh runs with --collector.hwmon.chip-include=
    # (applesmc|asus_nb_wmi|coretemp|hwmon4|ieee80211|nct6779): hwmon5 ("bogus") is left out.
    assert by_dir.pop("hwmon5") == "bogus"
    assert set(by_dir.values()) == oracle.chips
    assert by_dir["hwmon0"] == "platform_coretemp_0"  # device link wins over name
    assert by_dir["hwmon3"] == "nct6779"  # no device link: the name file
    assert by_dir["hwmon4"] == "hwmon4"  # neither: the directory
    assert by_dir["hwmon6"] == "platform_asus_nb_wmi_asus"  # shared device: name suffix


# --- other projects' trees ---------------------------------------------------------------


def test_kepler_tree_has_no_temperatures(tmp_path: Path) -> None:
    # ~20 power/energy/voltage chips (one named k10temp, with power files only) and
    # not one tempN_input: nothing to publish, and nothing crashes on the odd entries
    # (a `device` that is a plain file, dirs named hwmon_*).
    assert not list((KEPLER_SYS / "class" / "hwmon").glob("*/temp*_input"))
    with pytest.raises(NoData):
        poll(KEPLER_SYS)


def test_ceems_tree_has_no_hwmon(tmp_path: Path) -> None:
    extract(CEEMS_TTAR, tmp_path)
    assert not (tmp_path / "sys" / "class" / "hwmon").exists()
    with pytest.raises(NoData):
        poll(tmp_path / "sys")


# --- synthetic trees -----------------------------------------------------------------------


Temps = dict[int, dict[str, object]]


def add_chip(
    sysfs: Path,
    hwmon: str,
    *,
    name: str | None = None,
    device: str | None = None,
    temps: Temps | None = None,
    in_device_dir: bool = False,
) -> Path:
    """One /sys/class/hwmon entry: a link into devices/<device>/hwmon/, or a plain dir."""
    cls = sysfs / "class" / "hwmon"
    cls.mkdir(parents=True, exist_ok=True)
    if device is not None:
        dev = sysfs / "devices" / device
        real = dev / "hwmon" / hwmon
        real.mkdir(parents=True)
        (cls / hwmon).symlink_to(os.path.relpath(real, cls))
        (real / "device").symlink_to(os.path.relpath(dev, real))
    else:
        real = cls / hwmon
        real.mkdir()
    if name is not None:
        (real / "name").write_text(f"{name}\n")
    files = real / "device" if in_device_dir else real
    for n, attrs in (temps or {}).items():
        for key, value in attrs.items():
            (files / f"temp{n}_{key}").write_text(f"{value}\n")
    return real


def t(label: str | None, millideg: object, **extra: object) -> dict[str, object]:
    attrs: dict[str, object] = {"input": millideg, **extra}
    if label is not None:
        attrs["label"] = label
    return attrs


K10 = "pci0000:00/0000:00:18.3"
K10_CHIP = "pci0000:00_0000:00:18_3"


def test_k10temp_prefers_tdie_over_tctl(tmp_path: Path) -> None:
    # Threadripper 1950X: Tctl = Tdie + 27 °C.
    add_chip(
        tmp_path,
        "hwmon1",
        name="k10temp",
        device=K10,
        temps={1: t("Tctl", 75250), 2: t("Tdie", 48250), 3: t("Tccd1", 50000)},
    )
    assert series(poll(tmp_path)) == {(CPU_METRIC, K10_CHIP, "Tdie", 48.25)}


def test_k10temp_tctl_alone(tmp_path: Path) -> None:
    add_chip(
        tmp_path,
        "hwmon1",
        name="k10temp",
        device=K10,
        temps={1: t("Tctl", 61000), 3: t("Tccd1", 64000), 4: t("Tccd2", 59000)},
    )
    assert series(poll(tmp_path)) == {(CPU_METRIC, K10_CHIP, "Tctl", 61.0)}


def test_k10temp_faulty_tdie_falls_back_to_tctl(tmp_path: Path) -> None:
    add_chip(
        tmp_path, "hwmon1", name="k10temp", device=K10, temps={1: t("Tctl", 61000), 2: t("Tdie", 0)}
    )
    assert series(poll(tmp_path)) == {(CPU_METRIC, K10_CHIP, "Tctl", 61.0)}


def test_zenpower(tmp_path: Path) -> None:
    add_chip(
        tmp_path,
        "hwmon2",
        name="zenpower",
        device=K10,
        temps={1: t("Tdie", 44500), 2: t("Tctl", 44500), 3: t("Tccd1", 47000)},
    )
    assert series(poll(tmp_path)) == {(CPU_METRIC, K10_CHIP, "Tdie", 44.5)}


def coretemp(sysfs: Path, socket: int, package: int | None, cores: list[int], **kw: object) -> Path:
    temps: Temps = {}
    if package is not None:
        temps[1] = t(f"Package id {socket}", package, **kw)
    for i, value in enumerate(cores):
        temps[i + 2] = t(f"Core {i}", value)
    return add_chip(
        sysfs, f"hwmon{socket}", name="coretemp", device=f"platform/coretemp.{socket}", temps=temps
    )


def test_two_socket_coretemp(tmp_path: Path) -> None:
    coretemp(tmp_path, 0, 61000, [58000, 63000])
    coretemp(tmp_path, 1, 57000, [55000, 56000])
    assert series(poll(tmp_path)) == {
        (CPU_METRIC, "platform_coretemp_0", "Package id 0", 61.0),
        (CPU_METRIC, "platform_coretemp_1", "Package id 1", 57.0),
    }


def test_core_only_chip_gives_hottest_core(tmp_path: Path) -> None:
    coretemp(tmp_path, 0, None, [50000, 54000, 53000, 51000])
    assert series(poll(tmp_path)) == {(CPU_METRIC, "platform_coretemp_0", "Core 1", 54.0)}


def test_unlabelled_cpu_chip_gives_hottest_attribute(tmp_path: Path) -> None:
    add_chip(
        tmp_path,
        "hwmon0",
        name="k8temp",
        device="pci0000:00/0000:00:18.3",
        temps={1: {"input": 41000}, 2: {"input": 44000}, 3: {"input": 43000}},
    )
    assert series(poll(tmp_path)) == {(CPU_METRIC, K10_CHIP, "temp2", 44.0)}


@pytest.mark.parametrize(
    ("package_extra", "package_input"),
    [
        ({"fault": 1}, 99000),
        ({"enable": 0}, 99000),
        ({}, "garbage"),
        ({}, ""),
        ({}, 255000),  # all-ones register
        ({}, 0),  # unimplemented channel
    ],
    ids=["fault", "disabled", "garbage", "empty", "255C", "zero"],
)
def test_bad_package_reading_falls_back_to_hottest_core(
    tmp_path: Path, package_extra: dict[str, object], package_input: object
) -> None:
    real = coretemp(tmp_path, 0, 99000, [50000, 52000])
    (real / "temp1_input").write_text(f"{package_input}\n")
    for key, value in package_extra.items():
        (real / f"temp1_{key}").write_text(f"{value}\n")
    assert series(poll(tmp_path)) == {(CPU_METRIC, "platform_coretemp_0", "Core 1", 52.0)}


def test_fault_zero_and_enable_one_publish(tmp_path: Path) -> None:
    coretemp(tmp_path, 0, 60000, [50000], fault=0, enable=1)
    assert series(poll(tmp_path)) == {(CPU_METRIC, "platform_coretemp_0", "Package id 0", 60.0)}


def test_cpu_chip_with_only_bad_readings_is_up_with_no_series(tmp_path: Path) -> None:
    coretemp(tmp_path, 0, 99000, [50000], fault=1)
    (tmp_path / "devices/platform/coretemp.0/hwmon/hwmon0/temp2_input").write_text("x\n")
    assert poll(tmp_path) == []


NCT = "platform/nct6775.656"
NCT_CHIP = "platform_nct6775_656"


@pytest.mark.parametrize("millideg", [-62000, 127000, 255000, -128000])
def test_disconnected_systin_is_absent(tmp_path: Path, millideg: int) -> None:
    add_chip(
        tmp_path,
        "hwmon3",
        name="nct6775",
        device=NCT,
        temps={1: t("SYSTIN", millideg), 2: t("CPUTIN", 40000), 7: t("PECI Agent 0", 45000)},
    )
    assert poll(tmp_path) == []  # an inlet sensor exists, so not NoData: it reads nonsense


def test_systin_published_beside_cpu(tmp_path: Path) -> None:
    coretemp(tmp_path, 0, 61000, [58000])
    add_chip(
        tmp_path,
        "hwmon3",
        name="nct6775",
        device=NCT,
        temps={1: t("SYSTIN", 24000), 2: t("CPUTIN", 40000), 3: t("AUXTIN0", -62000)},
    )
    assert series(poll(tmp_path)) == {
        (CPU_METRIC, "platform_coretemp_0", "Package id 0", 61.0),
        (INLET_METRIC, NCT_CHIP, "SYSTIN", 24.0),
    }


@pytest.mark.parametrize(
    ("label", "inlet"),
    [
        ("SYSTIN", True),
        ("Inlet Temp", True),
        ("System Inlet", True),
        ("Ambient Temp", True),
        ("ambient", True),
        ("Front_Inlet", True),
        ("INLET", True),
        ("CPUTIN", False),
        ("AUXTIN0", False),
        ("Exhaust Temp", False),
        ("Inlets", False),
        ("PCH_CHIP_TEMP", False),
    ],
)
def test_inlet_label_matches_on_the_word(tmp_path: Path, label: str, inlet: bool) -> None:
    add_chip(tmp_path, "hwmon3", name="nct6798", device=NCT, temps={1: t(label, 23500)})
    if inlet:
        assert series(poll(tmp_path)) == {(INLET_METRIC, NCT_CHIP, label, 23.5)}
    else:
        with pytest.raises(NoData):
            poll(tmp_path)


def test_every_inlet_sensor_is_a_series(tmp_path: Path) -> None:
    add_chip(tmp_path, "hwmon5", name="dell_smm", temps={1: t("Ambient", 26000)})
    add_chip(
        tmp_path,
        "hwmon6",
        name="ipmi_sensors",
        device="platform/ipmi_si.0",
        temps={1: t("Inlet Temp", 21000), 2: t("Exhaust Temp", 35000)},
    )
    assert series(poll(tmp_path)) == {
        (INLET_METRIC, "dell_smm", "Ambient", 26.0),
        (INLET_METRIC, "platform_ipmi_si_0", "Inlet Temp", 21.0),
    }


@pytest.mark.parametrize("name", ["cpu_thermal", "soc_thermal", "acpitz"])
def test_thermal_zone_bridges_are_not_cpus(tmp_path: Path, name: str) -> None:
    add_chip(
        tmp_path,
        "hwmon0",
        name=name,
        device="virtual/thermal/thermal_zone0",
        temps={1: t(None, 60000)},
    )
    with pytest.raises(NoData):
        poll(tmp_path)


def test_sensor_files_in_device_dir(tmp_path: Path) -> None:
    # Older drivers put the attributes beside the device, not in hwmonN.
    add_chip(
        tmp_path,
        "hwmon3",
        name="nct6775",
        device=NCT,
        temps={1: t("SYSTIN", 22000)},
        in_device_dir=True,
    )
    assert series(poll(tmp_path)) == {(INLET_METRIC, NCT_CHIP, "SYSTIN", 22.0)}


def test_shared_device_same_name_gets_hwmon_suffix(tmp_path: Path) -> None:
    dev = "platform/soc/c000000.wifi/ieee80211/phy0"
    add_chip(tmp_path, "hwmon1", name="ath11k_hwmon", device=dev)
    add_chip(tmp_path, "hwmon2", name="ath11k_hwmon", device=dev)
    names = chip_names(sorted((tmp_path / "class" / "hwmon").iterdir()))
    assert sorted(names.values()) == ["ieee80211_phy0_hwmon1", "ieee80211_phy0_hwmon2"]


def test_empty_hwmon_dir_is_no_data(tmp_path: Path) -> None:
    (tmp_path / "class" / "hwmon").mkdir(parents=True)
    with pytest.raises(NoData):
        poll(tmp_path)


def test_missing_hwmon_class_is_no_data(tmp_path: Path) -> None:
    with pytest.raises(NoData):
        poll(tmp_path)


def test_chips_without_cpu_or_inlet_sensors_are_no_data(tmp_path: Path) -> None:
    add_chip(
        tmp_path,
        "hwmon0",
        name="nvme",
        device="pci0000:00/0000:00:1d.0/nvme/nvme0",
        temps={1: t("Composite", 38850)},
    )
    add_chip(
        tmp_path,
        "hwmon1",
        name="amdgpu",
        device="pci0000:00/0000:03:00.0",
        temps={1: t("edge", 45000)},
    )
    with pytest.raises(NoData):
        poll(tmp_path)


def test_permission_error_propagates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    coretemp(tmp_path, 0, 61000, [58000])
    real_read_text = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if self.name == "temp1_input":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.raises(PermissionError):
        poll(tmp_path)


def failing_listdir(monkeypatch: pytest.MonkeyPatch, bad: Path, exc: OSError) -> None:
    real_listdir = os.listdir

    def listdir(path: object) -> list[str]:
        if Path(str(path)) == bad:
            raise exc
        return real_listdir(path)  # type: ignore[arg-type]

    monkeypatch.setattr("exporter.sources.hwmon.os.listdir", listdir)


def test_one_chip_failing_leaves_the_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    coretemp(tmp_path, 0, 61000, [58000])
    coretemp(tmp_path, 1, 57000, [55000])
    failing_listdir(monkeypatch, tmp_path / "class/hwmon/hwmon0", OSError(errno.EIO, "I/O error"))
    with pytest.raises(PartialReading, match=r"platform_coretemp_0: .*I/O error") as partial:
        poll(tmp_path)
    assert series(partial.value.samples) == {
        (CPU_METRIC, "platform_coretemp_1", "Package id 1", 57.0)
    }


def test_only_chip_failing_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    coretemp(tmp_path, 0, 61000, [58000])
    failing_listdir(monkeypatch, tmp_path / "class/hwmon/hwmon0", OSError(errno.EIO, "I/O error"))
    with pytest.raises(OSError, match="I/O error"):
        poll(tmp_path)


def test_listing_permission_error_propagates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coretemp(tmp_path, 0, 61000, [58000])
    coretemp(tmp_path, 1, 57000, [55000])
    bad = tmp_path / "class/hwmon/hwmon1"
    failing_listdir(monkeypatch, bad, PermissionError(errno.EACCES, "Permission denied"))
    with pytest.raises(PermissionError):
        poll(tmp_path)


@given(st.integers(-300_000, 300_000) | st.integers(-(2**63), 2**63 - 1))
def test_published_value_is_in_bounds_and_exact(millideg: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sysfs = Path(tmp)
        coretemp(sysfs, 0, millideg, [])
        add_chip(sysfs, "hwmon3", name="nct6775", device=NCT, temps={1: t("SYSTIN", millideg)})
        published = {s.metric: s.value for s in poll(sysfs)}
    celsius = millideg / 1000
    for metric, low, high in [
        (CPU_METRIC, CPU_MIN_CELSIUS, CPU_MAX_CELSIUS),
        (INLET_METRIC, INLET_MIN_CELSIUS, INLET_MAX_CELSIUS),
    ]:
        if low <= celsius <= high:
            assert published[metric] == celsius
        else:
            assert metric not in published


def test_repeated_inlet_label_falls_back_to_attribute(tmp_path: Path) -> None:
    add_chip(tmp_path, "hwmon7", name="board", temps={1: t("Inlet", 21000), 2: t("Inlet", 22000)})
    assert series(poll(tmp_path)) == {
        (INLET_METRIC, "board", "temp1", 21.0),
        (INLET_METRIC, "board", "temp2", 22.0),
    }


# --- a read that never returns ----------------------------------------------------------


def hwmon_chip(root: Path, number: int, name: str, temps: dict[int, tuple[str, int]]) -> Path:
    chip = root / "class" / "hwmon" / f"hwmon{number}"
    chip.mkdir(parents=True)
    (chip / "name").write_text(f"{name}\n")
    for index, (label, millidegrees) in temps.items():
        (chip / f"temp{index}_label").write_text(f"{label}\n")
        (chip / f"temp{index}_input").write_text(f"{millidegrees}\n")
    return chip


def unblock(fifo: Path) -> None:
    """Let a reader stuck in open()/read() of the FIFO go: write a value and close."""
    descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(descriptor, b"24000\n")
    finally:
        os.close(descriptor)


def test_a_stuck_chip_is_abandoned_and_the_cpu_on_another_chip_still_seen(tmp_path: Path):
    hwmon_chip(tmp_path, 0, "coretemp", {1: ("Package id 0", 90000)})
    board = hwmon_chip(tmp_path, 1, "nct6775", {1: ("SYSTIN", 24000)})
    fifo = board / "temp1_input"
    fifo.unlink()
    os.mkfifo(fifo)  # a read that blocks until someone writes
    source = HwmonSource(tmp_path, SourceConfig(deadline=1.0))
    threads_before = threading.active_count()
    began = time.monotonic()
    with pytest.raises(PartialReading) as stuck:
        source.poll()
    assert time.monotonic() - began < 0.9  # the chip's 0.5 s, not the stuck read
    assert [(s.metric, s.value) for s in stuck.value.samples] == [
        ("llmgw_node_cpu_temperature_celsius", 90.0)
    ]
    assert "hwmon chip nct6775" in str(stuck.value)
    assert "did not return within its 0.5s deadline" in str(stuck.value)
    # Later polls start no new read of the stuck chip, and say the same.
    for _ in range(10):
        with pytest.raises(PartialReading) as again:
            source.poll()
        assert str(again.value) == str(stuck.value)
    assert threading.active_count() <= threads_before + 1
    # The read returns: discarded; the next poll reads the chip afresh.
    unblock(fifo)
    deadline = time.monotonic() + 5
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    fifo.unlink()
    fifo.write_text("25000\n")
    assert {s.metric: s.value for s in source.poll()} == {
        "llmgw_node_cpu_temperature_celsius": 90.0,
        "llmgw_node_inlet_temperature_celsius": 25.0,
    }
