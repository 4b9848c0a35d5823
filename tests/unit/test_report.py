"""``report`` and ``whatif``: the figures (slurm_elastic/report.py), the day-by-day sacct read, the controller's
``usage`` answer, and both verbs end to end on recorded sacct output."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_elastic.api.authz import AccessPolicy, Caller
from slurm_elastic.api.service import Service, ServiceSettings
from slurm_elastic.cli import main
from slurm_elastic.report import group_row, job_facts, node_seconds_moved, report_rows
from slurm_elastic.sim.loaders.sacct import parse_accounting
from slurm_elastic.slurm.accounting import REPORT_FIELDS, merge_exports
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.slurm.errors import SlurmError, SlurmParseError
from slurm_elastic.slurm.runner import CommandResult, SlurmCommands
from slurm_elastic.store import SqlStore, sqlite_url
from slurm_elastic.store.records import ActionKind, JobObservation, NewSample, SpecSource
from tests.unit.storehelpers import FakeClock, memory_store

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sacct"
HEADER = "|".join(REPORT_FIELDS)
# Four rigid jobs with JCTs 100, 200, 300, 20000 s and waits 0, 10, 20, 15000 s; elastic job 5 (2 GPUs, ran
# 1000 s) with extension job 6 (2 GPUs, 500 s); a CPU-only job and a job still running are left out.
EXPORT = "\n".join([
    HEADER,
    "1|2026-11-01T10:00:00|2026-11-01T10:00:00|2026-11-01T10:01:40|00:01:40|cpu=1,gres/gpu=1,node=1||1|COMPLETED|"
    "train|nlp|alice|normal|01:00:00",
    "2|2026-11-01T10:00:00|2026-11-01T10:00:10|2026-11-01T10:03:20|00:03:10|cpu=1,gres/gpu=2,node=1||1|FAILED|"
    "train|nlp|alice|normal|01:00:00",
    "3|2026-11-01T10:00:00|2026-11-01T10:00:20|2026-11-01T10:05:00|00:04:40|cpu=1,gres/gpu=4,node=1||1|COMPLETED|"
    "serve|vision|bob|high|01:00:00",
    "4|2026-11-01T10:00:00|2026-11-01T14:10:00|2026-11-01T15:33:20|01:23:20|cpu=1,gres/gpu=1,node=1||1|"
    "CANCELLED by 0|train|vision|bob|high|1-00:00:00",
    "5|2026-11-01T11:00:00|2026-11-01T11:00:00|2026-11-01T11:16:40|00:16:40|cpu=2,gres/gpu=2,node=1||1|COMPLETED|"
    "train|nlp|alice|normal|01:00:00",
    "6|2026-11-01T11:05:00|2026-11-01T11:05:00|2026-11-01T11:13:20|00:08:20|cpu=2,gres/gpu=2,node=1||1|CANCELLED|"
    "train|nlp|alice|normal|01:00:00",
    "7|2026-11-01T10:00:00|2026-11-01T10:00:00|2026-11-01T10:00:05|00:00:05|cpu=1,node=1||1|COMPLETED|"
    "train|nlp|alice|normal|01:00:00",
    "8|2026-11-01T10:00:00|2026-11-01T10:00:00|Unknown|00:10:00|cpu=1,gres/gpu=1,node=1||1|RUNNING|"
    "train|nlp|alice|normal|01:00:00",
]) + "\n"


def utc(text: str) -> float:
    """The tests' sacct prints UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def usage_for_job5() -> dict[str, object]:
    return {"jobs": [{"job": "5", "user": "alice", "account": "nlp", "partition": "train", "qos": "normal",
                      "extensions": [6], "resizes": [
                          {"kind": "grow", "nodes": 1, "gpus": 2, "time": "2026-11-01T11:05:00+00:00"},
                          {"kind": "cancel_extension", "nodes": 1, "gpus": 2, "time": "2026-11-01T11:13:20+00:00"}],
                      "util": [[0, 3600.0, 1800.0], [1, 1200.0, 1200.0]]}]}


