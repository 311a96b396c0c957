#!/usr/bin/env python3
"""Print the lowest versions pyproject.toml allows, one `name==version` a line, for pip.

    scripts/lowest_requirements.py [EXTRA ...] > lowest.txt

The project's dependencies and the named extras (`test`): each requirement's `>=` (or `==`)
bound is the version pinned. `make test-lowest` installs them into a second virtual
environment and runs the decider's API and the exporter's tests there, so that the lower
bounds are versions that work, not hopes (issue 18). A requirement without a lower bound is
an error: its lowest version would be whatever the registry holds first.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
#: A name, optional extras, then the version clauses (no markers in this project's list).
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def lowest(requirement: str) -> str:
    match = REQUIREMENT.match(requirement)
    if match is None or ";" in requirement:
        raise ValueError(f"{requirement!r}: not a plain `name>=version` requirement")
    name, extras, clauses = match.group(1), match.group(2) or "", match.group(3)
    for clause in clauses.split(","):
        found = re.match(r"^(>=|==)\s*(\S+)$", clause.strip())
        if found:
            return f"{name}{extras}=={found.group(2)}"
    raise ValueError(f"{requirement!r}: no lower bound (>= or ==) to install")


def main(extras: list[str]) -> int:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    try:
        pins = sorted({lowest(requirement) for requirement in requirements}, key=str.lower)
    except ValueError as error:
        print(f"pyproject.toml: {error}", file=sys.stderr)
        return 1
    print("\n".join(pins))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
