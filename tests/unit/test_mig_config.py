"""The MIG workflow's configuration: strict keys, argument-list commands, defaults from SLURM_CONF."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurm_elastic.errors import ConfigError
from slurm_elastic.mig.config import describe, load_mig_config, parse_mig_config

GOOD = """version = 1
[mig]
slurm_conf = "/etc/slurm/slurm.conf"
device_files = "/var/tmp/cl/dev/{node}/gpu{ordinal}"
mps_per_gpu = 100
wait_timeout_s = 600
[mig.commands]
slurmd_stop = ["ssh", "{node}", "systemctl", "stop", "slurmd"]
timeout_s = 30
[agents]
key_file = "/etc/slurm-elastic/agent.key"
url_template = "http://{node}:9817"
[agents.urls]
n4 = "http://127.0.0.1:18104"
"""


def test_a_full_file() -> None:
    cfg = parse_mig_config(GOOD, "mig.toml", env={})
    s = cfg.settings
    assert (s.slurm_conf, s.gres_conf, s.mps_per_gpu, s.wait_timeout_s) == (
        "/etc/slurm/slurm.conf", "/etc/slurm/gres.conf", 100, 600.0)
    assert s.device_files == "/var/tmp/cl/dev/{node}/gpu{ordinal}" and s.apply_mode == "restart"
    assert cfg.commands.slurmd_stop == ("ssh", "{node}", "systemctl", "stop", "slurmd")
    assert cfg.commands.slurmctld_restart == ("systemctl", "restart", "slurmctld")  # default kept
    assert cfg.agents.url_for("n4") == "http://127.0.0.1:18104" and cfg.agents.url_for("g7") == "http://g7:9817"


def test_defaults_follow_slurm_conf() -> None:
    cfg = parse_mig_config("version = 1\n", env={"SLURM_CONF": "/opt/slurm/etc/slurm.conf"})
    assert (cfg.settings.slurm_conf, cfg.settings.gres_conf) == ("/opt/slurm/etc/slurm.conf",
                                                                 "/opt/slurm/etc/gres.conf")
    assert cfg.settings.device_files == "nvidia-caps"


@pytest.mark.parametrize(("text", "message"), [
    ("", "version: must be 1"),
    ("version = 1\n[mig]\nbogus = 1\n", "line 3: mig.bogus: unknown key"),
    ("version = 1\n[mig]\nwait_timeout = 1\n",
     "line 3: mig.wait_timeout: unknown key (did you mean 'wait_timeout_s'?)"),
    ("version = 1\n[stor]\n", "stor: unknown section (did you mean 'store'?)"),
    ("version = 1\n[agents]\nurl_template = \"http://{host}:1\"\n", "line 3: agents.url_template: only {node} and "
     "{address} may be used"),
    ("version = 1\n[migs]\n", "migs: unknown section"),
    ("version = 1\n[mig]\nmps_per_gpu = true\n", "got a boolean"),
    ("version = 1\n[mig]\nwait_timeout_s = -1\n", "out of range"),
    ("version = 1\n[mig]\napply_mode = \"reboot\"\n", "apply_mode"),
    ("version = 1\n[mig]\ndevice_files = \"dev/{ordinal}\"\n", "absolute path template"),
    ("version = 1\n[mig.commands]\nslurmd_stop = \"ssh {node} systemctl stop slurmd\"\n", "argument list"),
    ("version = 1\n[mig.commands]\nslurmd_stop = [\"rm\", \"{path}\"]\n", "only {node} may be used"),
    ("version = 1\n[agents.urls]\nn4 = \"ftp://x\"\n", "http(s) URL"),
    ("version = 1\n[mig\n", "invalid TOML"),
])
def test_bad_files_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_mig_config(text, "mig.toml", env={})


def test_load_from_the_environment_variable(tmp_path: Path) -> None:
    f = tmp_path / "m.toml"
    f.write_text(GOOD)
    assert load_mig_config(None, env={"SLURM_ELASTIC_MIG_CONFIG": str(f)}).source == str(f)
    with pytest.raises(ConfigError, match="cannot read"):
        load_mig_config(tmp_path / "missing.toml", env={})


def test_every_key_has_a_doc_line() -> None:
    text = describe()
    for key in ("slurm_conf", "gres_conf", "device_files", "mps_per_gpu", "apply_mode", "url", "table_prefix",
                "slurmd_stop", "slurmctld_restart", "url_template"):
        assert key in text


def test_auto_apply_idle_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"line 4: mig.auto_apply_idle: removed: nothing applies MIG suggestions "
                                          r"automatically; remove the line"):
        parse_mig_config("version = 1\n[mig]\nmps_per_gpu = 0\nauto_apply_idle = false\n", "mig.toml", env={})


def test_store_section_and_the_old_db_url_spelling() -> None:
    cfg = parse_mig_config('version = 1\n[store]\nurl = "sqlite:////tmp/s.db"\ntable_prefix = "t_"\n', env={})
    assert (cfg.db_url, cfg.table_prefix) == ("sqlite:////tmp/s.db", "t_")
    warnings: list[str] = []
    old = parse_mig_config('version = 1\n[mig]\ndb_url = "sqlite:////tmp/o.db"\n', "mig.toml", env={},
                           warn=warnings.append)
    assert old.db_url == "sqlite:////tmp/o.db"
    assert warnings == ["mig.toml: mig.db_url is deprecated and will be refused in the next release; write it as "
                        "[store] url = ... instead"]
    with pytest.raises(ConfigError, match=r"line 3: mig.db_url: set twice: remove it and keep store.url"):
        parse_mig_config('version = 1\n[mig]\ndb_url = "a"\n[store]\nurl = "b"\n', "mig.toml", env={})


def test_agent_urls_take_the_node_address() -> None:
    cfg = parse_mig_config("version = 1\n", env={})
    assert cfg.agents.needs_address and cfg.agents.timeout_s == 10.0
    assert cfg.agents.url_for("g7", "10.0.0.7") == "http://10.0.0.7:9817"
    assert cfg.agents.url_for("g7") == "http://g7:9817"  # no NodeAddr: Slurm's default is the node name
