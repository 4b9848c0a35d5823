"""Shared test support for the virtual NVML library (not a test module).

Test modules bind the fixtures by assignment (``vgpu = vgpu_support.vgpu``), so no shared conftest is needed.

In-process NVML tests load the virtual ``libnvidia-ml.so.1`` by absolute path *before* pynvml loads its library:
the dynamic loader then answers pynvml's ``CDLL("libnvidia-ml.so.1")`` with the already-loaded object (same
soname), exactly as LD_LIBRARY_PATH would in a fresh process. Tests that need a fresh process (library missing,
the CLI) run a subprocess with :func:`vgpu_env`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_elastic.testing.vgpu import FAULTS_ENV, STATE_ENV
from slurm_elastic.testing.vgpu.build import build_library
from slurm_elastic.testing.vgpu.state import make_node_state
from slurm_elastic.testing.vgpu.statefile import StateFile

REPO = Path(__file__).resolve().parents[2]
BUILD_DIR = REPO / "build" / "vgpu"


@functools.cache
def vgpu_library() -> Path:
    """Builds (once per session, and only when vnvml.c changed) and returns the library's path."""
    return build_library(BUILD_DIR)


@functools.cache
def load_vgpu_library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(vgpu_library()), mode=ctypes.RTLD_GLOBAL)
    import pynvml

    if pynvml.nvmlLib is not None and pynvml.nvmlLib._name != lib._name:  # pragma: no cover - wiring error
        raise RuntimeError(f"pynvml already loaded another NVML: {pynvml.nvmlLib._name}")
    return lib


def vgpu_env(state: Path, **extra: str) -> dict[str, str]:
    """Environment for a subprocess that must use the virtual library and ``state``."""
    env = {k: v for k, v in os.environ.items() if k != FAULTS_ENV}
    env.update(LD_LIBRARY_PATH=str(vgpu_library().parent), **{STATE_ENV: str(state)}, **extra)
    env["PYTHONPATH"] = str(REPO)
    return env


PYTHON = sys.executable

# Hiding NVML needs a machine without a system-wide libnvidia-ml.so.1 (the loader's cache would find it).
needs_no_system_nvml = pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="a system libnvidia-ml is installed: its absence cannot be simulated here",
)


@pytest.fixture
def vgpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[StateFile]:
    """A node 'n1' with 4 idle virtual GPUs (minors 4..7), NVML initialised in this process."""
    load_vgpu_library()
    import pynvml

    path = tmp_path / "vgpu" / "n1.state"
    path.parent.mkdir()
    monkeypatch.setenv(STATE_ENV, str(path))
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    sf = StateFile(path)
    sf.write(make_node_state("n1", 4, minor_base=4))
    pynvml.nvmlInit()
    try:
        yield sf
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
