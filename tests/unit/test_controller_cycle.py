"""The controller's shell logic with a fake clock (the real thing is in tests/cluster/test_controller_e2e.py):
journal before acting, grace before shrink, dry-run, reconcile, backoff.

Where a recording can carry the facts, the tests replay Slurm replies recorded from the live test cluster under the
real SlurmCli (tests/unit/slurm_replay.py; a changed adapter command fails them as stale): no test here runs on a
hand-written Slurm."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest

from slurm_elastic.agent.payload import JobReport, NodeReport, NvmlInfo
from slurm_elastic.controller.collect import CollectResult
from slurm_elastic.controller.config import parse_controller_config
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.controller.extension import ExtensionTag
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import parse_config
from slurm_elastic.slurm import hostlist
from slurm_elastic.store.records import ActionKind, ActionState, DecisionFilter
from tests.policy_text import UNIT, policy_text
from tests.unit import reliability_scenarios  # noqa: F401 - registers admit_not_started
from tests.unit.slurm_replay import (
    SCENARIO_DIR,
    Recording,
    Replayed,
    ReplayRunner,
    StaleRecordingError,
    replay,
)
from tests.unit.storehelpers import FakeClock

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
POLICY_TEXT = policy_text(UNIT)
POLICY = parse_config(POLICY_TEXT)
SCRIPT = "#!/bin/bash\n#ELASTIC --min-nodes 1 --max-nodes 3\nsrun train\n"


class Agents:
    """Per (node, job) utilization, reported as fresh window means at the clock's time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.util: dict[tuple[str, int], float] = {}
        self.silent: set[str] = set()

    def __call__(self, agents: Mapping[str, str]) -> CollectResult:
        now = self.clock().timestamp()
        reports = {}
        for node in agents:
            if node in self.silent:
                continue
            jobs = tuple(JobReport(job_id=j, sluid=None, user="alice", account="nlp", uid=1001, devices=(),
                                   gpus_allocated=4, gpus_in_use=4, util_mean_percent=u, util_max_percent=u,
                                   util_last_percent=u, utilization_reason=None, memory_used_mib=0,
                                   memory_max_mib=0, sample_count=5, util_sample_count=5,
                                   first_sample_at=now - 5, last_sample_at=now)
                         for (n, j), u in self.util.items() if n == node)
            reports[node] = NodeReport(node=node, agent_version="t", generated_at=now, sampled_at=now,
                                       interval_s=1.0, window_s=5.0, nvml=NvmlInfo("ok", None, None), gpus=(),
                                       jobs=jobs, errors=())
        return CollectResult(reports=reports, errors={n: "timeout" for n in agents if n in self.silent})


def run(ctl: Controller, clock: FakeClock, cycles: int, step_s: float = 2.0) -> None:
    for _ in range(cycles):
        ctl.run_cycle()
        clock.advance(step_s)


def _replay(name: str) -> Replayed:
    return replay(name, Agents)


def _slurm_writes(runner: ReplayRunner) -> list[list[str]]:
    return [c for c in runner.calls if c[0] in ("sbatch", "scancel", "runuser")
            or c[:2] == ["scontrol", "update"]]


def test_busy_job_grows_through_a_journaled_extension_job() -> None:
    r = _replay("grow_by_extension")
    busy = r.rec.jobs["busy"]
    grows = [a for a in r.store.journal.list_actions(job_id=busy) if a.kind == ActionKind.GROW]
    assert len(grows) == 1 and grows[0].state == ActionState.APPLIED
    (submit,) = r.runner.ran("runuser")
    assert submit[:5] == ["runuser", "-u", "alice", "--", "sbatch"]
    args = dict(a.split("=", 1) for a in submit if a.startswith("--") and "=" in a)
    free = args["--nodelist"]
    assert free not in r.rec.nodes["busy"] and grows[0].params["nodes"] == [free]
    assert args["--comment"] == ExtensionTag(busy, grows[0].idempotency_key).render()
    assert [e.job_id for e in r.store.jobs.extensions(busy)] == [r.rec.jobs["ext"]]
    assert len(_slurm_writes(r.runner)) == 1  # the cycles after it: nothing more


def test_idle_job_gets_the_signal_then_loses_nodes_after_grace() -> None:
    r = _replay("shrink_with_grace")
    idle, nodes = r.rec.jobs["idle"], r.rec.nodes["idle"]
    writes = _slurm_writes(r.runner)
    assert writes[:2] == [["scancel", "--signal=USR1", "--full", str(idle)],
                          ["scontrol", "update", f"JobId={idle}", f"NodeList={hostlist.compress(nodes[:2])}"]]
    assert writes[2:] == [["scontrol", "update", f"JobId={idle}", "TimeLimit=45"]]  # 30 min x 3/2 nodes
    (action,) = [a for a in r.store.journal.list_actions(job_id=idle) if a.kind == ActionKind.SHRINK]
    assert action.state == ActionState.APPLIED and (action.params["from"], action.params["to"]) == (3, 2)
    assert action.finished_at is not None
    assert (action.finished_at - action.created_at).total_seconds() >= 5  # grace_s
    assert r.store.jobs.get_job(idle).current_nodes == 2  # type: ignore[union-attr]


