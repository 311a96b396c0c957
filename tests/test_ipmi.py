"""ipmi source: the recorded outputs of the three DCMI tools, played by fake tools on PATH.

The DCMI reports are CEEMS' recordings (tests/fixtures/ceems/bsd3/tool-outputs).
The SDR listings (`ipmitool sdr type Temperature`, FreeIPMI `ipmi-sensors`
CSV) are **synthetic**: written here in the tools' documented formats, as no
recording is at hand. The `ipmiutil sensor` listing keeps two lines of public
output verbatim (`Baseboard Temp`: the sample in ipmiutil's own isensor(8);
`FAN1` and the header: a published `ipmiutil sensor` 3.18 run) and adds inlet
lines in the format its isensor.c prints.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from exporter.poller import SourceRunner
from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.ipmi import (
    FrozenReading,
    IpmiConfig,
    IpmiSource,
    parse_power,
    parse_sdr_temperatures,
)
from tests.node_power_helpers import OUTPUTS

RECORDED = {  # tool → (recorded report, its current power)
    "ipmi-dcmi": ("ipmi-dcmi.stdout.txt", 332.0),
    "ipmitool": ("ipmitool.stdout.txt", 2578.0),
    "ipmiutil": ("ipmiutil.stdout.txt", 49.0),
}
POWER = "llmgw_node_power_watts"
INLET = "llmgw_node_inlet_temperature_celsius"

IPMITOOL_SDR = """\
Inlet Temp       | 04h | ok  |  7.1 | 23 degrees C
Exhaust Temp     | 01h | ok  |  7.1 | 35 degrees C
Temp             | 0Eh | ok  |  3.1 | 40 degrees C
Temp             | 0Fh | ns  |  3.2 | No Reading
"""
IPMIUTIL_SENSORS = """\
ipmiutil sensor version 3.18
-- BMC version 1.48, IPMI version 2.0
_ID_ SDR_Type_xx ET Own Typ S_Num   Sens_Description   Hex & Interp Reading
000b SDR Full 01 01 20 a 01 snum 30 Baseboard Temp   = 2e OK   46.00 degrees C
025f SDR Full 01 01 20 a 04 snum 41 FAN1             = 05 Crit-lo 500.00 RPM
0011 SDR Full 01 01 20 a 01 snum 32 Inlet Temp       = 17 OK   23.00 degrees C
ipmiutil sensor, completed successfully
"""
FREEIPMI_SDR = """\
4,CPU1 Temp,Temperature,52.00,C,'OK'
5,Ambient Temp,Temperature,21.00,C,'OK'
6,PCH Temp,Temperature,N/A,C,N/A
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A sysfs with an in-band IPMI device, and an empty bin/ that is all of PATH."""
    sysfs = tmp_path / "sys"
    (sysfs / "class" / "ipmi" / "ipmi0").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    return {"sysfs": sysfs, "bin": bin_dir, "tmp": tmp_path}


def fake_tool(bin_dir: Path, name: str, body: str) -> Path:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def replaying(bin_dir: Path, name: str, report: str, sdr: str | None = None) -> Path:
    """A tool that prints `report` for a DCMI call and `sdr` for an SDR listing."""
    data = bin_dir.parent / f"{name}.out"
    data.write_text(report)
    body = f'exec /bin/cat "{data}"\n'
    if sdr is not None:
        listing = bin_dir.parent / f"{name}.sdr"
        listing.write_text(sdr)
        body = f'case "$1" in sdr) exec /bin/cat "{listing}";; esac\n' + body
    return fake_tool(bin_dir, name, body)


def recorded(name: str) -> str:
    return (OUTPUTS / RECORDED[name][0]).read_text()


def source(node: dict[str, Path], clock: FakeClock | None = None, **keys: object) -> IpmiSource:
    return IpmiSource(node["sysfs"], IpmiConfig.model_validate(keys), clock or FakeClock())


def powers(samples: list[Sample]) -> list[float]:
    return [s.value for s in samples if s.metric == POWER]


# --- the recorded reports ----------------------------------------------------------------


@pytest.mark.parametrize("tool", list(RECORDED))
def test_each_recorded_report_parses(tool: str) -> None:
    assert parse_power(recorded(tool)) == RECORDED[tool][1]


@pytest.mark.parametrize("tool", list(RECORDED))
def test_each_tool_on_path(node: dict[str, Path], tool: str) -> None:
    replaying(node["bin"], tool, recorded(tool))
    samples = source(node).poll()
    assert samples == [Sample(POWER, RECORDED[tool][1], {"source": "ipmi"})]


def test_the_first_tool_found_is_used(node: dict[str, Path]) -> None:
    for tool in ("ipmiutil", "ipmitool"):
        replaying(node["bin"], tool, recorded(tool))
    assert powers(source(node).poll()) == [2578.0]  # ipmitool comes before ipmiutil


def test_the_configured_tool_is_used(node: dict[str, Path]) -> None:
    for tool in RECORDED:
        replaying(node["bin"], tool, recorded(tool))
    assert powers(source(node, tool="ipmiutil").poll()) == [49.0]


def test_a_configured_path_with_a_format(node: dict[str, Path]) -> None:
    wrapper = replaying(node["tmp"], "dcmi-over-lan", recorded("ipmitool"))
    (node["sysfs"] / "class" / "ipmi" / "ipmi0").rmdir()  # a configured tool needs no device
    assert powers(source(node, tool=str(wrapper), format="ipmitool").poll()) == [2578.0]


def test_no_ipmi_device_is_no_data(node: dict[str, Path]) -> None:
    replaying(node["bin"], "ipmitool", recorded("ipmitool"))
    (node["sysfs"] / "class" / "ipmi" / "ipmi0").rmdir()
    with pytest.raises(NoData, match="no in-band IPMI device"):
        source(node).poll()


def test_no_tool_is_no_data(node: dict[str, Path]) -> None:
    with pytest.raises(NoData, match="no IPMI tool on PATH"):
        source(node).poll()


def test_a_configured_tool_that_is_missing_is_a_failure(node: dict[str, Path]) -> None:
    with pytest.raises(RuntimeError, match="'ipmitool' is not executable"):
        source(node, tool="ipmitool").poll()


@pytest.mark.parametrize(
    ("tool", "line", "replacement"),
    [
        ("ipmi-dcmi", "Power Measurement                    : Active", "Not Available"),
        ("ipmitool", "Power reading state is:                   activated", "deactivated"),
        ("ipmiutil", "Power reading state is:          active", "not active"),
    ],
)
def test_power_measurement_not_active_is_absent_not_a_failure(
    node: dict[str, Path], tool: str, line: str, replacement: str
) -> None:
    report = recorded(tool)
    assert line in report
    key = line.split(":")[0]
    replaying(node["bin"], tool, report.replace(line, f"{key}: {replacement}"))
    runner = SourceRunner(source(node), 30)
    state = runner.poll_once()
    assert (state.up, state.samples) == (True, ())
    assert "power measurement is not active" in state.reason


@pytest.mark.parametrize("watts", ["0", "60000"])
def test_an_impossible_node_power_is_absent(node: dict[str, Path], watts: str) -> None:
    report = recorded("ipmitool").replace("2578 Watts", f"{watts} Watts", 1)
    replaying(node["bin"], "ipmitool", report)
    assert source(node, inlet=False).poll() == []


def test_a_report_without_a_reading_is_a_failure(node: dict[str, Path]) -> None:
    replaying(node["bin"], "ipmitool", "DCMI request failed because: Invalid command (c1)\n")
    with pytest.raises(RuntimeError, match="no current power reading"):
        source(node).poll()


def test_a_failing_tool_is_down_with_its_last_words(node: dict[str, Path]) -> None:
    fake_tool(
        node["bin"],
        "ipmitool",
        "echo 'Could not open device at /dev/ipmi0: No such file or directory' >&2\nexit 1\n",
    )
    state = SourceRunner(source(node), 30).poll_once()
    assert state.up is False
    assert state.reason == (
        "IpmiToolError: ipmitool exited with status 1:"
        " Could not open device at /dev/ipmi0: No such file or directory"
    )


def test_a_hanging_tool_is_killed_with_its_children(node: dict[str, Path]) -> None:
    child = node["tmp"] / "child.pid"
    fake_tool(node["bin"], "ipmitool", f'/bin/sleep 1000 &\necho $! > "{child}"\nwait\n')
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ipmitool did not answer within 0\.5s and was killed"):
        source(node, timeout="500ms").poll()
    assert time.monotonic() - started < 5
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(pid), "the tool's child outlived the kill"


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- a BMC that stops answering ------------------------------------------------------------


def test_the_last_reading_is_kept_until_stale_then_dropped(node: dict[str, Path]) -> None:
    clock = FakeClock()
    tool = replaying(node["bin"], "ipmitool", recorded("ipmitool"))
    runner = SourceRunner(source(node, clock, inlet=False), 30)
    assert runner.poll_once().up
    tool.write_text("#!/bin/sh\necho 'Unable to get DCMI power reading' >&2\nexit 1\n")
    clock.now += 30
    held = runner.poll_once()
    assert (held.up, [s.value for s in held.samples]) == (False, [2578.0])
    clock.now += 61  # 91 s after the reading: past 3 × 30 s
    gone = runner.poll_once()
    assert (gone.up, gone.samples) == (False, ())
    assert (
        gone.reason
        == "IpmiToolError: ipmitool exited with status 1: Unable to get DCMI power reading"
    )


def test_a_failure_is_logged_once_and_the_hold_expiry_once_more(
    node: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    tool = replaying(node["bin"], "ipmitool", recorded("ipmitool"))
    runner = SourceRunner(source(node, clock, inlet=False), 30)
    runner.poll_once()
    tool.write_text("#!/bin/sh\nexit 1\n")
    with caplog.at_level(logging.INFO):
        for _ in range(6):
            clock.now += 30
            runner.poll_once()
    assert caplog.text.count("source ipmi failing") == 2


# --- inlet from the SDR --------------------------------------------------------------------


def test_ipmitool_inlet(node: dict[str, Path]) -> None:
    replaying(node["bin"], "ipmitool", recorded("ipmitool"), IPMITOOL_SDR)
    samples = source(node).poll()
    assert samples == [
        Sample(POWER, 2578.0, {"source": "ipmi"}),
        Sample(INLET, 23.0, {"chip": "ipmi", "sensor": "Inlet Temp"}),
    ]


def test_freeipmi_inlet_from_ipmi_sensors_beside_ipmi_dcmi(node: dict[str, Path]) -> None:
    replaying(node["bin"], "ipmi-dcmi", recorded("ipmi-dcmi"))
    replaying(node["bin"], "ipmi-sensors", FREEIPMI_SDR)
    inlets = [(s.labels["sensor"], s.value) for s in source(node).poll() if s.metric == INLET]
    assert inlets == [("Ambient Temp", 21.0)]


def test_a_named_inlet_sensor(node: dict[str, Path]) -> None:
    sdr = IPMITOOL_SDR.replace("Inlet Temp  ", "Front Panel ")
    replaying(node["bin"], "ipmitool", recorded("ipmitool"), sdr)
    assert INLET not in {s.metric for s in source(node).poll()}
    named = source(node, inlet_sensor="front panel").poll()
    assert [s.value for s in named if s.metric == INLET] == [23.0]


def test_a_disconnected_inlet_sensor_is_absent(node: dict[str, Path]) -> None:
    sdr = IPMITOOL_SDR.replace("23 degrees C", "-62 degrees C")
    replaying(node["bin"], "ipmitool", recorded("ipmitool"), sdr)
    assert powers(source(node).poll()) == [2578.0]
    assert INLET not in {s.metric for s in source(node).poll()}


def test_a_failing_sdr_keeps_the_power_and_reads_down(node: dict[str, Path]) -> None:
    report = node["tmp"] / "power.out"
    report.write_text(recorded("ipmitool"))
    fake_tool(
        node["bin"], "ipmitool", f'case "$1" in sdr) exit 1;; esac\nexec /bin/cat "{report}"\n'
    )
    with pytest.raises(
        PartialReading, match="inlet sensor: ipmitool exited with status 1"
    ) as caught:
        source(node).poll()
    assert powers(caught.value.samples) == [2578.0]


def test_ipmiutil_sensor_listing_parses() -> None:
    """Temperatures only (sensor type 01), with their names as the SDR has them."""
    assert parse_sdr_temperatures(IPMIUTIL_SENSORS, "ipmiutil") == [
        ("Baseboard Temp", 46.0),
        ("Inlet Temp", 23.0),
    ]


def ipmiutil(bin_dir: Path, sensors: str) -> None:
    """ipmiutil replaying CEEMS' `dcmi power` recording, and `sensors` for `sensor -g temp`."""
    report, listing = bin_dir.parent / "ipmiutil.out", bin_dir.parent / "ipmiutil.sensors"
    report.write_text(recorded("ipmiutil"))
    listing.write_text(sensors)
    fake_tool(
        bin_dir,
        "ipmiutil",
        f'[ "$*" = "sensor -g temp" ] && exec /bin/cat "{listing}"\nexec /bin/cat "{report}"\n',
    )


