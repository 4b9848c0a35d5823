"""The policy is a functional core: it imports only the standard library's pure parts, the Slurm model, the
directives and its own modules, and never reads a clock, a file or a process (``now`` is passed in)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

POLICY = Path(__file__).resolve().parents[2] / "slurm_elastic" / "policy"

ALLOWED_STDLIB = {
    "__future__", "collections", "dataclasses", "datetime", "difflib", "enum", "itertools", "math", "re",
    "tomllib", "types", "typing",
    "heapq",  # a pure priority queue (the allocator's water-filling)
    "zoneinfo",  # reads the tz database: the same answer for the same config and time (windows in a site zone)
}
ALLOWED_PROJECT = ("slurm_elastic.policy", "slurm_elastic.slurm.model", "slurm_elastic.directives",
                   "slurm_elastic.keyschema",  # the one key declaration: standard library only
                   "slurm_elastic.errors", "slurm_elastic.batchsize",
                   "slurm_elastic.configfile")  # the config layer's text checks: no I/O
#: The policy's files, and the batch-size model it shares with the job library (held to the same rules).
CORE = [*sorted(POLICY.glob("*.py")), POLICY.parent / "batchsize.py"]
#: Builtins that read the world (files, the terminal) or evaluate text as code.
FORBIDDEN_BUILTINS = {"open", "print", "input", "eval", "exec", "compile", "__import__", "breakpoint"}
#: Methods that read the clock, files, the environment or entropy (``datetime.now()``, ``path.read_text()``).
FORBIDDEN_METHODS = {"now", "utcnow", "today", "read_text", "read_bytes", "getenv", "system", "time",
                     "monotonic", "perf_counter", "random", "seed", "urandom"}


def _modules(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _allowed(module: str) -> bool:
    return module.split(".", maxsplit=1)[0] in ALLOWED_STDLIB or any(
        module == p or module.startswith(p + ".") for p in ALLOWED_PROJECT
    )


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_imports_are_on_the_allow_list(path: Path) -> None:
    bad = sorted(m for m in _modules(ast.parse(path.read_text())) if not _allowed(m))
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_no_clock_file_or_eval_calls(path: Path) -> None:
    bad: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in FORBIDDEN_METHODS:
                bad.append(f"line {node.lineno}: .{func.attr}()")
            elif isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTINS:
                bad.append(f"line {node.lineno}: {func.id}()")
    assert not bad, f"{path.name}: {bad}"


def test_the_checks_catch_a_violation() -> None:
    tree = ast.parse("import subprocess\nfrom datetime import datetime\nx = datetime.now()\n")
    assert not _allowed("subprocess") and _allowed("datetime")
    assert "subprocess" in _modules(tree)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert isinstance(calls[0].func, ast.Attribute) and calls[0].func.attr in FORBIDDEN_METHODS


def test_importing_the_policy_pulls_in_no_side_effect_module() -> None:
    code = (
        "import sys, slurm_elastic.policy\n"
        "bad = {'subprocess', 'socket', 'sqlalchemy', 'pynvml', 'aiohttp', 'apscheduler', 'click', 'asyncio',"
        " 'random', 'slurm_elastic.slurm.adapter', 'slurm_elastic.agent'}\n"
        "print(sorted(bad & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
