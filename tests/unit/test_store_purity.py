"""The store's value types and journal state machine stay pure (functional core): no database, clock or I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STORE = Path(__file__).resolve().parents[2] / "slurm_elastic" / "store"
PURE = ["records.py", "journal_states.py", "errors.py"]
FORBIDDEN = {"sqlalchemy", "subprocess", "time", "socket", "os", "sqlite3", "pymysql", "threading"}


@pytest.mark.parametrize("name", PURE)
def test_no_side_effect_imports(name: str) -> None:
    tree = ast.parse((STORE / name).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN, f"{name} imports {sorted(imported & FORBIDDEN)}"


def test_no_clock_reads_in_pure_modules() -> None:
    for name in PURE:
        text = (STORE / name).read_text()
        assert ".now(" not in text and "utcnow" not in text, name
