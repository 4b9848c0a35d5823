"""`slurm-elastic db version|upgrade`."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import text

from slurm_elastic.cli import main
from slurm_elastic.store import CURRENT_SCHEMA_VERSION, SqlStore, sqlite_url


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, ["db", *args])
    return r.exit_code, r.stdout, r.stderr


def test_upgrade_creates_then_is_a_no_op(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "state.db")
    code, out, _ = run("version", "--url", url)
    assert code == 0 and "schema:    none (empty database)" in out
    code, out, _ = run("upgrade", "--url", url)
    assert code == 0 and out.startswith(f"created schema version {CURRENT_SCHEMA_VERSION} in ")
    code, out, _ = run("upgrade", "--url", url)
    assert code == 0 and out.startswith(f"schema already at version {CURRENT_SCHEMA_VERSION}")
    code, out, _ = run("version", "--url", url)
    assert code == 0 and f"schema:    {CURRENT_SCHEMA_VERSION}" in out


def test_url_from_environment_and_prefix(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "state.db")
    r = CliRunner().invoke(main, ["db", "upgrade", "--table-prefix", "se_"], env={"SLURM_ELASTIC_DB_URL": url})
    assert r.exit_code == 0, r.stderr
    st = SqlStore.open(url, table_prefix="se_", create=False)
    assert st.schema_version() == CURRENT_SCHEMA_VERSION
    st.close()


def test_newer_schema_is_an_error(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "state.db")
    st = SqlStore.open(url)
    with st.db.engine.begin() as conn:
        conn.execute(text("UPDATE schema_version SET version = 99"))
    st.close()
    code, _, err = run("upgrade", "--url", url)
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("slurm-elastic db upgrade: error: the state DB schema is version 99")
    code, out, err = run("version", "--url", url)
    assert code == 1 and "schema:    99" in out and "newer" in err


def test_unreachable_database_is_one_line_without_password(tmp_path: Path) -> None:
    code, _, err = run("upgrade", "--url", "mysql+pymysql://slurm:hunter2@127.0.0.1:1/x")
    assert code == 1 and err.count("\n") == 1
    assert "(connection_lost)" in err and "hunter2" not in err
    code, _, err = run("upgrade", "--url", "not a url")
    assert code == 1 and "not a valid SQLAlchemy URL" in err


def test_usage_error_is_exit_2() -> None:
    assert run("frobnicate")[0] == 2
