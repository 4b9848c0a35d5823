"""``slurm-elastic doctor`` on the live cluster (22.05 in lane 3; 24.11 and 26.05 in scripts/test-releases): every
check OK on the test cluster's setup (its slurm.conf, the project's plugins, real agents with the configured key,
a real state DB), and the settings a site gets wrong found, each with its fix: a controller config with another
agent key and an agent address where none listens, a state DB it cannot write, job_submit.lua missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic.store import SqlStore
from tests.cluster.agents_harness import Agents
from tests.cluster.harness import TestCluster

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lua(cluster: TestCluster) -> Path:
    """The cluster's job_submit.lua, refreshed from the checkout (what cluster.sh start copies)."""
    dst = cluster.root / "etc" / "job_submit.lua"
    tmp = dst.with_name(".job_submit.lua.new")
    shutil.copy(REPO / "plugins" / "job_submit.lua", tmp)
    os.replace(tmp, dst)
    return dst


def _config(tmp_path: Path, *, key_file: Path, db_url: str, urls: dict[str, str]) -> Path:
    cfg = tmp_path / "controller.toml"
    lines = ["version = 1", "[store]", f'url = "{db_url}"', "[api]", 'slurm_user = "root"',
             "[agents]", f'key_file = "{key_file}"', "timeout_s = 5.0", "[agents.urls]",
             *(f'{node} = "{url}"' for node, url in urls.items())]
    cfg.write_text("\n".join(lines) + "\n")
    cfg.chmod(0o600)
    return cfg


def _doctor(cluster: TestCluster, cfg: Path) -> tuple[int, dict[str, dict[str, Any]]]:
    cp = subprocess.run([sys.executable, "-m", "slurm_elastic.cli", "doctor", "-c", str(cfg), "--json"],
                        env=cluster.env, capture_output=True, text=True, timeout=120, check=False)
    assert cp.stdout.startswith("["), cp.stderr
    return cp.returncode, {row["check"]: row for row in json.loads(cp.stdout)}


@pytest.fixture
def db_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    SqlStore.open(url).close()
    yield url


def test_doctor_passes_on_the_test_cluster(agents: Agents, cluster: TestCluster, lua: Path, db_url: str,
                                           tmp_path: Path) -> None:
    cfg = _config(tmp_path, key_file=agents.key_file, db_url=db_url, urls={n: agents.url(n) for n in cluster.nodes})
    rc, rows = _doctor(cluster, cfg)
    assert {f"agent:{n}" for n in cluster.nodes} | {
        "slurm_config", "select_type", "proctrack", "job_submit", "prolog", "epilog", "power_saving", "accounting",
        "munge", "controller_config", "operator", "database", "clock"} <= set(rows)
    assert [r for r in rows.values() if r["status"] != "OK"] == []
    assert rc == 0
    assert rows["slurm_config"]["detail"].startswith(f"Slurm {os.environ.get('SLURM_ELASTIC_RELEASE', '22.05')}")


def test_doctor_finds_a_wrong_key_a_silent_agent_a_read_only_db_and_no_job_submit_lua(
        agents: Agents, cluster: TestCluster, lua: Path, db_url: str, tmp_path: Path) -> None:
    other_key = tmp_path / "other.key"
    other_key.write_bytes(os.urandom(32).hex().encode())
    other_key.chmod(0o600)
    urls = {n: agents.url(n) for n in cluster.nodes}
    silent = cluster.nodes[-1]
    urls[silent] = "http://127.0.0.1:9"  # nothing listens on the discard port
    path = db_url.removeprefix("sqlite:///")
    cfg = _config(tmp_path, key_file=other_key, db_url=f"sqlite:///file:{path}?mode=ro&uri=true", urls=urls)
    moved = lua.with_name(".job_submit.lua.doctor-test")
    os.replace(lua, moved)
    try:
        rc, rows = _doctor(cluster, cfg)
    finally:
        os.replace(moved, lua)
    assert rc == 2
    for node in cluster.nodes[:-1]:
        assert rows[f"agent:{node}"]["status"] == "FAIL"
        assert "refused our hmac credentials" in rows[f"agent:{node}"]["detail"]
        assert str(other_key) in rows[f"agent:{node}"]["fix"]
    assert rows[f"agent:{silent}"]["status"] == "FAIL"
    assert f"systemctl start slurm-elastic-agent on {silent}" in rows[f"agent:{silent}"]["fix"]
    assert rows["database"]["status"] == "FAIL" and "readonly" in rows["database"]["detail"]
    assert rows["job_submit"]["status"] == "FAIL" and f"{lua} is missing" in rows["job_submit"]["detail"]
    assert rows["clock"]["status"] == "WARN"  # no agent answered
    # What was not broken still passes.
    kept = ("select_type", "proctrack", "accounting", "munge", "operator")
    assert {k: rows[k]["status"] for k in kept} == dict.fromkeys(kept, "OK")
