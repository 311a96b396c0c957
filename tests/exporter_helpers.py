"""A real `llmgw-exporter` process on a loopback port the test picked, for the tests that
scrape it over HTTP (test_exporter_e2e, test_exporter_page)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import requests

from tests.promstack import free_port


@contextlib.contextmanager
def serving_exporter(
    args: list[str],
    env: Mapping[str, str],
    log: Path,
    ready: Callable[[str], bool],
    start_timeout_s: float = 30.0,
) -> Iterator[str]:
    """`python -m exporter ARGS --listen 127.0.0.1:PORT`, yielded as its URL once `ready`
    holds for a /metrics body; terminated after, failing the test if it ignores SIGTERM."""
    port = free_port()
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter", *args, "--listen", f"127.0.0.1:{port}"],
            env=dict(env),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                if ready(requests.get(f"{url}/metrics", timeout=2).text):
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                process.wait()
                pytest.fail(f"exporter never came up:\n{log.read_text()}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("exporter ignored SIGTERM for 10 s")
