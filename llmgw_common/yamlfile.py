"""Load a YAML file into a pydantic model, reporting every error with its file and line.

Shared by agent.yaml, the decider's YAML files and the simulator's scenarios: a bad file is
refused whole, with all its errors at once (`path:line: field: reason`), never half-applied.

What a file may hold is bounded before any of it is built (`BoundedLoader`), so that a
few hundred bytes cannot cost minutes and gigabytes (issue 16):

- at most `MAX_ALIASES` aliases (`*name`), standing for at most `MAX_ALIASED_VALUES` values
  in all: a "billion laughs" file of nested aliases is refused, not expanded;
- no alias inside the value it names (`a: &x [*x]`, a value that contains itself);
- at most `MAX_DEPTH` levels of nesting, aliases' values counted where they are used.

Every number must be finite and at most `LARGEST_FIGURE` in size (no budget, duration or
count of these files comes near it; `.inf` or `1.0e+308` is a mistake, and would reach
the decider's answers as `Infinity`, which strict JSON parsers refuse).

Each model says how strict its types are (pydantic's strict mode, as decider.facility's);
where a number is refused as quoted text (`margin: '0.1'`), the message says so.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, Strict, ValidationError

Model = TypeVar("Model", bound=BaseModel)
Location = tuple[str | int, ...]

#: Aliases one file may use, and how many values (scalars and collections) they may stand
#: for in all. Nothing in these files needs more; a bomb needs far more.
MAX_ALIASES = 100
MAX_ALIASED_VALUES = 10_000
#: Levels of nesting, counting the values aliases stand for where they are used. The deepest
#: file of the project nests 6 levels.
MAX_DEPTH = 32
#: The largest number any of these files may hold: 10^15 W is a million times the biggest
#: site there is, 10^15 s thirty million years.
LARGEST_FIGURE = 1e15
#: The longest duration a file may set: a year.
LONGEST_DURATION_S = 366 * 24 * 3600.0

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """`5s`, `500ms`, `2m`, `1h`, `7d` or a plain number of seconds, as seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string such as 5s, 500ms, 2m")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration (examples: 5s, 500ms, 2m)")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a finite duration")
    if seconds <= 0:
        raise ValueError("a duration must be more than zero")
    if seconds > LONGEST_DURATION_S:
        raise ValueError(f"{value!r} is more than a year, longer than any setting here")
    return seconds


#: Seconds, written in YAML as `5s`, `500ms`, `2m`, `7d` or a number.
Duration = Annotated[float, BeforeValidator(parse_duration)]

#: A file's path in a model with strict types: YAML has no path type, so its text is taken.
FilePath = Annotated[Path, Strict(False)]


