"""``explain`` after a job ended (failed, completed, cancelled): it holds no node now; its last size and when it
ended are shown, in the API's answer and in the CLI's table."""

from __future__ import annotations

from click.testing import CliRunner

from slurm_elastic.store import SqlStore
from tests.unit.test_api_service import ALICE, service, store  # noqa: F401  (store is a fixture)


def test_explain_shows_an_ended_job_at_zero_nodes_with_its_last_size(store: SqlStore) -> None:  # noqa: F811
    svc = service(store)
    assert svc.handle(ALICE, "explain", {"job": 10})["nodes"] == {"min": 1, "current": 2, "max": 3}
    store.jobs.mark_job_ended(10, "FAILED")
    r = svc.handle(ALICE, "explain", {"job": 10})
    assert r["state"] == "FAILED"
    assert r["nodes"]["current"] == 0 and r["nodes"]["last"] == 2 and r["nodes"]["ended"]


def test_the_cli_prints_the_end(store: SqlStore, monkeypatch) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from slurm_elastic.cli import decisions_cmd

    store.jobs.mark_job_ended(10, "FAILED")
    svc = service(store)
    monkeypatch.setattr(decisions_cmd, "call", lambda url, sock, op, args: svc.handle(ALICE, op, args))
    out = CliRunner().invoke(decisions_cmd.explain_cmd, ["10"]).output
    line = next(ln for ln in out.splitlines() if ln.startswith("nodes"))
    assert "current 0" in line and "last size 2" in line and "ended " in line
    assert any(ln.split()[:2] == ["state", "FAILED"] for ln in out.splitlines())
