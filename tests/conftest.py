"""Shared pytest fixtures."""

from __future__ import annotations

# --- fake NVML (tests/fake_nvml) ---------------------------------------------------------------
import ctypes
import json
import os
import pathlib
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

NVML_FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "nvml"


class FakeNvml:
    """The fake libnvidia-ml.so.1, loaded once per session and injected into pynvml.

    pynvml caches function pointers by name, so the whole session uses one library path.
    `configure()` replaces the JSON the library reads (atomically: temp file + os.replace),
    which the library notices at its next call, initialised or not.
    """

    def __init__(self, library: pathlib.Path, config_path: pathlib.Path, mp: pytest.MonkeyPatch):
        self.library = library
        self.config_path = config_path
        self.lib = ctypes.CDLL(str(library))
        self.lib.fakeNvmlGetCallCount.restype = ctypes.c_ulonglong
        self.lib.fakeNvmlGetCallCount.argtypes = [ctypes.c_char_p]
        self.lib.fakeNvmlGetRefCount.restype = ctypes.c_uint
        self.lib.fakeNvmlSizeof.restype = ctypes.c_size_t
        self.lib.fakeNvmlSizeof.argtypes = [ctypes.c_char_p]
        self._mp = mp

    @staticmethod
    def load_fixture(name: str) -> dict[str, Any]:
        """A config from tests/fixtures/nvml, by file name with or without `.json`."""
        path = NVML_FIXTURES / (name if name.endswith(".json") else f"{name}.json")
        return json.loads(path.read_text())

    def configure(self, config: dict[str, Any] | str | os.PathLike[str]) -> pathlib.Path:
        """Make `config` (a dict, or the path of a JSON file) what the library reads."""
        if isinstance(config, dict):
            text = json.dumps(config, indent=1)
        else:
            text = pathlib.Path(config).read_text()
        return self.configure_text(text)

    def configure_text(self, text: str) -> pathlib.Path:
        """Write raw text as the config (for testing invalid files too)."""
        fd, tmp = tempfile.mkstemp(prefix=".nvml-", suffix=".json", dir=self.config_path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            os.replace(tmp, self.config_path)
        except BaseException:
            pathlib.Path(tmp).unlink(missing_ok=True)
            raise
        self._mp.setenv("FAKE_NVML_CONFIG", str(self.config_path))
        return self.config_path

    def reset(self) -> None:
        """Back to a freshly loaded library: not initialised, call counters at zero."""
        import pynvml

        self.lib.fakeNvmlReset()
        pynvml._nvmlLib_refcount = 0

    def call_count(self, name: str | None = None) -> int:
        """How often the library's `name` (all functions when None) ran since the last reset."""
        return int(self.lib.fakeNvmlGetCallCount(name.encode() if name else None))

    def refcount(self) -> int:
        """The library's nvmlInit reference count."""
        return int(self.lib.fakeNvmlGetRefCount())


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeNvml]:
    """The fake NVML library, injected into pynvml for the whole session."""
    import pynvml

    from tests.fake_nvml.build import ensure_built

    mp = pytest.MonkeyPatch()
    fake = FakeNvml(ensure_built(), tmp_path_factory.mktemp("fake_nvml") / "nvml.json", mp)
    saved_lib = pynvml.nvmlLib
    saved_cache = dict(pynvml._nvmlGetFunctionPointer_cache)
    pynvml.nvmlLib = fake.lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield fake
    finally:
        fake.reset()
        mp.undo()
        pynvml.nvmlLib = saved_lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved_cache)


# --- end fake NVML -----------------------------------------------------------------------------


# --- BMC credentials (tests/fake_redfish) -------------------------------------------------------
@pytest.fixture
def credentials(tmp_path: pathlib.Path) -> pathlib.Path:
    """The credentials file the fake Redfish BMC accepts (user, then password; mode 0600)."""
    from tests.fake_redfish import PASSWORD, USER

    path = tmp_path / "bmc-credentials"
    path.write_text(f"{USER}\n{PASSWORD}\n")
    path.chmod(0o600)
    return path
