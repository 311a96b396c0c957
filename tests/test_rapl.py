"""RaplSource over real fixture trees (node_exporter, procfs, Kepler, CEEMS) and edited copies."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.rapl import RaplConfig, RaplPermissionError, RaplSource
from tests.shared_fixtures import SHARED_FIXTURES as FIXTURES
from tests.ttar import extract

CPU_J = "llmgw_node_cpu_energy_joules_total"
CPU_W = "llmgw_node_cpu_power_watts"
DRAM_J = "llmgw_node_dram_energy_joules_total"
DRAM_W = "llmgw_node_dram_power_watts"
PKG_MAX_UJ = 262143328850  # package max_energy_range_uj in every tree here
DRAM_MAX_UJ = 65712999613  # CEEMS' dram sub-zones


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def series(samples: list[Sample]) -> dict[tuple[str, str], float]:
    out = {(s.metric, s.labels["package"]): s.value for s in samples}
    assert len(out) == len(samples), "a series was emitted twice"
    assert all(set(s.labels) == {"package"} for s in samples)
    return out


def oracle(exposition: Path, metric: str, tree: Path) -> dict[str, float]:
    """`metric`'s values in an expected /metrics file, keyed by the zone's package number.

    The oracle names zones by path (`.../powercap/intel-rapl:N`); the package
    number comes from that zone's `name` file in our copy of the tree.
    """
    line = re.compile(re.escape(metric) + r'\{.*path="[^"]*/powercap/([^"]+)"\} (\S+)$')
    values: dict[str, float] = {}
    for text in exposition.read_text().splitlines():
        match = line.match(text)
        if match:
            name = (tree / "class" / "powercap" / match[1] / "name").read_text().strip()
            values[name.removeprefix("package-")] = float(match[2])
    return values


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fixture trees, unpacked once; tests copy them before changing anything."""
    root = tmp_path_factory.mktemp("trees")
    extract(FIXTURES / "node_exporter" / "sys.ttar", root / "node_exporter")
    extract(FIXTURES / "procfs" / "fixtures.ttar", root / "procfs")
    extract(FIXTURES / "ceems" / "bsd3" / "sys.ttar", root / "ceems")
    return {
        "node_exporter": root / "node_exporter" / "sys",
        "procfs": root / "procfs" / "fixtures" / "sys",
        "ceems": root / "ceems" / "sys",
        "kepler": FIXTURES / "kepler" / "sys",  # plain and read-only: copy before changing
    }


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src / "class" / "powercap", dest / "class" / "powercap", symlinks=True)
    for path in [dest, *dest.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def raw_joules(source: RaplSource) -> dict[tuple[str, str], float]:
    """The raw readings the source took in, by (kind, package): what node_exporter publishes."""
    return {key: counter.raw / 1e6 for key, counter in source._counters.items()}


def polled_raw_joules(tree: Path) -> dict[tuple[str, str], float]:
    source = RaplSource(tree, RaplConfig(), clock=FakeClock())
    assert all(value == 0.0 for value in series(source.poll()).values())
    return raw_joules(source)


def write_uj(zone: Path, value: int) -> None:
    (zone / "energy_uj").write_text(f"{value}\n")


# --- real trees -------------------------------------------------------------------------------


def test_node_exporter_package_equals_its_oracle_and_core_is_not_counted(trees):
    tree = trees["node_exporter"]
    source = RaplSource(tree, RaplConfig(), clock=FakeClock())
    got = series(source.poll())
    want = oracle(
        FIXTURES / "node_exporter" / "e2e-output.txt", "node_rapl_package_joules_total", tree
    )
    assert want == {"0": 240422.366267}
    # Only the package: the core sub-zone (118821.284256 J) is neither a series nor added.
    assert raw_joules(source) == {("cpu", "0"): want["0"]}
    assert got == {(CPU_J, "0"): 0.0}  # the published counter starts when the exporter does
    assert source.warming_up


def test_kepler_mmio_duplicate_counted_once(trees):
    tree = trees["kepler"]
    powercap = tree / "class" / "powercap"
    # The mmio zone is package-0 again, with the very same counter.
    assert (powercap / "intel-rapl-mmio:0" / "name").read_text().strip() == "package-0"
    assert (powercap / "intel-rapl-mmio:0" / "energy_uj").read_text() == (
        powercap / "intel-rapl:0" / "energy_uj"
    ).read_text()
    # intel-rapl:a is zone 0xa, a package of its own: package-10.
    assert (powercap / "intel-rapl:a" / "name").read_text().strip() == "package-10"
    assert polled_raw_joules(tree) == {("cpu", "0"): 240422.366267, ("cpu", "10"): 240422.366267}


def test_procfs_package_10_from_zone_a(trees):
    assert polled_raw_joules(trees["procfs"]) == {
        ("cpu", "0"): 240422.366267,
        ("cpu", "10"): 240422.366267,
    }


def test_ceems_two_packages_with_dram(trees):
    tree = trees["ceems"]
    got = polled_raw_joules(tree)
    outputs = sorted((FIXTURES / "ceems" / "bsd3" / "expected").glob("*.txt"))
    wants = [oracle(path, "ceems_rapl_package_joules_total", tree) for path in outputs]
    assert wants and all(want == wants[0] for want in wants)
    assert wants[0] == {"0": 258218.293244, "1": 130570.505826}
    # CEEMS' output has no dram series; these figures are the trees' own energy_uj / 1e6.
    assert got == {
        ("cpu", "0"): wants[0]["0"],
        ("cpu", "1"): wants[0]["1"],
        ("dram", "0"): 24468.409791,
        ("dram", "1"): 64930.394974,
    }


def test_subzone_seen_nested_and_flat_is_read_once(trees, tmp_path):
    # Real sysfs has both: class/powercap/intel-rapl:0:0 links into intel-rapl:0/intel-rapl:0:0.
    tree = copy_tree(trees["ceems"], tmp_path / "sys")
    powercap = tree / "class" / "powercap"
    (powercap / "intel-rapl:0:0").symlink_to("intel-rapl:0/intel-rapl:0:0")
    got = polled_raw_joules(tree)
    assert got[("dram", "0")] == 24468.409791
    assert len(got) == 4


# --- power and counter wraps ------------------------------------------------------------------


def test_power_over_a_plain_interval(trees, tmp_path):
    tree = copy_tree(trees["ceems"], tmp_path / "sys")
    powercap = tree / "class" / "powercap"
    clock = FakeClock()
    source = RaplSource(tree, RaplConfig(), clock=clock)
    source.poll()
    write_uj(powercap / "intel-rapl:0", 258218293244 + 700_000_000)  # +700 J
    write_uj(powercap / "intel-rapl:0" / "intel-rapl:0:0", 24468409791 + 83_000_000)  # +83 J
    clock.now += 2.0
    got = series(source.poll())
    assert got[(CPU_W, "0")] == 350.0
    assert got[(DRAM_W, "0")] == 41.5
    assert got[(CPU_W, "1")] == 0.0  # unchanged counter: a true zero, measured
    assert got[(CPU_J, "0")] == 700.0
    assert not source.warming_up


def test_package_wrap_gives_exact_watts(trees, tmp_path):
    tree = copy_tree(trees["node_exporter"], tmp_path / "sys")
    zone = tree / "class" / "powercap" / "intel-rapl:0"
    clock = FakeClock()
    source = RaplSource(tree, RaplConfig(), clock=clock)
    assert series(source.poll()) == {(CPU_J, "0"): 0.0}
    # 240,422,366,267 → max 262,143,328,850 → 679,037,417: 21,720,962,583 + 679,037,417
    # = 22,400,000,000 µJ = 22,400 J in 64 s = 350 W exactly (with "+1 µJ": 350.0000000156).
    write_uj(zone, 679_037_417)
    clock.now += 64.0
    got = series(source.poll())
    assert got[(CPU_W, "0")] == 350.0
    assert got[(CPU_J, "0")] == 22_400.0


def test_dram_wrap_gives_exact_watts(trees, tmp_path):
    tree = copy_tree(trees["ceems"], tmp_path / "sys")
    dram = tree / "class" / "powercap" / "intel-rapl:1" / "intel-rapl:1:0"
    clock = FakeClock()
    source = RaplSource(tree, RaplConfig(), clock=clock)
    source.poll()
    # 64,930,394,974 → max 65,712,999,613 → 17,395,361: 782,604,639 + 17,395,361 = 800 J in 16 s.
    write_uj(dram, 17_395_361)
    clock.now += 16.0
    got = series(source.poll())
    assert got[(DRAM_W, "1")] == 50.0
    assert got[(DRAM_J, "1")] == 800.0


def test_backwards_without_max_drops_the_interval(trees, tmp_path):
    tree = copy_tree(trees["node_exporter"], tmp_path / "sys")
    zone = tree / "class" / "powercap" / "intel-rapl:0"
    (zone / "max_energy_range_uj").unlink()
    clock = FakeClock()
    source = RaplSource(tree, RaplConfig(), clock=clock)
    source.poll()
    write_uj(zone, 1_000_000)
    clock.now += 5.0
    got = series(source.poll())
    assert got == {(CPU_J, "0"): 0.0}  # no power, counter held, nothing negative
    assert source.warming_up
    # The next interval starts from the new reading.
    write_uj(zone, 1_000_000 + 1_750_000_000)
    clock.now += 5.0
    got = series(source.poll())
    assert got == {(CPU_J, "0"): 1750.0, (CPU_W, "0"): 350.0}
    assert not source.warming_up


def test_delta_larger_than_max_is_dropped(trees, tmp_path):
    tree = copy_tree(trees["node_exporter"], tmp_path / "sys")
    zone = tree / "class" / "powercap" / "intel-rapl:0"
    clock = FakeClock()
    source = RaplSource(tree, RaplConfig(), clock=clock)
    source.poll()
    write_uj(zone, 240422366267 + PKG_MAX_UJ + 1)  # more than one whole range: impossible
    clock.now += 5.0
    assert series(source.poll()) == {(CPU_J, "0"): 0.0}


def test_a_reset_that_lands_low_is_not_read_as_a_wrap(trees, tmp_path, caplog):
    # Issue 16: 200,000,500,000 → 1,000,000 µJ read as a wrap was 62,143 J in 1 s.
    tree = copy_tree(trees["node_exporter"], tmp_path / "sys")
    zone = tree / "class" / "powercap" / "intel-rapl:0"
    clock = FakeClock()
    source = RaplSource(tree, RaplConfig(), clock=clock)
    write_uj(zone, 200_000_500_000)
    source.poll()
    write_uj(zone, 200_000_500_000 + 350_000_000)  # +350 J in 1 s: 350 W
    clock.now += 1.0
    assert series(source.poll()) == {(CPU_J, "0"): 350.0, (CPU_W, "0"): 350.0}
    write_uj(zone, 1_000_000)
    clock.now += 1.0
    with caplog.at_level(logging.WARNING):
        got = series(source.poll())
    assert got == {(CPU_J, "0"): 350.0}  # no power for that interval, nothing added
    assert [r.getMessage() for r in caplog.records] == [
        f"rapl {zone}: energy counter went from 200,350.5 to 1 J in 1.0s, a wrap of"
        " 61,794 J, 61,794 W (above the 1,000 W bound): a counter reset; no power for that"
        " interval, counting on from the new reading"
    ]
    assert [(s.labels, s.value) for s in source.counter_resets()] == [
        ({"source": "rapl", "metric": CPU_J}, 1.0)
    ]
    # Counting goes on from the new reading.
    write_uj(zone, 1_000_000 + 300_000_000)
    clock.now += 1.0
    assert series(source.poll()) == {(CPU_J, "0"): 650.0, (CPU_W, "0"): 300.0}


def test_the_bound_comes_from_the_zones_own_constraints(trees, tmp_path):
    # CEEMS' package 0 has constraints of 150 W and 376 W (max_power_uw): 752 W bound.
    tree = copy_tree(trees["ceems"], tmp_path / "sys")
    zone = tree / "class" / "powercap" / "intel-rapl:0"
    clock = FakeClock()
    source = RaplSource(tree, RaplConfig(), clock=clock)
    source.poll()
    start = int((zone / "energy_uj").read_text())
    write_uj(zone, start + 750_000_000)  # 750 J in 1 s: under 752 W, believed
    clock.now += 1.0
    assert series(source.poll())[(CPU_W, "0")] == 750.0
    write_uj(zone, start + 750_000_000 + 760_000_000)  # 760 W: past it, a reset
    clock.now += 1.0
    assert (CPU_W, "0") not in series(source.poll())
    assert source.counter_resets()[0].value == 1


def test_clock_that_did_not_move_gives_no_power(trees, tmp_path):
    tree = copy_tree(trees["node_exporter"], tmp_path / "sys")
    source = RaplSource(tree, RaplConfig(), clock=FakeClock())
    source.poll()
    write_uj(tree / "class" / "powercap" / "intel-rapl:0", 240422366267 + 1_000_000)
    assert series(source.poll()) == {(CPU_J, "0"): 0.0}


@settings(max_examples=150, deadline=None)
@given(
    max_uj=st.integers(min_value=1, max_value=2**48),
    steps=st.lists(
        st.tuples(st.floats(0.0, 1.0), st.one_of(st.just(0.0), st.floats(1e-3, 60.0))),
        min_size=1,
        max_size=25,
    ),
)
def test_published_energy_is_monotonic_and_power_bounded(max_uj, steps):
    with tempfile.TemporaryDirectory() as tmp:
        zone = Path(tmp) / "class" / "powercap" / "intel-rapl:0"
        zone.mkdir(parents=True)
        (zone / "name").write_text("package-0\n")
        (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
        clock = FakeClock()
        source = RaplSource(Path(tmp), RaplConfig(), clock=clock)
        last_energy: float | None = None
        last_time = 0.0  # of the last reading the source took in (one where the clock moved)
        for fraction, dt in steps:
            write_uj(zone, round(fraction * max_uj))
            clock.now += dt
            got = series(source.poll())
            energy = got[(CPU_J, "0")]
            assert energy >= 0
            if last_energy is not None:
                assert energy >= last_energy
                assert energy - last_energy <= max_uj / 1e6 * (1 + 1e-12)
            if (CPU_W, "0") in got:
                assert last_energy is not None and dt > 0
                interval = clock.now - last_time
                watts = got[(CPU_W, "0")]
                assert 0 <= watts <= max_uj / 1e6 / interval
                assert watts * interval == pytest.approx(energy - last_energy, rel=1e-9, abs=1e-6)
            if last_energy is None or dt > 0:
                last_time = clock.now
            last_energy = energy


# --- what is not counted, and missing data ----------------------------------------------------


def test_psys_core_and_uncore_are_not_counted(trees, tmp_path):
    tree = copy_tree(trees["node_exporter"], tmp_path / "sys")
    powercap = tree / "class" / "powercap"
    for zone, name in (("intel-rapl:1", "psys"), ("intel-rapl:0:1", "uncore")):
        (powercap / zone).mkdir()
        (powercap / zone / "name").write_text(f"{name}\n")
        write_uj(powercap / zone, 5_000_000)
    assert polled_raw_joules(tree) == {("cpu", "0"): 240422.366267}


def test_multi_die_package_keeps_its_die_in_the_label(tmp_path):
    for index, die in enumerate(("package-0-die-0", "package-0-die-1")):
        zone = tmp_path / "class" / "powercap" / f"intel-rapl:{index}"
        zone.mkdir(parents=True)
        (zone / "name").write_text(f"{die}\n")
        write_uj(zone, 1_000_000 * (index + 1))
    assert polled_raw_joules(tmp_path) == {("cpu", "0-die-0"): 1.0, ("cpu", "0-die-1"): 2.0}


def test_one_zone_failing_leaves_the_rest(trees, tmp_path):
    tree = copy_tree(trees["ceems"], tmp_path / "sys")
    (tree / "class" / "powercap" / "intel-rapl:1" / "energy_uj").write_text("garbage\n")
    with pytest.raises(PartialReading) as partial:
        RaplSource(tree, RaplConfig(), clock=FakeClock()).poll()
    assert set(series(partial.value.samples)) == {(CPU_J, "0"), (DRAM_J, "0"), (DRAM_J, "1")}
    assert "intel-rapl:1/energy_uj" in str(partial.value)


def test_no_zone_readable_is_an_error(trees, tmp_path):
    tree = copy_tree(trees["node_exporter"], tmp_path / "sys")
    (tree / "class" / "powercap" / "intel-rapl:0" / "energy_uj").unlink()
    with pytest.raises(RuntimeError, match="no RAPL zone could be read"):
        RaplSource(tree, RaplConfig(), clock=FakeClock()).poll()


def test_absent_hardware_is_no_data(tmp_path):
    with pytest.raises(NoData):
        RaplSource(tmp_path, RaplConfig()).poll()
    zone = tmp_path / "class" / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("psys\n")
    write_uj(zone, 1)
    with pytest.raises(NoData):
        RaplSource(tmp_path, RaplConfig()).poll()


def test_max_interval_polls_well_inside_a_wrap():
    wrap_at_1kw = PKG_MAX_UJ / 1e6 / 1000.0  # ≈ 262 s
    assert RaplConfig.max_interval is not None
    assert RaplSource.default_interval < RaplConfig.max_interval <= wrap_at_1kw / 4


# --- energy_uj readable by root only ----------------------------------------------------------

ROOT_ONLY = r"energy_uj is readable by root only .*CAP_DAC_READ_SEARCH"


def test_permission_error_is_translated(trees, monkeypatch):
    import exporter.sources.rapl as rapl

    def read_int(path: Path) -> int | None:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return None

    monkeypatch.setattr(rapl, "read_int", read_int)
    with pytest.raises(RaplPermissionError, match=ROOT_ONLY) as info:
        RaplSource(trees["node_exporter"], RaplConfig(), clock=FakeClock()).poll()
    assert isinstance(info.value.__cause__, PermissionError)


def _poll_as_nobody(tree: Path) -> str:
    """Poll in a child that dropped root; return what it raised, as 'Type: message'."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # fork() in a threaded process warns from 3.12 on
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            except OSError as exc:
                result = f"cannot drop privileges: {exc}"
            else:
                try:
                    RaplSource(tree, RaplConfig(), clock=FakeClock()).poll()
                    result = "no exception"
                except Exception as exc:
                    result = f"{type(exc).__name__}: {exc}"
            os.write(write_end, result.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        result = pipe.read().decode()
    os.waitpid(pid, 0)
    return result


def test_energy_uj_root_only_is_a_clear_error(trees, tmp_path):
    if os.geteuid() != 0:
        tree = copy_tree(trees["node_exporter"], tmp_path / "sys")
        energy = tree / "class" / "powercap" / "intel-rapl:0" / "energy_uj"
        energy.chmod(0)
        if os.access(energy, os.R_OK):
            pytest.skip("this user reads mode-000 files (CAP_DAC_OVERRIDE) and cannot drop it")
        with pytest.raises(RaplPermissionError, match=ROOT_ONLY):
            RaplSource(tree, RaplConfig(), clock=FakeClock()).poll()
        return
    # As root chmod stops nothing: the child drops to nobody, so the tree must be
    # reachable by nobody (tmp_path's parents are not), all but energy_uj.
    base = Path(tempfile.mkdtemp(prefix="rapl-perm-"))
    try:
        base.chmod(0o755)
        tree = copy_tree(trees["node_exporter"], base / "sys")
        # Warm up in the parent: the child inherits loaded modules (the ascii codec),
        # and nobody may not be able to read the interpreter's stdlib to load them.
        RaplSource(tree, RaplConfig(), clock=FakeClock()).poll()
        (tree / "class" / "powercap" / "intel-rapl:0" / "energy_uj").chmod(0)
        result = _poll_as_nobody(tree)
    finally:
        shutil.rmtree(base)
    if result.startswith("cannot drop privileges"):
        pytest.skip(result)
    assert result.startswith("RaplPermissionError: ")
    assert re.search(ROOT_ONLY, result)
