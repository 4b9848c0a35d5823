"""The demo (``scripts/demo``) finds a job's extension jobs through the extension tag parser and cancels its jobs
through the Slurm adapter (only slurm/runner.py spawns Slurm commands); the live run is the demo itself."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from slurm_elastic.controller.extension import ExtensionTag
from slurm_elastic.slurm.errors import SlurmCommandError
from slurm_elastic.slurm.model import ClusterSnapshot, GresCount, Job
from slurm_elastic.testing import demo

NOW = datetime(2026, 12, 2, 2, 0, tzinfo=UTC)


def job(job_id: int, nodes: tuple[str, ...] = ("n1",), comment: str = "", state: str = "RUNNING") -> Job:
    return Job(job_id=job_id, name="idle", user="bob", account=None, partition="debug", qos=None, priority=1,
               state=state, state_reason=None, nodes=nodes, batch_host=nodes[0] if nodes else None,
               node_count=len(nodes), tres_per_node="gres:gpu:4", gres_per_node=(GresCount("gpu", None, 4),),
               time_limit_min=30, submit_time=NOW, start_time=NOW, end_time=None, comment=comment,
               admin_comment="")


def ext(job_id: int, parent: int, nodes: tuple[str, ...] = ("n3",), state: str = "RUNNING") -> Job:
    return job(job_id, nodes, ExtensionTag(parent, f"grow:{parent}:1:1").render(), state)


def test_an_extension_counts_for_its_leader_and_a_look_alike_comment_does_not() -> None:
    assert demo.leader_of(job(7)) == 7
    assert demo.leader_of(ext(9, parent=7)) == 7
    assert demo.leader_of(job(10, comment="parent=7 ")) == 10  # not a tag


def test_unit_sizes_add_the_running_extensions_to_their_leader() -> None:
    snap = ClusterSnapshot(taken_at=NOW, nodes=(), partitions=(), jobs=(
        job(7, ("n1", "n2")), ext(9, 7, ("n3",)), ext(11, 7, ("n4",), state="PENDING"),
        job(8, ("n4",)), ext(12, 70, ("n5",)), job(13, ("n6",)), job(14, ("n7",), comment="my parent=7 ")))
    assert demo.unit_sizes(snap, (7, 8)) == {7: 3, 8: 1}


class CancelLog:
    """Serves fixed jobs and logs cancels (``demo.JobCanceller``); ``refuse`` holds jobs whose cancel Slurm refuses."""

    def __init__(self, jobs: tuple[Job, ...], refuse: set[int]) -> None:
        self._jobs, self.refuse = jobs, refuse
        self.cancelled: list[int] = []

    def jobs(self) -> tuple[Job, ...]:
        return self._jobs

    def cancel(self, job_id: int) -> None:
        self.cancelled.append(job_id)
        if job_id in self.refuse:
            raise SlurmCommandError(["scancel", str(job_id)], 1, "Job/step already completing or completed")


def test_stopping_cancels_the_demos_jobs_and_their_extensions_through_the_adapter(
        capsys: pytest.CaptureFixture[str]) -> None:
    log = CancelLog((job(7), job(8), ext(9, 7), ext(10, 8), ext(11, 99), job(12)), refuse={7})
    demo.cancel_jobs(log, [7, 8])
    assert log.cancelled == [7, 8, 9, 10]  # a refused cancel does not stop the others; job 99's extension stays
    assert "cancelling job 7" in capsys.readouterr().err
