"""The node agent on the live cluster: one agent per node on its own port, over its node's virtual GPUs.

Jobs run the workload helper (``python -m slurm_elastic.testing.vgpu.workload``), which registers its pid on the job's
GPUs; the real prolog/epilog write and remove the map files; the agent maps pids to jobs through the real
cgroups of Slurm 22.05 and reads GPUs through pynvml over the virtual libnvidia-ml.so.1.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_elastic.agent.auth import sign_request
from slurm_elastic.agent.client import AgentClient
from slurm_elastic.agent.errors import AgentAuthError
from slurm_elastic.agent.payload import NODE_PATH, JobReport, NodeReport
from tests.cluster.agents_harness import INTERVAL_S, Agents, running_agents, wait_for, workload
from tests.cluster.harness import TestCluster

pytestmark = pytest.mark.cluster



@pytest.fixture(scope="module")
def agents(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    with running_agents(cluster, tmp_path_factory.mktemp("agent")) as a:
        yield a


def submit(agents: Agents, script: str, node: str, gpus: int = 2, user: str = "root") -> int:
    job = agents.cluster.submit(script, f"--gres=gpu:{gpus}", "-N1", "-n1", f"--nodelist={node}", user=user)
    ended = {"FAILED", "COMPLETED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
    state = agents.cluster.wait_state(job, {"RUNNING"} | ended, timeout=120)
    if state != "RUNNING":
        out = agents.cluster.jobs_dir / f"{job}.out"
        raise AssertionError(f"job {job} is {state}: {out.read_text() if out.exists() else '(no output)'}")
    return job


def registered(agents: Agents, node: str, job: int) -> float:
    """Waits until the job's workload is in its node's state file; returns when it was seen there."""
    def owner(path: Path) -> str | None:
        # The prolog writes `.<gpu>.<job>` and renames it to `<gpu>`; an epilog may remove a file meanwhile.
        if path.name.startswith("."):
            return None
        try:
            words = path.read_text().split()
        except FileNotFoundError:
            return None
        return words[0] if words else None

    def probe() -> float | None:
        jobs_dir = agents.cluster.root / "gpu-map" / node
        mine = {int(p.name) for p in jobs_dir.iterdir() if owner(p) == str(job)}
        entries = {p.gpu for p in agents.state(node).read().processes}
        return time.time() if mine and mine <= entries else None
    return wait_for(f"job {job}'s workload on {node}", probe)


def job_in(report: NodeReport, job: int) -> JobReport | None:
    return next((j for j in report.jobs if j.job_id == job), None)


def report_after(agents: Agents, node: str, t: float) -> NodeReport:
    """The first report sampled at least two sampling intervals after time t (i.e. the second sample after t)."""
    return wait_for(f"a sample of {node} after t+2 intervals",
                    lambda: r if (r := agents.report(node)).sampled_at and r.sampled_at >= t + 2 * INTERVAL_S else None)


def test_a_job_at_90_percent_on_two_gpus_is_reported_at_90_within_two_samples(agents: Agents) -> None:
    job = submit(agents, workload(90), "n1")
    try:
        seen = registered(agents, "n1", job)
        report = report_after(agents, "n1", seen)
        j = job_in(report, job)
        assert j is not None, report.jobs
        assert (j.gpus_allocated, j.gpus_in_use, j.user, j.account) == (2, 2, "root", "root")
        assert j.util_last_percent is not None and abs(j.util_last_percent - 90) <= 5
        gpus = [g for g in report.gpus if g.job_id == job]
        assert len(gpus) == 2 and all(g.owner_source == "prolog" for g in gpus)
        assert all(g.utilization_percent is not None and abs(g.utilization_percent - 90) <= 5 for g in gpus)
        (proc,) = {p.pid: p for g in gpus for p in g.processes}.values()
        assert (proc.job_id, proc.job_source, proc.step) == (job, "cgroup", "batch")  # real Slurm cgroup v1
        assert proc.memory_used_mib == 1000
    finally:
        agents.cluster.cancel(job)


def test_a_job_holding_two_gpus_without_processes_is_reported_at_0_with_none_in_use(agents: Agents) -> None:
    job = submit(agents, "#!/bin/bash\nsleep 600\n", "n2")
    try:
        def seen() -> JobReport | None:
            j = job_in(agents.report("n2"), job)
            return j if j is not None and j.sample_count >= 2 else None
        j = wait_for(f"job {job} on n2", seen)
        assert (j.gpus_allocated, j.gpus_in_use) == (2, 0)
        assert (j.util_last_percent, j.util_mean_percent, j.util_max_percent) == (0.0, 0.0, 0.0)
        assert j.utilization_reason is None
    finally:
        agents.cluster.cancel(job)


def test_two_jobs_on_one_node_are_kept_apart(agents: Agents) -> None:
    busy = submit(agents, workload(90), "n3")
    light = submit(agents, workload(10), "n3", user="alice")  # alice's workload edits root's state in place
    try:
        seen = max(registered(agents, "n3", busy), registered(agents, "n3", light))
        report = report_after(agents, "n3", seen)
        a, b = job_in(report, busy), job_in(report, light)
        assert a is not None and b is not None, report.jobs
        assert not set(a.devices) & set(b.devices)
        assert (a.gpus_allocated, a.gpus_in_use, b.gpus_allocated, b.gpus_in_use) == (2, 2, 2, 2)
        assert a.util_last_percent is not None and abs(a.util_last_percent - 90) <= 5
        assert b.util_last_percent is not None and abs(b.util_last_percent - 10) <= 5
        assert (a.user, b.user, b.account) == ("root", "alice", "nlp")
        for g in report.gpus:
            for p in g.processes:
                assert p.job_id == g.job_id  # no process is attributed to the other job
    finally:
        agents.cluster.cancel(busy, light)


def test_unauthenticated_requests_get_401(agents: Agents) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as s:
            for node in agents.cluster.nodes:
                async with s.get(agents.url(node) + NODE_PATH) as resp:
                    body = await resp.read()
                    assert resp.status == 401 and b"gpus" not in body
                forged = sign_request(b"x" * 64, "GET", NODE_PATH, b"", now=time.time())
                async with s.get(agents.url(node) + NODE_PATH, headers=forged) as resp:
                    assert resp.status == 401
        async with AgentClient(b"y" * 64, timeout_s=10) as client:
            with pytest.raises(AgentAuthError):
                await client.fetch(agents.url("n1"))

    asyncio.run(main())


def test_killing_the_workload_makes_it_disappear_and_the_ended_job_too(agents: Agents) -> None:
    job = submit(agents, workload(60, then_sleep=True), "n4")
    try:
        seen = registered(agents, "n4", job)
        report = report_after(agents, "n4", seen)
        pids = {p.pid for g in report.gpus for p in g.processes if p.job_id == job}
        assert len(pids) == 1
        os.kill(pids.pop(), signal.SIGKILL)  # no clean-up by the workload: its state entries stay behind

        def workload_gone() -> JobReport | None:
            r = agents.report("n4")
            j = job_in(r, job)
            return j if j is not None and j.gpus_in_use == 0 and not any(g.processes for g in r.gpus) else None
        j = wait_for("the killed workload to vanish", workload_gone)
        assert (j.gpus_allocated, j.util_last_percent) == (2, 0.0)  # the job still holds its GPUs, idle

        agents.cluster.cancel(job)
        agents.cluster.wait_state(job, {"CANCELLED", "COMPLETED"}, timeout=120)
        wait_for("the ended job to vanish", lambda: True if job_in(agents.report("n4"), job) is None else None)
        assert not any((agents.cluster.root / "gpu-map" / "n4").iterdir()), "epilog left map files"
    finally:
        agents.cluster.cancel(job)


def test_metrics_of_a_live_agent(agents: Agents) -> None:
    """/metrics is on its own listener; job, user and account labels only with the bearer token."""
    async def get(url: str, headers: dict[str, str]) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as resp:
            return resp.status, await resp.text()

    assert asyncio.run(get(agents.url("n1") + "/metrics", {}))[0] == 404  # not on the controller's listener
    assert asyncio.run(get(agents.metrics_url("n1"), {"Authorization": "Bearer wrong-token-0123456789"}))[0] == 401
    for headers, per_job in (({}, set()),
                             ({"Authorization": f"Bearer {agents.metrics_token}"}, {"job", "user", "account"})):
        status, text = asyncio.run(get(agents.metrics_url("n1"), headers))
        assert status == 200
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        util = [s for s in samples if s.name == "DCGM_FI_DEV_GPU_UTIL"]
        assert sorted(s.labels["gpu"] for s in util) == ["0", "1", "2", "3"]
        assert {s.labels["node"] for s in util} == {"n1"}
        assert {k for s in util for k in s.labels} & {"job", "user", "account"} == per_job
        assert [s.value for s in samples if s.name == "slurm_elastic_agent_nvml_up"] == [1.0]
