"""Property tests of ``decide`` on random clusters: bounds, stale metrics, capacity, determinism."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_elastic.policy import (
    Action,
    Basis,
    Decision,
    ElasticUnit,
    ExtensionJob,
    JobUtilization,
    PolicyConfig,
    PolicyInput,
    Reason,
    decide,
)
from slurm_elastic.policy.capacity import is_free_node
from slurm_elastic.slurm.model import Job, Node
from tests.unit.policy_builders import NOW, cfg, ext, job, make_input, node, pending, record, tput, unit, util

PARTITIONS = (("gpu",), ("gpu",), ("gpu", "other"), ("other",))
METRIC_REASONS_NEED_FRESH = {Reason.UNDERUTILIZED, Reason.OVERUTILIZED, Reason.LOW_MARGINAL_EFFICIENCY}


@dataclass(frozen=True)
class Scenario:
    inp: PolicyInput
    config: PolicyConfig
    fresh: frozenset[int]  # units whose utilization is usable (present, fresh, window filled, enough samples)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n_nodes = draw(st.integers(1, 20))
    names = [f"n{i}" for i in range(1, n_nodes + 1)]
    gpus = {n: draw(st.sampled_from([2, 4, 8])) for n in names}
    parts = {n: draw(st.sampled_from(PARTITIONS)) for n in names}
    free = list(names)
    units: list[ElasticUnit] = []
    utils: list[JobUtilization] = []
    fresh: set[int] = set()
    history = []
    ext_id = 5000
    for i in range(draw(st.integers(0, 6))):
        if not free:
            break
        uid = 100 + i
        lead = [free.pop(0) for _ in range(min(len(free), draw(st.integers(1, 2))))]
        exts: list[ExtensionJob] = []
        for _ in range(draw(st.integers(0, 2))):
            running = draw(st.booleans())
            if free and running:
                exts.append(ext(ext_id, (free.pop(0),), started_ago=draw(st.sampled_from([100, 4000, 6000]))))
            elif draw(st.integers(0, 3)) == 0:
                exts.append(ext(ext_id, (), state="PENDING", count=1, started_ago=draw(st.sampled_from([100, 4000]))))
            ext_id += 1
        partition = parts[lead[0]][0]
        current = len(lead) + sum(len(e.nodes) for e in exts if e.is_running)
        lo = draw(st.integers(1, 4))
        hi = draw(st.integers(lo, 6))
        up = draw(st.integers(30, 100))
        spec_kw = {"min_nodes": lo, "max_nodes": hi, "step": draw(st.integers(1, 3)),
                   "scale_up_above": up, "scale_down_below": draw(st.integers(0, up - 1))}
        if draw(st.integers(0, 5)) == 0:
            spec_kw[draw(st.sampled_from(["grow", "shrink"]))] = False
        the_job = job(uid, nodes=tuple(lead), partition=partition, priority=draw(st.integers(0, 5)) * 100,
                      gpus=draw(st.sampled_from([1, 2, 4, 8])), account=draw(st.sampled_from(["a", "b", None])),
                      started_ago=draw(st.sampled_from([8000, 1000, 30])),
                      time_limit_min=draw(st.one_of(st.none(), st.integers(60, 400))))
        built = unit(the_job, exts=exts, **spec_kw)
        added_s = draw(st.sampled_from([0, 0, 600, 7200]))  # what earlier shrinks added to its time limit
        units.append(replace(built, time_limit_added_s=added_s) if added_s else built)
        if draw(st.integers(0, 4)):
            age = draw(st.sampled_from([5, 60, 179, 181, 5000]))
            window = draw(st.sampled_from([100, 600, 1200]))
            samples = draw(st.sampled_from([3, 10, 120]))
            mean = draw(st.floats(0, 100))
            tp = tput(current, 100.0) + tput(max(1, current - 1), draw(st.floats(1, 200)), age=4000)
            utils.append(util(uid, mean, age=age, window=window, samples=samples, throughput=tp,
                              restart=draw(st.one_of(st.none(), st.floats(0, 600)))))
            if age <= 180 and window >= spec_kw.get("window_s", 600) and samples >= 10:
                fresh.add(uid)
        if draw(st.integers(0, 3)) == 0:
            history.append(record(uid, draw(st.sampled_from([2000, 10]))))
    used = {n for u in units for n in [*u.job.nodes, *(x for e in u.extensions for x in e.nodes)]}
    all_nodes: list[Node] = []
    for n in names:
        if n in used:
            all_nodes.append(node(n, gpus=gpus[n], used=gpus[n], partitions=parts[n]))
        else:
            kind = draw(st.sampled_from(["idle", "idle", "idle", "down", "drain", "half", "mixed_cpu"]))
            all_nodes.append({
                "idle": node(n, gpus=gpus[n], partitions=parts[n]),
                "down": node(n, gpus=gpus[n], partitions=parts[n], state="DOWN"),
                "drain": node(n, gpus=gpus[n], partitions=parts[n], flags=("DRAIN",)),
                "half": node(n, gpus=gpus[n], used=gpus[n] // 2, partitions=parts[n]),
                "mixed_cpu": node(n, gpus=gpus[n], partitions=parts[n], state="MIXED"),
            }[kind])
    pend: list[Job] = [
        pending(900 + k, count=draw(st.integers(1, 3)), gpus=draw(st.sampled_from([0, 2, 4, 8])),
                priority=draw(st.integers(0, 6)) * 100, partition=draw(st.sampled_from(["gpu", "other", "gpu,other"])),
                reason=draw(st.sampled_from(["Resources", "Priority", "Dependency"])))
        for k in range(draw(st.integers(0, 4)))
    ]
    config = cfg(
        shrink_to_admit=draw(st.booleans()),
        reclaim_reserve=draw(st.booleans()),
        fair_share=draw(st.booleans()),
        restart_cost_aware=draw(st.booleans()),
        goodput=draw(st.booleans()),
        free_node_reserve=draw(st.integers(0, 2)),
        max_actions_per_cycle=draw(st.integers(1, 8)),
        startup_protection_s=draw(st.sampled_from([0, 300, 120])),
        cooldown_s=draw(st.sampled_from([0, 300])),
        min_remaining_for_grow_s=draw(st.sampled_from([0, 900])),
        max_extension_nodes_per_account=draw(st.sampled_from([-1, 0, 1, 3])),
        max_extension_gpus_per_qos=draw(st.sampled_from([-1, 0, 4, 16])),
        growth_cap_percent=draw(st.sampled_from([100, 50, 10])),
        extend_time_limit_on_shrink=draw(st.booleans()),
    )
    inp = make_input(units, all_nodes, pending_jobs=pend, utils=utils, history=history,
                     shares={"a": draw(st.floats(0.1, 5)), "b": draw(st.floats(0.1, 5))})
    limits = draw(st.dictionaries(st.sampled_from(["account:a", "account:b", "qos:normal", "qos_user:normal",
                                                   "user:a/alice"]), st.integers(0, 64), max_size=3))
    inp = replace(inp, gpu_limits=limits, extension_qos=draw(st.sampled_from([None, "normal", "scav"])))
    return Scenario(inp, config, frozenset(fresh))


PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _by_id(decisions: list[Decision]) -> dict[int, Decision]:
    return {d.unit_id: d for d in decisions}


@PROPS
@given(scenarios())
def test_one_decision_per_unit_sorted(sc: Scenario) -> None:
    out = decide(sc.inp, sc.config, NOW)
    assert [d.unit_id for d in out] == sorted(u.unit_id for u in sc.inp.units)


@PROPS
@given(scenarios())
def test_min_and_max_are_never_violated(sc: Scenario) -> None:
    units = {u.unit_id: u for u in sc.inp.units}
    for d in decide(sc.inp, sc.config, NOW):
        u = units[d.unit_id]
        assert d.current_nodes == u.current_nodes
        if d.action is Action.GROW:
            assert u.current_nodes < d.target_nodes <= u.max_nodes
            assert d.grow is not None and len(d.grow.nodes) == d.target_nodes - d.current_nodes
            assert u.spec.grow
        elif d.action is Action.SHRINK:
            assert u.min_nodes <= d.target_nodes < u.current_nodes
            assert d.shrink is not None and len(d.shrink.released_nodes) == d.current_nodes - d.target_nodes
            assert u.keep_host not in d.shrink.released_nodes
            assert set(d.shrink.released_nodes) <= {*u.job.nodes, *(n for e in u.extensions for n in e.nodes)}
            assert u.spec.shrink
        else:
            assert d.target_nodes == d.current_nodes


@PROPS
@given(scenarios())
def test_no_metric_driven_resize_on_stale_or_missing_metrics(sc: Scenario) -> None:
    for d in decide(sc.inp, sc.config, NOW):
        if d.unit_id in sc.fresh or d.action is Action.HOLD:
            continue
        # only resizes that do not rest on metrics: the queue (shrink-to-admit), the partition's reserve, or the
        # unit's own bounds
        assert d.reason in {Reason.SHRINK_TO_ADMIT, Reason.RESERVE_RECLAIM, Reason.ABOVE_MAX, Reason.BELOW_MIN}
        assert d.basis in {Basis.QUEUE, Basis.RESERVE, Basis.BOUNDS}
        assert d.reason not in METRIC_REASONS_NEED_FRESH


@PROPS
@given(scenarios())
def test_stale_metrics_alone_never_shrink(sc: Scenario) -> None:
    """With shrink-to-admit and reserve reclaim off, a unit without usable metrics only holds (or returns
    within its bounds)."""
    config = sc.config
    off = {**config.base.global_values, "shrink_to_admit": False, "reclaim_reserve": False}
    for d in decide(sc.inp, replace(config, base=replace(config.base, global_values=off)), NOW):
        if d.unit_id not in sc.fresh:
            assert d.action is Action.HOLD or d.reason in {Reason.ABOVE_MAX, Reason.BELOW_MIN}


@PROPS
@given(scenarios())
def test_granted_nodes_are_free_distinct_and_fit(sc: Scenario) -> None:
    nodes = {n.name: n for n in sc.inp.snapshot.nodes}
    requested = {n for u in sc.inp.units for e in u.extensions if e.is_pending for n in e.nodes}
    free = {n for n, nd in nodes.items() if is_free_node(nd) and n not in requested}
    granted: list[str] = []
    decisions = decide(sc.inp, sc.config, NOW)
    units = {u.unit_id: u for u in sc.inp.units}
    for d in decisions:
        if d.grow is None:
            continue
        u = units[d.unit_id]
        for name in d.grow.nodes:
            assert name in free
            assert u.job.partition in nodes[name].partitions
            assert nodes[name].gpus() >= u.job.gpus_per_node()
        granted.extend(d.grow.nodes)
    assert len(granted) == len(set(granted)) <= len(free)
    reserve = sc.config.resolve("free_node_reserve").value
    assert isinstance(reserve, int)
    for part in {p for nd in nodes.values() for p in nd.partitions}:
        free_here = sum(1 for n in free if part in nodes[n].partitions)
        granted_here = sum(1 for n in granted if part in nodes[n].partitions)
        assert granted_here <= max(0, free_here - reserve)
    assert sum(d.is_action for d in decisions) <= sc.config.max_actions_per_cycle


@PROPS
@given(scenarios(), st.randoms(use_true_random=False))
def test_deterministic_and_independent_of_input_order(sc: Scenario, rnd: random.Random) -> None:
    first = decide(sc.inp, sc.config, NOW)
    assert decide(sc.inp, sc.config, NOW) == first
    units, jobs, nodes = list(sc.inp.units), list(sc.inp.snapshot.jobs), list(sc.inp.snapshot.nodes)
    history = list(sc.inp.history)
    for seq in (units, jobs, nodes, history):
        rnd.shuffle(seq)
    units = [replace(u, extensions=tuple(rnd.sample(u.extensions, len(u.extensions)))) for u in units]
    shuffled = replace(
        sc.inp,
        snapshot=replace(sc.inp.snapshot, jobs=tuple(jobs), nodes=tuple(nodes), _by_id={}),
        units=tuple(units),
        history=tuple(history),
        utilization=dict(rnd.sample(list(sc.inp.utilization.items()), len(sc.inp.utilization))),
    )
    assert decide(shuffled, sc.config, NOW) == first


@PROPS
@given(scenarios())
def test_grants_never_take_an_account_past_its_slurm_gpu_limit(sc: Scenario) -> None:
    """What Slurm would refuse (AssocGrpGRES) is never planned: this cycle's grants of an account stay within
    what its GrpTRES gres/gpu leaves after its running jobs and our pending extensions."""
    decisions = decide(sc.inp, sc.config, NOW)
    units = {u.unit_id: u for u in sc.inp.units}
    for key, limit in sc.inp.gpu_limits.items():
        if not key.startswith("account:"):
            continue
        account = key.split(":", 1)[1]
        used = sum(j.gpus_per_node() * len(j.nodes) for j in sc.inp.snapshot.jobs
                   if j.is_running and j.account == account)
        used += sum(u.job.gpus_per_node() * e.node_count for u in sc.inp.units if u.job.account == account
                    for e in u.extensions if e.is_pending)
        granted = sum(units[d.unit_id].job.gpus_per_node() * len(d.grow.nodes) for d in decisions
                      if d.action is Action.GROW and d.grow is not None and units[d.unit_id].job.account == account)
        assert granted <= max(0, limit - used)


@PROPS
@given(scenarios())
def test_time_limits_never_end_below_what_the_user_asked_for(sc: Scenario) -> None:
    """A grow gives back at most what shrinks added (and whole minutes of it); the extension job it plans
    never outlives the leader's shortened remaining time; holds and shrinks give nothing back."""
    units = {u.unit_id: u for u in sc.inp.units}
    for d in decide(sc.inp, sc.config, NOW):
        u = units[d.unit_id]
        if d.grow is None:
            continue
        sub = d.grow.time_limit_sub_s
        assert 0 <= sub <= u.time_limit_added_s and sub % 60 == 0
        remaining = u.job.remaining_seconds(NOW)
        if remaining is None:
            assert sub == 0 and d.grow.time_limit_s is None
        else:
            assert d.grow.time_limit_s == max(0, int(remaining) - sub)

