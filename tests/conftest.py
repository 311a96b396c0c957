"""Shared pytest fixtures."""

from __future__ import annotations

# --- fake NVML (tests/fake_nvml) ---------------------------------------------------------------
import ctypes
import json
import os
import pathlib
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the decider's modules load only for the tests that build sites
    from decider.facility import Facility
    from decider.snapshot import Snapshot
    from decider.store import Reservation
    from tests.placement_helpers import Site

NVML_FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "nvml"


class FakeNvml:
    """The fake libnvidia-ml.so.1, loaded once per session and injected into pynvml.

    pynvml caches function pointers by name, so the whole session uses one library path.
    `configure()` replaces the JSON the library reads (atomically: temp file + os.replace),
    which the library notices at its next call, initialised or not.
    """

    def __init__(self, library: pathlib.Path, config_path: pathlib.Path, mp: pytest.MonkeyPatch):
        self.library = library
        self.config_path = config_path
        self.lib = ctypes.CDLL(str(library))
        self.lib.fakeNvmlGetCallCount.restype = ctypes.c_ulonglong
        self.lib.fakeNvmlGetCallCount.argtypes = [ctypes.c_char_p]
        self.lib.fakeNvmlGetRefCount.restype = ctypes.c_uint
        self.lib.fakeNvmlSizeof.restype = ctypes.c_size_t
        self.lib.fakeNvmlSizeof.argtypes = [ctypes.c_char_p]
        self._mp = mp

    @staticmethod
    def load_fixture(name: str) -> dict[str, Any]:
        """A config from tests/fixtures/nvml, by file name with or without `.json`."""
        path = NVML_FIXTURES / (name if name.endswith(".json") else f"{name}.json")
        return json.loads(path.read_text())

    def configure(self, config: dict[str, Any] | str | os.PathLike[str]) -> pathlib.Path:
        """Make `config` (a dict, or the path of a JSON file) what the library reads."""
        if isinstance(config, dict):
            text = json.dumps(config, indent=1)
        else:
            text = pathlib.Path(config).read_text()
        return self.configure_text(text)

    def configure_text(self, text: str) -> pathlib.Path:
        """Write raw text as the config (for testing invalid files too)."""
        fd, tmp = tempfile.mkstemp(prefix=".nvml-", suffix=".json", dir=self.config_path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            os.replace(tmp, self.config_path)
        except BaseException:
            pathlib.Path(tmp).unlink(missing_ok=True)
            raise
        self._mp.setenv("FAKE_NVML_CONFIG", str(self.config_path))
        return self.config_path

    def reset(self) -> None:
        """Back to a freshly loaded library: not initialised, call counters at zero."""
        import pynvml

        self.lib.fakeNvmlReset()
        pynvml._nvmlLib_refcount = 0

    def call_count(self, name: str | None = None) -> int:
        """How often the library's `name` (all functions when None) ran since the last reset."""
        return int(self.lib.fakeNvmlGetCallCount(name.encode() if name else None))

    def refcount(self) -> int:
        """The library's nvmlInit reference count."""
        return int(self.lib.fakeNvmlGetRefCount())


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeNvml]:
    """The fake NVML library, injected into pynvml for the whole session."""
    import pynvml

    from tests.fake_nvml.build import ensure_built

    mp = pytest.MonkeyPatch()
    fake = FakeNvml(ensure_built(), tmp_path_factory.mktemp("fake_nvml") / "nvml.json", mp)
    saved_lib = pynvml.nvmlLib
    saved_cache = dict(pynvml._nvmlGetFunctionPointer_cache)
    pynvml.nvmlLib = fake.lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield fake
    finally:
        fake.reset()
        mp.undo()
        pynvml.nvmlLib = saved_lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved_cache)


# --- end fake NVML -----------------------------------------------------------------------------


