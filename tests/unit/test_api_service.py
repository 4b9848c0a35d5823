"""The local API's authorization and operations, with an in-memory store and a fake clock; the socket server over
a real UNIX socket (peer credentials from the kernel, identity mapped by an injected function)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slurm_elastic.api.authz import AccessPolicy, Caller, PermissionDeniedError, UnknownOperationError, authorize
from slurm_elastic.api.client import ApiError, request
from slurm_elastic.api.server import ApiServer, peer_uid
from slurm_elastic.api.service import NotFoundError, RequestError, Service, ServiceSettings
from slurm_elastic.api.tomltext import PolicyEditError, apply_assignments, dumps, parse_assignment
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import parse_config
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import JobObservation, NewDecision, SpecSource
from tests.unit.storehelpers import FakeClock, memory_store

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
ROOT = Caller(0, "root")
SLURM = Caller(64030, "slurm")
ALICE = Caller(1001, "alice", frozenset({"alice"}))
BOB = Caller(1002, "bob", frozenset({"bob", "hpcops"}))
CAROL = Caller(1003, "carol", frozenset({"carol"}))


@pytest.fixture
def store() -> Iterator[SqlStore]:
    clock = FakeClock(T0)
    st = memory_store(clock)
    for job_id, user in ((10, "alice"), (20, "carol")):
        st.jobs.upsert_job(JobObservation(job_id=job_id, user=user, partition="gpu", state="RUNNING",
                                          current_nodes=2, min_nodes=1, max_nodes=3, account="nlp",
                                          spec="elastic:v1 min=1 max=3 window=60", spec_source=SpecSource.BATCH_SCRIPT))
    cycle = st.decisions.begin_cycle(holder="h")
    st.decisions.record_decisions(cycle, [
        NewDecision(job_id=10, action="hold", reason="IN_BAND", message="util 50%", inputs={"util": 50},
                    current_nodes=2, target_nodes=2),
        NewDecision(job_id=20, action="shrink", reason="UNDERUTILIZED", message="util 5%", inputs={"util": 5},
                    current_nodes=2, target_nodes=1)])
    st.decisions.finish_cycle(cycle, decisions=2, actions=0)
    yield st
    st.close()


def service(store: SqlStore, **access: object) -> Service:
    base = "version = 1\nscale_up_above = 85\n[partition.gpu]\ngrace_s = 30\n"
    return Service(store, ServiceSettings(access=AccessPolicy(**access), base_policy=lambda: (base, "policy.toml")),  # type: ignore[arg-type]
                   clock=lambda: T0 + timedelta(seconds=30))


# --- authorization -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("caller", "group", "allowed"), [
    (ROOT, "", True), (SLURM, "", True), (ALICE, "", False), (BOB, "", False), (BOB, "hpcops", True),
    (ALICE, "hpcops", False),
])
def test_changing_operations_need_root_slurmuser_or_the_operators_group(caller: Caller, group: str,
                                                                         allowed: bool) -> None:
    access = AccessPolicy(operators_group=group)
    for op in ("policy.set", "policy.rollback", "pause", "resume"):
        if allowed:
            authorize(caller, op, access)
        else:
            with pytest.raises(PermissionDeniedError, match="permission denied"):
                authorize(caller, op, access)


def test_unknown_operations_are_refused_before_any_lookup() -> None:
    with pytest.raises(UnknownOperationError):
        authorize(ROOT, "drop_all", AccessPolicy())
    with pytest.raises(UnknownOperationError):
        authorize(ROOT, "__init__", AccessPolicy())


def test_users_see_only_their_own_jobs_and_decisions(store: SqlStore) -> None:
    svc = service(store)
    assert [j["job"] for j in svc.handle(ALICE, "jobs", {})["jobs"]] == [10]
    assert [j["job"] for j in svc.handle(ROOT, "jobs", {})["jobs"]] == [10, 20]
    assert {d["job"] for d in svc.handle(ALICE, "decisions", {})["decisions"]} == {10}
    assert {d["job"] for d in svc.handle(SLURM, "decisions", {})["decisions"]} == {10, 20}
    with pytest.raises(PermissionDeniedError, match="job 20"):
        svc.handle(ALICE, "decisions", {"job": 20})
    with pytest.raises(PermissionDeniedError, match="not your job"):
        svc.handle(ALICE, "explain", {"job": 20})
    # A user cannot tell a foreign job from a missing one; an admin gets "not found".
    with pytest.raises(PermissionDeniedError):
        svc.handle(ALICE, "explain", {"job": 999})
    with pytest.raises(NotFoundError):
        svc.handle(ROOT, "explain", {"job": 999})
    assert svc.handle(ALICE, "status", {})["managed_jobs"] == 1


def test_the_site_may_let_users_see_every_job_but_still_not_change_anything(store: SqlStore) -> None:
    svc = service(store, users_see_all=True)
    assert [j["job"] for j in svc.handle(ALICE, "jobs", {})["jobs"]] == [10, 20]
    assert svc.handle(ALICE, "explain", {"job": 20})["user"] == "carol"
    with pytest.raises(PermissionDeniedError):
        svc.handle(ALICE, "pause", {"scope": "global"})


# --- explain ---------------------------------------------------------------------------------------------------

def test_explain_gives_each_value_with_its_provenance_and_the_decisions_with_inputs(store: SqlStore) -> None:
    r = service(store).handle(ALICE, "explain", {"job": 10})
    src = {s["key"]: (s["value"], s["source"]) for s in r["settings"]}
    assert src["scale_up_above"] == (85, "global")
    assert src["grace_s"] == (30, "partition gpu")
    assert src["window_s"] == (60, "directive")
    assert src["cooldown_s"][1] == "default"
    assert r["policy_source"] == "policy.toml"
    assert [(d["reason"], d["inputs"]) for d in r["decisions"]] == [("IN_BAND", {"util": 50})]


# --- policy ------------------------------------------------------------------------------------------------------

def test_policy_set_validates_before_storing_and_records_who(store: SqlStore) -> None:
    svc = service(store)
    with pytest.raises(ConfigError, match="scale_up_above"):
        svc.handle(ROOT, "policy.set", {"assignments": ["scale_up_above=1000"]})
    with pytest.raises(ConfigError, match="no_such_key"):
        svc.handle(ROOT, "policy.set", {"assignments": ["no_such_key=1"]})
    assert store.policies.current_policy() is None
    v1 = svc.handle(SLURM, "policy.set", {"assignments": ["scale_down_below=20", "partition.gpu.grace_s=45"]})
    assert v1["version"] == 1 and v1["author"] == "slurm"
    cfg = parse_config(store.policies.get_policy(1).toml_text)
    assert cfg.resolve("scale_up_above").value == 85  # the base policy's values are kept
    assert cfg.resolve("grace_s", partition="gpu").value == 45
    svc.handle(ROOT, "policy.set", {"assignments": ["scale_up_above=90"]})
    assert "+scale_up_above = 90" in svc.handle(ALICE, "policy.diff", {})["diff"]
    rb = svc.handle(ROOT, "policy.rollback", {"version": 1})
    assert rb == {"version": 3, "rollback_of": 1, "author": "root"}
    assert [v["version"] for v in svc.handle(ALICE, "policy.history", {})["versions"]] == [3, 2, 1]
    assert svc.handle(ALICE, "policy.show", {})["version"] == 3
    with pytest.raises(PermissionDeniedError):
        svc.handle(ALICE, "policy.set", {"assignments": ["scale_up_above=90"]})
    with pytest.raises(RequestError):
        svc.handle(ROOT, "policy.set", {"assignments": []})


@pytest.mark.parametrize(("text", "path", "value"), [
    ("scale_up_above=70", ["scale_up_above"], 70), ("signal=USR2", ["signal"], "USR2"),
    ('signal="USR1"', ["signal"], "USR1"), ("paused=true", ["paused"], True),
    ("paused_jobs=[1, 2]", ["paused_jobs"], [1, 2]), ("partition.gpu.grace_s=5", ["partition", "gpu", "grace_s"], 5),
])
def test_assignments_are_read_as_toml_values(text: str, path: list[str], value: object) -> None:
    assert parse_assignment(text) == (path, value)


@pytest.mark.parametrize("text", ["novalue", "=3", "a..b=1", "x=not valid toml{"])
def test_bad_assignments_are_refused(text: str) -> None:
    with pytest.raises(PolicyEditError):
        parse_assignment(text)


def test_written_policy_text_reads_back_the_same() -> None:
    data = {"version": 1, "scale_up_above": 70, "pending_block_reasons": ["Resources"],
            "partition": {"gpu": {"grace_s": 5}}, "profile": {"night": {"windows": ["Mon-Fri 22:00-06:00"],
                                                                          "account": {"x y": {"paused": True}}}}}
    import tomllib

    assert tomllib.loads(dumps(data)) == data
    text = dumps({"partition": {"b": {"x": 1}, "a": {"y": "é\"\n"}}, "z": 1.5, "version": 1})
    assert text.index("version") < text.index("z = 1.5") < text.index("[partition.a]") < text.index("[partition.b]")
    assert tomllib.loads(text)["partition"]["a"]["y"] == "é\"\n"
    with pytest.raises(PolicyEditError, match="cannot write"):
        dumps({"version": 1, "x": object()})
    with pytest.raises(PolicyEditError, match="is a value"):
        apply_assignments({"version": 1, "partition": 3}, ["partition.gpu.grace_s=1"])


# --- pauses ------------------------------------------------------------------------------------------------------

def test_pause_and_resume_by_scope(store: SqlStore) -> None:
    svc = service(store)
    assert svc.handle(ROOT, "pause", {"scope": "job", "target": "10", "reason": "debug"})["who"] == "root"
    assert svc.handle(ALICE, "explain", {"job": 10})["paused_by"]["scope"] == "job"
    assert svc.handle(ROOT, "pause", {"scope": "partition", "target": "gpu"})["target"] == "gpu"
    assert [p["scope"] for p in svc.handle(ROOT, "status", {})["pauses"]] == ["partition", "job"]
    assert svc.handle(ROOT, "resume", {"scope": "job", "target": "10"})["resumed"] is True
    assert svc.handle(ROOT, "resume", {"scope": "job", "target": "10"})["resumed"] is False
    with pytest.raises(RequestError):
        svc.handle(ROOT, "pause", {"scope": "cluster"})


def test_status_and_agents(store: SqlStore) -> None:
    store.agents.agent_seen("n1", url="http://n1:9817", version="0.1", gpu_count=4)
    store.agents.agent_failed("n2", url="http://n2:9817", error="timeout")
    s = service(store).handle(BOB, "status", {})
    assert s["controller"] == "down" and s["managed_jobs"] == 0 and s["agents_stale"] == ["n2"]  # no lease holder
    assert s["last_cycle"] is not None
    agents = {a["node"]: a for a in service(store).handle(BOB, "agents", {})["agents"]}
    assert agents["n1"]["reachable"] and agents["n1"]["gpus"] == 4
    assert not agents["n2"]["reachable"] and agents["n2"]["error"] == "timeout"


# --- the socket ------------------------------------------------------------------------------------------------

@pytest.fixture
def short_dir() -> Iterator[Path]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="se-api-") as d:  # AF_UNIX paths are limited to 107 bytes
        yield Path(d)


def test_the_server_takes_the_caller_from_the_kernel_not_from_the_request(store: SqlStore, short_dir: Path) -> None:
    import os

    seen: list[int] = []

    def identify(uid: int) -> Caller:
        seen.append(uid)
        return ALICE  # whatever the process is, the server decides who it is

    server = ApiServer(short_dir / "c.sock", service(store), identify=identify)
    server.start()
    try:
        assert oct((short_dir / "c.sock").stat().st_mode & 0o777) == "0o666"
        assert request(short_dir / "c.sock", "whoami", {"user": "root"}) == {"user": "alice", "uid": 1001,
                                                                           "admin": False}
        assert seen == [os.getuid()]
        with pytest.raises(ApiError, match="permission denied") as e:
            request(short_dir / "c.sock", "pause", {"scope": "global"})
        assert e.value.kind == "permission"
        with pytest.raises(ApiError, match="unknown operation"):
            request(short_dir / "c.sock", "no.such", {})
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(short_dir / "c.sock"))
            assert peer_uid(s) == os.getuid()
            s.sendall(b"not json\n")
            assert json.loads(s.makefile().readline())["kind"] == "request"
    finally:
        server.stop()
    assert not (short_dir / "c.sock").exists()
    with pytest.raises(ApiError, match="not reachable") as down:
        request(short_dir / "c.sock", "status")
    assert down.value.kind == "down"