def test_report_rows_measure_what_the_accounting_says() -> None:
    jobs, skipped = parse_accounting("export", EXPORT)
    assert skipped == {"no GPUs": 1, "not finished": 1}
    facts, folded = job_facts(jobs, usage_for_job5(), to_epoch=lambda t: t)
    assert folded == 1 and [f.job_id for f in facts] == ["1", "2", "3", "4", "5"]
    rows = {r["kind"]: r for r in report_rows(facts, None)}
    rigid, elastic, total = rows["rigid"], rows["elastic"], rows["all"]
    assert (rigid["jobs"], rigid["completed"], elastic["jobs"], total["jobs"]) == (4, 2, 1, 5)
    # JCT 100, 200, 300, 20000: population std by hand; "lower" percentiles (index floor(q (n - 1))).
    assert rigid["jct_mean_s"] == 5150.0 and rigid["jct_std_s"] == pytest.approx(math.sqrt(73512500), abs=0.1)
    assert (rigid["jct_p50_s"], rigid["jct_p99_s"]) == (200.0, 300.0)
    assert (rigid["wait_p50_s"], rigid["wait_p99_s"], rigid["starved"]) == (10.0, 20.0, 1)  # 15000 s > 4 h
    assert rigid["gpu_hours"] == round((100 * 1 + 190 * 2 + 280 * 4 + 5000 * 1) / 3600, 3)
    assert rigid["util_mean"] is None and rigid["resizes"] == 0
    # The extension's GPU-hours are the elastic job's; it lent one node for 500 s.
    assert elastic["gpu_hours"] == round((1000 * 2 + 500 * 2) / 3600, 3)
    assert (elastic["resizes"], elastic["node_hours_moved"]) == (2, round(500 / 3600, 3))
    # Utilization weighted by GPU-seconds: (0.5 x 3600 + 1.0 x 1200) / 4800; variance around it.
    mean = (0.5 * 3600 + 1.0 * 1200) / 4800
    assert elastic["util_mean"] == round(mean, 4)
    assert elastic["util_var"] == round((3600 * (0.5 - mean) ** 2 + 1200 * (1.0 - mean) ** 2) / 4800, 6)
    assert (elastic["gpu_hours_sampled"], elastic["gpu_hours_used"]) == (round(4800 / 3600, 3), round(3000 / 3600, 3))
    assert total["gpu_hours"] == pytest.approx(rigid["gpu_hours"] + elastic["gpu_hours"], abs=0.002)
    by_user = {(r["group"], r["kind"]): r["jobs"] for r in report_rows(facts, "user")}
    assert by_user[("alice", "all")] == 3 and by_user[("bob", "rigid")] == 2 and by_user[("bob", "elastic")] == 0
    assert group_row("x", "all", [])["jobs"] == 0


def test_recorded_cluster_export_gives_each_job_its_sacct_times() -> None:
    """The captured 22.05.8 export: a resized job is one job, from its first submission to its last end."""
    jobs, _ = parse_accounting("captured", (FIXTURES / "captured-22.05.8-parsable.txt").read_text())
    facts = {f.job_id: f for f in job_facts(jobs, None, to_epoch=lambda t: t)[0]}
    resized, plain = facts["9"], facts["11"]
    assert (resized.submit, resized.end) == (utc("2026-11-29T21:51:21"), utc("2026-11-29T21:51:22"))
    assert resized.state == "CANCELLED" and not resized.elastic
    assert (plain.jct, plain.wait, plain.state, plain.gpu_seconds) == (1.0, 1.0, "COMPLETED", 0.0)


