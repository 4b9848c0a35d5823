"""The real controller as a process on the live cluster, with real agents over virtual GPUs, for e2e tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, ActionRecord, ActionState, DecisionFilter, DecisionRecord
from tests.cluster.agents_harness import REPO, Agents
from tests.cluster.harness import RELEASE, TestCluster, stop_processes
from tests.policy_text import CLUSTER, policy_text

# Small numbers so a test sees a whole resize in seconds; the rules are the production ones (tests/policy_text.py:
# CLUSTER says which packaged defaults these tests pin off). A test of a switched rule passes it to policy_text.
TEST_POLICY = policy_text(CLUSTER)
INTERVAL_S = 2.0


def controller_config(tmp: Path, agents: Agents, *, dry_run: bool = False, api_socket: str = "",
                      metrics_port: int = 0, db_url: str | None = None, holder: str = "",
                      table_prefix: str = "", name: str = "controller.toml") -> Path:
    """The API socket and the metrics port are off unless asked for: tests must not share them."""
    policy = tmp / "policy.toml"
    policy.write_text(TEST_POLICY)
    urls = "\n".join(f'{n} = "{agents.url(n)}"' for n in agents.nodes)
    cfg = tmp / name
    # A release cluster's client commands are its chrooted wrappers (tests/cluster/harness.py): sbatch for an
    # extension job must be those too, or the 22.05 client talks to a newer slurmctld ("Incompatible versions").
    ext_path = ("" if RELEASE == "22.05" else f"{agents.cluster.root / 'bin'}:") + "/usr/local/bin:/usr/bin:/bin"
    cfg.write_text(f"""
version = 1
[controller]
interval_s = {INTERVAL_S}
dry_run = {"true" if dry_run else "false"}
max_snapshot_age_s = 30
holder = "{holder}"
policy_file = "{policy}"
lease_ttl_s = 10
reconcile_interval_s = 5
[store]
url = "{db_url or f"sqlite:///{tmp / 'state.db'}"}"
table_prefix = "{table_prefix}"
[agents]
key_file = "{agents.key_file}"
timeout_s = 3
[agents.urls]
{urls}
[extension.env]
PATH = "{ext_path}"
SLURM_CONF = "{agents.cluster.env['SLURM_CONF']}"
[api]
socket = "{api_socket}"
[metrics]
port = {metrics_port}
address = "127.0.0.1"
token_file = "{agents.metrics_token_file}"
""")
    return cfg


@dataclass
class ControllerProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    db_url: str

    def store(self) -> SqlStore:
        return SqlStore.open(self.db_url)

    def actions(self, job_id: int | None = None) -> list[ActionRecord]:
        st = self.store()
        try:
            return sorted(st.journal.list_actions(job_id=job_id), key=lambda a: a.id)
        finally:
            st.close()

    def decisions(self, job_id: int | None = None) -> list[DecisionRecord]:
        st = self.store()
        try:
            return sorted(st.decisions.list_decisions(DecisionFilter(job_id=job_id)), key=lambda d: d.id)
        finally:
            st.close()

    def applied(self, job_id: int, kind: ActionKind) -> list[ActionRecord]:
        return [a for a in self.actions(job_id) if a.kind == kind and a.state == ActionState.APPLIED]

    def wait_applied(self, job_id: int, kind: ActionKind, at_least: int, timeout: float = 15.0) -> list[ActionRecord]:
        """The applied actions once there are `at_least`: Slurm shows a resize (a new size, a running extension)
        as soon as scontrol or sbatch returns, and the journal marks the action applied just after."""
        wait_until(f"{at_least} applied {kind.value} action(s) on job {job_id}",
                   lambda: len(self.applied(job_id, kind)) >= at_least, timeout, self)
        return self.applied(job_id, kind)

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def cycle_mark(self) -> int:
        """The id of the newest cycle begun so far, finished or not (0: none yet): a point to count cycles from."""
        st = self.store()
        try:
            cycle = st.decisions.last_cycle(finished=False)
            return 0 if cycle is None else cycle.id
        finally:
            st.close()

    def full_cycles_since(self, mark: int) -> int:
        """Cycles begun after ``mark`` that finished a full pass (not skipped, no error), from the store's cycle
        table, the controller's own record of each cycle."""
        st = self.store()
        try:
            return sum(1 for c in st.decisions.cycles_after(mark) if c.finished_at is not None and c.error is None)
        finally:
            st.close()

    def wait_cycles(self, n: int, timeout: float | None = None) -> None:
        """Wait until ``n`` more cycles have run whole: begun after this call and finished without error or skip.
        A cycle in flight at the call does not count (it may have read Slurm before what the caller saw), so
        "nothing happened" after these ``n`` cycles means ``n`` full looks at the state the caller saw, however
        slow or fast the cycles are."""
        mark, t0 = self.cycle_mark(), time.monotonic()
        wait_until(f"{n} more full controller cycle(s) after cycle {mark}",
                   lambda: self.full_cycles_since(mark) >= n,
                   timeout if timeout is not None else 30 + 3 * n * INTERVAL_S, self)
        print(f"\n{n} full controller cycles after cycle {mark}: {time.monotonic() - t0:.1f}s")

    def wait_settled(self, n: int = 3, timeout: float = 120) -> None:
        """Wait until ``n`` whole cycles pass without a new journal row. A cycle stores each job's size before it
        acts, so after a cycle that acted the store is one look behind Slurm; after ``n`` quiet cycles it holds
        what Slurm has. (Right after a fault the window may still hold old samples, and one more decision may
        come: counting cycles alone raced with it on a loaded machine.)"""
        deadline = time.monotonic() + timeout
        while True:
            before = len(self.actions())
            self.wait_cycles(n)
            if len(self.actions()) == before:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the controller still acted after {timeout:.0f}s of calm:\n"
                                     f"{self.log_text()[-3000:]}")


