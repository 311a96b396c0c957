"""Reading sysfs (and cgroup, procfs) attribute files: one value a file, errors contained per file.

Every source reads its files through here, under one missing-data policy
(STYLE.md §3):

- **absent** (the file or its directory does not exist, or went away while
  read: `FileNotFoundError`, `NotADirectoryError`) → `None`, quietly: that
  sensor, controller or device is not there, which is normal.
- **unreadable** (any other `OSError`: EIO from a failed sensor, ENODATA,
  ENXIO) or **unparsable** (not an integer) → `None`, the value skipped; and,
  where the caller hands a `problems` list, the file and the reason named in
  it, for the source to report once at the end of its poll (`PartialReading`).
  A caller whose docstring says such a value is simply absent (hwmon, cray,
  hwmon_power: a broken sensor is a sensor missing) hands none.
- **denied** (`PermissionError`) → named in `problems` like any unreadable
  file where the caller collects them; raised where it does not, so that a
  source can tell "this sensor is absent" from "this process may not read it"
  (RAPL's `energy_uj` is root-only since CVE-2020-8694) and read down, not
  empty.
- **one device failing** → the caller goes on with the next: nothing here
  raises for an absent, unreadable or unparsable file.
"""

from __future__ import annotations

from pathlib import Path


def read_text(path: Path, problems: list[str] | None = None) -> str | None:
    """The file's stripped contents, or None (the policy above)."""
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError as exc:
        if problems is None:
            raise
        problems.append(f"{path}: {exc.strerror or exc}")
        return None
    except (OSError, ValueError) as exc:
        if problems is not None:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            problems.append(f"{path}: {reason}")
        return None


def read_int(path: Path, problems: list[str] | None = None) -> int | None:
    """The file's integer value, or None (the policy above)."""
    text = read_text(path, problems)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        if problems is not None:
            problems.append(f"{path}: not a number")
        return None
