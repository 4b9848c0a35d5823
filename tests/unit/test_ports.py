"""The controller's ports (controller/ports.py): the real adapters and the tests' fakes satisfy the same Protocols.

mypy checks this module and the fakes' modules (pyproject.toml, [tool.mypy] files): when a port, an adapter or a
fake drifts, an assignment below stops type-checking. The tests check at run time that every member a Protocol
names exists on the class meant to satisfy it (typing_extensions comes with SQLAlchemy).
"""

from __future__ import annotations

import pytest
from typing_extensions import get_protocol_members

from slurm_elastic.controller.collect import collect_sync
from slurm_elastic.controller.ports import ActuatorStore, AgentCollector, Clock, ControllerStore, SlurmControl
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.store import SqlStore
from slurm_elastic.store.database import utc_now
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import T0, Agents, FakeSlurm
from tests.unit.test_controller_losses import AccountingSlurm, DownSlurm
from tests.unit.test_reliability_controller import RefusingSlurm


def real_ports(slurm: SlurmCli, store: SqlStore) -> tuple[SlurmControl, ControllerStore, ActuatorStore, Clock]:
    return slurm, store, store, utc_now


def fake_ports(clock: FakeClock) -> tuple[list[SlurmControl], ControllerStore, AgentCollector, Clock]:
    slurms: list[SlurmControl] = [FakeSlurm(clock), RefusingSlurm(clock), DownSlurm(clock), AccountingSlurm(clock)]
    return slurms, memory_store(clock), Agents(clock), clock


def real_collector(key: bytes) -> AgentCollector:
    return lambda agents: collect_sync(agents, key, timeout_s=1.0)


def _missing(cls: type, proto: type) -> set[str]:
    return {name for name in get_protocol_members(proto) if not hasattr(cls, name)}


@pytest.mark.parametrize("cls", [SlurmCli, FakeSlurm, RefusingSlurm, DownSlurm, AccountingSlurm])
def test_every_slurm_control_member_exists(cls: type) -> None:
    assert get_protocol_members(SlurmControl) >= {"snapshot", "shrink", "submit_as", "cancel"}
    assert _missing(cls, SlurmControl) == set()


def test_sql_store_has_every_store_port_the_controller_uses() -> None:
    store = memory_store(FakeClock(T0))
    for proto in (ControllerStore, ActuatorStore):
        assert {name for name in get_protocol_members(proto) if not hasattr(store, name)} == set()
    slurm, ctl_store, act_store, clock = real_ports(SlurmCli(), store)
    assert ctl_store is store and act_store is store and clock().tzinfo is not None


def test_fakes_build_a_world() -> None:
    slurms, store, collector, clock = fake_ports(FakeClock(T0))
    assert len(slurms) == 4 and store.now() == T0 and clock() == T0
    assert collector({}).reports == {}
    assert callable(real_collector(b"k"))
