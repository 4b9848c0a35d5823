"""What operators change reaches the controller's cycle: stored policy versions and pauses (in-memory Slurm,
fake clock), the [api] section of controller.toml, and the CLI's usage and error conventions."""

from __future__ import annotations

from datetime import UTC, datetime
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
from slurm_elastic.store import SqlStore
from slurm_elastic.store.records import ActionKind, DecisionFilter, PauseScope
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_controller_cycle import POLICY, POLICY_TEXT, T0, Agents, FakeSlurm, run

World = tuple[Controller, FakeSlurm, Agents, FakeClock, SqlStore]


@pytest.fixture
def world() -> World:
    clock = FakeClock(T0)
    store = memory_store(clock)
    slurm = FakeSlurm(clock)
    agents = Agents(clock)
    ctl = Controller(ControllerConfig(interval_s=2.0, holder="test"), POLICY, slurm=slurm,
                     store=store, collector=agents, clock=clock)
    return ctl, slurm, agents, clock, store


def test_a_paused_job_is_decided_and_recorded_as_held_but_not_acted_on(world: World) -> None:
    ctl, slurm, agents, clock, store = world
    slurm.add_job(10, ["n1"])
    slurm.add_job(11, ["n2"])
    agents.util[("n1", 10)] = 95.0
    agents.util[("n2", 11)] = 95.0
    store.pauses.pause(PauseScope.JOB, 10, who="root")
    run(ctl, clock, 8)
    assert not [a for a in store.journal.list_actions(job_id=10) if a.kind == ActionKind.GROW]
    assert [a for a in store.journal.list_actions(job_id=11) if a.kind == ActionKind.GROW]
    paused = store.decisions.list_decisions(DecisionFilter(job_id=10, reason="PAUSED"))
    assert paused and all(d.action == "hold" and d.paused for d in paused)
    assert "grow" in paused[0].message  # the intent is kept in the message


def test_a_global_pause_holds_everything_until_resumed(world: World) -> None:
    ctl, slurm, agents, clock, store = world
    slurm.add_job(10, ["n1"])
    agents.util[("n1", 10)] = 95.0
    store.pauses.pause(PauseScope.GLOBAL, None, who="root")
    run(ctl, clock, 8)
    assert not store.journal.list_actions(job_id=10)
    store.pauses.resume(PauseScope.GLOBAL, None)
    run(ctl, clock, 8)
    assert [a for a in store.journal.list_actions(job_id=10) if a.kind == ActionKind.GROW]


def test_a_partition_pause_cannot_be_undone_by_a_scoped_paused_false() -> None:
    cfg = parse_config("version = 1\n[partition.train]\npaused = false\n[profile.p]\npaused_jobs = [7]\n")
    out = with_paused_jobs(cfg, frozenset({10}))
    assert out.paused_jobs == {10}
    assert out.with_active_profile("p").paused_jobs == {7, 10}
    assert with_paused_jobs(cfg, frozenset()) is cfg


def test_paused_units_by_scope(world: World) -> None:
    from slurm_elastic.controller.units import SpecCache, build_units

    ctl, slurm, _agents, _clock, store = world
    slurm.add_job(10, ["n1"])
    units = build_units(slurm.snapshot(), read_script=slurm.batch_script,
                        is_known_key=lambda p, k: False, cache=SpecCache()).units
    store.pauses.pause(PauseScope.PARTITION, "other", who="root")
    assert paused_units(units, store.pauses.list_pauses()) == frozenset()
    store.pauses.pause(PauseScope.PARTITION, "train", who="root")
    assert paused_units(units, store.pauses.list_pauses()) == {10}


def test_the_newest_stored_policy_version_is_in_force_at_the_next_cycle(world: World) -> None:
    ctl, slurm, agents, clock, store = world
    slurm.add_job(10, ["n1"])
    agents.util[("n1", 10)] = 95.0
    store.policies.add_policy("version = 1\npaused = true\n", author="root")
    run(ctl, clock, 1)
    assert ctl.policy_version == 1 and ctl.policy.resolve("paused").value is True
    store.policies.add_policy("version = 1\nscale_up_above = 1000\n", author="root")  # invalid: kept out
    run(ctl, clock, 1)
    assert ctl.policy_version == 2 and ctl.policy.resolve("paused").value is True
    run(ctl, clock, 6)
    assert not store.journal.list_actions(job_id=10)


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


PROFILE_POLICY = POLICY_TEXT + """
[profile.weekend]
windows = ["Sat,Sun 00:00-24:00"]
scale_up_above = 60
"""


def test_explain_shows_the_rule_the_signal_and_the_profile_behind_each_decision(tmp_path: Path) -> None:
    """T0 is Sunday 12:00: the "weekend" profile is in force; its decisions say so, and explain shows it."""
    clock = FakeClock(T0)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    store = SqlStore.open(url)
    slurm = FakeSlurm(clock)
    agents = Agents(clock)
    policy = parse_config(PROFILE_POLICY)
    ctl = Controller(ControllerConfig(interval_s=2.0, holder="test"), policy, slurm=slurm,
                     store=store, collector=agents, clock=clock)
    slurm.add_job(10, ["n1"])
    agents.util[("n1", 10)] = 70.0  # a grow only under the weekend profile's scale_up_above = 60
    run(ctl, clock, 8)
    store.close()
    out = CliRunner().invoke(main, ["explain", "--url", url, "10", "-P", "--last", "50"])
    assert out.exit_code == 0, out.output
    rows = [line.split("|") for line in out.output.splitlines()]
    header = next(r for r in rows if r[0] == "time")
    assert header[:6] == ["time", "action", "nodes", "reason", "based_on", "profile"]
    decided = [r for r in rows if len(r) == len(header) and r[0] != "time"]
    assert any(r[1] == "grow" and r[4] == "utilization" and r[5] == "weekend" for r in decided), out.output
    # The settings are resolved at the real now (the CLI's own clock): the profile only on a real weekend.
    weekend = datetime.now(tz=UTC).weekday() >= 5
    assert ["profile_now", "weekend" if weekend else "(none)"] in rows, out.output
    default_up = str(DEFAULTS["scale_up_above"])  # the packaged default
    assert ["scale_up_above", "60" if weekend else default_up, "profile weekend" if weekend else "default"] in rows
