"""``mig apply`` on the live cluster: node n4's virtual GPUs in MIG mode, the real Slurm daemons restarted as the
workflow does it (restart mode; on 22.05, and on 24.11 and 26.05 in the release subset, scripts/test-releases),
and the CLI killed mid-way then resumed or rolled back.

n4 is put back exactly as it was afterwards (slurm.conf, gres.conf, its virtual GPU state, Slurm's Gres=gpu:4,
mps:400, its slurmd and its state), even when a test fails. Run these under the shared lock:
``flock /tmp/slurm-elastic-cluster-tests.lock .venv/bin/pytest tests/cluster/test_mig_cluster.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_elastic.agent.client import AgentClient
from slurm_elastic.mig.adapters import CommandDaemons, MigStoreJournal
from slurm_elastic.mig.config import Commands
from slurm_elastic.mig.slurmconf import gres_summary
from slurm_elastic.mig.wire import NodeMigReport
from slurm_elastic.store import SqlStore, sqlite_url
from slurm_elastic.testing.vgpu.build import build_library
from slurm_elastic.testing.vgpu.state import make_node_state
from slurm_elastic.testing.vgpu.statefile import StateFile
from tests.cluster.agents_harness import install_plugins, wait_for
from tests.cluster.harness import AGENT_PORT_BASE, TestCluster, stop_processes

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NODE = "n4"
AGENT_PORT = AGENT_PORT_BASE + 104
ORIGINAL_GRES = "gpu:4,mps:400"
EXTRA_DEVICES = range(4, 28)  # n4/gpu4..gpu27: one device node per MIG instance (7 x 4 at most)


@dataclass
class MigRig:
    cluster: TestCluster
    config: Path
    db: Path
    key: bytes
    state: StateFile

    def cli(self, *args: str, fault: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        env = {**self.cluster.env, "PYTHONPATH": str(REPO)}
        env.pop("SLURM_ELASTIC_MIG_FAULT", None)
        if fault:
            env["SLURM_ELASTIC_MIG_FAULT"] = fault
        return subprocess.run([sys.executable, "-c", "from slurm_elastic.cli import main; main()", "mig", *args,
                               "--config", str(self.config)], capture_output=True, text=True, env=env,
                              timeout=timeout, check=False)

    def node(self) -> dict[str, str]:
        out = self.cluster.run(["scontrol", "-o", "show", "node", NODE], check=True).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def job_state(self, job: int) -> str:
        """squeue for this job only, then sacct: never decodes other jobs' fields (another test's job may carry
        bytes that are not UTF-8 in its comment, which breaks a whole ``squeue --json``)."""
        out = self.cluster.run(["squeue", "-h", "-j", str(job), "-o", "%T"]).stdout.strip()
        if out:
            return out.split()[0]
        acct = self.cluster.run(["sacct", "-n", "-X", "-P", "-j", str(job), "-o", "State"]).stdout.split()
        return acct[0] if acct else "UNKNOWN"

    def wait_job(self, job: int, states: set[str], timeout: float = 120) -> str:
        return wait_for(f"job {job} in {sorted(states)}",
                        lambda: st if (st := self.job_state(job)) in states else None, timeout)

    def wait_idle(self) -> None:
        """In service and responding (a flag such as NOT_RESPONDING may linger a moment after a restart)."""
        wait_for("n4 IDLE", lambda: True if self.node()["State"] == "IDLE" else None, timeout=60)

    def reason(self) -> str:
        return self.cluster.run(["sinfo", "-h", "-N", "-n", NODE, "-o", "%E"], check=True).stdout.splitlines()[0]

    def sinfo_gres(self) -> str:
        return self.cluster.run(["sinfo", "-h", "-N", "-n", NODE, "-o", "%G"], check=True).stdout.split()[0]

    def agent_report(self) -> NodeMigReport:
        async def go() -> NodeMigReport:
            async with AgentClient(self.key, timeout_s=30) as client:
                return await client.mig_report(f"http://127.0.0.1:{AGENT_PORT}")

        return asyncio.run(go())

    def layout(self) -> dict[int, object]:
        return {g.index: g.state.layout().as_dict() if g.state.mig_enabled else "off"
                for g in self.agent_report().gpus}

    def workflows(self) -> list[tuple[str, list[tuple[str, str]]]]:
        store = SqlStore.open(sqlite_url(self.db))
        try:
            journal = MigStoreJournal(store.journal)
            out = []
            for wf in reversed(journal.workflows(50)):
                steps = [r for r in store.journal.list_actions() if r.idempotency_key.startswith(wf.key + ":")]
                out.append((wf.state.value, [(s.idempotency_key.rsplit(":", 1)[1], s.state.value)
                                             for s in sorted(steps, key=lambda a: a.id)]))
            return out
        finally:
            store.close()


def workflow_id(out: subprocess.CompletedProcess[str]) -> int:
    m = re.search(r"^workflow #(\d+): n4 -> ", out.stderr, re.MULTILINE)
    assert m, out.stderr
    return int(m.group(1))


def restore_node(cluster: TestCluster, slurm_conf: str, gres_conf: str, was_drained: bool) -> None:
    """Put n4's Slurm side back: original files, the restart sequence 22.05 needs, then its old state."""
    etc = cluster.root / "etc"
    if ((etc / "slurm.conf").read_text() == slurm_conf and (etc / "gres.conf").read_text() == gres_conf
            and gres_summary(_gres(cluster)) == gres_summary(ORIGINAL_GRES)):
        return
    cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=mig test: restoring n4"])
    (etc / "slurm.conf").write_text(slurm_conf)
    (etc / "gres.conf").write_text(gres_conf)
    daemons = CommandDaemons(Commands(
        slurmd_stop=(str(REPO / "docker-slurm" / "slurm-daemon.sh"), "stop-slurmd", "{node}"),
        slurmd_start=(str(REPO / "docker-slurm" / "slurm-daemon.sh"), "start-slurmd", "{node}"),
        slurmctld_restart=(str(REPO / "docker-slurm" / "slurm-daemon.sh"), "restart-slurmctld"),
    ), env=cluster.env)
    daemons.stop_slurmd(NODE)
    # Stops every slurmctld of this cluster, also one a reconfigure is re-executing into (23.11+), and returns only
    # when the one it started is the only one and answers, so it has read the restored files (docs/slurm-facts.md).
    daemons.restart_slurmctld()
    daemons.start_slurmd(NODE)
    wait_for("n4 back with Gres=gpu:4,mps:400",
             lambda: True if gres_summary(_gres(cluster)) == gres_summary(ORIGINAL_GRES) else None, timeout=120)
    if not was_drained:
        cluster.run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"])


