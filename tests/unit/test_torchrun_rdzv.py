"""The launcher's hold on torchrun's rendezvous (slurm_elastic/torchrun_rdzv.py): after an acknowledged notice the
agent restarts once and its next round admits exactly the notice's size; a released node joins no round.

The handler here stands in for torch's DynamicRendezvousHandler with the attributes the module touches
(``next_rendezvous``, ``num_nodes_waiting``, a frozen ``_settings`` with ``min_nodes``/``max_nodes``); the live
behaviour is tests/cluster/test_resize_phases_cluster.py's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_elastic import resize, torchrun_rdzv


@dataclass(frozen=True)
class Settings:
    min_nodes: int
    max_nodes: int


@dataclass
class Info:
    world_size: int
    rank: int = 0


class Handler:
    def __init__(self, lo: int = 1, hi: int = 4) -> None:
        self._settings = Settings(lo, hi)
        self.seen: list[tuple[int, int]] = []
        self.waiting = 0

    def next_rendezvous(self) -> Info:
        self.seen.append((self._settings.min_nodes, self._settings.max_nodes))
        return Info(self._settings.max_nodes)

    def num_nodes_waiting(self) -> int:
        return self.waiting


@pytest.fixture
def notice_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "resize-7.json"
    monkeypatch.setenv(resize.ENV_FILE, str(path))
    torchrun_rdzv.EXPECT[0] = None
    torchrun_rdzv.ROUNDS[0] = 0
    yield path
    torchrun_rdzv.EXPECT[0] = None
    torchrun_rdzv.ROUNDS[0] = 0


def _wrapped(logs: list[str], lo: int = 1, hi: int = 4) -> Handler:
    h = Handler(lo, hi)
    torchrun_rdzv._log_rounds(h, logs.append)
    return h


def _post(kind: str, to: int, release: tuple[str, ...] = (), *, ack: bool = True) -> resize.Notice:
    n = resize.make_notice(kind, 30, from_nodes=2, to_nodes=to, release=release)
    assert resize.post(n)
    if ack:
        assert resize.acknowledge(5)
    return n


def test_an_acknowledged_notice_restarts_a_running_agent_once_into_a_round_of_its_size(notice_file: Path) -> None:
    logs: list[str] = []
    h = _wrapped(logs)
    assert h.next_rendezvous().world_size == 4  # the job's first round: the torchrun arguments' 1..4
    assert h.num_nodes_waiting() == 0
    n = _post("shrink", 1, ("n2",))
    torchrun_rdzv.follow(resize.read_notice(), "n1")
    assert h.num_nodes_waiting() == 1  # the agent restarts its workers now ...
    assert h.num_nodes_waiting() == 0  # ... once
    assert h.next_rendezvous().world_size == 1
    assert h.seen == [(1, 4), (1, 1)]
    assert h._settings == Settings(1, 4)  # put back after the round
    assert h.next_rendezvous().world_size == 4  # the override was for that one round
    assert any(f"notice {n.id} acknowledged" in line for line in logs)
    assert sum("rendezvous complete" in line for line in logs) == 3


def test_an_unacknowledged_or_withdrawn_notice_changes_nothing(notice_file: Path) -> None:
    logs: list[str] = []
    h = _wrapped(logs)
    h.next_rendezvous()
    _post("grow", 3, ack=False)
    torchrun_rdzv.follow(resize.read_notice(), "n1")
    assert h.num_nodes_waiting() == 0
    resize.acknowledge(9)
    torchrun_rdzv.follow(resize.read_notice(), "n1")
    notice_file.unlink()  # the controller withdrew it before the agent restarted
    torchrun_rdzv.follow(resize.read_notice(), "n1")
    assert h.num_nodes_waiting() == 0
    assert h.next_rendezvous().world_size == 4


def test_a_new_agent_of_a_grow_does_not_restart_but_its_first_round_admits_the_notices_size(
        notice_file: Path) -> None:
    _post("grow", 2)
    logs: list[str] = []
    h = _wrapped(logs)
    torchrun_rdzv.follow(resize.read_notice(), "n2")  # an extension's launcher: no round formed yet
    assert h.num_nodes_waiting() == 0
    assert h.next_rendezvous().world_size == 2
    assert h.num_nodes_waiting() == 0


def test_a_released_agent_joins_again_when_the_shrink_is_called_off(notice_file: Path) -> None:
    logs: list[str] = []
    h = _wrapped(logs)
    h.next_rendezvous()
    _post("shrink", 1, ("n2",))
    torchrun_rdzv.follow(resize.read_notice(), "n2")
    assert h.num_nodes_waiting() == 1  # its workers stop too
    notice_file.unlink()  # called off before the agent asked for its next round
    assert h.next_rendezvous().world_size == 4  # no override for a released node: it joins as before
    assert any("called off" in line for line in logs)


def test_a_size_outside_the_agents_range_is_not_forced(notice_file: Path) -> None:
    logs: list[str] = []
    h = _wrapped(logs, 1, 2)
    h.next_rendezvous()
    _post("grow", 3)
    torchrun_rdzv.follow(resize.read_notice(), "n1")
    assert h.num_nodes_waiting() == 1
    assert h.next_rendezvous().world_size == 2 and h.seen[-1] == (1, 2)


def test_leave_without_a_handler_or_with_other_internals_says_so(notice_file: Path) -> None:
    torchrun_rdzv.HANDLERS.clear()
    assert torchrun_rdzv.leave() is False
    logs: list[str] = []
    torchrun_rdzv.HANDLERS.append(object())
    try:
        assert torchrun_rdzv.leave(logs.append) is False
    finally:
        torchrun_rdzv.HANDLERS.clear()
    assert logs and "could not leave the rendezvous" in logs[0]


def test_a_notice_withdrawn_while_its_round_waits_puts_the_agents_range_back(notice_file: Path) -> None:
    class Waiting(Handler):
        def next_rendezvous(self) -> Info:
            self.seen.append((self._settings.min_nodes, self._settings.max_nodes))
            torchrun_rdzv.follow(None, "n1")  # the watcher's next poll: the controller removed the notice
            return super().next_rendezvous()

    logs: list[str] = []
    h = Waiting()
    torchrun_rdzv._log_rounds(h, logs.append)
    h.next_rendezvous()
    _post("grow", 3)
    torchrun_rdzv.follow(resize.read_notice(), "n1")
    assert h.num_nodes_waiting() == 1
    assert h.next_rendezvous().world_size == 4  # the round closes as torchrun's arguments say
    assert h.seen[-2:] == [(3, 3), (1, 4)]
    assert any("has not formed and its notice is over" in line for line in logs)
