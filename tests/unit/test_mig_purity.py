"""The MIG core stays pure: no subprocess, NVML, clock or network imports (functional core)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

MIG = Path(__file__).resolve().parents[2] / "slurm_elastic" / "mig"
FORBIDDEN = {
    "subprocess",
    "pynvml",
    "time",
    "datetime",
    "socket",
    "sqlalchemy",
    "aiohttp",
    "requests",
    "shutil",
}


@pytest.mark.parametrize("path", sorted(MIG.glob("*.py")), ids=lambda p: p.name)
def test_no_side_effect_imports(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN, f"{path.name} imports {sorted(imported & FORBIDDEN)}"
