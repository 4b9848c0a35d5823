"""Hostile input and authentication on the real cluster (docs/reliability.md, rows H1-H5).

* plugins/job_submit.lua inside the real slurmctld gets the shared invalid vectors, very long lines, binary bytes
  and thousands of directives: each job is rejected with the plugin's message and slurmctld stays up.
* The real agents refuse unsigned, wrongly signed, replayed and forged requests with 401 and no data; the agent
  and the controller refuse to start with a key file others can read.
* Job names, comments and script paths full of shell metacharacters, newlines, quotes and bytes that are not
  UTF-8 pass through every Slurm call unharmed while the real controller grows and shrinks such jobs, and a
  forged extension tag on alice's job claiming bob's job is not taken as bob's extension.

Run: ``flock /tmp/slurm-elastic-cluster-tests.lock .venv/bin/pytest tests/cluster/test_reliability_hostile.py``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from slurm_elastic.agent.auth import sign_request
from slurm_elastic.agent.payload import NODE_PATH
from slurm_elastic.store.records import ActionKind
from tests.cluster.agents_harness import REPO, Agents
from tests.cluster.controller_harness import (
    controller_config,
    elastic_script,
    node_count,
    running_controller,
    wait_until,
)
from tests.cluster.harness import TestCluster
from tests.cluster.test_job_submit_lua import install_plugin
from tests.unit.directives_vectors import load as load_vectors
from tests.unit.directives_vectors import script_of

pytestmark = pytest.mark.cluster



def slurmctld_pid(cluster: TestCluster) -> int:
    return int((cluster.root / "run" / "slurmctld.pid").read_text().split()[0])


def slurmctld_up(cluster: TestCluster) -> bool:
    cp = cluster.run(["scontrol", "ping"], timeout=30)
    return cp.returncode == 0 and "UP" in cp.stdout


# --- H1: the Lua job_submit plugin under hostile scripts -----------------------------------------------------------
def hostile_scripts() -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for case in load_vectors()["cases"]:
        expect = case["expect"]
        errors = (expect.get("components") or {}).get("none", {"errors": expect["errors"]})["errors"]
        if errors and b"hetjob" not in script_of(case):  # a real het job script is valid as a het job
            script = script_of(case)  # sbatch itself wants a #! line first
            out.append((f"vector:{case['name']}", script if script.startswith(b"#!") else b"#!/bin/bash\n" + script))
    out.append(("long-line-1MiB", b"#!/bin/bash\n#ELASTIC --max-nodes " + b"9" * (1 << 20) + b"\nhostname\n"))
    out.append(("long-line-many-options", b"#!/bin/bash\n#ELASTIC" + b" --window 5m" * 20000 + b"\nhostname\n"))
    out.append(("binary-bytes",
                b"#!/bin/bash\n#ELASTIC --signal \xff\xfe\x01\x1b[31m --max-nodes \x80\nhostname\n"))
    out.append(("binary-option", b"#!/bin/bash\n#ELASTIC --\xc3\x28 2\nhostname\n"))
    out.append(("5000-directives", b"#!/bin/bash\n" + b"#ELASTIC --max-nodes 2\n" * 5000 + b"hostname\n"))
    out.append(("3000-distinct-bad", b"#!/bin/bash\n" + b"".join(
        b"#ELASTIC --bogus-%d %d\n" % (i, i) for i in range(3000)) + b"hostname\n"))
    return out


def test_lua_plugin_rejects_hostile_scripts_and_slurmctld_stays_up(cluster: TestCluster) -> None:
    install_plugin(cluster)
    pid = slurmctld_pid(cluster)
    tag = f"hostile-{uuid.uuid4().hex[:6]}"
    cases = hostile_scripts()
    assert len(cases) >= 20
    accepted: list[str] = []
    for name, script in cases:
        cp = subprocess.run(["runuser", "-u", "alice", "--", "sbatch", "--parsable", "--hold", "--chdir=/tmp",
                             "--output=/dev/null", f"--job-name={tag}"], input=script, capture_output=True,
                            env=cluster.env, timeout=120, check=False)
        err = cp.stderr.decode(errors="replace")
        if cp.returncode == 0:
            accepted.append(name)
            continue
        if b"\0" in script:  # sbatch itself refuses NUL bytes before the plugin sees the script
            assert "does not allow scripts that" in err and "NULL character" in err, (name, err[:500])
            continue
        if b"\r\n" in script:  # and DOS line breaks
            assert "Batch script contains DOS line breaks" in err, (name, err[:500])
            continue
        assert "slurm-elastic: job rejected: invalid #ELASTIC directives" in err, (name, err[:500])
        assert "slurm-elastic: line " in err, (name, err[:500])
        assert len(err) < 64 * 1024, f"{name}: a rejection of {len(err)} bytes is not a clear message"
    leaked = [line.split()[0] for line in cluster.run(["squeue", "--all", "-h", "-o", "%i %j"]).stdout.splitlines()
              if line.split()[1:] == [tag]]
    cluster.cancel(*(int(j.split("+")[0]) for j in leaked))
    assert accepted == [] and leaked == []
    assert slurmctld_pid(cluster) == pid and slurmctld_up(cluster)
    print(f"\nH1: {len(cases)} hostile scripts, {len(cases)} rejected, slurmctld pid {pid} unchanged")


# --- H2/H3: authentication against the real agents -----------------------------------------------------------------
def _get(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_real_agent_refuses_missing_wrong_replayed_and_forged_requests(agents: Agents) -> None:
    url = agents.url("n1") + NODE_PATH
    now = time.time()
    good = sign_request(agents.key, "GET", NODE_PATH, b"", now=now)
    status, body = _get(url, good)
    assert status == 200 and b'"gpus"' in body  # the control case: a signed request gets data
    refused = {
        "no credentials": {},
        "wrong key": sign_request(b"x" * 32, "GET", NODE_PATH, b"", now=now),
        "replayed": good,  # the very same headers again
        "forged path": {**sign_request(agents.key, "GET", "/v1/other", b"", now=now)},
        "forged signature": {**sign_request(agents.key, "GET", NODE_PATH, b"", now=now),
                             "Authorization": "SE-HMAC-SHA256 " + "0" * 64},
        "stale timestamp": sign_request(agents.key, "GET", NODE_PATH, b"", now=now - 3600),
        "garbage header": {"Authorization": "SE-HMAC-SHA256 \x7f;rm -rf /", "X-Slurm-Elastic-Nonce": "../../"},
    }
    for what, headers in refused.items():
        status, body = _get(url, headers)
        # A header that is not even valid HTTP is refused by the HTTP layer (400) before authentication.
        assert status == 401 or (what == "garbage header" and status == 400), (what, status, body[:200])
        assert b'"gpus"' not in body and b'"jobs"' not in body, what
    print(f"\nH2: {len(refused)} refused request kinds against a live agent, all 401 without data")


def test_agent_and_controller_refuse_a_loose_key_file(agents: Agents, tmp_path: Path) -> None:
    loose = tmp_path / "loose.key"
    loose.write_bytes(os.urandom(32).hex().encode())
    loose.chmod(0o644)
    cp = subprocess.run([sys.executable, "-c", "from slurm_elastic.cli import main; main()", "agent", "--node", "n1",
                         "--listen", "127.0.0.1", "--port", "18099", "--key-file", str(loose)],
                        capture_output=True, text=True, timeout=60, env=agents.cluster.env, check=False)
    assert cp.returncode != 0 and "0644" in cp.stderr + cp.stdout
    cfg = controller_config(tmp_path, agents)
    cfg.write_text(cfg.read_text().replace(str(agents.key_file), str(loose)))
    cp = subprocess.run([sys.executable, "-c", "from slurm_elastic.cli import main; main()", "controller", "-c",
                         str(cfg), "--once"], capture_output=True, text=True, timeout=60, env=agents.cluster.env,
                        check=False, cwd=REPO)
    assert cp.returncode != 0 and "0644" in cp.stderr + cp.stdout, cp.stderr[-2000:]


# --- H4/H5: injection through every Slurm call, and a forged extension tag --------------------------------------------
EVIL = "x$(touch /tmp/PWNED-{m})`touch /tmp/PWNED-{m}`;touch /tmp/PWNED-{m}|&<>'\"\\\n\t*?[]{{}}!#~%"
DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 2 --window 10s --cooldown 15s --grace 3s --signal USR2"


def _squeue(cluster: TestCluster) -> dict[int, dict[str, object]]:
    cp = subprocess.run(["squeue", "--all", "--json"], capture_output=True, env=cluster.env, timeout=60,
                        check=True)
    jobs = json.loads(cp.stdout.decode(errors="replace"))["jobs"]
    return {int(j["job_id"]): j for j in jobs}


def _sbatch_bytes(cluster: TestCluster, user: str, script: bytes, *args: bytes) -> int:
    cp = subprocess.run([b"runuser", b"-u", user.encode(), b"--", b"sbatch", b"--parsable", b"--chdir=/tmp",
                         f"--output={cluster.jobs_dir}/%j.out".encode(), *args], input=script, capture_output=True,
                        env=cluster.env, timeout=60, check=False)
    assert cp.returncode == 0, cp.stderr
    return int(cp.stdout.decode().strip().split(";")[0])


def test_metacharacters_binary_names_and_forged_tags_pass_through_the_real_controller(
        agents: Agents, clean_cluster: TestCluster, tmp_path: Path) -> None:
    cluster = clean_cluster
    m = uuid.uuid4().hex[:8]
    evil = EVIL.format(m=m)
    marker = cluster.jobs_dir / f"marker-{m}"
    marker.touch()
    marker.chmod(0o666)
    # A script path with metacharacters, readable by the users.
    sdir = Path("/tmp") / f"se dir $(touch PWNED-{m});'\"{m}"
    sdir.mkdir(mode=0o755)
    try:
        idle_script = sdir / "idle job;`id`.sh"
        idle_script.write_text(elastic_script(10, DIRECTIVES, marker))
        idle_script.chmod(0o755)
        alice = _sbatch_bytes(cluster, "alice", b"", f"--job-name={evil}".encode(), f"--comment={evil}".encode(),
                              b"-N2", b"--gres=gpu:2", b"--time=60", str(idle_script).encode())
        bob = _sbatch_bytes(cluster, "bob", elastic_script(90, DIRECTIVES, marker).encode(),
                            f"--job-name=b{evil}".encode(), f"--comment=c{evil}".encode(), b"-N1", b"--gres=gpu:2",
                            b"--time=60")
        # Bytes that are not UTF-8 in a held job's name and comment: squeue --json passes them through verbatim.
        binary = _sbatch_bytes(cluster, "alice", b"#!/bin/bash\nsleep 600\n", b"--hold",
                               b"--job-name=bin\xff\xfe\x80name", b"--comment=\xc3\x28" + evil.encode())
        for job in (alice, bob):
            cluster.wait_state(job, {"RUNNING"})
        # alice forges bob's extension tag on a job of her own.
        forged = _sbatch_bytes(cluster, "alice", b"#!/bin/bash\nsleep 600\n", b"-N1", b"--gres=gpu:1",
                               b"--time=60", f"--comment=slurm-elastic:ext parent={bob} key=grow:{bob}:1".encode(),
                               f"--job-name=elastic-ext-{bob}".encode())
        cluster.wait_state(forged, {"RUNNING"})
        before = _squeue(cluster)
        with running_controller(cluster, controller_config(tmp_path, agents)) as ctl:
            wait_until("alice's job to shrink to 1 node", lambda: node_count(cluster, alice) == 1, 180, ctl)
            wait_until("bob's job to grow to 2 nodes", lambda: len(ctl.applied(bob, ActionKind.GROW)) >= 1
                       and any(str(j.get("comment", "")).startswith("slurm-elastic:ext")
                               and j.get("job_state") == "RUNNING" and j["job_id"] != forged
                               for j in _squeue(cluster).values()), 180, ctl)
            ctl.wait_cycles(3)  # a few more cycles with bob at max and the forged job around
            st = ctl.store()
            try:
                exts = {e.job_id for e in st.jobs.extensions(bob, active_only=False)}
                bob_rec = st.jobs.get_job(bob)
            finally:
                st.close()
            log = ctl.log_text()
            assert ctl.proc.poll() is None
        after = _squeue(cluster)
        # Names and comments unharmed through squeue -> controller -> scontrol/sbatch.
        for job in (alice, bob, binary):
            assert after[job]["name"] == before[job]["name"] and after[job]["comment"] == before[job]["comment"]
        assert after[alice]["name"] == evil and after[alice]["comment"] == evil
        # The forged tag: not bob's extension, not cancelled, not counted in bob's size.
        assert forged not in exts and after[forged]["job_state"] == "RUNNING"
        assert bob_rec is not None and bob_rec.current_nodes == node_count(cluster, bob) + sum(
            1 for e in exts if after.get(e, {}).get("job_state") == "RUNNING")
        assert bob_rec.current_nodes <= 2
        # No cycle died on the bytes that are not UTF-8 (the bug this found).
        assert "UnicodeDecodeError" not in log and "Traceback" not in log
        assert not list(Path("/tmp").glob(f"PWNED-{m}*")) and not list(sdir.glob("PWNED*"))
        assert not list(Path(cluster.jobs_dir).glob(f"PWNED-{m}*"))
    finally:
        for p in sdir.iterdir():
            p.unlink()
        sdir.rmdir()
