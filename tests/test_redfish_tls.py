"""redfish source over real HTTPS on loopback: CEEMS' Redfish fixtures behind TLS.

The CA and the BMC's certificate (for IP 127.0.0.1) are made for this run
only, by tests/redfish_helpers.py's `make_pki`. The service is
tests/fake_redfish.py's, the same as tests/test_redfish.py's, given a server
TLS context.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.poller import SourceRunner
from exporter.sources.redfish import RedfishConfig, RedfishSource
from tests.fake_redfish import PASSWORD, FakeRedfish
from tests.redfish_helpers import POWER, FakeClock, make_pki, server_context, values


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The BMC's CA and certificate for 127.0.0.1, and a second CA that signed nothing."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def bmc(pki: dict[str, Path]) -> Iterator[FakeRedfish]:
    service = FakeRedfish(tls=server_context(pki)).start()
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
