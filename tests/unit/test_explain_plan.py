"""``explain`` with the round plan on (allocator = true): the planned size, rho and what it rests on, and the
share the plan gave the waiting job a victim's shrink admits. The controller runs the recorded cycles of
test_policy_input_paths_facts.py (three busy units, a moldable arrival of three nodes, min one); explain reads
the decisions it stored, through the API service and the CLI's table."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from slurm_elastic.api.authz import AccessPolicy
from slurm_elastic.api.service import Service, ServiceSettings
from slurm_elastic.cli import decisions_cmd
from slurm_elastic.cli.explain_plan import plan_rows
from slurm_elastic.sim.policy_adapter import at
from tests.unit.storehelpers import FakeClock, memory_store
from tests.unit.test_api_service import ROOT
from tests.unit.test_policy_input_paths_facts import PLAN_POLICY, PLAN_TEXT, _record_plan, _replay_with


def _rows(out: str) -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        rows.setdefault(key, value.strip())
    return rows


def test_explain_shows_a_victims_plan_rho_and_the_share_of_the_job_it_admits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _record_plan(monkeypatch)
    clock = FakeClock(at(rec.times[0]))
    store = memory_store(clock)
    ctl, _ = _replay_with(rec, monkeypatch, PLAN_POLICY, clock, store)
    shrink = next(d for ds in ctl.decisions for d in ds if d.shrink is not None)
    kept = next(d.unit_id for d in ctl.decisions[1] if d.shrink is None)
    svc = Service(store, ServiceSettings(access=AccessPolicy(), base_policy=lambda: (PLAN_TEXT, "policy.toml")),
                  clock=clock)
    monkeypatch.setattr(decisions_cmd, "call", lambda url, sock, op, args: svc.handle(ROOT, op, args))
    out = CliRunner().invoke(decisions_cmd.explain_cmd, [str(shrink.unit_id)]).output
    rows = _rows(out)
    assert rows["plan"].startswith("1 node(s) planned, 2 held")
    i = next(d for d in ctl.decisions[-1] if d.unit_id == shrink.unit_id).inputs  # the newest stored decision
    assert rows["rho"] == (f"{i['rho']} = projected JCT {i['projected_jct_s']:,.0f} s / rigid-equivalent JCT "
                           f"{i['rigid_jct_s']:,.0f} s; remaining from as long again as it ran, speeds from "
                           f"utilization model ({clock():%Y-%m-%dT%H:%M:%S})")
    assert rows["admits"].startswith(f"gave 1 node(s) to waiting job(s) {shrink.shrink.admits[0]}, planned at a "
                                     "share of 2 node(s)")
    other = _rows(CliRunner().invoke(decisions_cmd.explain_cmd, [str(kept)]).output)
    assert other["plan"].startswith("2 node(s) planned, 2 held") and "admits" not in other


def test_a_waiting_jobs_mold_shows_its_share_and_a_protected_unit_says_so() -> None:
    mold = {"time": "2026-12-05T10:00:00+00:00", "action": "mold", "reason": "MOLDABLE_START",
            "current_nodes": 3, "target_nodes": 2, "inputs": {"plan_share": 2, "molded_nodes": 2}}
    hold = {"time": "2026-12-05T09:59:00+00:00", "action": "hold", "reason": "IN_BAND", "current_nodes": 2,
            "target_nodes": 1, "inputs": {"rho": "1.4", "rigid_jct_s": "1000", "projected_jct_s": "1400",
                                          "rho_after_shrink": 1.9}}
    rows = dict(plan_rows([mold, hold]))
    assert rows["share"] == ("started on 2 of its 3 requested node(s); the round plan's share was 2 "
                             "(2026-12-05T10:00:00)")
    assert rows["rho"].startswith("1.4 = projected JCT 1,400 s / rigid-equivalent JCT 1,000 s")
    assert rows["rho"].endswith("; protected: never a victim, first for spare nodes; 1.900 after the shrink")
    assert "plan" not in rows
    assert plan_rows([{**hold, "inputs": {}}]) == []  # the allocator off: no plan lines
