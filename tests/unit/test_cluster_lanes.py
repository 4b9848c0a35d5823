"""scripts/test's two lanes of 22.05 cluster tests (SLURM_ELASTIC_CLUSTER_LANES=2) and the harness's lane 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "test"
# Files that must run on the default instance (scripts/test says why): its MariaDB database slurm_elastic, its
# slurm.conf rewritten by the MIG workflow, the torchrun rendezvous ports derived from job ids.
LANE1_ONLY = {"test_store_mariadb.py", "test_controller_ha.py", "test_mig_cluster.py", "test_controller_e2e.py",
              "test_resize_templates.py", "test_network_faults.py"}


def lane_ignores(lane: int) -> list[str]:
    """The --ignore= arguments scripts/test gives the lane, from its own functions (bash)."""
    prog = (f'eval "$(sed -n \'/^lane2_files=(/,/^)/p\' {SCRIPT})"; '
            f'eval "$(sed -n \'/^lane_ignores()/,/^}}/p\' {SCRIPT})"; lane_ignores {lane}')
    cp = subprocess.run(["bash", "-c", prog], cwd=REPO, capture_output=True, text=True, check=True, timeout=30)
    return [line.removeprefix("--ignore=") for line in cp.stdout.split()]


def test_the_two_lanes_split_the_cluster_test_files_between_them() -> None:
    files = {str(p.relative_to(REPO)) for p in (REPO / "tests" / "cluster").glob("test_*.py")}
    ignored_by_1, ignored_by_2 = set(lane_ignores(1)), set(lane_ignores(2))
    assert ignored_by_1 and ignored_by_2
    assert ignored_by_1 <= files and ignored_by_2 <= files
    assert ignored_by_1 | ignored_by_2 == files, "a file neither lane runs"
    assert not ignored_by_1 & ignored_by_2, "a file both lanes skip"


def test_files_bound_to_the_default_instance_stay_in_lane_1() -> None:
    lane2 = {Path(f).name for f in lane_ignores(1)}
    assert not lane2 & LANE1_ONLY


# The harness reads its settings from the environment when imported: one interpreter reloads it per case.
CASES = [{}, {"SLURM_ELASTIC_CLUSTER_LANE": "2"},
         {"SLURM_ELASTIC_CLUSTER_LANE": "2", "SLURM_ELASTIC_CLUSTER_DIR": "/var/tmp/slurm-elastic-cluster"},
         {"SLURM_ELASTIC_CLUSTER_LANE": "3"}, {"SLURM_ELASTIC_CLUSTER_LANE": "2", "SLURM_ELASTIC_RELEASE": "24.11"}]
PROBE = """
import importlib, json, os, sys
out = []
for case in json.loads(sys.argv[1]):
    for k in ("SLURM_ELASTIC_CLUSTER_LANE", "SLURM_ELASTIC_RELEASE", "SLURM_ELASTIC_CLUSTER_DIR",
              "SLURM_ELASTIC_LANE2_CLUSTER_DIR"):
        os.environ.pop(k, None)
    os.environ.update(case)
    try:
        sys.modules.pop("tests.cluster.harness", None)
        h = importlib.import_module("tests.cluster.harness")
        out.append({"root": str(h.DEFAULT_ROOT), "port": h.AGENT_PORT_BASE, "arg": h.CLUSTER_ARG,
                    "var": h.CLUSTER_DIR_VAR})
    except RuntimeError as exc:
        out.append({"error": str(exc)})
print(json.dumps(out))
"""


def test_lane_2_has_its_own_directory_agent_ports_and_start_argument() -> None:
    cp = subprocess.run([sys.executable, "-c", PROBE, json.dumps(CASES)], cwd=REPO, capture_output=True, text=True,
                        timeout=60, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    one, two, two_with_default_env, three, two_of_24_11 = json.loads(cp.stdout)
    assert one == {"root": "/var/tmp/slurm-elastic-cluster", "port": 18000, "arg": "22.05",
                   "var": "SLURM_ELASTIC_CLUSTER_DIR"}
    assert two == {"root": "/var/tmp/slurm-elastic-cluster-lane2", "port": 21000, "arg": "lane2",
                   "var": "SLURM_ELASTIC_LANE2_CLUSTER_DIR"}
    # lane 2's directory comes only from its own variable: a shell with the default cluster's env.sh sourced
    # must not point lane 2 at the default cluster
    assert two_with_default_env == two
    # only lanes 1 and 2, and lane 2 only of 22.05
    assert "SLURM_ELASTIC_CLUSTER_LANE" in three["error"] and "SLURM_ELASTIC_CLUSTER_LANE" in two_of_24_11["error"]


def test_scripts_test_refuses_an_unknown_lane_count() -> None:
    cp = subprocess.run([str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=30, check=False,
                        env={**os.environ, "SLURM_ELASTIC_CLUSTER_LANES": "3"})
    assert cp.returncode == 2 and "SLURM_ELASTIC_CLUSTER_LANES is 1 or 2" in cp.stderr
