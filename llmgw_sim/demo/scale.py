"""Rule files with every duration divided by one factor: the same logic, run faster.

The demo runs its simulated site `time_scale` times faster than real time, so the rules'
hold times must shrink by the same factor: the condition's 2-minute enter and 5-minute
leave windows, its 15-minute memory, the group intervals, the alerts' `for`. Nothing
else changes: the expressions are the committed ones with their durations rewritten.

What is scaled, in a rule file:

- each group's `interval`, and each rule's `for` and `keep_firing_for`;
- in every `expr`, every PromQL duration: range windows (`[2m15s]`), subquery ranges and
  steps (`[5m:30s]`), `offset 2m`;
- numbers that are seconds of age or time, where the expression says so: `time() - N`
  and `time() + N`, and the right side of a comparison whose left operand is an age: a
  series named `…_age_seconds`, or `time() - x` (`time() - timestamp(level) < 60`).

Annotations are left alone (their text speaks in the scenario's minutes). A number that
is seconds in some other shape would not be found: `scale_rules` only rewrites, and
`promtool check rules` on the copy is the check that it still parses.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from decider.promql import Token, format_duration, tokens
from llmgw_common.yamlfile import load_text

_UNIT_SECONDS = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
    "y": 31536000.0,
}
_PART = re.compile(r"(\d+)(ms|[smhdwy])")
_SUBQUERY_STEP = re.compile(r"^:(\d+(ms|[smhdwy]))+$")
_COMPARISONS = frozenset({"==", "!=", "<", ">", "<=", ">="})


def duration_seconds(text: str) -> float:
    """A Prometheus duration (`2m15s`, `500ms`, `0s`) in seconds."""
    text = text.strip()
    parts = _PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"{text!r} is not a Prometheus duration")
    return sum(int(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def scale_duration(text: str, factor: float) -> str:
    """`text` divided by `factor`, as a Prometheus duration; `0s` stays `0s`."""
    seconds = duration_seconds(text)
    if seconds == 0:
        return "0s"
    return format_duration(seconds / factor)


def _number(value: float) -> str:
    return f"{value:g}"


def _significant_before(found: list[Token], index: int) -> int:
    index -= 1
    while index >= 0 and found[index].kind in ("space", "comment"):
        index -= 1
    return index


def _opening(found: list[Token], close: int) -> int:
    depth = 0
    for index in range(close, -1, -1):
        if found[index].kind == "close":
            depth += 1
        elif found[index].kind == "open":
            depth -= 1
            if depth == 0:
                return index
    return -1


def _operand_start(found: list[Token], end: int) -> int:
    """The first token of the operand that ends at `end`: a name, `name{…}`, `f(…)`, `(…)`."""
    token = found[end]
    if token.kind == "close":
        start = _opening(found, end)
        before = _significant_before(found, start)
        if before >= 0 and found[before].kind == "name":
            return before
        return start
    return end


def _is_time_call(found: list[Token], end: int) -> bool:
    """Whether the tokens ending at `end` are `time()`."""
    if end < 0 or found[end].text != ")":
        return False
    start = _operand_start(found, end)
    return found[start].text == "time"


def _after_time_minus(found: list[Token], start: int) -> bool:
    """Whether the operand starting at `start` is preceded by `time() -`."""
    minus = _significant_before(found, start)
    return (
        minus >= 0
        and found[minus].text == "-"
        and _is_time_call(found, _significant_before(found, minus))
    )


def _seconds_literal(found: list[Token], index: int) -> bool:
    """Whether the number at `index` is a count of seconds of age or time."""
    before = _significant_before(found, index)
    if before < 0:
        return False
    text = found[before].text
    if text == "offset":
        return True
    if text in ("-", "+"):
        return _is_time_call(found, _significant_before(found, before))
    if text == "bool":
        before = _significant_before(found, before)
        text = found[before].text if before >= 0 else ""
    if text not in _COMPARISONS:
        return False
    end = _significant_before(found, before)
    if end < 0:
        return False
    start = _operand_start(found, end)
    name = found[start].text if found[start].kind == "name" else ""
    return name.endswith("_age_seconds") or _after_time_minus(found, start)


def scale_expr(expr: str, factor: float) -> str:
    """A PromQL expression with its durations and seconds-literals divided by `factor`."""
    found = tokens(expr)
    out: list[str] = []
    for index, token in enumerate(found):
        if token.kind == "duration":
            out.append(scale_duration(token.text, factor))
        elif token.kind == "name" and _SUBQUERY_STEP.match(token.text):
            # decider.promql lexes a subquery's `:1m` as one name token
            out.append(":" + scale_duration(token.text[1:], factor))
        elif token.kind == "number" and _seconds_literal(found, index):
            out.append(_number(float(token.text) / factor))
        else:
            out.append(token.text)
    return "".join(out)


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def scale_groups(data: dict[str, Any], factor: float) -> dict[str, Any]:
    """A rule file's content (`{"groups": [...]}`) with its durations divided by `factor`."""
    groups = []
    for group in data.get("groups") or []:
        group = dict(group)
        if "interval" in group:
            group["interval"] = scale_duration(str(group["interval"]), factor)
        rules = []
        for rule in group.get("rules") or []:
            rule = dict(rule)
            rule["expr"] = scale_expr(str(rule["expr"]), factor)
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    rule[key] = scale_duration(str(rule[key]), factor)
            rules.append(rule)
        group["rules"] = rules
        groups.append(group)
    return {**data, "groups": groups}


def scale_rules(text: str, factor: float, *, source: str = "") -> str:
    """A rule file's text with every duration divided by `factor` (see the module)."""
    if factor <= 0:
        raise ValueError("the factor must be more than zero")
    scaled = scale_groups(load_text(text) or {}, factor)
    head = (
        f"# {source} with every duration divided by {factor:g} (llmgw-facility demo)\n"
        if source
        else ""
    )
    body = yaml.dump(scaled, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=10_000)
    return head + body
