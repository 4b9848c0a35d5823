"""Resize notices: the job-side library (slurm_elastic/resize.py), the controller's safe writer/reader
(controller/notices.py), and the actuator's notice path (a shrink finishes at the acknowledgement, a grow
announces itself before its extension job is submitted)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_elastic import resize
from slurm_elastic.controller.extension import build_request, leader_file
from slurm_elastic.controller.notices import NoticeBoard, NoticeError
from slurm_elastic.slurm.model import Job
from slurm_elastic.store.records import ActionKind, ActionState
from tests.unit.resize_scenarios import LocalBoard, board, recorded_job
from tests.unit.slurm_replay import Replayed, replay
from tests.unit.test_controller_cycle import T0, Agents

ME = pwd.getpwuid(os.getuid()).pw_name


# --- the library -------------------------------------------------------------------------------------------
def test_pending_until_acknowledged_then_not_for_restarted_workers(tmp_path: Path) -> None:
    path = str(tmp_path / ".slurm-elastic" / "resize-7.json")
    assert not resize.resize_pending(path) and resize.deadline(path) is None
    n = resize.make_notice("shrink", 30, from_nodes=3, to_nodes=1)
    assert resize.post(n, path)
    assert resize.resize_pending(path)
    assert resize.deadline(path) == pytest.approx(n.deadline) and n.deadline == pytest.approx(n.time + 30)
    assert resize.acknowledge(step=120, path=path)
    ack = json.loads(Path(resize.ack_path(path)).read_text())
    assert ack["id"] == n.id and ack["step"] == 120
    assert not resize.resize_pending(path)  # a worker started after the resize does not checkpoint again
    assert resize.read_notice(path) == n  # the notice itself stays until withdrawn


def test_expired_or_malformed_notices_are_not_pending(tmp_path: Path) -> None:
    path = str(tmp_path / "n.json")
    old = resize.make_notice("grow", 5, now=time.time() - 1000)
    resize.post(old, path)
    assert not resize.resize_pending(path)
    for text in ("{", "[]", '{"id": "x", "kind": "melt", "time": 1, "deadline": 2}',
                 '{"id": "x", "kind": "grow", "time": "soon", "deadline": 2}', '{"id": "", "kind": "grow"}'):
        Path(path).write_text(text)
        assert resize.read_notice(path) is None and not resize.resize_pending(path)
    assert not resize.acknowledge(path=path)  # nothing to acknowledge
    with pytest.raises(ValueError):
        resize.make_notice("grow", -1)


def test_default_path_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(resize.ENV_FILE, raising=False)
    monkeypatch.delenv("SLURM_ELASTIC_PARENT", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert resize.default_path() is None and not resize.resize_pending()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    assert resize.default_path() == str(tmp_path / ".slurm-elastic" / "resize-12.json")
    monkeypatch.setenv("SLURM_ELASTIC_PARENT", "9")  # an extension job reads its leader's notice
    assert resize.default_path() == str(tmp_path / ".slurm-elastic" / "resize-9.json")
    monkeypatch.setenv(resize.ENV_FILE, str(tmp_path / "x.json"))
    assert resize.default_path() == str(tmp_path / "x.json")


def test_hold_ends_when_the_notice_is_withdrawn_and_agree_decides(tmp_path: Path) -> None:
    path = str(tmp_path / "n.json")
    n = resize.make_notice("shrink", 30)
    resize.post(n, path)
    resize.acknowledge(path=path)
    views: list[bool] = []

    def agree(done: bool) -> bool:
        views.append(done)
        if len(views) == 3:
            os.unlink(path)  # the controller withdrew it
        return done

    resize.hold(n.id, path=path, agree=agree, poll_s=0.001)
    assert views[-1] is True and views[:3] == [False, False, False]
    # a replaced notice also ends the hold; the group's answer wins over the local one
    resize.post(n, path)
    assert [resize.hold(n.id, path=path, agree=lambda done: True)] == [None]


def test_gate_join_waits_for_the_acknowledgement_or_posts_a_fresh_notice(tmp_path: Path) -> None:
    path = str(tmp_path / "n.json")
    n = resize.make_notice("grow", 10)
    resize.post(n, path)
    threading.Timer(0.2, lambda: resize.acknowledge(path=path)).start()
    ack = resize.gate_join(10, path)
    assert ack is not None and ack.id == n.id
    # stale (the running workers stopped holding long ago): the extension asks again, with its own grace
    resize.post(resize.make_notice("grow", 1, now=time.time() - 500), path)
    got = resize.gate_join(0.05, path)
    fresh = resize.read_notice(path)
    assert got is None and fresh is not None and fresh.id.startswith("ext:") and fresh.kind == "grow"


# --- the controller's board ------------------------------------------------------------------------------------
def _job(tmp_path: Path, user: str = ME) -> Job:
    """Job 42 (a job recorded from the test cluster) of ``user``, working in ``tmp_path``."""
    return replace(recorded_job(42, ("n1", "n2")), working_dir=str(tmp_path), user=user)


def test_board_writes_reads_and_withdraws(tmp_path: Path) -> None:
    board, job = NoticeBoard(), _job(tmp_path)
    n = resize.make_notice("shrink", 20, notice_id="shrink:42:3")
    path = board.post(job, 42, n)
    assert path == str(tmp_path / ".slurm-elastic" / "resize-42.json") and resize.read_notice(path) == n
    assert board.acknowledgement(job, 42, n.id) is None
    resize.acknowledge(path=path, now=n.time + 1.5)
    ack = board.acknowledgement(job, 42, n.id)
    assert ack is not None and ack.time == pytest.approx(n.time + 1.5)
    assert board.acknowledgement(job, 42, "other") is None
    assert not board.withdraw(job, 42, "other") and Path(path).exists()
    assert board.withdraw(job, 42, n.id) and not Path(path).exists()


def test_board_replaces_a_planted_symlink_and_refuses_foreign_dirs(tmp_path: Path) -> None:
    board, job = NoticeBoard(), _job(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / ".slurm-elastic").mkdir()
    (tmp_path / ".slurm-elastic" / "resize-42.json").symlink_to(victim)
    board.post(job, 42, resize.make_notice("grow", 5))
    assert victim.read_text() == "keep"
    assert not (tmp_path / ".slurm-elastic" / "resize-42.json").is_symlink()
    with pytest.raises(NoticeError):
        board.post(replace(job, working_dir="relative"), 42, resize.make_notice("grow", 5))
    with pytest.raises(NoticeError):  # the directory belongs to someone else than the job's user
        board.post(replace(job, user="nobody"), 42, resize.make_notice("grow", 5))
    other = tmp_path / "other"
    other.mkdir()
    (other / ".slurm-elastic").symlink_to(tmp_path / ".slurm-elastic")
    with pytest.raises(NoticeError):
        board.post(replace(job, working_dir=str(other)), 42, resize.make_notice("grow", 5))


# --- the actuator (the real SlurmCli on recorded replies; notices in each run's own directory) -------------------
def _replay(name: str) -> tuple[Replayed, LocalBoard]:
    r = replay(name, Agents)
    notices = board(r.world)
    return r, notices


@pytest.fixture(autouse=True)
def _boards() -> Iterator[None]:
    """Remove the directories the notice boards of this test's replays made (LocalBoard: mkdtemp)."""
    before = set(Path(tempfile.gettempdir()).glob("slurm-elastic-notices-*"))
    yield
    for d in set(Path(tempfile.gettempdir()).glob("slurm-elastic-notices-*")) - before:
        shutil.rmtree(d, ignore_errors=True)