# --- BMC credentials (tests/fake_redfish) -------------------------------------------------------
@pytest.fixture
def credentials(tmp_path: pathlib.Path) -> pathlib.Path:
    """The credentials file the fake Redfish BMC accepts (user, then password; mode 0600)."""
    from tests.fake_redfish import PASSWORD, USER

    path = tmp_path / "bmc-credentials"
    path.write_text(f"{USER}\n{PASSWORD}\n")
    path.chmod(0o600)
    return path


# --- placement sites (tests/placement_helpers.py) ----------------------------------------------
@pytest.fixture
def make_site(tmp_path: pathlib.Path) -> Iterator[Any]:
    """Builds a placement_helpers.Site per call, each with its own store, closed at the end."""
    from tests.placement_helpers import Site

    sites: list[Site] = []

    def make(
        facility: Facility,
        snapshot: Snapshot | None = None,
        *,
        reservations: Iterable[Reservation] = (),
        holds: Mapping[str, str] | None = None,
    ) -> Site:
        site = Site(
            tmp_path / f"decider-{len(sites)}.db", facility, snapshot, reservations, holds or {}
        )
        sites.append(site)
        return site

    yield make
    for site in sites:
        site.store.close()


# --- the fast tier: tests that start real servers or a browser ---------------------------------
# `make test-fast` runs `-m "not servers and not browser"`; `make test` runs all. A test is
# marked here by its file, by a fixture of its file that starts servers, or by its own name
# when its body starts them. So that no test can be missed, the session watches every process
# a test starts (the interpreter's subprocess.Popen audit event): a server or browser started
# by a test without the marker fails that test, naming the marker and this table.

#: Test file (relative to tests/) -> None: every test of the file; or the fixtures (of that
#: file) and test names that start servers.
SERVER_TESTS: dict[str, frozenset[str] | None] = {
    "test_alerting_e2e.py": None,
    "test_bmc_alerts_e2e.py": None,
    "test_bmc_targets.py": None,
    "test_capping_e2e.py": None,
    "test_benchmark_smoke.py": frozenset({"test_a_few_rounds_end_to_end"}),
    "test_conditions_state_set.py": frozenset(
        {"test_every_read_finds_each_domain_at_exactly_one_condition"}
    ),
    "test_dashboards.py": frozenset({"prometheus", "demo"}),
    "test_decider_api.py": frozenset(
        {"make", "decider", "shared", "test_a_bad_file_at_start_exits_2_naming_the_line"}
    ),
    "test_decider_benchmark_smoke.py": frozenset({"test_a_quick_run_end_to_end"}),
    "test_decider_cli.py": frozenset({"site"}),
    "test_decider_durability.py": None,
    "test_decider_e2e.py": None,
    "test_decider_prometheus.py": frozenset({"engines", "engine"}),
    "test_demo.py": frozenset(
        {"test_the_demo_tells_its_story_once", "test_ctrl_c_stops_the_demo_and_every_server"}
    ),
    "test_energy_victoriametrics.py": None,
    "test_evidence.py": frozenset(
        {
            "test_a_real_decider_names_the_evidence_it_reads_from_prometheus",
            "test_victoria_metrics_reads_each_warm_or_hot_domains_evidence",
        }
    ),
    "test_exporter_e2e.py": None,
    "test_exporter_page.py": None,
    "test_ipmi_sim.py": None,
    "test_overrides.py": frozenset(
        {"test_an_override_through_the_cli_is_kept_across_a_restart_and_ended"}
    ),
    "test_phases.py": frozenset({"service"}),
    "test_power_capping.py": frozenset({"test_the_api_shows_the_recommendations"}),
    "test_profiles.py": frozenset({"running"}),
    "test_profiles_e2e.py": None,
    "test_rules_benchmark_smoke.py": frozenset(
        {"test_whole_run_at_eight_nodes", "test_sharded_run_at_sixteen_nodes"}
    ),
    "test_rules_render.py": frozenset(
        {"test_vmalert_evaluates_the_rendered_rules_over_victoria_metrics"}
    ),
    "test_shedding.py": frozenset({"test_the_calls_metric_and_cli_on_a_real_decider"}),
    "test_shedding_hot_query.py": frozenset(
        {"test_victoria_metrics_reads_how_long_each_domain_is_hot"}
    ),
    "test_simulate.py": frozenset(
        {
            "test_the_simulate_command_serves_each_node_and_writes_the_target_file",
            "test_the_simulate_command_refuses_a_bad_scenario",
            "test_prometheus_scrapes_every_simulated_node_as_its_own_target",
        }
    ),
    "test_snmp_pdu_e2e.py": None,
    "test_status_page.py": None,
}
BROWSER_TESTS: dict[str, frozenset[str] | None] = {
    "test_status_page.py": frozenset({"page"}),
}
#: The fault-injection suite runs against real processes (issue 16): all of it.
SERVER_FOLDERS = ("faults/",)

