"""The doctor's pure checks on Slurm configurations recorded from the live test clusters (22.05, 24.11, 26.05):
each recorded cluster passes, and a setting changed the way a misconfigured site has it gives WARN/FAIL with the
slurm.conf line, file mode or right to change."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from slurm_elastic import __version__
from slurm_elastic.doctor.model import Verdict, parse_show_config, value, worst
from slurm_elastic.doctor.site_checks import (
    AgentFacts,
    DbFacts,
    Identity,
    agents,
    clock,
    database,
    operator,
)
from slurm_elastic.doctor.slurm_checks import (
    LUA_VERSION_RE,
    HookFile,
    accounting,
    hook,
    job_submit,
    power_saving,
    proctrack,
    select_type,
    slurm_auth,
    slurm_checks,
)
from tests.unit.doctor_replies import FIXTURES, NO_DBD, RELEASES, recorded, show_config

REPO = Path(__file__).resolve().parents[2]
LUA = (REPO / "plugins" / "job_submit.lua").read_text()
OURS = [HookFile("/etc/slurm/prolog.sh", exists=True, mode=0o100755, ours=True)]


def test_every_release_has_a_recorded_config() -> None:
    assert set(RELEASES) >= {"22.05", "24.11", "26.05"}


@pytest.mark.parametrize("release", RELEASES)
def test_the_test_clusters_configs_pass(release: str) -> None:
    config = parse_show_config(show_config(release))
    assert value(config, "SLURM_VERSION").startswith(release)
    findings = slurm_checks(config, lua_path="/etc/slurm/job_submit.lua", lua_text=LUA,
                            package_version=__version__, prolog=OURS, epilog=OURS,
                            sacct_error=None, munge_error=None)
    assert [f.check for f in findings] == ["select_type", "proctrack", "job_submit", "prolog", "epilog",
                                           "power_saving", "accounting", "munge"]
    assert [f for f in findings if f.status is not Verdict.OK] == []
    # The 22.05 clusters save power on n5, n6 (docs/power-saving.md) with PrivateData=cloud; the release
    # clusters do not save power.
    power = "PrivateData includes cloud" if release == "22.05" else "power saving off"
    assert power in findings[5].detail
    # 24.11 and 26.05 print list settings one entry a line (Prolog[0] = ...).
    assert value(config, "Prolog").endswith("/etc/prolog.sh") and value(config, "Epilog").endswith("/etc/epilog.sh")


def test_parse_show_config_reads_keys_and_unset_values() -> None:
    config = parse_show_config(show_config("22.05"))
    assert config["SelectType"] == "select/cons_tres"
    assert value(config, "SuspendExcParts") == ""  # (null)
    assert value(config, "NoSuchKey") == ""


@pytest.mark.parametrize("release", RELEASES)
def test_select_and_proctrack_name_the_slurm_conf_line(release: str) -> None:
    config = parse_show_config(show_config(release))
    f = select_type({**config, "SelectType": "select/linear"})
    assert f.status is Verdict.FAIL and "SelectType=select/linear" in f.detail
    assert "slurm.conf: SelectType=select/cons_tres" in f.fix
    f = proctrack({**config, "ProctrackType": "proctrack/linuxproc"})
    assert f.status is Verdict.FAIL and "slurm.conf: ProctrackType=proctrack/cgroup" in f.fix
    f = proctrack({**config, "TaskPlugin": "task/affinity"})
    assert f.status is Verdict.WARN and "ConstrainDevices=yes" in f.fix


def test_job_submit_plugin_missing_unlisted_or_of_another_version() -> None:
    config = parse_show_config(show_config("22.05"))
    path = "/etc/slurm/job_submit.lua"
    assert job_submit(config, path, LUA, __version__).status is Verdict.OK
    f = job_submit(config, path, None, __version__)
    assert f.status is Verdict.FAIL and f"{path} is missing" in f.detail and f"to {path}" in f.fix
    f = job_submit({**config, "JobSubmitPlugins": "(null)"}, path, LUA, __version__)
    assert f.status is Verdict.WARN and "JobSubmitPlugins=lua" in f.fix
    f = job_submit(config, path, LUA, "9.9.9")
    assert f.status is Verdict.WARN and f"version {__version__}, this package 9.9.9" in f.detail
    unversioned = LUA_VERSION_RE.sub("", LUA)
    f = job_submit(config, path, unversioned, __version__)
    assert f.status is Verdict.WARN and "unversioned" in f.detail
    f = job_submit(config, path, "function slurm_job_submit() return slurm.SUCCESS end", __version__)
    assert f.status is Verdict.WARN and "not slurm-elastic's" in f.detail


def test_the_plugin_carries_the_package_version() -> None:
    m = LUA_VERSION_RE.search(LUA)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert m is not None and m.group(1) == __version__ == project


def test_prolog_and_epilog() -> None:
    config = parse_show_config(show_config("22.05"))
    assert hook(config, "Prolog", OURS).status is Verdict.OK
    f = hook({**config, "Prolog": "(null)"}, "Prolog", [])
    assert f.status is Verdict.WARN and "slurm.conf: Prolog=" in f.fix
    f = hook(config, "Epilog", [HookFile(value(config, "Epilog"), exists=False)])
    assert f.status is Verdict.WARN and "not on this host" in f.detail
    bad = HookFile(value(config, "Prolog"), exists=True, mode=0o100644, ours=True)
    f = hook(config, "Prolog", [bad])
    assert f.status is Verdict.FAIL and "mode 0644" in f.detail and f.fix == f"chmod 0755 {bad.path}"
    writable = HookFile(bad.path, exists=True, mode=0o100777, ours=True)
    assert hook(config, "Prolog", [writable]).status is Verdict.FAIL
    other = HookFile(bad.path, exists=True, mode=0o100755, ours=False)
    assert hook(config, "Prolog", [other]).status is Verdict.WARN


def test_power_saving_needs_private_data_cloud() -> None:
    on = parse_show_config((FIXTURES / "22.05" / "scontrol_show_config_power.txt").read_text())
    assert power_saving(on).status is Verdict.OK
    f = power_saving({**on, "PrivateData": "none"})
    assert f.status is Verdict.FAIL and "SuspendTime=20 sec" in f.detail and "PrivateData=cloud" in f.fix
    off = parse_show_config((FIXTURES / "22.05" / "scontrol_show_config.txt").read_text())
    f = power_saving(off)
    assert f.status is Verdict.OK and "power saving off" in f.detail


def test_accounting_from_the_config_and_a_recorded_sacct_failure() -> None:
    config = parse_show_config(show_config("22.05"))
    no_dbd = NO_DBD.read_text().splitlines()[-2]
    f = accounting(config, no_dbd)
    assert f.status is Verdict.FAIL and "Connection refused" in f.detail
    assert f"{value(config, 'AccountingStorageHost')}:{value(config, 'AccountingStoragePort')}" in f.fix
    f = accounting({**config, "AccountingStorageType": "accounting_storage/none"}, None)
    assert f.status is Verdict.FAIL and "AccountingStorageType=accounting_storage/slurmdbd" in f.fix


def test_munge() -> None:
    config = parse_show_config(show_config("22.05"))
    f = slurm_auth(config, "munge encode: Failed to connect to socket (munge status 6)")
    assert f.status is Verdict.FAIL and "systemctl start munge" in f.fix
    assert slurm_auth({**config, "AuthType": "auth/slurm"}, None).status is Verdict.OK


@pytest.mark.parametrize("release", RELEASES)
def test_operator_rights(release: str) -> None:
    config = parse_show_config(show_config(release))
    assert [f.status for f in operator(config, Identity("root", 0, None), "root")] == [Verdict.OK]
    level = recorded(release, "sacctmgr-adminlevel-bob.txt").strip()
    [f] = operator(config, Identity("bob", 1001, level), "root")
    assert f.status is Verdict.FAIL and "runs as bob" in f.detail
    assert "sacctmgr modify user bob set AdminLevel=Operator" in f.detail and "as root" in f.fix
    [_, mismatch] = operator(config, Identity("root", 0, None), "slurm")
    assert mismatch.status is Verdict.WARN and 'slurm_user = "root"' in mismatch.fix


def test_database_findings() -> None:
    assert database(DbFacts("sqlite:////x.db", version=3), 3).status is Verdict.OK
    f = database(DbFacts("sqlite:////x.db", version=2), 3)
    assert f.status is Verdict.FAIL and "slurm-elastic db upgrade --url 'sqlite:////x.db'" in f.fix
    assert database(DbFacts("sqlite:////x.db", version=4), 3).status is Verdict.FAIL
    assert database(DbFacts("sqlite:////x.db", version=None), 3).status is Verdict.WARN
    f = database(DbFacts("sqlite:////x.db", version=3, write_error="attempt to write a readonly database",
                         file_note=" (file /x.db mode 0444 owner root)"), 3)
    assert f.status is Verdict.FAIL and "mode 0444" in f.detail and "chmod 0600" in f.fix


def test_agents_and_clock() -> None:
    good = AgentFacts("n1", "http://n1:9817", version=__version__, offset_s=0.3)
    refused = AgentFacts("n2", "http://n2:9817", "auth", "refused our credentials: bad signature")
    down = AgentFacts("n3", "http://n3:9817", "unreachable", "Cannot connect to host n3:9817")
    old = AgentFacts("n4", "http://n4:9817", version="0.0.9", offset_s=-12.4)
    out = agents([good, refused, down, old], auth="hmac", key_note="key_file /etc/slurm-elastic/agent.key",
                 package_version=__version__, source="/etc/slurm-elastic/controller.toml")
    assert [(f.check, f.status) for f in out] == [("agent:n1", Verdict.OK), ("agent:n2", Verdict.FAIL),
                                                  ("agent:n3", Verdict.FAIL), ("agent:n4", Verdict.WARN)]
    assert "key_file /etc/slurm-elastic/agent.key" in out[1].fix
    assert "systemctl start slurm-elastic-agent on n3" in out[2].fix
    f = clock([good, old])
    assert f.status is Verdict.FAIL and "-12.4 s (n4)" in f.detail and "synchronize n4" in f.fix
    assert clock([good]).status is Verdict.OK
    assert clock([AgentFacts("n1", "u", version="x", offset_s=2.0)]).status is Verdict.WARN
    assert clock([refused]).status is Verdict.WARN
    assert worst(out) is Verdict.FAIL


def test_fixes_name_no_checkout_path() -> None:
    config = parse_show_config(show_config("22.05"))
    findings = slurm_checks({**config, "SelectType": "x", "JobSubmitPlugins": ""}, lua_path="/etc/slurm/job_submit.lua",
                            lua_text=None, package_version=__version__, prolog=[], epilog=[],
                            sacct_error="x", munge_error="y")
    assert all(not re.search(r"/work/|/root/", f.fix) for f in findings)
