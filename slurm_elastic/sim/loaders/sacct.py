"""Slurm accounting exports, so that a site can replay its own history.

Two forms, told apart by content (a JSON document starts with ``{``):

``sacct --json`` (Slurm 22.05, openapi dbv0.0.38; later shapes are accepted too)
    Top-level ``jobs`` list; per job ``job_id``, ``time.{submission,start,end,elapsed,limit}``,
    ``tres.{allocated,requested}``, ``allocation_nodes``, ``state.current``, ``partition``, ``account``,
    ``user``.
    ``steps`` are ignored. An error names the line where the job's object starts.
``sacct -P`` / ``sacct -p`` (``|``-separated, header line first)
    Columns by name, in any order: JobID, Submit, Start, End, and AllocTRES or ReqTRES are required; Elapsed,
    NNodes, State, Partition, Account, User, QOS and Timelimit are read when present. Step rows (``123.batch``,
    ``123.0``, ``123.extern``) are ignored. Suggested export::

        sacct -a -X -P -S 2024-01-01 -E now \\
          -o JobID,Submit,Start,End,Elapsed,AllocTRES,ReqTRES,NNodes,State,Partition,Account,User,Timelimit

Records sharing a JobID (a resized job's ``RESIZING`` records, a requeued job's runs) are merged into one job
(see :func:`_merge`). A job is replayed when it started and ended and held at least one GPU (``gres/gpu`` in
AllocTRES, else in ReqTRES); the others are counted in ``Workload.skipped`` by reason. Times are read as
printed, without a zone (sacct prints the cluster's local time; only differences matter).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from slurm_elastic.sim.errors import TraceFormatError
from slurm_elastic.sim.loaders.common import open_text
from slurm_elastic.sim.workload import JobSpec, Workload

_REQUIRED = ("JobID", "Submit", "Start", "End")
_JOB_ID = re.compile(r"^\d+(?:_(?:\d+|\[[^\]]*\]))?(?:\+\d+)?$")
_STEP_ID = re.compile(r"^\d+(?:_(?:\d+|\[[^\]]*\]))?(?:\+\d+)?\.\S+$")
_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?$")
_UNKNOWN_TIMES = {"", "unknown", "none", "n/a"}


@dataclass(frozen=True)
class _Record:
    """One job of either export, before the replay filter."""

    line: int
    job_id: str
    submit: float | None
    start: float | None
    end: float | None
    gpus: int
    nodes: int | None
    state: str
    partition: str | None
    account: str | None
    user: str | None
    time_limit: float | None
    qos: str | None = None


@dataclass(frozen=True)
class AccountingJob:
    """One finished GPU job of an export, all its records merged (see :func:`_merge`).

    Times are seconds since the epoch of the clock sacct printed, read as if it were UTC (sacct prints local
    time without a zone): differences are exact, absolute values are off by the cluster's UTC offset.
    """

    spec: JobSpec  # submit_time on that clock; duration = time covered by its records' [Start, End] spans
    start: float  # first start
    end: float  # last end
    state: str  # of its last record: COMPLETED, FAILED, TIMEOUT, CANCELLED, ...
    qos: str | None
    running: float  # seconds its records' spans cover (the replay runs it at least 1 s)
    gpu_seconds: float = 0.0  # GPUs x time at each size it held (:func:`held_gpu_seconds`), for report
    resized: int = 0  # size changes Slurm recorded (RESIZING records)

    @property
    def jct(self) -> float:
        return self.end - self.spec.submit_time

    @property
    def wait(self) -> float:
        return max(0.0, self.start - self.spec.submit_time)


def load_sacct(path: str) -> Workload:
    with open_text(path) as handle:
        try:
            text = handle.read()
        except UnicodeDecodeError as exc:
            raise TraceFormatError(path, None, f"not UTF-8 text: {exc}") from None
    return accounting_workload(path, *parse_accounting(path, text))


def parse_accounting(source: str, text: str) -> tuple[list[AccountingJob], dict[str, int]]:
    """The finished GPU jobs of an export (either form), in order of submission, and the others by reason."""
    records = list(_json_records(source, text) if text.lstrip().startswith("{") else _parsable_records(source, text))
    groups: dict[str, list[_Record]] = {}
    for rec in records:
        groups.setdefault(rec.job_id, []).append(rec)
    skipped: dict[str, int] = {}
    jobs: list[AccountingJob] = []
    for group in groups.values():
        merged = _merge(source, group)
        if isinstance(merged, str):
            skipped[merged] = skipped.get(merged, 0) + 1
        else:
            jobs.append(merged)
    jobs.sort(key=lambda j: j.spec.submit_time)  # stable: ties keep file order
    return jobs, skipped


def accounting_workload(source: str, jobs: list[AccountingJob], skipped: dict[str, int]) -> Workload:
    """The jobs as a workload to replay: submission times relative to the first one."""
    if not jobs:
        raise TraceFormatError(source, None, f"no finished GPU jobs (skipped: {skipped or 'none'})")
    origin = min(j.spec.submit_time for j in jobs)
    ordered = sorted(jobs, key=lambda j: j.spec.submit_time)
    return Workload(
        source=source,
        jobs=tuple(replace(j.spec, submit_time=j.spec.submit_time - origin) for j in ordered),
        skipped=skipped,
    )


def _merge(path: str, group: list[_Record]) -> AccountingJob | str:
    """One job from all its records, or the reason it is not replayed.

    Slurm writes several records under one JobID when a job is resized (each size but the last is ``RESIZING``)
    or requeued (``PREEMPTED``/``REQUEUED``, then the next run). The job is replayed from its first submission
    and first start, at the GPUs it first ran with, for the time covered by its records' [Start, End] spans.
    A resize record keeps the original Start, so a resized job's spans overlap and count once; a requeued
    job's runs are disjoint, and the time it waited in between is left out.
    """
    ran = [r for r in group if r.start is not None]
    if not ran:
        return "never started"
    if any(r.end is None for r in ran):
        return "not finished"
    first = min(ran, key=lambda r: r.start or 0.0)
    if first.gpus < 1:
        return "no GPUs"
    spans: list[tuple[float, float]] = []
    for rec in ran:
        assert rec.start is not None and rec.end is not None  # for mypy; checked above
        if rec.end < rec.start:
            raise TraceFormatError(path, rec.line, f"job {rec.job_id}: End before Start")
        spans.append((rec.start, rec.end))
    running = _covered(spans)
    submits = [r.submit for r in group if r.submit is not None]
    if not submits:
        raise TraceFormatError(path, first.line, f"job {first.job_id} started but has no submit time")
    # A resized job's later record is submitted at the resize, after its (original) start: keep the earliest.
    submit = min(*submits, first.start or 0.0)
    last = group[-1]
    spec = JobSpec(
        job_id=first.job_id,
        submit_time=submit,
        num_gpus=first.gpus,
        duration=max(1.0, running),  # a job that ran 0 s still held its GPUs for a moment
        num_nodes=first.nodes,
        time_limit=first.time_limit,
        user=last.user,
        account=last.account,
        partition=last.partition,
        line=min(r.line for r in group),
    )
    end = max(r.end for r in ran if r.end is not None)
    return AccountingJob(spec=spec, start=first.start or submit, end=end, state=last.state, qos=last.qos,
                         running=running, gpu_seconds=held_gpu_seconds(ran),
                         resized=sum(1 for r in group if r.state == "RESIZING"))


def held_gpu_seconds(records: list[_Record]) -> float:
    """GPU-seconds a job held, at the size of each of its records: a resize record keeps the original Start, so
    each record counts only from where the previous one ended (its resize) to its own end; a requeued job's runs
    are disjoint and count whole."""
    total, reached = 0.0, -math.inf
    for rec in sorted(records, key=lambda r: (r.end or 0.0, r.line)):
        assert rec.start is not None and rec.end is not None  # started and ended records only
        total += rec.gpus * max(0.0, rec.end - max(rec.start, reached))
        reached = max(reached, rec.end)
    return total


def _covered(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of intervals."""
    total = 0.0
    reached = -math.inf
    for start, end in sorted(spans):
        if end > max(start, reached):
            total += end - max(start, reached)
        reached = max(reached, end)
    return total