#: Programs that serve until stopped; chromium is the browser.
SERVER_PROGRAMS = frozenset(
    {
        "prometheus",
        "alertmanager",
        "prometheus-alertmanager",
        "victoria-metrics",
        "victoria-metrics-prod",
        "vmalert",
        "vmalert-prod",
        "llmgw-decider",
        "llmgw-exporter",
        "prometheus-node-exporter",
        "sushy-static",  # sushy-tools' Redfish mockup server (tests/redfish_helpers.py)
        "snmpsim-command-responder",  # an SNMP agent from recordings (test_snmp_pdu_e2e.py)
        "prometheus-snmp-exporter",
        "ipmi_sim",  # OpenIPMI's BMC simulator (tests/ipmi_sim_helpers.py)
    }
)
BROWSER_PROGRAMS = frozenset({"chromium", "chromium-browser"})
SERVER_MODULES = frozenset({"decider.main", "exporter", "exporter.main"})
ONE_SHOT_FLAGS = frozenset({"--once", "-dryRun"})
SERVING_CLI_COMMANDS = frozenset({"demo", "simulate"})  # llmgw-facility's commands that serve

TESTS = pathlib.Path(__file__).resolve().parent


def _marked_by(table: dict[str, frozenset[str] | None], item: pytest.Item, path: str) -> bool:
    if path not in table:
        return False
    names = table[path]
    return names is None or bool(names & {*item.fixturenames, getattr(item, "originalname", "")})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.relative_to(TESTS).as_posix()
        if _marked_by(SERVER_TESTS, item, path) or path.startswith(SERVER_FOLDERS):
            item.add_marker(pytest.mark.servers)
        if _marked_by(BROWSER_TESTS, item, path):
            item.add_marker(pytest.mark.browser)


def started_kind(argv: object) -> str | None:
    """`servers` or `browser` when a process of this argv serves or browses, else None."""
    if isinstance(argv, str | bytes | os.PathLike):
        argv = [argv]
    words = [os.fsdecode(word) for word in argv]  # type: ignore[union-attr]
    if not words:
        return None
    program = os.path.basename(words[0])
    # The exporter's one exposition and exit; vmalert's check of a rule file.
    once = bool(ONE_SHOT_FLAGS & set(words))
    if program in BROWSER_PROGRAMS:
        return "browser"
    if program in SERVER_PROGRAMS and not once:
        return "servers"
    module = words[words.index("-m") + 1] if "-m" in words[:-1] else None
    if module in SERVER_MODULES and not once:
        return "servers"
    command = words[words.index(module) + 1 :] if module else words[1:]
    if (module == "llmgw_facility.cli" or program == "llmgw-facility") and command:
        return "servers" if command[0] in SERVING_CLI_COMMANDS else None
    return None


_running: list[pytest.Item] = []  # the test whose setup, call or teardown runs now


def _watch_processes(event: str, args: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen" or not _running:
        return
    item, kind = _running[-1], started_kind(args[1])
    if kind is not None and item.get_closest_marker(kind) is None:
        raise RuntimeError(
            f"{item.nodeid} starts {args[1]!r} but is not marked `{kind}`: add its file, "
            "fixture or name to tests/conftest.py's table, so that `make test-fast` leaves it out"
        )


sys.addaudithook(_watch_processes)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


# --- end fast tier -----------------------------------------------------------------------------
