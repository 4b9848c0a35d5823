"""Slurm GRES for a node's MIG layout: the gres.conf lines and the node's typed ``Gres=`` counts.

Slurm schedules each MIG instance as one ``gpu`` GRES whose *type* names its size, and it expects the
instances to exist already (Slurm's gres.html, "MIG Management"). slurm-elastic writes the lines itself
instead of relying on ``AutoDetect=nvml``, because

* Debian's Slurm packages ship no gpu/nvml plugin (see shared/slurm-facts.md), and
* with AutoDetect, Slurm derives the type from the device name and the instance's memory
  (``<name up to the first '-'>_<slices>g.<round(MiB/1024)>gb``, gpu_nvml.c ``_handle_mig``), which does not
  always equal NVIDIA's profile name (an H100's 3g.40gb reports 39.25 GiB).

**Type names.** The Slurm type of a MIG instance is its NVIDIA profile name (``3g.40gb``), which is what
sites write (``--gres=gpu:1g.10gb:1``) and what Slurm's own MIG example uses as a suffix
(``gpu:a100_3g.20gb:2``). The ``+`` of media-extension profiles (``1g.10gb+me``) becomes ``_``
(``1g.10gb_me``): see :func:`slurm_type_for_profile`. Whole GPUs (MIG off) take the catalog's
``slurm_type`` (``h100``), because Slurm forbids mixing typed and untyped GRES of one name on a node.

**Device files** are a parameter (:class:`DeviceFiles`): real sites give each instance the parent GPU's
``/dev/nvidiaN`` plus its two ``/dev/nvidia-caps/nvidia-capN`` files (written as ``MultipleFiles=``, which
Slurm 22.05+ documents for MIG), the test cluster gives each instance a character device node of its own.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm_elastic.mig.errors import GresRenderError
from slurm_elastic.mig.model import GpuState, MigInstance
from slurm_elastic.mig.wire import NodeMigReport

_TYPE_CHARS_RE = re.compile(r"^[A-Za-z0-9._-]+$")


def slurm_type_for_profile(profile: str) -> str:
    """``3g.40gb`` -> ``3g.40gb``; ``1g.10gb+me`` -> ``1g.10gb_me``; ``1g.24gb+me.all`` -> ``1g.24gb_me.all``.

    ``.`` is kept (Slurm's own docs and sites' job scripts use ``gpu:a100_3g.20gb`` and ``gpu:1g.10gb:1``).
    ``+`` is replaced because it is not needed and not documented as safe in GRES strings, which Slurm also
    carries into TRES names (``gres/gpu:TYPE``). NVIDIA profile names never contain ``_``, so the mapping is
    reversible (:func:`profile_for_slurm_type`).
    """
    return profile.replace("+", "_")


def profile_for_slurm_type(slurm_type: str) -> str:
    """Inverse of :func:`slurm_type_for_profile`."""
    return slurm_type.replace("_", "+")


@dataclass(frozen=True)
class GresDevice:
    """One schedulable ``gpu`` GRES: a whole GPU (``instance`` None) or one MIG instance."""

    gpu_index: int
    slurm_type: str
    files: tuple[str, ...]
    instance: MigInstance | None = None


class DeviceFiles(Protocol):
    """Names the device file(s) Slurm fences for one schedulable GPU on ``node``.

    ``ordinal`` counts the node's schedulable GPUs in gres.conf order (0, 1, ...).
    """

    def files(
        self, node: str, gpu_index: int, instance: MigInstance | None, ordinal: int
    ) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class NvidiaCapsFiles:
    """Real MIG device files: ``/dev/nvidia<minor>`` plus the GPU- and compute-instance capability files.

    ``mig_minors`` is ``/proc/driver/nvidia-caps/mig-minors`` parsed by :func:`parse_mig_minors`;
    ``gpu_minors`` maps GPU index to its ``/dev/nvidiaN`` minor (default: the index).
    """

    mig_minors: Mapping[str, int]
    gpu_minors: Mapping[int, int] | None = None
    dev_dir: str = "/dev"

    def files(self, node: str, gpu_index: int, instance: MigInstance | None, ordinal: int) -> tuple[str, ...]:
        minor = (self.gpu_minors or {}).get(gpu_index, gpu_index)
        parent = f"{self.dev_dir}/nvidia{minor}"
        if instance is None:
            return (parent,)
        gi, ci = instance.gpu_instance_id, instance.compute_instance_id
        if gi is None or ci is None:
            raise GresRenderError(f"{node} GPU {gpu_index}: {instance} has no GPU/compute instance id yet")
        gi_key = f"gpu{minor}/gi{gi}/access"
        ci_key = f"gpu{minor}/gi{gi}/ci{ci}/access"
        try:
            gi_minor, ci_minor = self.mig_minors[gi_key], self.mig_minors[ci_key]
        except KeyError as exc:
            raise GresRenderError(f"{node} GPU {gpu_index}: no {exc.args[0]} in mig-minors") from exc
        caps = f"{self.dev_dir}/nvidia-caps"
        return (parent, f"{caps}/nvidia-cap{gi_minor}", f"{caps}/nvidia-cap{ci_minor}")


@dataclass(frozen=True)
class TemplateFiles:
    """One device file per schedulable GPU, from a template like ``/var/tmp/cl/dev/{node}/gpu{ordinal}``.

    Fields: ``{node}``, ``{gpu}`` (parent GPU index), ``{ordinal}``, ``{gi}`` and ``{ci}`` (instance ids,
    empty for whole GPUs). The template is checked when the object is made; nothing in it is evaluated.
    """

    template: str

    FIELDS = frozenset({"node", "gpu", "ordinal", "gi", "ci"})

    def __post_init__(self) -> None:
        try:
            parsed = list(string.Formatter().parse(self.template))
        except ValueError as exc:
            raise GresRenderError(f"bad device file template {self.template!r}: {exc}") from exc
        for _, field, spec, conv in parsed:
            if field is None:
                continue
            if field not in self.FIELDS or spec or conv:
                raise GresRenderError(
                    f"bad device file template {self.template!r}: unknown field {{{field}}} "
                    f"(allowed: {', '.join(sorted(self.FIELDS))})"
                )
        if not self.template.startswith("/"):
            raise GresRenderError(f"device file template {self.template!r} must be an absolute path")

    def files(self, node: str, gpu_index: int, instance: MigInstance | None, ordinal: int) -> tuple[str, ...]:
        gi = "" if instance is None or instance.gpu_instance_id is None else str(instance.gpu_instance_id)
        ci = (
            ""
            if instance is None or instance.compute_instance_id is None
            else str(instance.compute_instance_id)
        )
        return (self.template.format(node=node, gpu=gpu_index, ordinal=ordinal, gi=gi, ci=ci),)


def parse_mig_minors(text: str) -> dict[str, int]:
    """Parse ``/proc/driver/nvidia-caps/mig-minors`` (lines like ``gpu0/gi1/ci0/access 22``)."""
    minors: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].isdigit():
            raise GresRenderError(f"mig-minors line {lineno}: expected '<path> <minor>', got {line!r}")
        minors[parts[0]] = int(parts[1])
    return minors


def gres_devices(
    node: str, gpus: Sequence[GpuState], whole_gpu_types: Mapping[int, str], files: DeviceFiles
) -> tuple[GresDevice, ...]:
    """The node's schedulable GPUs in a stable order: by GPU index, then by instance placement.

    ``whole_gpu_types`` gives the Slurm type of each GPU index that is not in MIG mode.
    """
    devices: list[GresDevice] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.mig_enabled:
            for inst in sorted(gpu.instances, key=lambda i: (i.placement, i.profile)):
                slurm_type = slurm_type_for_profile(inst.profile)
                devices.append(
                    GresDevice(gpu.index, slurm_type, files.files(node, gpu.index, inst, len(devices)), inst)
                )
        else:
            slurm_type = whole_gpu_types.get(gpu.index, "")
            if not slurm_type:
                raise GresRenderError(f"{node} GPU {gpu.index}: no Slurm type for the whole GPU (MIG off)")
            devices.append(
                GresDevice(gpu.index, slurm_type, files.files(node, gpu.index, None, len(devices)))
            )
    for d in devices:
        if not _TYPE_CHARS_RE.match(d.slurm_type):
            raise GresRenderError(
                f"{node} GPU {d.gpu_index}: Slurm type {d.slurm_type!r} has characters Slurm may split on"
            )
    return tuple(devices)


def render_gres_conf(node: str, devices: Sequence[GresDevice], autodetect_off: bool = False) -> str:
    """The node's gres.conf lines, one per schedulable GPU.

    ``autodetect_off`` adds ``NodeName=<node> AutoDetect=off`` first, for sites whose global gres.conf says
    ``AutoDetect=nvml``: otherwise Slurm would merge its own detected types with these lines.
    """
    lines = [f"NodeName={node} AutoDetect=off"] if autodetect_off else []
    for d in devices:
        key = "MultipleFiles" if len(d.files) > 1 else "File"
        lines.append(f"NodeName={node} Name=gpu Type={d.slurm_type} {key}={','.join(d.files)}")
    return "\n".join(lines) + ("\n" if lines else "")


def gres_counts(devices: Sequence[GresDevice]) -> tuple[tuple[str, int], ...]:
    """Typed counts, ordered by first appearance in ``devices``: ``(("3g.40gb", 2), ("1g.10gb", 1))``."""
    counts: dict[str, int] = {}
    for d in devices:
        counts[d.slurm_type] = counts.get(d.slurm_type, 0) + 1
    return tuple(counts.items())


def render_node_gres(devices: Sequence[GresDevice], extra: Sequence[str] = ()) -> str:
    """The node's ``Gres=`` value, e.g. ``gpu:3g.40gb:2,gpu:1g.10gb:1``; ``extra`` (``mps:400``) appended."""
    parts = [f"gpu:{t}:{n}" for t, n in gres_counts(devices)]
    return ",".join([*parts, *extra])


