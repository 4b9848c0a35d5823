"""What operators change reaches the controller's cycle: stored policy versions and pauses (over Slurm replies
recorded from the live test cluster, fake clock), the [api] section of controller.toml, and the CLI's usage and
error conventions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_elastic.cli import main
from slurm_elastic.controller.config import ControllerConfig, parse_controller_config
from slurm_elastic.controller.cycle import Controller
from slurm_elastic.controller.pauses import paused_units, with_paused_jobs
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import parse_config
from slurm_elastic.policy.schema import DEFAULTS
from slurm_elastic.slurm.adapter import SlurmCli
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, DecisionFilter, PauseScope
from tests.unit.controller_scenarios import SteadyRunner, steady_cli
from tests.unit.slurm_replay import STEP_S, Replayed, replay
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import POLICY_TEXT, Agents

# A 2-node job (max 3) with two free nodes, recorded on the live cluster and read as a steady cluster: a grow
# would be an sbatch, which steady_cli refuses (the test fails).
ROOM_TO_GROW = "dry_run_idle"


def _steady(store_url: str | None = None, policy_text: str = POLICY_TEXT, dry_run: bool = False
            ) -> tuple[Controller, SlurmCli, SteadyRunner, Agents, FakeClock, SqlStore, int]:
    slurm, runner = steady_cli(ROOM_TO_GROW)
    clock = FakeClock(runner.rec.clock_start)
    store = SqlStore.open(store_url) if store_url else memory_store(clock)
    agents = Agents(clock)
    job = runner.rec.jobs["idle"]
    agents.util = {(n, job): 95.0 for n in runner.rec.nodes["idle"]}
    # a snapshot is stamped with the host's time, the cycle with the fake one: never call it stale here
    cfg = ControllerConfig(interval_s=STEP_S, holder="test", max_snapshot_age_s=86400, dry_run=dry_run)
    ctl = Controller(cfg, parse_config(policy_text), slurm=slurm, store=store, collector=agents, clock=clock)
    return ctl, slurm, runner, agents, clock, store, job


def run(ctl: Controller, runner: SteadyRunner, clock: FakeClock, cycles: int) -> None:
    for _ in range(cycles):
        ctl.run_cycle()
        runner.check()  # a Slurm write or an unrecorded command, even one the controller caught
        clock.advance(STEP_S)


@pytest.fixture(scope="module")
def pauses() -> Replayed:
    """Recorded: two busy 1-node jobs under a global pause, "paused" paused on its own too; the global pause is
    lifted after 8 cycles (the two tests below only read the outcome)."""
    return replay("pause_then_resume", Agents)


def test_a_paused_job_is_decided_and_recorded_as_held_but_not_acted_on(pauses: Replayed) -> None:
    r = pauses
    paused, free = r.rec.jobs["paused"], r.rec.jobs["free"]
    assert not [a for a in r.store.journal.list_actions(job_id=paused) if a.kind == ActionKind.GROW]
    assert [a for a in r.store.journal.list_actions(job_id=free) if a.kind == ActionKind.GROW]
    held = r.store.decisions.list_decisions(DecisionFilter(job_id=paused, reason="PAUSED"))
    assert held and all(d.action == "hold" and d.paused for d in held)
    assert any("grow" in d.message for d in held)  # the intent is kept in the message
    (submit,) = r.runner.ran("runuser")  # the one extension job: the free job's
    assert f"--comment=slurm-elastic:ext parent={free} " in " ".join(submit) + " "


def test_a_global_pause_holds_everything_until_resumed(pauses: Replayed) -> None:
    r = pauses
    resumed = r.rec.clock_start + timedelta(seconds=8 * STEP_S)  # the scenario lifts it after 8 cycles
    actions = r.store.journal.list_actions()
    assert actions and all(a.created_at >= resumed for a in actions)
    free = r.rec.jobs["free"]
    during = [d for d in r.store.decisions.list_decisions(DecisionFilter(job_id=free)) if d.time < resumed]
    assert during and all(d.action == "hold" for d in during)
    assert [a for a in actions if a.job_id == free and a.kind == ActionKind.GROW]


def test_a_partition_pause_cannot_be_undone_by_a_scoped_paused_false() -> None:
    cfg = parse_config("version = 1\n[partition.train]\npaused = false\n[profile.p]\npaused_jobs = [7]\n")
    out = with_paused_jobs(cfg, frozenset({10}))
    assert out.paused_jobs == {10}
    assert out.with_active_profile("p").paused_jobs == {7, 10}
    assert with_paused_jobs(cfg, frozenset()) is cfg


def test_paused_units_by_scope() -> None:
    from slurm_elastic.controller.units import SpecCache, build_units

    slurm, runner = steady_cli(ROOM_TO_GROW)
    store = memory_store(FakeClock(runner.rec.clock_start))
    job = runner.rec.jobs["idle"]
    units = build_units(slurm.snapshot(), read_script=slurm.batch_script,
                        is_known_key=lambda p, k: False, cache=SpecCache()).units
    (unit,) = [u for u in units if u.unit_id == job]
    store.pauses.pause(PauseScope.PARTITION, "other", who="root")
    assert paused_units(units, store.pauses.list_pauses()) == frozenset()
    store.pauses.pause(PauseScope.PARTITION, unit.job.partition, who="root")
    assert paused_units(units, store.pauses.list_pauses()) == {u.unit_id for u in units}
    runner.check()


def test_the_newest_stored_policy_version_is_in_force_at_the_next_cycle() -> None:
    ctl, _slurm, runner, _agents, clock, store, job = _steady()
    store.policies.add_policy("version = 1\npaused = true\n", author="root")
    run(ctl, runner, clock, 1)
    assert ctl.policy_version == 1 and ctl.policy.resolve("paused").value is True
    store.policies.add_policy("version = 1\nscale_up_above = 1000\n", author="root")  # invalid: kept out
    run(ctl, runner, clock, 1)
    assert ctl.policy_version == 2 and ctl.policy.resolve("paused").value is True
    run(ctl, runner, clock, 6)  # busy, with room to grow: only the pause keeps it from an sbatch
    assert not store.journal.list_actions(job_id=job)
    assert store.decisions.list_decisions(DecisionFilter(job_id=job, reason="PAUSED"))


def test_api_section_of_controller_toml() -> None:
    cfg = parse_controller_config('version = 1\n[api]\nsocket = "/run/x.sock"\noperators_group = "hpcops"\n'
                                  'users_see_all = true\n')
    assert str(cfg.api.socket) == "/run/x.sock" and cfg.api.operators_group == "hpcops" and cfg.api.users_see_all
    assert parse_controller_config('version = 1\n[api]\nsocket = ""\n').api.socket is None
    assert str(parse_controller_config("version = 1\n").api.socket) == "/run/slurm-elastic/controller.sock"
    with pytest.raises(ConfigError, match="api.socket"):
        parse_controller_config('version = 1\n[api]\nsocket = "rel.sock"\n')
    with pytest.raises(ConfigError, match="api.nope"):
        parse_controller_config("version = 1\n[api]\nnope = 1\n")


# --- CLI conventions (direct DB access, as the test's own user) --------------------------------------------------

@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    SqlStore.open(url).close()
    return url


def test_cli_exit_codes_and_one_line_errors(db: str, tmp_path: Path) -> None:
    r = CliRunner()
    ok = r.invoke(main, ["policy", "set", "--url", db, "scale_up_above=70"])
    assert ok.exit_code == 0 and "policy version 1" in ok.output
    bad = r.invoke(main, ["policy", "set", "--url", db, "scale_up_above=700"])
    assert bad.exit_code == 1 and len(bad.output.strip().splitlines()) == 1
    assert r.invoke(main, ["pause", "--url", db]).exit_code == 2
    assert r.invoke(main, ["pause", "--url", db, "--all", "--job", "3"]).exit_code == 2
    assert r.invoke(main, ["explain", "--url", db, "notanumber"]).exit_code == 2
    down = r.invoke(main, ["status", "--socket", str(tmp_path / "none.sock")])
    assert down.exit_code == 1 and "not reachable" in down.output
    f = tmp_path / "p.toml"
    f.write_text("version = 1\nscale_up_above = 20\nscale_down_below = 40\n")
    assert r.invoke(main, ["policy", "validate", str(f)]).exit_code == 1
    f.write_text("version = 1\nscale_up_above = 60\n")
    assert r.invoke(main, ["policy", "validate", str(f)]).exit_code == 0


def test_cli_output_formats(db: str) -> None:
    r = CliRunner()
    r.invoke(main, ["policy", "set", "--url", db, "scale_up_above=70"])
    table = r.invoke(main, ["policy", "history", "--url", db]).output.splitlines()
    assert table[0].split()[:3] == ["VERSION", "TIME", "AUTHOR"]
    parsable = r.invoke(main, ["policy", "history", "--url", db, "-P", "-n"]).output.splitlines()
    assert len(parsable) == 1 and parsable[0].startswith("1|")
    import json

    assert json.loads(r.invoke(main, ["policy", "history", "--url", db, "--json"]).output)[0]["version"] == 1
    status = r.invoke(main, ["status", "--url", db, "-P"]).output.splitlines()
    assert status[0] == "item|value" and "controller|down" in status
    assert json.loads(r.invoke(main, ["status", "--url", db, "--json"]).output)["managed_jobs"] == 0


def test_the_daemon_serves_the_api_and_keeps_the_db_private(tmp_path: Path) -> None:
    import os
    import tempfile

    from slurm_elastic.api.client import request
    from slurm_elastic.controller.daemon import restrict_sqlite_file, start_api

    url = f"sqlite:///{tmp_path / 'state.db'}"
    SqlStore.open(url).close()
    (tmp_path / "state.db").chmod(0o644)
    restrict_sqlite_file(url)
    assert (tmp_path / "state.db").stat().st_mode & 0o777 == 0o600
    restrict_sqlite_file("sqlite://")  # in memory: nothing to do
    with tempfile.TemporaryDirectory(prefix="se-d-") as d:
        sock = Path(d) / "c.sock"
        cfg = parse_controller_config(f'version = 1\n[controller]\ndb_url = "{url}"\n[api]\nsocket = "{sock}"\n')
        server = start_api(cfg)
        assert server is not None
        try:
            me = request(sock, "whoami")
            assert me["uid"] == os.getuid()
            assert request(sock, "policy.show")["source"] == "packaged defaults"
        finally:
            server.stop()
        off = parse_controller_config(f'version = 1\n[controller]\ndb_url = "{url}"\n[api]\nsocket = ""\n')
        assert start_api(off) is None
        bad = parse_controller_config(f'version = 1\n[controller]\ndb_url = "{url}"\n[api]\n'
                                      f'socket = "/proc/nope/c.sock"\n')
        assert start_api(bad) is None  # logged; the controller runs on without the API


def test_explain_shows_the_rule_the_signal_and_the_profile_behind_each_decision(tmp_path: Path) -> None:
    """A profile in force on the weekday of the recording (the fake clock's): its decisions say so, and explain
    shows it. Under --dry-run the grow is decided and stored, and no sbatch is run."""
    day = steady_cli(ROOM_TO_GROW)[1].rec.clock_start.strftime("%a")
    url = f"sqlite:///{tmp_path / 'state.db'}"
    policy = POLICY_TEXT + f'[profile.oneday]\nwindows = ["{day} 00:00-24:00"]\nscale_up_above = 60\n'
    ctl, _slurm, runner, agents, clock, store, job = _steady(url, policy, dry_run=True)
    agents.util = {(n, job): 70.0 for n in runner.rec.nodes["idle"]}  # a grow only under the profile's 60
    run(ctl, runner, clock, 8)
    store.close()
    out = CliRunner().invoke(main, ["explain", "--url", url, str(job), "-P", "--last", "50"])
    assert out.exit_code == 0, out.output
    rows = [line.split("|") for line in out.output.splitlines()]
    header = next(r for r in rows if r[0] == "time")
    assert header[:6] == ["time", "action", "nodes", "reason", "based_on", "profile"]
    decided = [r for r in rows if len(r) == len(header) and r[0] != "time"]
    assert any(r[1] == "grow" and r[4] == "utilization" and r[5] == "oneday" for r in decided), out.output
    # The settings are resolved at the real now (the CLI's own clock): the profile only on that weekday.
    today = datetime.now(tz=UTC).strftime("%a") == day
    assert ["profile_now", "oneday" if today else "(none)"] in rows, out.output
    default_up = str(DEFAULTS["scale_up_above"])  # the packaged default
    assert ["scale_up_above", "60" if today else default_up, "profile oneday" if today else "default"] in rows
