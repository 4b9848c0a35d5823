"""What the views say: decision inputs as JSON-like values, the --prewarm command as text,
powered-down nodes' agents as powered down (not stale or unreachable), elastic leaders still booting
(CONFIGURING) in ``jobs``."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_elastic.api.authz import Caller
from slurm_elastic.api.service import Service, ServiceSettings
from slurm_elastic.cli import decisions_cmd, status_cmd
from slurm_elastic.cli.output import spec_text, value_text
from slurm_elastic.controller.power import note_powered_down
from slurm_elastic.controller.units import SpecCache, build_units
from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.slurm.decode import parse_nodes
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import JobObservation, NewDecision, SpecSource
from tests.unit.policy_builders import NOW, job, snapshot
from tests.unit.storehelpers import FakeClock, memory_store

ROOT = Caller(0, "root")
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05"
PREWARM = ElasticSpec(min_nodes=1, max_nodes=3, prewarm="stage --to '/tmp/x y'",
                      explicit=frozenset({"min_nodes", "max_nodes", "prewarm"})).to_normalized()


@pytest.fixture
def store() -> SqlStore:
    st = memory_store(FakeClock(NOW))
    st.jobs.upsert_job(JobObservation(job_id=100, user="alice", partition="gpu", state="RUNNING", current_nodes=1,
                                      min_nodes=1, max_nodes=3, account="nlp", spec=PREWARM,
                                      spec_source=SpecSource.ADMIN_COMMENT))
    st.decisions.record_decisions(st.decisions.begin_cycle(), [NewDecision(
        job_id=100, action="hold", reason="RESUME_FAILED", message="m", current_nodes=1, target_nodes=1,
        inputs={"lost_nodes": ["n5"], "node_states": {"n5": "IDLE+POWERED_DOWN"}, "resume_timeout_s": None,
                "ended_by": "slurm", "cancelled": False})])
    return st


def _cli(monkeypatch: pytest.MonkeyPatch, store: SqlStore, module: object, cmd: object, *args: str) -> str:
    svc = Service(store, ServiceSettings(), clock=lambda: NOW + timedelta(seconds=5))
    monkeypatch.setattr(module, "call", lambda url, sock, op, a=None: svc.handle(ROOT, op, a or {}))
    r = CliRunner().invoke(cmd, list(args))  # type: ignore[arg-type]
    assert r.exit_code == 0, r.output
    return r.output


def test_values_print_as_json_not_python() -> None:
    assert value_text(["n5"]) == '["n5"]' and value_text({"n5": "IDLE"}) == '{"n5":"IDLE"}'
    assert (value_text(None), value_text(True), value_text("text"), value_text(2.5)) == ("null", "true", "text", "2.5")


def test_explain_prints_inputs_as_json_and_the_prewarm_command_as_text(monkeypatch: pytest.MonkeyPatch,
                                                                         store: SqlStore) -> None:
    assert "prewarm=7374" in PREWARM  # stored in hex (one token), shown as text
    out = _cli(monkeypatch, store, decisions_cmd, decisions_cmd.explain_cmd, "100")
    assert 'lost_nodes=["n5"]' in out and 'node_states={"n5":"IDLE+POWERED_DOWN"}' in out
    assert "resume_timeout_s=null" in out and "cancelled=false" in out and "['n5']" not in out
    directives = next(ln for ln in out.splitlines() if ln.startswith("directives "))
    assert """prewarm='stage --to '"'"'/tmp/x y'"'"''""" in directives and "7374" not in directives
    assert spec_text(PREWARM).endswith("prewarm='stage --to '\"'\"'/tmp/x y'\"'\"''")
    assert spec_text("elastic:v1 min=1") == "elastic:v1 min=1" and spec_text(None) == ""


def test_agents_of_powered_down_nodes_show_as_powered_down(monkeypatch: pytest.MonkeyPatch,
                                                           store: SqlStore) -> None:
    """The recorded power-saving cluster's nodes: n5, n6 IDLE+CLOUD+POWERED_DOWN (sinfo_power.json)."""
    _, nodes = parse_nodes(json.loads((RECORDED / "sinfo_power.json").read_text()))
    for name in ("n1", "n5", "n6"):
        store.agents.agent_seen(name, url=f"http://{name}:8000", version="1", gpu_count=4)
    store.agents.agent_failed("n6", url="http://n6:8000", error="connection refused")  # before it went down
    snap = replace(snapshot([], []), nodes=tuple(nodes))
    assert note_powered_down(store, snap) == ["n5", "n6"]
    assert note_powered_down(store, snap) == []  # once per power-down
    later = lambda: NOW + timedelta(hours=1)  # noqa: E731  every agent's last scrape is old by now
    s = Service(store, ServiceSettings(), clock=later).handle(ROOT, "status", {})
    assert (s["agents_powered_down"], s["agents_stale"], s["agents_reachable"]) == (["n5", "n6"], ["n1"], 0)
    rows = {a["node"]: a for a in Service(store, ServiceSettings(), clock=later).handle(ROOT, "agents", {})["agents"]}
    assert rows["n5"]["state"] == "powered down" and rows["n5"]["error"] is None
    assert rows["n1"]["state"] == "unreachable"
    out = _cli(monkeypatch, store, status_cmd, status_cmd.agents_cmd)
    assert any(ln.split()[:3] == ["n5", "powered", "down"] for ln in out.splitlines()), out
    out = _cli(monkeypatch, store, status_cmd, status_cmd.status_cmd)
    assert any(ln.split() == ["agents_powered_down", "n5,n6"] for ln in out.splitlines()), out
    store.agents.agent_seen("n5", url="http://n5:8000", version="1", gpu_count=4)  # it came back: scraped
    s = Service(store, ServiceSettings(), clock=lambda: NOW).handle(ROOT, "status", {})
    assert s["agents_powered_down"] == ["n6"]


def test_a_leader_waiting_for_its_nodes_to_boot_is_listed() -> None:
    booting = replace(job(300, state="CONFIGURING", nodes=("n5",)), nodes=("n5",),
                      admin_comment=f"[{ElasticSpec(min_nodes=1, max_nodes=2).to_normalized()}]")
    running = replace(job(301, nodes=("n1",)), admin_comment=booting.admin_comment)
    built = build_units(snapshot([booting, running], []), read_script=lambda _: None,
                        is_known_key=lambda *_: False, cache=SpecCache())
    assert [u.unit_id for u in built.units] == [301]  # the policy never resizes a job that has not started
    assert [u.unit_id for u in built.booting] == [300] and built.sources[300] == "admin_comment"
