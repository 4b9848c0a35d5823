"""``slurm-elastic check``'s pitfalls: what the directives allow but the job will not survive."""

from __future__ import annotations

import re
import signal

from slurm_elastic.directives.spec import ElasticSpec

SIGNAL_NUMBERS = {s.name.removeprefix("SIG"): int(s) for s in signal.Signals}


_TRAP = re.compile(rb"^\s*trap\s+(.*)$", re.MULTILINE)
_PY_HANDLER = re.compile(rb"signal\.signal\s*\(\s*signal\.SIG(\w+)")


def grace_handler_warning(name: str, data: bytes, spec: ElasticSpec) -> str | None:
    """A warning when the batch script has no handler for the job's grace signal: the controller sends it with
    ``scancel --signal=SIG --full``, which reaches the batch shell too, and a shell without a ``trap`` for it dies
    at the first shrink (the job ends FAILED 0:10 and its extensions are cancelled as orphans). None when the
    job never shrinks or the script handles the signal (a shell ``trap`` naming it, or Python's
    ``signal.signal(signal.SIG...)``)."""
    if not spec.shrink:
        return None
    sig = spec.signal.upper().removeprefix("SIG")
    number = str(SIGNAL_NUMBERS.get(sig, ""))
    for m in _TRAP.finditer(data):  # trap ACTION SIGNAL...: the signals are the last words
        names = {w.strip("'\";").upper().removeprefix("SIG") for w in m.group(1).decode("utf-8", "replace").split()}
        if sig in names or (number and number in names):
            return None
    if any(m.group(1).decode().upper() == sig for m in _PY_HANDLER.finditer(data)):
        return None
    return (f"{name}: warning: no handler for the grace signal SIG{sig}: the controller sends it with "
            f"'scancel --signal={sig} --full' before a shrink, which kills a batch shell without one (the job "
            f"ends FAILED 0:10); add e.g. \"trap 'echo checkpoint' {sig}\" before srun "
            f"(sbatch_templates/minimal.sbatch)")
