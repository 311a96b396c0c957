"""Build the fake NVML library (``libnvidia-ml.so.1``) from ``fake_nvml.c``.

Tests call :func:`ensure_built` and load the returned path with ``ctypes.CDLL``.
The library is rebuilt only when it is missing or older than its source, and
is written under a temporary name and moved into place with ``os.replace``, so
concurrent pytest processes never load a half-written file.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "fake_nvml.c"
LIBRARY = HERE / "libnvidia-ml.so.1"
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror")


def _is_fresh(lib: pathlib.Path, src: pathlib.Path) -> bool:
    try:
        return lib.stat().st_mtime_ns >= src.stat().st_mtime_ns
    except FileNotFoundError:
        return False


def ensure_built() -> pathlib.Path:
    """Compile the library if needed and return its path.

    Raises RuntimeError (with gcc's own output) when gcc is missing or fails.
    """
    if _is_fresh(LIBRARY, SOURCE):
        return LIBRARY
    cc = os.environ.get("CC") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("cannot build the fake NVML library: gcc is not on PATH")
    fd, tmp_name = tempfile.mkstemp(prefix=".libnvidia-ml.", suffix=".so.tmp", dir=HERE)
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    try:
        proc = subprocess.run(
            [cc, *CFLAGS, "-o", str(tmp), str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"building {LIBRARY.name} from {SOURCE} failed "
                f"(gcc exit status {proc.returncode}):\n{proc.stderr.strip()}"
            )
        os.chmod(tmp, 0o755)
        os.replace(tmp, LIBRARY)
    finally:
        tmp.unlink(missing_ok=True)
    return LIBRARY


if __name__ == "__main__":
    print(ensure_built())
