"""Diffs between what a GPU has and what is requested, exercised against the fake device."""

from __future__ import annotations

import pytest

from slurm_elastic.mig.catalog import load_catalog
from slurm_elastic.mig.device import MigDevice, observe
from slurm_elastic.mig.diff import GpuDiff, diff_gpu, diff_node
from slurm_elastic.mig.errors import LayoutError, MigDeviceError
from slurm_elastic.mig.model import GpuModel, GpuState, Layout, MigInstance, NodeLayout, Placement
from slurm_elastic.testing.mig_fake import FakeMigDevice

CATALOG = load_catalog()
H100 = CATALOG.get("H100-80GB")


def apply(diff: GpuDiff, device: MigDevice, gpu: GpuModel) -> None:
    """A minimal apply, in the order a real one must use (the journaled workflow is built elsewhere)."""
    ids = {p.name: p.profile_id for p in gpu.profiles}
    for inst in diff.destroy:
        assert inst.gpu_instance_id is not None
        for ci in device.list_compute_instances(inst.gpu_instance_id):
            device.destroy_compute_instance(inst.gpu_instance_id, ci.compute_instance_id)
        device.destroy_gpu_instance(inst.gpu_instance_id)
    if diff.set_mig_mode is not None:
        device.set_mig_mode(diff.set_mig_mode)
    for inst in diff.create:
        profile_id = ids[inst.profile]
        assert profile_id is not None
        gi = device.create_gpu_instance(profile_id, inst.placement)
        device.create_compute_instance(gi)


def converge(device: FakeMigDevice, layout: Layout) -> GpuDiff:
    first = diff_gpu(H100, observe(device, H100.model), layout)
    apply(first, device, H100)
    return first


def test_fresh_gpu_enables_mig_and_creates_everything() -> None:
    device = FakeMigDevice(H100)
    diff = converge(device, Layout.of({"3g.40gb": 2}))
    assert diff.set_mig_mode is True
    assert [str(i) for i in diff.create] == ["3g.40gb@0:4", "3g.40gb@4:4"]
    assert diff.destroy == () and diff.keep == ()
    assert device.calls == [
        ("set_mig_mode", True),
        ("create_gpu_instance", 9, 0, 4),
        ("create_compute_instance", 1),
        ("create_gpu_instance", 9, 4, 4),
        ("create_compute_instance", 2),
    ]
    state = observe(device, H100.model)
    assert state.layout() == Layout.of({"3g.40gb": 2})
    assert [str(i) for i in state.instances] == ["3g.40gb@0:4 gi=1 ci=0", "3g.40gb@4:4 gi=2 ci=0"]


