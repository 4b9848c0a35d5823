"""The agent's MIG endpoints on the wire: ``GET /v1/mig`` (schema ``slurm-elastic/agent-mig/v1``) and
``POST /v1/mig/apply``. Pure: typed values, a serializer and a strict parser, shared by agent and controller.

A GPU's report carries the model the agent plans with: NVML's profiles and placements, which win over the
catalog at runtime (:mod:`slurm_elastic.mig.nvml_check`), so the controller plans and diffs exactly what the
driver will accept. It also carries the node's ``/proc/driver/nvidia-caps/mig-minors`` entries, which gres.conf
needs on a real MIG node (:class:`~slurm_elastic.mig.gres.NvidiaCapsFiles`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_elastic.mig.errors import MigError
from slurm_elastic.mig.model import GpuModel, GpuState, Layout, MigInstance, MigProfile, NodeLayout, Placement

SCHEMA = "slurm-elastic/agent-mig/v1"
MIG_PATH = "/v1/mig"
APPLY_PATH = "/v1/mig/apply"


class MigWireError(MigError):
    """A MIG report or apply request/answer does not match the schema; the message names the field."""


@dataclass(frozen=True)
class GpuMigReport:
    """One physical GPU: identity, whether it can do MIG, its state and the model NVML says it has."""

    index: int
    name: str
    uuid: str | None
    minor: int | None
    mig_capable: bool
    state: GpuState  # mig_enabled False and no instances when MIG is off or unsupported
    model: GpuModel | None  # None when the GPU is not MIG capable
    notes: tuple[str, ...] = ()  # catalog disagreements (nvml_check), for the operator
    pci_device_id: str | None = None  # "0x233010DE" (mig-parted device-filter), None when unknown


@dataclass(frozen=True)
class NodeMigReport:
    node: str
    gpus: tuple[GpuMigReport, ...]
    mig_minors: tuple[tuple[str, int], ...] = ()  # /proc/driver/nvidia-caps/mig-minors, empty without MIG
    schema: str = SCHEMA

    def gpu(self, index: int) -> GpuMigReport | None:
        return next((g for g in self.gpus if g.index == index), None)

    def states(self) -> tuple[GpuState, ...]:
        return tuple(g.state for g in self.gpus)

    def models(self) -> dict[int, GpuModel]:
        return {g.index: g.model for g in self.gpus if g.model is not None}

    def layout(self) -> NodeLayout:
        """The node's current layout, every GPU listed (MIG-off GPUs as disabled)."""
        return NodeLayout.of({g.index: g.state.layout() for g in self.gpus})


@dataclass(frozen=True)
class ApplyAnswer:
    """What ``POST /v1/mig/apply`` returns: the changes made (in order) and the node afterwards."""

    changes: tuple[str, ...]
    report: NodeMigReport

    @property
    def changed(self) -> bool:
        return bool(self.changes)


# ---- layouts --------------------------------------------------------------------------------------------------


def layout_to_obj(layout: Layout) -> object:
    """``"off"`` for MIG disabled, else the counts object (``{}`` is MIG on with no instances)."""
    return "off" if not layout.mig_enabled else dict(layout.counts)


def layout_from_obj(obj: object, where: str) -> Layout:
    if obj == "off":
        return Layout.disabled()
    if not isinstance(obj, dict):
        raise MigWireError(f"{where}: expected \"off\" or an object of profile counts, got {obj!r}")
    counts: dict[str, int] = {}
    for k, v in obj.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise MigWireError(f"{where}: bad count {k!r}: {v!r}")
        counts[k] = v
    return Layout.of(counts)


def node_layout_to_obj(layout: NodeLayout) -> dict[str, object]:
    return {str(i): layout_to_obj(lay) for i, lay in layout.gpus}


def node_layout_from_obj(obj: object, where: str = "layout") -> NodeLayout:
    if not isinstance(obj, dict) or not obj:
        raise MigWireError(f"{where}: expected an object of GPU index -> layout")
    gpus: dict[int, Layout] = {}
    for k, v in obj.items():
        if not isinstance(k, str) or not k.isdigit():
            raise MigWireError(f"{where}: GPU keys are indexes such as \"0\", got {k!r}")
        gpus[int(k)] = layout_from_obj(v, f"{where}.{k}")
    return NodeLayout.of(gpus)


# ---- reports --------------------------------------------------------------------------------------------------


def _model_obj(m: GpuModel) -> dict[str, Any]:
    return {
        "model": m.model,
        "compute_slices": m.compute_slices,
        "memory_slices": m.memory_slices,
        "slurm_type": m.slurm_type,
        "profiles": [
            {
                "name": p.name,
                "profile_id": p.profile_id,
                "compute_slices": p.compute_slices,
                "memory_slices": p.memory_slices,
                "max_instances": p.max_instances,
                "placement_starts": list(p.placement_starts),
            }
            for p in m.profiles
        ],
    }


def _instance_obj(i: MigInstance) -> dict[str, Any]:
    return {
        "profile": i.profile,
        "start": i.placement.start,
        "size": i.placement.size,
        "gpu_instance_id": i.gpu_instance_id,
        "compute_instance_id": i.compute_instance_id,
    }


