"""What an id, a name or a reason may hold: one set of characters and lengths for every one
that comes in (docs/decider.md, "Ids, names and reasons"), checked at the HTTP edge (a 422
naming the field) and, for domain names, in the facility file.

- A node or domain name: 1 to 253 characters (a DNS name's most), letters, digits and
  `. _ : -`, the first a letter or a digit. So no `..`, no `/` (it separates a domain's kind
  from its name), nothing a URL must escape, nothing that splits a log line.
- A reservation id, a model or a profile name: the same, with `/` between parts
  (`team-a/llama-0`, `meta-llama/Llama-3.3-70B-Instruct`), each part a name; at most 256
  characters in all. No part is `.` or `..`: an HTTP client would drop it from a URL.
- A replica's class: a name of at most 64 characters.
- A reason (a hold's): 1 to 512 printable characters (`str.isprintable`: no control, format
  (bidi overrides such as U+202E), separator other than the space, or surrogate character).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, StringConstraints

NAME_MAX = 253
ID_MAX = 256
CLASS_MAX = 64
REASON_MAX = 512

_PART = r"[A-Za-z0-9][A-Za-z0-9._:-]*"
NAME_PATTERN = re.compile(rf"{_PART}")
PATH_PATTERN = re.compile(rf"{_PART}(?:/{_PART})*")


def _describe(text: str) -> str:
    # ascii(): a control, bidi or surrogate character is shown escaped, never acted on.
    return ascii(text[:64] + ("…" if len(text) > 64 else ""))


def check_name(name: str) -> str:
    """A node or domain name (module docstring); raises ValueError saying what is wrong."""
    if not 1 <= len(name) <= NAME_MAX:
        raise ValueError(f"a name is 1-{NAME_MAX} characters, not {len(name)}")
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"{_describe(name)} is not a name: letters, digits and . _ : - only, "
            "the first a letter or a digit"
        )
    return name


def check_path(text: str) -> str:
    """A reservation id, a model or a profile name: names joined by `/`."""
    if not 1 <= len(text) <= ID_MAX:
        raise ValueError(f"1-{ID_MAX} characters, not {len(text)}")
    if not PATH_PATTERN.fullmatch(text):
        raise ValueError(
            f"{_describe(text)} is not names joined by '/': letters, digits and . _ : - "
            "only, each part starting with a letter or a digit"
        )
    return text


def check_reason(reason: str) -> str:
    """A reason: printable text, stripped of the spaces around it."""
    # Checked before stripping: str.strip() would drop U+0085 and other Unicode spaces.
    if not reason.isprintable():
        bad = next(char for char in reason if not char.isprintable())
        raise ValueError(
            f"a reason is one line of printable text: U+{ord(bad):04X} is not printable"
        )
    reason = reason.strip(" ")
    if not 1 <= len(reason) <= REASON_MAX:
        raise ValueError(f"a reason is 1-{REASON_MAX} characters, not {len(reason)}")
    return reason


# Lengths first (StringConstraints), so that a 10 MB name is refused before any pattern
# runs over it; then the check, with a message that says which characters may be used.
NodeName = Annotated[
    str, StringConstraints(min_length=1, max_length=NAME_MAX), AfterValidator(check_name)
]
PathName = Annotated[
    str, StringConstraints(min_length=1, max_length=ID_MAX), AfterValidator(check_path)
]
ClassName = Annotated[
    str, StringConstraints(min_length=1, max_length=CLASS_MAX), AfterValidator(check_name)
]
Reason = Annotated[
    str, StringConstraints(min_length=1, max_length=REASON_MAX), AfterValidator(check_reason)
]
