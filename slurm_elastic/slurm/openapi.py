"""Parsers for ``squeue --json`` and ``sinfo --json`` across Slurm's OpenAPI / data_parser versions.

Known versions (Slurm release -> plugin):
  22.05 -> openapi/v0.0.38   flat numbers, ``job_state`` a string, ``sinfo --json`` has ``nodes``
  23.02 -> data_parser/v0.0.39  numbers become ``{"set", "infinite", "number"}``
  23.11 -> v0.0.40, 24.05 -> v0.0.41, 24.11 -> v0.0.42, 25.05 -> v0.0.43, 25.11 -> v0.0.44, 26.05 -> v0.0.45:
           ``job_state`` and node ``state`` are lists of flags; ``sinfo --json`` has ``sinfo`` entries
           (one per partition and node group) instead of ``nodes``; ``meta.slurm`` is lower case.
Every field may be missing: a missing value becomes ``None`` (or empty), never a guess. A document that is not
a Slurm reply at all raises :class:`SlurmParseError` with what was wrong.

Differences recorded on live clusters (tests/fixtures/slurm/<release>/recorded):
* ``sinfo --json`` from 23.02 on groups nodes of equal state into one entry: its ``cpus``/``alloc_cpus`` are the
  group's sums and its ``port`` the first node's, the address is missing and ``reason`` is an object
  ``{description, time, user}``. Nodes are therefore read from ``scontrol show nodes --json`` (23.02+), one
  object per node like 22.05's ``sinfo --json``; a grouped entry is only trusted for what holds for each node.
* A running job without a time limit gets an ``end_time`` a year out (scontrol: ``EndTime=Unknown``): no end.
* ``standard_output`` is the raw pattern (22.05, 26.05; relative to the working directory when relative) or
  already expanded (24.11); both are made absolute against the job's working directory.
"""

from __future__ import annotations

import contextlib
import gc
import math
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from slurm_elastic.slurm import hostlist
from slurm_elastic.slurm.errors import SlurmParseError
from slurm_elastic.slurm.gres import parse_gres, parse_tres_per_node
from slurm_elastic.slurm.model import Job, Node

KNOWN_VERSIONS = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44", "v0.0.45")
_NO_VAL = {0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF}  # Slurm's NO_VAL / INFINITE


@dataclass(frozen=True)
class ReplyMeta:
    data_parser: str | None  # "v0.0.38" … or None when the reply does not say
    slurm_release: str | None  # "22.05.8"

    @property
    def known(self) -> bool:
        return self.data_parser in KNOWN_VERSIONS


