"""Goodput on the controller side: the publish helper, the safe reader, attribution to sizes, restart times, and
whole controller cycles (in-memory Slurm, fake clock) where a linearly scaling job grows and a flat one shrinks
back. The live-cluster version of the flat case is tests/cluster/test_goodput_cluster.py."""

from __future__ import annotations

import ast
import json
import os
import pwd
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slurm_elastic import goodput
from slurm_elastic.controller.goodput import (
    GoodputReader,
    Refused,
    Report,
    Resize,
    attribute,
    parse_lines,
    read_file,
    restart_times,
    throughput_samples,
)
from slurm_elastic.policy import ElasticUnit, parse_config, resolve_unit
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState, DecisionFilter, ExtensionRecord
from tests.unit.controller_scenarios import replay_in
from tests.unit.policy_builders import ext, job, spec, util
from tests.unit.slurm_replay import Replayed
from tests.unit.test_controller_cycle import Agents

REPO = Path(__file__).resolve().parents[2]
ALICE = pwd.getpwnam("alice").pw_uid if any(p.pw_name == "alice" for p in pwd.getpwall()) else None
needs_root = pytest.mark.skipif(os.geteuid() != 0 or ALICE is None,
                                reason="ownership tests need root and a user alice (the test cluster's)")
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def lines(*objs: object) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objs)


