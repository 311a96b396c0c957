"""Facility files written and loaded in a test's folder (tests/test_facility.py), and the
example file: shared with the phases' tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from decider import facility as facility_file
from decider.facility import Facility
from llmgw_common.yamlfile import ConfigError

EXAMPLE = Path(__file__).parent.parent / "examples" / "facility.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "facility.yaml"
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str) -> Facility:
    return facility_file.load(write(tmp_path, text))


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    return str(caught.value)
