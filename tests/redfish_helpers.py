"""What the Redfish tests share: a clock the test moves, the samples read as a table, a
throwaway PKI (the test's own CA, and a certificate for 127.0.0.1 it signed), and DMTF's
mockup served by the real `sushy-static` (sushy-tools) over HTTPS.

The PKI is made with the `openssl` command (Debian package `openssl`, installed by
`make debian-packages`).
"""

from __future__ import annotations

import contextlib
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from exporter.samples import Sample
from tests.promstack import free_port

POWER = "llmgw_node_power_watts"
INLET = "llmgw_node_inlet_temperature_celsius"

#: DMTF's public-rackmount1 mockup, the parts the tests serve (tests/fixtures/redfish/README.md).
MOCKUP = Path(__file__).parent / "fixtures" / "redfish" / "public-rackmount1"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def values(samples: list[Sample]) -> dict[tuple[str, str], float]:
    out = {
        (s.metric, s.labels.get("source") or s.labels.get("sensor", "")): s.value for s in samples
    }
    assert len(out) == len(samples)
    return out


# --- the test's own PKI --------------------------------------------------------------------

OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = llmgw test CA
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""


def openssl(*args: str | Path, cwd: Path) -> None:
    command = shutil.which("openssl")
    assert command, "openssl is not installed: run `make debian-packages`"
    subprocess.run([command, *map(str, args)], cwd=cwd, check=True, capture_output=True)


def make_ca(where: Path, name: str) -> tuple[Path, Path]:
    """A throwaway CA: (certificate, key)."""
    (where / "openssl.cnf").write_text(OPENSSL_CONFIG)
    cert, key = where / f"{name}.pem", where / f"{name}.key"
    openssl(
        "req", "-x509", "-config", "openssl.cnf", "-extensions", "ca", "-subj", f"/CN={name}",
        "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", cwd=where,
    )  # fmt: skip
    return cert, key


def make_pki(where: Path) -> dict[str, Path]:
    """The BMC's CA (`ca`), its certificate for IP 127.0.0.1 (`cert`, `key`), and a second CA
    that signed nothing (`other_ca`)."""
    ca, ca_key = make_ca(where, "bmc-ca")
    other_ca, _ = make_ca(where, "other-ca")
    openssl(
        "req", "-new", "-config", "openssl.cnf", "-subj", "/CN=127.0.0.1",
        "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "bmc.key", "-out", "bmc.csr", cwd=where,
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", "bmc.csr", "-CA", ca, "-CAkey", ca_key, "-set_serial", "2",
        "-days", "2", "-extfile", "openssl.cnf", "-extensions", "server", "-out", "bmc.pem",
        cwd=where,
    )  # fmt: skip
    return {"ca": ca, "other_ca": other_ca, "cert": where / "bmc.pem", "key": where / "bmc.key"}


def server_context(pki: dict[str, Path]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["cert"], pki["key"])
    return context


# --- sushy-static: DMTF's mockup served as a BMC ------------------------------------------


@dataclass
class SushyStatic:
    """A running `sushy-static`: a plain http.server that serves each `DIR/…/index.json`
    at `/redfish/v1/…` for GET, answers any POST or PATCH with 204 (no session, no
    token), DELETE with 501, and checks no credentials. It prints each request's headers
    and bodies to its stdout (`log`), its access log to stderr (`access_log`)."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    access_log: Path

    def requested(self, method: str = "GET") -> list[str]:
        """The paths asked with `method`, in order, from its access log."""
        paths = []
        for line in self.access_log.read_text().splitlines():
            if f'"{method} ' in line:
                paths.append(line.split(f'"{method} ', 1)[1].split(" ", 1)[0])
        return paths

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL) and wait for it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def sushy_static_program() -> str:
    """The venv's console script (sushy-tools is in the test extra)."""
    program = Path(sys.executable).parent / "sushy-static"
    if not program.exists():
        pytest.fail(f"{program} is missing: sushy-tools is in the test extra (`make venv`)")
    return str(program)


@contextlib.contextmanager
def serving_sushy_static(
    mockup: Path, pki: dict[str, Path], logs: Path, start_timeout_s: float = 30.0
) -> Iterator[SushyStatic]:
    """`sushy-static --mockup-files MOCKUP` over HTTPS with the PKI's certificate, on a
    loopback port picked here; yielded once it serves the service root to a client that
    trusts the PKI's CA; stopped after, whatever the test did."""
    port = free_port()
    log, access_log = logs / "sushy-static.out", logs / "sushy-static.err"
    with log.open("wb") as out, access_log.open("wb") as err:
        command = [sushy_static_program(), "--interface", "127.0.0.1", "--port", str(port)]
        command += ["--mockup-files", str(mockup)]
        command += ["--ssl-certificate", str(pki["cert"]), "--ssl-key", str(pki["key"])]
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=err,
        )
    server = SushyStatic(f"https://127.0.0.1:{port}", process, log, access_log)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            with contextlib.suppress(requests.ConnectionError):
                answer = requests.get(f"{server.url}/redfish/v1/", verify=str(pki["ca"]), timeout=5)
                if answer.status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"sushy-static did not serve {server.url} (exit status {process.poll()}):\n"
                    + access_log.read_text()
                )
            time.sleep(0.1)
        yield server
    finally:
        server.stop()
