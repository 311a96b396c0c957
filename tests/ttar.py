"""Unpack a ttar archive (the text format node_exporter and procfs keep fixture trees in).

Format: records separated by `# ttar - - -` lines; `Directory: P` then `Mode: M`;
`Path: P` then `Lines: N` and N content lines then `Mode: M`; or `Path: P` then
`SymlinkTo: T`. In content, `NULLBYTE` stands for a NUL byte and a trailing
`EOF` on the last line means the file has no final newline.
"""

from __future__ import annotations

import os
from pathlib import Path


class TtarError(ValueError):
    pass


def extract(archive: Path, dest: Path) -> None:
    """Write the archive's tree under `dest`, as `ttar -x -C dest` would."""
    # Bytes, not text: universal newlines would turn a binary file's CR into a line.
    lines = archive.read_bytes().decode("utf-8", errors="surrogateescape").split("\n")
    i = 0
    path: Path | None = None

    def inside(name: str) -> Path:
        target = (dest / name).resolve()
        if not target.is_relative_to(dest.resolve()):
            raise TtarError(f"{archive}: path escapes the destination: {name}")
        return target

    while i < len(lines):
        line = lines[i]
        i += 1
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(": ")
        if key == "Directory":
            path = inside(value)
            path.mkdir(parents=True, exist_ok=True)
        elif key == "Path":
            path = inside(value)
            path.parent.mkdir(parents=True, exist_ok=True)
        elif key == "Lines":
            if path is None:
                raise TtarError(f"{archive}:{i}: Lines before Path")
            count = int(value.split("|")[0])
            body = lines[i : i + count]
            i += count
            data = "".join(part + "\n" for part in body)
            if data.endswith("EOF\n"):
                data = data[: -len("EOF\n")]
            path.write_bytes(
                data.replace("NULLBYTE", "\0").encode("utf-8", errors="surrogateescape")
            )
        elif key == "SymlinkTo":
            if path is None:
                raise TtarError(f"{archive}:{i}: SymlinkTo before Path")
            if path.is_symlink() or path.exists():
                path.unlink()
            os.symlink(value, path)
        elif key == "Mode":
            if path is not None and not path.is_symlink():
                path.chmod(int(value, 8))
        else:
            raise TtarError(f"{archive}:{i}: unknown record {line!r}")
