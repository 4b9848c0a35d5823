"""The bridge from the simulator's elastic hook to the production policy, ``slurm_elastic.policy.decide``.

Every scheduling cycle the engine hands over its :class:`~slurm_elastic.sim.elastic.SimClusterState`; this
module turns it into exactly what the controller builds on a real cluster (a Slurm
:class:`~slurm_elastic.slurm.model.ClusterSnapshot`, :class:`~slurm_elastic.policy.ElasticUnit` values with
extension jobs, :class:`~slurm_elastic.policy.JobUtilization` aggregated over each unit's window, the resize
history) and calls :func:`slurm_elastic.policy.decide`. It never decides anything itself: grow and shrink
decisions become :class:`~slurm_elastic.sim.elastic.ResizeRequest` values, holds become nothing.

Modelling rules (docs/simulator.md, "The production policy in the simulator", says why):

* **Clock.** ``now`` is ``EPOCH`` (Monday 2024-01-01 00:00 UTC) plus the simulated seconds, UTC-aware, so that
  time-window profiles see a fixed calendar.
* **Cluster.** One partition, ``sim``, holding nodes ``n0..n{N-1}``, each with ``gpu:G``. A node is IDLE with
  no GPU in use, ALLOCATED with all in use, MIXED otherwise (``gres_used`` says how many).
* **Jobs.** Slurm ids are given in submission order (1, 2, ...). Priority is Slurm's multifactor priority
  with only the age factor: ``1 + whole minutes waited`` (capped at 7 days, Slurm's default PriorityMaxAge);
  a running job keeps the priority it had when it started, because Slurm recomputes only pending jobs. A
  pending job asks for ``ceil(gpus / G)`` nodes with ``gpu:ceil(gpus / nodes)`` each; the head of the queue
  waits for ``Resources``, the others for ``Priority``. The account is the trace's, else ``app-<application>``
  (Pollux traces have none; this gives fair share and quotas something to split), else none.
* **Units.** Every running job is elastic: ``--min-nodes``/``--max-nodes`` come from :class:`AdapterSettings`
  (fixed when the job starts, within the engine's bounds). Nodes the job got when it started are the leader's;
  each applied grow is one running extension job holding the added nodes (the engine adds whole free nodes
  and shrinks from the most recently added, which is the policy's removal order).
* **Metrics.** One utilization sample per cycle and unit, as the controller stores: the time-weighted mean of
  the modelled GPU utilization (compute / step time incl. sync; 0 while starting or restarting) since the
  previous cycle, in percent. The policy input is built by the controller's builder
  (:class:`~slurm_elastic.policy.inputs.PolicyInputBuilder`): samples from ``window_s + 2 x interval`` back,
  so ``window_s`` counts as filled once samples span it, goodput only where the settings use it. Each cycle
  in which the job computed, it also "publishes" its throughput (the model's samples/s on its current shape,
  through the goodput API), tagged with its node count; the last ``THROUGHPUT_KEEP`` samples per size are
  kept. After the job's first resize its observed restart time (the simulator's resize cost) is reported as
  ``restart_s``.
* **Progress.** Each cycle adds the span since the previous one to the unit's attained service (GPUs held x
  seconds) and, while it runs on fewer nodes than it started with, to its time shrunk (``requested_nodes``,
  ``shrunk_s``, ``attained_gpu_s``: tail_protection and victim_by_service), as the controller derives them
  from its journal.
* **Time limits.** The policy sees the time limit the base scheduler trusts (``--walltime-factor`` times the
  modelled runtime at the requested size, or the trace's own), as Slurm would; ``AdapterSettings(time_limits=
  False)`` shows every job as UNLIMITED instead. A shrink's ``time_limit_add_s`` (extend_time_limit_on_shrink)
  is added to the job's limit when the engine applies it, as the controller does with ``scontrol update
  TimeLimit=``, so the policy and the base scheduler's backfill both see the new limit. The simulator never
  kills a job that overruns its limit (the optimistic case).
* **Grace.** A shrink is applied ``grace_s`` after the decision (the job gets its signal, then loses nodes),
  at the first cycle at or after that; meanwhile it is an action in progress, so the policy holds the unit's
  other actions (ACTION_IN_PROGRESS), as it does for the controller's open actions.
* **History.** Each action is journalled at decision time (any outcome starts the cooldown), then marked
  applied or failed once the engine's next snapshot shows whether it happened; a SHRINK_TO_ADMIT records the
  pending jobs it was for, so the admit back-off works. Like the controller, the policy sees every resize of
  the running units decided in the last day, not only each unit's last (sim/journal.py says what reads them).
* **Grow back-off and power.** The facts the controller gives the grow back-off and the power rules come from the
  controller's code: a grow the engine did not apply is a refused grow (slurm_elastic/backoff.py
  ``refused_grow_end``: GROW_BACKOFF; on a real cluster such a grow may instead pend as an extension job, so
  this is the stricter reading), an extension cut by a shrink an end by us; a cold node (sim/power.py) shows
  ``POWERED_DOWN``/``POWERING_UP`` and the controller's PowerTracker measures its resume time (``power_state``),
  so the power walk charges its resume. Resumes never fail here (no RESUME_FAILED), and prewarms are not
  modelled. tests/unit/test_policy_input_paths_facts.py replays one such run through the controller.

One :class:`ProductionPolicy` serves one run: it keeps per-run state (samples, history, extension jobs).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

from slurm_elastic.backoff import refused_grow_end
from slurm_elastic.controller.power import PowerTracker, power_state
from slurm_elastic.directives.spec import ElasticSpec
from slurm_elastic.errors import ConfigError
from slurm_elastic.policy import (
    Action,
    Decision,
    ElasticUnit,
    ExtensionJob,
    Outcome,
    PolicyConfig,
    ResizeRecord,
    ThroughputSample,
    decide,
    default_config,
    parse_config,
)
from slurm_elastic.policy.holds import LOOKBACK_S
from slurm_elastic.policy.inputs import PolicyInputBuilder, Sample, UnitMeasure
from slurm_elastic.policy.model import ActionInProgress, ExtensionEnd
from slurm_elastic.policy.moldable import start_floors
from slurm_elastic.sim.config import SimConfig
from slurm_elastic.sim.elastic import JobView, ResizeRequest, SimClusterState
from slurm_elastic.sim.errors import SimulationError
from slurm_elastic.sim.journal import Entry, SimJournal
from slurm_elastic.sim.slurm_view import (
    PARTITION,
    USER,
    AdapterSettings,
    account_of,
    age_priority,
    at,
    build_job,
    build_node,
    job_bounds,
    node_name,
)
from slurm_elastic.slurm.model import ClusterSnapshot as SlurmSnapshot
from slurm_elastic.slurm.model import GresCount, Job, Node, Partition

THROUGHPUT_KEEP = 10  # throughput samples kept per node count
EXTENSION_ID_BASE = 1_000_000_000  # extension job ids: never clash with trace jobs (1, 2, ...)


@dataclass
class _Extension:
    job_id: int
    nodes: list[str]
    start: datetime
    job: Job


@dataclass
class _Unit:
    """Per-run state of one running trace job."""

    job_id: int
    spec: ElasticSpec  # --min-nodes/--max-nodes from AdapterSettings
    start_nodes: int
    priority: int
    leader: list[str]
    nodes: tuple[int, ...]
    last_t: float
    exts: list[_Extension] = field(default_factory=list)
    samples: deque[Sample] = field(default_factory=deque)
    throughput: dict[int, deque[ThroughputSample]] = field(default_factory=dict)
    leader_job: Job | None = None
    restarted: bool = False
    time_limit_added_s: int = 0  # added by shrinks, not given back by grows (what the controller's store keeps)
    shrunk_s: float = 0.0  # seconds run below start_nodes (tail_protection)
    attained_gpu_s: float = 0.0  # GPU-seconds held since it started (victim_by_service)
    molded_request: int | None = None  # moldable start began it on fewer GPUs: the whole nodes it asked for


@dataclass
class _Inflight:
    record: ResizeRecord
    entry: Entry  # its journal entry, settled once the engine had its chance
    target: int
    due: float  # when the engine is asked (after the grace period for a shrink)
    sent: bool = False
    time_limit_add_s: int = 0
    gpus: int = 0  # a GPU-granular grow: GPUs of the one added entry, on node index ``node``
    node: int | None = None


class ProductionPolicy:
    """``policy(snapshot, now) -> requests`` through ``slurm_elastic.policy.decide``. One instance per run."""

    def __init__(self, cfg: PolicyConfig, sim: SimConfig, settings: AdapterSettings | None = None) -> None:
        self.cfg = cfg
        self.sim = sim
        self.settings = settings or AdapterSettings()
        # the policy's global moldable_start: the engine molds waiting jobs with the controller's rule when on
        self.moldable_start = bool(cfg.resolve("moldable_start").value)
        self.mold_only_if_faster = bool(cfg.resolve("mold_only_if_faster").value)
        self.calls = 0
        self.actions: Counter[str] = Counter()  # "grow SPEEDUP_GAIN" -> grows and shrinks decided (for bench/)
        self._ids: dict[str, int] = {}
        self._trace_ids: dict[int, str] = {}
        self._units: dict[str, _Unit] = {}
        self._inflight: dict[str, _Inflight] = {}
        self._journal = SimJournal()
        self._next_ext = EXTENSION_ID_BASE
        self._nodes: dict[tuple[int, int, int, str], Node] = {}
        # The controller's own facts, from the same code: resume times measured from the nodes' power states
        # (controller/power.py) and the grows that ended, for the grow back-off (slurm_elastic/backoff.py).
        self._power = PowerTracker()
        self._ends: list[ExtensionEnd] = []
        self._last_now: float | None = None

    # ------------------------------------------------------------------ the hook

    def __call__(self, snapshot: SimClusterState, now: float) -> Sequence[ResizeRequest]:
        if self._last_now is not None and now <= self._last_now:
            raise SimulationError("a ProductionPolicy serves one run; make a new one (make_policy) per run")
        self._last_now = now
        self.calls += 1
        t = at(now)
        running = [v for v in snapshot.jobs if v.state == "RUNNING"]
        pending = [v for v in snapshot.jobs if v.state == "PENDING"]
        for view in pending:
            self._id(view.job_id)
        self._observe(running, now)
        builder = PolicyInputBuilder(self.cfg, t, self.sim.interval)
        units, samples, measures, jobs = self._units_input(running, builder)
        head = True
        for view in pending:
            jobs.append(build_job(view, self._ids[view.job_id], age_priority(now - view.submit_time),
                                  snapshot.gpus_per_node, reason="Resources" if head else "Priority",
                                  time_limit=self.settings.time_limits))
            head = False
        slurm = SlurmSnapshot(
            taken_at=t, jobs=tuple(jobs), nodes=self._slurm_nodes(snapshot),
            partitions=(Partition(PARTITION, tuple(node_name(n.index) for n in snapshot.nodes), is_default=True),),
        )
        history = self._journal.history(t)
        in_progress = [ActionInProgress(f.record.unit_id, str(f.record.action), f.record.at)
                       for f in self._inflight.values()]
        self._power.observe(slurm, t)  # resumes never fail here: no RESUME_FAILED (docs/simulator.md)
        self._ends = [e for e in self._ends if e.ended_at > t - timedelta(seconds=LOOKBACK_S)]
        # moldable start: the fewest whole nodes each waiting job may start on (the controller's function)
        views = {self._ids[view.job_id]: view for view in pending}
        g = snapshot.gpus_per_node

        def floor_of(job: Job) -> tuple[int, int] | None:  # a trace job's min, the whole nodes in its GPUs
            view = views.get(job.job_id)  # (not an extension job)
            return None if view is None else (view.min_nodes, view.requested_gpus // g)

        molds = start_floors(slurm, self.cfg, floor_of)
        inp = builder.build(slurm, units, samples=samples, measures=measures, history=history,
                            in_progress=in_progress, extension_ends=self._ends,
                            power=power_state(self._power, None, {}), pending_min_nodes=molds)
        decisions = decide(inp, self.cfg, t)
        return self._act(decisions, now, t)

    # ------------------------------------------------------------------ bookkeeping

    def _id(self, trace_id: str) -> int:
        found = self._ids.get(trace_id)
        if found is None:
            found = self._ids[trace_id] = len(self._ids) + 1
            self._trace_ids[found] = trace_id
        return found

    def _ready(self, view: JobView) -> float:
        """When the job's current (re)start delay ends (or ended)."""
        ready = (view.start_time or 0.0) + self.sim.start_delay
        if view.last_resize_time is not None:
            ready = max(ready, view.last_resize_time + self.sim.resize_cost)
        return ready

    def _observe(self, running: list[JobView], now: float) -> None:
        seen: set[str] = set()
        for view in running:
            seen.add(view.job_id)
            unit = self._units.get(view.job_id)
            if unit is None:
                unit = self._units[view.job_id] = self._new_unit(view)
            elif view.nodes != unit.nodes:
                self._reconcile(unit, view)
            self._sample(unit, view, now)
            self._settle(view, unit, now)
        for gone in [k for k in self._units if k not in seen]:
            del self._units[gone]
            self._inflight.pop(gone, None)
            self._journal.forget(self._ids[gone])

    def _new_unit(self, view: JobView) -> _Unit:
        job_id = self._id(view.job_id)
        lo, hi = job_bounds(self.settings, view.requested_gpus, view.num_nodes, self.sim.gpus_per_node,
                            engine=(view.min_nodes, view.max_nodes))
        start = view.start_time if view.start_time is not None else 0.0
        g = self.sim.gpus_per_node
        molded = -(-view.requested_gpus // g) if view.num_gpus < view.requested_gpus else None
        return _Unit(
            job_id=job_id, spec=ElasticSpec(min_nodes=lo, max_nodes=hi, explicit=frozenset({"min_nodes", "max_nodes"})),
            start_nodes=view.num_nodes,
            priority=age_priority(start - view.submit_time), leader=[node_name(n) for n in view.nodes],
            nodes=view.nodes, last_t=start, molded_request=molded,
        )

    def _reconcile(self, unit: _Unit, view: JobView) -> None:
        """Turn the engine's node list into leader nodes plus extension jobs (grows append, shrinks cut)."""
        old, new = unit.nodes, view.nodes
        unit.nodes = new
        when = at(view.last_resize_time if view.last_resize_time is not None else 0.0)
        if len(new) > len(old) and new[: len(old)] == old:
            names = [node_name(n) for n in new[len(old):]]
            per_node = max(view.gpus_per_node[len(old):], default=self.sim.gpus_per_node)  # k: GPU-granular grow
            self._next_ext += 1
            ext_job = Job(
                job_id=self._next_ext, name=f"{view.job_id}-ext", user=view.user or USER, account=account_of(view),
                partition=PARTITION, qos=None, priority=unit.priority, state="RUNNING", state_reason=None,
                nodes=tuple(names), batch_host=names[0], node_count=len(names),
                tres_per_node=f"gres:gpu:{per_node}",
                gres_per_node=(GresCount("gpu", None, per_node),), time_limit_min=None,
                submit_time=when, start_time=when, end_time=None, comment="", admin_comment="",
            )
            unit.exts.append(_Extension(self._next_ext, names, when, ext_job))
        elif len(new) < len(old) and old[: len(new)] == new:
            drop = len(old) - len(new)
            while drop and unit.exts:
                ext = unit.exts[-1]
                cut = min(drop, len(ext.nodes))
                drop -= cut
                if cut == len(ext.nodes):  # cancelled by the shrink: an end by us, no failure
                    unit.exts.pop()
                    self._ends.append(ExtensionEnd(unit.job_id, ext.job_id, "CANCELLED", ext.start, when))
                else:
                    ext.nodes = ext.nodes[: len(ext.nodes) - cut]
                    ext.job = replace(ext.job, nodes=tuple(ext.nodes), node_count=len(ext.nodes))
            if drop:
                unit.leader = unit.leader[: len(unit.leader) - drop]
        else:  # not something the engine does; start over from what it says
            unit.leader, unit.exts = [node_name(n) for n in new], []
        unit.leader_job = None

    def _sample(self, unit: _Unit, view: JobView, now: float) -> None:
        span = now - unit.last_t
        if span <= 0:
            return
        busy = 0.0 if view.restarting_until is not None else max(0.0, now - max(unit.last_t, self._ready(view)))
        value = 100.0 * view.gpu_util * busy / span
        unit.samples.append(Sample(at(now), value, value))
        unit.attained_gpu_s += view.num_gpus * span  # the size held since the last cycle, as the journal would say
        if view.num_nodes < unit.start_nodes:
            unit.shrunk_s += span
        if busy > 0 and view.throughput > 0:
            per_size = unit.throughput.setdefault(view.num_nodes, deque(maxlen=THROUGHPUT_KEEP))
            per_size.append(ThroughputSample(at(now), view.num_nodes, view.throughput))
        unit.last_t = now
        if view.resizes:
            unit.restarted = True

    def _settle(self, view: JobView, unit: _Unit, now: float) -> None:
        """Mark a journalled action applied or failed once the engine had its chance."""
        flight = self._inflight.get(view.job_id)
        if flight is None or not flight.sent:
            return
        record = flight.record
        applied = view.num_nodes == flight.target and view.last_resize_time is not None and \
            view.last_resize_time >= flight.due
        self._journal.settle(flight.entry, Outcome.APPLIED if applied else Outcome.FAILED,
                             at(view.last_resize_time) if applied and view.last_resize_time is not None else record.at)
        if not applied and record.action is Action.GROW:  # as a refused sbatch: the grow back-off counts it
            self._ends.append(refused_grow_end(record.unit_id, record.at, record.at))
        if applied:
            unit.time_limit_added_s = max(0, unit.time_limit_added_s + flight.time_limit_add_s)
        del self._inflight[view.job_id]

    # ------------------------------------------------------------------ policy input

    def _units_input(self, running: list[JobView], builder: PolicyInputBuilder) -> tuple[
            list[ElasticUnit], dict[int, deque[Sample]], dict[int, UnitMeasure], list[Job]]:
        """The running units, their samples (trimmed to the window the builder reads) and measures, and the
        Slurm jobs that stand for them (leaders and extension jobs)."""
        units: list[ElasticUnit] = []
        samples: dict[int, deque[Sample]] = {}
        measures: dict[int, UnitMeasure] = {}
        jobs: list[Job] = []
        for view in running:
            state = self._units[view.job_id]
            if state.leader_job is None:
                state.leader_job = build_job(view, state.job_id, state.priority, self.sim.gpus_per_node,
                                             nodes=tuple(state.leader), time_limit=self.settings.time_limits)
            jobs.append(state.leader_job)
            exts = tuple(ExtensionJob(e.job_id, "RUNNING", tuple(e.nodes), len(e.nodes), e.start, e.start, e.nodes[0])
                         for e in state.exts)
            jobs.extend(e.job for e in state.exts)
            unit = ElasticUnit(state.leader_job, state.spec, exts,  # max is explicit: no submitted_nodes
                               time_limit_added_s=state.time_limit_added_s, requested_nodes=state.start_nodes,
                               shrunk_s=state.shrunk_s, attained_gpu_s=state.attained_gpu_s,
                               molded_request=state.molded_request)
            units.append(unit)
            since = builder.reads(unit).since
            while state.samples and state.samples[0].time < since:
                state.samples.popleft()
            samples[state.job_id] = state.samples
            measures[state.job_id] = UnitMeasure(
                gpus_allocated=view.num_gpus, gpus_in_use=round(view.num_gpus * view.gpu_util),
                throughput=tuple(s for q in state.throughput.values() for s in q),
                restart_s=self.sim.resize_cost if state.restarted else None, adaptive=view.adaptive)
        return units, samples, measures, jobs

    def _slurm_nodes(self, snapshot: SimClusterState) -> tuple[Node, ...]:
        out: list[Node] = []
        for view in snapshot.nodes:
            key = (view.index, view.total_gpus, view.total_gpus - view.free_gpus, view.power)
            node = self._nodes.get(key)
            if node is None:
                node = self._nodes[key] = build_node(view.index, view.total_gpus, key[2], view.power)
            out.append(node)
        return tuple(out)

    # ------------------------------------------------------------------ decisions -> requests

    def _act(self, decisions: Sequence[Decision], now: float, t: datetime) -> list[ResizeRequest]:
        out: list[ResizeRequest] = []
        for d in decisions:
            trace_id = self._trace_ids[d.unit_id]
            if d.action is Action.HOLD:  # incl. units with an action in flight (ACTION_IN_PROGRESS)
                continue
            self.actions[f"{d.action} {d.reason}"] += 1
            entry = self._journal.record(d, t)
            record = ResizeRecord(at=t, unit_id=d.unit_id, action=d.action, from_nodes=d.current_nodes,
                                  to_nodes=d.target_nodes, outcome=Outcome.INTENT, reason=str(d.reason))
            due = now + (d.grace_s if d.action is Action.SHRINK else 0)
            add = (d.shrink.time_limit_add_s if d.shrink is not None
                   else -d.grow.time_limit_sub_s if d.grow is not None else 0)  # a grow gives back
            gpus, node = _partial(d, self.sim.gpus_per_node)
            self._inflight[trace_id] = _Inflight(record, entry, d.target_nodes, due, time_limit_add_s=add,
                                                 gpus=gpus, node=node)
        for trace_id, flight in self._inflight.items():
            if not flight.sent and flight.due <= now:
                flight.sent = True
                flight.due = now
                out.append(ResizeRequest(trace_id, flight.target, flight.record.reason,
                                         time_limit_add_s=flight.time_limit_add_s, gpus=flight.gpus,
                                         node=flight.node))
        return out


def _partial(d: Decision, gpus_per_node: int) -> tuple[int, int | None]:
    """(GPUs, node index) of a GPU-granular grow (an extension job of fewer GPUs than a node has), else (0, None)."""
    if d.grow is None or len(d.grow.nodes) != 1:
        return 0, None
    k = sum(g.count for g in d.grow.gres_per_node if g.name == "gpu")
    if not 0 < k < gpus_per_node:
        return 0, None
    return k, int(d.grow.nodes[0].removeprefix("n"))


def load_policy_config(policy_file: Path | None) -> PolicyConfig:
    """The production policy config from a TOML file, or the packaged defaults."""
    if policy_file is None:
        return default_config()
    try:
        text = policy_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read policy file {policy_file}: {exc.strerror or exc}") from None
    return parse_config(text, source=str(policy_file))


def make_policy(policy_file: Path | None, config: SimConfig, settings: AdapterSettings | None = None
                ) -> ProductionPolicy:
    """The simulator's elastic policy: the production policy configured by ``policy_file`` (TOML)."""
    return ProductionPolicy(load_policy_config(policy_file), config, settings)
