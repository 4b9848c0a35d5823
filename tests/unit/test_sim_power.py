"""Power saving in the simulator (slurm_elastic/sim/power.py): which nodes are off, the boot a job on one waits
for, and energy as powered node-seconds."""

from __future__ import annotations

import pytest

from slurm_elastic.errors import ConfigError
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.engine import Simulation
from slurm_elastic.sim.invariants import check_invariants
from slurm_elastic.sim.perfmodel.base import JobPerf
from slurm_elastic.sim.power import NodePower, PowerReport, PowerSaving

from .simhelpers import LinearPerf, job

COLD = PowerSaving(cold_nodes=1, resume_s=100.0, suspend_s=300.0)


def test_a_cold_node_boots_when_used_and_goes_off_after_suspend_s() -> None:
    p = NodePower(COLD, 2)  # node 0 always on, node 1 cold
    assert not p.is_off(0, 0.0) and p.is_off(1, 0.0)
    assert p.used(0, 10.0) == 0.0
    assert p.used(1, 10.0) == 100.0 and p.resumes == 1
    p.freed(1, 1000.0)
    assert p.used(1, 1200.0) == 0.0  # idle 200 s < 300 s: still on
    p.freed(1, 1500.0)
    assert p.is_off(1, 1801.0) and p.used(1, 1900.0) == 100.0 and p.resumes == 2
    p.freed(1, 2000.0)
    p.freed(0, 2000.0)
    r = p.report(3000.0)
    # node 0: 3000 s; node 1: [10, 1500 + 300] and [1900, 2000 + 300] = 1790 + 400
    assert (r.powered_node_s, r.always_on_node_s, r.resumes) == (3000.0 + 1790.0 + 400.0, 6000.0, 2)
    assert r.until(4000.0) == r.powered_node_s + 1000.0  # only the always-on node after the run's end


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="cold_nodes"):
        PowerSaving(cold_nodes=-1, resume_s=1, suspend_s=1)
    with pytest.raises(ConfigError, match="exceeds"):
        NodePower(PowerSaving(cold_nodes=3, resume_s=1, suspend_s=1), 2)


def _run(power: PowerSaving | None) -> tuple[dict[str, tuple[float, float]], PowerReport | None]:
    # Two 4-GPU nodes, node 1 cold. A takes node 0; B arrives while A runs and must go to the cold node 1.
    jobs = [job("A", 0.0, 4), job("B", 10.0, 4)]
    perf: dict[str, JobPerf] = {"A": LinearPerf(runtime=1000.0, gpus=4), "B": LinearPerf(runtime=500.0, gpus=4)}
    result = Simulation(SimConfig(2, 4, scheduler="fifo", start_delay=0.0, power=power), jobs, perf).run()
    assert check_invariants(result, 2) == []
    return {r.job_id: (r.start_time, r.end_time) for r in result.jobs}, result.power


def test_the_job_on_a_powered_down_node_waits_for_its_boot_and_energy_is_counted() -> None:
    plain, none = _run(None)
    assert none is None
    ends, report = _run(COLD)
    assert ends["A"] == plain["A"] and ends["B"] == (plain["B"][0], plain["B"][1] + 100.0)  # B boots node 1 first
    assert report is not None and report.resumes == 1
    end = max(e for _, e in ends.values())
    (b_start, b_end) = ends["B"]
    # node 0 for the whole run; node 1 from B's start until 300 s after B, or the end of the run
    assert report.powered_node_s == pytest.approx(end + min(end, b_end + 300.0) - b_start)
