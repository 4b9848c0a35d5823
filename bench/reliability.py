"""Run the reliability suite (docs/reliability.md): bounded by default, ``--long`` for the long form.

    .venv/bin/python bench/reliability.py            # the CI form: fuzz 300 cases/target, 20 crash points, 20 s outage
    .venv/bin/python bench/reliability.py --long     # 5000 fuzz cases/target, 100 crash points, 60 s outage
    .venv/bin/python bench/reliability.py --unit     # only the fast unit part (no cluster)
    .venv/bin/python bench/reliability.py --soak 1   # only the soak, 1 hour, on the namespace cluster
                                                     # (docker-slurm/netns-cluster.sh; started and stopped here)
    .venv/bin/python bench/reliability.py --soak 0.9 --resizes 1000
                                                     # the 1,000-resize run: until that many are applied (~22 a
                                                     # minute here), at most 0.9 hours; fails short of them

Cluster tests run under the shared lock, as every cluster test on this machine must.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = "/tmp/slurm-elastic-cluster-tests.lock"
UNIT = ["tests/unit/test_fuzz_inputs.py", "tests/unit/test_reliability_controller.py"]
CLUSTER = ["tests/cluster/test_reliability_hostile.py", "tests/cluster/test_reliability_faults.py"]
NETNS_LOCK = "/tmp/slurm-elastic-netns-cluster.lock"
SOAK = "tests/cluster/test_network_faults.py::test_soak_flips_kills_restarts_and_cuts_leave_journal_equal_to_slurm"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--long", action="store_true", help="the long form (hours of fuzzing, 100 crash points)")
    ap.add_argument("--unit", action="store_true", help="only the unit part (no live cluster)")
    ap.add_argument("--seed", type=int, default=None, help="crash-storm seed (SLURM_ELASTIC_FAULT_SEED)")
    ap.add_argument("--soak", type=float, metavar="HOURS", default=None,
                    help="only the soak on the namespace cluster: jobs flipping busy/idle, controller kills, agent "
                         "restarts, link cuts for HOURS, then the journal against squeue, sacct and every job write "
                         "slurmctld logged")
    ap.add_argument("--resizes", type=int, metavar="N", default=0,
                    help="with --soak: end the faults once N resizes are applied (HOURS is then the most it runs; "
                         "the soak fails if it ends short of N)")
    args = ap.parse_args(argv)
    if args.soak is not None and not 0 < args.soak <= 168:
        ap.error("--soak HOURS must be > 0 and at most 168")
    if args.resizes < 0 or (args.resizes and args.soak is None):
        ap.error("--resizes N needs --soak HOURS and N >= 0")
    env = dict(os.environ)
    if args.long:
        env["SLURM_ELASTIC_LONG"] = "1"
    if args.seed is not None:
        env["SLURM_ELASTIC_FAULT_SEED"] = str(args.seed)
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-ra"]  # this interpreter's venv
    if args.soak is not None:
        env["SLURM_ELASTIC_SOAK_S"] = str(args.soak * 3600)
        env["SLURM_ELASTIC_SOAK_RESIZES"] = str(args.resizes)
        # The test's fixture starts the namespace cluster if it is down (and then stops it afterwards).
        return subprocess.run(["flock", NETNS_LOCK, *pytest, SOAK], cwd=REPO, env=env,
                              timeout=args.soak * 3600 + 1800, check=False).returncode
    timeout = 6 * 3600 if args.long else 1800
    rc = subprocess.run([*pytest, *UNIT], cwd=REPO, env=env, timeout=timeout, check=False).returncode
    if rc or args.unit:
        return rc
    return subprocess.run(["flock", LOCK, *pytest, *CLUSTER], cwd=REPO, env=env, timeout=timeout,
                          check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
