"""Just enough of PromQL's lexer to bound the age of the samples a site's query reads.

A facility signal (DESIGN.md §6) is a PromQL query the site writes, such as
`max by (rack) (dcim_rack_inlet_temperature_celsius)`, with a `stale_after`.
PromQL cannot tell the age of an aggregated sample (`timestamp()` of an
aggregation is the evaluation time), so freshness has to be applied where the
samples are read: every instant vector selector `x{…}` becomes
`last_over_time(x{…}[stale_after])`, the newest raw sample no older than
`stale_after`, absent when there is none. Range selectors (`rate(x[5m])`) are
left as written: their window already bounds the age of what they read.

This is a lexer, not a parser: it finds selectors by their tokens (a name not
followed by `(`, not a keyword, not a label in `by (…)`/`on (…)`; or a bare
`{…}`) and checks that brackets balance and strings end. Whether the query is
valid PromQL is left to Prometheus: `promtool check rules` on the rendered file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEYWORDS = frozenset(
    {"and", "or", "unless", "atan2", "bool", "offset"}
    | {"by", "without", "on", "ignoring", "group_left", "group_right"}
)
#: Keywords followed by a parenthesised list of label names, not expressions.
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
AGGREGATIONS = frozenset(
    {"sum", "avg", "count", "min", "max", "group", "stddev", "stdvar", "topk", "bottomk"}
    | {"count_values", "quantile", "limitk", "limit_ratio"}
)
NUMBER_WORDS = frozenset({"inf", "nan"})

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+(?!\w))
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>==|!=|<=|>=|=~|!~|[-+*/%^<>=,@:])
  | (?P<open>[({\[])
  | (?P<close>[)}\]])
    """,
    re.VERBOSE,
)
_PAIRS = {"(": ")", "{": "}", "[": "]"}


class PromQLError(ValueError):
    """A query whose tokens cannot be PromQL: an unknown character, an open bracket or string."""


@dataclass(frozen=True)
class Token:
    kind: str  # one of the group names of _TOKEN
    text: str
    start: int
    end: int


def tokens(query: str) -> list[Token]:
    """The query's tokens, spaces and comments included, so that they join back to it."""
    result: list[Token] = []
    position = 0
    while position < len(query):
        match = _TOKEN.match(query, position)
        if match is None:
            char = query[position]
            if char in "\"'`":
                raise PromQLError(f"a string opened at character {position + 1} never ends")
            raise PromQLError(f"unexpected {char!r} at character {position + 1}")
        kind = match.lastgroup or ""
        result.append(Token(kind, match.group(), match.start(), match.end()))
        position = match.end()
    _check_brackets(result)
    return result


def _check_brackets(found: list[Token]) -> None:
    stack: list[Token] = []
    for token in found:
        if token.kind == "open":
            stack.append(token)
        elif token.kind == "close":
            if not stack or _PAIRS[stack[-1].text] != token.text:
                raise PromQLError(f"unmatched {token.text!r} at character {token.start + 1}")
            stack.pop()
    if stack:
        raise PromQLError(f"{stack[-1].text!r} at character {stack[-1].start + 1} is never closed")


@dataclass(frozen=True)
class Selector:
    """An instant vector selector in a query, as character offsets.

    `start:head_end` is the name and matchers (`x{a="b"}`), `head_end:end` its modifiers
    (` offset 5m`), empty when it has none.
    """

    start: int
    head_end: int
    end: int


def _closing(found: list[Token], index: int) -> int:
    """The index of the token that closes the bracket opened at `index`."""
    depth = 0
    for position in range(index, len(found)):
        if found[position].kind == "open":
            depth += 1
        elif found[position].kind == "close":
            depth -= 1
            if depth == 0:
                return position
    raise PromQLError("unbalanced brackets")  # _check_brackets has already refused this


