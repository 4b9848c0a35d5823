"""``scripts/demo``'s command line: the live demo (:mod:`slurm_elastic.testing.demo`), ``--serving`` and ``--try
TEMPLATE`` (:mod:`slurm_elastic.testing.trial`). Test support: never installed."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from slurm_elastic.testing.demo import Demo, run_serving
from slurm_elastic.testing.demo import __doc__ as demo_doc


def main() -> int:
    ap = argparse.ArgumentParser(description=demo_doc)
    ap.add_argument("--cluster-dir", type=Path,
                    default=Path(os.environ.get("SLURM_ELASTIC_CLUSTER_DIR", "/var/tmp/slurm-elastic-cluster")))
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--command", default="", help="the slurm-elastic command that runs the agents and the controller "
                    "(default: this interpreter's slurm_elastic), e.g. an installed console script")
    ap.add_argument("--agent-port-base", type=int, default=18100,
                    help="agents listen on BASE+1.. and serve /metrics on BASE+101.. (scripts/test-wheel moves "
                    "them off the ports the cluster tests' own agents use)")
    ap.add_argument("--serving", action="store_true",
                    help="a service scaling with a daily load curve next to a training job (docs/serving.md)")
    ap.add_argument("--try", dest="trial", choices=["minimal", "torchrun", "dlrm"],
                    help="one template with trial timings and a GPU load you set (slurm_elastic/testing/trial.py)")
    ap.add_argument("--nodes", type=int, default=2, help="--try: the job's nodes at the start")
    ap.add_argument("--util", type=int, default=60, help="--try: the GPU load at the start (%%)")
    ap.add_argument("--check", action="store_true",
                    help="--try: set the load itself (95%% until the job grows, then 5%% until it shrinks) and exit 1 "
                    "unless both happen within --duration (scripts/test-wheel)")
    args = ap.parse_args()
    if args.trial:
        from slurm_elastic.testing.trial import run

        return run(args.cluster_dir, args.trial, args.nodes, args.util,
                   args.duration if "--duration" in sys.argv else 3600, check=args.check,
                   command=[args.command] if args.command else (), agent_port_base=args.agent_port_base)
    if args.serving:
        return run_serving(args)
    demo = Demo(args.cluster_dir, args.duration, [args.command] if args.command else (), args.agent_port_base)
    shutil.rmtree(demo.dir, ignore_errors=True)
    demo.dir.mkdir(parents=True)
    try:
        # A release cluster's (24.11, 26.05) client commands are in its bin/: extension jobs submit with them.
        release_bin = args.cluster_dir / "bin"
        ext_path = f"{release_bin}:" * release_bin.is_dir() + "/usr/local/bin:/usr/bin:/bin"
        db = demo.start_controller(demo.start_agents(), ext_path=ext_path)
        idle = demo.submit("bob", 10, 3, "idle")
        busy = demo.submit("alice", 95, 1, "busy")
        print(f"bob's job {idle}: 3 nodes at 10% GPU; alice's job {busy}: 1 node at 95% GPU (4 nodes in all)")
        print("the controller shrinks the idle job (after its grace signal) and grows the busy one with "
              "extension jobs run as alice\n", flush=True)
        ok = demo.watch(db, idle, busy)
        print("\ndone: idle job at 1 node, busy job at 3 nodes" if ok else "\ndemo timed out (see "
              f"{demo.dir}/controller.log)")
        return 0 if ok else 1
    finally:
        demo.stop()


if __name__ == "__main__":
    sys.exit(main())