def test_node_seconds_moved_integrates_the_size_change() -> None:
    shrink = [{"kind": "shrink", "nodes": 2, "time": "2026-11-01T10:00:00+00:00"}]
    assert node_seconds_moved(shrink, utc("2026-11-01T10:10:00")) == 1200.0
    grow_back = [*shrink, {"kind": "grow", "nodes": 1, "time": "2026-11-01T10:05:00+00:00"}]
    assert node_seconds_moved(grow_back, utc("2026-11-01T10:10:00")) == 2 * 300 + 1 * 300
    assert node_seconds_moved([], 0.0) == 0.0


def test_merge_exports_keeps_each_record_once_as_the_newest_window_printed_it() -> None:
    older = f"{HEADER}\n" + "1|2026-11-01T10:00:00|2026-11-01T10:00:00|Unknown|" + "|" * 9 + "\n"
    newer = (f"{HEADER}\n" + "1|2026-11-01T10:00:00|2026-11-01T10:00:00|2026-11-02T01:00:00|" + "|" * 9 + "\n"
             + "1|2026-11-01T11:00:00|2026-11-01T10:00:00|2026-11-02T01:00:00|" + "|" * 9 + "\n")
    merged = merge_exports([older, newer, ""]).splitlines()
    assert merged[0] == HEADER and len(merged) == 3 and "Unknown" not in "".join(merged)
    with pytest.raises(SlurmParseError, match="differs"):
        merge_exports([older, "JobID|State\n"])