def slurm_autodetect_type(nvml_gpu_name: str, gpu_instance_slices: int, memory_size_mb: int) -> str:
    """The type Slurm's AutoDetect=nvml would give a MIG instance (gpu_nvml.c ``_handle_mig``), lower case.

    Useful to check a site's existing AutoDetect types against ours: a configured Type must be a substring
    of this (gres.conf(5), Type). ``NVIDIA A100-SXM4-40GB`` + 3 slices + 19968 MiB -> ``nvidia_a100_3g.20gb``.
    The rounding is round-half-up, as C's roundl for positive values.
    """
    base = nvml_gpu_name.split("-", 1)[0].strip()
    gb = (2 * memory_size_mb + 1024) // 2048
    return f"{base}_{gpu_instance_slices}g.{gb}gb".replace(" ", "_").lower()


@dataclass(frozen=True)
class NodeGresConfig:
    """Everything Slurm needs to know about one node's GPUs: its gres.conf lines and its ``Gres=`` value."""

    node: str
    devices: tuple[GresDevice, ...]
    gres_lines: tuple[str, ...]
    node_gres: str


def device_files_for(spec: str, mig_minors: Mapping[str, int], gpu_minors: Mapping[int, int]) -> DeviceFiles:
    """``"nvidia-caps"`` (real MIG nodes, from the driver's mig-minors) or a :class:`TemplateFiles` template."""
    if spec == "nvidia-caps":
        return NvidiaCapsFiles(mig_minors, gpu_minors)
    return TemplateFiles(spec)


