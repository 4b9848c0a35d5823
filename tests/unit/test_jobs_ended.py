"""`slurm-elastic jobs -a`: an ended job holds no nodes. Its state is Slurm's final one (FAILED...), its "cur" is
"-", and the size it ended with is shown as history, with when it ended."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from slurm_elastic.api.authz import Caller
from slurm_elastic.api.service import Service, ServiceSettings
from slurm_elastic.cli import main
from slurm_elastic.store import SqlStore, sqlite_url
from slurm_elastic.store.records import JobObservation
from tests.unit.storehelpers import FakeClock, file_store

ROOT = Caller(0, "root")


def two_jobs(path: Path, clock: FakeClock) -> SqlStore:
    store = file_store(path, clock)
    for job_id in (7, 8):
        store.jobs.upsert_job(JobObservation(job_id=job_id, user="alice", partition="gpu", state="RUNNING",
                                             current_nodes=3, min_nodes=1, max_nodes=4))
    clock.advance(60)
    assert store.jobs.mark_job_ended(7, "FAILED")  # as the cycle does when sacct says how it ended
    return store


def test_service_reports_the_final_state_and_the_size_it_ended_with(tmp_path: Path, clock: FakeClock) -> None:
    store = two_jobs(tmp_path / "s.db", clock)
    rows = {r["job"]: r for r in Service(store, ServiceSettings(), clock=clock).handle(ROOT, "jobs",
                                                                                        {"all": True})["jobs"]}
    assert (rows[7]["state"], rows[7]["current_nodes"], rows[7]["ended_nodes"]) == ("FAILED", None, 3)
    assert rows[7]["ended_at"] == clock().isoformat()
    assert (rows[8]["state"], rows[8]["current_nodes"], rows[8]["ended_nodes"], rows[8]["ended_at"]) == (
        "RUNNING", 3, None, None)
    store.close()


def test_cli_shows_no_current_size_for_an_ended_job(tmp_path: Path, clock: FakeClock) -> None:
    two_jobs(tmp_path / "s.db", clock).close()
    r = CliRunner().invoke(main, ["jobs", "-a", "--parsable", "--url", sqlite_url(tmp_path / "s.db")])
    assert r.exit_code == 0, r.output
    rows = {line.split("|")[0]: line.split("|") for line in r.output.splitlines()[1:]}
    failed, running = rows["7"], rows["8"]
    assert (failed[4], failed[5], failed[6], failed[7]) == ("FAILED", "1", "-", "4")
    assert failed[-1] == f"ended {clock().strftime('%Y-%m-%dT%H:%M:%S')} with 3 nodes"
    assert (running[4], running[6], running[-1]) == ("RUNNING", "3", "")