class RecordingRunner:
    """Answers every sacct call with ``text`` and keeps the argument lists."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float, input_text: str | None,
                 env: Mapping[str, str] | None) -> CommandResult:
        self.calls.append(list(argv))
        return CommandResult(tuple(argv), 0, self.text, "")


def test_accounting_export_reads_one_day_at_a_time() -> None:
    runner = RecordingRunner(EXPORT)
    cli = SlurmCli(SlurmCommands(runner=runner, env={}))
    start = datetime(2026, 11, 1, 6, tzinfo=UTC)
    progress: list[tuple[int, int]] = []
    text = cli.accounting_export(start, start + timedelta(days=2, hours=3),
                                 on_chunk=lambda d, t: progress.append((d, t)))
    assert progress == [(1, 3), (2, 3), (3, 3)]
    assert text == EXPORT  # the same records in every window are kept once
    first = runner.calls[0]
    assert first[:4] == ["sacct", "-X", "-P", "-a"] and first[first.index("-o") + 1] == ",".join(REPORT_FIELDS)
    bounds = [(c[c.index("-S") + 1], c[c.index("-E") + 1]) for c in runner.calls]
    assert [s for s, _ in bounds][1:] == [e for _, e in bounds][:-1]  # consecutive days, no gap
    cli.accounting_export(start, start + timedelta(hours=1), user="alice")
    assert runner.calls[-1][3:5] == ["-u", "alice"]
    for bad in ("-a", "al ice", ""):
        with pytest.raises(SlurmError, match="invalid user"):
            cli.accounting_export(start, start + timedelta(hours=1), user=bad)
    with pytest.raises(SlurmError, match="before it starts"):
        cli.accounting_export(start, start)


T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def elastic_store(store: SqlStore, clock: FakeClock) -> None:
    for job_id, user in ((5, "alice"), (20, "carol")):
        store.jobs.upsert_job(JobObservation(job_id=job_id, user=user, partition="train", state="RUNNING",
                                             current_nodes=1, min_nodes=1, max_nodes=2, account="nlp", qos="normal",
                                             spec="elastic:v1 min=1 max=2", spec_source=SpecSource.BATCH_SCRIPT))
    aid = store.journal.record_intent(job_id=5, kind=ActionKind.GROW, idempotency_key="g5", nodes=1, gpus=2)
    store.journal.mark_in_progress(aid)
    store.journal.mark_applied(aid, "Submitted batch job 6")
    store.jobs.record_extension(job_id=6, parent_job_id=5, node_count=1, state="RUNNING", action_id=aid)
    store.journal.note_joined(aid, clock())  # its extension ran for the job (controller/grants.py)
    # A grow submitted whose extension never joined (its prewarm failed): no size change.
    failed = store.journal.record_intent(job_id=5, kind=ActionKind.GROW, idempotency_key="g5b", nodes=1, gpus=2)
    store.journal.mark_in_progress(failed)
    store.journal.mark_applied(failed, "Submitted batch job 7")
    # One sample a minute, then a 10-minute gap (the controller was down): it stands for 2 minutes only.
    store.samples.add_samples([NewSample(job_id=5, time=T0 + timedelta(minutes=m), util_mean=u, util_max=u,
                                         gpus_alloc=2, gpus_in_use=2, sample_count=6)
                               for m, u in ((1, 50.0), (2, 50.0), (3, 100.0), (13, 100.0))])
    clock.advance(60)


def test_usage_answers_users_about_their_own_elastic_jobs() -> None:
    clock = FakeClock(T0)
    store = memory_store(clock)
    elastic_store(store, clock)
    svc = Service(store, ServiceSettings(access=AccessPolicy()), clock=clock)
    args = {"since": (T0 - timedelta(hours=1)).isoformat(), "until": (T0 + timedelta(hours=1)).isoformat(),
            "bucket_s": 3600.0}
    alice = svc.handle(Caller(1001, "alice"), "usage", args)["jobs"]
    assert [j["job"] for j in alice] == ["5"]
    assert sorted(j["job"] for j in svc.handle(Caller(0, "root"), "usage", args)["jobs"]) == ["20", "5"]
    job = alice[0]
    assert job["extensions"] == [6] and [(r["kind"], r["nodes"]) for r in job["resizes"]] == [("grow", 1)]
    # 60 s each for the first three (median gap), 120 s for the one after the gap; bucket 1 (T0 .. T0 + 1 h).
    assert job["util"] == [[1.0, 2 * 300.0, 2 * (60 * 0.5 + 60 * 0.5 + 60 * 1.0 + 120 * 1.0)]]
    with pytest.raises(Exception, match="ISO time with a zone"):
        svc.handle(Caller(1001, "alice"), "usage", {**args, "since": "2026-11-01T10:00:00"})


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A state DB with elastic job 5 and a SlurmCli that answers sacct from EXPORT."""
    clock = FakeClock(datetime(2026, 11, 1, 11, 0, tzinfo=UTC))
    url = sqlite_url(tmp_path / "state.db")
    store = SqlStore.open(url, clock=clock)
    store.jobs.upsert_job(JobObservation(job_id=5, user="alice", partition="train", state="RUNNING", current_nodes=1,
                                         min_nodes=1, max_nodes=2, account="nlp", spec="elastic:v1 min=1 max=2",
                                         spec_source=SpecSource.BATCH_SCRIPT))
    store.jobs.record_extension(job_id=6, parent_job_id=5, node_count=1, state="RUNNING")
    store.policies.add_policy("version = 1\n", author="root")
    store.close()
    runner = RecordingRunner(EXPORT)
    monkeypatch.setattr("slurm_elastic.cli.report_cmd.SlurmCli", lambda: SlurmCli(SlurmCommands(runner=runner, env={})))
    monkeypatch.setenv("TZ", "UTC")
    import time

    time.tzset()
    return url


