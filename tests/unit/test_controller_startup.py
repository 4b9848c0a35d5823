"""A start the controller refuses leaves nothing behind: every check that may refuse it (config, key file,
policy file) runs before the state DB is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.agent.auth import generate_key_file
from slurm_elastic.controller.config import AgentsConfig, ControllerConfig
from slurm_elastic.controller.daemon import build_controller
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import parse_config
from slurm_elastic.store import sqlite_url


def config(tmp_path: Path, policy: str) -> ControllerConfig:
    generate_key_file(tmp_path / "agent.key")
    (tmp_path / "policy.toml").write_text(policy)
    return ControllerConfig(db_url=sqlite_url(tmp_path / "state.db"), policy_file=tmp_path / "policy.toml",
                            agents=AgentsConfig(key_file=tmp_path / "agent.key"))


@pytest.mark.parametrize(("policy", "match"), [
    ("version = 1\nscale_up_above = 500\n", "scale_up_above"),
    ("version = 1\nno_such_key = 1\n", "no_such_key"),
    ("version = [\n", "TOML"),
])
def test_a_bad_policy_file_is_refused_before_the_state_db_exists(tmp_path: Path, policy: str, match: str) -> None:
    cfg = config(tmp_path, policy)
    with pytest.raises(ConfigError, match=match):
        build_controller(cfg)
    assert not (tmp_path / "state.db").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.key", "policy.toml"]


def test_an_unreadable_policy_file_is_refused_before_the_state_db_exists(tmp_path: Path) -> None:
    cfg = config(tmp_path, "version = 1\n")
    (tmp_path / "policy.toml").unlink()
    with pytest.raises(ConfigError, match="cannot read"):
        build_controller(cfg)
    assert not (tmp_path / "state.db").exists()


def test_a_good_policy_file_starts_and_creates_the_state_db(tmp_path: Path) -> None:
    text = "version = 1\nscale_up_above = 90\n"
    ctl = build_controller(config(tmp_path, text))
    try:
        assert (tmp_path / "state.db").exists() and ctl.policy.base == parse_config(text).base
    finally:
        ctl.store.close()


def test_a_missing_or_loose_key_file_is_refused_naming_the_key_before_the_state_db_exists(tmp_path: Path) -> None:
    cfg = config(tmp_path, "version = 1\n")
    key = tmp_path / "agent.key"
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=rf"agents\.key_file: key file {key} has mode 0644.*chmod 600"):
        build_controller(cfg)
    key.unlink()
    with pytest.raises(ConfigError, match=rf"agents\.key_file: key file {key} does not exist \(create one: "):
        build_controller(cfg)
    assert not (tmp_path / "state.db").exists()