def test_ipmiutil_inlet(node: dict[str, Path]) -> None:
    ipmiutil(node["bin"], IPMIUTIL_SENSORS)
    assert source(node).poll() == [
        Sample(POWER, 49.0, {"source": "ipmi"}),
        Sample(INLET, 23.0, {"chip": "ipmi", "sensor": "Inlet Temp"}),
    ]


def test_an_ipmiutil_sensor_in_init_state_has_no_reading(node: dict[str, Path]) -> None:
    """isensor.c's "Init" status: no reading yet; its 0.00 is not a temperature."""
    ipmiutil(node["bin"], IPMIUTIL_SENSORS.replace("= 17 OK   23.00", "= 00 Init  0.00"))
    assert [s.metric for s in source(node).poll()] == [POWER]


def test_not_active_power_still_serves_the_inlet(node: dict[str, Path]) -> None:
    report = recorded("ipmitool").replace("activated", "deactivated")
    replaying(node["bin"], "ipmitool", report, IPMITOOL_SDR)
    assert [s.metric for s in source(node).poll()] == [INLET]


def test_sdr_parsers() -> None:
    assert parse_sdr_temperatures(IPMITOOL_SDR, "ipmitool") == [
        ("Inlet Temp", 23.0),
        ("Exhaust Temp", 35.0),
        ("Temp", 40.0),
    ]
    assert parse_sdr_temperatures(FREEIPMI_SDR, "freeipmi") == [
        ("CPU1 Temp", 52.0),
        ("Ambient Temp", 21.0),
    ]