def report_to_obj(r: NodeMigReport) -> dict[str, Any]:
    return {
        "schema": r.schema,
        "node": r.node,
        "mig_minors": dict(r.mig_minors),
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "uuid": g.uuid,
                "minor": g.minor,
                "mig_capable": g.mig_capable,
                "mig_enabled": g.state.mig_enabled,
                "mig_pending": g.state.mig_pending,
                "model": None if g.model is None else _model_obj(g.model),
                "instances": [_instance_obj(i) for i in g.state.instances],
                "notes": list(g.notes),
                "pci_device_id": g.pci_device_id,
            }
            for g in r.gpus
        ],
    }


def answer_to_obj(a: ApplyAnswer) -> dict[str, Any]:
    return {"changes": list(a.changes), "report": report_to_obj(a.report)}


def dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


class _O:
    def __init__(self, value: object, path: str) -> None:
        if not isinstance(value, dict):
            raise MigWireError(f"{path or 'answer'}: expected an object")
        self.d: dict[str, Any] = value
        self.path = path

    def get(self, key: str, kinds: type | tuple[type, ...], optional: bool = False) -> Any:
        where = f"{self.path}.{key}" if self.path else key
        if key not in self.d:
            if optional:
                return None
            raise MigWireError(f"{where}: missing")
        v = self.d[key]
        if v is None and optional:
            return None
        if isinstance(v, bool) and kinds is int or not isinstance(v, kinds):
            raise MigWireError(f"{where}: expected {getattr(kinds, '__name__', kinds)}, got {v!r}")
        return v

    def list(self, key: str) -> Sequence[Any]:
        return self.get(key, list)  # type: ignore[no-any-return]


def _int(v: object, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise MigWireError(f"{where}: expected an integer, got {v!r}")
    return v


def _model_from(obj: object, path: str) -> GpuModel:
    o = _O(obj, path)
    profiles = []
    for k, raw in enumerate(o.list("profiles")):
        p = _O(raw, f"{path}.profiles[{k}]")
        pid = p.get("profile_id", int, optional=True)
        profiles.append(
            MigProfile(
                name=p.get("name", str),
                compute_slices=p.get("compute_slices", int),
                memory_slices=p.get("memory_slices", int),
                max_instances=p.get("max_instances", int),
                placement_starts=tuple(_int(s, f"{p.path}.placement_starts") for s in p.list("placement_starts")),
                profile_id=pid,
            )
        )
    return GpuModel(
        model=o.get("model", str),
        compute_slices=o.get("compute_slices", int),
        memory_slices=o.get("memory_slices", int),
        profiles=tuple(profiles),
        slurm_type=o.get("slurm_type", str, optional=True),
        sources=("nvml",),
    )


def report_from_obj(obj: object) -> NodeMigReport:
    o = _O(obj, "")
    schema = o.get("schema", str)
    if schema != SCHEMA:
        raise MigWireError(f"schema: unsupported {schema!r} (this reader knows {SCHEMA!r})")
    minors_raw = o.get("mig_minors", dict)
    minors = tuple(sorted((str(k), _int(v, f"mig_minors.{k}")) for k, v in minors_raw.items()))
    gpus: list[GpuMigReport] = []
    for k, raw in enumerate(o.list("gpus")):
        path = f"gpus[{k}]"
        g = _O(raw, path)
        index = g.get("index", int)
        model_raw = g.get("model", dict, optional=True)
        model = None if model_raw is None else _model_from(model_raw, f"{path}.model")
        instances = []
        for n, iraw in enumerate(g.list("instances")):
            i = _O(iraw, f"{path}.instances[{n}]")
            instances.append(
                MigInstance(
                    profile=i.get("profile", str),
                    placement=Placement(i.get("start", int), i.get("size", int)),
                    gpu_instance_id=i.get("gpu_instance_id", int, optional=True),
                    compute_instance_id=i.get("compute_instance_id", int, optional=True),
                )
            )
        state = GpuState(
            index=index,
            model=model.model if model is not None else g.get("name", str),
            mig_enabled=g.get("mig_enabled", bool),
            instances=tuple(sorted(instances, key=lambda x: (x.placement, x.profile))),
            mig_pending=g.get("mig_pending", bool, optional=True),
        )
        gpus.append(
            GpuMigReport(
                index=index,
                name=g.get("name", str),
                uuid=g.get("uuid", str, optional=True),
                minor=g.get("minor", int, optional=True),
                mig_capable=g.get("mig_capable", bool),
                state=state,
                model=model,
                notes=tuple(str(n) for n in g.list("notes")),
                pci_device_id=g.get("pci_device_id", str, optional=True),
            )
        )
    indexes = [g.index for g in gpus]
    if len(set(indexes)) != len(indexes):
        raise MigWireError(f"gpus: duplicate indexes {indexes}")
    return NodeMigReport(node=o.get("node", str), gpus=tuple(gpus), mig_minors=minors)


def answer_from_obj(obj: object) -> ApplyAnswer:
    o = _O(obj, "")
    changes = tuple(str(c) for c in o.list("changes"))
    return ApplyAnswer(changes, report_from_obj(o.get("report", dict)))


def loads(data: bytes) -> object:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MigWireError(f"not JSON: {exc}") from exc


def apply_request_obj(layout: NodeLayout) -> dict[str, Any]:
    return {"layout": node_layout_to_obj(layout)}


def apply_request_from_obj(obj: object) -> NodeLayout:
    o = _O(obj, "")
    unknown = sorted(set(o.d) - {"layout"})
    if unknown:
        raise MigWireError(f"unknown field(s) {', '.join(unknown)}")
    return node_layout_from_obj(o.get("layout", dict))


def minors_mapping(report: NodeMigReport) -> Mapping[str, int]:
    return dict(report.mig_minors)