def test_dry_run_decides_but_never_calls_slurm() -> None:
    r = _replay("dry_run_idle")
    assert _slurm_writes(r.runner) == []
    assert r.store.journal.list_actions() == []
    shrinks = r.store.decisions.list_decisions(DecisionFilter(job_id=r.rec.jobs["idle"], action="shrink"))
    assert shrinks and all(d.dry_run for d in shrinks)


def test_a_silent_agent_stops_samples_and_never_causes_a_shrink() -> None:
    r = _replay("silent_agent")
    assert _slurm_writes(r.runner) == [] and r.store.journal.list_actions() == []
    assert r.store.samples.samples(r.rec.jobs["idle"]) == []  # partial coverage stores nothing


def test_a_replay_fails_on_a_command_its_recording_lacks() -> None:
    """The staleness check: a command that is not the recording's next one fails, naming both and how to
    re-record."""
    rec = Recording.load(SCENARIO_DIR / "shrink_with_grace.json")
    runner = ReplayRunner(rec)
    first = rec.commands[0]
    assert runner(first["argv"], timeout=1, input_text=first["stdin"], env=None).stdout == first["stdout"]
    with pytest.raises(StaleRecordingError, match=r"command 2: the controller ran \['squeue', '--me'\].*"
                                                  r"scripts/record-slurm-scenarios shrink_with_grace"):
        runner(["squeue", "--me"], timeout=1, input_text=None, env=None)
    with pytest.raises(StaleRecordingError):  # and stays failed, whatever the controller does with the error
        runner.check()
    short = ReplayRunner(rec)
    short(first["argv"], timeout=1, input_text=first["stdin"], env=None)
    with pytest.raises(StaleRecordingError, match=f"stopped after 1 of {len(rec.commands)} commands"):
        short.finish()


def test_nodes_slurm_switched_off_are_not_asked() -> None:
    """The test cluster's cold nodes (n5, n6) are powered down in the recordings: no agent is asked there."""
    asked: list[set[str]] = []

    class Asked(Agents):
        def __call__(self, agents: Mapping[str, str]) -> CollectResult:
            asked.append(set(agents))
            return super().__call__(agents)

    rec = Recording.load(SCENARIO_DIR / "shrink_with_grace.json")
    sinfo = next(c for c in rec.commands if c["argv"][:2] == ["sinfo", "--json"])
    off = {n["name"] for n in json.loads(sinfo["stdout"])["nodes"] if "POWERED_DOWN" in n.get("state_flags", [])}
    assert off == {"n5", "n6"}
    replay("shrink_with_grace", Asked)
    assert asked and all(a == {"n1", "n2", "n3", "n4"} for a in asked), asked


def test_nodes_slurm_switched_off_or_is_booting_are_not_asked() -> None:
    """Replayed (reliability_scenarios.py: cold_node_boots): n5 is powered up and boots during the cycles, n6
    stays off: neither is asked (no agent can answer there yet)."""
    asked: list[set[str]] = []

    class Asked(Agents):
        def __call__(self, agents: Mapping[str, str]) -> CollectResult:
            asked.append(set(agents))
            return super().__call__(agents)

    r = replay("cold_node_boots", Asked)
    cycle_sinfo = [c for c in r.rec.commands if c["argv"][:2] == ["sinfo", "--json"]][:2]
    flags = [{n["name"]: n.get("state_flags", []) for n in json.loads(c["stdout"])["nodes"]} for c in cycle_sinfo]
    # n5: asked to power up (still POWERED_DOWN), then booting (POWERING_UP, NOT_RESPONDING); n6 off throughout
    assert "POWER_UP" in flags[0]["n5"] and "POWERING_UP" in flags[1]["n5"], flags
    assert all("POWERED_DOWN" in f["n6"] for f in flags), flags
    assert len(asked) == 2 and all(a == {"n1", "n2", "n3", "n4"} for a in asked), asked
    assert {a.node for a in r.store.agents.list_agents()} == {"n1", "n2", "n3", "n4"}