def test_applying_twice_does_nothing() -> None:
    device = FakeMigDevice(H100)
    layout = Layout.of({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
    converge(device, layout)
    calls = len(device.calls)
    again = diff_gpu(H100, observe(device, H100.model), layout)
    assert again.is_noop
    assert again.describe() == []
    assert len(again.keep) == 4
    apply(again, device, H100)
    assert len(device.calls) == calls


def test_only_what_is_missing_is_created_and_only_what_is_extra_destroyed() -> None:
    device = FakeMigDevice(H100)
    converge(device, Layout.of({"3g.40gb": 1, "1g.10gb": 4}))  # 3g@4, 1g@0..3
    before = observe(device, H100.model)
    device.calls.clear()
    diff = converge(device, Layout.of({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}))
    assert [str(i) for i in diff.keep] == [
        "1g.10gb@0:1 gi=1 ci=0",
        "1g.10gb@1:1 gi=2 ci=0",
        "3g.40gb@4:4 gi=5 ci=0",
    ]
    assert [str(i) for i in diff.destroy] == ["1g.10gb@2:1 gi=3 ci=0", "1g.10gb@3:1 gi=4 ci=0"]
    assert [str(i) for i in diff.create] == ["2g.20gb@2:2"]
    assert diff.set_mig_mode is None
    assert diff.describe() == [
        "GPU 0: destroy 1g.10gb@2:1 gi=3 ci=0",
        "GPU 0: destroy 1g.10gb@3:1 gi=4 ci=0",
        "GPU 0: create 2g.20gb@2:2",
    ]
    after = observe(device, H100.model)
    assert {i.gpu_instance_id for i in after.instances} >= {1, 2, 5}  # kept instances keep their ids
    assert set(before.instances) - set(after.instances) == set(diff.destroy)
    assert diff_gpu(H100, after, Layout.of({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2})).is_noop


def test_fragmentation_keeps_fewer_instances() -> None:
    # 1g at slices 0 and 4; a 4g can only start at 0, so the 1g at 0 has to go.
    current = GpuState(
        index=0,
        model="H100-80GB",
        mig_enabled=True,
        instances=(
            MigInstance("1g.10gb", Placement(0, 1), 1, 0),
            MigInstance("1g.10gb", Placement(4, 1), 2, 0),
        ),
    )
    diff = diff_gpu(H100, current, Layout.of({"4g.40gb": 1, "1g.10gb": 2}))
    assert [str(i) for i in diff.keep] == ["1g.10gb@4:1 gi=2 ci=0"]
    assert [str(i) for i in diff.destroy] == ["1g.10gb@0:1 gi=1 ci=0"]
    assert [str(i) for i in diff.create] == ["4g.40gb@0:4", "1g.10gb@5:1"]


def test_disable_mig_destroys_everything_first() -> None:
    device = FakeMigDevice(H100)
    converge(device, Layout.of({"7g.80gb": 1}))
    device.calls.clear()
    diff = converge(device, Layout.disabled())
    assert diff.set_mig_mode is False and [str(i) for i in diff.destroy] == ["7g.80gb@0:8 gi=1 ci=0"]
    assert device.calls == [
        ("destroy_compute_instance", 1, 0),
        ("destroy_gpu_instance", 1),
        ("set_mig_mode", False),
    ]
    assert diff_gpu(H100, observe(device, H100.model), Layout.disabled()).is_noop


def test_instance_without_its_compute_instance_is_rebuilt() -> None:
    device = FakeMigDevice(H100, mig_enabled=True)
    gi = device.create_gpu_instance(9, Placement(0, 4))  # no compute instance, as after a crash mid-apply
    state = observe(device, H100.model)
    assert [str(i) for i in state.instances] == ["3g.40gb@0:4 gi=1"]
    diff = diff_gpu(H100, state, Layout.of({"3g.40gb": 1}))
    assert [i.gpu_instance_id for i in diff.destroy] == [gi]
    assert [str(i) for i in diff.create] == ["3g.40gb@0:4"]


def test_hand_subpartitioned_instance_is_rebuilt() -> None:
    device = FakeMigDevice(H100, mig_enabled=True)
    gi = device.create_gpu_instance(9, Placement(4, 4))
    device.add_partial_compute_instance(gi, 1)
    device.add_partial_compute_instance(gi, 2)
    diff = diff_gpu(H100, observe(device, H100.model), Layout.of({"3g.40gb": 1}))
    assert [i.gpu_instance_id for i in diff.destroy] == [gi]
    apply(diff, device, H100)
    assert diff_gpu(H100, observe(device, H100.model), Layout.of({"3g.40gb": 1})).is_noop


def test_invalid_request_raises_before_touching_anything() -> None:
    device = FakeMigDevice(H100)
    with pytest.raises(LayoutError, match="3 × 3g.40gb needs 9 compute slices; H100-80GB has 7"):
        diff_gpu(H100, observe(device, H100.model), Layout.of({"3g.40gb": 3}))
    assert device.calls == []


def test_node_diff_covers_named_gpus_and_reports_every_problem() -> None:
    devices = [FakeMigDevice(H100, index=i) for i in range(2)]
    states = [observe(d, H100.model) for d in devices]
    models = {0: H100, 1: H100}
    diffs = diff_node(models, states, NodeLayout.of({1: Layout.of({"7g.80gb": 1})}))
    assert [d.gpu_index for d in diffs] == [1]
    with pytest.raises(LayoutError) as err:
        diff_node(models, states, NodeLayout.of({0: Layout.of({"9g.90gb": 1}), 5: Layout.of({})}))
    assert str(err.value) == (
        "GPU 0: unknown profile 9g.90gb for H100-80GB "
        "(known: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb); "
        "GPU 5 does not exist on this node"
    )


def test_fake_device_enforces_the_driver_rules() -> None:
    device = FakeMigDevice(H100)
    with pytest.raises(MigDeviceError, match="MIG mode is disabled"):
        device.create_gpu_instance(9, Placement(0, 4))
    device.set_mig_mode(True)
    with pytest.raises(MigDeviceError, match="not a possible placement"):
        device.create_gpu_instance(9, Placement(2, 4))
    gi = device.create_gpu_instance(9, Placement(0, 4))
    with pytest.raises(MigDeviceError, match="overlaps"):
        device.create_gpu_instance(19, Placement(3, 1))
    device.create_compute_instance(gi)
    with pytest.raises(MigDeviceError, match="still has compute instances"):
        device.destroy_gpu_instance(gi)
    with pytest.raises(MigDeviceError, match="cannot disable MIG while GPU instances exist"):
        device.set_mig_mode(False)


def test_mode_change_that_needs_a_reset_stays_pending() -> None:
    device = FakeMigDevice(H100, mode_change_needs_reset=True)
    device.set_mig_mode(True)
    state = observe(device, H100.model)
    assert state.mig_enabled is False and state.mig_pending is True
    # Still asks to enable: the diff describes the target, the workflow decides when to reset.
    assert diff_gpu(H100, state, Layout.of({"7g.80gb": 1})).set_mig_mode is True
    device.reset()
    assert observe(device, H100.model).mig_enabled is True