# --- configuration -------------------------------------------------------------------------

LAN = {"host": "10.20.7.3", "user": "llmgw", "password_file": "/etc/llmgw/bmc-password"}


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"interval": "5s"}, "shorter than 30s"),
        ({"timeout": "1m"}, "must be shorter than the interval"),
        ({"stale_after": "10s"}, "stale_after 10s is shorter than the interval 30s"),
        ({"tool": "/usr/local/bin/bmc-wrapper"}, "set format"),
        ({"format": "racadm"}, "Input should be"),
        ({"host": "10.20.7.3", "user": "llmgw"}, "host 10.20.7.3 needs password_file"),
        ({"host": "10.20.7.3", "password_file": "/p"}, "host 10.20.7.3 needs user"),
        ({"user": "llmgw", "password_file": "/p"}, "user and password_file without host"),
        ({**LAN, "host": "https://10.20.7.3"}, "is not a host name or an IP address"),
        ({**LAN, "host": "-P"}, "is not a host name or an IP address"),
        ({**LAN, "user": "-P"}, "is not an IPMI user name"),
        ({**LAN, "user": "a-user-name-over-16"}, "is not an IPMI user name"),
        ({**LAN, "port": 0}, "greater than or equal to 1"),
        ({**LAN, "interface": "lan"}, "Input should be 'lanplus'"),
        ({**LAN, "privilege": "root"}, "Input should be 'user', 'operator' or 'admin'"),
        ({**LAN, "cipher_suite": 0}, "greater than or equal to 1"),
        ({**LAN, "workarounds": ["open sesspriv"]}, "is not a FreeIPMI workaround flag"),
        ({**LAN, "tool": "ipmiutil"}, "ipmiutil cannot read a BMC over the LAN"),
        ({"tool": "ipmiutil", "power_sensor": "Pwr"}, "not ipmiutil"),
        ({"frozen_after": "45s"}, "frozen_after 45s is shorter than two intervals"),
    ],
)
def test_config_refusals(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IpmiConfig.model_validate(keys)


def test_the_environment_of_the_tool_is_c_locale(node: dict[str, Path]) -> None:
    seen = node["tmp"] / "env"
    report = node["tmp"] / "power.out"
    report.write_text(recorded("ipmitool"))
    fake_tool(node["bin"], "ipmitool", f'echo "$LC_ALL" > "{seen}"\nexec /bin/cat "{report}"\n')
    source(node, inlet=False).poll()
    assert seen.read_text().strip() == "C"


def test_out_of_band_keys_are_accepted() -> None:
    config = IpmiConfig.model_validate(
        {**LAN, "port": 6230, "privilege": "operator", "cipher_suite": 17, "frozen_after": None}
    )
    assert (config.host, config.port, config.interface, config.frozen_after) == (
        "10.20.7.3",
        6230,
        "lanplus",
        None,
    )
    assert IpmiConfig.model_validate({**LAN, "host": "fe80::1%eth0"}).host == "fe80::1%eth0"


# --- out-of-band, with fake tools (tests/test_ipmi_sim.py: against a real BMC simulator) ---


def arguments_recorder(bin_dir: Path, name: str, report: str) -> Path:
    """A tool that writes its argv and stdin beside it, one word a line, and prints `report`."""
    data = bin_dir.parent / f"{name}.out"
    data.write_text(report)
    argv, stdin = bin_dir.parent / f"{name}.argv", bin_dir.parent / f"{name}.stdin"
    body = f'printf "%s\\n" "$@" > "{argv}"\n/bin/cat > "{stdin}"\nexec /bin/cat "{data}"\n'
    return fake_tool(bin_dir, name, body)


def test_ipmitool_out_of_band_gets_the_password_file_not_the_password(
    node: dict[str, Path],
) -> None:
    password = node["tmp"] / "bmc-password"
    password.write_text("s3cret\n")
    tool = arguments_recorder(
        node["bin"], "ipmitool", IPMITOOL_SDR + "Pwr | 30h | ok | 21.1 | 332 Watts\n"
    )
    keys = {**LAN, "password_file": str(password), "power_sensor": "pwr", "cipher_suite": 3}
    samples = source(node, tool=str(tool), **keys).poll()
    assert powers(samples) == [332.0]
    argv = (node["tmp"] / "ipmitool.argv").read_text().splitlines()
    assert argv == [
        *("-I", "lanplus", "-H", "10.20.7.3", "-p", "623", "-U", "llmgw"),
        *("-f", str(password), "-L", "USER", "-C", "3", "sdr", "elist", "full"),
    ]
    assert (node["tmp"] / "ipmitool.stdin").read_text() == ""


def test_freeipmi_out_of_band_gets_the_password_on_stdin(node: dict[str, Path]) -> None:
    password = node["tmp"] / "bmc-password"
    password.write_text("s3cret\n")
    fake_tool(node["bin"], "ipmi-dcmi", "exit 3\n")  # names the family; not run for a sensor
    arguments_recorder(node["bin"], "ipmi-sensors", "7,Pwr,Current,332.00,W,'OK'\n" + FREEIPMI_SDR)
    keys = {**LAN, "password_file": str(password), "power_sensor": "Pwr", "port": 6230}
    source_ = source(node, tool="ipmi-dcmi", workarounds=["opensesspriv"], **keys)
    samples = source_.poll()
    assert (powers(samples), [s.labels.get("sensor") for s in samples if s.metric == INLET]) == (
        [332.0],
        ["Ambient Temp"],
    )
    argv = (node["tmp"] / "ipmi-sensors.argv").read_text().splitlines()
    cache = source_._sdr_cache
    assert argv == [
        "--driver-type=LAN_2_0",
        "--hostname=10.20.7.3:6230",
        "--username=llmgw",
        "--password-prompt",
        "--privilege-level=user",
        "--workaround-flags=opensesspriv",
        f"--sdr-cache-directory={cache}",
        "--sdr-cache-recreate",
        "--quiet-cache",
        "--comma-separated-output",
        "--no-header-output",
    ]
    assert (node["tmp"] / "ipmi-sensors.stdin").read_text() == "s3cret\n"
    source_.close()
    assert cache is not None and not Path(cache).exists()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "cannot read the password file {path}: No such file or directory"),
        ("", "the password file {path} is empty: the password goes on its first line"),
        ("x" * 21 + "\n", "the password in {path} is longer than IPMI's 20 bytes"),
    ],
)
def test_an_unusable_password_file_reads_down_and_runs_no_tool(
    node: dict[str, Path], content: str | None, reason: str
) -> None:
    path = node["tmp"] / "bmc-password"
    if content is not None:
        path.write_text(content)
    ran = node["tmp"] / "ran"
    fake_tool(node["bin"], "ipmitool", f'touch "{ran}"\n')
    runner = SourceRunner(source(node, tool="ipmitool", **{**LAN, "password_file": str(path)}), 30)
    state = runner.poll_once()
    assert (state.up, state.samples) == (False, ())
    assert state.reason == "IpmiToolError: " + reason.format(path=path)
    assert not ran.exists()