def test_reconcile_resolves_dangling_grows_by_their_key() -> None:
    r = _replay("reconcile_dangling_grows")
    leader, ext, forged = r.rec.jobs["leader"], r.rec.jobs["ext"], r.rec.jobs["forged"]
    found = r.store.journal.find_by_idempotency_key(f"grow:{leader}:1")
    lost = r.store.journal.find_by_idempotency_key(f"grow:{leader}:2")
    assert found is not None and found.state == ActionState.APPLIED
    assert lost is not None and lost.state == ActionState.ABORTED
    assert [e.job_id for e in r.store.jobs.extensions(leader, active_only=False)] == [ext]
    assert len(r.world.reconciled[0]) == 2
    # the leader ended: its extension is an orphan and is cancelled -- but not bob's job with a copied key
    assert [c for c in _slurm_writes(r.runner) if c[0] == "scancel"] == [["scancel", str(ext)]], forged
    cancel = r.store.journal.find_by_idempotency_key(f"cancel:{ext}")  # journaled like every Slurm write
    assert cancel is not None and (cancel.kind, cancel.state, cancel.job_id) == (
        ActionKind.CANCEL_EXTENSION, ActionState.APPLIED, leader)
    assert cancel.params["reason"] == "ORPHAN_EXTENSION" and cancel.params["recovery"] is True


def test_grow_backs_off_after_extensions_die_on_their_own() -> None:
    """The recorded extension job exits 3 at once (its script fails in the extension role)."""
    r = _replay("grow_extension_fails")
    busy, ext = r.rec.jobs["busy"], r.rec.jobs["ext"]
    assert len(r.runner.ran("runuser")) == 1  # 15 cycles past the cooldown, inside the back-off: no second grow
    held = r.store.decisions.list_decisions(DecisionFilter(job_id=busy, reason="GROW_BACKOFF"))
    assert held and all(d.action == "hold" and d.inputs["would"] == "OVERUTILIZED" for d in held)
    assert "1 extension job(s) ended on their own within 600s" in held[0].message
    assert held[0].inputs["extension_failures"] == 1 and held[0].inputs["last_failed_extension"] == ext


def test_a_het_component_shrinks_by_its_raw_job_id() -> None:
    r = _replay("het_component_shrink")
    comp, leader, nodes = r.rec.jobs["het"], r.rec.jobs["het_leader"], r.rec.nodes["het"]
    updates = [c for c in _slurm_writes(r.runner) if c[:2] == ["scontrol", "update"]]
    assert updates[0] == ["scontrol", "update", f"JobId={comp}", f"NodeList={nodes[0]}"], updates
    assert not any(f"JobId={leader}" in c or f"{leader}+" in " ".join(c) for c in _slurm_writes(r.runner))
    (action,) = [a for a in r.store.journal.list_actions(job_id=comp) if a.kind == ActionKind.SHRINK]
    assert action.state == ActionState.APPLIED and (action.params["from"], action.params["to"]) == (2, 1)


