"""Packaging: the example configs parse with the real loaders, and the systemd units verify.

``systemd-analyze verify`` exits 0 even for unknown keys and bad values (it only warns), so the test requires
it to print nothing. It runs wherever systemd-analyze is installed (it is on the dev machine and in CI)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic.agent.config import load_config
from slurm_elastic.controller.config import load_controller_config
from slurm_elastic.policy import parse_config

REPO = Path(__file__).resolve().parents[2]
ETC = REPO / "packaging" / "etc" / "slurm-elastic"
UNITS = REPO / "packaging" / "systemd"
SLURM_ELASTIC = Path(sys.executable).parent / "slurm-elastic"


def test_example_configs_parse_with_the_real_loaders() -> None:
    ctl = load_controller_config(ETC / "controller.toml")
    assert ctl.policy_file == Path("/etc/slurm-elastic/policy.toml")
    assert ctl.api.socket == Path("/run/slurm-elastic/controller.sock") and ctl.metrics.port == 9818
    policy = parse_config((ETC / "policy.toml").read_text(), source="policy.toml")
    assert policy.resolve("grace_s", partition="gpu").value == 300
    agent = load_config(ETC / "agent.toml", {}, "gpu017")
    assert agent.node == "gpu017" and agent.key_file == Path("/etc/slurm-elastic/agent.key")
    # Telemetry stays on the host, and without job/user/account labels, until the site opens it.
    assert (ctl.metrics.address, ctl.metrics.anonymous) == ("127.0.0.1", "reduced")
    assert (agent.metrics_listen, agent.metrics_anonymous) == ("127.0.0.1", "reduced")


def test_example_configs_are_commented() -> None:
    for name in ("controller.toml", "agent.toml", "policy.toml"):
        lines = (ETC / name).read_text().splitlines()
        assert sum("#" in line for line in lines) >= len([x for x in lines if "=" in x]) // 2, name


def units() -> list[Path]:
    return sorted(UNITS.glob("*.service"))


@pytest.mark.parametrize("unit", units(), ids=lambda p: p.name)
def test_units_have_what_the_issue_asks(unit: Path) -> None:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(unit.read_text())
    svc = cp["Service"]
    assert svc["Type"] in {"simple", "notify"}
    assert "Type=simple" in unit.read_text() and "Type=simple:" in unit.read_text()  # with its reason
    assert svc["Restart"] == "on-failure"
    assert svc["EnvironmentFile"].startswith("-/etc/default/")
    assert svc["ProtectSystem"] == "full" and svc["NoNewPrivileges"] == "yes"
    if unit.name == "slurm-elastic-controller.service":
        assert svc["ExecReload"] == "/bin/kill -HUP $MAINPID" and svc["PrivateTmp"] == "yes"
    else:
        assert "ExecReload" not in svc and "No ExecReload" in unit.read_text()  # the agent has no HUP handler
    assert (REPO / "packaging" / "default" / unit.stem).exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_units_verify_with_systemd_analyze(tmp_path: Path) -> None:
    assert SLURM_ELASTIC.exists(), SLURM_ELASTIC
    for unit in units():  # ExecStart must exist for verify: point it at this checkout's entry point
        (tmp_path / unit.name).write_text(unit.read_text().replace("/usr/bin/slurm-elastic", str(SLURM_ELASTIC)))
    cp = subprocess.run(["systemd-analyze", "verify", *map(str, sorted(tmp_path.glob("*.service")))],
                        capture_output=True, text=True, timeout=120, check=False)
    assert cp.returncode == 0, cp.stderr
    ours = [line for line in (cp.stdout + cp.stderr).splitlines() if "slurm-elastic" in line]
    assert ours == [], "\n".join(ours)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_verify_check_does_catch_a_bad_unit(tmp_path: Path) -> None:
    bad = tmp_path / "slurm-elastic-bad.service"
    bad.write_text("[Service]\nType=bogus\nExecStart=/bin/true\nRestartt=always\n")
    cp = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, timeout=120,
                        check=False)
    assert "slurm-elastic" in cp.stdout + cp.stderr
