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
    assert ("export SLURM_ELASTIC_GOODPUT_FILE=${SLURM_ELASTIC_GOODPUT_FILE:-$PWD/.slurm-elastic/"
            "goodput-$leader.jsonl}") in text
    assert "leader=${SLURM_ELASTIC_PARENT:-$SLURM_JOB_ID}" in text


@pytest.mark.parametrize("name", TRAIN_SCRIPTS)
def test_train_scripts_publish_throughput_readable_by_the_controller(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripts use slurm_elastic.goodput when importable, else an inline fallback (torch jobs may not have
    the package on PYTHONPATH): run that fallback and parse what it wrote as the controller does."""
    import ast
    import os
    import time

    from slurm_elastic.controller.goodput import parse_lines

    source = (TEMPLATES[0].parent / name).read_text()
    assert "publish(samples_per_s=" in source and "nodes=nodes_from_env()" in source
    tree = ast.parse(source)
    (fallback,) = [n for n in tree.body if isinstance(n, ast.Try)
                   and any(isinstance(s, ast.ImportFrom) and s.module == "slurm_elastic.goodput" for s in n.body)]
    namespace: dict[str, object] = {"os": os, "time": time}
    exec(compile(ast.Module(body=fallback.handlers[0].body, type_ignores=[]), name, "exec"), namespace)
    path = tmp_path / ".slurm-elastic" / "goodput-7.jsonl"
    monkeypatch.setenv("SLURM_ELASTIC_GOODPUT_FILE", str(path))
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    publish, nodes_from_env = namespace["publish"], namespace["nodes_from_env"]
    assert publish(samples_per_s=640.0, nodes=nodes_from_env())  # type: ignore[operator]
    assert not publish(samples_per_s=float("nan"))  # type: ignore[operator]
    reports, bad = parse_lines(path.read_bytes(), now=time.time())
    assert bad == 0 and [(r.value, r.nodes) for r in reports] == [(640.0, 2)]
