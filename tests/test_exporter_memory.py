"""What the running exporter holds in memory (docs/benchmarks.md, "Where the memory goes").

The exporter's resident memory is almost all code loaded at start, so its 40 MiB target
(`make bench`) is kept by not loading what a node does not use: a package that only one
feature needs is imported when that feature is first used, never at start. These tests run
the exporter as a node starts it (every default source on, one reading each, `--once`) and
list the packages the process then holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

#: Package -> what loads it, when it is first needed; none of them is loaded at start.
LOADED_ON_DEMAND = {
    "jinja2": "exporter/web.py, at the first request for the node page (/)",
    "markupsafe": "jinja2's escaping, with it",
    "requests": "exporter/sources/redfish.py, when the redfish source first talks to a BMC",
    "urllib3": "requests, with it",
    "exporter.sources.amd_kfd": "exporter/sources/units.py, when the units source starts",
}

#: Runs the exporter's own main() and reports, in a line of stderr of its own, which of the
#: packages it was given were loaded by the time main() returned.
PROBE = """
import json, sys
from exporter.main import main
watched = json.loads(sys.argv[1])
status = main(sys.argv[2:])
print(json.dumps({"status": status, "loaded": sorted(set(watched) & set(sys.modules))}),
      file=sys.stderr)
"""


def run_once(tmp_path: Path) -> tuple[int, list[str], str]:
    """One `--once` run of the default sources over an empty sysfs: main()'s exit status,
    the watched packages loaded, the exposition printed."""
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    config = tmp_path / "agent.yaml"
    # The default agent.yaml, every source on as shipped; only the node's name is set.
    config.write_text(yaml.safe_dump({"node": "memory-test"}))
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            json.dumps(sorted(LOADED_ON_DEMAND)),
            "--once",
            "--config",
            str(config),
            "--sysfs",
            str(sysfs),
            "--log-level",
            "WARNING",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    answers = [line for line in result.stderr.splitlines() if line.startswith('{"status"')]
    assert answers, f"no answer from the probe (exit {result.returncode}):\n{result.stderr}"
    answer = json.loads(answers[-1])
    return answer["status"], answer["loaded"], result.stdout


def test_a_started_exporter_has_not_loaded_what_only_a_feature_needs(tmp_path):
    status, loaded, exposition = run_once(tmp_path)
    assert status == 0
    # The run did poll: each default source said whether it is up.
    assert 'llmgw_exporter_source_up{node="memory-test",source="hwmon"}' in exposition
    assert loaded == [], "loaded at start: " + "; ".join(
        f"{name} (needed by {LOADED_ON_DEMAND[name]})" for name in loaded
    )