def test_out_of_band_without_a_tool_reads_down_not_no_data(node: dict[str, Path]) -> None:
    state = SourceRunner(source(node, **LAN), 30).poll_once()
    assert (state.up, state.failure) == (False, "error")
    assert state.reason == (
        "IpmiToolError: no IPMI tool on PATH to read the BMC at 10.20.7.3"
        " (ipmi-dcmi from FreeIPMI, or ipmitool)"
    )


def test_power_sensor_in_band_reads_the_sdr_once(node: dict[str, Path]) -> None:
    runs = node["tmp"] / "runs"
    listing = node["tmp"] / "sdr"
    listing.write_text("PSU Input Power  | 30h | ok | 21.1 | 1496 Watts\n" + IPMITOOL_SDR)
    fake_tool(node["bin"], "ipmitool", f'echo "$@" >> "{runs}"\nexec /bin/cat "{listing}"\n')
    samples = source(node, power_sensor="PSU Input Power").poll()
    assert [(s.metric, s.value) for s in samples] == [(POWER, 1496.0), (INLET, 23.0)]
    assert runs.read_text() == "sdr elist full\n"


@pytest.mark.parametrize(
    ("line", "outcome"),
    [
        ("Pwr | 30h | ns | 21.1 | No Reading\n", "no data: the sensor 'Pwr' has no reading now"),
        (
            "Pwr | 30h | ok | 21.1 | 41 degrees C\n",
            "IpmiToolError: the sensor 'Pwr' does not read in Watts",
        ),
        (
            "Pwr | 30h | ok | 21.1 | 0 Watts\n",
            "no data: the sensor 'Pwr' reads 0 W, not a node's power",
        ),
    ],
)
def test_a_power_sensor_without_a_watts_reading(
    node: dict[str, Path], line: str, outcome: str
) -> None:
    replaying(node["bin"], "ipmitool", "", sdr=line)
    state = SourceRunner(source(node, power_sensor="Pwr", inlet=False), 30).poll_once()
    assert (state.samples, state.reason) == ((), outcome)