def _obj(doc: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise SlurmParseError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    return doc


def parse_meta(doc: Any) -> ReplyMeta:
    meta = _obj(doc, "reply").get("meta")
    meta = {} if meta is None else meta
    if not isinstance(meta, Mapping):
        raise SlurmParseError("reply: 'meta' is not an object")
    plugin = meta.get("plugin") or {}
    version: str | None = None
    if isinstance(plugin, Mapping):
        for key in ("data_parser", "type"):
            raw = plugin.get(key)
            if isinstance(raw, str) and "v0.0." in raw:
                version = "v0.0." + raw.split("v0.0.", 1)[1].split("/")[0]
                break
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    release = slurm.get("release") if isinstance(slurm, Mapping) else None
    if release is None and isinstance(slurm, Mapping) and isinstance(slurm.get("version"), Mapping):
        v = slurm["version"]
        release = f"{v.get('major')}.{v.get('minor')}.{v.get('micro')}"
    return ReplyMeta(data_parser=version, slurm_release=str(release) if release is not None else None)


def check_errors(doc: Mapping[str, Any]) -> None:
    errs = doc.get("errors") or []
    if isinstance(errs, list) and errs:
        msgs = []
        for e in errs:
            if isinstance(e, Mapping):
                msgs.append(str(e.get("description") or e.get("error") or e))
            else:
                msgs.append(str(e))
        raise SlurmParseError("Slurm reported errors: " + "; ".join(msgs))


def num(value: Any) -> int | None:
    """A Slurm number: plain int (v0.0.38) or ``{"set", "infinite", "number"}`` (v0.0.39+)."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):  # NaN/inf: int() would raise (found by tests/unit/test_fuzz_inputs.py)
            raise SlurmParseError(f"expected a finite number, got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise SlurmParseError(f"expected a number, got {value!r}")
    return None if value in _NO_VAL else value


def _str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (str, int, float)):
        s = str(value)
        return s if s != "" else None
    raise SlurmParseError(f"expected a string, got {type(value).__name__}")


def _time(value: Any) -> datetime | None:
    n = num(value)
    if not n or n <= 0:
        return None
    try:
        return datetime.fromtimestamp(n, tz=UTC)
    except (ValueError, OverflowError, OSError):  # beyond year 9999: unknown, not a crash (test_fuzz_inputs)
        return None


def state_of(value: Any) -> tuple[str, tuple[str, ...]]:
    """``"RUNNING"`` or ``["RUNNING", "COMPLETING"]`` -> (base, flags), upper case."""
    if isinstance(value, str):
        parts = [p for p in value.replace("+", " ").split() if p]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        parts = list(value)
    elif value is None:
        parts = []
    else:
        raise SlurmParseError(f"bad state {value!r}")
    parts = [p.upper() for p in parts]
    if not parts:
        return "UNKNOWN", ()
    return parts[0], tuple(parts[1:])


#: Job states after which Slurm's end time is when the job really ended.
FINAL_JOB_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                              "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"})


def _end_time(value: Any, state: str, flags: tuple[str, ...], time_limit: int | None) -> datetime | None:
    """When the job ended or must end. None while pending, and for a live job without a time limit: Slurm
    reports a year out there (scontrol: ``EndTime=Unknown``)."""
    if state == "PENDING":
        return None
    if time_limit is None and state not in FINAL_JOB_STATES and "COMPLETING" not in flags:
        return None
    return _time(value)


def output_path(value: Any, working_dir: str | None) -> str | None:
    """``--output``/``--error`` as an absolute path (pattern): 22.05 and 26.05 give the raw pattern, relative to
    the working directory when the user gave it so; 24.11 gives it already expanded and absolute."""
    path = _str(value)
    if path is None or posixpath.isabs(path) or not working_dir:
        return path
    return posixpath.join(working_dir, path)


def _positive_or_none(value: Any) -> int | None:
    n = num(value)
    return n if n else None


def _job(raw: Any) -> Job:
    j = _obj(raw, "job")
    job_id = num(j.get("job_id"))
    if job_id is None:
        raise SlurmParseError(f"job without job_id: {str(j)[:200]}")
    state, flags = state_of(j.get("job_state"))
    nodes_expr = _str(j.get("nodes"))
    # v0.0.38 reports het_job_offset 0 for non-het jobs too: a job is a het component only with het_job_id set.
    het_id = _positive_or_none(j.get("het_job_id"))
    array_job = _positive_or_none(j.get("array_job_id"))
    tres = _str(j.get("tres_per_node"))
    time_limit = num(j.get("time_limit"))
    working_dir = _str(j.get("current_working_directory"))
    return Job(
        job_id=job_id,
        name=_str(j.get("name")) or "",
        user=_str(j.get("user_name")) or str(num(j.get("user_id"))),
        uid=num(j.get("user_id")),
        account=_str(j.get("account")),
        partition=_str(j.get("partition")) or "",
        qos=_str(j.get("qos")),
        priority=num(j.get("priority")) or 0,
        state=state,
        state_flags=flags,
        state_reason=_str(j.get("state_reason")),
        nodes=hostlist.expand(nodes_expr) if state not in {"PENDING"} else (),
        batch_host=_str(j.get("batch_host")),
        node_count=num(j.get("node_count")) or 0,
        tres_per_node=tres,
        gres_per_node=parse_tres_per_node(tres),
        time_limit_min=time_limit,
        submit_time=_time(j.get("submit_time")),
        start_time=_time(j.get("start_time")) if state not in {"PENDING"} else None,
        end_time=_end_time(j.get("end_time"), state, flags, time_limit),
        comment=_str(j.get("comment")) or "",
        admin_comment=_str(j.get("admin_comment")) or "",
        het_job_id=het_id,
        het_job_offset=num(j.get("het_job_offset")) if het_id is not None else None,
        array_job_id=array_job,
        array_task_id=num(j.get("array_task_id")) if array_job is not None else None,
        batch_flag=bool(j.get("batch_flag", True)),
        working_dir=working_dir,
        standard_output=output_path(j.get("standard_output"), working_dir),
        standard_error=output_path(j.get("standard_error"), working_dir),
    )


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Cyclic garbage collection off while a large reply is decoded and parsed: the millions of dicts, lists
    and records it allocates set off collections that walk every live object again and again, which cost as
    much as the parse itself and grow faster than the reply (bench/controller_cycle.py). Nothing in a reply
    forms cycles; the previous state is restored after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def walk_squeue(doc: Any) -> tuple[ReplyMeta, tuple[Job, ...]]:
    """A decoded ``squeue --json`` reply read field by field: any JSON value anywhere gets a result or a
    SlurmParseError naming what is wrong (the reference the typed reading is held to)."""
    d = _obj(doc, "squeue reply")
    check_errors(d)
    meta = parse_meta(d)
    jobs = d.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmParseError("squeue reply: 'jobs' is missing or not a list")
    return meta, tuple(_job(j) for j in jobs)


def _reason(value: Any) -> str | None:
    """A node's reason: a string (22.05, ``scontrol show nodes``) or ``{description, time, user}`` (sinfo 23.02+)."""
    if isinstance(value, Mapping):
        value = value.get("description")
    return _str(value)


def _node(n: Mapping[str, Any]) -> Node:
    """One node object: 22.05's ``sinfo --json`` ``nodes`` entries and ``scontrol show nodes --json`` (23.02+)."""
    state, flags = state_of(n.get("state"))
    extra = n.get("state_flags") or []
    if isinstance(extra, list):
        flags = tuple(dict.fromkeys([*flags, *(str(f).upper() for f in extra)]))
    parts = n.get("partitions") or []
    name = _str(n.get("name"))
    if not name:
        raise SlurmParseError(f"node without a name: {str(n)[:200]}")
    return Node(
        name=name,
        state=state,
        state_flags=flags,
        partitions=tuple(str(p) for p in parts) if isinstance(parts, list) else (),
        cpus=num(n.get("cpus")) or 0,
        alloc_cpus=num(n.get("alloc_cpus")),
        gres=parse_gres(_str(n.get("gres"))),
        gres_used=parse_gres(_str(n.get("gres_used"))),
        reason=_reason(n.get("reason")),
        address=_str(n.get("address")),
        port=num(n.get("port")),
        slurmd_start_time=_time(n.get("slurmd_start_time")),
    )


def _sub(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A nested object, or an empty one when it is missing or of another type (hostile replies stay typed)."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _nodes_from_sinfo_entries(entries: list[Any]) -> tuple[Node, ...]:
    """23.02+ ``sinfo --json``: entries per (partition, node group); merged into one Node per name.

    An entry of several nodes (plain ``sinfo --json`` groups nodes of equal state) gives sums and the first
    node's values: its CPUs count only when every node has the same (minimum = maximum), its allocated CPUs
    and port not at all. ``sinfo -N --json`` gives one entry per node, so every value is that node's."""
    merged: dict[str, Node] = {}
    for raw in entries:
        e = _obj(raw, "sinfo entry")
        names = _sub(e, "nodes").get("nodes") or []
        names = names if isinstance(names, list) else []
        hosts = [h for name in names for h in hostlist.expand(str(name))]
        single = len(hosts) == 1
        part = _sub(e, "partition").get("name")
        state, flags = state_of(_sub(e, "node").get("state"))
        cpus = _sub(e, "cpus")
        gres = _sub(e, "gres")
        if single:
            cpu_total, cpu_alloc, port = num(cpus.get("total")), num(cpus.get("allocated")), num(e.get("port"))
        else:
            low, high = num(cpus.get("minimum")), num(cpus.get("maximum"))
            cpu_total, cpu_alloc, port = (low if low == high else None), None, None
        for host in hosts:
            prev = merged.get(host)
            partitions = (*(prev.partitions if prev else ()), *([str(part)] if part else ()))
            merged[host] = Node(
                name=host,
                state=state,
                state_flags=flags,
                partitions=tuple(dict.fromkeys(partitions)),
                cpus=cpu_total or 0,
                alloc_cpus=cpu_alloc,
                gres=parse_gres(_str(gres.get("total"))),
                gres_used=parse_gres(_str(gres.get("used"))) if single else (),
                reason=_reason(e.get("reason")),
                port=port,
            )
    return tuple(merged.values())


def walk_nodes(doc: Any) -> tuple[ReplyMeta, tuple[Node, ...]]:
    """A decoded node reply read field by field, as :func:`walk_squeue`."""
    d = _obj(doc, "sinfo reply")
    check_errors(d)
    meta = parse_meta(d)
    if isinstance(d.get("nodes"), list):
        return meta, tuple(_node(_obj(n, "node")) for n in d["nodes"])
    if isinstance(d.get("sinfo"), list):
        return meta, _nodes_from_sinfo_entries(d["sinfo"])
    raise SlurmParseError("sinfo reply: neither 'nodes' nor 'sinfo' is a list")
