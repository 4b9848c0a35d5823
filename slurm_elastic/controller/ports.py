"""The controller's ports: what the cycle, the actuator and reconcile need from Slurm, the state DB, the clock and
the node agents. The daemon plugs in the real ones (``SlurmCli``, ``SqlStore``, ``collect_sync``, the wall
clock); unit tests plug in their own. tests/unit/test_ports.py (mypy-checked, see pyproject.toml) assigns both the
real adapters and the tests' fakes to these types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Protocol

from slurm_elastic.controller.collect import CollectResult
from slurm_elastic.slurm.adapter import SlurmControl
from slurm_elastic.store.protocols import ActuatorStore, ControllerStore

__all__ = ["ActuatorStore", "AgentCollector", "Clock", "ControllerStore", "SlurmControl"]

#: The controller's wall clock (aware UTC datetimes); tests pass a fake one they step by hand.
Clock = Callable[[], datetime]


class AgentCollector(Protocol):
    """One fan-out to the node agents: node -> agent URL in, every report and every node's error out."""

    def __call__(self, agents: Mapping[str, str], /) -> CollectResult: ...

