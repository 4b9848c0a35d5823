"""A task killed because a shrink released its node is no failure: the launcher's task records and the job's exit
status from them (slurm_elastic/taskexit.py, launch.py ``outcome``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_elastic import resize
from slurm_elastic.taskexit import Recorder, TaskRecord, job_status, parse_record, read_records

REPO = Path(__file__).resolve().parents[2]


def _rec(node: str, state: str, rc: int | None = None, notice: str | None = None) -> TaskRecord:
    return TaskRecord(node=node, rank=0, state=state, rc=rc, notice=notice)


SHRINK = resize.make_notice("shrink", 30, now=100.0, from_nodes=2, to_nodes=1, notice_id="shrink:7:3",
                            release=("n2",))


@pytest.mark.parametrize(("srun", "records", "notice", "status"), [
    (0, [], None, 0),  # srun's 0 stands whatever the records say
    (137, [_rec("n1", "exited", 0), _rec("n2", "released", notice="shrink:7:3")], None, 0),
    # the launcher on n2 was killed before it polled the notice: the notice written names n2
    (137, [_rec("n1", "exited", 0), _rec("n2", "running")], SHRINK, 0),
    (137, [_rec("n1", "exited", 0), _rec("n2", "running")], None, 137),  # killed, and no shrink named n2
    (137, [_rec("n1", "exited", 0), _rec("n3", "running")], SHRINK, 137),  # n3 is not n2
    (137, [_rec("n1", "exited", 1), _rec("n2", "released")], None, 137),  # training itself failed
    (137, [_rec("n1", "running"), _rec("n2", "released")], SHRINK, 137),  # nothing finished
    (137, [], SHRINK, 137),  # no records (a script without the launcher's records)
    (1, [_rec("n1", "exited", 1)], None, 1),
])
def test_job_status(srun: int, records: list[TaskRecord], notice: resize.Notice | None, status: int) -> None:
    got, why = job_status(srun, records, notice)
    assert got == status, why
    assert (why == "") == (srun == 0)
    if status == 0 and srun != 0:
        assert "n2" in why and "shrink:7:3" in why and "succeeded" in why


def test_a_grow_notice_releases_nothing() -> None:
    grow = resize.make_notice("grow", 30, release=("n2",))
    assert not grow.releases("n2") and SHRINK.releases("n2") and not SHRINK.releases("n1")
    assert not SHRINK.releases(None)


def test_the_notice_carries_the_nodes_a_shrink_releases() -> None:
    back = resize.parse_notice(SHRINK.render())
    assert back == SHRINK and back.release == ("n2",)
    plain = resize.make_notice("grow", 5)
    assert "release" not in plain.render() and resize.parse_notice(plain.render()) == plain
    bad = SHRINK.render().replace('["n2"]', '["n2", 3, ""]')
    assert resize.parse_notice(bad).release == ("n2",)  # type: ignore[union-attr]
    assert resize.parse_notice(SHRINK.render().replace('["n2"]', '"n2"')).release == ()  # type: ignore[union-attr]


def test_recorder_follows_the_notice_and_reads_back(tmp_path: Path) -> None:
    rec = Recorder(str(tmp_path / "tasks"), "n2", 1)
    assert rec.write("running")
    marked = rec.follow(None, None)
    assert marked is None and read_records(rec.directory) == [TaskRecord("n2", 1, "running")]
    marked = rec.follow(SHRINK, marked)
    assert marked == SHRINK.id and read_records(rec.directory) == [TaskRecord("n2", 1, "released", notice=SHRINK.id)]
    marked = rec.follow(None, marked)  # the shrink was called off: the notice is withdrawn
    assert marked is None and read_records(rec.directory)[0].state == "running"
    assert rec.write("exited", rc=0)
    (tmp_path / "tasks" / "junk.json").write_text("{not json")
    assert read_records(rec.directory) == [TaskRecord("n2", 1, "exited", rc=0)]
    assert read_records(str(tmp_path / "missing")) == [] and read_records(None) == []
    assert parse_record('{"node": "n1", "state": "gone"}') is None


def _wait(probe, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _launcher(tmp_path: Path, node: str, program: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), resize.ENV_FILE: str(tmp_path / "resize-7.json"),
           "SLURM_ELASTIC_TASKS_DIR": str(tmp_path / "tasks"), "SLURMD_NODENAME": node, "SLURM_PROCID": "0"}
    env.pop("SLURM_ELASTIC_ROLE", None)
    return subprocess.Popen([sys.executable, "-m", "slurm_elastic.launch", "exec", sys.executable, "-c", program],
                            env=env)


def _outcome(tmp_path: Path, srun_status: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), resize.ENV_FILE: str(tmp_path / "resize-7.json"),
           "SLURM_ELASTIC_TASKS_DIR": str(tmp_path / "tasks")}
    return subprocess.run([sys.executable, "-m", "slurm_elastic.launch", "outcome", str(srun_status)], env=env,
                          check=False, capture_output=True, text=True, timeout=60)


def test_launchers_record_a_released_node_and_outcome_exits_0(tmp_path: Path) -> None:
    """Two nodes' launchers; a shrink notice names n2, whose launcher is then killed (SIGKILL, as Slurm does);
    n1's program ends 0. srun would exit 137: the job's status is 0, and said why."""
    kept = _launcher(tmp_path, "n1", f"import time, pathlib; p = pathlib.Path({str(tmp_path / 'end')!r})\n"
                                     "while not p.exists(): time.sleep(0.05)")
    gone = _launcher(tmp_path, "n2", "import time; time.sleep(600)")
    try:
        tasks = tmp_path / "tasks"
        _wait(lambda: len(read_records(str(tasks))) == 2)
        assert resize.post(SHRINK, str(tmp_path / "resize-7.json"))
        _wait(lambda: any(r.state == "released" for r in read_records(str(tasks))))
        gone.send_signal(signal.SIGKILL)
        gone.wait(timeout=20)
        (tmp_path / "end").touch()
        assert kept.wait(timeout=20) == 0
    finally:
        for p in (kept, gone):
            if p.poll() is None:
                p.kill()
    assert [(r.node, r.state, r.rc) for r in read_records(str(tmp_path / "tasks"))] == [
        ("n1", "exited", 0), ("n2", "released", None)]
    done = _outcome(tmp_path, 137)
    assert done.returncode == 0, done.stderr
    assert "Killed" not in done.stderr and "task(s) on n2" in done.stderr and "the job exits 0" in done.stderr
    # Without the shrink (another reason killed n2's task) the job keeps srun's failure.
    (tmp_path / "resize-7.json").unlink()
    for name in os.listdir(tmp_path / "tasks"):
        if name.startswith("n2"):
            (tmp_path / "tasks" / name).write_text('{"node": "n2", "rank": 0, "state": "running"}\n')
    assert _outcome(tmp_path, 137).returncode == 137
    assert _outcome(tmp_path, 0).returncode == 0 and _outcome(tmp_path, 0).stderr == ""


def test_a_failing_program_is_recorded_with_its_status(tmp_path: Path) -> None:
    proc = _launcher(tmp_path, "n1", "raise SystemExit(5)")
    assert proc.wait(timeout=30) == 5
    assert read_records(str(tmp_path / "tasks")) == [TaskRecord("n1", 0, "exited", rc=5)]
    assert _outcome(tmp_path, 5).returncode == 5