def _gres(cluster: TestCluster) -> str:
    out = cluster.run(["scontrol", "-o", "show", "node", NODE]).stdout
    return next((kv.split("=", 1)[1] for kv in out.split() if kv.startswith("Gres=")), "")


@pytest.fixture(scope="module")
def rig(cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigRig]:
    cluster.cancel_all()
    cluster.wait_nodes_idle()
    install_plugins(cluster)
    etc = cluster.root / "etc"
    slurm_conf, gres_conf = (etc / "slurm.conf").read_text(), (etc / "gres.conf").read_text()
    was_drained = "DRAIN" in cluster.run(["sinfo", "-h", "-n", NODE, "-o", "%T"]).stdout.upper()
    state_path = cluster.root / "vgpu" / f"{NODE}.state"
    old_state = state_path.read_text() if state_path.exists() else None
    made: list[Path] = []
    tmp = tmp_path_factory.mktemp("mig")
    agent: subprocess.Popen[bytes] | None = None
    try:
        for i in EXTRA_DEVICES:
            dev = cluster.gpu_device(NODE, i)
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(240, 200 + i))  # char device, like cluster.sh's
                dev.chmod(0o666)
                made.append(dev)
        state = StateFile(state_path)
        state.write(make_node_state(NODE, 4, minor_base=12))
        lib = build_library(REPO / "build" / "vgpu")
        key_file = tmp / "agent.key"
        key_file.write_bytes(os.urandom(32).hex().encode())
        key_file.chmod(0o600)
        env = {**cluster.env, "LD_LIBRARY_PATH": str(lib.parent), "SLURM_ELASTIC_VGPU_STATE": str(state_path)}
        with open(cluster.root / "log" / f"agent-mig-{NODE}.log", "ab") as log:
            agent = subprocess.Popen(
                [sys.executable, "-c", "from slurm_elastic.cli import main; main()", "agent", "-v", "--node", NODE,
                 "--listen", "127.0.0.1", "--port", str(AGENT_PORT), "--key-file", str(key_file),
                 "--gpu-map-dir", str(cluster.root / "gpu-map"), "--mps-dir", str(cluster.root / "mps"),
                 "--interval", "1", "--window", "30"], env=env, stdout=log, stderr=subprocess.STDOUT)
        daemon = REPO / "docker-slurm" / "slurm-daemon.sh"
        config = tmp / "mig.toml"
        config.write_text(f"""version = 1
[mig]
slurm_conf = "{etc / 'slurm.conf'}"
gres_conf = "{etc / 'gres.conf'}"
device_files = "{cluster.root / 'dev'}/{{node}}/gpu{{ordinal}}"
mps_per_gpu = 100
wait_timeout_s = 120
verify_timeout_s = 120
poll_interval_s = 1
lock_dir = "{tmp / 'locks'}"
[store]
url = "{sqlite_url(tmp / 'state.db')}"
[mig.commands]
slurmd_stop = ["{daemon}", "stop-slurmd", "{{node}}"]
slurmd_start = ["{daemon}", "start-slurmd", "{{node}}"]
slurmctld_restart = ["{daemon}", "restart-slurmctld"]
[agents]
key_file = "{key_file}"
timeout_s = 30
apply_timeout_s = 120
[agents.urls]
{NODE} = "http://127.0.0.1:{AGENT_PORT}"
""")
        rig = MigRig(cluster, config, tmp / "state.db", key_file.read_bytes(), state)

        def agent_up() -> bool | None:
            assert agent is not None and agent.poll() is None, "the n4 agent exited: see its log"
            try:
                rig.agent_report()
            except Exception:
                return None
            return True

        wait_for("the n4 agent", agent_up, timeout=60)
        yield rig
    finally:
        if agent is not None:
            stop_processes([agent])
        cluster.cancel_all()
        restore_node(cluster, slurm_conf, gres_conf, was_drained)
        if old_state is None:
            state_path.unlink(missing_ok=True)
        else:
            StateFile(state_path).write(__import__("slurm_elastic.testing.vgpu.state", fromlist=["parse_state"])
                                        .parse_state(old_state))
        for dev in made:
            dev.unlink(missing_ok=True)
        cluster.wait_nodes_idle()


