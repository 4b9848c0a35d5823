"""``slurm-elastic doctor`` end to end on recorded Slurm replies and a real SQLite state DB: the probes of the DB
(schema, a rolled-back write), the output formats and the exit status."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_elastic.cli import main
from slurm_elastic.doctor import probes
from slurm_elastic.doctor.model import Verdict
from slurm_elastic.doctor.site_checks import database
from slurm_elastic.store import CURRENT_SCHEMA_VERSION, SqlStore
from tests.unit.doctor_replies import NO_DBD, RecordedRunner


def _store(path: Path) -> str:
    url = f"sqlite:///{path}"
    SqlStore.open(url).close()
    return url


def test_database_probe_reads_the_schema_and_writes_nothing(tmp_path: Path) -> None:
    url = _store(tmp_path / "state.db")
    before = (tmp_path / "state.db").read_bytes()
    facts = probes.database(url)
    assert facts.version == CURRENT_SCHEMA_VERSION and facts.error is None and facts.write_error is None
    assert database(facts, CURRENT_SCHEMA_VERSION).status is Verdict.OK
    with sqlite3.connect(tmp_path / "state.db") as db:
        assert db.execute("SELECT version FROM schema_version").fetchone() == (CURRENT_SCHEMA_VERSION,)
    assert (tmp_path / "state.db").read_bytes() == before


def test_database_probe_finds_a_read_only_db(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _store(path)
    facts = probes.database(f"sqlite:///file:{path}?mode=ro&uri=true")
    assert facts.version == CURRENT_SCHEMA_VERSION
    assert facts.write_error is not None and "readonly" in facts.write_error
    assert database(facts, CURRENT_SCHEMA_VERSION).status is Verdict.FAIL


def test_database_probe_finds_an_old_schema_and_a_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _store(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE schema_version SET version = ?", (CURRENT_SCHEMA_VERSION - 1,))
    f = database(probes.database(f"sqlite:///{path}"), CURRENT_SCHEMA_VERSION)
    assert f.status is Verdict.FAIL and "db upgrade" in f.fix
    missing = tmp_path / "nodir" / "state.db"
    f = database(probes.database(f"sqlite:///{missing}"), CURRENT_SCHEMA_VERSION)
    assert f.status is Verdict.FAIL and f"directory {missing.parent} does not exist" in f.detail
    assert not missing.parent.exists()  # the probe creates nothing
    fresh = tmp_path / "fresh.db"
    f = database(probes.database(f"sqlite:///{fresh}"), CURRENT_SCHEMA_VERSION)
    assert f.status is Verdict.WARN and not fresh.exists()


def _config(tmp_path: Path, db_url: str, *, mode: int = 0o600) -> Path:
    cfg = tmp_path / "controller.toml"
    cfg.write_text(f'version = 1\n[store]\nurl = "{db_url}"\n[api]\nslurm_user = "root"\n'
                   '[metrics_source]\nkind = "prometheus"\nurl = "http://127.0.0.1:9"\n')
    cfg.chmod(mode)
    return cfg


def _run(args: list[str], runner: RecordedRunner) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["doctor", *args], obj=probes.ProbeCommands(runner))
    return result.exit_code, result.output


@pytest.mark.skipif(os.geteuid() != 0, reason="the operator check passes only as root (the controller's user)")
def test_cli_parsable_json_and_exit_status(tmp_path: Path) -> None:
    cfg = _config(tmp_path, _store(tmp_path / "state.db"))
    runner = RecordedRunner("22.05")
    rc, out = _run(["-c", str(cfg), "-P"], runner)
    lines = out.splitlines()
    assert lines[0] == "check|status|detail|fix"
    rows = {line.split("|")[0]: line.split("|") for line in lines[1:]}
    assert {"slurm_config", "select_type", "proctrack", "job_submit", "prolog", "epilog", "power_saving",
            "accounting", "munge", "controller_config", "operator", "database", "agents"} <= set(rows)
    assert rows["database"][1] == "OK" and rows["select_type"][1] == "OK"
    assert rc == max(Verdict[r[1]] for r in rows.values())
    # sacct failing (recorded against a closed accounting port): FAIL, exit status 2, in JSON too.
    broken = RecordedRunner("22.05", {probes.SACCT_ARGV: NO_DBD})
    rc, out = _run(["-c", str(cfg), "--json"], broken)
    doc = {r["check"]: r for r in json.loads(out)}
    assert rc == 2 and doc["accounting"]["status"] == "FAIL" and "Connection refused" in doc["accounting"]["detail"]
    assert set(doc["accounting"]) == {"check", "status", "detail", "fix"}


def test_cli_without_a_controller_config_fails_with_the_install_line(tmp_path: Path) -> None:
    rc, out = _run(["-c", str(tmp_path / "none.toml"), "-P", "-n"], RecordedRunner("22.05"))
    row = next(line.split("|") for line in out.splitlines() if line.startswith("controller_config|"))
    assert rc == 2 and row[1] == "FAIL" and row[3].startswith("install -m 0600 ")
    assert not out.startswith("check|")
    assert "controller.toml" in row[3]


def test_cli_warns_about_a_readable_config_with_a_db_password(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "mysql+pymysql://se:secret@127.0.0.1:9/se", mode=0o644)
    rc, out = _run(["-c", str(cfg), "--json"], RecordedRunner("22.05"))
    doc = {r["check"]: r for r in json.loads(out)}
    assert doc["controller_config"]["status"] == "WARN" and doc["controller_config"]["fix"] == f"chmod 0600 {cfg}"
    assert doc["database"]["status"] == "FAIL" and "secret" not in out
    assert rc == 2