@pytest.mark.parametrize("text,match", [
    ("version = 1\n[controller]\ninterval_s = 0\n", "interval_s: 0 out of range"),
    ("version = 1\n[controller]\nbogus = 1\n", "controller.bogus: unknown key"),
    ("[controller]\n", "version: must be 1"),
    ("version = 1\n[agents]\nurl_template = 'http://{host}:1'\n", "url_template"),
    ("version = 1\n[agents.urls]\nn1 = 'ftp://x'\n", "must be an http"),
    ("version = 1\n[controller]\ndry_run = 'yes'\n", "dry_run: wrong type"),
    ("version = 1\n[nonsense]\n", "unknown section"),
    ("version = 1\n[retention]\nsamples_days = -1\n", "samples_days: -1 out of range"),
    ("version = 1\n[controller\n", "invalid TOML"),
])
def test_controller_config_errors_are_clear(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_controller_config(text, source="controller.toml")


def test_controller_config_valid() -> None:
    cfg = parse_controller_config("""
version = 1
[controller]
interval_s = 15
dry_run = true
[agents]
url_template = "http://{address}:9817"
[agents.urls]
n9 = "http://10.0.0.9:1234"
[retention]
samples_days = 2
decisions_days = 0
demand_days = 3
""")
    assert cfg.retention.samples_s == 2 * 86400 and cfg.retention.decisions_s is None
    assert cfg.retention.actions_s == 365 * 86400 and cfg.retention.demand_s == 3 * 86400
    assert cfg.interval_s == 15 and cfg.dry_run
    assert cfg.agents.url_for("n1", "10.0.0.1") == "http://10.0.0.1:9817"
    assert cfg.agents.url_for("n9", "x") == "http://10.0.0.9:1234"


def _admits(ctl: Controller, outcome: str) -> float:
    assert ctl.metrics is not None
    return ctl.metrics.registry.get_sample_value("slurm_elastic_controller_admits_total", {"outcome": outcome}) or 0


def test_an_admitted_job_that_starts_is_followed_and_counted_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    r = _replay("admit_by_shrink")
    running, pending = r.rec.jobs["running"], r.rec.jobs["pending"]
    (shrink,) = [a for a in r.store.journal.list_actions(job_id=running) if a.kind == ActionKind.SHRINK]
    assert (shrink.params["from"], shrink.params["to"], shrink.params["admits"]) == (3, 2, [pending])
    assert _admits(r.world.ctl, "started") == 1 and _admits(r.world.ctl, "not_started") == 0
    assert f"job {pending} started on " in caplog.text


def test_shrink_to_admit_backs_off_when_slurm_does_not_start_the_admitted_job(
        caplog: pytest.LogCaptureFixture) -> None:
    """The journal remembers which pending job a shrink-to-admit was for; when Slurm starts something else (or
    nothing), the controller warns once and does not shrink again for that job within admit_backoff_s.
    Replayed (reliability_scenarios.py: admit_not_started): another job took the only free node first."""
    caplog.set_level("INFO")
    r = replay("admit_not_started", Agents)
    running, pending = r.rec.jobs["running"], r.rec.jobs["pending"]
    shrinks = sorted((a for a in r.store.journal.list_actions(job_id=running) if a.kind == ActionKind.SHRINK),
                     key=lambda a: a.id)
    first = shrinks[0]
    assert (first.params["from"], first.params["to"], first.params["admits"]) == (3, 2, [pending])
    assert first.state == ActionState.APPLIED and first.finished_at is not None
    assert ["scancel", "--signal=USR1", "--full", str(running)] in r.runner.calls
    assert _admits(r.world.ctl, "not_started") == 1 and caplog.text.count(f"job {pending} did not start within") == 1
    backoff_until = first.finished_at + timedelta(seconds=120)
    assert r.world.clock() > backoff_until + timedelta(seconds=30)  # the recording runs well past the back-off
    assert all(a.created_at >= backoff_until for a in shrinks[1:])  # no shrink for it within admit_backoff_s
    assert "admit" not in " ".join(d.message for d in r.store.decisions.list_decisions(DecisionFilter(job_id=running))
                                   if first.finished_at < d.time < backoff_until)


def test_shrink_to_admit_shrinks_again_after_the_backoff() -> None:
    """Past the back-off the 2-node job still waits: one more node goes for it (the 3-node job's min 1 is kept),
    and it starts. The node freed by the first shrink is IDLE+PLANNED (Slurm's backfill planned it for the
    waiting job): it counts toward the job's fit, so the second shrink frees just the one node still missing.
    Replayed (reliability_scenarios.py: admit_not_started)."""
    r = replay("admit_not_started", Agents)
    running, pending = r.rec.jobs["running"], r.rec.jobs["pending"]
    shrinks = sorted((a for a in r.store.journal.list_actions(job_id=running) if a.kind == ActionKind.SHRINK),
                     key=lambda a: a.id)
    assert [(a.params["from"], a.params["to"], a.params["admits"]) for a in shrinks] == [
        (3, 2, [pending]), (2, 1, [pending])]
    assert all(a.state == ActionState.APPLIED for a in shrinks)
    assert _admits(r.world.ctl, "started") == 1


def test_shrink_to_admit_tries_again_once_a_job_that_held_the_partition_ended() -> None:
    """The journal keeps what a shrink-to-admit was based on (the holders of the pending job's partition). A
    job taking the freed node is no change; a holder that ends is, even when another job takes its node at once:
    the controller shrinks again for the pending job well inside admit_backoff_s (1800 s).
    Replayed (reliability_scenarios.py: admit_again_once_a_holder_ended)."""
    r = replay("admit_again_once_a_holder_ended", Agents)
    running, holder, pending = r.rec.jobs["running"], r.rec.jobs["holder"], r.rec.jobs["pending"]
    shrinks = sorted((a for a in r.store.journal.list_actions(job_id=running) if a.kind == ActionKind.SHRINK),
                     key=lambda a: a.id)
    first = shrinks[0]
    assert first.params["admit_basis"] == [{"job_id": pending, "request": "1|gpu::4|train",
                                            "holders": sorted([running, holder])}]
    cancelled_at = r.rec.clock_start + timedelta(seconds=50 * 2)  # after the scenario's 50th cycle
    assert [a for a in shrinks if a.created_at < cancelled_at] == [first]  # 80 s, nothing changed: no shrink
    assert sorted((a.params["from"], a.params["to"]) for a in shrinks) == [(2, 1), (3, 2)]
    assert first.finished_at is not None
    assert (shrinks[1].created_at - first.finished_at).total_seconds() < 1800


