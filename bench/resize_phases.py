"""Resize in seconds, on a live cluster: the phases of 5 shrinks and 5 grows of the torchrun template.

    flock /tmp/cluster-lane1.lock .venv/bin/python bench/resize_phases.py            # the default instance
    SLURM_ELASTIC_CLUSTER_LANE=3 flock /tmp/cluster-lane3.lock .venv/bin/python bench/resize_phases.py

Runs tests/cluster/test_resize_phases_cluster.py with ``SLURM_ELASTIC_RESIZE_ROUNDS`` rounds (a shrink 2 -> 1,
then a grow 1 -> 2 by an extension job; the first shrink releases a leader's node, the later ones cancel the
extension) under the real controller, then prints each resize's phases and their medians, in seconds after the
decision: notice written, checkpoint acknowledged, the released agent left (shrink) or the new agent joined
(grow), the rendezvous re-formed at the new size, the first training step at the new size
(tests/cluster/resize_phases.py). Run it under the cluster's lock (docs/test-cluster.md). Not a timed test: the
numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster.resize_phases import Resize, table  # noqa: E402

TEST = "tests/cluster/test_resize_phases_cluster.py"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="shrink+grow rounds (default 5: 5 of each)")
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= 20:
        ap.error("--rounds must be 1..20")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "phases.json"
        env = {**os.environ, "SLURM_ELASTIC_RESIZE_ROUNDS": str(args.rounds), "SLURM_ELASTIC_PHASES_OUT": str(out),
               "PYTHONPATH": str(REPO)}
        pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "-m", "cluster", TEST]
        rc = subprocess.run(pytest, cwd=REPO, env=env, timeout=300 + 120 * args.rounds, check=False).returncode
        if not out.exists():
            print(f"resize_phases: the test recorded nothing (exit {rc})", file=sys.stderr)
            return rc or 1
        rows = json.loads(out.read_text())
    resizes = [Resize(r["kind"], 0.0, r["world"], dict(r["phases"])) for r in rows]
    print(f"\nresize phases, seconds after the decision ({args.rounds} shrinks, {args.rounds} grows):")
    print(table(resizes))
    return rc


if __name__ == "__main__":
    sys.exit(main())
