"""Resize in seconds, on a live cluster: the phases of 5 shrinks and 5 grows of the torchrun template.

    flock /tmp/cluster-lane1.lock .venv/bin/python bench/resize_phases.py            # the default instance
    SLURM_ELASTIC_CLUSTER_LANE=3 flock /tmp/cluster-lane3.lock .venv/bin/python bench/resize_phases.py

Runs tests/cluster/test_resize_phases_cluster.py with ``SLURM_ELASTIC_RESIZE_ROUNDS`` rounds (a shrink 2 -> 1,
then a grow 1 -> 2 by an extension job; the first shrink releases a leader's node, the later ones cancel the
extension) under the real controller, then prints each resize's phases and their medians, in seconds after the
decision: notice written, checkpoint acknowledged, the released agent left (shrink) or the new agent joined
(grow), the rendezvous re-formed at the new size, the first training step at the new size
(tests/cluster/resize_phases.py). First the baseline in the same run, ``SLURM_ELASTIC_FAST_RESIZE=0`` (the
launcher leaves torch's rendezvous alone: heartbeats, last call, restart on the failed collective), then the
launcher's fast re-form; the last lines are the medians' ratios. Run it under the cluster's lock
(docs/test-cluster.md). Not a timed test: the numbers go to docs/performance.md.
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

from tests.cluster.resize_phases import Resize, medians, table  # noqa: E402

TEST = "tests/cluster/test_resize_phases_cluster.py"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="shrink+grow rounds (default 5: 5 of each)")
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= 20:
        ap.error("--rounds must be 1..20")
    got: dict[str, list[Resize]] = {}
    rc = 0
    for mode, fast in (("baseline (SLURM_ELASTIC_FAST_RESIZE=0)", "0"), ("fast re-form", "1")):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "phases.json"
            env = {**os.environ, "SLURM_ELASTIC_RESIZE_ROUNDS": str(args.rounds), "SLURM_ELASTIC_PHASES_OUT": str(out),
                   "SLURM_ELASTIC_FAST_RESIZE": fast, "PYTHONPATH": str(REPO)}
            pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", "-m", "cluster", TEST]
            done = subprocess.run(pytest, cwd=REPO, env=env, timeout=300 + 120 * args.rounds, check=False)
            rc = rc or done.returncode
            if not out.exists():
                print(f"resize_phases: {mode}: the test recorded nothing", file=sys.stderr)
                return rc or 1
            got[mode] = [Resize(r["kind"], 0.0, r["world"], dict(r["phases"])) for r in json.loads(out.read_text())]
    for mode, resizes in got.items():
        print(f"\n{mode}: resize phases, seconds after the decision ({args.rounds} shrinks, {args.rounds} grows):")
        print(table(resizes))
    base, fast_m = (medians(r) for r in got.values())
    for kind in ("shrink", "grow"):
        b, f = base[kind].get("first_step"), fast_m[kind].get("first_step")
        if b and f:
            print(f"{kind}: decision -> first step, median {f:.2f} s fast vs {b:.2f} s baseline: {f / b:.2f}x")
    return rc

if __name__ == "__main__":
    sys.exit(main())
