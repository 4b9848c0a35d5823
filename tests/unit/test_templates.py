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
