"""The agent's JSON payload, version 1 (``GET /v1/node``): typed values, serializer and validating parser.

Pure: no I/O, no clock. The agent builds a :class:`NodeReport` and sends :func:`to_dict` of it; the controller
runs :func:`parse_payload` (or :func:`parse_payload_bytes`) on what it receives and gets the same
:class:`NodeReport` back, or a :class:`PayloadError` naming the offending field (``gpus[2].utilization_percent:
...``). Rules beyond types, checked both ways:

- ``schema`` is exactly :data:`SCHEMA`; a breaking change gets a new version and endpoint (``/v2/node``).
  Additive fields may appear within v1: parsers ignore keys they do not know.
- A null utilization always comes with a non-empty ``utilization_reason`` (a MIG instance says
  ``mig_no_utilization``); null never stands for 0, and 0 never stands for "unknown".
- Percentages are within 0..100; counts, ids and MiB are non-negative integers; times are Unix seconds.
- A MIG device (``kind: "mig"``) carries its parent's UUID and its GPU/compute instance ids.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from slurm_elastic.agent.errors import PayloadError

SCHEMA = "slurm-elastic/agent-node/v1"
NODE_PATH = "/v1/node"  # the endpoint serving this schema
NVML_STATUSES = ("ok", "degraded", "error")
JOB_SOURCES = ("cgroup", "environ", "prolog")
OWNER_SOURCES = ("prolog", "process")
MPS_DAEMON_STATES = ("running", "stopped", "error")

NvmlStatus = Literal["ok", "degraded", "error"]
T = TypeVar("T")


@dataclass(frozen=True)
class ProcessReport:
    pid: int
    job_id: int | None
    sluid: str | None
    step: str | None
    job_source: str | None  # one of JOB_SOURCES, None when unattributed
    sm_util_percent: float | None
    memory_used_mib: int | None


@dataclass(frozen=True)
class GpuReport:
    id: str  # "0"; "0/1/0" for a MIG instance (GPU 0, GPU instance 1, compute instance 0)
    kind: Literal["gpu", "mig"]
    index: int
    uuid: str | None
    name: str | None
    minor: int | None
    mig_enabled: bool
    parent_uuid: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    profile: str | None
    utilization_percent: float | None
    utilization_reason: str | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    job_id: int | None  # the job holding the device (prolog allocation, else its only job's processes)
    user: str | None
    account: str | None
    owner_source: str | None  # one of OWNER_SOURCES
    processes: tuple[ProcessReport, ...]
    processes_reason: str | None
    error: str | None


@dataclass(frozen=True)
class JobReport:
    job_id: int
    sluid: str | None
    user: str | None
    account: str | None
    uid: int | None
    devices: tuple[str, ...]  # GpuReport.id of every device the job holds or uses, latest sample
    gpus_allocated: int
    gpus_in_use: int  # devices with at least one of the job's processes
    util_mean_percent: float | None  # over the window: mean of per-sample means over the job's devices
    util_max_percent: float | None  # over the window: highest single-device utilization
    util_last_percent: float | None  # latest sample's mean over the job's devices
    utilization_reason: str | None
    memory_used_mib: int  # latest sample, sum of the job's processes
    memory_max_mib: int  # over the window
    sample_count: int  # samples in the window that saw the job
    util_sample_count: int  # of those, samples with a utilization value
    first_sample_at: float
    last_sample_at: float


@dataclass(frozen=True)
class NvmlInfo:
    status: NvmlStatus
    driver_version: str | None
    message: str | None


@dataclass(frozen=True)
class ErrorReport:
    code: str
    message: str
    device: str | None


@dataclass(frozen=True)
class MpsGpuReport:
    """MPS on one GPU (additive in v1: absent from older agents' payloads)."""

    gpu: int
    daemon: str  # "running", "stopped" or "error"
    pipe_dir: str
    servers: tuple[int, ...]
    jobs: tuple[int, ...]
    active_thread_percentage: int | None
    error: str | None


@dataclass(frozen=True)
class NodeReport:
    node: str
    agent_version: str
    generated_at: float
    sampled_at: float | None
    interval_s: float
    window_s: float
    nvml: NvmlInfo
    gpus: tuple[GpuReport, ...]
    jobs: tuple[JobReport, ...]
    errors: tuple[ErrorReport, ...]
    schema: str = SCHEMA
    mps: tuple[MpsGpuReport, ...] = ()  # one entry per GPU that has an MPS directory (plugins/prolog.sh)


# ---- serializing -------------------------------------------------------------------------------------------


def to_dict(report: NodeReport) -> dict[str, Any]:
    """The JSON object for ``report`` (validated first: the agent never sends what the controller refuses)."""
    d: dict[str, Any] = _plain(report)
    parse_payload(d)
    return {"schema": d.pop("schema"), **d}  # schema first: what a reader looks at first


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {name: _plain(getattr(value, name)) for name in value.__dataclass_fields__}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def to_json_bytes(report: NodeReport) -> bytes:
    return json.dumps(to_dict(report), separators=(",", ":"), allow_nan=False).encode()


# ---- parsing -----------------------------------------------------------------------------------------------


class _Obj:
    """Typed field access on one JSON object, errors named by path."""

    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise PayloadError(path, f"expected an object, got {type(value).__name__}")
        self.d: dict[str, Any] = value
        self.path = path

    def _at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str, optional: bool) -> Any:
        if key not in self.d:
            raise PayloadError(self._at(key), "missing")
        v = self.d[key]
        if v is None and not optional:
            raise PayloadError(self._at(key), "must not be null")
        return v

    def str_(self, key: str, optional: bool = False, choices: tuple[str, ...] | None = None) -> str | None:
        v = self._get(key, optional)
        if v is None:
            return None
        if not isinstance(v, str):
            raise PayloadError(self._at(key), f"expected a string, got {type(v).__name__}")
        if choices is not None and v not in choices:
            raise PayloadError(self._at(key), f"expected one of {', '.join(choices)}, got {v!r}")
        return v

    def req_str(self, key: str, choices: tuple[str, ...] | None = None) -> str:
        return cast(str, self.str_(key, False, choices))

    def int_(self, key: str, optional: bool = False, minimum: int = 0) -> int | None:
        v = self._get(key, optional)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise PayloadError(self._at(key), f"expected an integer, got {type(v).__name__}")
        if v < minimum:
            raise PayloadError(self._at(key), f"must be >= {minimum}, got {v}")
        return v

    def req_int(self, key: str, minimum: int = 0) -> int:
        return cast(int, self.int_(key, False, minimum))

    def num(self, key: str, optional: bool = False, lo: float = 0.0, hi: float = math.inf) -> float | None:
        v = self._get(key, optional)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise PayloadError(self._at(key), f"expected a finite number, got {v!r}")
        if not lo <= v <= hi:
            raise PayloadError(self._at(key), f"must be within {lo:g}..{hi:g}, got {v}")
        return float(v)

    def req_num(self, key: str, lo: float = 0.0, hi: float = math.inf) -> float:
        return cast(float, self.num(key, False, lo, hi))

    def pct(self, key: str) -> float | None:
        return self.num(key, optional=True, lo=0.0, hi=100.0)

    def bool_(self, key: str) -> bool:
        v = self._get(key, False)
        if not isinstance(v, bool):
            raise PayloadError(self._at(key), f"expected true or false, got {type(v).__name__}")
        return v

    def list_(self, key: str, item: Callable[[object, str], T]) -> tuple[T, ...]:
        v = self._get(key, False)
        if not isinstance(v, list):
            raise PayloadError(self._at(key), f"expected a list, got {type(v).__name__}")
        return tuple(item(x, f"{self._at(key)}[{i}]") for i, x in enumerate(v))


