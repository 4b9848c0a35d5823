"""The MIG workflow's Slurm side on replies recorded from the live 22.05 cluster (tests/unit/mig_replay.py).

Each test replays one recorded scenario through the production adapters (CliSlurm over SlurmCli, CommandDaemons):
a command the recording lacks at that point, or a recorded one left unasked, fails it. The GPUs are the real
MigService over in-memory GPUs; the config files are the recorded texts in a dict.
"""

from __future__ import annotations

from slurm_elastic.mig.slurmconf import gres_summary, node_gres_lines, node_gres_value
from slurm_elastic.mig.steps import FORWARD, MigStepOutcome
from slurm_elastic.store import ActionKind
from tests.unit.mig_replay import NODE, MigReplayed, replay

# n4's four A100-40GB: GPU 0 as 2 x 3g.20gb, GPU 1 as 7 x 1g.5gb, GPUs 2-3 whole (with mps)
AFTER = {"gpu:3g.20gb": 2, "gpu:1g.5gb": 7, "gpu:a100": 2, "mps": 200}
ORIGINAL = {"gpu": 4, "mps": 400}
DRAINING = "Reason=slurm-elastic mig #1: draining to change the MIG layout"
RESTART = [["slurm-daemon.sh", "stop-slurmd", NODE], ["slurm-daemon.sh", "restart-slurmctld"],
           ["slurm-daemon.sh", "start-slurmd", NODE]]


def updates(r: MigReplayed) -> list[list[str]]:
    return [c[2:] for c in r.runner.ran("scontrol", "update")]


def daemon_calls(r: MigReplayed) -> list[list[str]]:
    return [c for c in r.runner.calls if c[0] == "slurm-daemon.sh"]


def conf_gres(r: MigReplayed, node: str = NODE) -> dict[str, int]:
    return gres_summary(node_gres_value(r.files.files[r.settings.slurm_conf], node) or "")


def layout(r: MigReplayed) -> dict[int, object]:
    return {g.index: (g.state.layout().as_dict() if g.state.mig_enabled else "off")
            for g in r.world.agent.report(NODE).gpus}


def step_messages(r: MigReplayed) -> dict[str, str]:
    return {s: m for s, _, m in r.world.results[-1].steps}


def test_apply_on_an_idle_node_drains_restarts_verifies_on_slurms_replies_and_resumes() -> None:
    r = replay("apply_idle")
    (result,) = r.world.results
    assert result.outcome is MigStepOutcome.APPLIED, result
    assert [(s, st) for s, st, _ in result.steps] == [(s.value, "applied") for s in FORWARD]
    ups = updates(r)
    assert ups[0] == [f"NodeName={NODE}", "State=DRAIN", DRAINING]
    assert ups[-1] == [f"NodeName={NODE}", "State=RESUME"]
    assert daemon_calls(r) == RESTART  # stop slurmd, restart slurmctld, start slurmd: in that order, once
    assert r.runner.ran("scontrol", "reconfigure") == [["scontrol", "reconfigure"]]
    verify = step_messages(r)["verify"]  # Slurm's own reply after the restart shows the new Gres
    assert gres_summary(verify.rsplit("Gres=", 1)[1]) == AFTER
    assert conf_gres(r) == AFTER and conf_gres(r, "n1") == ORIGINAL  # other nodes untouched
    assert len(node_gres_lines(r.files.files[r.settings.gres_conf], NODE)) == 13  # 2 + 7 MIG, 2 GPUs + mps
    assert "# slurm-elastic-mig: n4" in r.files.files[r.settings.gres_conf]
    assert layout(r) == {0: {"3g.20gb": 2}, 1: {"1g.5gb": 7}, 2: "off", 3: "off"}
    assert r.world.journal.open_workflows() == []
    assert {a.kind for a in r.store.journal.list_actions()} == {ActionKind.MIG_WORKFLOW, ActionKind.MIG_STEP}
    (after,) = r.world.looked  # the live Slurm then: in service with the new GRES (22.05 showed NOT_RESPONDING
    assert (after.state, after.drained, gres_summary(after.gres)) == ("IDLE", False, AFTER)  # a moment here)


def test_the_workflow_polls_slurm_until_the_job_on_the_node_ends_then_applies() -> None:
    r = replay("apply_waits_for_job")
    (result,) = r.world.results
    assert result.outcome is MigStepOutcome.APPLIED, result
    assert step_messages(r)["wait_jobs"] == f"no jobs left on {NODE}"
    assert len(r.runner.ran("squeue")) >= 2  # the recorded job was seen running at least once, then gone
    assert ["sleep", r.settings.poll_interval_s] in r.rec.clock
    assert daemon_calls(r) == RESTART and updates(r)[-1] == [f"NodeName={NODE}", "State=RESUME"]
    assert conf_gres(r) == AFTER


