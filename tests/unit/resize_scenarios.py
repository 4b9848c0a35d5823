"""Recorded scenarios of time limits, moldable start and the extension QOS (not a test module).

Registered in slurm_replay.SCENARIOS on import, so ``scripts/record-slurm-scenarios NAME`` records them and
:func:`slurm_replay.replay` plays them (tests/unit/test_controller_time_limit.py, test_controller_molds.py,
test_controller_losses.py). :func:`recorded_snapshot` is a snapshot the real adapter parses from a recording's
first replies, for tests that need real Slurm jobs and nodes but no Slurm behaviour.
"""

from __future__ import annotations

import functools
import os
import pwd
import tempfile
from dataclasses import replace
from pathlib import Path

from slurm_elastic import resize
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.controller.notices import NoticeBoard
from slurm_elastic.resize import Ack, Notice
from slurm_elastic.slurm.errors import SlurmError
from slurm_elastic.slurm.model import ClusterSnapshot, Job
from tests.policy_text import UNIT, policy_text
from tests.unit.slurm_replay import (
    SCENARIO_DIR,
    SCENARIOS,
    SCRIPT,
    JobSpec,
    Recording,
    Scenario,
    World,
    _grow,
    _shrink,
    recorded_cli,
)

# A waiting elastic job without --max-nodes (its request is its max: controller/molds.py).
MOLD_SCRIPT = SCRIPT.replace("#ELASTIC --min-nodes 1 --max-nodes 3", "#ELASTIC --min-nodes 1")
MOLD_POLICY_TEXT = policy_text(UNIT, moldable_start=True, step=2)
GPU_NODES = ("n1", "n2", "n3", "n4")  # the test cluster's GPU nodes (n5, n6 are cold, powered down)
PLAIN_SCRIPT = "#!/bin/bash\nwhile :; do sleep 5 & wait $!; done\n"  # a rigid job (the recorder's PLAIN)


def _shrink_then_grow(w: World) -> None:
    w.cycles(10)  # shrunk 3 -> 2, its time limit raised
    idle = w.jobs["idle"]
    w.agents.util.update({(n, idle): 95.0 for n in w.nodes["idle"]})  # busy again (a released node: ignored)
    w.cycles(15)  # past the cooldown (20 s) and a fresh window: grows 2 -> 3, gives the time back
    w.wait("ext", "RUNNING")
    w.cycles(1)


def _mold(w: World) -> None:
    w.cycles(1)  # the waiting job is molded to the 2 free nodes
    w.wait("waiting", "RUNNING")
    w.cycles(2)  # molded once
    waiting = w.jobs["waiting"]
    w.agents.util.update({(n, waiting): 95.0 for n in GPU_NODES})  # only its own nodes count
    w.cancel("running")  # frees two more nodes
    w.wait("running", "CANCELLED")
    w.cycles(8)  # a window: grows 2 -> 4, its request, and gives back what the mold added


def _mold_cut_short(w: World) -> None:
    def crash(step: str) -> None:
        if step == "mold:after-intent":
            raise SlurmError("killed between the intent and the update")

    w.ctl.actuator.fault = crash
    w.cycles(1)  # the intent is journaled, no update
    w.ctl.actuator.fault = lambda _step: None
    w.cycles(1)  # the next cycle finishes it


def _mold_watch(w: World) -> None:
    w.cycles(2)


def _extension_qos(w: World) -> None:
    """[extension] qos = scavenger, as the daemon applies a reloaded controller file (controller/daemon.py)."""
    w.ctl.cfg = replace(w.ctl.cfg, extension_qos="scavenger")
    w.ctl.actuator.extension_qos = "scavenger"


def _preempted(w: World) -> None:
    """The leader grows by a scavenger extension onto the last free node; a --qos=high job then needs that node
    and Slurm preempts the extension. The high job is submitted through the controller's own SlurmCli, so its
    sbatch and the reply (its id) are in the recording like the controller's commands."""
    _extension_qos(w)
    w.cycles(8)  # the grow: an extension job on the only free node
    w.wait("ext", "RUNNING")
    busy = w.jobs["busy"]
    (ext,) = w.ctl.store.jobs.extensions(busy)
    assert ext.nodelist is not None
    w.agents.util[(ext.nodelist, ext.job_id)] = 95.0  # busy there too: at its max (2 of 3 would grow on)
    w.cycles(2)
    w.jobs["high"] = w.ctl.slurm.submit_as("bob", PLAIN_SCRIPT, ["--qos=high", "--nodes=1", "--gres=gpu:4",
                                                                  "--time=30", "--job-name=scenario-high",
                                                                  "--chdir=/tmp", "--output=/dev/null"])
    w.wait("high", "RUNNING")  # Slurm preempted the extension for it
    w.cycles(1)
    w.reconcile()  # closes the extension's record with Slurm's state
    w.cycles(14)  # the loss starts the cooldown (20 s); after it, no free node: no regrow, no back-off
    w.ctl = Controller(w.ctl.cfg, w.ctl.policy, slurm=w.ctl.slurm, store=w.ctl.store, collector=w.ctl.collector,
                       clock=w.clock)  # restarted on the same store: records the loss no second time
    w.reconcile()
    w.cycles(1)


class LocalBoard(NoticeBoard):
    """The controller's resize notices in a directory of this run's own, as if the job ran there as this process's
    user. Notices are files beside the job, not Slurm: a recorded job's working directory (root's /tmp, the job
    alice's) takes none, here or on a test machine, so both runs put them where the test can read and answer them.
    """

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="slurm-elastic-notices-"))
        self.user = pwd.getpwuid(os.getuid()).pw_name

    def here(self, job: Job) -> Job:
        return replace(job, working_dir=str(self.dir), user=self.user)

    def path(self, unit_id: int) -> str:
        return str(self.dir / ".slurm-elastic" / f"resize-{unit_id}.json")

    def post(self, job: Job, unit_id: int, notice: Notice) -> str:
        return super().post(self.here(job), unit_id, notice)

    def acknowledgement(self, job: Job, unit_id: int, notice_id: str) -> Ack | None:
        return super().acknowledgement(self.here(job), unit_id, notice_id)

    def withdraw(self, job: Job, unit_id: int, notice_id: str) -> bool:
        return super().withdraw(self.here(job), unit_id, notice_id)


