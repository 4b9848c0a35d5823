"""Test and demo support lives in ``slurm_elastic.testing`` and stays out of what a site installs: the wheel
leaves the package out (pyproject.toml), and no production module refers to it, so an installed controller or
agent never reaches for a module it does not have."""

from __future__ import annotations

import ast
import fnmatch
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "slurm_elastic"
TESTING = "slurm_elastic.testing"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_testing(name: str) -> bool:
    return name == TESTING or name.startswith(TESTING + ".")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (module, class, function): prose may name the test package."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def references_to_testing(path: Path, root: Path) -> list[str]:
    """Where the module at ``path`` (inside the package directory ``root``) imports ``slurm_elastic.testing`` or
    names it in a string (``importlib.import_module(...)``, ``python -m ...``): ``file:line: what``."""
    module = _module_name(path, root)
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = _docstrings(tree)
    where = f"{path.relative_to(root.parent)}"
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names = [source, *(f"{source}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if TESTING in node.value or "slurm_elastic/testing" in node.value:
                found.append(f"{where}:{node.lineno}: string {node.value!r}")
            continue
        found += [f"{where}:{node.lineno}: imports {n}" for n in names if _is_testing(n)]
    return found


def production_modules(root: Path) -> list[Path]:
    return [p for p in sorted(root.rglob("*.py")) if "testing" not in p.relative_to(root).parts[:1]]


def test_production_code_does_not_use_the_testing_package() -> None:
    modules = production_modules(PACKAGE)
    assert len(modules) > 100 and PACKAGE / "controller" / "cycle.py" in modules  # it walked the package
    assert not any("testing" in p.relative_to(PACKAGE).parts for p in modules)
    assert [ref for path in modules for ref in references_to_testing(path, PACKAGE)] == []


def test_the_testing_package_holds_the_test_support() -> None:
    """What moved there is there, and the package root keeps no stale copy of it."""
    testing = PACKAGE / "testing"
    for name in ("vgpu/__init__.py", "vgpu/vnvml.c", "vgpu/workload.py", "mig_fake.py", "demo.py"):
        assert (testing / name).is_file(), name
    assert not (PACKAGE / "vgpu").exists() and not (PACKAGE / "demo.py").exists()
    assert not (PACKAGE / "mig" / "fake.py").exists()


def test_the_check_finds_every_kind_of_reference(tmp_path: Path) -> None:
    pkg = tmp_path / "slurm_elastic"
    (pkg / "agent").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    cases = {
        "plain.py": "import slurm_elastic.testing.vgpu\n",
        "from_module.py": "from slurm_elastic.testing.vgpu.state import make_node_state\n",
        "from_package.py": "from slurm_elastic import testing\n",
        "agent/relative.py": "from ..testing import demo\n",
        "lazy.py": "def f():\n    from slurm_elastic.testing.mig_fake import FakeMigDevice\n    return FakeMigDevice\n",
        "by_name.py": "import importlib\nM = importlib.import_module('slurm_elastic.testing.demo')\n",
        "spawned.py": "ARGV = ['python3', '-m', 'slurm_elastic.testing.vgpu.workload']\n",
    }
    for name, text in cases.items():
        (pkg / name).write_text(text)
    for name in cases:
        assert references_to_testing(pkg / name, pkg), name
    fine = pkg / "agent" / "fine.py"
    fine.write_text('"""Tests run this against :mod:`slurm_elastic.testing.vgpu`."""\n'
                    "import slurm_elastic.testing_tools\nfrom slurm_elastic.mig import device\n"
                    "def f():\n    '''Like slurm_elastic.testing.mig_fake.'''\n")
    assert references_to_testing(fine, pkg) == []


def _packages(root: Path) -> list[str]:
    """Every directory is a package to setuptools' pyproject configuration (namespace packages: slurm/ has no
    ``__init__.py``, data/ no module at all)."""
    dirs = [p for p in root.rglob("*") if p.is_dir() and "__pycache__" not in p.parts]
    return sorted([root.name, *(".".join(p.relative_to(root.parent).parts) for p in dirs)])


def test_the_wheel_leaves_the_testing_package_out() -> None:
    """setuptools' package finder (fnmatch on dotted names) keeps every production package and drops every
    package under testing/; package data names nothing there either. Building the wheel itself needs the
    build backend from an index, so that is done by hand (docs/architecture.md) rather than here."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    include, exclude = config["packages"]["find"]["include"], config["packages"]["find"].get("exclude", [])

    def shipped(name: str) -> bool:
        return (any(fnmatch.fnmatchcase(name, p) for p in include)
                and not any(fnmatch.fnmatchcase(name, p) for p in exclude))

    packages = _packages(PACKAGE)
    testing = [p for p in packages if _is_testing(p)]
    assert {TESTING, f"{TESTING}.vgpu"} <= set(testing)
    assert [p for p in testing if shipped(p)] == []
    assert [p for p in packages if not _is_testing(p) and not shipped(p)] == []
    assert not any("testing" in pattern for patterns in config["package-data"].values() for pattern in patterns)