def test_a_job_that_outlasts_the_wait_aborts_and_the_node_is_resumed_unchanged() -> None:
    r = replay("jobs_outlast_the_wait")
    (result,) = r.world.results
    assert result.outcome is MigStepOutcome.ABORTED, result
    assert f"jobs {r.rec.jobs['job']} still on {NODE} after the 3 s wait timeout" in result.message
    assert [s for s, _, _ in result.steps] == ["drain", "wait_jobs", "restore_node"]
    assert updates(r) == [[f"NodeName={NODE}", "State=DRAIN", DRAINING], [f"NodeName={NODE}", "State=RESUME"]]
    assert daemon_calls(r) == [] and r.files.writes == []
    assert layout(r) == {0: "off", 1: "off", 2: "off", 3: "off"}


def test_a_node_drained_before_stays_drained_with_the_operators_reason() -> None:
    r = replay("drained_node_stays_drained")
    (result,) = r.world.results
    assert result.outcome is MigStepOutcome.APPLIED, result
    ups = updates(r)
    assert ups[-1] == [f"NodeName={NODE}", "State=DRAIN", "Reason=bad fan"]
    assert [f"NodeName={NODE}", "State=RESUME"] not in ups
    assert conf_gres(r) == AFTER


def test_a_crash_after_the_gpus_changed_is_finished_by_resume_without_redoing_them() -> None:
    r = replay("crash_then_resume")
    assert r.world.crashes == ["after:apply_layout"]
    (result,) = r.world.results
    assert result.outcome is MigStepOutcome.APPLIED, result
    assert [s for s, _, _ in result.steps] == [s.value for s in FORWARD]
    mode_changes = [[c for c in d.calls if c[0] == "set_mig_mode"] for d in r.world.agent.devices]
    assert mode_changes == [[("set_mig_mode", True)], [("set_mig_mode", True)], [], []]  # applied once, not again
    assert daemon_calls(r) == RESTART
    assert updates(r)[0] == [f"NodeName={NODE}", "State=DRAIN", DRAINING]
    assert updates(r)[-1] == [f"NodeName={NODE}", "State=RESUME"]
    assert conf_gres(r) == AFTER
    assert layout(r) == {0: {"3g.20gb": 2}, 1: {"1g.5gb": 7}, 2: "off", 3: "off"}


def test_a_crash_after_the_gres_files_then_rollback_restores_files_gpus_slurm_and_service() -> None:
    r = replay("crash_then_rollback")
    assert r.world.crashes == ["after:write_gres"]
    (result,) = r.world.results
    assert result.outcome is MigStepOutcome.ABORTED, result
    assert "rollback requested at restart_slurm" in result.message
    assert [s for s, _, _ in result.steps][-5:] == [
        "rollback_layout", "rollback_gres", "rollback_restart", "rollback_verify", "restore_node"]
    assert r.files.files == r.rec.files  # both files byte for byte as before
    assert daemon_calls(r) == RESTART  # only the rollback's restart: the forward one never ran
    assert gres_summary(step_messages(r)["rollback_verify"].rsplit("Gres=", 1)[1]) == ORIGINAL
    assert updates(r)[-1] == [f"NodeName={NODE}", "State=RESUME"]
    assert layout(r) == {0: "off", 1: "off", 2: "off", 3: "off"}
    (after,) = r.world.looked
    assert (after.state, after.drained, gres_summary(after.gres)) == ("IDLE", False, ORIGINAL)


def test_slurm_keeping_the_old_gres_fails_verify_and_everything_is_undone_with_the_node_held_drained() -> None:
    r = replay("verify_fails_after_reconfigure")  # apply_mode reconfigure: 22.05 keeps Gres=, n4 INVALID_REG
    (result,) = r.world.results
    assert result.outcome is MigStepOutcome.FAILED, result
    verify = step_messages(r)["verify"]
    assert verify.startswith("verification failed: Slurm shows Gres=gpu:4,mps:400 for n4, expected gpu:3g.20gb:2")
    assert [s for s, _, _ in result.steps][-5:] == [
        "rollback_layout", "rollback_gres", "rollback_restart", "rollback_verify", "hold_drained"]
    assert ["sleep", r.settings.poll_interval_s] in r.rec.clock  # it polled until the 5 s verify timeout
    assert daemon_calls(r) == [] and len(r.runner.ran("scontrol", "reconfigure")) == 2  # forward, rollback
    assert r.files.files == r.rec.files and layout(r) == {0: "off", 1: "off", 2: "off", 3: "off"}
    hold = updates(r)[-1]
    assert hold[:2] == [f"NodeName={NODE}", "State=DRAIN"] and hold[2].startswith(
        "Reason=slurm-elastic mig #1: verify failed: verification failed: Slurm shows Gres=gpu:4,mps:400")
    (after,) = r.world.looked
    assert after.drained and gres_summary(after.gres) == ORIGINAL
