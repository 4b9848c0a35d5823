"""The MIG core stays pure: no subprocess, NVML, clock or network imports (functional core). The one module
exempt is the workflow's imperative shell, mig/adapters.py (store journal, files, clock, locks)."""

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
SHELL = {"adapters.py"}


def test_the_exempt_shell_modules_exist() -> None:
    assert {p.name for p in MIG.glob("*.py")} >= SHELL


@pytest.mark.parametrize("path", sorted(p for p in MIG.glob("*.py") if p.name not in SHELL), ids=lambda p: p.name)
def test_no_side_effect_imports(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN, f"{path.name} imports {sorted(imported & FORBIDDEN)}"
