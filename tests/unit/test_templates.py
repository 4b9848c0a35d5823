"""Every sbatch template carries valid #ELASTIC directives and the --no-kill contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.directives.parser import parse_script

TEMPLATES = sorted((Path(__file__).resolve().parents[2] / "sbatch_templates").glob("*.sbatch"))


def test_there_are_templates() -> None:
    assert {p.name for p in TEMPLATES} >= {"minimal.sbatch", "torchrun_elastic.sbatch", "dlrm_embedding.sbatch"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_directives_are_valid(path: Path) -> None:
    text = path.read_text()
    result = parse_script(text)
    assert not result.errors, [e.describe() for e in result.errors]
    assert "#SBATCH --no-kill" in text
    assert "SLURM_ELASTIC_ROLE" in text


TRAIN_SCRIPTS = ("train_elastic.py", "train_dlrm.py")


@pytest.mark.parametrize("name", ["torchrun_elastic.sbatch", "dlrm_embedding.sbatch"])
def test_torch_templates_point_the_goodput_file_at_the_controllers_path(name: str) -> None:
    text = (TEMPLATES[0].parent / name).read_text()
    assert "state=$PWD/.slurm-elastic" in text
    assert "export SLURM_ELASTIC_GOODPUT_FILE=${SLURM_ELASTIC_GOODPUT_FILE:-$state/goodput-$leader.jsonl}" in text
    assert "leader=${SLURM_ELASTIC_PARENT:-$SLURM_JOB_ID}" in text


@pytest.mark.parametrize("name", ["torchrun_elastic.sbatch", "dlrm_embedding.sbatch", "minimal.sbatch",
                                  "serve_http.sbatch"])
def test_templates_run_the_launcher_and_keep_the_users_environment(name: str) -> None:
    """The launcher is the step's task (it forwards the grace signal and notices to the program); the leader
    records the user's environment and an extension job loads it; the notice file is the controller's path."""
    text = (TEMPLATES[0].parent / name).read_text()
    assert "srun --kill-on-bad-exit=0 python3 -m slurm_elastic.launch " in text
    assert "SIG_IGN" not in text  # nothing makes the launcher (or the program) deaf to the grace signal
    assert 'done > "$state/env-$leader.sh"' in text and '. "$state/env-$leader.sh"' in text
    assert "export SLURM_ELASTIC_RESIZE_FILE=${SLURM_ELASTIC_RESIZE_FILE:-$state/resize-$leader.json}" in text


@pytest.mark.parametrize("name", ["torchrun_elastic.sbatch", "dlrm_embedding.sbatch"])
def test_torch_templates_take_their_sizes_from_elastic_only(name: str, tmp_path: Path) -> None:
    """min/max nodes come from the script's own #ELASTIC line (the bash function the template uses, run on a
    copy with other numbers), and the store host is pinned through the launcher."""
    import re
    import subprocess

    text = (TEMPLATES[0].parent / name).read_text()
    assert re.search(r"--nnodes=\"\$min_nodes:\$max_nodes\"", text) and "--max-nodes 4" in text
    assert not re.search(r"--nnodes=\"?[0-9]", text)
    assert "export SLURM_ELASTIC_RDZV_HOST_NODE=${SLURMD_NODENAME:-}" in text
    func = next(line for line in text.splitlines() if line.startswith("elastic() {"))
    script = tmp_path / "job.sh"
    script.write_text(text.replace("--min-nodes 1 --max-nodes 4", "--min-nodes 2 --max-nodes=7").split("set -u")[0]
                      + f"{func}\necho $(elastic min-nodes):$(elastic max-nodes)\n")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "2:7"


TORCH_HELPERS = Path(__file__).resolve().parents[2] / "slurm_elastic" / "torch_resize.py"


@pytest.mark.parametrize("name", [*TRAIN_SCRIPTS, "train_adaptive.py", "train_minimal.py"])
def test_train_scripts_keep_the_contract(name: str) -> None:
    """They use the package's helpers (goodput, resize), checkpoint the optimizer state, log step and loss; the
    torch scripts through the package's one copy of the checkpoint/hold helpers (slurm_elastic/torch_resize.py),
    importable from the wheel, never from a sibling script."""
    source = (TEMPLATES[0].parent / name).read_text()
    assert "from slurm_elastic import resize" in source
    assert "resize.resize_pending()" in source
    assert 'print(f"step={step} loss=' in source and 'print(f"resumed step={step}' in source
    if name == "train_minimal.py":
        assert "resize.acknowledge(step)" in source
        return
    assert "publish(samples_per_s=" in source and "nodes_from_env()" in source
    assert "from slurm_elastic.torch_resize import" in source and "before_resize(step, rank," in source
    assert "from train_" not in source and "def save(" not in source and "def load(" not in source
    helpers = TORCH_HELPERS.read_text()
    assert '"optimizer": opt.state_dict()' in helpers and "opt.load_state_dict(" in helpers
    assert "resize.hold(" in helpers and "resize.acknowledge(step)" in helpers


@pytest.mark.parametrize("name", ["torchrun_elastic.sbatch", "dlrm_embedding.sbatch"])
def test_an_extension_never_forms_a_group_without_the_running_job(name: str, tmp_path: Path) -> None:
    """An extension's agents wait for at least one node more than their own (capped at max): were the leader's
    restart slow, they would otherwise complete a rendezvous round alone and train a second copy of the model."""
    import subprocess

    text = (TEMPLATES[0].parent / name).read_text()
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("elastic() {"))
    end = next(i for i, ln in enumerate(lines) if i > start and ln == "fi")
    script = tmp_path / "job.sh"
    script.write_text("\n".join([*text.split("set -u")[0].splitlines(), *lines[start:end + 1],
                                 "echo $min_nodes:$max_nodes"]) + "\n")
    run = lambda env: subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True,  # noqa: E731
                                     env=env).stdout.strip()
    assert run({"role": "leader", "SLURM_JOB_NUM_NODES": "2"}) == "1:4"
    assert run({"role": "extension", "SLURM_JOB_NUM_NODES": "2"}) == "3:4"
    assert run({"role": "extension", "SLURM_JOB_NUM_NODES": "4"}) == "4:4"


def test_serving_template_publishes_where_the_controller_reads_and_is_a_serving_unit() -> None:
    text = (TEMPLATES[0].parent / "serve_http.sbatch").read_text()
    assert "export SLURM_ELASTIC_SERVING_FILE=${SLURM_ELASTIC_SERVING_FILE:-$state/serving-$leader.jsonl}" in text
    assert [s.serving for s in parse_script(text).specs] == [True]
    source = (TEMPLATES[0].parent / "serve_http.py").read_text()
    assert "serving.publish(" in source and "resize.acknowledge()" in source


@pytest.mark.parametrize("name", ["torchrun_elastic.sbatch", "dlrm_embedding.sbatch"])
@pytest.mark.parametrize(("env", "workers"), [
    ({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "4"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "2"),  # no SLURM_GPUS_ON_NODE (an older Slurm): the devices it sees
    ({}, "1"),  # no GPUs
    ({"SLURM_GPUS_ON_NODE": "0"}, "1"),
    ({"SLURM_GPUS_ON_NODE": "4", "SLURM_ELASTIC_NPROC_PER_NODE": "1"}, "1"),  # the user's override
])
def test_torch_templates_start_one_worker_per_gpu(name: str, env: dict[str, str], workers: str,
                                                 tmp_path: Path) -> None:
    """--nproc-per-node is the number of GPUs Slurm gave the node (the template's own lines, run by bash)."""
    import os
    import subprocess

    text = (TEMPLATES[0].parent / name).read_text()
    assert '--nproc-per-node="$nproc"' in text and "--nproc-per-node=1" not in text
    lines = text.splitlines()
    first = lines.index("gpus=${SLURM_GPUS_ON_NODE:-}")
    last = next(i for i, ln in enumerate(lines) if ln.startswith('[ "$nproc" -ge 1 ]'))
    script = tmp_path / "nproc.sh"
    script.write_text("set -u\n" + "\n".join(lines[first:last + 1]) + '\necho "$nproc"\n')
    clean = {k: v for k, v in os.environ.items()
             if k not in {"SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES", "SLURM_ELASTIC_NPROC_PER_NODE"}}
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True, env={**clean, **env})
    assert out.stdout.strip() == workers
    assert "SLURM_ELASTIC_NPROC_PER_NODE" in text.split("> \"$state/env-$leader.sh\"")[0]  # extension jobs too


def test_the_templates_end_with_the_jobs_outcome() -> None:
    """srun's status goes through `launch outcome`: a task killed by a shrink is no failure (taskexit.py)."""
    for path in TEMPLATES:
        text = path.read_text()
        assert text.rstrip().endswith('python3 -m slurm_elastic.launch outcome "$rc"'), path.name
        assert "export SLURM_ELASTIC_TASKS_DIR=$state/tasks-$SLURM_JOB_ID" in text, path.name
