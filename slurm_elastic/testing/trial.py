"""``scripts/demo --try TEMPLATE``: one shipped template on the local test cluster, with trial timings and a GPU
load you set while it runs (test support: never installed).

The templates' ``#ELASTIC`` timings are a site's (10 min window, 5 min cooldown, 2 min grace); a trial keeps their
sizes and thresholds and shortens the timings to :data:`TRIAL_TIMINGS`. The test cluster's GPUs are virtual, so
the job also runs the virtual-GPU load helper on every node (``slurm_elastic.testing.vgpu.workload``, the one the
cluster tests use) at the utilization written in a file: ``echo 95 > WORK/util`` (above the template's 80: the
job grows), ``echo 5 > WORK/util`` (below its 40: it shrinks). The demo's agents and controller run meanwhile and
every decision is printed with its reason; Ctrl-C (or ``--duration``) ends the trial and cancels the job.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

TEMPLATES = {  # template -> the programs it runs (copied into the job's working directory)
    "minimal": ("minimal.sbatch", ("train_minimal.py",)),
    "torchrun": ("torchrun_elastic.sbatch", ("train_elastic.py",)),
    "dlrm": ("dlrm_embedding.sbatch", ("train_dlrm.py",)),
}
TRIAL_TIMINGS = {"window": "20s", "cooldown": "20s", "grace": "30s"}
#: small models and short steps, so a trial shows its steps on the test cluster's CPUs
TRAIN_ARGS = {"minimal": "--step-seconds 0.5", "torchrun": "--step-seconds 0.5",
              "dlrm": "--step-seconds 0.5 --tables 2 --rows 1000 --batch 32"}


def trial_directives(line: str) -> str:
    """An ``#ELASTIC`` line with its window, cooldown and grace set to :data:`TRIAL_TIMINGS`."""
    for key, value in TRIAL_TIMINGS.items():
        line = re.sub(rf"--{key}[ =]\S+", f"--{key} {value}", line)
    return line


def trial_script(template: str, vgpu_dir: Path, util_file: Path, python: str) -> str:
    """The template with trial timings, one torch worker per node (torch runs on the CPU here) and the
    virtual-GPU load on every node, at the utilization in ``util_file`` (re-read every second)."""
    lines = [trial_directives(ln) if ln.startswith("#ELASTIC") else ln for ln in template.splitlines()]
    at = next(i for i, ln in enumerate(lines) if ln.startswith('echo "elastic role='))
    head = lines.index("set -u")
    cpu = "export SLURM_ELASTIC_NPROC_PER_NODE=1  # torch runs on the CPU here: one worker per node"
    # The load is no part of the template: it ignores the grace signal (scancel --full reaches its tasks too).
    load = (f"export SLURM_ELASTIC_VGPU_DIR={vgpu_dir}\n"
            f"srun --overlap --kill-on-bad-exit=0 --ntasks-per-node=1 bash -c \"trap '' USR1; exec {python} "
            f"-m slurm_elastic.testing.vgpu.workload --util 60 --util-file {util_file} --mem-mib 500\" &")
    return "\n".join([*lines[:head], cpu, *lines[head:at], load, *lines[at:]]) + "\n"


def prepare(repo: Path, jobs_dir: Path, name: str, util: int, user: str) -> tuple[Path, str]:
    """A fresh working directory owned by ``user`` with the template's programs and the load file; the script."""
    template, programs = TEMPLATES[name]
    work = jobs_dir / f"try-{name}-{int(time.time())}"
    work.mkdir(parents=True)
    for program in programs:
        shutil.copy(repo / "sbatch_templates" / program, work / program)
    util_file = work / "util"
    util_file.write_text(f"{util}\n")
    util_file.chmod(0o666)
    shutil.chown(work, user)
    shutil.chown(util_file, user)
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else "python3"
    text = (repo / "sbatch_templates" / template).read_text()
    return work, trial_script(text, jobs_dir.parent / "vgpu", util_file, python)