def _writes(r: Replayed) -> list[list[str]]:
    return [c for c in r.runner.calls if c[0] in ("sbatch", "scancel", "runuser") or c[:2] == ["scontrol", "update"]]


def test_shrink_posts_a_notice_and_goes_at_the_acknowledgement() -> None:
    r, notices = _replay("notice_shrink_ack")
    idle = r.rec.jobs["idle"]
    path = notices.path(idle)
    notice = resize.read_notice(path)
    (action,) = [a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.SHRINK]
    assert notice is not None and notice.kind == "shrink" and notice.id == action.idempotency_key
    assert notice.deadline - notice.time == pytest.approx(5) and (notice.from_nodes, notice.to_nodes) == (3, 2)
    signal, update = _writes(r)[:2]
    assert signal == ["scancel", "--signal=USR1", "--full", str(idle)] and update[-1] == "NodeList=n[1-2]"
    # released in the cycle after the acknowledgement, 3 s after the notice: inside the 5 s grace
    snapshots = [i for i, c in enumerate(r.runner.calls) if c[:2] == ["squeue", "--all"]]
    assert snapshots[-2] < r.runner.calls.index(update) and snapshots[-1] < r.runner.calls.index(update)
    assert action.state == ActionState.APPLIED and "checkpoint acknowledged after 0.8s" in action.message
    assert action.finished_at is not None and (action.finished_at - action.created_at).total_seconds() < 5
    assert (action.params["from"], action.params["to"]) == (3, 2)
    assert not resize.resize_pending(path)  # stays (acknowledged): held workers go on at their peers' end
    assert r.world.ctl.actuator.known_ack_s(idle, recorded_job(idle, ("n1", "n2"))) == pytest.approx(0.8)