def _str_item(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise PayloadError(path, f"expected a string, got {type(value).__name__}")
    return value


def _process(value: object, path: str) -> ProcessReport:
    o = _Obj(value, path)
    return ProcessReport(
        pid=o.req_int("pid", 1),
        job_id=o.int_("job_id", True, 1),
        sluid=o.str_("sluid", True),
        step=o.str_("step", True),
        job_source=o.str_("job_source", True, JOB_SOURCES),
        sm_util_percent=o.pct("sm_util_percent"),
        memory_used_mib=o.int_("memory_used_mib", True),
    )


def _gpu(value: object, path: str) -> GpuReport:
    o = _Obj(value, path)
    g = GpuReport(
        id=o.req_str("id"),
        kind=cast(Literal["gpu", "mig"], o.req_str("kind", ("gpu", "mig"))),
        index=o.req_int("index"),
        uuid=o.str_("uuid", True),
        name=o.str_("name", True),
        minor=o.int_("minor", True),
        mig_enabled=o.bool_("mig_enabled"),
        parent_uuid=o.str_("parent_uuid", True),
        gpu_instance_id=o.int_("gpu_instance_id", True),
        compute_instance_id=o.int_("compute_instance_id", True),
        profile=o.str_("profile", True),
        utilization_percent=o.pct("utilization_percent"),
        utilization_reason=o.str_("utilization_reason", True),
        memory_used_mib=o.int_("memory_used_mib", True),
        memory_total_mib=o.int_("memory_total_mib", True),
        job_id=o.int_("job_id", True, 1),
        user=o.str_("user", True),
        account=o.str_("account", True),
        owner_source=o.str_("owner_source", True, OWNER_SOURCES),
        processes=o.list_("processes", _process),
        processes_reason=o.str_("processes_reason", True),
        error=o.str_("error", True),
    )
    _check_gpu(g, path)
    return g


def _job(value: object, path: str) -> JobReport:
    o = _Obj(value, path)
    j = JobReport(
        job_id=o.req_int("job_id", 1),
        sluid=o.str_("sluid", True),
        user=o.str_("user", True),
        account=o.str_("account", True),
        uid=o.int_("uid", True),
        devices=o.list_("devices", _str_item),
        gpus_allocated=o.req_int("gpus_allocated"),
        gpus_in_use=o.req_int("gpus_in_use"),
        util_mean_percent=o.pct("util_mean_percent"),
        util_max_percent=o.pct("util_max_percent"),
        util_last_percent=o.pct("util_last_percent"),
        utilization_reason=o.str_("utilization_reason", True),
        memory_used_mib=o.req_int("memory_used_mib"),
        memory_max_mib=o.req_int("memory_max_mib"),
        sample_count=o.req_int("sample_count", 1),
        util_sample_count=o.req_int("util_sample_count"),
        first_sample_at=o.req_num("first_sample_at"),
        last_sample_at=o.req_num("last_sample_at"),
    )
    _check_job(j, path)
    return j


def _error(value: object, path: str) -> ErrorReport:
    o = _Obj(value, path)
    return ErrorReport(code=o.req_str("code"), message=o.req_str("message"), device=o.str_("device", True))


def _int_item(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PayloadError(path, f"expected an integer >= 0, got {value!r}")
    return value


def _mps(value: object, path: str) -> MpsGpuReport:
    o = _Obj(value, path)
    pct = o.int_("active_thread_percentage", True)
    if pct is not None and pct > 100:
        raise PayloadError(f"{path}.active_thread_percentage", f"must be within 0..100, got {pct}")
    return MpsGpuReport(
        gpu=o.req_int("gpu"),
        daemon=o.req_str("daemon", MPS_DAEMON_STATES),
        pipe_dir=o.req_str("pipe_dir"),
        servers=o.list_("servers", _int_item),
        jobs=o.list_("jobs", _int_item),
        active_thread_percentage=pct,
        error=o.str_("error", True),
    )


def parse_payload(obj: object) -> NodeReport:
    """Validates a decoded JSON payload; raises :class:`PayloadError` on the first violation."""
    o = _Obj(obj, "")
    schema = o.req_str("schema")
    if schema != SCHEMA:
        raise PayloadError("schema", f"unsupported schema {schema!r} (this parser reads {SCHEMA!r})")
    nv = _Obj(o._get("nvml", False), "nvml")
    report = NodeReport(
        schema=schema,
        node=o.req_str("node"),
        agent_version=o.req_str("agent_version"),
        generated_at=o.req_num("generated_at"),
        sampled_at=o.num("sampled_at", optional=True),
        interval_s=o.req_num("interval_s"),
        window_s=o.req_num("window_s"),
        nvml=NvmlInfo(
            status=cast(NvmlStatus, nv.req_str("status", NVML_STATUSES)),
            driver_version=nv.str_("driver_version", True),
            message=nv.str_("message", True),
        ),
        gpus=o.list_("gpus", _gpu),
        jobs=o.list_("jobs", _job),
        errors=o.list_("errors", _error),
        mps=o.list_("mps", _mps) if "mps" in o.d else (),
    )
    _check_node(report)
    return report


def parse_payload_bytes(data: bytes) -> NodeReport:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError("", f"not JSON: {exc}") from exc
    except RecursionError:  # hostile nesting ([[[[...): a typed error, not a crash (tests/unit/test_fuzz_inputs.py)
        raise PayloadError("", "not JSON: nested too deeply") from None
    return parse_payload(obj)


# ---- rules beyond types ------------------------------------------------------------------------------------


def _check_gpu(g: GpuReport, path: str) -> None:
    if g.utilization_percent is None and not g.utilization_reason:
        raise PayloadError(f"{path}.utilization_reason", "a null utilization needs a reason")
    if g.kind == "mig":
        if g.utilization_percent is not None:
            raise PayloadError(f"{path}.utilization_percent", "NVML has no utilization for MIG instances")
        if g.parent_uuid is None or g.gpu_instance_id is None or g.compute_instance_id is None:
            raise PayloadError(path, "a MIG device needs parent_uuid, gpu_instance_id and compute_instance_id")
    if (g.job_id is None) != (g.owner_source is None):
        raise PayloadError(f"{path}.owner_source", "set exactly when job_id is set")
    if g.memory_used_mib is not None and g.memory_total_mib is not None and g.memory_used_mib > g.memory_total_mib:
        raise PayloadError(f"{path}.memory_used_mib", "exceeds memory_total_mib")


def _check_job(j: JobReport, path: str) -> None:
    if j.util_mean_percent is None and not j.utilization_reason:
        raise PayloadError(f"{path}.utilization_reason", "a null utilization needs a reason")
    if j.gpus_allocated > len(j.devices) or j.gpus_in_use > len(j.devices):
        raise PayloadError(path, "gpus_allocated and gpus_in_use cannot exceed the number of devices")
    if j.util_sample_count > j.sample_count:
        raise PayloadError(f"{path}.util_sample_count", "exceeds sample_count")
    if j.first_sample_at > j.last_sample_at:
        raise PayloadError(f"{path}.first_sample_at", "is after last_sample_at")
    if j.memory_used_mib > j.memory_max_mib:
        raise PayloadError(f"{path}.memory_max_mib", "is below memory_used_mib")


def _check_node(r: NodeReport) -> None:
    if not r.node:
        raise PayloadError("node", "must not be empty")
    if r.interval_s <= 0 or r.window_s <= 0:
        raise PayloadError("interval_s", "interval_s and window_s must be positive")
    ids = [g.id for g in r.gpus]
    if len(set(ids)) != len(ids):
        raise PayloadError("gpus", f"duplicate device ids in {ids}")
    jobs = [j.job_id for j in r.jobs]
    if len(set(jobs)) != len(jobs):
        raise PayloadError("jobs", f"duplicate job ids in {jobs}")


def validate_report(r: NodeReport) -> None:
    """The controller's rules applied to a report built in Python (raises PayloadError): the same parser, so the
    agent can never send what the controller refuses."""
    parse_payload(_plain(r))
