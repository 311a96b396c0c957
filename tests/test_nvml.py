"""exporter/nvml.py: one NVML for the gpu and units sources, initialised once, never shut
down under a call still inside it (issue 16's abandoned polls), initialised afresh after
the driver went away. A stand-in for pynvml counts the calls."""

from __future__ import annotations

import threading

import pynvml
import pytest

from exporter.nvml import Nvml, NvmlAbsent


class Bindings:
    """pynvml's names that Nvml uses, counting init and shutdown."""

    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound

    def __init__(self, absent: bool = False) -> None:
        self.nvmlLib = object()
        self.inits = 0
        self.shutdowns = 0
        self.absent = absent

    def nvmlInit(self) -> None:
        if self.absent:
            raise pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1


def test_two_sources_share_one_initialisation_and_the_last_release_shuts_down() -> None:
    api = Bindings()
    nvml = Nvml(api=api)
    with nvml.session("gpu"):
        pass
    with nvml.session("units"):
        pass
    assert (api.inits, api.shutdowns) == (1, 0)
    nvml.release("gpu")
    assert api.shutdowns == 0 and nvml.initialized
    nvml.release("units")
    assert api.shutdowns == 1 and not nvml.initialized


def test_never_shut_down_under_a_call_still_inside() -> None:
    api = Bindings()
    nvml = Nvml(api=api)
    inside, leave = threading.Event(), threading.Event()

    def stuck_poll() -> None:  # a poll abandoned past its deadline, still in the driver
        with nvml.session("gpu"):
            inside.set()
            leave.wait(5)

    thread = threading.Thread(target=stuck_poll)
    thread.start()
    assert inside.wait(5)
    nvml.release("gpu")  # the source closed at exit while its poll is stuck
    assert api.shutdowns == 0 and nvml.initialized
    leave.set()
    thread.join(5)
    assert api.shutdowns == 1 and not nvml.initialized


def test_the_driver_gone_initialises_afresh_once_no_call_is_inside() -> None:
    api = Bindings()
    nvml = Nvml(api=api)
    with pytest.raises(pynvml.NVMLError), nvml.session("gpu"):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    assert not nvml.initialized and api.shutdowns == 1
    with nvml.session("gpu"):
        assert nvml.initialized
    assert api.inits == 2


def test_another_nvml_error_leaves_nvml_up() -> None:
    api = Bindings()
    nvml = Nvml(api=api)
    with pytest.raises(pynvml.NVMLError), nvml.session("gpu"):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert nvml.initialized and api.shutdowns == 0


def test_no_library_is_absent_not_a_failure() -> None:
    with pytest.raises(NvmlAbsent), Nvml(api=Bindings(absent=True)).session("gpu"):
        pass
