"""``mig plan`` (what an apply would change, nothing changed) and ``mig suggest`` (repartition idle GPUs for
pending MIG requests), on reports built by the real MigService over in-memory GPUs."""

from __future__ import annotations

from slurm_elastic.agent.mig_service import MigService
from slurm_elastic.mig.catalog import load_catalog
from slurm_elastic.mig.model import Layout, NodeLayout
from slurm_elastic.mig.plan import plan_node_change
from slurm_elastic.mig.ports import JobOnNode, NodeStatus, WorkflowSettings
from slurm_elastic.mig.suggest import GpuNodeView, PendingRequest, SuggestReason, suggest
from slurm_elastic.mig.wire import NodeMigReport
from slurm_elastic.testing.mig_fake import FakeMigDevice
from tests.unit.mig_workflow_support import GRES_CONF, SLURM_CONF

CATALOG = load_catalog()


def node_report(node: str, model: str = "A100-40GB", gpus: int = 2,
                layout: NodeLayout | None = None) -> NodeMigReport:
    devices = [FakeMigDevice(CATALOG.get(model), i) for i in range(gpus)]
    svc = MigService(node, CATALOG, devices=lambda: devices)
    if layout is not None:
        svc.apply(layout)
    return svc.report()


SETTINGS = WorkflowSettings("/s", "/g", device_files="/dev/{node}/gpu{ordinal}", mps_per_gpu=100)
STATUS = NodeStatus("n4", "IDLE", (), None, "gpu:2,mps:200")


def test_plan_shows_gpu_changes_gres_before_and_after_and_the_jobs() -> None:
    report = node_report("n4")
    plan = plan_node_change("n4", report, NodeLayout.of({0: Layout.of({"3g.20gb": 2})}), SETTINGS,
                            status=STATUS, jobs=[JobOnNode(7, "alice", "RUNNING")], slurm_text=SLURM_CONF,
                            gres_text=GRES_CONF)
    assert [line for d in plan.diffs for line in d.describe()] == [
        "GPU 0: enable MIG mode", "GPU 0: create 3g.20gb@0:4", "GPU 0: create 3g.20gb@4:4"]
    assert (plan.conf_gres_now, plan.gres_after) == ("gpu:2,mps:200", "gpu:3g.20gb:2,gpu:a100:1,mps:100")
    assert plan.lines_after == (
        "NodeName=n4 Name=gpu Type=3g.20gb File=/dev/n4/gpu0",
        "NodeName=n4 Name=gpu Type=3g.20gb File=/dev/n4/gpu1",
        "NodeName=n4 Name=gpu Type=a100 File=/dev/n4/gpu2",
        "NodeName=n4 Name=mps Count=100 File=/dev/n4/gpu2",
    )
    assert not plan.lines_provisional
    text = "\n".join(plan.describe())
    assert "jobs it waits for" in text and "7 alice RUNNING" in text
    assert "Slurm Gres=: gpu:2,mps:200 -> gpu:3g.20gb:2,gpu:a100:1,mps:100" in text


def test_plan_on_real_mig_nodes_says_the_device_files_come_after_the_apply() -> None:
    settings = WorkflowSettings("/s", "/g", device_files="nvidia-caps")
    plan = plan_node_change("n4", node_report("n4", "H100-80GB", 1), NodeLayout.of({0: Layout.of({"1g.10gb": 7})}),
                            settings, status=STATUS, jobs=[], slurm_text=SLURM_CONF, gres_text=GRES_CONF)
    assert plan.lines_provisional and plan.gres_after == "gpu:1g.10gb:7"
    assert "device files fixed after the apply" in "\n".join(plan.describe())


def view(name: str, report: NodeMigReport, *, idle: bool = True, free: dict[str, int] | None = None) -> GpuNodeView:
    return GpuNodeView(name, idle, free or {}, report)


def test_pending_mig_requests_turn_an_idle_whole_gpu_into_that_type() -> None:
    nodes = [view("n1", node_report("n1"), idle=False, free={"a100": 0}),
             view("n2", node_report("n2"), free={"a100": 2})]
    result = suggest([PendingRequest(10, "1g.5gb", 1), PendingRequest(11, "1g.5gb", 2)], nodes)
    (s,) = result.suggestions
    assert (s.node, s.reason) == ("n2", SuggestReason.MIG_SHORTFALL)
    assert s.layout == NodeLayout.of({0: Layout.of({"1g.5gb": 7})})
    assert s.covers == {"1g.5gb": 7}
    assert "3 GPU(s) of type 1g.5gb pending, 0 free" in s.message
    assert result.unmet == ()


def test_whole_gpus_that_pending_jobs_need_are_not_converted() -> None:
    nodes = [view("n2", node_report("n2", gpus=1), free={"a100": 1})]
    result = suggest([PendingRequest(10, "3g.20gb", 1), PendingRequest(11, None, 1)], nodes)
    assert result.suggestions == ()
    assert [(u.gpu_type, u.missing) for u in result.unmet] == [("3g.20gb", 1)]


def test_a_mig_gpu_with_other_profiles_is_refilled() -> None:
    mig = node_report("n3", layout=NodeLayout.of({0: Layout.of({"1g.5gb": 7}), 1: Layout.of({"1g.5gb": 7})}))
    result = suggest([PendingRequest(12, "3g.20gb", 1, nodes=3)], [view("n3", mig, free={"1g.5gb": 14})])
    (s,) = result.suggestions
    assert s.layout == NodeLayout.of({0: Layout.of({"3g.20gb": 2}), 1: Layout.of({"3g.20gb": 2})})


def test_busy_nodes_are_never_candidates_and_supply_covers_demand() -> None:
    nodes = [view("n1", node_report("n1"), idle=False), view("n2", node_report("n2"), free={"1g.5gb": 5})]
    assert suggest([PendingRequest(1, "1g.5gb", 5)], nodes).suggestions == ()  # 5 free already
    busy = [view("n1", node_report("n1"), idle=False)]
    assert [u.gpu_type for u in suggest([PendingRequest(1, "1g.5gb", 1)], busy).unmet] == ["1g.5gb"]


def test_whole_gpu_shortfall_turns_unwanted_mig_off() -> None:
    mig = node_report("n3", layout=NodeLayout.of({0: Layout.of({"2g.10gb": 3})}))
    result = suggest([PendingRequest(20, "a100", 2)], [view("n3", mig, free={"2g.10gb": 3, "a100": 1})])
    (s,) = result.suggestions
    assert (s.reason, s.layout) == (SuggestReason.WHOLE_GPU_SHORTFALL, NodeLayout.of({0: Layout.disabled()}))
    assert s.covers == {"a100": 1}
