"""Reading sysfs attribute files: one value a file, errors contained per file."""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path) -> str | None:
    """The file's stripped contents, or None when it is missing or unreadable.

    A PermissionError is raised, not swallowed: a source must be able to tell
    "this sensor is absent" from "this process may not read it" (RAPL's
    `energy_uj` is root-only since CVE-2020-8694).
    """
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except PermissionError:
        raise
    except (OSError, ValueError):
        return None


def read_int(path: Path) -> int | None:
    """The file's integer value, or None when missing, unreadable or not an integer."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None
