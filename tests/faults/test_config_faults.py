"""Configuration files built to hurt, or truncated (issue 16 items 4, 8, 11, 13), read by the
real processes: `llmgw-facility check-config`, a running `llmgw-decider` reloading by
`POST /-/reload` and SIGHUP, `llmgw-exporter` and the simulator at start.

- YAML alias bombs, a recursive alias and deep nesting: refused at once with file:line
  (check-config exit 1 as docs/facility.md says, the exporter and the simulator exit 2, a
  reload 400 within a second while placements go on and the running file stays);
- an empty facility file, or one that budgets none of the running domains: a reload refused
  with the reason, the running file kept, unless `POST /-/reload?force=true`;
- non-finite and absurd figures, and text or booleans where a number goes: refused with
  file:line in the facility file, decider.yaml, agent.yaml and a scenario;
- a token file others can write: refused; one every user can read: a warning.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.decider_harness import (
    REPO,
    TOKEN,
    Decider,
    FakePrometheus,
    Readings,
    decider_yaml,
    poll,
    running,
    serving,
)
from tests.promstack import free_port

NODES = ["n1", "n2"]
FACILITY: dict[str, Any] = {
    "mode": "enforce",
    "domains": {"rack/r1": {"cap_watts": 20000}, "rack/r2": {"cap_watts": 8000}},
}
REPLICA = {"model": "llama", "profile": "tp1", "gpus": 1, "power_watts": 900}
#: Every process here must refuse its file at once; a bomb expanded would take minutes.
PROCESS_TIMEOUT_S = 30
RELOAD_BOUND_S = 1.0

# --- files built to hurt ------------------------------------------------------------------

#: Nine levels of ten aliases each: 10^9 values if expanded (the issue's was 370 bytes).
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 10)}]\n" for level in range(1, 10)
)
BOMBS: dict[str, tuple[str, int, str]] = {  # text, line, reason
    "nested aliases": (ALIAS_BOMB, 4, "aliases stand for more than 10000 values"),
    "a recursive alias": ("mode: enforce\na: &x [*x]\n", 2, "a recursive alias"),
    "deep nesting": ("mode: enforce\na: " + "[" * 5000 + "]" * 5000 + "\n", 2, "nested more than"),
    "many aliases": (
        "mode: enforce\nx: &x 1\n" + "".join(f"k{i}: *x\n" for i in range(200)),
        103,
        "more than 100 aliases",
    ),
}


def run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *map(str, command)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT_S,
    )


def check_config(*arguments: str | Path) -> subprocess.CompletedProcess[str]:
    return run("-m", "llmgw_facility.cli", "check-config", *arguments)


def assert_refused(
    result: subprocess.CompletedProcess[str], status: int, where: str, reason: str
) -> None:
    assert result.returncode == status, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert where in result.stderr, result.stderr[-2000:]
    assert reason in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("bomb", BOMBS, ids=list(BOMBS))
def test_check_config_refuses_an_alias_bomb_at_once_with_file_and_line(tmp_path, bomb):
    text, line, reason = BOMBS[bomb]
    path = tmp_path / "facility.yaml"
    path.write_text(text)
    started = time.monotonic()
    assert_refused(check_config("--facility", path), 1, f"{path}:{line}: not valid YAML", reason)
    assert time.monotonic() - started < PROCESS_TIMEOUT_S


def test_check_config_refuses_a_decider_yaml_that_is_a_bomb(tmp_path):
    path = tmp_path / "decider.yaml"
    path.write_text("mode: &m [*m]\n")
    assert_refused(check_config("--decider-config", path), 1, f"{path}:1:", "a recursive alias")


@pytest.mark.parametrize("bomb", ["nested aliases", "a recursive alias"])
def test_the_exporter_refuses_an_alias_bomb_with_exit_2(tmp_path, bomb):
    text, line, reason = BOMBS[bomb]
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    result = run("-m", "exporter", "--config", path, "--sysfs", tmp_path, "--once")
    assert_refused(result, 2, f"{path}:{line}: not valid YAML", reason)


def test_the_simulator_refuses_an_alias_bomb_with_exit_2(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(ALIAS_BOMB)
    result = run("-m", "llmgw_facility.cli", "simulate", "--scenario", path)
    assert_refused(result, 2, f"{path}:4: not valid YAML", "aliases stand for more than")


# --- a running decider: reload ------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    with serving(
        Readings(
            membership={"n1": ["rack/r1"], "n2": ["rack/r2"]},
            inventory=["rack/r1", "rack/r2"],
            measured={"rack/r1": 0, "rack/r2": 0},
            conditions={"rack/r1": "ok", "rack/r2": "ok"},
            gpus=dict.fromkeys(NODES, 8),
            limits=dict.fromkeys(NODES, 700.0),
        )
    ) as server:
        yield server


@pytest.fixture
def decider(tmp_path: Path, fake: FakePrometheus) -> Iterator[Decider]:
    with running(tmp_path / "decider", fake.url, FACILITY) as started:
        yield started


def assert_running_file_kept(decider: Decider) -> None:
    assert decider.running
    assert decider.domain("rack/r1")["cap_watts"] == 20000
    answer = decider.place(REPLICA, NODES)
    assert answer["mode"] == "enforce"
    assert answer["order"] == NODES


def reload(decider: Decider, query: str = "") -> tuple[float, Any]:
    started = time.monotonic()
    response = decider.post(f"/-/reload{query}")
    return time.monotonic() - started, response


@pytest.mark.parametrize("bomb", BOMBS, ids=list(BOMBS))
def test_reloading_an_alias_bomb_is_refused_at_once_and_the_running_file_kept(decider, bomb):
    text, line, reason = BOMBS[bomb]
    decider.write_facility(text)
    seconds, response = reload(decider)
    assert response.status_code == 400, response.text
    assert seconds < RELOAD_BOUND_S, seconds
    [problem] = response.json()["problems"]
    assert problem.startswith(f"{decider.facility_path}:{line}: not valid YAML: "), problem
    assert reason in problem
    assert_running_file_kept(decider)


def test_reloading_an_empty_facility_file_is_refused(decider):
    decider.write_facility("")  # a truncated write
    response = reload(decider)[1]
    assert response.status_code == 400, response.text
    assert response.json()["problems"] == [f"{decider.facility_path}:1: mode: Field required"]
    assert_running_file_kept(decider)
    # Not even when forced: an empty file is not a facility file.
    assert reload(decider, "?force=true")[1].status_code == 400
    assert_running_file_kept(decider)


def test_reloading_a_file_that_budgets_none_of_the_running_domains_needs_force(decider):
    decider.write_facility({"mode": "enforce", "domains": {"rack/r1": {}, "rack/r9": {}}})
    response = reload(decider)[1]
    assert response.status_code == 400, response.text
    [problem] = response.json()["problems"]
    assert problem.startswith(
        f"{decider.facility_path}: it budgets none of the 2 domains the running file budgets "
        "(rack/r1, rack/r2)"
    ), problem
    assert "POST /-/reload?force=true (SIGHUP never forces)" in problem
    assert_running_file_kept(decider)

    # SIGHUP never forces.
    decider.signal(signal.SIGHUP)
    poll(lambda: decider.log().count("it budgets none of the 2 domains") >= 2, "SIGHUP refused")
    assert_running_file_kept(decider)

    # Forced, with the token: applied, and said so in the log.
    assert reload(decider, "?force=true")[1].status_code == 200
    assert decider.domain("rack/r1")["cap_watts"] is None
    assert "reload forced: " in decider.log()


def test_a_file_that_keeps_one_running_budget_is_applied(decider):
    decider.write_facility({"mode": "enforce", "domains": {"rack/r2": {"cap_watts": 9000}}})
    assert reload(decider)[1].status_code == 200
    assert decider.domain("rack/r2")["cap_watts"] == 9000
    assert decider.domain("rack/r1")["cap_watts"] is None


# --- figures and types --------------------------------------------------------------------

BAD_FIGURES = {
    ".inf": "is not a finite number",
    "-.inf": "is not a finite number",
    ".nan": "is not a finite number",
    "1.0e+308": "is larger than any figure of these files",
    "100000000000000000000": "is larger than any figure of these files",
    "1e308": "'1e308' is text here",  # YAML 1.1 reads a float without a dot as text
    "20000000000": "less than or equal to 10000000000",  # 20 GW: no domain draws that
}


@pytest.mark.parametrize("figure", BAD_FIGURES)
def test_a_non_finite_or_absurd_cap_is_refused_with_its_line(tmp_path, figure):
    path = tmp_path / "facility.yaml"
    path.write_text(f"mode: enforce\ndomains:\n  rack/r1: {{cap_watts: {figure}}}\n")
    assert_refused(check_config("--facility", path), 1, f"{path}:3: ", BAD_FIGURES[figure])


STRICT = {  # facility text, line, field
    "a quoted margin": ("defaults: {margin: '0.1'}\n", "defaults.margin"),
    "quoted GPUs": ("profiles: {p: {gpus: '4'}}\n", "profiles.p.gpus"),
    "true for GPUs": ("profiles: {p: {gpus: true}}\n", "profiles.p.gpus"),
    "a float for GPUs": ("profiles: {p: {gpus: 4.0}}\n", "profiles.p.gpus"),
    "text for a switch": ("shedding: {enabled: 'yes'}\n", "shedding.enabled"),
    "text for a rating": ("domains: {pdu/a: {phases: {L1: {rating_watts: ' 4 '}}}}\n", "rating"),
}


@pytest.mark.parametrize("case", STRICT, ids=list(STRICT))
def test_text_or_booleans_where_a_number_goes_are_refused(tmp_path, case):
    text, field = STRICT[case]
    path = tmp_path / "facility.yaml"
    path.write_text("mode: enforce\n" + text)
    assert_refused(check_config("--facility", path), 1, f"{path}:2: ", field)


def test_yaml_integers_are_numbers_where_a_field_takes_floats(tmp_path):
    path = tmp_path / "facility.yaml"
    path.write_text(
        "mode: enforce\n"
        "defaults: {margin: 0, derating: 1}\n"
        "domains: {rack/r1: {cap_watts: 13840}}\n"
    )
    result = check_config("--facility", path)
    assert result.returncode == 0, result.stderr


def test_decider_yaml_refuses_bad_figures_and_types_with_their_lines(tmp_path):
    path = tmp_path / "decider.yaml"
    path.write_text(
        "prometheus:\n"
        "  timeout: .inf\n"  # 2
        "  retries: '1'\n"  # 3
        "refresh_interval: 1.0e+300\n"  # 4
        "reservation_ttl: 100000h\n"  # 5: more than a year
    )
    result = check_config("--decider-config", path)
    assert_refused(result, 1, f"{path}:2: .inf is not a finite number", "")
    assert f"{path}:4: 1.0e+300 is larger than any figure" in result.stderr
    path.write_text("prometheus:\n  retries: '1'\nreservation_ttl: 100000h\n")
    result = check_config("--decider-config", path)
    assert_refused(result, 1, f"{path}:2: prometheus.retries: Input should be a valid integer", "")
    assert f"{path}:3: reservation_ttl: Value error, '100000h' is more than a year" in result.stderr
    path.write_text(
        "prometheus:\n  url: https://127.0.0.1:9090\n  tls_config: {insecure_skip_verify: 'yes'}\n"
    )
    result = check_config("--decider-config", path)
    assert_refused(
        result,
        1,
        f"{path}:3: prometheus.tls_config.insecure_skip_verify: Input should be a valid boolean",
        "",
    )


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("overhead_watts: .inf\n", "1: .inf is not a finite number"),
        ("overhead_watts: '250'\n", "1: overhead_watts: Input should be a valid number"),
        ("bmc_includes_gpus: 1\n", "1: bmc_includes_gpus: Input should be a valid boolean"),
        (
            "sources:\n  gpu: {enabled: 'yes'}\n",
            "2: sources.gpu.enabled: Input should be a valid boolean",
        ),
    ],
    ids=["infinite", "quoted", "a number for a boolean", "text for a source's switch"],
)
def test_agent_yaml_refuses_bad_figures_and_types_with_exit_2(tmp_path, text, where):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    result = run("-m", "exporter", "--config", path, "--sysfs", tmp_path, "--once")
    assert_refused(result, 2, f"{path}:{where}", "")


def test_a_scenario_refuses_text_where_a_number_goes_with_exit_2(tmp_path):
    text = (REPO / "examples" / "scenarios" / "demo.yaml").read_text()
    lines = text.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith("time_scale: "))
    lines[index] = "time_scale: '30'"
    path = tmp_path / "scenario.yaml"
    path.write_text("\n".join(lines) + "\n")
    result = run("-m", "llmgw_facility.cli", "simulate", "--scenario", path)
    assert result.returncode == 2, result.stderr
    assert f"{path}:{index + 1}: time_scale: Input should be a valid number" in result.stderr


def test_a_scenario_refuses_a_non_finite_figure_with_exit_2(tmp_path):
    text = (REPO / "examples" / "scenarios" / "demo.yaml").read_text()
    lines = text.splitlines()
    # Time running infinitely fast: refused at its line before anything else is checked.
    index = next(i for i, line in enumerate(lines) if line.startswith("time_scale: "))
    lines[index] = "time_scale: .inf"
    path = tmp_path / "scenario.yaml"
    path.write_text("\n".join(lines) + "\n")
    result = run("-m", "llmgw_facility.cli", "simulate", "--scenario", path)
    assert_refused(result, 2, f"{path}:{index + 1}: .inf is not a finite number", "")


# --- the token file -----------------------------------------------------------------------


def start_once(directory: Path) -> subprocess.CompletedProcess[str]:
    """Run `llmgw-decider` in `directory` (nothing listens at its Prometheus); it must exit
    (killed past PROCESS_TIMEOUT_S, the test failing, if it serves instead)."""
    (directory / "facility.yaml").write_text(yaml.safe_dump(FACILITY))
    config = decider_yaml(
        f"http://127.0.0.1:{free_port()}", listen=f"127.0.0.1:{free_port()}", token=True
    )
    (directory / "decider.yaml").write_text(yaml.safe_dump(config))
    return run("-m", "decider.main", "--config", directory / "decider.yaml")


@pytest.mark.parametrize(
    ("mode", "who"),
    [(0o620, "its group"), (0o602, "every user")],
    ids=["group-writable", "world-writable"],
)
def test_a_token_file_others_can_write_is_refused(tmp_path, mode, who):
    token = tmp_path / "decider.token"
    token.write_text(TOKEN + "\n")
    os.chmod(token, mode)
    result = start_once(tmp_path)
    assert_refused(
        result, 2, f"{token}:1: the token file is writable by {who} (mode {mode:04o})", ""
    )


def test_a_token_file_every_user_can_read_is_taken_with_a_warning(decider):
    token = decider.directory / "decider.token"
    assert os.stat(token).st_mode & 0o777 == 0o644  # as the harness writes it
    assert f"WARNING decider.service: {token}: the token file is readable by every user" in (
        decider.log()
    )
    os.chmod(token, 0o600)
    assert reload(decider)[1].status_code == 200
    os.chmod(token, 0o664)  # group-writable: a reload keeps the running token
    response = reload(decider)[1]
    assert response.status_code == 400, response.text
    assert "the token file is writable by its group" in response.json()["problems"][0]
    assert_running_file_kept(decider)
