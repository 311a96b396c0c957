"""A BMC on loopback: OpenIPMI's `ipmi_sim` answering IPMI 2.0 (RMCP+) on a UDP port the
test picked, for tests/test_ipmi_sim.py.

Its sensors are tests/fixtures/ipmi_sim/bmc.emu: a node power sensor in Watts ("Pwr
Consumption") and an inlet temperature sensor ("Inlet Temp"), each read by ipmi_sim every
second from a file in its working directory, so that `SimulatedBmc.set_power()` changes
what the BMC answers. The LAN side (lan.conf, ipmi_lan(5)) is written here, as its port is
the test's: one user, `llmgw`, of the `user` privilege (the read-only account the docs ask
for), and the IPMI 2.0 cipher suites ipmi_sim has (1 to 3; not 17, so `cipher_suite: 3`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "ipmi_sim"
EMULATOR_COMMANDS = FIXTURES / "bmc.emu"
USER = "llmgw"
PASSWORD = "rack-r12-bmc"
POWER_SENSOR = "Pwr Consumption"
INLET_SENSOR = "Inlet Temp"
#: The cipher suite both tools are given: ipmi_sim has no SHA-256 suite (17), and
#: ipmitool, left to choose, asks for the list first, which ipmi_sim never answers
#: (ipmitool gives up after 10 s and falls back to 3).
CIPHER_SUITE = 3
#: FreeIPMI's workaround for ipmi_sim's Open Session answer (it grants the requested
#: maximum privilege 0 back instead of the user's level, which FreeIPMI refuses as
#: "privilege level cannot be obtained for this user").
FREEIPMI_WORKAROUNDS = ["opensesspriv"]
#: The power step of the sensor (its SDR's M): readings are multiples of 4 W.
POWER_STEP_WATTS = 4

LAN_CONF = """\
# ipmi_lan(5): the simulated BMC's LAN channel, on loopback only.
name "llmgw-test-bmc"
set_working_mc 0x20
  startlan 1
    addr {address} {port}
    priv_limit admin
    # IPMI 1.5 authentication types per privilege (ipmitool and FreeIPMI use 2.0 here).
    allowed_auths_callback md5
    allowed_auths_user md5
    allowed_auths_operator md5
    allowed_auths_admin md5
    guid a123456789abcdefa123456789abcdef
  endlan
  # user number, enabled, name, password, maximum privilege, sessions, auth types
  user 2 true "{user}" "{password}" user 10 md5
"""


#: Loopback as /proc/net/udp and udp6 write it (32-bit words in the host's byte order).
PROC_NET_LOOPBACK = {
    "127.0.0.1": ("/proc/net/udp", "0100007F"),
    "::1": ("/proc/net/udp6", "00000000000000000000000001000000"),
}


def free_udp_port(address: str = "127.0.0.1") -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def udp_bound(address: str, port: int) -> bool:
    """Whether a socket is bound to ADDRESS:PORT over UDP (/proc/net/udp, udp6)."""
    table, hex_address = PROC_NET_LOOPBACK[address]
    wanted = f"{hex_address}:{port:04X}"
    with open(table) as lines:
        return any(line.split()[1] == wanted for line in list(lines)[1:])


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: `make debian-packages` installs it")
    return path


class SimulatedBmc:
    """One running ipmi_sim, its working directory, and how to reach it."""

    def __init__(self, directory: Path, address: str, port: int) -> None:
        self.directory = directory
        self.address = address
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.password_file = directory / "bmc-password"
        self.password_file.write_text(PASSWORD + "\n")
        self.password_file.chmod(0o600)

    def source_keys(self, tool: str, **keys: object) -> dict[str, object]:
        """`sources.ipmi` for this BMC, out-of-band through `tool`."""
        return {
            "host": self.address,
            "port": self.port,
            "user": USER,
            "password_file": str(self.password_file),
            "tool": binary(tool),
            "cipher_suite": CIPHER_SUITE,
            "workarounds": FREEIPMI_WORKAROUNDS,
            "power_sensor": POWER_SENSOR,
            "timeout": "5s",
            **keys,
        }

    def start(self, start_timeout_s: float = 30.0) -> None:
        state = self.directory / "state"
        state.mkdir(exist_ok=True)
        log = (self.directory / "ipmi_sim.log").open("ab")
        with log:
            self.process = subprocess.Popen(
                [
                    binary("ipmi_sim"),
                    "-c",
                    str(self.directory / "lan.conf"),
                    "-f",
                    str(EMULATOR_COMMANDS),
                    "-s",
                    str(state),
                    "-n",  # no console on stdin
                ],
                cwd=self.directory,  # the sensors' value files are relative to it
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + start_timeout_s
        while not udp_bound(self.address, self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"ipmi_sim never bound UDP {self.address} {self.port}:\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def log(self) -> str:
        path = self.directory / "ipmi_sim.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def write_power(self, watts: int) -> None:
        """What the power sensor reads from its next second on (a multiple of 4 W)."""
        assert watts % POWER_STEP_WATTS == 0, "the sensor reads in 4 W steps"
        assert watts <= 255 * POWER_STEP_WATTS, "an 8-bit reading: at most 1,020 W"
        self._write("power.val", watts)

    def write_inlet(self, celsius: int) -> None:
        self._write("inlet.val", celsius)

    def _write(self, name: str, value: int) -> None:
        # Whole, at once: ipmi_sim reads the file every second and must never see half.
        temporary = self.directory / f".{name}"
        temporary.write_text(f"{value}\n")
        os.replace(temporary, self.directory / name)

    def sensor_reading(self, name: str) -> float | None:
        """The sensor's value as ipmitool reads it now (None: no answer or no reading)."""
        argv = [
            binary("ipmitool"),
            *("-I", "lanplus", "-H", self.address, "-p", str(self.port)),
            *("-U", USER, "-f", str(self.password_file), "-L", "USER"),
            *("-C", str(CIPHER_SUITE), "sensor", "reading", name),
        ]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        except subprocess.TimeoutExpired:
            return None
        _, _, value = done.stdout.partition("|")
        try:
            return float(value)
        except ValueError:
            return None

    def set_power(self, watts: int, timeout_s: float = 30.0) -> None:
        """Write the power and wait until the BMC answers it (it reads the file each second)."""
        self.write_power(watts)
        deadline = time.monotonic() + timeout_s
        while self.sensor_reading(POWER_SENSOR) != watts:
            if time.monotonic() > deadline:
                pytest.fail(f"the simulated BMC never read {watts} W:\n{self.log()}")
            time.sleep(0.2)


@contextlib.contextmanager
def running_bmc(
    directory: Path, watts: int = 332, celsius: int = 23, address: str = "127.0.0.1"
) -> Iterator[SimulatedBmc]:
    """ipmi_sim on a UDP port of `address` (127.0.0.1 or ::1) picked here, reading `watts`
    and `celsius`; stopped after."""
    port = free_udp_port(address)
    directory.mkdir(parents=True, exist_ok=True)
    lan_conf = LAN_CONF.format(address=address, port=port, user=USER, password=PASSWORD)
    (directory / "lan.conf").write_text(lan_conf)
    bmc = SimulatedBmc(directory, address, port)
    bmc.write_power(watts)
    bmc.write_inlet(celsius)
    try:
        bmc.start()
        yield bmc
    finally:
        bmc.stop()