def banner(job: int, name: str, nodes: int, util: int, work: Path) -> str:
    util_file = work / "util"
    return (f"{datetime.now(UTC):%H:%M:%S}  job {job}: sbatch_templates/{TEMPLATES[name][0]} on {nodes} node(s), "
            f"trial timings {TRIAL_TIMINGS}, GPU load {util}%\n"
            f"  grow:    echo 95 > {util_file}\n"
            f"  shrink:  echo 5 > {util_file}\n"
            f"  output:  {work.parent}/try-{job}.out   (Ctrl-C ends the trial and cancels the job)\n")


#: ``--check``: the loads it sets in turn, and what each must make the job do
CHECK_STEPS = ((95, "grow"), (5, "shrink"))


def run(cluster_dir: Path, name: str, nodes: int, util: int, duration: float, *, check: bool = False,
        command: Sequence[str] = (), agent_port_base: int = 18100) -> int:
    """Agents, controller and the trial job; prints decisions and sizes until ``duration`` or Ctrl-C.

    ``check``: drive the load itself (:data:`CHECK_STEPS`: 95% until the job grows, then 5% until it shrinks) and
    return 1 unless both happen within ``duration``; scripts/test-wheel runs it with the installed console
    script as ``command``."""
    from slurm_elastic.testing.demo import JOB_PATH, POLICY, REPO, Demo, new_decisions, unit_sizes

    demo = Demo(cluster_dir, duration, command, agent_port_base)
    shutil.rmtree(demo.dir, ignore_errors=True)
    demo.dir.mkdir(parents=True)
    try:
        # A release cluster's (24.11, 26.05) client commands are in its bin/: the job's srun and the extension
        # jobs' sbatch must be that release's.
        release_bin = cluster_dir / "bin"
        path = f"{release_bin}:{JOB_PATH}" if release_bin.is_dir() else JOB_PATH
        db = demo.start_controller(demo.start_agents(), POLICY, path)
        work, script = prepare(REPO, cluster_dir / "jobs", name, util, "alice")
        env = {**demo.env, "PATH": path, "PYTHONPATH": str(REPO), "SLURM_ELASTIC_TRAIN_ARGS": TRAIN_ARGS[name]}
        job = demo.slurm.submit_as("alice", script, [f"--chdir={work}", f"--output={cluster_dir}/jobs/try-%j.out",
                                                     f"-N{nodes}", "--gres=gpu:4", "--time=60"], env=env)
        demo.jobs.append(job)
        print(banner(job, name, nodes, util, work), flush=True)
        seen: set[int] = set()
        last = -1
        steps = list(CHECK_STEPS) if check else []
        reference: int | None = None  # the size the current check step started from
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            time.sleep(2)
            size = unit_sizes(demo.slurm.snapshot(), (job,))[job]
            if size != last:
                last = size
                print(f"{datetime.now(UTC):%H:%M:%S}  [job {job}: {size} node(s)]", flush=True)
            if steps and size > 0:
                load, want = steps[0]
                if reference is None:
                    reference = size
                    (work / "util").write_text(f"{load}\n")
                    print(f"{datetime.now(UTC):%H:%M:%S}  check: GPU load {load}%: the job must {want}", flush=True)
                elif (size > reference) if want == "grow" else (size < reference):
                    print(f"{datetime.now(UTC):%H:%M:%S}  check: it did ({reference} -> {size} node(s))", flush=True)
                    steps.pop(0)
                    reference = None
                    if not steps:
                        return 0
            for d in new_decisions(db, seen) or []:
                if d.job_id == job and (d.action != "hold" or d.reason in {"AT_MIN", "AT_MAX", "IN_BAND"}):
                    print(f"{d.time.astimezone(UTC):%H:%M:%S}  {d.action:6} {d.current_nodes}->{d.target_nodes}  "
                          f"{d.reason}: {d.message}", flush=True)
        if steps:
            print(f"check: the job did not {steps[0][1]} within {duration:.0f}s", flush=True)
            return 1
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        demo.stop()