def test_report_verb_prints_parsable_rows_json_and_plots(cli_env: str, tmp_path: Path) -> None:
    window = ["--since", "2026-10-31T00:00:00", "--until", "2026-11-02T00:00:00", "--url", cli_env, "--no-progress"]
    out = CliRunner().invoke(main, ["report", *window, "-P"])
    assert out.exit_code == 0, out.output
    lines = [line for line in out.stdout.splitlines() if "|" in line]
    header = lines[0].split("|")
    rows = {r["kind"]: r for r in (dict(zip(header, line.split("|"), strict=True)) for line in lines[1:])}
    assert (rows["elastic"]["jobs"], rows["rigid"]["jobs"], rows["all"]["jobs"]) == ("1", "4", "5")
    assert rows["rigid"]["jct_p50_s"] == "200.0"
    as_json = CliRunner().invoke(main, ["report", *window, "--json", "--by", "account"])
    assert {(r["group"], r["kind"], r["jobs"]) for r in json.loads(as_json.stdout)} >= {("nlp", "elastic", 1),
                                                                                         ("vision", "rigid", 2)}
    plots = CliRunner().invoke(main, ["report", *window, "--plot", str(tmp_path / "plots")])
    assert plots.exit_code == 0, plots.output
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"jct_cdf.png", "wait_cdf.png"}
    # A window that ends before the jobs did has none of them.
    early = CliRunner().invoke(main, ["report", "--since", "2026-10-30T00:00:00", "--until", "2026-10-31T00:00:00",
                                      "--url", cli_env, "--no-progress", "--json"])
    assert [r["jobs"] for r in json.loads(early.stdout)] == [0, 0, 0]