@contextlib.contextmanager
def running_controller(cluster: TestCluster, config: Path, *, crash_at: str | None = None,
                       dry_run: bool = False, prefix: Sequence[str] = ()) -> Iterator[ControllerProcess]:
    """``prefix`` goes before the command line (e.g. ``nsenter --net=...``: the controller in its own network)."""
    env = dict(cluster.env)
    env.pop("SLURM_ELASTIC_TEST_CRASH_AT", None)
    if crash_at:
        env["SLURM_ELASTIC_TEST_CRASH_AT"] = crash_at
    log = config.parent / f"controller-{int(time.time() * 1000)}.log"
    args = [*prefix, sys.executable, "-c", "from slurm_elastic.cli import main; main()", "controller",
            "-c", str(config), "-v"]
    if dry_run:
        args.append("--dry-run")
    db_url = f"sqlite:///{config.parent / 'state.db'}"
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    cp = ControllerProcess(proc, log, db_url)
    try:
        yield cp
    finally:
        stop_processes([proc])


def elastic_script(util: int, directives: str, marker: Path, *, het: bool = False) -> str:
    """A batch script: the workload on every node of the job (srun), the grace signal logged with its time."""
    from tests.cluster.agents_harness import JOB_PYTHON

    het_arg = "--het-group=1 " if het else ""
    return f"""#!/bin/bash
{directives}
export PYTHONPATH={REPO}
export SLURM_ELASTIC_VGPU_DIR={marker.parent.parent / "vgpu"}
trap 'echo "grace $(date +%s.%N) role=${{SLURM_ELASTIC_ROLE:-leader}} job=$SLURM_JOB_ID" >> {marker}' USR2
role="role=${{SLURM_ELASTIC_ROLE:-leader}} job=$SLURM_JOB_ID parent=${{SLURM_ELASTIC_PARENT:-}}"
echo "start $(date +%s.%N) $role" >> {marker}
srun {het_arg}--kill-on-bad-exit=0 --ntasks-per-node=1 {JOB_PYTHON} -m slurm_elastic.testing.vgpu.workload \\
  --util {util} --mem-mib 500 &
child=$!
while kill -0 $child 2>/dev/null; do wait $child; done
sleep 600
"""


def marker_file(cluster: TestCluster) -> Path:
    """A file every job user may append to (the scripts log their starts and grace signals there)."""
    path = cluster.jobs_dir / f"marker-{uuid.uuid4().hex[:8]}"
    path.touch()
    path.chmod(0o666)
    return path


def node_count(cluster: TestCluster, job_id: int) -> int:
    job = cluster.job(job_id)
    return 0 if job is None else len(job.nodes)


def wait_until(what: str, probe: object, timeout: float, proc: ControllerProcess | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():  # type: ignore[operator]
            return
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"controller exited ({proc.proc.returncode}) while waiting for {what}:\n"
                                 f"{proc.log_text()[-3000:]}")
        time.sleep(0.5)
    tail = proc.log_text()[-4000:] if proc else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{tail}")


def util_script(cluster: TestCluster, util_file: Path, directives: str) -> str:
    """The workload on every node of the job, its utilization read from ``util_file`` (changed at runtime)."""
    from tests.cluster.agents_harness import JOB_PYTHON

    return f"""#!/bin/bash
{directives}
export PYTHONPATH={REPO}
export SLURM_ELASTIC_VGPU_DIR={cluster.root / "vgpu"}
trap 'echo "grace $(date +%s) job=$SLURM_JOB_ID"' USR2
srun --kill-on-bad-exit=0 --ntasks-per-node=1 {JOB_PYTHON} -m slurm_elastic.testing.vgpu.workload --util 50 \\
  --util-file {util_file} --mem-mib 500 &
child=$!
while kill -0 $child 2>/dev/null; do wait $child; done
sleep 600
"""


def set_util(path: Path, util: int) -> None:
    """Write the utilization a util_script job reads (atomically: the workload polls the file)."""
    tmp = path.with_suffix(".new")
    tmp.write_text(f"{util}\n")
    tmp.chmod(0o666)
    os.replace(tmp, path)


def user_workdir(cluster: TestCluster, templates: Sequence[str], util: int, *, user: str = "alice"
                 ) -> tuple[Path, Path]:
    """A new working directory of ``user`` (notices, checkpoints) under the cluster's jobs dir, which outlives test
    runs: copies of ``templates`` (files of sbatch_templates/) and the utilization file a template job's load
    reads, set to ``util``. Returns the directory and the file."""
    work = cluster.jobs_dir / f"work-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    for name in templates:
        shutil.copy(REPO / "sbatch_templates" / name, work / name)
    shutil.chown(work, user)
    util_file = work / "util"
    set_util(util_file, util)
    return work, util_file
