"""Load a YAML file into a pydantic model, reporting every error with its file and line.

Shared by agent.yaml and the decider's YAML files: a bad file is refused whole,
with all its errors at once (`path:line: field: reason`), never half-applied.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ValidationError

Model = TypeVar("Model", bound=BaseModel)
Location = tuple[str | int, ...]


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """`5s`, `500ms`, `2m`, `1h` or a plain number of seconds, as seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string such as 5s, 500ms, 2m")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration (examples: 5s, 500ms, 2m)")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError("a duration must be more than zero")
    return seconds


#: Seconds, written in YAML as `5s`, `500ms`, `2m` or a number.
Duration = Annotated[float, BeforeValidator(parse_duration)]


class ConfigError(Exception):
    """A configuration file that cannot be used; `str()` lists every problem, one a line."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__("\n".join(f"{path}:{problem}" for problem in problems))


def _to_python(
    node: yaml.Node, where: Location, lines: dict[Location, int], problems: list[str]
) -> Any:
    """Build plain Python from a composed YAML node, remembering each value's line."""
    lines[where] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node))
            if key in result:
                problems.append(f"{key_node.start_mark.line + 1}: duplicate key {key!r}")
            result[key] = _to_python(value_node, (*where, key), lines, problems)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, (*where, i), lines, problems) for i, item in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def _line_of(loc: Location, lines: dict[Location, int]) -> int:
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def load_model(path: Path, model: type[Model]) -> Model:
    """Parse and validate `path` as `model`; raise ConfigError naming every problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, [f"0: cannot read the file: {exc}"]) from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(path, [f"{line}: not valid YAML: {reason}"]) from exc
    lines: dict[Location, int] = {}
    duplicates: list[str] = []
    data = {} if root is None else _to_python(root, (), lines, duplicates)
    if duplicates:
        raise ConfigError(path, duplicates)
    problems: list[tuple[int, str]] = []
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            loc = tuple(error["loc"])
            field = ".".join(str(part) for part in loc) or "(top level)"
            problems.append((_line_of(loc, lines), f"{field}: {error['msg']}"))
        raise ConfigError(path, [f"{line}: {text}" for line, text in sorted(problems)]) from exc