# ---------------------------------------------------------------------------- field parsers (both forms)


def _time(path: str, line: int, raw: str) -> float | None:
    text = raw.strip()
    if text.lower() in _UNKNOWN_TIMES:
        return None
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise TraceFormatError(path, line, f"time {text!r} is not YYYY-MM-DDTHH:MM:SS") from None


def _duration(path: str, line: int, raw: str, name: str) -> float | None:
    text = raw.strip()
    if text.lower() in {"", "unlimited", "partition_limit", "invalid", "none", "unknown"}:
        return None
    match = _DURATION.match(text)
    if not match:
        raise TraceFormatError(path, line, f"{name}={text!r} is not [D-]HH:MM:SS")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _tres_gpus(path: str, line: int, raw: str) -> int | None:
    """GPUs in a TRES string (``cpu=4,gres/gpu=2,mem=8G``); None when the string names no GPU."""
    untyped: int | None = None
    typed = 0
    seen_typed = False
    for item in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise TraceFormatError(path, line, f"TRES entry {item!r} is not NAME=COUNT")
        if key == "gres/gpu" or key.startswith("gres/gpu:"):
            try:
                count = int(value)
            except ValueError:
                raise TraceFormatError(path, line, f"TRES {key}={value!r} is not an integer") from None
            if key == "gres/gpu":
                untyped = count
            else:
                typed += count
                seen_typed = True
    if untyped is not None:
        return untyped
    return typed if seen_typed else None


