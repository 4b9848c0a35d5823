"""The base scheduler's admission rules, table-driven on GPU counts (no engine)."""

from __future__ import annotations

import pytest

from slurm_elastic.sim.scheduler import PendingJob, RunningJob, SchedulerKind, plan


def _pending(*sizes: tuple[int, float]) -> list[PendingJob]:
    return [PendingJob(key=i, gpus=g, time_limit=t) for i, (g, t) in enumerate(sizes)]


@pytest.mark.parametrize(
    ("kind", "free", "pending", "running", "expected"),
    [
        # Strict FIFO stops at the first job that does not fit.
        ("fifo", 4, [(2, 100), (4, 100), (2, 100)], [], [0]),
        ("fifo", 8, [(2, 100), (4, 100), (2, 100)], [], [0, 1, 2]),
        # Greedy backfill starts every later job that fits, without a reservation.
        ("greedy", 4, [(2, 100), (4, 100), (2, 100)], [], [0, 2]),
        ("greedy", 3, [(4, 100), (1, 100), (8, 100), (2, 100)], [], [1, 3]),
        # EASY: head (4 GPUs) reserved at t=500 (2 free + 2 released); a 2-GPU job ending by then may start...
        ("backfill", 2, [(4, 100), (2, 400)], [(2, 500)], [1]),
        # ...one ending later may not (it would delay the head)...
        ("backfill", 2, [(4, 100), (2, 600)], [(2, 500)], []),
        # ...unless it only uses GPUs the head will not need at the reservation (extra = 6 + 2 - 4 = 4).
        ("backfill", 2, [(4, 100), (2, 600)], [(6, 500)], [1]),
        ("greedy", 2, [(4, 100), (2, 600)], [(2, 500)], [1]),
    ],
)
def test_admission(
    kind: SchedulerKind,
    free: int,
    pending: list[tuple[int, float]],
    running: list[tuple[int, float]],
    expected: list[int],
) -> None:
    run = [RunningJob(key=100 + i, gpus=g, expected_end=e) for i, (g, e) in enumerate(running)]
    assert plan(kind, _pending(*pending), run, free, 0.0) == expected


def test_easy_treats_overdue_jobs_as_ending_now() -> None:
    # Expected to end at t=150: the head is reserved at 150 and a 10 s job fits before it.
    on_time = [RunningJob(key=9, gpus=2, expected_end=150.0)]
    assert plan("backfill", _pending((4, 10), (2, 10)), on_time, 2, 100.0) == [1]
    # Expected at t=50 but still running at t=100: it may end any moment, so the reservation is now.
    overdue = [RunningJob(key=9, gpus=2, expected_end=50.0)]
    assert plan("backfill", _pending((4, 10), (2, 10)), overdue, 2, 100.0) == []
