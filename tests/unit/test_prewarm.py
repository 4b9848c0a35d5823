"""#ELASTIC --prewarm: quoting, the extension's prewarm run (slurm_elastic/prewarm.py, launch.py), the extension
request, and the controller's cold-start record (controller/coldstart.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from slurm_elastic import prewarm, resize
from slurm_elastic.controller.coldstart import ColdStarts, decide_prewarms, outcome, restart_cost
from slurm_elastic.controller.extension import build_request, prewarm_of
from slurm_elastic.controller.power import PowerTracker
from slurm_elastic.controller.rulings import CancelExtension, Ruling
from slurm_elastic.controller.units import SpecCache, spec_for
from slurm_elastic.directives.words import Word, WordError, command_argv, split_words
from slurm_elastic.policy.inputs import UnitMeasure, utilization
from slurm_elastic.slurm.model import Job
from slurm_elastic.store.records import ExtensionRecord, JobObservation
from tests.unit.policy_builders import NOW, job, node, snapshot, unit
from tests.unit.storehelpers import FakeClock, memory_store

REPO = Path(__file__).resolve().parents[2]


def test_words_quote_only_at_a_word_start_and_never_escape() -> None:
    assert split_words(b"--prewarm 'a b' x'y \"it's\" # c 'open") == [
        Word(b"--prewarm", False), Word(b"a b", True), Word(b"x'y", False), Word(b"it's", True)]
    assert split_words(b"--prewarm='python -c \"1\"' --max-nodes 2") == [
        Word(b"--prewarm=python -c \"1\"", False), Word(b"--max-nodes", False), Word(b"2", False)]
    assert split_words(b"'#x' '' ") == [Word(b"#x", True), Word(b"", True)]
    with pytest.raises(WordError, match="unterminated ' quote"):
        split_words(b"--prewarm 'abc")
    with pytest.raises(WordError, match="text right after a closing \" quote"):
        split_words(b'"a"b')
    assert command_argv("python -c 'import sys; sys.exit(0)' --to /tmp/x # y") == [
        "python", "-c", "import sys; sys.exit(0)", "--to", "/tmp/x", "#", "y"]


def test_run_reports_status_missing_program_and_timeout(tmp_path: Path) -> None:
    assert prewarm.run([sys.executable, "-c", "pass"], 30) == (True, 0, None)
    assert prewarm.run([sys.executable, "-c", "raise SystemExit(4)"], 30) == (False, 4, "exited with status 4")
    ok, rc, why = prewarm.run([str(tmp_path / "nope")], 30)
    assert not ok and rc is None and why is not None and why.startswith("cannot start")
    child = tmp_path / "child.pid"
    # The command starts a grandchild: the timeout kills the whole group, not only the command.
    code = f"import subprocess,time; p=subprocess.Popen(['sleep','60']); open({str(child)!r},'w').write(str(p.pid)); " \
           "time.sleep(60)"
    ok, rc, why = prewarm.run([sys.executable, "-c", code], 1.0)
    assert (ok, rc, why) == (False, None, "timed out after 1s")
    pid = int(child.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # reaped by init: gone once it has been killed
            os.kill(pid, 0)
            subprocess.run(["sleep", "0.05"], check=True)


def _env(tmp_path: Path, command: str, *, job_id: int = 77, nodes: int = 1, node: str = "n5") -> dict[str, str]:
    return {prewarm.ENV_COMMAND: command, prewarm.ENV_TIMEOUT: "20", prewarm.ENV_FILE: str(tmp_path / "p.jsonl"),
            "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NUM_NODES": str(nodes), "SLURMD_NODENAME": node}


def test_prewarm_and_wait_records_each_step(tmp_path: Path) -> None:
    path = str(tmp_path / "p.jsonl")
    assert prewarm.prewarm_and_wait({}, path=path) is None  # no --prewarm: nothing to do
    assert prewarm.prewarm_and_wait(_env(tmp_path, f"{sys.executable} -c pass"), path=path) is True
    assert [e.event for e in prewarm.read_events(path)] == ["launch", "ready"]
    assert prewarm.prewarm_and_wait(_env(tmp_path, f"{sys.executable} -c 'raise SystemExit(2)'", job_id=78),
                                    path=path) is False
    failed = [e for e in prewarm.read_events(path) if e.job == 78 and e.event == "failed"]
    assert [(e.rc, e.error) for e in failed] == [(2, "exited with status 2")]


def test_a_node_does_not_join_when_another_node_of_its_job_failed(tmp_path: Path) -> None:
    path = str(tmp_path / "p.jsonl")
    prewarm.record(path, "failed", job=79, node="n6", error="timed out after 20s")
    assert prewarm.prewarm_and_wait(_env(tmp_path, f"{sys.executable} -c pass", job_id=79, nodes=2),
                                    path=path) is False


PROGRAM = "import sys; open(sys.argv[1], 'w').write('started')"


def _launch(tmp_path: Path, command: str) -> tuple[subprocess.CompletedProcess[bytes], Path, Path]:
    out, notice_file = tmp_path / "out", tmp_path / "resize-5.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), resize.ENV_FILE: str(notice_file),
           "SLURM_ELASTIC_ROLE": "extension", "SLURM_ELASTIC_NOTICE_GRACE": "0.5", "SLURM_NODEID": "0",
           **_env(tmp_path, command)}
    done = subprocess.run([sys.executable, "-m", "slurm_elastic.launch", "exec", sys.executable, "-c", PROGRAM,
                           str(out)], check=False, env=env, timeout=60)
    return done, out, notice_file


def test_launcher_does_not_join_or_disturb_the_leader_when_the_prewarm_fails(tmp_path: Path) -> None:
    done, out, notice_file = _launch(tmp_path, f"{sys.executable} -c 'raise SystemExit(1)'")
    assert done.returncode == 3
    assert not out.exists()  # the workers never started
    assert not notice_file.exists()  # the leader was never asked to checkpoint


def test_launcher_posts_the_notice_only_after_the_prewarm(tmp_path: Path) -> None:
    notice_file = tmp_path / "resize-5.json"
    seen = tmp_path / "seen"
    # The prewarm itself records whether a notice was already there while it ran.
    check = f"import os; open({str(seen)!r}, 'w').write(str(os.path.exists({str(notice_file)!r})))"
    done, out, _ = _launch(tmp_path, f"{sys.executable} -c \"{check}\"")
    assert done.returncode == 0 and out.read_text() == "started"
    assert seen.read_text() == "False"
    n = resize.read_notice(str(notice_file))
    assert n is not None and n.kind == "grow" and n.id == "ext:77:prewarm"
    events = prewarm.read_events(str(tmp_path / "p.jsonl"))
    assert [e.event for e in events] == ["launch", "ready", "joined"]
    assert events[1].time <= n.time <= events[2].time


def test_extension_request_carries_the_prewarm_and_the_plugin_spec_gives_it() -> None:
    leader = replace(job(100, nodes=("n1",)), admin_comment="[elastic:v1 prewarm=7374616765202D2D6661737420 "
                                                            "prewarmtimeout=90]")
    def prewarm_read(j: Job, script: str) -> tuple[str, int] | None:  # the grow's prewarm: the unit's spec
        spec, _, _ = spec_for(j, lambda _id: script, SpecCache())
        assert spec is not None
        return prewarm_of(spec)

    assert prewarm_read(leader, "#!/bin/bash\nrun\n") == ("stage --fast ", 90)
    from_script = replace(leader, admin_comment="")
    assert prewarm_read(from_script, "#!/bin/bash\n#ELASTIC --prewarm 'a b'\nrun\n") == ("a b", 600)
    assert prewarm_read(from_script, "#!/bin/bash\n#ELASTIC --max-nodes 2\nrun\n") is None
    req = build_request(leader, ["n5"], "k", NOW, rendezvous="h:1", prewarm=("a b", 90))
    assert req.env[prewarm.ENV_COMMAND] == "a b" and req.env[prewarm.ENV_TIMEOUT] == "90"
    assert prewarm.ENV_COMMAND not in build_request(leader, ["n5"], "k", NOW, rendezvous="h:1").env


def _rec(job_id: int, nodes: str = "n5", count: int = 1) -> ExtensionRecord:
    return ExtensionRecord(job_id=job_id, parent_job_id=100, node_count=count, nodelist=nodes, state="RUNNING",
                           action_id=1, idempotency_key=None, created_at=NOW, updated_at=NOW, ended_at=None)


def _ev(job_id: int, node: str, event: str, after_s: float, **kw: object) -> prewarm.Event:
    return prewarm.Event(job=job_id, node=node, event=event, time=NOW.timestamp() + after_s, **kw)  # type: ignore[arg-type]


def test_phases_are_back_to_back_from_submission_to_the_last_join() -> None:
    events = [_ev(501, "n5", "launch", 20), _ev(501, "n6", "launch", 22), _ev(501, "n5", "ready", 30),
              _ev(501, "n6", "ready", 35), _ev(501, "n5", "joined", 38)]
    resumed = {"n5": (NOW + timedelta(seconds=15), 12.0), "n6": (NOW - timedelta(seconds=60), 99.0)}
    assert outcome(_rec(501, "n5,n6", 2), events, resumed).kind == "waiting"  # n6 has not joined yet
    o = outcome(_rec(501, "n5,n6", 2), [*events, _ev(501, "n6", "joined", 40)], resumed)
    # n6's resume ended before this grow was submitted: not this grow's
    assert o.kind == "joined" and o.phases == {"resume": 12.0, "start": 10.0, "prewarm": 13.0, "join": 5.0}
    assert restart_cost(o.phases) == 28.0
    bad = outcome(_rec(502), [_ev(502, "n5", "launch", 1), _ev(502, "n5", "failed", 9, rc=None,
                                                                 error="timed out after 8s")], {})
    assert (bad.kind, bad.failed_node, bad.error) == ("failed", "n5", "timed out after 8s")


def _write(path: Path, *events: prewarm.Event) -> None:
    with path.open("a") as f:
        for e in events:
            f.write(json.dumps({"job": e.job, "node": e.node, "event": e.event, "time": e.time,
                                **({"error": e.error} if e.error else {})}) + "\n")


def test_the_shell_cancels_a_failed_prewarm_and_records_cold_starts_as_restart_cost(tmp_path: Path) -> None:
    clock = FakeClock(NOW)
    store = memory_store(clock)
    leader = replace(job(100, nodes=("n1",), user="root"), working_dir=str(tmp_path))
    u = unit(leader, prewarm="stage", prewarm_timeout_s=60)
    store.jobs.upsert_job(JobObservation(job_id=100, user="root", account="acct", partition="gpu", state="RUNNING",
                                         current_nodes=1, min_nodes=1, max_nodes=4))
    store.jobs.record_extension(job_id=501, parent_job_id=100, node_count=1, state="RUNNING", nodelist="n5")
    store.jobs.record_extension(job_id=502, parent_job_id=100, node_count=1, state="RUNNING", nodelist="n6")
    (tmp_path / ".slurm-elastic").mkdir()
    path = tmp_path / ".slurm-elastic" / "prewarm-100.jsonl"
    _write(path, _ev(501, "n5", "launch", 5), _ev(501, "n5", "failed", 65, error="timed out after 60s"),
           _ev(502, "n6", "launch", 4), _ev(502, "n6", "ready", 10))
    shell = ColdStarts(store, PowerTracker())
    ext = replace(job(501, nodes=("n5",)), node_count=1)
    snap = snapshot([leader, ext], [node("n1", used=4), node("n5", used=4), node("n6", used=4)])
    cycle = store.decisions.begin_cycle()

    def decide_and_record(shell: ColdStarts) -> list[Ruling]:  # the cycle's write step, without Slurm
        rulings = shell.decide({100: u}, snap, NOW)
        store.decisions.record_decisions(cycle, [v.decision for v in rulings])
        return rulings

    (v,) = decide_and_record(shell)
    d = v.decision
    assert v.cancel == CancelExtension(100, 501, "PREWARM_FAILED", ("n5",))
    assert (d.reason, d.current_nodes, d.target_nodes) == ("PREWARM_FAILED", 1, 1)
    assert "timed out after 60s" in d.message and d.inputs["node"] == "n5"
    assert decide_and_record(shell) == []  # once
    assert shell.restart_s(NOW) == {}
    _write(path, _ev(502, "n6", "joined", 16))
    (w,) = decide_and_record(shell)
    c = w.decision
    assert c.reason == "COLD_START" and c.inputs["restart_cost_s"] == 16.0 and c.inputs["prewarm_s"] == 6.0
    assert w.cancel is None
    # A restarted controller neither records them again nor forgets the restart cost.
    again = ColdStarts(store, PowerTracker())
    assert decide_and_record(again) == []
    assert again.restart_s(NOW + timedelta(seconds=1)) == {100: 16.0}


def test_the_cold_start_reaches_the_policy_as_restart_s_even_without_goodput() -> None:
    from slurm_elastic.policy import parse_config
    from slurm_elastic.policy.inputs import PolicyInputBuilder, Sample

    u = unit(job(100, nodes=("n1",)), prewarm="stage")
    samples = {100: [Sample(NOW - timedelta(seconds=s), 90.0, 95.0) for s in (60, 30, 0)]}
    builder = PolicyInputBuilder(parse_config("version = 1\nwindow_s = 120\n"), NOW, 30.0)
    assert not builder.reads(u).goodput  # the goodput reader's observed restart would be dropped
    inp = builder.build(snapshot([u.job], [node("n1", used=4)]), [u], samples=samples,
                        measures={100: UnitMeasure(4, 4, restart_s=99.0, cold_start_s=16.0)})
    assert inp.utilization[100].restart_s == 16.0
    assert inp.utilization[100].throughput == ()
    both = utilization(100, samples[100], NOW - timedelta(minutes=5),
                       UnitMeasure(4, 4, restart_s=30.0, cold_start_s=16.0))
    assert both is not None and both.restart_s == 30.0  # the larger of observed and measured


def test_the_prewarm_decider_is_pure_and_cancels_only_a_live_extension_outside_dry_run() -> None:
    u = unit(job(100, nodes=("n1",)), prewarm="stage", prewarm_timeout_s=60)
    failed = outcome(_rec(501, "n5"), [_ev(501, "n5", "failed", 65, error="timed out after 60s")], {})
    joined = outcome(_rec(502, "n6"), [_ev(502, "n6", e, t) for e, t in (("launch", 4), ("ready", 10), ("joined", 16))],
                     {})
    live = replace(job(501, nodes=("n5",)), node_count=1)
    snap = snapshot([u.job, live], [node("n1", used=4), node("n5", used=4), node("n6", used=4)])
    outcomes = [(_rec(501, "n5"), failed), (_rec(502, "n6"), joined)]
    rulings = decide_prewarms({100: u}, outcomes, snap, NOW, ends=())
    assert [(v.decision.reason, v.cancel) for v in rulings] == [
        ("PREWARM_FAILED", CancelExtension(100, 501, "PREWARM_FAILED", ("n5",))), ("COLD_START", None)]
    assert "(--prewarm-timeout 60s)" in rulings[0].decision.message
    dry = decide_prewarms({100: u}, outcomes, snap, NOW, ends=(), dry_run=True)
    assert [v.cancel for v in dry] == [None, None] and dry[0].decision.inputs["ended_by"] == "job"
    gone = snapshot([u.job], [node("n1", used=4)])  # Slurm no longer holds it: nothing to cancel
    assert decide_prewarms({100: u}, outcomes, gone, NOW, ends=())[0].cancel is None
    assert decide_prewarms({100: u}, outcomes, snap, NOW, ends=()) == rulings  # the same facts, the same rulings
