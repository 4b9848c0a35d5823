"""docs/architecture.md matches the code: its import graph is what scripts/import-graph reads from the source now,
every package has a layer, the layers' arrows point the way the doc says, and the files it names exist."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import pytest

Graph = tuple[set[str], dict[tuple[str, str], set[str]]]
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "import-graph"
DOC = REPO / "docs" / "architecture.md"


def _script() -> ModuleType:
    loader = SourceFileLoader("import_graph", str(SCRIPT))
    spec = importlib.util.spec_from_loader("import_graph", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


ig = _script()


@pytest.fixture(scope="module")
def graph() -> Graph:
    """The package's nodes and edges, read once for the module (parsing the whole package takes a second)."""
    nodes, edges = ig.import_edges(REPO / "slurm_elastic")
    return nodes, edges


def test_the_embedded_graph_is_the_one_the_code_has_now(graph: Graph) -> None:
    nodes, edges = graph
    assert ig.embedded(DOC.read_text()) == ig.mermaid(nodes, edges), \
        "docs/architecture.md's import graph is stale: run scripts/import-graph --write docs/architecture.md"


def test_every_package_has_a_layer(graph: Graph) -> None:
    nodes, _ = graph
    assert {"policy", "controller", "slurm", "store", "agent", "sim", "errors"} <= nodes  # it found them
    assert [n for n in sorted(nodes) if ig.layer_of(n) == ig.UNPLACED] == []


def test_the_layers_point_inward(graph: Graph) -> None:
    """The shell is imported by the shell and the test support only; the core imports the core and the snapshot's
    types only; the test support (the outermost layer, drives everything) is imported by nothing."""
    _, edges = graph
    layer = {name: i for i, name in enumerate(ig.LAYERS)}
    core, shell, testing = layer[next(iter(ig.LAYERS))], layer[list(ig.LAYERS)[2]], layer[list(ig.LAYERS)[-1]]
    assert list(ig.LAYERS.values())[-1] == ("testing",)
    into_shell = [(a, b) for a, b in edges
                  if layer[ig.layer_of(b)] == shell and layer[ig.layer_of(a)] not in (shell, testing)]
    assert into_shell == []
    assert [(a, b) for a, b in edges if layer[ig.layer_of(b)] == testing] == []
    out_of_core = [(a, b, sorted(used)) for (a, b), used in edges.items()
                   if layer[ig.layer_of(a)] == core and layer[ig.layer_of(b)] != core
                   and not (b == "slurm" and used == {"model"})]
    assert out_of_core == []


def test_the_files_the_doc_names_exist() -> None:
    text = DOC.read_text()
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.(?:py|sh|md))`", text))
    named |= set(re.findall(r"`((?:tests|scripts|docker-slurm)/[A-Za-z0-9_./<>-]+)`", text))
    assert len(named) > 30
    missing = []
    for name in sorted(named):
        path = name.split("<", 1)[0]  # tests/fixtures/slurm/<release>/recorded/: the folder above
        if not any((base / path).exists() for base in (REPO, REPO / "slurm_elastic")):
            missing.append(name)
    assert missing == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "slurm_elastic"
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_edges_come_from_every_kind_of_import(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {
        "__init__.py": "__version__ = '1'\n",
        "errors.py": "",
        "core/__init__.py": "from slurm_elastic import __version__\n",
        "core/model.py": "from slurm_elastic.errors import X\n",
        "core/rules.py": "from .model import Y\nfrom ..errors import Z\n",
        "ports/a.py": "from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from slurm_elastic.core.model import M\n",
        "shell/run.py": "import slurm_elastic.ports.a\n\ndef f():\n    from slurm_elastic.core import rules\n",
        "shell/cli.py": "from slurm_elastic import core, errors\nfrom slurm_elastic.ports import a, b, c\n",
        "shell/data/__init__.py": "",
    })
    nodes, edges = ig.import_edges(pkg)
    assert nodes == {"errors", "core", "ports", "shell"}
    assert {k: sorted(v) for k, v in edges.items()} == {
        ("core", "errors"): [],
        ("ports", "core"): ["model"],
        ("shell", "ports"): ["a"],  # b and c are no modules
        ("shell", "core"): ["rules"],
        ("shell", "errors"): [],
    }
    text = ig.mermaid(nodes, edges)
    assert "  ports -->|model| core\n" in text and "  shell --> errors\n" in text
    assert 'subgraph layer0["core (pure: no clock, no I/O)"]\n    errors\n  end' in text
    assert '["unplaced"]\n    core\n    ports\n    shell\n  end' in text
    assert "  ports -> core [label=\"model\"];" in ig.dot(nodes, edges)


def test_check_fails_on_a_stale_doc_and_write_fixes_it(tmp_path: Path) -> None:
    pkg = _tree(tmp_path, {"errors.py": "", "a/x.py": "from slurm_elastic.errors import E\n"})
    doc = tmp_path / "doc.md"
    doc.write_text(f"# t\n\n{ig.BEGIN}\n```mermaid\n```\n{ig.END}\n\nafter\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(SCRIPT), "--root", str(pkg), *args], capture_output=True,
                              text=True, timeout=60, check=False)

    assert run("--check", str(doc)).returncode == 1
    assert run("--write", str(doc)).returncode == 0
    assert run("--check", str(doc)).returncode == 0
    assert doc.read_text().startswith("# t\n\n") and doc.read_text().endswith(f"{ig.END}\n\nafter\n")
    assert "  a --> errors\n" in doc.read_text()
    (pkg / "b").mkdir()
    (pkg / "b" / "y.py").write_text("import slurm_elastic.a.x\n")  # a new import makes the doc stale
    stale = run("--check", str(doc))
    assert stale.returncode == 1 and "stale" in stale.stderr


def test_a_doc_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers"):
        ig.embedded("# no graph here\n")