class ConfigError(Exception):
    """A configuration file that cannot be used; `str()` lists every problem, one a line."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__("\n".join(f"{path}:{problem}" for problem in problems))


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing (ComposerError at the offending line) what would make
    building the document's values cost more than its size: see the module's bounds.

    It composes nodes without expanding aliases (an alias is the node it names, shared),
    so each bound is checked before anything is built from the nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._aliased_values = 0
        #: Anchors whose value is still being composed: an alias to one is recursive.
        self._open_anchors: set[str] = set()
        #: Per node (by id): (values in it, counting itself; its levels of nesting).
        self._extents: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            return self._compose_alias(parent, index, event)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested more than {MAX_DEPTH} levels deep", event.start_mark
            )
        anchor = event.anchor
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open_anchors.discard(anchor)

    def _compose_alias(self, parent: yaml.Node | None, index: Any, event: Any) -> yaml.Node:
        def refuse(problem: str) -> yaml.composer.ComposerError:
            return yaml.composer.ComposerError(None, None, problem, event.start_mark)

        if event.anchor in self._open_anchors:
            raise refuse(f"alias *{event.anchor} is inside the value it names (a recursive alias)")
        node: yaml.Node = super().compose_node(parent, index)  # refuses an undefined alias
        self._aliases += 1
        if self._aliases > MAX_ALIASES:
            raise refuse(f"more than {MAX_ALIASES} aliases")
        values, levels = self._extent(node)
        self._aliased_values += values
        if self._aliased_values > MAX_ALIASED_VALUES:
            raise refuse(
                f"aliases stand for more than {MAX_ALIASED_VALUES} values in all "
                "(nested aliases multiply)"
            )
        if self._depth + levels > MAX_DEPTH:
            raise refuse(f"alias *{event.anchor} nests its value more than {MAX_DEPTH} levels deep")
        return node

    def _extent(self, node: yaml.Node) -> tuple[int, int]:
        """Values and levels of a complete node; each node worked out once, so shared nodes
        (aliases) cost their size once here however often they are used."""
        known = self._extents.get(id(node))
        if known is not None:
            return known
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        parts = [self._extent(child) for child in children]
        extent = (
            1 + sum(values for values, _ in parts),
            1 + max((lv for _, lv in parts), default=0),
        )
        self._extents[id(node)] = extent
        return extent


def _scalar(node: yaml.Node, loader: BoundedLoader, problems: list[str]) -> Any:
    """A scalar's value, if it is one these files take: text, a finite number of a sane size,
    a boolean or null (a problem noted otherwise)."""
    line = node.start_mark.line + 1
    if node.tag == "tag:yaml.org,2002:merge":
        problems.append(f"{line}: a merge key (<<) is not supported: write the keys out")
        return None
    try:
        value = loader.construct_object(node)
    except (yaml.YAMLError, ValueError, TypeError) as exc:  # a tag its value does not fit
        reason = getattr(exc, "problem", None) or str(exc)
        problems.append(f"{line}: {node.value!r} cannot be read as {node.tag}: {reason}")
        return None
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        if not math.isfinite(value):
            problems.append(f"{line}: {node.value} is not a finite number")
        elif abs(value) > LARGEST_FIGURE:
            problems.append(
                f"{line}: {node.value} is larger than any figure of these files "
                f"(at most {LARGEST_FIGURE:g})"
            )
        return value
    problems.append(
        f"{line}: {node.value!r} reads as a {type(value).__name__}, which no setting takes; "
        "quote it for text"
    )
    return None


def _to_python(
    node: yaml.Node,
    loader: BoundedLoader,
    where: Location,
    lines: dict[Location, int],
    problems: list[str],
) -> Any:
    """Build plain Python from a composed YAML node, remembering each value's line."""
    lines[where] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                problems.append(f"{key_line}: a key must be a plain value, not a list or mapping")
                continue
            key = _scalar(key_node, loader, problems)
            if key in result:
                problems.append(f"{key_line}: duplicate key {key!r}")
            result[key] = _to_python(value_node, loader, (*where, key), lines, problems)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _to_python(item, loader, (*where, i), lines, problems)
            for i, item in enumerate(node.value)
        ]
    return _scalar(node, loader, problems)


def _line_of(loc: Location, lines: dict[Location, int]) -> int:
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def _compose(path: Path, text: str) -> tuple[yaml.Node | None, BoundedLoader]:
    loader = BoundedLoader(text)
    try:
        return loader.get_single_node(), loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(path, [f"{line}: not valid YAML: {reason}"]) from exc
    finally:
        loader.dispose()


def _problem(error: Any, lines: dict[Location, int]) -> tuple[int, str]:
    loc = tuple(error["loc"])
    field = ".".join(str(part) for part in loc) or "(top level)"
    message = error["msg"]
    if isinstance(error.get("input"), str) and error["type"] in (
        "float_type",
        "int_type",
        "bool_type",
    ):
        message += (
            f"; {error['input']!r} is text here: write the number without quotes (YAML reads "
            "1e3 as text: write 1000 or 1.0e+3)"
        )
    return _line_of(loc, lines), f"{field}: {message}"


def load_text(text: str) -> Any:
    """Plain Python from YAML that is no settings file (rules the project writes and reads
    back), within the same bounds as `load_model`; raises yaml.YAMLError past one."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_model(path: Path, model: type[Model], required: tuple[str, ...] = ()) -> Model:
    """Parse and validate `path` as `model`; raise ConfigError naming every problem.

    `required`: top-level keys the file must write although the model has a default for
    code that builds it (the facility file's `mode`); their absence is reported with every
    other problem, not instead of them."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, [f"0: cannot read the file: {exc}"]) from exc
    root, loader = _compose(path, text)
    lines: dict[Location, int] = {}
    problems: list[str] = []
    data = {} if root is None else _to_python(root, loader, (), lines, problems)
    if problems:
        raise ConfigError(path, problems)
    found = [
        (1, f"{key}: Field required")
        for key in required
        if isinstance(data, dict) and key not in data
    ]
    try:
        loaded = model.model_validate(data)
    except ValidationError as exc:
        found += [_problem(error, lines) for error in exc.errors(include_url=False)]
        raise ConfigError(path, [f"{line}: {text}" for line, text in sorted(found)]) from exc
    if found:
        raise ConfigError(path, [f"{line}: {text}" for line, text in found])
    return loaded