def owned_file(path: Path, data: bytes, uid: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


# --- the publish helper ---------------------------------------------------------------------------------------
def test_publish_appends_one_json_line_per_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(goodput.ENV_FILE, raising=False)
    monkeypatch.delenv("SLURM_ELASTIC_PARENT", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert goodput.publish(samples_per_s=1200.5, nodes=2, at=1000.0)
    assert goodput.publish(steps_per_s=2.0, global_batch=256, at=1001.0)
    assert not goodput.publish(samples_per_s=float("nan"))  # never written, never raises
    assert not goodput.publish(samples_per_s=0.0)
    path = tmp_path / ".slurm-elastic" / "goodput-42.jsonl"
    got = [json.loads(x) for x in path.read_text().splitlines()]
    assert got == [{"time": 1000.0, "samples_per_s": 1200.5, "nodes": 2},
                   {"time": 1001.0, "steps_per_s": 2.0, "global_batch": 256}]
    reports, bad = parse_lines(path.read_bytes(), now=2000.0)
    assert bad == 0 and [(r.value, r.nodes) for r in reports] == [(1200.5, 2), (512.0, None)]


def test_publish_in_an_extension_job_writes_the_leaders_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(goodput.ENV_FILE, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    monkeypatch.setenv("SLURM_ELASTIC_PARENT", "40")
    assert goodput.default_path() == str(tmp_path / ".slurm-elastic" / "goodput-40.jsonl")
    monkeypatch.setenv(goodput.ENV_FILE, str(tmp_path / "x.jsonl"))
    assert goodput.default_path() == str(tmp_path / "x.jsonl")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert goodput.nodes_from_env() == 2
    with pytest.raises(ValueError):
        goodput.publish(samples_per_s=1.0, steps_per_s=1.0, global_batch=2)
    with pytest.raises(ValueError):
        goodput.publish(steps_per_s=1.0)


def test_the_helper_needs_only_the_standard_library() -> None:
    # goodput.py and the batch-size model it shares with the policy (batchsize.py) import only the stdlib
    for name, allowed in (("goodput.py", {"slurm_elastic.batchsize"}), ("batchsize.py", set())):
        tree = ast.parse((REPO / "slurm_elastic" / name).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported = {m if m.startswith("slurm_elastic") else m.split(".")[0] for m in imported}
        assert imported <= set(sys.stdlib_module_names) | {"__future__"} | allowed, name
    # and importing it pulls in nothing of the project beyond the package's own tiny __init__ and that model
    code = ("import sys; import slurm_elastic.goodput; "
            "print(sorted(m for m in sys.modules if m.startswith('slurm_elastic')))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout
    assert out.strip() == "['slurm_elastic', 'slurm_elastic.batchsize', 'slurm_elastic.goodput']"


# --- parsing --------------------------------------------------------------------------------------------------
def test_bad_lines_are_skipped_and_counted() -> None:
    data = (lines({"time": 100, "samples_per_s": 10.0}) + b"not json\n" + b"[1,2]\n"
            + lines({"time": 101, "samples_per_s": -1}, {"time": 102, "samples_per_s": float("inf")},
                    {"time": 103}, {"time": "x", "samples_per_s": 1}, {"time": 104, "samples_per_s": 5, "nodes": 0},
                    {"time": 105, "samples_per_s": 5, "nodes": 1.5}, {"time": 106, "samples_per_s": True},
                    {"time": 9999, "samples_per_s": 5},  # in the future
                    {"time": 107, "steps_per_s": 2, "global_batch": 8, "nodes": 3})
            + b"\n  \n")
    reports, bad = parse_lines(data, now=1000.0)
    assert [(r.at, r.value, r.nodes) for r in reports] == [(100.0, 10.0, None), (107.0, 16.0, 3)]
    assert bad == 10


# --- reading the file safely ----------------------------------------------------------------------------------
def test_reads_complete_lines_only_then_the_rest_once_it_is_written(tmp_path: Path) -> None:
    uid = os.geteuid()
    path = owned_file(tmp_path / "g.jsonl", lines({"time": 100, "samples_per_s": 1.0}) + b'{"time": 101, "sam')
    st = read_file(str(path), uid, None, now=1000.0)
    assert st is not None and [r.at for r in st.reports] == [100.0] and st.bad_lines == 0
    with open(path, "ab") as f:
        f.write(b'ples_per_s": 2.0}\n')
    st2 = read_file(str(path), uid, st, now=1000.0)
    assert st2 is st and [r.value for r in st.reports] == [1.0, 2.0] and st.bad_lines == 0


def test_an_unchanged_file_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uid = os.geteuid()
    path = owned_file(tmp_path / "g.jsonl", lines({"time": 100, "samples_per_s": 1.0}))
    st = read_file(str(path), uid, None, now=1000.0)
    calls: list[int] = []
    real = os.open

    def counting_open(*a: Any, **k: Any) -> int:
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(os, "open", counting_open)
    assert read_file(str(path), uid, st, now=1000.0) is st
    assert len(calls) == 1  # the directory only; the file itself was not opened
    with open(path, "ab") as f:
        f.write(lines({"time": 101, "samples_per_s": 2.0}))
    read_file(str(path), uid, st, now=1000.0)
    assert len(calls) == 3 and [r.value for r in st.reports] == [1.0, 2.0]  # type: ignore[union-attr]


def test_only_the_last_64k_are_read(tmp_path: Path) -> None:
    body = b"".join(lines({"time": 100 + i, "samples_per_s": float(i + 1)}) for i in range(5000))
    assert len(body) > 3 * 64 * 1024
    path = owned_file(tmp_path / "g.jsonl", body)
    st = read_file(str(path), os.geteuid(), None, now=1e6)
    assert st is not None and st.bad_lines == 0  # the partial first line of the tail is dropped, not counted
    assert 0 < len(st.reports) < 5000 and st.reports[-1].value == 5000.0
    assert sum(len(json.dumps({"time": r.at, "samples_per_s": r.value})) for r in st.reports) <= 64 * 1024 * 1.2
    # a replaced (rotated) file starts over
    path.unlink()
    owned_file(path, lines({"time": 7, "samples_per_s": 3.0}))
    st = read_file(str(path), os.geteuid(), st, now=1e6)
    assert st is not None and [r.value for r in st.reports] == [3.0]


@needs_root
def test_a_file_not_owned_by_the_jobs_user_is_refused(tmp_path: Path) -> None:
    assert ALICE is not None
    path = owned_file(tmp_path / "g.jsonl", lines({"time": 100, "samples_per_s": 1.0}))  # root's
    with pytest.raises(Refused, match="owned by uid 0"):
        read_file(str(path), ALICE, None, now=1000.0)
    os.chown(path, ALICE, -1)
    st = read_file(str(path), ALICE, None, now=1000.0)
    assert st is not None and len(st.reports) == 1


@needs_root
def test_symlinks_and_special_files_are_refused(tmp_path: Path) -> None:
    assert ALICE is not None
    secret = owned_file(tmp_path / "secret", lines({"time": 100, "samples_per_s": 1.0}), ALICE)
    d = tmp_path / ".slurm-elastic"
    d.mkdir()
    (d / "goodput-1.jsonl").symlink_to(secret)
    os.lchown(d / "goodput-1.jsonl", ALICE, -1)
    with pytest.raises(Refused, match="symlink"):
        read_file(str(d / "goodput-1.jsonl"), ALICE, None, now=1000.0)
    os.mkfifo(d / "goodput-2.jsonl")  # a FIFO must neither block the controller nor be read
    os.chown(d / "goodput-2.jsonl", ALICE, -1)
    with pytest.raises(Refused, match="regular"):
        read_file(str(d / "goodput-2.jsonl"), ALICE, None, now=1000.0)
    # a symlinked directory is refused too
    real = tmp_path / "elsewhere"
    owned_file(real / "goodput-3.jsonl", lines({"time": 100, "samples_per_s": 1.0}), ALICE)
    link = tmp_path / "w2" / ".slurm-elastic"
    link.parent.mkdir()
    link.symlink_to(real)
    with pytest.raises(Refused, match="not a plain directory"):
        read_file(str(link / "goodput-3.jsonl"), ALICE, None, now=1000.0)
    assert read_file(str(tmp_path / "none" / "goodput-9.jsonl"), ALICE, None, now=1000.0) is None


# --- attribution and restart times ---------------------------------------------------------------------------
def rep(at: float, value: float = 100.0, nodes: int | None = None) -> Report:
    return Report(at=at, value=value, nodes=nodes)


def test_unlabelled_reports_take_the_size_at_their_time_and_skip_the_settling() -> None:
    # 1 node until a grow applied at 1000 (intent at 995), 2 nodes until a shrink (signal 1500, released 1505)
    history = [Resize(995, 1000, 1000, 1, 2), Resize(1500, 1505, 1505, 2, 1)]
    reports = [rep(t) for t in (900, 990, 996, 1005, 1011, 1100, 1499, 1502, 1510, 1516, 1600)]
    got = {r.at: n for r, n in attribute(reports, history, current=1, settle_s=10)}
    assert got == {900: 1, 990: 1, 1011: 2, 1100: 2, 1499: 2, 1516: 1, 1600: 1}
    # a label wins over the walk, but settling still applies
    got = {r.at: n for r, n in attribute([rep(1100, nodes=4), rep(1005, nodes=2)], history, current=1)}
    assert got == {1100: 4}


def test_open_actions_and_pending_extensions_stop_attribution() -> None:
    history = [Resize(1000, None, None, 1, 2)]  # a grow whose extension is still pending
    got = {r.at: n for r, n in attribute([rep(900), rep(1001), rep(1200)], history, current=1)}
    assert got == {900: 1}


def test_a_walk_that_does_not_add_up_drops_the_older_reports() -> None:
    # the journal says 1 -> 2 but the unit runs 3 nodes now (an extension was added outside the journal's view)
    history = [Resize(995, 1000, 1000, 1, 2)]
    got = {r.at: n for r, n in attribute([rep(900), rep(1100)], history, current=3)}
    assert got == {1100: 3}


def test_restart_time_is_the_first_report_at_the_new_size() -> None:
    history = [Resize(995, 1000, 1000, 1, 2), Resize(1500, 1505, 1505, 2, 1), Resize(2000, 2010, 2010, 1, 2)]
    reports = [rep(t) for t in (900, 950, 1030, 1040, 1600, 1700)] + [rep(2015, nodes=1), rep(2050, nodes=2)]
    assert restart_times(reports, history) == [30.0, 95.0, 40.0]
    # a job that only starts publishing after a resize gives no restart time for it
    assert restart_times([rep(1030), rep(1040)], history[:1]) == []


def test_keeps_the_most_recent_per_size() -> None:
    attributed = [(rep(1000 - i, float(i)), 1 if i % 2 else 2) for i in range(100)]
    samples = throughput_samples(attributed, per_size=5)
    assert sorted(s.value for s in samples if s.nodes == 2) == [0, 2, 4, 6, 8]
    assert sorted(s.value for s in samples if s.nodes == 1) == [1, 3, 5, 7, 9]
    assert [s.at for s in samples] == sorted(s.at for s in samples)


# --- the reader on a unit, with a journal -------------------------------------------------------------------
class Journal:
    def __init__(self, actions: list[ActionRecord], exts: list[ExtensionRecord]) -> None:
        self._actions, self._exts = actions, exts

    def actions(self, job_id: int) -> list[ActionRecord]:
        return [a for a in self._actions if a.job_id == job_id]

    def extensions(self, job_id: int) -> list[ExtensionRecord]:
        return [e for e in self._exts if e.parent_job_id == job_id]


def action(aid: int, kind: ActionKind, created: datetime, finished: datetime | None, frm: int, to: int,
           state: ActionState = ActionState.APPLIED) -> ActionRecord:
    return ActionRecord(id=aid, job_id=7, kind=kind, idempotency_key=f"k{aid}", params={"from": frm, "to": to},
                        state=state, message="", transient=False, attempts=1, nodes=1, gpus=4, decision_id=None,
                        cycle_id=None, fencing_epoch=None, created_at=created, updated_at=created,
                        finished_at=finished)


def unit_in(work_dir: Path, *, user: str, exts: tuple = ()) -> ElasticUnit:  # type: ignore[type-arg]
    j = replace(job(7, nodes=("n1",), user=user), working_dir=str(work_dir))
    return ElasticUnit(job=j, spec=spec(min_nodes=1, max_nodes=4), extensions=exts)


def test_attach_feeds_samples_and_the_median_restart_to_the_policy(tmp_path: Path) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    t0 = NOW - timedelta(seconds=400)
    grow_at = t0 + timedelta(seconds=100)
    started = grow_at + timedelta(seconds=3)  # the extension job started 3 s after it was submitted
    recs = [{"time": (t0 + timedelta(seconds=s)).timestamp(), "samples_per_s": 100.0 if s < 100 else 190.0}
            for s in range(0, 400, 5)]
    owned_file(tmp_path / ".slurm-elastic" / "goodput-7.jsonl", lines(*recs) + b"garbage\n")
    e = replace(ext(8, ("n2",)), start_time=started)
    u = unit_in(tmp_path, user=me, exts=(e,))
    journal = Journal([action(1, ActionKind.GROW, grow_at - timedelta(seconds=1), grow_at, 1, 2)],
                      [ExtensionRecord(job_id=8, parent_job_id=7, node_count=1, nodelist="n2", state="RUNNING",
                                       action_id=1, idempotency_key="k1", created_at=grow_at,
                                       updated_at=grow_at, ended_at=None)])
    r = GoodputReader(journal, per_size=10)
    on = parse_config("version = 1\ngoodput = true\n")
    got = r.attach(u, util(7, 95), resolve_unit(on, u), NOW)
    assert {s.nodes for s in got.throughput} == {1, 2}
    assert [s.value for s in got.throughput if s.nodes == 1] == [100.0] * 10
    assert [s.value for s in got.throughput if s.nodes == 2] == [190.0] * 10
    # the first report after the extension started: the grow at 100 s, started at 103 s, next report at 105 s
    assert got.restart_s == pytest.approx(2.0)
    assert r.last[7].bad_lines == 1 and r.last[7].reports == 80
    # with neither goodput nor restart-cost awareness the file is not even looked at
    off = parse_config("version = 1\n")
    plain = util(7, 95)
    assert r.attach(u, plain, resolve_unit(off, u), NOW) is plain


@needs_root
def test_attach_ignores_a_file_the_job_user_does_not_own(tmp_path: Path) -> None:
    owned_file(tmp_path / ".slurm-elastic" / "goodput-7.jsonl",
               lines({"time": NOW.timestamp() - 5, "samples_per_s": 5.0}))  # root's, the job is alice's
    u = unit_in(tmp_path, user="alice")
    r = GoodputReader(Journal([], []))
    on = parse_config("version = 1\ngoodput = true\n")
    plain = util(7, 95)
    assert r.attach(u, plain, resolve_unit(on, u), NOW) is plain
    assert r.last[7].refused is not None and "owned by uid 0" in r.last[7].refused


# --- whole controller cycles ---------------------------------------------------------------------------------
# Recorded on the live test cluster (tests/unit/controller_scenarios.py: goodput_linear, goodput_flat): alice's
# job publishes one unlabelled report per 2 s cycle in its own directory, moved to tmp_path here; the grows are
# real extension jobs, the shrink a real scancel.


def _sizes(r: Replayed) -> int:
    leader = r.rec.jobs["leader"]
    rec = r.store.jobs.get_job(leader)
    assert rec is not None
    return rec.current_nodes


@needs_root
def test_a_linearly_scaling_job_keeps_growing_on_measured_throughput(tmp_path: Path) -> None:
    r = replay_in("goodput_linear", Agents, tmp_path)
    leader = r.rec.jobs["leader"]
    decisions = r.store.decisions.list_decisions(DecisionFilter(job_id=leader))
    grows = sorted((d for d in decisions if d.action == "grow"), key=lambda d: d.id)
    assert [(d.current_nodes, d.target_nodes) for d in grows] == [(1, 2), (2, 3)]
    assert grows[0].inputs["basis"] == "utilization"  # nothing known above 1 node yet
    assert grows[1].inputs["basis"] == "throughput"
    assert grows[1].inputs["marginal_efficiency_last"] == pytest.approx(1.0)
    assert "predicted marginal efficiency 1.00 >= 0.50" in grows[1].message
    assert not any(d.action == "shrink" for d in decisions)
    assert len(r.runner.ran("runuser")) == 2 and _sizes(r) == 3  # two extension jobs, both run by Slurm


@needs_root
def test_a_flat_job_is_shrunk_back_and_not_grown_again(tmp_path: Path) -> None:
    r = replay_in("goodput_flat", Agents, tmp_path)
    leader = r.rec.jobs["leader"]
    ctl = r.world.ctl
    decisions = sorted(ctl.store.decisions.list_decisions(DecisionFilter(job_id=leader)), key=lambda d: d.id)
    acts = [(d.action, d.current_nodes, d.target_nodes, d.reason) for d in decisions if d.action != "hold"]
    assert acts == [("grow", 1, 2, "OVERUTILIZED"), ("shrink", 2, 1, "LOW_MARGINAL_EFFICIENCY")]
    shrink = next(d for d in decisions if d.action == "shrink")
    assert shrink.inputs["basis"] == "throughput" and shrink.inputs["marginal_efficiency_last"] == 0.0
    after = [d for d in decisions if d.id > shrink.id and d.reason != "COOLDOWN"]
    # Held there ever since: one stored row for the whole unchanged run (holds are stored by change), and the
    # run lasted many cycles.
    assert len(after) == 1 and (after[0].action, after[0].reason) == ("hold", "LOW_MARGINAL_EFFICIENCY")
    assert after[0].inputs["marginal_efficiency_next"] == 0.0
    assert (ctl.clock() - after[0].time).total_seconds() >= 40
    (ext,) = r.store.jobs.extensions(leader, active_only=False)
    assert r.runner.ran("scancel", str(ext.job_id)) and _sizes(r) == 1  # the extension job cancelled


def test_a_new_resize_changes_the_answer_for_an_unchanged_file(tmp_path: Path) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    t0 = NOW - timedelta(seconds=300)
    owned_file(tmp_path / ".slurm-elastic" / "goodput-7.jsonl",
               lines(*({"time": (t0 + timedelta(seconds=s)).timestamp(), "samples_per_s": 50.0}
                       for s in range(0, 300, 10))))
    u = unit_in(tmp_path, user=me)
    actions: list[ActionRecord] = []
    r = GoodputReader(Journal(actions, []))
    on = resolve_unit(parse_config("version = 1\ngoodput = true\n"), u)
    assert {s.nodes for s in r.attach(u, util(7, 95), on, NOW).throughput} == {1}
    # the journal now says the job ran 2 nodes until a shrink at t0+150 (same file, not re-read)
    actions.append(action(1, ActionKind.SHRINK, t0 + timedelta(seconds=145), t0 + timedelta(seconds=150), 2, 1))
    got = r.attach(u, util(7, 95), on, NOW).throughput
    assert {s.nodes for s in got if s.at < t0 + timedelta(seconds=145)} == {2}
    assert {s.nodes for s in got if s.at > t0 + timedelta(seconds=160)} == {1}
    assert not [s for s in got if t0 + timedelta(seconds=145) <= s.at <= t0 + timedelta(seconds=160)]
    assert r.last[7].restarts == (10.0,)
