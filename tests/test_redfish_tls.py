"""redfish source over real HTTPS on loopback: CEEMS' Redfish fixtures behind TLS.

The CA and the BMC's certificate (for IP 127.0.0.1) are made here, for this
run only, with the `openssl` command (Debian package `openssl`, installed by
`make debian-packages`). The service is tests/fake_redfish.py's, the same as
tests/test_redfish.py's, given a server TLS context.
"""

from __future__ import annotations

import logging
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.poller import SourceRunner
from exporter.sources.redfish import RedfishConfig, RedfishSource
from tests.fake_redfish import PASSWORD, FakeRedfish
from tests.redfish_helpers import POWER, FakeClock, values

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


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The BMC's CA and certificate for 127.0.0.1, and a second CA that signed nothing."""
    where = tmp_path_factory.mktemp("pki")
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


@pytest.fixture
def bmc(pki: dict[str, Path]) -> Iterator[FakeRedfish]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["cert"], pki["key"])
    service = FakeRedfish(tls=context).start()
    assert service.url.startswith("https://127.0.0.1:")
    yield service
    service.stop()


def runner(bmc: FakeRedfish, credentials: Path, tls_verify: object) -> SourceRunner:
    config = RedfishConfig.model_validate(
        {"url": bmc.url, "credentials_file": credentials, "timeout": 2, "tls_verify": tls_verify}
    )
    return SourceRunner(RedfishSource(Path("/nonexistent"), config, FakeClock()), 30)


def test_the_bmc_ca_as_tls_verify_gives_readings(
    bmc: FakeRedfish, credentials: Path, pki: dict[str, Path]
) -> None:
    state = runner(bmc, credentials, str(pki["ca"])).poll_once()
    assert state.up, state.reason
    assert values(list(state.samples)) == {(POWER, "redfish"): 344.0}
    assert bmc.logins() == 1  # the session login went over the verified connection


@pytest.mark.parametrize("trusted", ["system", "other_ca"])
def test_an_untrusted_certificate_is_a_clear_failure_with_no_series(
    bmc: FakeRedfish,
    credentials: Path,
    pki: dict[str, Path],
    caplog: pytest.LogCaptureFixture,
    trusted: str,
) -> None:
    tls_verify = True if trusted == "system" else str(pki[trusted])
    with caplog.at_level(logging.DEBUG):
        state = runner(bmc, credentials, tls_verify).poll_once()
    assert (state.up, state.samples) == (False, ())
    assert f"the BMC at {bmc.url} presented a certificate not trusted" in state.reason
    assert "unable to get local issuer certificate" in state.reason
    assert "tls_verify" in state.reason  # what to change
    assert bmc.logins() == 0  # the password never left for an unverified peer
    assert PASSWORD not in caplog.text + state.reason


def test_tls_verify_false_reads_and_warns_once(
    bmc: FakeRedfish, credentials: Path, pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Also with REQUESTS_CA_BUNDLE set, which a requests Session lets override its `verify`
    (psf/requests#3829): the source passes `verify` with every request."""
    with pytest.MonkeyPatch.context() as env, caplog.at_level(logging.DEBUG):
        env.setenv("REQUESTS_CA_BUNDLE", str(pki["other_ca"]))
        poller = runner(bmc, credentials, False)
        states = [poller.poll_once() for _ in range(3)]
    assert all(state.up for state in states), states[-1].reason
    assert values(list(states[-1].samples)) == {(POWER, "redfish"): 344.0}
    assert caplog.text.count(f"the certificate of {bmc.url} is not verified") == 1
    assert PASSWORD not in caplog.text