# --- a reading that stops changing -------------------------------------------------------


def test_a_dcmi_reading_unchanged_for_frozen_after_reads_down_and_serves_nothing(
    node: dict[str, Path],
) -> None:
    clock = FakeClock()
    replaying(node["bin"], "ipmitool", recorded("ipmitool"))
    runner = SourceRunner(source(node, clock, inlet=False, frozen_after="2m"), 30)
    for _ in range(4):  # 0, 30, 60, 90 s: the same 2578 W, still believed
        assert runner.poll_once().up
        clock.now += 30
    frozen = runner.poll_once()  # 120 s
    assert (frozen.up, frozen.failure, frozen.samples) == (False, "error", ())
    assert frozen.reason == (
        "FrozenReading: the power reading has stayed at 2578 W for 120s (frozen_after):"
        " the BMC no longer updates it"
    )
    assert runner.fresh_samples() == ()


def test_frozen_after_null_never_judges_a_reading_frozen(node: dict[str, Path]) -> None:
    clock = FakeClock()
    replaying(node["bin"], "ipmitool", recorded("ipmitool"))
    ipmi_source = source(node, clock, inlet=False, frozen_after=None)
    for _ in range(100):
        assert powers(ipmi_source.poll()) == [2578.0]
        clock.now += 30


def test_a_failed_poll_between_equal_readings_does_not_reset_the_frozen_clock(
    node: dict[str, Path],
) -> None:
    clock = FakeClock()
    tool = replaying(node["bin"], "ipmitool", recorded("ipmitool"))
    good = tool.read_text()
    ipmi_source = source(node, clock, inlet=False, frozen_after="1m")
    ipmi_source.poll()
    tool.write_text("#!/bin/sh\nexit 1\n")
    clock.now += 30
    with pytest.raises(PartialReading):
        ipmi_source.poll()
    tool.write_text(good)
    clock.now += 30
    with pytest.raises(FrozenReading, match="stayed at 2578 W"):
        ipmi_source.poll()
