"""The API's operations over the state store: the same code answers the UNIX socket (caller from SO_PEERCRED)
and root's direct ``--url`` access (caller from the process). Results are plain JSON-able dicts; the CLI renders.

Authorization happens here, once, before any read or write: :func:`authorize` per operation, then the job
owner check for per-job reads, and the user filter for listings."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from slurm_elastic.api.authz import AccessPolicy, Caller, authorize, check_job_owner
from slurm_elastic.api.lease_status import controller_state
from slurm_elastic.api.tomltext import apply_assignments, dumps
from slurm_elastic.errors import SlurmElasticError
from slurm_elastic.store import SqlStore
from slurm_elastic.store.agents_sql import is_powered_down
from slurm_elastic.store.records import (
    UNCHANGED_SINCE,
    CycleRecord,
    DecisionFilter,
    DecisionRecord,
    ElasticJobRecord,
    PauseScope,
)

#: (policy text, where it came from) used while no version is stored: the controller's policy_file, or defaults.
BasePolicy = Callable[[], tuple[str, str]]
DEFAULT_POLICY_TEXT = "version = 1\n"


class RequestError(SlurmElasticError):
    """A malformed request (a missing or mistyped argument)."""


class NotFoundError(SlurmElasticError):
    """The job or version asked for does not exist."""


@dataclass(frozen=True)
class ServiceSettings:
    access: AccessPolicy = field(default_factory=AccessPolicy)
    agent_stale_s: float = 120.0  # an agent not scraped successfully for this long is stale
    base_policy: BasePolicy = lambda: (DEFAULT_POLICY_TEXT, "packaged defaults")  # noqa: E731
    via: str = "socket"  # "socket" (a controller process answers) or "direct" (DB only)
    holder: str | None = None  # the lease holder name of the controller that answers the socket


def _int(args: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    value = args.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{key}: expected an integer, got {value!r}")
    return value


def _str(args: Mapping[str, Any], key: str) -> str | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise RequestError(f"{key}: expected a string, got {value!r}")
    return value


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def decision_dict(d: DecisionRecord) -> dict[str, Any]:
    return {"id": d.id, "time": d.time.isoformat(), "cycle": d.cycle_id, "job": d.job_id, "action": d.action,
            "reason": d.reason, "message": d.message, "inputs": d.inputs, "current_nodes": d.current_nodes,
            "target_nodes": d.target_nodes, "signal": d.signal, "profile": d.profile, "paused": d.paused,
            "dry_run": d.dry_run}


def standing_hold(newest: DecisionRecord | None, last_cycle: CycleRecord | None) -> dict[str, Any] | None:
    """The hold a job stands on, when its newest decision is one. Holds are stored when they change and then every
    ``hold_heartbeat_s``, so that row may be minutes old: ``since`` is when the unchanged hold began, ``recorded``
    when its newest row was written, ``last_cycle`` when the controller last decided (it would have stored a
    change since)."""
    if newest is None or newest.action != "hold":
        return None
    since = newest.inputs.get(UNCHANGED_SINCE)
    return {"reason": newest.reason, "since": since if isinstance(since, str) else _iso(newest.time),
            "recorded": _iso(newest.time), "last_cycle": _iso(last_cycle.started_at) if last_cycle else None}


def _nodes_now(rec: ElasticJobRecord) -> dict[str, Any]:
    """min/current/max of a job; one that has ended (failed, completed, cancelled) holds no node now: its last
    size is ``last`` and ``ended`` says when."""
    nodes: dict[str, Any] = {"min": rec.min_nodes, "current": rec.current_nodes, "max": rec.max_nodes}
    if rec.ended_at is not None:
        nodes.update(current=0, last=rec.current_nodes, ended=_iso(rec.ended_at))
    return nodes


class Service:
    def __init__(self, store: SqlStore, settings: ServiceSettings, clock: Callable[[], datetime] | None = None):
        self.store = store
        self.settings = settings
        self.clock = clock or (lambda: datetime.now(tz=UTC))

    def handle(self, caller: Caller, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        authorize(caller, op, self.settings.access)
        method: Callable[[Caller, Mapping[str, Any]], dict[str, Any]] = getattr(self, "op_" + op.replace(".", "_"))
        return method(caller, args)

    # --- reads ------------------------------------------------------------------------------------------------
    def op_whoami(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        return {"user": caller.user, "uid": caller.uid, "admin": caller.is_admin(self.settings.access)}

    def op_status(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        now = self.clock()
        lease = self.store.lease.get()
        cycle = self.store.decisions.last_cycle()
        user = None if caller.sees_all(self.settings.access) else caller.user
        jobs = self.store.jobs.list_jobs(active_only=True, user=user)
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        gpus = self.store.journal.gpu_totals(since=midnight)
        agents = self.store.agents.list_agents()
        off = [a.node for a in agents if is_powered_down(a.last_error)]  # not asked: neither stale nor reachable
        stale = [a.node for a in agents if a.node not in off and (
            a.last_seen is None or (now - a.last_seen).total_seconds() > self.settings.agent_stale_s)]
        state = controller_state(lease, now)  # from the lease: a process answering the socket may be a standby
        me = self.settings.holder if self.settings.via == "socket" else None
        return {**state, "via": self.settings.via,
                "answered_by": me, "standby": None if me is None else me != state["lease_holder"],
                "lease_epoch": lease.epoch if lease else None,
                "lease_expires": _iso(lease.expires_at) if lease else None,
                "last_cycle": _iso(cycle.started_at) if cycle else None,
                "last_cycle_duration_s": cycle.duration_s if cycle else None,
                "last_cycle_error": cycle.error if cycle else None,
                "managed_jobs": len(jobs), "gpus_granted_today": gpus.granted,
                "gpus_reclaimed_today": gpus.reclaimed, "agents": len(agents),
                "agents_reachable": len(agents) - len(stale) - len(off), "agents_stale": sorted(stale),
                "agents_powered_down": sorted(off),
                "pauses": [{"scope": str(p.scope), "target": p.target, "who": p.who}
                           for p in self.store.pauses.list_pauses()]}

    def op_jobs(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        now = self.clock()
        user = None if caller.sees_all(self.settings.access) else caller.user
        jobs = self.store.jobs.list_jobs(active_only=not args.get("all"), user=user)
        last = {jid: ds[0] for jid, ds in
                self.store.decisions.last_decisions_per_job(1, [j.job_id for j in jobs]).items() if ds}
        rows = []
        for j in jobs:
            s = self.store.samples.samples(j.job_id, since=now - timedelta(minutes=10))
            d = last.get(j.job_id)
            rows.append({"job": j.job_id, "user": j.user, "account": j.account, "partition": j.partition,
                         "state": j.state, "min_nodes": j.min_nodes, "max_nodes": j.max_nodes, "paused": j.paused,
                         # an ended job holds no nodes: its last size is what it ended with, not a current one
                         "current_nodes": None if j.ended_at else j.current_nodes,
                         "ended_nodes": j.current_nodes if j.ended_at else None, "ended_at": _iso(j.ended_at),
                         "util_10m": round(sum(x.util_mean for x in s) / len(s), 1) if s else None,
                         "last_action": d.action if d else None, "last_reason": d.reason if d else None,
                         "last_age_s": (now - d.time).total_seconds() if d else None, "note": j.spec_error})
        return {"jobs": rows}

    def _owned_job(self, caller: Caller, job_id: int) -> Any:
        rec = self.store.jobs.get_job(job_id)
        check_job_owner(caller, rec.user if rec else None, job_id, self.settings.access)
        if rec is None:  # only admins get here: others were refused above without learning whether it exists
            raise NotFoundError(f"job {job_id}: not an elastic job the controller knows")
        return rec

    def op_explain(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        from slurm_elastic.directives.spec import from_normalized
        from slurm_elastic.policy import parse_config
        from slurm_elastic.policy.config import UNIT_KEYS
        from slurm_elastic.policy.schema import KEYS

        job_id = _int(args, "job")
        if job_id is None:
            raise RequestError("job: required")
        rec = self._owned_job(caller, job_id)
        text, source = self._policy_text()
        cfg = parse_config(text, source=source).at(self.clock())  # the profile in force now, as the cycle sees it
        resolved = cfg.resolve_all(rec.partition, rec.account, rec.qos)
        explicit: dict[str, Any] = {}
        if rec.spec:
            spec = from_normalized(rec.spec)
            directive_keys = {k.name for k in KEYS if k.directive}
            explicit = {n: getattr(spec, n) for n in spec.explicit if n in directive_keys}
        settings = []
        for key in UNIT_KEYS:
            if key in explicit:
                settings.append({"key": key, "value": explicit[key], "source": "directive"})
            else:
                r = resolved[key]
                settings.append({"key": key, "value": r.value, "source": str(r.provenance)})
        n = _int(args, "last", 10) or 10
        records = self.store.decisions.last_decisions(job_id, n)
        decisions = [decision_dict(d) for d in records]
        pause = self.store.pauses.active_pause(job_id, rec.partition)
        return {"grow_backoff": self._grow_backoff(job_id),
                "job": job_id, "user": rec.user, "account": rec.account, "partition": rec.partition, "qos": rec.qos,
                "state": rec.state, "nodes": _nodes_now(rec),
                "directives": rec.spec, "directives_source": str(rec.spec_source), "directives_error": rec.spec_error,
                "policy_source": source, "profile_now": cfg.active_profile, "settings": settings,
                "decisions": decisions,
                "hold": standing_hold(records[0] if records else None, self.store.decisions.last_cycle()),
                "paused_by": None if pause is None else {"scope": str(pause.scope), "target": pause.target,
                                                         "who": pause.who, "reason": pause.reason}}

    def _grow_backoff(self, job_id: int) -> dict[str, Any] | None:
        """The job's grow back-off now (slurm_elastic/backoff.py), as the next cycle's policy sees it."""
        from slurm_elastic.backoff import unit_backoff
        from slurm_elastic.policy.holds import backoff_until, describe

        b = unit_backoff(self.store, job_id, self.clock())
        if b is None:
            return None
        return {"until": backoff_until(b).isoformat(), "wait_s": b.wait_s, "left_s": round(b.left_s, 1),
                "failed_grows": len(b.failures), "last": describe(b.failures[0]),
                "last_at": b.failures[0].ended_at.isoformat()}

    def op_usage(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        """Elastic jobs of a window for ``report`` (:mod:`slurm_elastic.api.usage`); users get their own."""
        from slurm_elastic.api.usage import usage

        window = []
        for key in ("since", "until"):
            text = _str(args, key)
            try:
                t = datetime.fromisoformat(text) if text else None
            except ValueError:
                t = None
            if t is None or t.tzinfo is None:
                raise RequestError(f"{key}: expected an ISO time with a zone, got {text!r}")
            window.append(t)
        bucket_s, interval_s = (args.get(k, d) for k, d in (("bucket_s", 3600.0), ("interval_s", 60.0)))
        if any(isinstance(v, bool) or not isinstance(v, int | float) or v <= 0 for v in (bucket_s, interval_s)):
            raise RequestError(f"bucket_s, interval_s: expected positive numbers, got {bucket_s!r}, {interval_s!r}")
        user = None if caller.sees_all(self.settings.access) else caller.user
        return usage(self.store, user=user, since=window[0], until=window[1], bucket_s=float(bucket_s),
                     interval_s=float(interval_s))

    def op_decisions(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        job_id = _int(args, "job")
        user = None if caller.sees_all(self.settings.access) else caller.user
        if job_id is not None and user is not None:
            self._owned_job(caller, job_id)
        since_text = _str(args, "since")
        try:
            since = datetime.fromisoformat(since_text) if since_text else None
        except ValueError:
            raise RequestError(f"since: not an ISO time: {since_text!r}") from None
        if since is not None and since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        flt = DecisionFilter(job_id=job_id, since=since, action=_str(args, "action"), reason=_str(args, "reason"),
                             user=user, limit=_int(args, "limit", 50))
        return {"decisions": [decision_dict(d) for d in self.store.decisions.list_decisions(flt)]}

    def op_agents(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        now = self.clock()
        out = []
        for a in self.store.agents.list_agents():
            age = None if a.last_seen is None else (now - a.last_seen).total_seconds()
            off = is_powered_down(a.last_error)
            reachable = age is not None and a.last_error is None and age <= self.settings.agent_stale_s
            out.append({"node": a.node, "url": a.url, "reachable": reachable,
                        "state": "powered down" if off else "reachable" if reachable else "unreachable",
                        "last_seen": _iso(a.last_seen), "age_s": age, "version": a.version, "gpus": a.gpu_count,
                        "error": None if off else a.last_error, "note": a.last_error if off else None})
        return {"agents": out}

    # --- policy -----------------------------------------------------------------------------------------------
    def _policy_text(self) -> tuple[str, str]:
        cur = self.store.policies.current_policy()
        if cur is not None:
            return cur.toml_text, f"policy version {cur.version}"
        return self.settings.base_policy()

    def op_policy_show(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        version = _int(args, "version")
        if version is not None:
            rec = self.store.policies.get_policy(version)
            return {"version": rec.version, "author": rec.author, "created_at": _iso(rec.created_at),
                    "source": f"policy version {rec.version}", "text": rec.toml_text}
        cur = self.store.policies.current_policy()
        text, source = self._policy_text()
        return {"version": cur.version if cur else None, "author": cur.author if cur else None,
                "created_at": _iso(cur.created_at) if cur else None, "source": source, "text": text}

    def op_policy_history(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        return {"versions": [{"version": p.version, "author": p.author, "created_at": _iso(p.created_at),
                              "comment": p.comment, "rollback_of": p.rollback_of}
                             for p in self.store.policies.policy_history(_int(args, "limit"))]}

    def op_policy_diff(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        """``to`` (default: newest) against ``from`` (default: the version before it, else the base policy)."""
        cur = self.store.policies.current_policy()
        to_v = _int(args, "to") or (cur.version if cur else None)
        if to_v is None:
            return {"diff": "", "from": None, "to": None}
        to_text = self.store.policies.get_policy(to_v).toml_text
        from_v = _int(args, "from")
        if from_v is None and to_v > 1:
            from_v = to_v - 1
        from_text = self.store.policies.get_policy(from_v).toml_text if from_v else self.settings.base_policy()[0]
        from_name = f"version {from_v}" if from_v else self.settings.base_policy()[1]
        diff = "".join(difflib.unified_diff(from_text.splitlines(True), to_text.splitlines(True),
                                            fromfile=from_name, tofile=f"version {to_v}"))
        return {"diff": diff, "from": from_v, "to": to_v}

    def op_policy_set(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        from slurm_elastic.policy import parse_config

        assignments = args.get("assignments")
        text = _str(args, "text")
        if text is None:
            if not isinstance(assignments, list) or not assignments or not all(isinstance(a, str)
                                                                              for a in assignments):
                raise RequestError("assignments: a non-empty list of KEY=VALUE strings")
            base, _ = self._policy_text()
            text = dumps(apply_assignments(tomllib.loads(base), assignments))
        parse_config(text, source="the new policy")  # validates types, ranges, bands: raises before storing
        comment = _str(args, "comment") or ("set " + " ".join(assignments) if isinstance(assignments, list) else "")
        rec = self.store.policies.add_policy(text, author=caller.user, comment=comment[:1000])
        return {"version": rec.version, "author": rec.author, "text": rec.toml_text}

    def op_policy_rollback(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        from slurm_elastic.policy import parse_config

        version = _int(args, "version")
        if version is None:
            raise RequestError("version: required")
        old = self.store.policies.get_policy(version)
        parse_config(old.toml_text, source=f"policy version {version}")  # still valid with this code?
        rec = self.store.policies.rollback_policy(version, author=caller.user)
        return {"version": rec.version, "rollback_of": version, "author": rec.author}

    # --- pauses -----------------------------------------------------------------------------------------------
    def _scope(self, args: Mapping[str, Any]) -> tuple[PauseScope, str | None]:
        scope = _str(args, "scope")
        try:
            return PauseScope(scope or ""), _str(args, "target")
        except ValueError:
            raise RequestError(f"scope: one of job, partition, global (got {scope!r})") from None

    def op_pause(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        scope, target = self._scope(args)
        p = self.store.pauses.pause(scope, target, who=caller.user, reason=_str(args, "reason") or "")
        return {"scope": str(p.scope), "target": p.target, "who": p.who, "since": _iso(p.created_at)}

    def op_resume(self, caller: Caller, args: Mapping[str, Any]) -> dict[str, Any]:
        scope, target = self._scope(args)
        return {"scope": str(scope), "target": target, "resumed": self.store.pauses.resume(scope, target)}
