"""One running demo (`llmgw-facility demo`, llmgw_sim/demo) shared by the test modules that
look at it: the dashboards' queries (tests/test_dashboards.py) and the status page
(tests/test_status_page.py).

The demo runs as its own process, as tests/test_demo.py runs it, without `--once`: its
story is told, then it stays up until SIGINT. Its temporary directory is put under the
test's own (TMPDIR), which is how the test finds the decider's bearer token. Started once
per session, by the first module that asks; stopped at the session's end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.demo_helpers import DEMO_TIMEOUT_S, REPO, _finish, _urls


@dataclass
class RunningDemo:
    urls: dict[str, str]  # simulator, Alertmanager, Prometheus, decider
    token: str
    log: Path
    process: subprocess.Popen[bytes]

    @property
    def prometheus(self) -> str:
        return self.urls["Prometheus"]

    @property
    def decider(self) -> str:
        return self.urls["decider"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            _finish(self.process, self.log, 60)


_running: RunningDemo | None = None


def _start(directory: Path) -> RunningDemo:
    tmp = directory / "tmp"
    tmp.mkdir(parents=True)
    log = directory / "demo.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "llmgw_facility.cli", "demo"],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp)},
        )
    deadline = time.monotonic() + DEMO_TIMEOUT_S
    while "the story is told" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            pytest.fail(f"the demo did not tell its story:\n{log.read_text()}")
        time.sleep(0.2)
    urls = _urls(log.read_text())
    tokens = list(tmp.glob("llmgw-demo-*/decider/decider.token"))
    assert len(tokens) == 1, tokens
    return RunningDemo(urls, tokens[0].read_text().strip(), log, process)


def shared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RunningDemo:
    """The session's running demo, started on first use (call from a session fixture)."""
    global _running
    if _running is None or _running.process.poll() is not None:
        _running = _start(tmp_path_factory.mktemp("demo"))
        request.addfinalizer(_running.stop)
    return _running
