"""scripts/test's lanes of 22.05 cluster tests (SLURM_ELASTIC_CLUSTER_LANES, scripts/cluster-lanes.sh) and the
harness's lanes 2 and 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "test"
LANES = REPO / "scripts" / "cluster-lanes.sh"
# Files that must run on the default instance (scripts/test says why): its MariaDB database slurm_elastic, its
# slurm.conf rewritten by the MIG workflow, the torchrun rendezvous ports derived from job ids.
LANE1_ONLY = {"test_store_mariadb.py", "test_controller_ha.py", "test_mig_cluster.py", "test_controller_e2e.py",
              "test_resize_templates.py", "test_adaptive_batch_cluster.py", "test_network_faults.py",
              "test_gpu_granular_cluster.py"}
FILES = {str(p.relative_to(REPO)) for p in (REPO / "tests" / "cluster").glob("test_*.py")}


def lane_files(lane: int, lanes: int) -> set[str]:
    """The 22.05 cluster test files the lane runs with ``lanes`` lanes: those scripts/test does not --ignore
    (its own functions, bash)."""
    cp = subprocess.run(["bash", "-c", f'. {LANES}; lane_ignores {lane} {lanes}'], cwd=REPO, capture_output=True,
                        text=True, check=True, timeout=30)
    ignored = {line.removeprefix("--ignore=") for line in cp.stdout.split()}
    assert ignored <= FILES
    return FILES - ignored


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_the_lanes_split_the_cluster_test_files_between_them(lanes: int) -> None:
    runs = [lane_files(lane, lanes) for lane in range(1, lanes + 1)]
    assert all(runs), "a lane with no file"
    assert set().union(*runs) == FILES, "a file no lane runs"
    assert sum(len(r) for r in runs) == len(FILES), "a file two lanes run"


@pytest.mark.parametrize("lanes", [2, 3])
def test_files_bound_to_the_default_instance_stay_in_lane_1(lanes: int) -> None:
    assert {Path(f).name for f in lane_files(1, lanes)} >= LANE1_ONLY


def test_the_script_uses_the_lane_list() -> None:
    text = SCRIPT.read_text()
    assert ". scripts/cluster-lanes.sh" in text and 'lane_ignores "$lane" "$lanes"' in text


# The harness reads its settings from the environment when imported: one interpreter reloads it per case.
CASES = [{}, {"SLURM_ELASTIC_CLUSTER_LANE": "2"},
         {"SLURM_ELASTIC_CLUSTER_LANE": "2", "SLURM_ELASTIC_CLUSTER_DIR": "/var/tmp/slurm-elastic-cluster"},
         {"SLURM_ELASTIC_CLUSTER_LANE": "3"}, {"SLURM_ELASTIC_CLUSTER_LANE": "4"},
         {"SLURM_ELASTIC_CLUSTER_LANE": "2", "SLURM_ELASTIC_RELEASE": "24.11"}]
PROBE = """
import importlib, json, os, sys
out = []
for case in json.loads(sys.argv[1]):
    for k in ("SLURM_ELASTIC_CLUSTER_LANE", "SLURM_ELASTIC_RELEASE", "SLURM_ELASTIC_CLUSTER_DIR",
              "SLURM_ELASTIC_LANE2_CLUSTER_DIR", "SLURM_ELASTIC_LANE3_CLUSTER_DIR"):
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


def test_lanes_2_and_3_have_their_own_directory_agent_ports_and_start_argument() -> None:
    cp = subprocess.run([sys.executable, "-c", PROBE, json.dumps(CASES)], cwd=REPO, capture_output=True, text=True,
                        timeout=60, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    one, two, two_with_default_env, three, four, two_of_24_11 = json.loads(cp.stdout)
    assert one == {"root": "/var/tmp/slurm-elastic-cluster", "port": 18000, "arg": "22.05",
                   "var": "SLURM_ELASTIC_CLUSTER_DIR"}
    assert two == {"root": "/var/tmp/slurm-elastic-cluster-lane2", "port": 21000, "arg": "lane2",
                   "var": "SLURM_ELASTIC_LANE2_CLUSTER_DIR"}
    # lane 2's directory comes only from its own variable: a shell with the default cluster's env.sh sourced
    # must not point lane 2 at the default cluster
    assert two_with_default_env == two
    assert three == {"root": "/var/tmp/slurm-elastic-cluster-lane3", "port": 22000, "arg": "lane3",
                     "var": "SLURM_ELASTIC_LANE3_CLUSTER_DIR"}
    # only lanes 1 to 3, and lanes 2 and 3 only of 22.05
    assert "SLURM_ELASTIC_CLUSTER_LANE" in four["error"] and "SLURM_ELASTIC_CLUSTER_LANE" in two_of_24_11["error"]


def test_scripts_test_refuses_an_unknown_lane_count() -> None:
    cp = subprocess.run([str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=30, check=False,
                        env={**os.environ, "SLURM_ELASTIC_CLUSTER_LANES": "4"})
    assert cp.returncode == 2 and "SLURM_ELASTIC_CLUSTER_LANES is 1, 2 or 3" in cp.stderr
