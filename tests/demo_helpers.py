"""Running `llmgw-facility demo` as a process: its bound, its end and the URLs it prints,
shared by tests/test_demo.py and the session-wide demo of tests/demo_running.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The demo's own bound is a few minutes of wall time on a small shared machine.
DEMO_TIMEOUT_S = 300


def _finish(process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> int:
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"the demo did not finish in {timeout_s:.0f} s; its output:\n{log.read_text()}")


def _urls(text: str) -> dict[str, str]:
    return dict(
        re.findall(r"^\s+(simulator|Alertmanager|Prometheus|decider)\s+(http://\S+)$", text, re.M)
    )
