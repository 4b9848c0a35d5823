"""Agent configuration: defaults, TOML file, flags; unknown keys and bad values refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.agent.config import AgentConfig, describe, load_config
from slurm_elastic.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return p


def test_defaults() -> None:
    c = load_config(None, {}, "gpu017")
    assert c == AgentConfig(node="gpu017")
    assert (c.interval_s, c.port, c.on_nvml_missing) == (5.0, 9817, "fail")
    # /metrics: this host only, no token, the series without job/user/account labels
    assert (c.metrics_listen, c.metrics_port, c.metrics_token_file, c.metrics_anonymous) == (
        "127.0.0.1", 9819, None, "reduced")


def test_file_then_flags(tmp_path: Path) -> None:
    p = write(tmp_path, 'version = 1\nnode = "n3"\nport = 18003\ninterval_s = 2\nkey_file = "/k"\n'
                        'on_nvml_missing = "degraded"\nmetrics_listen = "0.0.0.0"\nmetrics_token_file = "/t"\n')
    c = load_config(p, {"port": 18013, "window_s": None, "metrics_anonymous": "none"}, "host")
    assert (c.node, c.port, c.interval_s, c.key_file, c.on_nvml_missing) == ("n3", 18013, 2.0, Path("/k"), "degraded")
    assert (c.metrics_listen, c.metrics_token_file, c.metrics_anonymous) == ("0.0.0.0", Path("/t"), "none")


@pytest.mark.parametrize(("text", "message"), [
    ('node = "n1"\n', "needs 'version = 1'"),
    ("version = 2\n", "needs 'version = 1'"),
    ("version = 1\nprot = 1\n", "unknown key.*prot"),
    ('version = 1\nport = "80"\n', "port must be a int"),
    ("version = 1\nport = 70000\n", "port must be within"),
    ("version = 1\ninterval_s = 0\n", "interval_s must be >= 0.05"),
    ("version = 1\nmetrics_auth = true\n", "metrics_auth is gone; use metrics_token_file and metrics_anonymous"),
    ('version = 1\nmetrics_anonymous = "open"\n', "metrics_anonymous must be 'reduced', 'none' or 'all'"),
    ("version = 1\nmetrics_port = -1\n", "metrics_port must be within 0..65535"),
    ('version = 1\nmetrics_listen = ""\n', "metrics_listen must not be empty"),
    ('version = 1\non_nvml_missing = "ignore"\n', "on_nvml_missing must be 'fail' or 'degraded'"),
    ('version = 1\nnode = "../etc"\n', "node must be a plain node name"),
    ("version = 1\ninterval_s = 10\nwindow_s = 5\n", "window_s .* must be at least interval_s"),
    ("version = 1\nport = \n", "agent.toml"),
])
def test_bad_files(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), {}, "host")


def test_bad_flag_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="command line: nvml_timeout_s must be > 0"):
        load_config(None, {"nvml_timeout_s": -1.0}, "host")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.toml", {}, "host")


def test_every_key_is_documented() -> None:
    doc = describe()
    for name in AgentConfig.__dataclass_fields__:
        assert f"\n{name} = " in "\n" + doc
