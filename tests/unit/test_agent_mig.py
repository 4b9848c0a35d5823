"""The agent's MIG side: the real NVML MigDevice through the virtual libnvidia-ml.so.1, the service (report and
idempotent apply), and the signed HTTP endpoints with the controller's client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from slurm_elastic.agent.auth import RequestVerifier, sign_request
from slurm_elastic.agent.client import AgentClient
from slurm_elastic.agent.errors import AgentAuthError, AgentRequestError
from slurm_elastic.agent.mig_nvml import MigNotSupportedError, NvmlMigDevice
from slurm_elastic.agent.mig_service import MigService, nvml_mig_service
from slurm_elastic.agent.server import AgentApp
from slurm_elastic.mig.apply import MigApplyError
from slurm_elastic.mig.catalog import load_catalog
from slurm_elastic.mig.errors import LayoutError
from slurm_elastic.mig.model import Layout, NodeLayout, Placement
from slurm_elastic.mig.wire import APPLY_PATH, MIG_PATH, answer_from_obj, report_from_obj, report_to_obj
from slurm_elastic.testing.vgpu.state import make_node_state, with_fault
from slurm_elastic.testing.vgpu.statefile import StateFile
from tests.unit import vgpu_support
from tests.unit.test_agent_auth import KEY, StubSampler, report

vgpu = vgpu_support.vgpu
pynvml = pytest.importorskip("pynvml")


@contextlib.contextmanager
def nvml_service(minors: Path) -> Iterator[MigService]:
    """The production service; its own NVML reference is released after the test (NVML counts them)."""
    svc, devices = nvml_mig_service("n1", load_catalog(), mig_minors_file=minors)
    try:
        yield svc
    finally:
        devices.close()


@pytest.fixture
def service(vgpu: StateFile, tmp_path: Path) -> Iterator[MigService]:
    with nvml_service(tmp_path / "no-mig-minors") as svc:
        yield svc


def layouts(svc: MigService) -> dict[int, object]:
    return {g.index: g.state.layout().as_dict() if g.state.mig_enabled else "off" for g in svc.report().gpus}


def test_the_report_plans_with_what_nvml_says(service: MigService) -> None:
    r = service.report()
    assert [g.index for g in r.gpus] == [0, 1, 2, 3]
    g = r.gpus[0]
    assert (g.name, g.mig_capable, g.state.mig_enabled, g.minor) == ("NVIDIA A100-SXM4-40GB", True, False, 4)
    assert g.uuid is not None and g.uuid.startswith("GPU-")
    assert g.model is not None and g.model.model == "A100-40GB" and g.model.slurm_type == "a100"
    assert {p.name: (p.profile_id, p.placement_starts) for p in g.model.profiles}["2g.10gb"] == (14, (0, 2, 4))
    assert g.notes == ()  # the virtual library's table is the catalog's
    assert report_to_obj(report_from_obj(report_to_obj(r))) == report_to_obj(r)  # the wire format round-trips


def test_apply_creates_what_is_missing_and_is_idempotent(service: MigService, vgpu: StateFile) -> None:
    target = NodeLayout.of({0: Layout.of({"3g.20gb": 2}), 1: Layout.of({"1g.5gb": 7})})
    answer = service.apply(target)
    assert answer.changes[:2] == ("GPU 0: enable MIG mode", "GPU 0: create GPU instance 3g.20gb@0:4 gi=1")
    assert len([c for c in answer.changes if "create compute instance" in c]) == 9
    assert layouts(service) == {0: {"3g.20gb": 2}, 1: {"1g.5gb": 7}, 2: "off", 3: "off"}
    state = vgpu.read()
    assert sorted((i.gpu, i.profile_id, i.start) for i in state.gpu_instances if i.gpu == 0) == [(0, 9, 0), (0, 9, 4)]
    assert len(state.compute_instances) == 9
    assert service.apply(target).changes == ()  # nothing missing: nothing done


def test_apply_keeps_instances_that_can_stay(service: MigService) -> None:
    service.apply(NodeLayout.of({0: Layout.of({"1g.5gb": 7})}))
    before = {i.placement: i.gpu_instance_id for i in service.report().gpus[0].state.instances}
    answer = service.apply(NodeLayout.of({0: Layout.of({"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1})}))
    after = {i.placement: i.gpu_instance_id for i in service.report().gpus[0].state.instances}
    kept = {p: gi for p, gi in after.items() if before.get(p) == gi}
    assert sorted(kept) == [Placement(0, 1), Placement(1, 1)]  # same ids: their device files stay valid
    assert sum("destroy GPU instance" in c for c in answer.changes) == 5


def test_mig_off_destroys_instances_then_disables(service: MigService) -> None:
    service.apply(NodeLayout.of({2: Layout.of({"4g.20gb": 1, "3g.20gb": 1})}))
    answer = service.apply(NodeLayout.of({2: Layout.disabled()}))
    assert answer.changes[-1] == "GPU 2: disable MIG mode"
    assert [c.split(":")[1].split()[0] for c in answer.changes].count("destroy") == 4
    assert layouts(service)[2] == "off"


def test_impossible_or_unknown_layouts_are_refused_and_change_nothing(service: MigService, vgpu: StateFile) -> None:
    with pytest.raises(LayoutError, match="3 × 3g.20gb needs 9 compute slices"):
        service.apply(NodeLayout.of({0: Layout.of({"3g.20gb": 3})}))
    with pytest.raises(LayoutError, match="GPU 9 does not exist on n1"):
        service.apply(NodeLayout.of({9: Layout.of({"1g.5gb": 1})}))
    with pytest.raises(LayoutError, match="unknown"):
        service.apply(NodeLayout.of({0: Layout.of({"3g.40gb": 1})}))
    assert vgpu.read().gpu_instances == () and not vgpu.read().gpu(0).mig_current


def test_an_nvml_failure_mid_apply_says_what_was_done(service: MigService, vgpu: StateFile) -> None:
    vgpu.update(lambda s: with_fault(s, "nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_NO_PERMISSION, 0))
    with pytest.raises(MigApplyError) as info:
        service.apply(NodeLayout.of({0: Layout.of({"7g.40gb": 1})}))
    assert info.value.changes == ("GPU 0: enable MIG mode", "GPU 0: create GPU instance 7g.40gb@0:8 gi=1")
    assert "No Permission" in str(info.value) or "no_permission" in str(info.value)


def test_a_gpu_without_mig_mode(vgpu: StateFile, tmp_path: Path) -> None:
    vgpu.write(make_node_state("n1", 2, mig_capable=False))
    with pytest.raises(MigNotSupportedError):
        NvmlMigDevice(0).get_mig_mode()
    with nvml_service(tmp_path / "none") as svc:
        r = svc.report()
        assert [(g.mig_capable, g.model) for g in r.gpus] == [(False, None), (False, None)]
        with pytest.raises(LayoutError, match="has no MIG mode"):
            svc.apply(NodeLayout.of({0: Layout.of({"1g.5gb": 1})}))


def test_nvml_device_calls_one_by_one(vgpu: StateFile) -> None:
    d = NvmlMigDevice(3)
    assert not d.get_mig_mode().current
    assert d.set_mig_mode(True).current
    assert d.possible_placements(9) == (Placement(0, 4), Placement(4, 4))
    gi = d.create_gpu_instance(9, Placement(4, 4))
    ci = d.create_compute_instance(gi)
    listed = [(r.gpu_instance_id, r.profile_id, r.placement) for r in d.list_gpu_instances()]
    assert listed == [(gi, 9, Placement(4, 4))]
    assert [(c.compute_instance_id, c.slice_count) for c in d.list_compute_instances(gi)] == [(ci, 3)]
    d.destroy_compute_instance(gi, ci)
    d.destroy_gpu_instance(gi)
    assert d.list_gpu_instances() == ()


def test_mig_minors_are_reported_for_gres_conf(vgpu: StateFile, tmp_path: Path) -> None:
    minors = tmp_path / "mig-minors"
    minors.write_text("gpu0/gi1/access 21\ngpu0/gi1/ci0/access 22\n")
    with nvml_service(minors) as svc:
        assert dict(svc.report().mig_minors) == {"gpu0/gi1/access": 21, "gpu0/gi1/ci0/access": 22}


# ---- HTTP ------------------------------------------------------------------------------------------------------


def server(svc: MigService | None) -> TestServer:
    app = AgentApp(StubSampler(report()), RequestVerifier(KEY), mig=svc)
    return TestServer(app.build(), host="127.0.0.1")


def test_signed_report_and_apply_through_the_client(service: MigService) -> None:
    async def main() -> None:
        async with server(service) as srv, AgentClient(KEY, timeout_s=30) as client:
            url = str(srv.make_url("/"))
            r = await client.mig_report(url)
            assert r.node == "n1" and len(r.gpus) == 4
            answer = await client.mig_apply(url, NodeLayout.of({3: Layout.of({"2g.10gb": 3})}))
            assert answer.changed and answer.report.gpu(3).state.layout().as_dict() == {"2g.10gb": 3}  # type: ignore[union-attr]
            again = await client.mig_apply(url, NodeLayout.of({3: Layout.of({"2g.10gb": 3})}))
            assert not again.changed
            with pytest.raises(AgentRequestError) as info:
                await client.mig_apply(url, NodeLayout.of({3: Layout.of({"2g.10gb": 4})}))
            assert (info.value.status, info.value.error) == (400, "invalid_layout")
            with pytest.raises(AgentAuthError):
                async with AgentClient(b"z" * 64) as other:
                    await other.mig_apply(url, NodeLayout.of({3: Layout.disabled()}))

    asyncio.run(main())
    assert layouts(service)[3] == {"2g.10gb": 3}


def test_unsigned_or_tampered_applies_are_refused(service: MigService) -> None:
    async def main() -> None:
        async with server(service) as srv, aiohttp.ClientSession() as s:
            url = str(srv.make_url(APPLY_PATH))
            body = json.dumps({"layout": {"0": "off"}}).encode()
            async with s.post(url, data=body) as resp:
                assert resp.status == 401
            headers = sign_request(KEY, "POST", APPLY_PATH, body, now=time.time())
            tampered = json.dumps({"layout": {"0": {"7g.40gb": 1}}}).encode()
            async with s.post(url, data=tampered, headers=headers) as resp:  # the signature covers the body
                assert resp.status == 401 and json.loads(await resp.read())["reason"] == "bad_signature"
            headers = sign_request(KEY, "POST", APPLY_PATH, b"{}", now=time.time())
            async with s.post(url, data=b"{}", headers=headers) as resp:
                assert resp.status == 400

    asyncio.run(main())
    assert layouts(service)[0] == "off"


def test_apply_can_be_switched_off_and_agents_without_mig_say_so(service: MigService) -> None:
    service.allow_apply = False

    async def main() -> None:
        async with server(service) as srv, AgentClient(KEY, timeout_s=30) as client:
            with pytest.raises(AgentRequestError) as info:
                await client.mig_apply(str(srv.make_url("/")), NodeLayout.of({0: Layout.disabled()}))
            assert (info.value.status, info.value.error) == (403, "mig_apply_disabled")
        async with server(None) as srv, AgentClient(KEY, timeout_s=30) as client:
            with pytest.raises(AgentRequestError) as info:
                await client.mig_report(str(srv.make_url("/")))
            assert (info.value.status, info.value.error) == (404, "mig_unavailable")

    asyncio.run(main())


def test_the_apply_answer_parses(service: MigService) -> None:
    from slurm_elastic.mig.wire import answer_to_obj

    answer = service.apply(NodeLayout.of({1: Layout.of({"4g.20gb": 1})}))
    assert answer_to_obj(answer_from_obj(json.loads(json.dumps(answer_to_obj(answer))))) == answer_to_obj(answer)
    assert MIG_PATH == "/v1/mig"