def test_shrink_without_acknowledgement_waits_out_the_grace() -> None:
    r, notices = _replay("notice_shrink_no_ack")
    idle = r.rec.jobs["idle"]
    notice = resize.read_notice(notices.path(idle))
    (action, *_) = [a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.SHRINK]
    assert notice is not None and notice.id == action.idempotency_key  # posted, never acknowledged
    assert action.state == ActionState.APPLIED and "no acknowledgement: grace period over" in action.message
    assert action.finished_at is not None and (action.finished_at - action.created_at).total_seconds() >= 5


def test_grow_posts_a_notice_before_the_extension_and_passes_its_grace() -> None:
    r, notices = _replay("notice_grow")
    busy = r.rec.jobs["busy"]
    (grow,) = [a for a in r.store.journal.list_actions(job_id=busy) if a.kind == ActionKind.GROW]
    path = notices.path(busy)
    notice = resize.read_notice(path)
    assert notice is not None and notice.kind == "grow" and notice.id == grow.idempotency_key
    assert notice.deadline - notice.time == pytest.approx(12) and grow.params["notice_s"] == 12.0
    assert "notice grow due in 12s" in grow.message and len(r.runner.ran("runuser")) == 1
    # a known acknowledgement time shortens the next grow notice (4x, at least 5 s)
    resize.acknowledge(path=path, now=notice.time + 0.5)
    assert r.world.ctl.actuator.grow_notice_s(busy, recorded_job(busy, ("n1",))) == 5.0


def test_extension_request_carries_the_grace_and_appends_to_the_leaders_file() -> None:
    leader = replace(recorded_job(42, ("n1",)), standard_output="/w/slurm-%j.out", standard_error="/w/%x-%5j.err")
    req = build_request(leader, ["n2"], "grow:42:1", T0, rendezvous="h:1", notice_grace_s=7.5)
    args = dict(a.split("=", 1) for a in req.sbatch_args if "=" in a)
    assert args["--output"] == "/w/slurm-42.out" and args["--error"] == f"/w/{leader.name}-00042.err"
    assert leader.name == "scenario-idle"
    assert req.env["SLURM_ELASTIC_NOTICE_GRACE"] == "7.5"
    assert leader_file("/w/%N-%j-%%j.out", leader) == "/w/%N-42-%%j.out"
