"""Where the traces live: ``$SLURM_ELASTIC_TRACES``, else ``traces/`` in the repository (see traces/README.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from slurm_elastic.sim.errors import TracesNotFoundError

TRACES_ENV = "SLURM_ELASTIC_TRACES"

# slurm_elastic/sim/traces.py -> parents[2] is the repository root (a source checkout or an editable install).
_REPO_ROOT = Path(__file__).resolve().parents[2]


def traces_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The trace root (the directory holding ``pollux/`` and ``itp/``).

    The environment variable wins so that CI, a site or a test can point elsewhere; otherwise the path is
    resolved relative to the repository, never to the current directory.
    """
    env = os.environ if environ is None else environ
    override = env.get(TRACES_ENV, "")
    if override:
        path = Path(override)
        if not path.is_dir():
            raise TracesNotFoundError(f"{TRACES_ENV}={override} is not a directory")
        return path
    path = _REPO_ROOT / "traces"
    if not path.is_dir():
        raise TracesNotFoundError(
            f"trace directory not found at {path} (it ships with the source checkout); "
            f"set {TRACES_ENV} to the directory holding pollux/"
        )
    return path


def pollux_app_dir(root: Path, application: str) -> Path:
    """Directory with one application's measurements (placements.csv, scalability.csv, validation-*.csv)."""
    return root / "pollux" / "traces" / application
