"""The process's one NVML: loaded once, initialised once, shut down when the last user is done.

pynvml keeps the loaded library in module globals, so a process has one NVML
whichever source asks. `Nvml` owns its lifecycle for every source that reads
it (the gpu and units sources): built in `main()` and handed to each
(STYLE.md §4), so no source loads, initialises or shuts NVML down itself.

- The library: `library`, a path, is loaded the first time NVML is used when
  pynvml holds none yet; unset, pynvml's own search finds `libnvidia-ml.so.1`.
- `session(user)` is the only way in: it initialises NVML if it is not (the
  first use, or the first after the driver went away) and counts the callers
  inside, so NVML is never shut down under a call still running in it, a poll
  past its deadline and abandoned (exporter/deadline.py) included.
- The driver gone or reloaded (uninitialised, driver not loaded, library and
  driver versions apart): whichever user meets it says so (`forget_if_driver_gone`,
  or any such error leaving a session); NVML is shut down when the last caller
  inside leaves, and initialised afresh by the next session.
- `release(user)`: that user is done (its source closed); the last one to go
  shuts NVML down, again only once no call is inside.

Errors are translated at this edge: no library found → `NvmlAbsent` (a node
without GPUs, for the sources "no data"); a configured library that cannot be
loaded → `NvmlUnloadable` (a failure); any other NVML error is pynvml's own
`NVMLError`, for the source to judge.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from typing import Any

import pynvml

#: Answers meaning the driver itself went away: initialise NVML again.
DRIVER_GONE = frozenset(
    {
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)


class NvmlAbsent(Exception):
    """No NVML library on this node: no NVIDIA driver, a node without NVIDIA GPUs."""


class NvmlUnloadable(RuntimeError):
    """The configured NVML library could not be loaded."""


class Nvml:
    """One process's NVML, shared by the sources that read it.

    `api` is the bindings (pynvml; tests hand a stand-in); `library` the path of
    `libnvidia-ml.so.1` to load, or None for the loader's search.
    """

    def __init__(self, library: str | None = None, api: Any = pynvml) -> None:
        self.library = library
        self.api = api
        self._lock = threading.Lock()
        self._initialized = False
        self._inside = 0  # callers in a session now
        self._users: set[str] = set()  # who initialised through us and has not released
        self._reset_wanted = False

    @property
    def initialized(self) -> bool:
        return self._initialized

    @contextlib.contextmanager
    def session(self, user: str) -> Iterator[Any]:
        """The bindings, with NVML initialised for the time of the block.

        Raises `NvmlAbsent`, `NvmlUnloadable` or pynvml's `NVMLError` when NVML
        cannot be initialised. An initialisation that hangs holds the lock:
        the other users wait behind it, as they would inside a stuck driver.
        """
        with self._lock:
            if not self._initialized:
                self._start()
            self._users.add(user)
            self._inside += 1
        try:
            yield self.api
        except Exception as exc:
            self.forget_if_driver_gone(exc)
            raise
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0 and (self._reset_wanted or not self._users):
                    self._stop()

    def forget_if_driver_gone(self, exc: BaseException) -> bool:
        """True when `exc` says the driver went away; NVML is then initialised afresh
        once no call is inside it."""
        if getattr(exc, "value", None) not in DRIVER_GONE:
            return False
        with self._lock:
            self._reset_wanted = True
        return True

    def release(self, user: str) -> None:
        """`user` is done with NVML; the last user to go shuts it down (none inside)."""
        with self._lock:
            self._users.discard(user)
            if not self._users and self._inside == 0:
                self._stop()

    def _start(self) -> None:
        api = self.api
        if self.library and api.nvmlLib is None:
            try:
                api.nvmlLib = ctypes.CDLL(self.library)
            except OSError as exc:
                raise NvmlUnloadable(f"cannot load the NVML library {self.library}: {exc}") from exc
        try:
            api.nvmlInit()
        except api.NVMLError_LibraryNotFound as exc:
            raise NvmlAbsent("no NVIDIA driver library (libnvidia-ml.so.1) on this node") from exc
        self._initialized = True
        self._reset_wanted = False

    def _stop(self) -> None:
        self._reset_wanted = False
        if self._initialized:
            self._initialized = False
            # A failing shutdown means the driver is already gone: nothing to release.
            with contextlib.suppress(self.api.NVMLError):
                self.api.nvmlShutdown()
