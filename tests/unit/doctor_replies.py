"""Recorded Slurm replies for the doctor's unit tests (tests/fixtures/slurm/<release>/recorded/doctor/, recorded
by scripts/record-doctor-replies), served by argument list like the live commands."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_elastic.doctor.probes import SACCT_ARGV
from slurm_elastic.slurm.runner import CommandResult

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
RELEASES = tuple(sorted(p.parents[2].name for p in FIXTURES.glob("*/recorded/doctor/scontrol-show-config.txt")))
NO_DBD = FIXTURES / "22.05" / "recorded" / "sacct-no-dbd.txt.stderr"  # sacct against a closed accounting port

_FILES = {
    ("scontrol", "show", "config"): "scontrol-show-config.txt",
    tuple(SACCT_ARGV): "sacct-probe.txt",
    ("sacctmgr", "-n", "-P", "show", "user", "bob", "format=AdminLevel"): "sacctmgr-adminlevel-bob.txt",
}


def recorded(release: str, name: str) -> str:
    return (FIXTURES / release / "recorded" / "doctor" / name).read_text()


def show_config(release: str) -> str:
    return recorded(release, "scontrol-show-config.txt")


class RecordedRunner:
    """A :class:`CommandRunner` over one release's recordings; ``replace`` serves other recorded files for some
    commands (e.g. the sacct failure). A command with no recording fails the test."""

    def __init__(self, release: str, replace: Mapping[tuple[str, ...], Path] | None = None) -> None:
        self.release, self.replace = release, dict(replace or {})
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float, input_text: str | None,
                 env: Mapping[str, str] | None) -> CommandResult:
        key = tuple(argv)
        self.calls.append(key)
        if key in self.replace:
            return _from_stderr_file(key, self.replace[key])
        if key not in _FILES:
            raise AssertionError(f"no recorded reply for {argv}")
        base = FIXTURES / self.release / "recorded" / "doctor" / _FILES[key]
        err = base.with_name(base.name + ".stderr")
        if err.exists():
            return _from_stderr_file(key, err)
        return CommandResult(key, 0, base.read_text(), "")


def _from_stderr_file(key: tuple[str, ...], path: Path) -> CommandResult:
    lines = path.read_text().splitlines()
    rc = int(lines[-1].split()[1]) if lines and lines[-1].startswith("exit ") else 1
    return CommandResult(key, rc, "", "\n".join(lines[:-1]) + "\n")
