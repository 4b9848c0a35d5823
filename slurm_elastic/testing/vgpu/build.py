"""Builds the virtual ``libnvidia-ml.so.1`` from :file:`vnvml.c` with the machine's gcc.

``python -m slurm_elastic.testing.vgpu.build OUTDIR`` prints the library's path. Idempotent: a stamp beside the library
records a hash of the source and the compiler command, and the library is rebuilt only when either changes.
Concurrent builds (parallel test sessions) serialize on a lock file and publish the library with a rename.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.testing.vgpu import LIBRARY_NAME

SOURCE = Path(__file__).with_name("vnvml.c")
CFLAGS = (
    "-O2", "-g", "-shared", "-fPIC", "-fvisibility=hidden", "-pthread", "-Wall", "-Wextra",
    f"-Wl,-soname,{LIBRARY_NAME}",
)
BUILD_TIMEOUT_S = 120


class VgpuBuildError(SlurmElasticError):
    """The virtual NVML library could not be compiled."""


def _stamp(cc: str) -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update("\0".join((cc, *CFLAGS)).encode())
    return h.hexdigest()


def build_library(outdir: str | Path, cc: str | None = None) -> Path:
    """Compiles the library into ``outdir`` unless an up-to-date build is there; returns its path."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    compiler = cc or os.environ.get("CC") or shutil.which("gcc")
    if not compiler:
        raise VgpuBuildError("gcc not found: install gcc and libc6-dev (scripts/bootstrap does)")
    lib, stamp_file = out / LIBRARY_NAME, out / f"{LIBRARY_NAME}.sha256"
    stamp = _stamp(compiler)
    with open(out / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists() and stamp_file.exists() and stamp_file.read_text().strip() == stamp:
            return lib
        tmp = out / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
        cmd = [compiler, *CFLAGS, "-o", str(tmp), str(SOURCE)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise VgpuBuildError(f"could not run {compiler}: {exc}") from exc
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise VgpuBuildError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr.strip()}")
        os.replace(tmp, lib)
        stamp_file.write_text(stamp + "\n")
    return lib


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m slurm_elastic.testing.vgpu.build OUTDIR", file=sys.stderr)
        return 2
    try:
        print(build_library(args[0]))
    except VgpuBuildError as exc:
        print(f"vgpu build: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
