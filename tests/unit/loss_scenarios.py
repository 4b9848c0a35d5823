"""Recorded scenarios of Slurm-side losses that take the live cluster minutes (not a test module).

A node failing (a stopped slurmd: NOT_RESPONDING after ~20 s, DOWN after SlurmdTimeout=60), a node set DOWN by
hand, a job purged from squeue (MinJobAge=120): long for a test, fine for a one-time recording. The recorder
makes them happen (World.fault; tests/cluster/scenario_recorder.py: Faults) and undoes them before it lets the
cluster go; the replay (tests/unit/test_controller_losses.py) serves what Slurm answered meanwhile.
Registered in slurm_replay.SCENARIOS on import, like resize_scenarios.
"""

from __future__ import annotations

from slurm_elastic.controller.cycle import Controller
from slurm_elastic.store.records import ActionState
from tests.unit.resize_scenarios import PLAIN_SCRIPT, _extension_qos
from tests.unit.slurm_replay import SCENARIOS, SCRIPT, JobSpec, Scenario, World

# A leader that keeps running when one of its non-batch nodes dies (Slurm drops the node from it).
NO_KILL_SCRIPT = SCRIPT.replace("#ELASTIC", "#SBATCH --no-kill\n#ELASTIC", 1)


def fake_time_accounting(w: World) -> None:
    """sshare/sacctmgr re-read on the fake clock, not the host's: a recording that waits minutes for the cluster
    (a purge) asks no more than its replay, which does not wait."""
    w.ctl.accounting.clock = lambda: w.clock().timestamp()


def restart(w: World) -> None:
    """A restarted controller on the same store and Slurm."""
    w.ctl = Controller(w.ctl.cfg, w.ctl.policy, slurm=w.ctl.slurm, store=w.ctl.store, collector=w.ctl.collector,
                       clock=w.clock)
    fake_time_accounting(w)


def _grown_onto_last_free_node(w: World) -> str:
    """The busy leader grows by an extension onto the one free node (bob's filler has the others); busy there
    too, so at 2 of 3 nodes it wants more but there is none. Returns the extension's node."""
    w.cycles(8)
    w.wait("ext", "RUNNING")
    (ext,) = w.ctl.store.jobs.extensions(w.jobs["busy"])
    assert ext.nodelist is not None
    w.jobs["ext"] = ext.job_id
    w.agents.util[(ext.nodelist, ext.job_id)] = 95.0
    w.cycles(2)
    return ext.nodelist


def _node_fail(w: World) -> None:
    node = _grown_onto_last_free_node(w)
    w.fault("stop-slurmd", node)
    w.fault("wait-node", f"{node}:NOT_RESPONDING")
    w.cycles(3)  # silent, not yet given up by Slurm: no loss
    w.fault("wait-node", f"{node}:DOWN")
    w.cycles(1)  # the loss
    w.cancel("filler")  # free nodes from now on: only the loss's cooldown holds the grow back
    w.wait("filler", "CANCELLED")
    w.cycles(2)
    w.reconcile()  # closes the extension's record with Slurm's state
    w.cycles(12)  # cooldown_s = 20 after the loss, then it regrows at once (no back-off)
    restart(w)  # records the loss no second time
    w.reconcile()
    w.cycles(1)


def _no_kill_leader(w: World) -> None:
    w.cycles(3)
    leader, node = w.jobs["leader"], w.nodes["leader"][1]  # a non-batch node (the batch host is the first)
    w.fault("stop-slurmd", node)
    w.fault("down", node)  # by hand, as tests/cluster/test_slurm_losses_cluster.py does: not SlurmdTimeout
    w.fault("wait-job-nodes", "leader:1")  # Slurm dropped the node; the job goes on (--no-kill)
    w.agents.util.pop((node, leader), None)
    w.cycles(12)


def _released_down(w: World) -> None:
    idle = w.jobs["idle"]
    for _ in range(15):  # until the cycle that shrinks 3 -> 2 after the grace
        w.cycles(1)
        if w.ctl.store.journal.list_actions(job_id=idle, states=[ActionState.APPLIED]):
            break
    # The next cycle sees the released node left the job and DOWN together (its record still has 3 nodes).
    (job,) = [j for j in w.ctl.slurm.snapshot().jobs if j.job_id == w.jobs["idle"]]
    for node in sorted(set(w.nodes["idle"]) - set(job.nodes)):
        w.fault("down", node)  # a node the controller released goes DOWN later
    w.cycles(5)


def _leader_purged(w: World) -> None:
    w.cycles(2)
    w.cancel("leader")  # ends while the controller is not looking...
    w.wait("leader", "CANCELLED")
    w.fault("wait-purged", "leader")  # ...and leaves squeue (MinJobAge; 23.02+ at once)
    w.cycles(1)  # its record ends as sacct has it


def _preempted_while_away(w: World) -> None:
    """The leader grows by a scavenger extension; no controller runs while a --qos=high job preempts it and
    slurmctld purges it; the restarted controller asks sacct how it ended."""
    _extension_qos(w)
    _grown_onto_last_free_node(w)
    w.jobs["high"] = w.ctl.slurm.submit_as("bob", PLAIN_SCRIPT, ["--qos=high", "--nodes=1", "--gres=gpu:4",
                                                                  "--time=30", "--job-name=scenario-high",
                                                                  "--chdir=/tmp", "--output=/dev/null"])
    w.wait("high", "RUNNING")
    w.fault("wait-purged", "ext")
    w.clock.advance(300)
    restart(w)
    w.reconcile()
    w.reconcile()
    w.cycles(1)


_BUSY_BESIDE_FILLER = (JobSpec("busy", 1, util=95.0), JobSpec("filler", 2, user="bob", elastic=False))

for _s in (
    Scenario("extension_node_fail", "a busy 1-node job grows onto the last free node; that node's slurmd dies: "
             "NOT_RESPONDING, then DOWN; bob's filler ends, the cooldown passes and the job regrows",
             _BUSY_BESIDE_FILLER, _node_fail),
    Scenario("leader_no_kill_node_fail", "a 2-node --no-kill job in band; its non-batch node's slurmd dies and "
             "the node is set DOWN: Slurm drops it and the job goes on", (JobSpec("leader", 2, util=60.0,
                                                                                  script=NO_KILL_SCRIPT),),
             _no_kill_leader),
    Scenario("released_nodes_down", "an idle 3-node job shrinks to 2; the released node is set DOWN later",
             (JobSpec("idle", 3, util=5.0),), _released_down, prepare=fake_time_accounting),
    Scenario("leader_purged", "a 1-node job is cancelled while no cycle runs and is purged from squeue",
             (JobSpec("leader", 1, util=60.0),), _leader_purged, prepare=fake_time_accounting),
    Scenario("extension_preempted_while_away", "a scavenger extension is preempted and purged from squeue "
             "while no controller runs; the restarted one reads sacct", _BUSY_BESIDE_FILLER,
             _preempted_while_away, prepare=fake_time_accounting),
):
    SCENARIOS.setdefault(_s.name, _s)