def test_apply_drains_waits_for_jobs_changes_nvml_and_slurm_then_resumes(rig: MigRig) -> None:
    cluster = rig.cluster
    busy = cluster.submit("#!/bin/bash\nsleep 6\n", "--gres=gpu:1", f"--nodelist={NODE}", "-N1", "-n1")
    rig.wait_job(busy, {"RUNNING"}, timeout=60)
    out = rig.cli("apply", NODE, "--layout", '{"3g.20gb": 2}', "--gpus", "0,1")
    assert out.returncode == 0, out.stdout + out.stderr
    wf = workflow_id(out)
    assert f"workflow #{wf} on n4: applied" in out.stdout
    assert rig.wait_job(busy, {"COMPLETED", "CANCELLED", "FAILED"}) == "COMPLETED"  # waited for, not killed
    ((state, steps),) = rig.workflows()
    assert state == "applied"
    assert steps == [(s, "applied") for s in ("drain", "wait_jobs", "apply_layout", "write_gres", "restart_slurm",
                                              "verify", "resume")]
    ctld_log = (cluster.root / "log" / "slurmctld.log").read_text()
    assert f"reason set to: slurm-elastic mig #{wf}: draining to change the MIG layout" in ctld_log
    vgpu = rig.state.read()
    assert [(g.index, g.mig_current) for g in vgpu.gpus] == [(0, True), (1, True), (2, False), (3, False)]
    assert sorted((i.gpu, i.profile_id, i.start) for i in vgpu.gpu_instances) == [
        (0, 9, 0), (0, 9, 4), (1, 9, 0), (1, 9, 4)]
    assert len(vgpu.compute_instances) == 4
    assert gres_summary(rig.sinfo_gres()) == {"gpu:3g.20gb": 4, "gpu:a100": 2, "mps": 200}
    rig.wait_idle()
    assert rig.layout() == {0: {"3g.20gb": 2}, 1: {"3g.20gb": 2}, 2: "off", 3: "off"}


def test_a_job_asking_for_the_mig_type_runs_on_it(rig: MigRig) -> None:
    cluster = rig.cluster
    job = cluster.submit("#!/bin/bash\necho GPUS=$SLURM_JOB_GPUS CVD=$CUDA_VISIBLE_DEVICES $(hostname)\n",
                         "--gres=gpu:3g.20gb:1", "-N1", "-n1")  # no --nodelist: only n4 has that type
    assert rig.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
    text = (cluster.jobs_dir / f"{job}.out").read_text()
    assert "CVD=0" in text and "GPUS=" in text
    # Accounting counts gres/gpu only (typed TRES are not in AccountingStorageTRES); where it ran is the proof.
    acct = cluster.run(["sacct", "-n", "-X", "-P", "-j", str(job), "-o", "NodeList,AllocTRES"]).stdout
    assert acct.startswith(f"{NODE}|") and "gres/gpu=1" in acct, acct


