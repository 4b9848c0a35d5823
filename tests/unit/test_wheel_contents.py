"""What the wheel installs beside the package (pyproject.toml's data-files, under <prefix>/share/slurm-elastic) is
every file of packaging/ and Slurm's hooks from plugins/, and the sdist grafts both: a unit or config added to
packaging/ and not to the wheel fails here, not at a site. scripts/test-wheel builds and installs the real thing."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_wheel_ships_every_packaged_file_and_the_slurm_hooks() -> None:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    shipped = {f for files in data.values() for f in files}
    for f in shipped:
        assert (REPO / f).is_file(), f
    packaged = {str(p.relative_to(REPO)) for p in (REPO / "packaging").rglob("*") if p.is_file()}
    hooks = {f"plugins/{n}" for n in ("job_submit.lua", "prolog.sh", "epilog.sh")}
    assert packaged | hooks <= shipped
    assert all(target.startswith("share/slurm-elastic/") for target in data)


def test_the_sdist_grafts_packaging_and_plugins() -> None:
    lines = (REPO / "MANIFEST.in").read_text().splitlines()
    assert {"graft packaging", "graft plugins"} <= set(lines)
