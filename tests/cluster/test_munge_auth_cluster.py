"""MUNGE between the controller and the agents on the live cluster: real agents started with ``--auth munge``
decode credentials through the cluster's munged (the one Slurm uses); hostile requests are refused, and the real
controller with ``[agents] auth = "munge"`` polls them and decides on their data."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_elastic.agent.auth import HEADER_SIGNATURE, sign_request
from slurm_elastic.agent.mig_remote import HttpAgent, load_agent_auth
from slurm_elastic.agent.munge import Munge
from slurm_elastic.agent.munge_auth import SCHEME, MungeClientAuth, request_id, request_payload
from slurm_elastic.agent.payload import NODE_PATH
from slurm_elastic.mig.config import AgentAccess
from slurm_elastic.mig.errors import WorkflowError
from slurm_elastic.slurm.hostlist import expand
from slurm_elastic.store import SqlStore
from tests.cluster.agents_harness import REPO, Agents, running_agents
from tests.cluster.controller_harness import (
    controller_config,
    elastic_script,
    marker_file,
    running_controller,
    wait_until,
)
from tests.cluster.harness import TestCluster

DIRECTIVES = "#ELASTIC --min-nodes 1 --max-nodes 3 --window 10s --cooldown 15s --grace 3s --signal USR2"


@pytest.fixture(scope="module")
def munge_agents(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    with running_agents(cluster, tmp_path_factory.mktemp("munge-agents"), interval_s=1.0, window_s=4,
                        auth="munge") as a:
        yield a


def _get(url: str, headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _credential(payload: bytes, ttl_s: int = 60, *, as_nobody: bool = False) -> dict[str, str]:
    if as_nobody:  # the munge binary as another uid: what any user on a node can make
        cp = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "munge", "-t",
                             str(ttl_s)], input=payload, capture_output=True, check=True, timeout=30)
        return {"Authorization": f"{SCHEME} {cp.stdout.decode().strip()}"}
    return {"Authorization": f"{SCHEME} {Munge().encode(payload, ttl_s)}"}


def test_real_agent_with_munge_refuses_hostile_requests(munge_agents: Agents) -> None:
    url = munge_agents.url("n1") + NODE_PATH
    get = request_payload("GET", NODE_PATH, b"")
    good = _credential(get)
    status, body, headers = _get(url, good)
    assert status == 200 and b'"gpus"' in body  # the control case
    rid = request_id(good["Authorization"].split(" ", 1)[1])
    checker = MungeClientAuth(Munge(), os.geteuid())
    assert checker.check_response(rid, body, headers.get(HEADER_SIGNATURE))  # the answer carries the agent's
    assert not checker.check_response(rid, body + b" ", headers.get(HEADER_SIGNATURE))
    expiring = _credential(get, ttl_s=1)
    encoded_at = time.time()
    refused: dict[str, tuple[dict[str, str], str]] = {
        "no credentials": ({}, "missing_credentials"),
        "the shared key instead": (sign_request(munge_agents.key, "GET", NODE_PATH, b"", now=time.time()),
                                   "malformed_credentials"),
        "replayed": (good, "replayed_credential"),
        "lifted from another path": (_credential(request_payload("GET", "/v1/mig", b"")), "request_mismatch"),
        "lifted from a POST": (_credential(request_payload("POST", NODE_PATH, b"{}")), "request_mismatch"),
        "another user": (_credential(get, as_nobody=True), "wrong_user"),
        "TTL above the limit": (_credential(get, ttl_s=3600), "ttl_too_long"),
        "forged credential": ({"Authorization": f"{SCHEME} MUNGE:{'A' * 120}:"}, "bad_credential"),
    }
    wait_until("the 1 s credential to expire", lambda: time.time() > encoded_at + 2.5, 10)
    refused["expired"] = (expiring, "expired_credential")
    for what, (h, reason) in refused.items():
        status, body, _ = _get(url, h)
        assert status == 401, (what, status, body[:200])
        assert json.loads(body)["reason"] == reason, (what, body[:200])
        assert b'"gpus"' not in body and b'"jobs"' not in body, what
    print(f"\nMUNGE: {len(refused)} refused request kinds against a live agent, all 401 without data")


def _munge_config(tmp: Path, agents: Agents) -> Path:
    cfg = controller_config(tmp, agents, dry_run=True)
    text, n = re.subn(r'(?m)^key_file = .*$', f'auth = "munge"\nmunge_agent_user = "{os.geteuid()}"\nmunge_ttl_s = 30',
                      cfg.read_text())
    assert n == 1
    cfg.write_text(text)
    return cfg


def test_the_controller_polls_real_agents_with_munge(munge_agents: Agents, cluster: TestCluster,
                                                     tmp_path: Path) -> None:
    cluster.cancel_all()
    cluster.wait_nodes_idle()
    marker = marker_file(cluster)
    job = cluster.submit(elastic_script(10, DIRECTIVES, marker), "-N2", "--gres=gpu:1", "--time=30", user="bob")
    try:
        cluster.wait_state(job, {"RUNNING"})
        rec = cluster.job_record(job) or {}
        nodes = expand(str(rec.get("nodes") or ""))
        assert len(nodes) == 2, rec
        # A controller still on the shared key is refused by every agent, and so sees no data.
        hmac_dir = tmp_path / "hmac"
        hmac_dir.mkdir()
        cp = subprocess.run([sys.executable, "-c", "from slurm_elastic.cli import main; main()", "controller", "-c",
                             str(controller_config(hmac_dir, munge_agents, dry_run=True)), "--once"],
                            capture_output=True, text=True, timeout=120, env=cluster.env, check=False, cwd=REPO)
        assert cp.returncode == 0, cp.stderr[-2000:]
        with running_controller(cluster, _munge_config(tmp_path, munge_agents), dry_run=True) as ctl:
            wait_until("a dry-run shrink decision on MUNGE-fetched data", lambda: any(
                d.action == "shrink" and d.dry_run for d in ctl.decisions(job)), 90, ctl)
            st = ctl.store()
            try:
                seen = {a.node: a for a in st.agents.list_agents()}
            finally:
                st.close()
            assert "agents: requests authenticated with SE-MUNGE" in ctl.log_text()
        polled = [n for n, a in seen.items() if a.last_seen is not None]
        assert len(polled) >= 2 and all(seen[n].last_error is None for n in polled), seen
        assert all(n in polled for n in nodes)
        st = SqlStore.open(f"sqlite:///{hmac_dir / 'state.db'}")
        try:
            refused = {a.node: a for a in st.agents.list_agents()}
        finally:
            st.close()
        assert set(munge_agents.procs) <= set(refused), refused
        for node in munge_agents.procs:  # nodes without an agent of ours fail otherwise (unreachable)
            rec = refused[node]
            assert rec.last_seen is None and "refused our credentials" in (rec.last_error or ""), rec
    finally:
        cluster.cancel(job)


def test_the_mig_workflow_reaches_a_munge_agent_with_munge_and_not_with_the_key(munge_agents: Agents) -> None:
    """The MIG workflow's agent port (``GET /v1/mig``, ``POST /v1/mig/apply``) with ``[agents] auth = "munge"`` in
    mig.toml gets through to a real agent that requires MUNGE; the same port on the shared key is refused (401) for
    both. The apply asks for the layout the node already has: the signed POST goes the whole way (credential bound
    to its body, the agent's signed answer checked), and the shared cluster's GPUs keep their layout."""
    node = "n1"
    access = AgentAccess(auth="munge", munge_agent_user=str(os.geteuid()), munge_ttl_s=30,
                         key_file=munge_agents.key_file, urls={node: munge_agents.url(node)})
    agent = HttpAgent(access, load_agent_auth(access, "mig.toml"))
    before = agent.report(node)
    assert before.node == node and before.gpus
    changes, after = agent.apply(node, before.layout())
    assert changes == () and after.layout() == before.layout()
    keyed = replace(access, auth="hmac")
    on_the_key = HttpAgent(keyed, load_agent_auth(keyed, "mig.toml"))
    with pytest.raises(WorkflowError, match=r"agent of n1: .*refused our credentials.*missing_credentials|"
                                            r"agent of n1: .*refused our credentials.*malformed_credentials"):
        on_the_key.report(node)
    with pytest.raises(WorkflowError, match="refused our credentials"):
        on_the_key.apply(node, before.layout())
