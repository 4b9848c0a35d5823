"""Apply a node layout through :class:`~slurm_elastic.mig.device.MigDevice` objects: mig-parted's "apply reuses
assert". Only what :func:`~slurm_elastic.mig.diff.diff_gpu` finds missing is done, so applying twice does nothing
the second time, and the result is checked by diffing again.

Order per GPU, as the driver requires: destroy compute instances, then their GPU instances; switch MIG mode;
create each GPU instance at its planned placement, then its one full-size compute instance. A failure stops the
apply and raises :class:`MigApplyError` with the changes already made: the caller (the agent, then the workflow)
decides to retry or to roll back by applying the previous layout, which is just another apply.

No I/O of its own: the devices are the only side effect, and they come in as a parameter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_elastic.mig.device import MigDevice, observe
from slurm_elastic.mig.diff import GpuDiff, diff_node
from slurm_elastic.mig.errors import LayoutError, MigDeviceError, MigError
from slurm_elastic.mig.model import GpuModel, GpuState, MigInstance, NodeLayout


class MigApplyError(MigError):
    """An apply stopped part-way. ``changes`` lists what was done before ``cause``; the GPU may be mixed."""

    def __init__(self, message: str, changes: Sequence[str]) -> None:
        self.changes = tuple(changes)
        done = f" (done before the failure: {'; '.join(self.changes)})" if self.changes else " (nothing changed)"
        super().__init__(message + done)


class MigResetRequiredError(MigApplyError):
    """The driver accepted a MIG mode change that takes effect only after a GPU reset (or reboot)."""


@dataclass(frozen=True)
class ApplyResult:
    changes: tuple[str, ...]  # one line per NVML call that changed something, in order
    after: tuple[GpuState, ...]  # every GPU's state afterwards


def current_states(devices: Sequence[MigDevice], models: Mapping[int, GpuModel]) -> tuple[GpuState, ...]:
    return tuple(observe(d, models[d.index].model) for d in devices if d.index in models)


def plan_node(
    devices: Sequence[MigDevice], models: Mapping[int, GpuModel], requested: NodeLayout
) -> tuple[GpuDiff, ...]:
    """The diffs ``requested`` needs now (raises :class:`LayoutError` when it cannot be built)."""
    return diff_node(models, current_states(devices, models), requested)


def apply_node(
    devices: Sequence[MigDevice], models: Mapping[int, GpuModel], requested: NodeLayout
) -> ApplyResult:
    """Make the GPUs named in ``requested`` match it; returns the changes made and the states afterwards."""
    by_index = {d.index: d for d in devices}
    diffs = plan_node(devices, models, requested)
    changes: list[str] = []
    for diff in diffs:
        if diff.is_noop:
            continue
        _apply_gpu(by_index[diff.gpu_index], models[diff.gpu_index], diff, changes)
    after = current_states(devices, models)
    try:
        leftover = [d for d in diff_node(models, after, requested) if not d.is_noop]
    except LayoutError as exc:  # pragma: no cover - the same request planned a moment ago
        raise MigApplyError(f"the layout no longer plans after the apply: {exc}", changes) from exc
    if leftover:
        what = "; ".join(line for d in leftover for line in d.describe())
        raise MigApplyError(f"the GPUs still differ from the layout after the apply: {what}", changes)
    return ApplyResult(tuple(changes), after)


def _apply_gpu(device: MigDevice, model: GpuModel, diff: GpuDiff, changes: list[str]) -> None:
    g = diff.gpu_index
    try:
        for inst in diff.destroy:
            _destroy(device, inst, changes)
        if diff.set_mig_mode is not None:
            mode = device.set_mig_mode(diff.set_mig_mode)
            changes.append(f"GPU {g}: {'enable' if diff.set_mig_mode else 'disable'} MIG mode")
            if mode.current != diff.set_mig_mode:
                raise MigResetRequiredError(
                    f"GPU {g}: MIG mode {'on' if diff.set_mig_mode else 'off'} is pending until the GPU is reset "
                    "(nvidia-smi -r, or a reboot); apply again afterwards",
                    changes,
                )
        for inst in diff.create:
            profile = model.profile(inst.profile)
            if profile is None or profile.profile_id is None:
                raise MigApplyError(f"GPU {g}: no NVML profile id for {inst.profile}", changes)
            gi = device.create_gpu_instance(profile.profile_id, inst.placement)
            changes.append(f"GPU {g}: create GPU instance {inst.profile}@{inst.placement} gi={gi}")
            ci = device.create_compute_instance(gi)
            changes.append(f"GPU {g}: create compute instance gi={gi} ci={ci}")
    except MigDeviceError as exc:
        raise MigApplyError(f"GPU {g}: {exc}", changes) from exc


def _destroy(device: MigDevice, inst: MigInstance, changes: list[str]) -> None:
    g = device.index
    gi = inst.gpu_instance_id
    if gi is None:  # pragma: no cover - observed instances always carry their ids
        raise MigApplyError(f"GPU {g}: cannot destroy {inst}: no GPU instance id", changes)
    # Every compute instance goes first (a hand-split GPU instance may hold several).
    for ci in device.list_compute_instances(gi):
        device.destroy_compute_instance(gi, ci.compute_instance_id)
        changes.append(f"GPU {g}: destroy compute instance gi={gi} ci={ci.compute_instance_id}")
    device.destroy_gpu_instance(gi)
    changes.append(f"GPU {g}: destroy GPU instance {inst.profile}@{inst.placement} gi={gi}")