@dataclass(frozen=True)
class PlannedFiles:
    """For plans: the real files where they are known, a placeholder for instances that do not exist yet."""

    real: DeviceFiles

    def files(self, node: str, gpu_index: int, instance: MigInstance | None, ordinal: int) -> tuple[str, ...]:
        try:
            return self.real.files(node, gpu_index, instance, ordinal)
        except GresRenderError:
            return (f"<device files of {instance} after the apply>",)


def render_node_gres_config(
    node: str,
    report: NodeMigReport,
    *,
    device_files: str,
    mps_per_gpu: int = 0,
    autodetect_off: bool = False,
    whole_gpu_type: str | None = None,
    planned: bool = False,
) -> NodeGresConfig:
    """The node's gres.conf lines and ``Gres=`` for the layout the agent reports now.

    Whole GPUs (MIG off) take the model's Slurm type, else ``whole_gpu_type``. With ``mps_per_gpu``, each whole
    GPU also gets a ``Name=mps Count=<mps_per_gpu>`` line on the same device file(s), and ``Gres=`` an ``mps``
    count: Slurm 22.05 does not share MIG instances through MPS, so MIG instances get none. ``planned``: the
    report describes a layout not applied yet; files that depend on new instance ids become placeholders.
    """
    gpu_minors = {g.index: g.minor for g in report.gpus if g.minor is not None}
    files: DeviceFiles = device_files_for(device_files, dict(report.mig_minors), gpu_minors)
    if planned:
        files = PlannedFiles(files)
    whole_types: dict[int, str] = {}
    for g in report.gpus:
        t = (g.model.slurm_type if g.model is not None else None) or whole_gpu_type
        if t:
            whole_types[g.index] = t
    devices = gres_devices(node, [g.state for g in report.gpus], whole_types, files)
    lines = render_gres_conf(node, devices, autodetect_off).splitlines()
    whole = [d for d in devices if d.instance is None]
    mps_total = 0
    if mps_per_gpu > 0:
        for d in whole:
            key = "MultipleFiles" if len(d.files) > 1 else "File"
            lines.append(f"NodeName={node} Name=mps Count={mps_per_gpu} {key}={','.join(d.files)}")
            mps_total += mps_per_gpu
    extra = [f"mps:{mps_total}"] if mps_total else []
    return NodeGresConfig(node, devices, tuple(lines), render_node_gres(devices, extra))

