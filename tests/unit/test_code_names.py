"""Names in the code say what they hold: no two top-level classes of the package share a name (a reader or a
grep finds the one meant), and no code comment or docstring points at an issue number (the docs may)."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "slurm_elastic"
CLASS = re.compile(r"^class (\w+)", re.MULTILINE)  # top level: a nested class is indented
CODE_SUFFIXES = {".py", ".sh", ".lua", ".c", ".h", ""}  # "": scripts/*
ISSUE_NUMBER = re.compile(r"(?i)\bissues?\s*(?:no\.?\s*)?#\s*\d+|\bissues?\s+\d+")


def _top_level_classes(path: Path) -> list[str]:
    return CLASS.findall(path.read_text(encoding="utf-8"))


def test_top_level_class_names_are_unique_across_the_package() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _top_level_classes(path):
            where[name].append(str(path.relative_to(REPO)))
    assert len(where) > 300  # it found the package's classes
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_no_issue_numbers_in_code() -> None:
    offenders = []
    for top in ("slurm_elastic", "tests", "scripts", "bench"):
        for path in sorted((REPO / top).rglob("*")):
            if not path.is_file() or path.suffix not in CODE_SUFFIXES or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            offenders += [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
                          for n, line in enumerate(text.splitlines(), 1) if ISSUE_NUMBER.search(line)]
    assert offenders == []


def test_the_issue_pattern_finds_what_it_should() -> None:
    word = "iss" + "ue"  # spelled in two halves so that this file does not match its own search
    assert ISSUE_NUMBER.search(f"# fixed for {word} 13 item 4")
    assert ISSUE_NUMBER.search(f"see {word.title()} #7")
    assert not ISSUE_NUMBER.search("slurm-elastic mig #7: restart_slurm failed")
    assert not ISSUE_NUMBER.search("NVML_ERROR_IRQ_ISSUE = 11")
