"""A resize in seconds: the torchrun template shrinks and grows under the real controller, each phase is recorded
(decision -> notice -> checkpoint -> leave | join -> re-form -> first step at the new size) and no step is repeated.

CI runs one shrink (2 -> 1: one of the leader's own nodes goes, its agent leaves the rendezvous on the notice)
and one grow (1 -> 2 by an extension job). ``bench/resize_phases.py`` runs the same with
``SLURM_ELASTIC_RESIZE_ROUNDS=5`` (5 shrinks, 5 grows; the later shrinks cancel the extension) and prints each
phase's median: performance goes there, not into an assertion.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_elastic.store.records import ActionKind
from tests.cluster.agents_harness import REPO, Agents
from tests.cluster.controller_harness import (
    controller_config,
    node_count,
    running_controller,
    set_util,
    user_workdir,
    wait_until,
)
from tests.cluster.resize_phases import Resize, events, phases, table
from tests.cluster.test_controller_e2e import extensions_of
from tests.cluster.test_resize_templates import repeated_steps, template_script, training_log

pytestmark = pytest.mark.cluster

DIRECTIVES = ("#ELASTIC --min-nodes 1 --max-nodes 2 --step 1 --scale-up-above 80 --scale-down-below 40 "
              "--window 10s --cooldown 2s --grace 30s --signal USR1")
ROUNDS = int(os.environ.get("SLURM_ELASTIC_RESIZE_ROUNDS", "1"))
FAST = os.environ.get("SLURM_ELASTIC_FAST_RESIZE", "1")  # "0": the baseline, torch's own re-form (the bench's)


def test_resizes_record_every_phase_and_repeat_no_step(stack: Agents, tmp_path: Path) -> None:
    cluster = stack.cluster
    work, util = user_workdir(cluster, ["train_elastic.py"], 60)
    env_path = f"{REPO / '.venv-jobs' / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    cp = cluster.run(["env", f"PATH={env_path}", f"PYTHONPATH={REPO}", f"SLURM_ELASTIC_FAST_RESIZE={FAST}",
                      "SLURM_ELASTIC_TRAIN_ARGS=--step-seconds 0.1 --checkpoint-every 1000000",
                      "sbatch", "--parsable", f"--chdir={work}", f"--output={cluster.jobs_dir}/%j.out", "-N2",
                      "--gres=gpu:2", "--time=30"], user="alice",
                     input_text=template_script("torchrun_elastic.sbatch", cluster, util, DIRECTIVES))
    assert cp.returncode == 0, cp.stderr
    job = int(cp.stdout.strip())
    out = cluster.jobs_dir / f"{job}.out"

    def stepped_at(world: int, past: int) -> bool:
        return any(s > past and w == str(world) for s, w in training_log(out)[0])

    def last_step() -> int:
        return max((s for s, _ in training_log(out)[0]), default=0)

    cluster.wait_state(job, {"RUNNING"})
    cfg = controller_config(tmp_path, stack)
    cfg.write_text(cfg.read_text().replace('PATH = "/usr/local/bin:/usr/bin:/bin"', f'PATH = "{env_path}"'))
    with running_controller(cluster, cfg) as ctl:
        wait_until("training at world 2", lambda: stepped_at(2, 5), 120, ctl)
        for _ in range(ROUNDS):
            mark = last_step()
            set_util(util, 0)  # shrink 2 -> 1: the leader's second node, later the extension job
            wait_until("the shrink to 1 node", lambda: node_count(cluster, job) == 1 and not extensions_of(
                cluster, job), 120, ctl)
            wait_until("training at world 1", lambda m=mark: stepped_at(1, m + 5), 120, ctl)
            mark = last_step()
            set_util(util, 100)  # grow 1 -> 2 by an extension job
            wait_until("training at world 2 after the grow", lambda m=mark: stepped_at(2, m + 5), 150, ctl)
        set_util(util, 60)
        actions = sorted([*ctl.applied(job, ActionKind.SHRINK), *ctl.applied(job, ActionKind.GROW)],
                         key=lambda a: a.created_at)
    text = out.read_text(errors="replace")
    ev = events(text)
    resizes = [Resize("grow" if a.kind is ActionKind.GROW else "shrink", a.created_at.timestamp(),
                      int(a.params["to"])) for a in actions]
    for i, r in enumerate(resizes):
        phases(r, ev, resizes[i + 1].decided if i + 1 < len(resizes) else None)
    report = table(resizes)
    print(f"\nresize phases, seconds after the decision (job {job}):\n{report}")
    if path := os.environ.get("SLURM_ELASTIC_PHASES_OUT"):
        Path(path).write_text(json.dumps([{"kind": r.kind, "world": r.world, "phases": r.phases}
                                          for r in resizes], indent=1))
    assert [r.kind for r in resizes] == ["shrink", "grow"] * ROUNDS, report
    missing = {r.kind: [p for p in r.missing() if FAST != "0" or p != "leave"] for r in resizes}
    assert {k: v for k, v in missing.items() if v} == {}, f"{report}\n{text[-3000:]}"
    assert repeated_steps(out) == [0] * len(repeated_steps(out)), f"steps repeated after a resize\n{text[-3000:]}"
    assert len(repeated_steps(out)) >= 2 * ROUNDS