def test_a_workflow_killed_after_the_apply_is_finished_by_resume(rig: MigRig) -> None:
    out = rig.cli("apply", NODE, "--layout", '{"1g.5gb": 7}', "--gpus", "2", fault="kill-after:apply_layout")
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr
    wf = workflow_id(out)
    assert "DRAIN" in rig.node()["State"]
    assert rig.reason() == f"slurm-elastic mig #{wf}: draining to change the MIG layout"
    assert rig.layout()[2] == {"1g.5gb": 7}  # NVML changed ...
    assert gres_summary(rig.sinfo_gres()) == {"gpu:3g.20gb": 4, "gpu:a100": 2, "mps": 200}  # ... Slurm not yet
    assert rig.workflows()[-1][0] == "in_progress"
    out = rig.cli("resume-workflows")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"workflow #{wf} on n4: applied" in out.stdout
    assert gres_summary(rig.sinfo_gres()) == {"gpu:1g.5gb": 7, "gpu:3g.20gb": 4, "gpu:a100": 1, "mps": 100}
    rig.wait_idle()


def test_a_workflow_killed_after_writing_gres_is_rolled_back_on_request(rig: MigRig) -> None:
    before_conf = (rig.cluster.root / "etc" / "slurm.conf").read_text()
    out = rig.cli("apply", NODE, "--layout", "off", "--gpus", "0,1,2", fault="kill-after:write_gres")
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr
    wf = workflow_id(out)
    assert (rig.cluster.root / "etc" / "slurm.conf").read_text() != before_conf
    assert rig.layout() == {0: "off", 1: "off", 2: "off", 3: "off"}
    out = rig.cli("resume-workflows", "--rollback")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"workflow #{wf} on n4: aborted: rollback requested at restart_slurm" in out.stdout
    assert (rig.cluster.root / "etc" / "slurm.conf").read_text() == before_conf
    assert rig.layout() == {0: {"3g.20gb": 2}, 1: {"3g.20gb": 2}, 2: {"1g.5gb": 7}, 3: "off"}
    assert gres_summary(rig.sinfo_gres()) == {"gpu:1g.5gb": 7, "gpu:3g.20gb": 4, "gpu:a100": 1, "mps": 100}
    rig.wait_idle()
    assert [s for s, _ in rig.workflows()[-1][1]][-5:] == [
        "rollback_layout", "rollback_gres", "rollback_restart", "rollback_verify", "restore_node"]


def test_plan_shows_the_change_and_changes_nothing(rig: MigRig) -> None:
    conf = (rig.cluster.root / "etc" / "slurm.conf").read_text()
    out = rig.cli("plan", NODE, "--layout", "off", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["gres_after"] == "gpu:a100:4,mps:400"
    assert "GPU 2: disable MIG mode" in plan["changes"]
    assert (rig.cluster.root / "etc" / "slurm.conf").read_text() == conf
    assert len(rig.workflows()) == 3


def test_suggest_reads_pending_mig_requests_and_never_touches_a_busy_node(rig: MigRig) -> None:
    # Slurm 22.05 refuses at submission a type no node has ("Requested node configuration is not available"),
    # so pending MIG demand exists only for types some node offers: here all of n4's 3g.20gb are taken.
    busy = rig.cluster.submit("#!/bin/bash\nsleep 300\n", "--gres=gpu:3g.20gb:4", f"--nodelist={NODE}", "-N1", "-n1")
    waiting = rig.cluster.submit("#!/bin/bash\ntrue\n", "--gres=gpu:3g.20gb:1", "-N1", "-n1")
    try:
        rig.wait_job(busy, {"RUNNING"}, timeout=60)
        rig.wait_job(waiting, {"PENDING"}, timeout=60)
        out = rig.cli("suggest", "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["demand"] == {"3g.20gb": 1}
        assert result["suggestions"] == []  # n4 runs a job; n1-n3 have no MIG agent here
        assert [(u["type"], u["missing"], u["reason"]) for u in result["unmet"]] == [("3g.20gb", 1, "UNMET")]
        assert len(rig.workflows()) == 3  # suggest changes nothing
    finally:
        rig.cluster.cancel(busy, waiting)
        rig.wait_job(busy, {"CANCELLED", "COMPLETED"}, timeout=120)
        rig.wait_idle()


def test_back_to_whole_gpus(rig: MigRig) -> None:
    out = rig.cli("apply", NODE, "--layout", "off")
    assert out.returncode == 0, out.stdout + out.stderr
    assert gres_summary(rig.sinfo_gres()) == {"gpu:a100": 4, "mps": 400}
    assert rig.state.read().gpu_instances == ()
    job = rig.cluster.submit("#!/bin/bash\ntrue\n", "--gres=gpu:a100:4", f"--nodelist={NODE}", "-N1", "-n1")
    assert rig.wait_job(job, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
