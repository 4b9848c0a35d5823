"""The controller's ports (controller/ports.py): the real adapters and the tests' stand-ins satisfy the same
Protocols.

The controller unit tests drive the real SlurmCli over a runner that replays recorded Slurm replies
(tests/unit/slurm_replay.py); only the agents (GPUs) and the clock are stand-ins. mypy checks this module and the
test modules (pyproject.toml, [tool.mypy] files): when a port, an adapter or a stand-in drifts, an assignment below
stops type-checking. The tests check at run time that every member a Protocol names exists on the class meant to
satisfy it (typing_extensions comes with SQLAlchemy).
"""

from __future__ import annotations

from typing_extensions import get_protocol_members

from slurm_elastic.controller.collect import collect_sync
from slurm_elastic.controller.ports import ActuatorStore, AgentCollector, Clock, ControllerStore, SlurmControl
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.runner import CommandRunner
from slurm_elastic.store import SqlStore
from slurm_elastic.store.database import utc_now
from tests.unit.slurm_replay import ReplayRunner, recorded_cli
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import T0, Agents


def real_ports(slurm: SlurmCli, store: SqlStore) -> tuple[SlurmControl, ControllerStore, ActuatorStore, Clock]:
    return slurm, store, store, utc_now


def unit_ports(clock: FakeClock) -> tuple[SlurmControl, CommandRunner, ControllerStore, AgentCollector, Clock]:
    slurm, runner = recorded_cli("silent_agent")
    replayed: CommandRunner = runner
    return slurm, replayed, memory_store(clock), Agents(clock), clock


def real_collector(key: bytes) -> AgentCollector:
    return lambda agents: collect_sync(agents, key, timeout_s=1.0)


def _missing(cls: type, proto: type) -> set[str]:
    return {name for name in get_protocol_members(proto) if not hasattr(cls, name)}


def test_every_slurm_control_member_exists() -> None:
    assert get_protocol_members(SlurmControl) >= {"snapshot", "shrink", "submit_as", "cancel"}
    assert _missing(SlurmCli, SlurmControl) == set()


def test_sql_store_has_every_store_port_the_controller_uses() -> None:
    store = memory_store(FakeClock(T0))
    for proto in (ControllerStore, ActuatorStore):
        assert {name for name in get_protocol_members(proto) if not hasattr(store, name)} == set()
    slurm, ctl_store, act_store, clock = real_ports(SlurmCli(), store)
    assert ctl_store is store and act_store is store and clock().tzinfo is not None


def test_the_test_ports_build_a_world() -> None:
    """The unit tests' world: the real SlurmCli answers from a recording, the agents and the clock are stand-ins."""
    slurm, runner, store, collector, clock = unit_ports(FakeClock(T0))
    assert isinstance(slurm, SlurmCli) and isinstance(runner, ReplayRunner)
    assert store.now() == T0 and clock() == T0
    assert collector({}).reports == {}
    assert callable(real_collector(b"k"))
    jobs = {j.job_id: j for j in slurm.snapshot().jobs}  # parsed by the adapter from the recorded replies
    assert jobs[runner.rec.jobs["idle"]].user == "alice"
    runner.check()
