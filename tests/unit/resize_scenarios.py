"""Recorded scenarios of time limits, moldable start and the extension QOS (not a test module).

Registered in slurm_replay.SCENARIOS on import, so ``scripts/record-slurm-scenarios NAME`` records them and
:func:`slurm_replay.replay` plays them (tests/unit/test_controller_time_limit.py, test_controller_molds.py,
test_controller_losses.py). :func:`recorded_snapshot` is a snapshot the real adapter parses from a recording's
first replies, for tests that need real Slurm jobs and nodes but no Slurm behaviour.
"""

from __future__ import annotations

import functools
from dataclasses import replace

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
