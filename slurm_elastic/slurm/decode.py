"""Typed decoding of ``squeue --json`` and the node replies straight into the adapter's records.

The replies are large (a 50,000-job ``squeue --json`` is ~130 MB) and the controller reads ~30 of each job's
~110 fields. msgspec decodes the JSON text into Structs that declare only those fields, skipping the rest
without building Python objects for them; the Structs then become :class:`Job` and :class:`Node` by the same
rules as :mod:`slurm_elastic.slurm.openapi`'s reading of a decoded document (bench/controller_cycle.py: parse
~0.5x ``json.loads`` of the same text, where ``json.loads`` + the dict walk took ~1.6x).

Each field's type is the union of what the recorded replies of 22.05, 24.11 and 26.05 send (a plain number or
``{"set", "infinite", "number"}``, a state string or list, a reason string or object). A reply outside that
(a float or a boolean where a number belongs, a list where an object belongs, invalid JSON) is handed to
:mod:`~slurm_elastic.slurm.openapi`'s walk of the decoded document, which tolerates what it can and names
what it cannot: so every reply reads exactly as before, only faster
(tests/unit/test_slurm_decode.py holds both to the same result on every recorded reply, and on fuzzed ones).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, TypeVar

import msgspec

from slurm_elastic.slurm import hostlist, openapi
from slurm_elastic.slurm.errors import SlurmParseError
from slurm_elastic.slurm.gres import parse_gres, parse_tres_per_node
from slurm_elastic.slurm.model import GresCount, Job, Node
from slurm_elastic.slurm.openapi import FINAL_JOB_STATES, ReplyMeta


class _Number(msgspec.Struct, frozen=True, gc=False):
    """v0.0.39+: ``{"set": true, "infinite": false, "number": 7}``."""

    set: bool = True
    infinite: bool = False
    number: int | None = None


Number = int | _Number | None


class _Reason(msgspec.Struct, gc=False):
    description: str | None = None


class _RawJob(msgspec.Struct, frozen=True, gc=False):
    """The fields of a ``squeue --json`` job the controller reads (slurm/model.py's Job). Frozen, so hashable:
    a :class:`JobMemo` finds the record built from equal fields in the previous reply."""

    job_id: Number = None
    job_state: str | tuple[str, ...] | None = None
    name: str | None = None
    user_name: str | None = None
    user_id: Number = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    priority: Number = None
    state_reason: str | None = None
    nodes: str | None = None
    batch_host: str | None = None
    node_count: Number = None
    tres_per_node: str | None = None
    time_limit: Number = None
    submit_time: Number = None
    start_time: Number = None
    end_time: Number = None
    comment: str | None = None
    admin_comment: str | None = None
    het_job_id: Number = None
    het_job_offset: Number = None
    array_job_id: Number = None
    array_task_id: Number = None
    batch_flag: bool | int | None = True
    current_working_directory: str | None = None
    standard_output: str | None = None
    standard_error: str | None = None


class _RawNode(msgspec.Struct, gc=False):
    """A node object: 22.05's ``sinfo --json`` ``nodes`` and ``scontrol show nodes --json`` (23.02+)."""

    name: str | None = None
    state: str | list[str] | None = None
    state_flags: list[str] | None = None
    partitions: list[str] | None = None
    cpus: Number = None
    alloc_cpus: Number = None
    gres: str | None = None
    gres_used: str | None = None
    reason: str | _Reason | None = None
    address: str | None = None
    port: Number = None
    slurmd_start_time: Number = None


class _EntryNodes(msgspec.Struct, gc=False):
    nodes: list[str] | None = None


class _EntryName(msgspec.Struct, gc=False):
    name: str | None = None


class _EntryState(msgspec.Struct, gc=False):
    state: str | list[str] | None = None


class _EntryCpus(msgspec.Struct, gc=False):
    total: Number = None
    allocated: Number = None
    minimum: Number = None
    maximum: Number = None


class _EntryGres(msgspec.Struct, gc=False):
    total: str | None = None
    used: str | None = None


class _SinfoEntry(msgspec.Struct, gc=False):
    """23.02+ ``sinfo --json``: one entry per (partition, group of nodes of equal state)."""

    nodes: _EntryNodes | None = None
    partition: _EntryName | None = None
    node: _EntryState | None = None
    cpus: _EntryCpus | None = None
    gres: _EntryGres | None = None
    reason: str | _Reason | None = None
    port: Number = None


class _SqueueReply(msgspec.Struct, gc=False):
    meta: Any = None  # small: read by openapi.parse_meta as it stands
    errors: Any = None
    jobs: list[_RawJob] | None = None


class _NodesReply(msgspec.Struct, gc=False):
    meta: Any = None
    errors: Any = None
    nodes: list[_RawNode] | None = None
    sinfo: list[_SinfoEntry] | None = None


class _Unusual(Exception):
    """The reply is not of the shapes typed here: the dict walk reads it (and names what is wrong)."""


_SQUEUE = msgspec.json.Decoder(_SqueueReply)
_NODES = msgspec.json.Decoder(_NodesReply)
_NO_VAL = {0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF}  # as openapi's


def _num(value: Number) -> int | None:
    if value is None:
        return None
    if type(value) is not int:
        assert isinstance(value, _Number)
        if not value.set or value.infinite:
            return None
        value = value.number
        if value is None:
            return None
    return None if value in _NO_VAL else value


def _str(value: str | None) -> str | None:
    return value if value else None


def _time(value: Number) -> datetime | None:
    n = _num(value)
    if not n or n <= 0:
        return None
    try:
        return datetime.fromtimestamp(n, tz=UTC)
    except (ValueError, OverflowError, OSError):
        return None


def _positive_or_none(value: Number) -> int | None:
    n = _num(value)
    return n if n else None


def _reason(value: str | _Reason | None) -> str | None:
    return _str(value.description if isinstance(value, _Reason) else value)


# A cluster has a handful of distinct TRES and GRES strings: each is parsed once (results are immutable tuples).
_tres = lru_cache(maxsize=4096)(parse_tres_per_node)
_gres = lru_cache(maxsize=4096)(parse_gres)


@lru_cache(maxsize=256)
def _state(value: str | tuple[str, ...] | None) -> tuple[str, tuple[str, ...]]:
    return openapi.state_of(list(value) if isinstance(value, tuple) else value)


def _job_state(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, tuple[str, ...]]:
    return _state(tuple(value) if isinstance(value, list) else value)


def _output(path: str | None, working_dir: str | None) -> str | None:
    """openapi.output_path on a string: a relative ``--output`` pattern made absolute against the working dir."""
    if not path:
        return None
    return path if path[0] == "/" or not working_dir else posixpath.join(working_dir, path)


RecordT = TypeVar("RecordT", Job, Node)


def _record(kind: type[RecordT], values: dict[str, Any]) -> RecordT:
    """``kind(**values)`` without the frozen dataclass's ``__init__``, which sets each of Job's 30 fields through
    ``object.__setattr__`` (5.3 µs a job against 0.5 µs: a third of a 51k-job parse). ``values`` names every
    field (tests/unit/test_slurm_decode.py compares each field with the walk's records, built by ``__init__``);
    Job and Node have no ``__post_init__``."""
    record = object.__new__(kind)
    record.__dict__.update(values)
    return record


assert not hasattr(Job, "__post_init__") and not hasattr(Node, "__post_init__")


def _job(j: _RawJob) -> Job:
    job_id = _num(j.job_id)
    if job_id is None:
        raise _Unusual
    state, flags = _job_state(j.job_state)
    pending = state == "PENDING"
    het_id = _positive_or_none(j.het_job_id)
    array_job = _positive_or_none(j.array_job_id)
    tres = j.tres_per_node or None
    time_limit = _num(j.time_limit)
    working_dir = j.current_working_directory or None
    end: datetime | None = None
    if not pending and (time_limit is not None or state in FINAL_JOB_STATES or "COMPLETING" in flags):
        end = _time(j.end_time)
    uid = _num(j.user_id)
    return _record(Job, {
        "job_id": job_id,
        "name": j.name or "",
        "user": j.user_name or str(uid),
        "account": j.account or None,
        "partition": j.partition or "",
        "qos": j.qos or None,
        "priority": _num(j.priority) or 0,
        "state": state,
        "state_reason": j.state_reason or None,
        "nodes": hostlist.expand(j.nodes) if not pending and j.nodes else (),
        "batch_host": j.batch_host or None,
        "node_count": _num(j.node_count) or 0,
        "tres_per_node": tres,
        "gres_per_node": _tres(tres),
        "time_limit_min": time_limit,
        "submit_time": _time(j.submit_time),
        "start_time": None if pending else _time(j.start_time),
        "end_time": end,
        "comment": j.comment or "",
        "admin_comment": j.admin_comment or "",
        "uid": uid,
        "het_job_id": het_id,
        "het_job_offset": _num(j.het_job_offset) if het_id is not None else None,
        "array_job_id": array_job,
        "array_task_id": _num(j.array_task_id) if array_job is not None else None,
        "state_flags": flags,
        "batch_flag": bool(j.batch_flag),
        "working_dir": working_dir,
        "standard_output": _output(j.standard_output, working_dir),
        "standard_error": _output(j.standard_error, working_dir),
    })


def _node(n: _RawNode) -> Node:
    state, flags = _job_state(n.state)
    flags = tuple(dict.fromkeys([*flags, *(f.upper() for f in n.state_flags or ())]))
    if not n.name:
        raise _Unusual
    return _record(Node, {
        "name": n.name,
        "state": state,
        "state_flags": flags,
        "partitions": tuple(n.partitions or ()),
        "cpus": _num(n.cpus) or 0,
        "alloc_cpus": _num(n.alloc_cpus),
        "gres": _gres(n.gres or None),
        "gres_used": _gres(n.gres_used or None),
        "reason": _reason(n.reason),
        "address": n.address or None,
        "port": _num(n.port),
        "slurmd_start_time": _time(n.slurmd_start_time),
    })


def _entries(entries: list[_SinfoEntry]) -> tuple[Node, ...]:
    """As openapi's ``_nodes_from_sinfo_entries`` (its docstring says why a group gives less than a node)."""
    merged: dict[str, Node] = {}
    for e in entries:
        names = (e.nodes.nodes if e.nodes is not None else None) or []
        hosts = [h for name in names for h in hostlist.expand(name)]
        single = len(hosts) == 1
        part = e.partition.name if e.partition is not None else None
        state, flags = _job_state(e.node.state if e.node is not None else None)
        cpus = e.cpus or _EntryCpus()
        gres = e.gres or _EntryGres()
        if single:
            cpu_total, cpu_alloc, port = _num(cpus.total), _num(cpus.allocated), _num(e.port)
        else:
            low, high = _num(cpus.minimum), _num(cpus.maximum)
            cpu_total, cpu_alloc, port = (low if low == high else None), None, None
        total: tuple[GresCount, ...] = _gres(_str(gres.total))
        used: tuple[GresCount, ...] = _gres(_str(gres.used)) if single else ()
        for host in hosts:
            prev = merged.get(host)
            partitions = (*(prev.partitions if prev else ()), *([part] if part else ()))
            merged[host] = Node(name=host, state=state, state_flags=flags, partitions=tuple(dict.fromkeys(partitions)),
                                cpus=cpu_total or 0, alloc_cpus=cpu_alloc, gres=total, gres_used=used,
                                reason=_reason(e.reason), port=port)
    return tuple(merged.values())


def _head(reply: _SqueueReply | _NodesReply) -> ReplyMeta:
    doc = {"meta": reply.meta, "errors": reply.errors}
    openapi.check_errors(doc)
    return openapi.parse_meta(doc)


class JobMemo:
    """The records of the last reply read, by the fields they were built from. A job is a function of those
    fields, and from one cycle to the next most jobs' fields do not change: their records are taken again
    instead of built again (a steady 51k-job reply: ~0.3 s less CPU; the decoding itself is still needed)."""

    def __init__(self) -> None:
        self.by_raw: dict[_RawJob, Job] = {}

    def jobs(self, raws: list[_RawJob]) -> tuple[Job, ...]:
        last = self.by_raw
        now: dict[_RawJob, Job] = {}
        for raw in raws:
            job = last.get(raw)
            now[raw] = _job(raw) if job is None else job
        self.by_raw = now  # only when every job was read: a reply handed to the walk leaves the memo as it was
        return tuple(now[raw] for raw in raws)


def typed_squeue(reply: _SqueueReply, memo: JobMemo | None = None) -> tuple[ReplyMeta, tuple[Job, ...]]:
    meta = _head(reply)
    if reply.jobs is None:
        raise _Unusual
    return meta, tuple(map(_job, reply.jobs)) if memo is None else memo.jobs(reply.jobs)


def typed_nodes(reply: _NodesReply) -> tuple[ReplyMeta, tuple[Node, ...]]:
    meta = _head(reply)
    if reply.nodes is not None:
        return meta, tuple(map(_node, reply.nodes))
    if reply.sinfo is not None:
        return meta, _entries(reply.sinfo)
    raise _Unusual


R = TypeVar("R")
T = TypeVar("T")


def _typed_or_walk(typed: Callable[[], R], walk: Callable[[], R]) -> R:
    """The typed reading where the reply is of a typed shape, else the dict walk (same result, or its error)."""
    try:
        return typed()
    except (msgspec.MsgspecError, _Unusual, SlurmParseError):
        # SlurmParseError: a hostlist, GRES or Slurm error the walk reports the same way (and in the same order
        # as it finds them: the walk checks a reply's errors before its jobs, and jobs in order).
        return walk()


def read_squeue(text: str | bytes, memo: JobMemo | None = None) -> tuple[ReplyMeta, tuple[Job, ...]]:
    """A ``squeue --json`` reply's text -> (meta, jobs); with ``memo``, the records of unchanged jobs are the
    previous read's. Invalid JSON raises json.JSONDecodeError (or RecursionError), as ``json.loads`` does."""
    return _typed_or_walk(lambda: typed_squeue(_SQUEUE.decode(text), memo),
                          lambda: openapi.walk_squeue(json.loads(text)))


def read_nodes(text: str | bytes) -> tuple[ReplyMeta, tuple[Node, ...]]:
    """``sinfo --json`` or ``scontrol show nodes --json`` text -> (meta, nodes); errors as :func:`read_squeue`."""
    return _typed_or_walk(lambda: typed_nodes(_NODES.decode(text)), lambda: openapi.walk_nodes(json.loads(text)))


def convert_squeue(doc: Any) -> tuple[ReplyMeta, tuple[Job, ...]]:
    """An already decoded reply (tests, recorded documents): the same typed reading, from Python objects."""
    return _typed_or_walk(lambda: typed_squeue(_convert(doc, _SqueueReply)), lambda: openapi.walk_squeue(doc))


def convert_nodes(doc: Any) -> tuple[ReplyMeta, tuple[Node, ...]]:
    return _typed_or_walk(lambda: typed_nodes(_convert(doc, _NodesReply)), lambda: openapi.walk_nodes(doc))


def _convert(doc: Any, kind: type[T]) -> T:
    if not isinstance(doc, dict):
        raise _Unusual
    return msgspec.convert(doc, kind)


def parse_squeue(doc: Any) -> tuple[ReplyMeta, tuple[Job, ...]]:
    """Parse a decoded ``squeue --json`` reply (any known version): the typed reading of this module (text
    goes to ``read_squeue``), which hands what it does not type to :func:`~slurm_elastic.slurm.openapi.walk_squeue`."""
    return convert_squeue(doc)


def parse_nodes(doc: Any) -> tuple[ReplyMeta, tuple[Node, ...]]:
    """Parse a decoded ``sinfo --json`` (22.05 ``nodes``; 23.02+ ``sinfo``) or ``scontrol show nodes --json``
    reply: the typed reading of this module, as :func:`parse_squeue`."""
    return convert_nodes(doc)