# ---------------------------------------------------------------------------- sacct -P / -p


def _parsable_records(path: str, text: str) -> Iterator[_Record]:
    lines = text.splitlines()
    if not lines:
        raise TraceFormatError(path, 1, "empty file (expected a header line)")
    header = [h.strip().lower() for h in lines[0].split("|")]
    if header and header[-1] == "":
        header = header[:-1]  # sacct -p ends every line with a separator
    missing = [c for c in _REQUIRED if c.lower() not in header]
    if "alloctres" not in header and "reqtres" not in header:
        missing.append("AllocTRES or ReqTRES")
    if missing:
        raise TraceFormatError(path, 1, f"missing column(s) {', '.join(missing)} (export with sacct -P -o ...)")
    for number, raw in enumerate(lines[1:], start=2):
        if not raw.strip():
            continue
        values = raw.split("|")
        if len(values) == len(header) + 1 and values[-1] == "":
            values = values[:-1]
        if len(values) != len(header):
            raise TraceFormatError(path, number, f"expected {len(header)} fields, got {len(values)}")
        row = dict(zip(header, values, strict=True))
        job_id = row["jobid"].strip()
        if _STEP_ID.match(job_id):
            continue
        if not _JOB_ID.match(job_id):
            raise TraceFormatError(path, number, f"JobID {job_id!r} is not a Slurm job id")
        yield _parsable_record(path, number, job_id, row)


def _parsable_record(path: str, line: int, job_id: str, row: Mapping[str, str]) -> _Record:
    gpus = _tres_gpus(path, line, row.get("alloctres", ""))
    if gpus is None:
        gpus = _tres_gpus(path, line, row.get("reqtres", "")) or 0
    start = _time(path, line, row["start"])
    end = _time(path, line, row["end"])
    _duration(path, line, row.get("elapsed", ""), "Elapsed")  # validated; End - Start is what is replayed
    nodes_raw = row.get("nnodes", "").strip()
    try:
        nodes = int(nodes_raw) if nodes_raw else None
    except ValueError:
        raise TraceFormatError(path, line, f"NNodes={nodes_raw!r} is not an integer") from None
    return _Record(
        line=line,
        job_id=job_id,
        submit=_time(path, line, row["submit"]),
        start=start,
        end=end,
        gpus=gpus,
        nodes=nodes,
        state=row.get("state", "").strip().split(" ")[0],
        partition=row.get("partition", "").strip() or None,
        account=row.get("account", "").strip() or None,
        user=row.get("user", "").strip() or None,
        time_limit=_duration(path, line, row.get("timelimit", ""), "Timelimit"),
        qos=row.get("qos", "").strip() or None,
    )


# ---------------------------------------------------------------------------- sacct --json


