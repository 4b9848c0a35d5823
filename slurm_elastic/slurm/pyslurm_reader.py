"""Optional read backend over pyslurm, behind the same :class:`SlurmReader` interface as :class:`SlurmCli`.

Used when ``import pyslurm`` works (``reader_from_env``). Only reads go through pyslurm: writes stay on
scontrol/scancel/sbatch, because pyslurm's ``Job.modify`` ignores node counts (so it cannot shrink a job) and
submitting as another user needs the user's own munge credential anyway.

pyslurm X.Y builds only against Slurm X.Y, and no pyslurm release matches a Slurm that Debian ships on this
machine (22.05), so this backend is checked by contract tests (tests/unit/test_slurm_reader_contract.py) against
a stand-in module that follows pyslurm's documented object model (``pyslurm.Jobs.load()``,
``pyslurm.Nodes.load()``, ``pyslurm.Partitions.load()``), not against a real pyslurm.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

from slurm_elastic.slurm import hostlist
from slurm_elastic.slurm.errors import SlurmError, SlurmParseError
from slurm_elastic.slurm.gres import parse_gres
from slurm_elastic.slurm.model import ClusterSnapshot, GresCount, Job, Node, Partition


def _ts(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, (int, float)) and value > 0:
        return datetime.fromtimestamp(value, tz=UTC)
    return None


def _gres_dict(value: Any) -> tuple[GresCount, ...]:
    """pyslurm reports GRES as ``{"gpu": 4}`` or ``{"gpu:a100": 4}``; strings are parsed like Slurm's."""
    if isinstance(value, str):
        return parse_gres(value)
    if not isinstance(value, Mapping):
        return ()
    out = []
    for key, count in value.items():
        name, _, gtype = str(key).partition(":")
        out.append(GresCount(name=name, type=gtype or None, count=int(count)))
    return tuple(out)


def _state(value: Any) -> tuple[str, tuple[str, ...]]:
    parts = str(value or "UNKNOWN").replace("+", " ").upper().split()
    return parts[0], tuple(parts[1:])


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and value > 0 else None


class PyslurmReader:
    """:class:`SlurmReader` reading through pyslurm's object API."""

    def __init__(self, module: ModuleType | None = None) -> None:
        self.pyslurm = module or importlib.import_module("pyslurm")

    def _job(self, j: Any) -> Job:
        state, flags = _state(getattr(j, "state", None))
        het_id = _opt_int(getattr(j, "het_id", None))
        array_id = _opt_int(getattr(j, "array_id", None))
        nodes = getattr(j, "nodes", None) or getattr(j, "allocated_nodes", None)
        return Job(
            job_id=int(j.id),
            name=str(getattr(j, "name", "") or ""),
            user=str(getattr(j, "user_name", "") or ""),
            uid=getattr(j, "user_id", None),
            account=getattr(j, "account", None),
            partition=str(getattr(j, "partition", "") or ""),
            qos=getattr(j, "qos", None),
            priority=int(getattr(j, "priority", 0) or 0),
            state=state,
            state_flags=flags,
            state_reason=getattr(j, "state_reason", None),
            nodes=hostlist.expand(nodes) if nodes and state != "PENDING" else (),
            batch_host=getattr(j, "batch_host", None) or None,
            node_count=int(getattr(j, "num_nodes", 0) or 0),
            tres_per_node=None,
            gres_per_node=_gres_dict(getattr(j, "gres_per_node", None)),
            time_limit_min=_opt_int(getattr(j, "time_limit", None)),
            submit_time=_ts(getattr(j, "submit_time", None)),
            start_time=_ts(getattr(j, "start_time", None)) if state != "PENDING" else None,
            end_time=_ts(getattr(j, "end_time", None)) if state != "PENDING" else None,
            comment=str(getattr(j, "comment", "") or ""),
            admin_comment=str(getattr(j, "admin_comment", "") or ""),
            het_job_id=het_id,
            het_job_offset=getattr(j, "het_offset", None) if het_id else None,
            array_job_id=array_id,
            array_task_id=getattr(j, "array_task_id", None) if array_id else None,
        )

    def _node(self, n: Any) -> Node:
        state, flags = _state(getattr(n, "state", None))
        return Node(
            name=str(n.name),
            state=state,
            state_flags=flags,
            partitions=tuple(getattr(n, "partitions", ()) or ()),
            cpus=int(getattr(n, "total_cpus", 0) or 0),
            alloc_cpus=getattr(n, "allocated_cpus", None),
            gres=_gres_dict(getattr(n, "configured_gres", None)),
            gres_used=_gres_dict(getattr(n, "allocated_gres", None)),
            reason=getattr(n, "reason", None) or None,
            address=getattr(n, "address", None),
            port=getattr(n, "port", None),
        )

    def snapshot(self) -> ClusterSnapshot:
        try:
            jobs = self.pyslurm.Jobs.load()
            nodes = self.pyslurm.Nodes.load()
            parts = self.pyslurm.Partitions.load()
        except (AttributeError, TypeError) as e:
            raise SlurmParseError(f"pyslurm does not have the expected object API: {e}") from e
        except Exception as e:  # pyslurm raises its own RPCError; keep Slurm's message
            raise SlurmError(f"pyslurm: {e}") from e
        partitions = tuple(
            Partition(
                name=str(p.name),
                nodes=hostlist.expand(getattr(p, "nodes", "") or ""),
                is_default=bool(getattr(p, "is_default", False)),
                priority_tier=getattr(p, "priority_tier", None),
                state=getattr(p, "state", None),
            )
            for p in parts.values()
        )
        return ClusterSnapshot(
            taken_at=datetime.now(tz=UTC),
            jobs=tuple(self._job(j) for j in jobs.values()),
            nodes=tuple(self._node(n) for n in nodes.values()),
            partitions=partitions,
            slurm_version=getattr(self.pyslurm, "__version__", None),
            data_parser="pyslurm",
        )


def reader_from_env(prefer_pyslurm: bool = True) -> Any:
    """pyslurm when it imports, else the squeue/sinfo JSON reader. Both satisfy SlurmReader."""
    if prefer_pyslurm:
        try:
            return PyslurmReader()
        except ImportError:
            pass
    from slurm_elastic.slurm.adapter import SlurmCli

    return SlurmCli()
