"""The Docker variant of the test cluster: files exist, compose is well-formed (no engine here to run it)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DS = REPO / "docker-slurm"


def test_compose_file_structure() -> None:
    doc = yaml.safe_load((DS / "compose.yaml").read_text())
    svc = doc["services"]["cluster"]
    build = svc["build"]
    assert (DS / build["context"] / build["dockerfile"]).resolve() == (DS / "Dockerfile").resolve()
    assert svc["privileged"] is True  # mknod + cgroups
    vol = svc["volumes"][0].split(":")
    assert vol[0] in doc["volumes"] and vol[1] == svc["environment"]["SLURM_ELASTIC_CLUSTER_DIR"]


def test_dockerfile_uses_the_same_entrypoint_and_scripts() -> None:
    text = (DS / "Dockerfile").read_text()
    assert "FROM debian:bookworm" in text
    assert "docker-slurm/entrypoint.sh" in text and (DS / "entrypoint.sh").stat().st_mode & 0o111
    assert "cluster.sh start" in (DS / "entrypoint.sh").read_text()
    assert "./scripts/bootstrap" in text
