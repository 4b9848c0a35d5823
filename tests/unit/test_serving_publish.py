"""slurm_elastic.serving: the serving job's load/latency publisher (the file the controller's serving rules read)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic import serving

REPO = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_publish_appends_one_line_per_call_and_leaves_out_none_fields(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    assert serving.publish(120.5, p50_ms=4.0, p99_ms=31.25, queue_depth=3, replicas=2, at=1000.0, path=str(path))
    assert serving.publish(0.0, at=1005.0, path=str(path))  # idle: no requests, no latency measured
    assert _lines(path) == [
        {"time": 1000.0, "requests_per_s": 120.5, "p50_ms": 4.0, "p99_ms": 31.25, "queue_depth": 3, "replicas": 2},
        {"time": 1005.0, "requests_per_s": 0.0},
    ]


def test_default_path_is_the_leaders_file_under_the_working_dir(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(serving.ENV_FILE, raising=False)
    monkeypatch.delenv("SLURM_ELASTIC_PARENT", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert serving.default_path() is None
    assert not serving.publish(1.0)  # outside Slurm: nowhere to write, no exception
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert serving.default_path() == str(tmp_path / ".slurm-elastic" / "serving-42.jsonl")
    monkeypatch.setenv("SLURM_ELASTIC_PARENT", "40")  # an extension job publishes into its leader's file
    assert serving.publish(3.0, replicas=1)
    assert serving.serving_path(str(tmp_path), 40) == str(tmp_path / ".slurm-elastic" / "serving-40.jsonl")
    assert _lines(tmp_path / ".slurm-elastic" / "serving-40.jsonl")[0]["requests_per_s"] == 3.0
    override = tmp_path / "elsewhere" / "x.jsonl"
    monkeypatch.setenv(serving.ENV_FILE, str(override))
    assert serving.default_path() == str(override)
    assert serving.publish(4.0) and _lines(override)[0]["requests_per_s"] == 4.0


def test_io_errors_return_false_and_a_symlink_is_not_followed(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert not serving.publish(1.0, path=str(blocker / "sub" / "s.jsonl"))  # parent is a file
    target = tmp_path / "victim"
    target.write_text("")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    assert not serving.publish(1.0, path=str(link))
    assert target.read_text() == ""


@pytest.mark.parametrize("kwargs", [
    {"requests_per_s": -1.0}, {"requests_per_s": math.nan}, {"requests_per_s": math.inf},
    {"requests_per_s": 1.0, "p99_ms": -2.0}, {"requests_per_s": 1.0, "p50_ms": 9.0, "p99_ms": 3.0},
    {"requests_per_s": 1.0, "queue_depth": -1}, {"requests_per_s": 1.0, "replicas": 1.5},
    {"requests_per_s": 1.0, "replicas": True},
])
def test_nonsense_values_are_the_callers_bug(kwargs: dict[str, object], tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        serving.publish(path=str(tmp_path / "s.jsonl"), **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "s.jsonl").exists()


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    code = ("import sys; from slurm_elastic import serving\n"
            "for i in range(200): serving.publish(float(i), p50_ms=1.0, p99_ms=2.0, path=sys.argv[1])\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], env={**os.environ, "PYTHONPATH": str(REPO)})
             for _ in range(3)]
    assert [p.wait() for p in procs] == [0, 0, 0]
    rows = _lines(path)
    assert len(rows) == 600 and all(set(r) == {"time", "requests_per_s", "p50_ms", "p99_ms"} for r in rows)


def test_import_has_no_side_effects_and_needs_only_the_standard_library() -> None:
    code = ("import sys; before = set(sys.modules); import slurm_elastic.serving\n"
            "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
            "assert new <= set(sys.stdlib_module_names) | {'slurm_elastic'}, new\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    assert subprocess.run([sys.executable, "-c", code], check=False, env=env).returncode == 0
