"""Virtual GPUs beneath nvidia-ml-py, for tests and the demo (never used in production).

A small C library (:file:`vnvml.c`) built as ``libnvidia-ml.so.1`` answers the NVML calls that ``pynvml`` makes,
from a text state file per node (:mod:`slurm_elastic.testing.vgpu.state`, written through
:mod:`slurm_elastic.testing.vgpu.statefile`). Put the library on ``LD_LIBRARY_PATH`` and the state file's path in
``SLURM_ELASTIC_VGPU_STATE``, and the agent's production NVML code runs unchanged against it.
"""

from __future__ import annotations

STATE_ENV = "SLURM_ELASTIC_VGPU_STATE"
"""Environment variable naming the state file that the virtual library reads."""

STATE_DIR_ENV = "SLURM_ELASTIC_VGPU_DIR"
"""Environment variable naming the directory of per-node state files (``<node>.state``)."""

FAULTS_ENV = "SLURM_ELASTIC_VGPU_FAULTS"
"""Environment variable with injected faults: ``fn=code[@gpu];fn=delay:ms[@gpu]``."""

LIBRARY_NAME = "libnvidia-ml.so.1"