def test_whatif_replays_the_window_rigid_and_elastic(cli_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = RecordingRunner(EXPORT)
    monkeypatch.setattr("slurm_elastic.cli.whatif_cmd.SlurmCli", lambda: SlurmCli(SlurmCommands(runner=runner, env={})))
    out = CliRunner().invoke(main, ["whatif", "--since", "2026-10-31T00:00:00", "--until", "2026-11-02T00:00:00",
                                    "--url", cli_env, "--no-progress", "--nodes", "2", "--gpus-per-node", "4",
                                    "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["kind"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {"all", "rigid", "elastic"} and rows["all"]["group"] == "actual"
    assert rows["rigid"]["jobs"] == rows["elastic"]["jobs"] == rows["all"]["jobs"] == 5
    assert "parametric speedup model" in out.stderr and "policy: policy version 1" in out.stderr


def test_a_job_that_shrank_counts_what_it_held_at_each_size() -> None:
    """Recorded on the live cluster (fixtures/sacct/README.md): job 1000000 held 8 GPUs for 15 s, then 4 GPUs for
    25 s after a shrink in place; job 1000001, its extension here, 4 GPUs for 10 s. The controller's journal
    says: one grow that joined, one shrink, and one grow whose extension never joined (not a size change)."""
    jobs, _ = parse_accounting("shrink", (FIXTURES / "captured-22.05.8-shrink-parsable.txt").read_text())
    by_id = {j.spec.job_id: j for j in jobs}
    assert by_id["1000000"].gpu_seconds == 8 * 15 + 4 * 25 and by_id["1000000"].resized == 1
    assert by_id["1000001"].gpu_seconds == 4 * 10
    usage = {"jobs": [{"job": "1000000", "user": "alice", "account": "nlp", "partition": "train", "qos": "normal",
                       "extensions": [1000001], "util": [], "resizes": [
                           {"kind": "grow", "nodes": 1, "gpus": 4, "time": "2026-12-05T09:23:15+00:00"},
                           {"kind": "shrink", "nodes": 1, "gpus": 4, "time": "2026-12-05T09:23:15+00:00"}]}]}
    facts, folded = job_facts(jobs, usage, to_epoch=lambda t: t)
    (job,) = facts
    assert folded == 1 and job.gpu_seconds == 220 + 40
    (row,) = [r for r in report_rows(facts, None) if r["kind"] == "elastic"]
    assert row["gpu_hours"] == round(260 / 3600, 3) == 0.072  # the starting size over the whole run: 0.1
    assert row["resizes"] == 2 and (row["jct_mean_s"], row["wait_mean_s"]) == (40.0, 0.0)


def test_usage_counts_a_grow_only_once_it_joined() -> None:
    clock = FakeClock(T0)
    store = memory_store(clock)
    elastic_store(store, clock)
    job = next(j for j in Service(store, ServiceSettings(access=AccessPolicy()), clock=clock).handle(
        Caller(0, "root"), "usage", {"since": (T0 - timedelta(hours=1)).isoformat(),
                                     "until": (T0 + timedelta(hours=1)).isoformat()})["jobs"] if j["job"] == "5")
    # two grows applied (submitted), one joined: one size change, at its join
    assert [(r["kind"], r["time"]) for r in job["resizes"]] == [("grow", T0.isoformat())]


CAPTURED = (FIXTURES / "captured-22.05.8-parsable.txt").read_text()


def test_whatif_rigid_replay_reproduces_the_recorded_past(cli_env: str, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    """The captured 22.05.8 export (34 GPU jobs of the live test cluster): the rigid replay, scheduling as Slurm
    does (as jobs fit, 1 s) with no start delay, comes within 10% of the actual mean JCT and 1 s of the mean wait
    (it gave 104.4 s against 18.3 s, waits 56.8 s against 1.0 s, at a fixed 60-s scheduling cycle with 30 s of
    start delay); the elastic row, equal to it, says why; --plot draws actual, rigid and elastic."""
    runner = RecordingRunner(CAPTURED)
    monkeypatch.setattr("slurm_elastic.cli.report_cmd.SlurmCli", lambda: SlurmCli(SlurmCommands(runner=runner,
                                                                                                  env={})))
    monkeypatch.setattr("slurm_elastic.cli.whatif_cmd.SlurmCli", lambda: SlurmCli(SlurmCommands(runner=runner,
                                                                                                  env={})))
    out = CliRunner().invoke(main, ["whatif", "--since", "2026-11-29T00:00:00", "--until", "2026-11-30T00:00:00",
                                    "--url", cli_env, "--no-progress", "--nodes", "4", "--gpus-per-node", "4",
                                    "--json", "--plot", str(tmp_path / "plots")])
    assert out.exit_code == 0, out.output
    rows = {r["kind"]: r for r in json.loads(out.stdout)}
    actual, rigid, elastic = rows["all"], rows["rigid"], rows["elastic"]
    assert actual["jobs"] == rigid["jobs"] == 34
    assert abs(rigid["jct_mean_s"] - actual["jct_mean_s"]) <= 0.1 * actual["jct_mean_s"], (rigid, actual)
    assert abs(rigid["wait_mean_s"] - actual["wait_mean_s"]) <= 1.0, (rigid, actual)
    assert "rigid replay vs actual: mean JCT" in out.stderr
    assert (elastic["jct_mean_s"], elastic["resizes"]) == (rigid["jct_mean_s"], 0)
    assert "elastic replay = rigid: no replayed job resized" in out.stderr and "window_s 600s" in out.stderr
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"jct_cdf.png", "wait_cdf.png", "nodes.png"}


def test_whatif_names_the_powered_down_nodes_it_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded power-saving cluster (n1-n4 on, n5-n6 powered down)."""
    from slurm_elastic.cli import whatif_cmd
    from slurm_elastic.slurm.decode import parse_nodes

    _, nodes = parse_nodes(json.loads((FIXTURES.parent / "slurm" / "22.05" / "sinfo_power.json").read_text()))

    class Nodes:
        def nodes(self) -> list[object]:
            return list(nodes)

    monkeypatch.setattr(whatif_cmd, "SlurmCli", Nodes)
    assert whatif_cmd.cluster_shape(None, None) == (6, 4, ["n5", "n6"])
    assert whatif_cmd.cluster_shape(4, 4) == (4, 4, [])


def test_plot_axes_use_the_tables_units() -> None:
    from slurm_elastic.report_plots import time_unit

    assert time_unit([5.0, 45.0]) == (1.0, "seconds")  # second-long waits are not drawn in hours
    assert time_unit([30.0, 600.0]) == (60.0, "minutes")
    assert time_unit([7200.0]) == (3600.0, "hours") and time_unit([]) == (1.0, "seconds")
