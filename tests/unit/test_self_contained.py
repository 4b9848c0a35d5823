"""The repository carries everything its tests, benchmarks and docs use: nothing refers to a folder beside it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from slurm_elastic.sim.traces import TRACES_ENV, traces_dir

REPO = Path(__file__).resolve().parents[2]
# Spelled in two halves so that this file does not match its own search.
OUTSIDE = "../" + "shared"


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout
    return [REPO / line for line in out.splitlines() if line and not line.endswith((".gz", ".png"))]


def test_nothing_refers_to_a_folder_beside_the_repository() -> None:
    offenders = []
    for path in _tracked_text_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            if OUTSIDE in line:
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()}")
    assert not offenders, "references outside the repository:\n" + "\n".join(offenders)


def test_traces_are_found_in_the_repository_without_environment() -> None:
    root = traces_dir({})
    assert root == REPO / "traces"
    for rel in ("README.md", "pollux/workloads/workload-6.csv", "pollux/traces/bert/placements.csv",
                "pollux/traces/philly.csv", "itp/raw-traces.tar.gz"):
        assert (root / rel).is_file(), rel
    assert TRACES_ENV == "SLURM_ELASTIC_TRACES"