def _json_jobs(path: str, text: str) -> Iterator[tuple[int, Any]]:
    """(line, job object) for each element of the top-level ``jobs`` list, with the line it starts on."""
    decoder = json.JSONDecoder()
    try:
        json.loads(text)  # reject malformed JSON first, with the decoder's own line number
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, exc.lineno, f"invalid JSON: {exc.msg}") from None
    ws = re.compile(r"\s*")

    def skip(pos: int) -> int:
        match = ws.match(text, pos)
        return match.end() if match else pos

    pos = skip(0) + 1  # past '{'
    found = False
    while True:
        pos = skip(pos)
        if text[pos] == "}":
            break
        key, pos = decoder.raw_decode(text, pos)
        pos = skip(pos) + 1  # past ':'
        pos = skip(pos)
        if key == "jobs" and text[pos] == "[":
            found = True
            pos = skip(pos + 1)
            while text[pos] != "]":
                line = text.count("\n", 0, pos) + 1
                job, pos = decoder.raw_decode(text, pos)
                yield line, job
                pos = skip(pos)
                if text[pos] == ",":
                    pos = skip(pos + 1)
            pos += 1
        else:
            _, pos = decoder.raw_decode(text, pos)
        pos = skip(pos)
        if text[pos] == ",":
            pos += 1
    if not found:
        raise TraceFormatError(path, 1, "no top-level 'jobs' list (is this sacct --json output?)")


def _number(value: Any) -> float | None:
    """A Slurm JSON number: plain (22.05; 0 = unset) or ``{"set", "infinite", "number"}`` (23.02+)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _stamp(times: Mapping[str, Any], key: str) -> float | None:
    value = _number(times.get(key))
    return value if value else None  # 0 = unknown in 22.05


def _json_gpus(tres: Any) -> int | None:
    if not isinstance(tres, list):
        return None
    untyped: int | None = None
    typed: int | None = None
    for item in tres:
        if not isinstance(item, dict):
            continue
        kind, name, count = item.get("type"), item.get("name") or "", item.get("count")
        if kind == "gres" and isinstance(count, int) and not isinstance(count, bool):
            if name == "gpu":
                untyped = count
            elif name.startswith("gpu:"):
                typed = (typed or 0) + count
    return untyped if untyped is not None else typed


def _json_id(job: Mapping[str, Any]) -> str:
    het = job["het"] if isinstance(job.get("het"), dict) else {}
    array = job["array"] if isinstance(job.get("array"), dict) else {}
    het_id, het_offset = _number(het.get("job_id")), _number(het.get("job_offset"))
    if het_id and het_offset is not None:
        return f"{int(het_id)}+{int(het_offset)}"
    array_id, task = _number(array.get("job_id")), _number(array.get("task_id"))
    if array_id and task is not None:
        return f"{int(array_id)}_{int(task)}"
    return str(job["job_id"])


def _json_records(path: str, text: str) -> Iterator[_Record]:
    for line, job in _json_jobs(path, text):
        if not isinstance(job, dict):
            raise TraceFormatError(path, line, "a job must be a JSON object")
        raw_id = job.get("job_id")
        if isinstance(raw_id, bool) or not isinstance(raw_id, int):
            raise TraceFormatError(path, line, f"job_id={raw_id!r} is not an integer")
        job_id = _json_id(job)
        times = job.get("time")
        if not isinstance(times, dict):
            raise TraceFormatError(path, line, f"job {job_id}: missing 'time' object")
        state = job.get("state", {})
        current = state.get("current") if isinstance(state, dict) else state
        if isinstance(current, list):
            current = current[0] if current else ""
        tres = job["tres"] if isinstance(job.get("tres"), dict) else {}
        gpus = _json_gpus(tres.get("allocated"))
        if gpus is None:
            gpus = _json_gpus(tres.get("requested")) or 0
        nodes = _number(job.get("allocation_nodes"))
        limit = _number(times.get("limit"))

        yield _Record(
            line=line,
            job_id=job_id,
            submit=_stamp(times, "submission"),
            start=_stamp(times, "start"),
            end=_stamp(times, "end"),
            gpus=gpus,
            nodes=int(nodes) if nodes else None,
            state=str(current or ""),
            partition=job.get("partition") or None,
            account=job.get("account") or None,
            user=job.get("user") or None,
            time_limit=limit * 60.0 if limit else None,  # minutes
            qos=job.get("qos") or None,
        )