def _significant(found: list[Token], index: int) -> int:
    """The index of the first token at or after `index` that is not a space or a comment."""
    while index < len(found) and found[index].kind in ("space", "comment"):
        index += 1
    return index


def _modifiers_end(found: list[Token], index: int) -> int:
    """Past any `offset DURATION` and `@ TIME` after a selector; the index after the last."""
    end = index
    while True:
        at = _significant(found, end)
        if at < len(found) and found[at].text == "offset":
            at = _significant(found, at + 1)
            if at < len(found) and found[at].text in ("-", "+"):
                at = _significant(found, at + 1)
            if at < len(found) and found[at].kind in ("duration", "number"):
                end = at + 1
                continue
            return end
        if at < len(found) and found[at].text == "@":
            at = _significant(found, at + 1)
            if at < len(found) and found[at].text in ("-", "+"):
                at = _significant(found, at + 1)
            if at < len(found) and found[at].kind == "number":
                end = at + 1
                continue
            if at < len(found) and found[at].text in ("start", "end"):
                paren = _significant(found, at + 1)
                if paren < len(found) and found[paren].text == "(":
                    end = _closing(found, paren) + 1
                    continue
            return end
        return end


def instant_selectors(query: str) -> list[Selector]:
    """Every instant vector selector of the query, with its modifiers, in order."""
    found = tokens(query)
    selectors: list[Selector] = []
    index = 0
    while index < len(found):
        token = found[index]
        after = _significant(found, index + 1)
        following = found[after].text if after < len(found) else ""
        if token.kind == "name" and token.text in GROUPING and following == "(":
            index = _closing(found, after) + 1  # a list of label names
            continue
        if token.text == "[":
            index = _closing(found, index) + 1  # a subquery's range and step
            continue
        starts_selector = token.text == "{" or (
            token.kind == "name"
            and token.text not in KEYWORDS
            and token.text.lower() not in NUMBER_WORDS
            and following != "("
            and not (token.text in AGGREGATIONS and following in ("by", "without"))
        )
        if not starts_selector:
            index += 1
            continue
        end = index + 1
        if token.text == "{":
            end = _closing(found, index) + 1
        elif following == "{":
            end = _closing(found, after) + 1
        head_end = found[end - 1].end
        bracket = _significant(found, end)
        if bracket < len(found) and found[bracket].text == "[":
            close = _closing(found, bracket)
            if not any(":" in found[i].text for i in range(bracket, close)):
                index = close + 1  # a range selector: its window bounds the age already
                continue
        else:
            end = _modifiers_end(found, end)
        selectors.append(Selector(found[index].start, head_end, found[end - 1].end))
        index = end
    return selectors


def check(query: str) -> None:
    """Raise PromQLError when the query's tokens cannot be PromQL."""
    if not query.strip():
        raise PromQLError("the query is empty")
    instant_selectors(query)


def format_duration(seconds: float) -> str:
    """Seconds as a PromQL duration: 120 → `2m`, 90 → `90s`, 0.5 → `500ms`."""
    milliseconds = round(seconds * 1000)
    if milliseconds < 1:
        raise ValueError(f"{seconds}s is shorter than a millisecond")
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if milliseconds % size == 0:
            return f"{milliseconds // size}{unit}"
    return f"{milliseconds}ms"


def bound_age(query: str, seconds: float) -> str:
    """The query with every instant selector reading only samples at most `seconds` old.

    `x{a="b"} offset 5m` becomes `last_over_time(x{a="b"}[2m] offset 5m)`: the newest sample
    in the window, absent when the window holds none. Everything else is kept as written.
    """
    window = format_duration(seconds)
    parts: list[str] = []
    position = 0
    for selector in instant_selectors(query):
        head = query[selector.start : selector.head_end]
        modifiers = query[selector.head_end : selector.end]
        parts.append(query[position : selector.start])
        parts.append(f"last_over_time({head}[{window}]{modifiers})")
        position = selector.end
    parts.append(query[position:])
    return "".join(parts)
