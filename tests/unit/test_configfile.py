"""The shared config layer (slurm_elastic/configfile.py) and the loaders built on it: did-you-mean, line numbers,
the [agents] and [store] sections controller.toml and mig.toml share, and the old spellings of the DB URL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurm_elastic.agent.config import KEYS as AGENT_FILE_KEYS
from slurm_elastic.agent.config import load_config
from slurm_elastic.configfile import AGENT_KEYS, Key, KeyLines, Kind, Problems, check_table
from slurm_elastic.controller.config import parse_controller_config
from slurm_elastic.errors import ConfigError
from slurm_elastic.keyschema import AGENT_KEY_FILE
from slurm_elastic.mig.config import parse_mig_config

TEXT = """version = 1
# a comment = not a key
[controller]
interval_s = 30

[agents]
  timeout_s = 5
[agents.urls]
"n-1" = "http://x"
[mig.commands]
slurmd_stop = ["a"]
"""


def test_key_lines_find_keys_in_their_section() -> None:
    lines = KeyLines(TEXT)
    assert lines.line(["version"]) == 1
    assert lines.line(["controller", "interval_s"]) == 4
    assert lines.line(["agents", "timeout_s"]) == 7
    assert lines.line(["agents", "urls", "n-1"]) == 9
    assert lines.line(["mig", "commands", "slurmd_stop"]) == 11
    assert lines.line(["controller", "timeout_s"]) is None and lines.line(["a comment"]) is None


def test_check_table_types_ranges_and_suggestions() -> None:
    keys = {"timeout_s": Key(Kind.NUMBER, 5.0, "t", 0.1, 300), "flag": Key(Kind.BOOL, False, "f")}
    problems = Problems("x.toml", KeyLines("[s]\ntimeout_s = 0\nflag = 1\ntimout_s = 2\n"))
    assert check_table({"timeout_s": 0, "flag": 1, "timout_s": 2}, keys, "s", problems) == {}
    assert problems.items == ["line 2: s.timeout_s: 0 out of range 0.1..300",
                              "line 3: s.flag: wrong type int (expected true or false)",
                              "line 4: s.timout_s: unknown key (did you mean 'timeout_s'?) (known: timeout_s, flag)"]
    with pytest.raises(ConfigError, match=r"^x\.toml: line 2: s\.timeout_s"):
        problems.raise_if_any()


def test_controller_errors_carry_lines_and_suggestions() -> None:
    text = "version = 1\n[controller]\ninterval_s = 30\nintervl_s = 5\n[agents]\ntimeout_s = 0\n"
    with pytest.raises(ConfigError) as e:
        parse_controller_config(text, "controller.toml")
    msg = str(e.value)
    assert "line 4: controller.intervl_s: unknown key (did you mean 'interval_s'?)" in msg
    assert "line 6: agents.timeout_s: 0 out of range 0.1..300" in msg
    with pytest.raises(ConfigError, match=re.escape("line 2: agent: unknown section (did you mean 'agents'?)")):
        parse_controller_config("version = 1\n[agent]\n", "controller.toml")


def test_store_section_is_shared_and_the_old_spelling_warns() -> None:
    new = 'version = 1\n[store]\nurl = "sqlite:////tmp/a.db"\ntable_prefix = "p_"\n'
    ctl, mig = parse_controller_config(new), parse_mig_config(new, env={})
    assert (ctl.db_url, ctl.table_prefix) == (mig.db_url, mig.table_prefix) == ("sqlite:////tmp/a.db", "p_")
    warned: list[str] = []
    old = parse_controller_config('version = 1\n[controller]\ndb_url = "sqlite:////tmp/b.db"\ntable_prefix = "q"\n',
                                  "controller.toml", warn=warned.append)
    assert (old.db_url, old.table_prefix) == ("sqlite:////tmp/b.db", "q")
    assert [w.split(": ", 1)[1].split(" is ")[0] for w in warned] == ["controller.db_url", "controller.table_prefix"]
    assert "write it as [store] url = ... instead" in warned[0]
    with pytest.raises(ConfigError, match=r"line 3: controller\.db_url: set twice: remove it and keep store\.url"):
        parse_controller_config('version = 1\n[controller]\ndb_url = "a"\n[store]\nurl = "b"\n', "c.toml")
    with pytest.raises(ConfigError, match=r"store\.table_prefix: up to 16"):
        parse_controller_config('version = 1\n[store]\ntable_prefix = "Bad-"\n')


def test_agents_section_means_the_same_in_both_files() -> None:
    text = ('version = 1\n[agents]\nkey_file = "/k"\nurl_template = "http://{address}:1"\ntimeout_s = 3\n'
            'apply_timeout_s = 60\n[agents.urls]\nn9 = "http://10.0.0.9:2"\n')
    ctl, mig = parse_controller_config(text).agents, parse_mig_config(text, env={}).agents
    for node, address in (("n1", "10.0.0.1"), ("n9", "x")):
        assert ctl.url_for(node, address) == mig.url_for(node, address)
    assert ctl.timeout_s == mig.timeout_s == 3.0 and mig.apply_timeout_s == 60.0
    assert str(ctl.key_file) == str(mig.key_file) == "/k"
    # unset: each keeps its own read timeout, and the documented template
    assert (parse_controller_config("version = 1\n").agents.timeout_s,
            parse_mig_config("version = 1\n", env={}).agents.timeout_s) == (5.0, 10.0)
    assert AGENT_KEYS["url_template"].default == parse_controller_config("version = 1\n").agents.url_template


def test_the_agents_key_file_has_one_default_in_every_program() -> None:
    """The controller, the MIG workflow (and the CLI commands that read their files) and the agent read the same
    key file when none is set: the key schema's one default. An empty one is refused, not taken for unset."""
    default = Path(AGENT_KEY_FILE)
    assert AGENT_KEYS["key_file"].default == AGENT_FILE_KEYS["key_file"].default == AGENT_KEY_FILE
    assert parse_controller_config("version = 1\n").agents.key_file == default
    assert parse_mig_config("version = 1\n", env={}).agents.key_file == default
    assert load_config(None, {}, "n1").key_file == default
    for parse in (parse_controller_config, lambda text: parse_mig_config(text, env={})):
        with pytest.raises(ConfigError, match=r"line 3: agents\.key_file: must not be empty"):
            parse('version = 1\n[agents]\nkey_file = " "\n')


def test_agent_file_unknown_key_names_its_line_and_the_close_one(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text('version = 1\nnode = "n1"\nintervall_s = 5\n')
    with pytest.raises(ConfigError, match=re.escape("unknown key(s) intervall_s (did you mean 'interval_s'?) "
                                                    "(line 3)")):
        load_config(f, {}, "n1")