def _local_board(w: World) -> None:
    w.ctl.actuator.notices = LocalBoard()


def board(w: World) -> LocalBoard:
    notices = w.ctl.actuator.notices
    assert isinstance(notices, LocalBoard)
    return notices


def _notice_grow(w: World) -> None:
    _local_board(w)
    w.ctl.actuator.notice_grace_s = 12.0  # [extension] notice_grace_s


def _shrink_at_ack(w: World) -> None:
    """The job acknowledges the shrink notice 0.8 s after it was posted, inside the 5 s grace."""
    path = board(w).path(w.jobs["idle"])
    for _ in range(20):
        w.cycles(1)
        if resize.read_notice(path) is not None:
            break
    notice = resize.read_notice(path)
    assert notice is not None
    _cycle_1s(w)  # 2 s into the grace, not acknowledged: nothing released
    resize.acknowledge(step=80, path=path, now=notice.time + 0.8)
    _cycle_1s(w)  # released at the acknowledgement


def _cycle_1s(w: World) -> None:
    w.ctl.run_cycle()
    w.check()
    w.clock.advance(1.0)


_MOLD_JOBS = (JobSpec("running", 2, util=60.0), JobSpec("waiting", 4, pending=True, script=MOLD_SCRIPT))

for _s in (
    Scenario("shrink_then_grow", "an idle 3-node job shrinks to 2 (time limit raised), then is busy again and "
             "grows back to 3 by an extension job (time limit given back)",
             (JobSpec("idle", 3, util=5.0),), _shrink_then_grow),
    Scenario("shrink_keep_time_limit", "an idle 3-node job shrinks to 2 with extend_time_limit_on_shrink off",
             (JobSpec("idle", 3, util=5.0),), _shrink,
             policy_text=policy_text(UNIT, moldable_start=None, extend_time_limit_on_shrink=False)),
    Scenario("mold_waiting_job", "a 4-node elastic job waits behind a 2-node one: molded to 2-4 nodes, Slurm "
             "starts it on the 2 free ones; the other job is cancelled and it grows back to 4",
             _MOLD_JOBS, _mold, policy_text=MOLD_POLICY_TEXT),
    Scenario("mold_cut_short", "the mold's intent is journaled, the controller dies before the update: the next "
             "cycle finishes it", _MOLD_JOBS, _mold_cut_short, policy_text=MOLD_POLICY_TEXT),
    Scenario("mold_default_dry_run", "a policy that does not name moldable_start, under --dry-run: the mold is "
             "decided (the packaged default), no Slurm write", _MOLD_JOBS, _mold_watch, dry_run=True),
    Scenario("mold_switched_off", "moldable_start = false: the waiting elastic job is left as it is",
             _MOLD_JOBS, _mold_watch, policy_text=policy_text(UNIT)),
    Scenario("extension_preempted", "a busy 1-node job (bob's 2-node job beside it) grows by a scavenger "
             "extension onto the last free node; a --qos=high job needs it and Slurm preempts the extension",
             (JobSpec("busy", 1, util=95.0), JobSpec("filler", 2, user="bob", elastic=False)), _preempted),
    Scenario("notice_shrink_ack", "an idle 3-node job's shrink notice is acknowledged inside the grace: the "
             "nodes go at the acknowledgement", (JobSpec("idle", 3, util=5.0),), _shrink_at_ack,
             prepare=_local_board),
    Scenario("notice_shrink_no_ack", "an idle 3-node job's shrink notice is never acknowledged: the nodes go "
             "when the grace is over", (JobSpec("idle", 3, util=5.0),), _shrink, prepare=_local_board),
    Scenario("notice_grow", "a busy 1-node job grows with notice_grace_s = 12: its grow notice is posted before "
             "the extension job", (JobSpec("busy", 1, util=95.0),), _grow, prepare=_notice_grow),
    Scenario("grow_in_extension_qos", "a busy 1-node job grows with [extension] qos = scavenger",
             (JobSpec("busy", 1, util=95.0),), _grow, prepare=_extension_qos),
):
    SCENARIOS.setdefault(_s.name, _s)


@functools.cache
def recorded_snapshot(name: str = "shrink_with_grace") -> ClusterSnapshot:
    """The first snapshot of recording ``name``, parsed once by the real :class:`SlurmCli` (it is immutable): its
    jobs and nodes as the live cluster had them (shrink_with_grace: alice's 3-node job on n1-n3, n4 idle, n5 and
    n6 cold)."""
    cli, runner = recorded_cli(name)
    snap = cli.snapshot()
    runner.check()
    return snap


def recorded_job(job_id: int, nodes: tuple[str, ...], name: str = "shrink_with_grace",
                 job: str = "idle") -> Job:
    """Recording ``name``'s running elastic job ``job`` (alice's, 30 min, gpu:4 per node), renumbered and
    placed on ``nodes``: a real job as the adapter parses it, where a test needs one of given id and nodes."""
    real_id = Recording.load(SCENARIO_DIR / f"{name}.json").jobs[job]
    (found,) = [j for j in recorded_snapshot(name).jobs if j.job_id == real_id]
    return replace(found, job_id=job_id, nodes=nodes, node_count=len(nodes),
                   batch_host=nodes[0] if nodes else None)
