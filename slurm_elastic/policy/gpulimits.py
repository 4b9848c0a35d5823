"""Slurm's own GPU limits as quotas on grows: never plan an extension job that Slurm would leave pending.

An extension job runs under the leader's account, user and QOS, so Slurm checks it against their GrpTRES
``gres/gpu`` limits; over a limit, it pends with ``AssocGrpGRES`` / ``QOSGrpGRES`` (or ``...MaxGRESPerUser``)
and holds the unit's growth (EXTENSION_PENDING) until other jobs end. The policy therefore caps a grow at what
the limits leave, and holds with QUOTA_REACHED when not even one node's GPUs fit.

``PolicyInput.gpu_limits`` maps a scope key (built with :func:`scope_key`) to a GPU count:

==========================  =====================================================================
``account:<account>``       the account association's GrpTRES (jobs of that account)
``user:<account>/<user>``   the user association's GrpTRES (the user's jobs in that account)
``qos:<qos>``               the QOS's GrpTRES (all jobs of the QOS)
``qos_user:<qos>``          the QOS's MaxTRESPerUser (each user's jobs in the QOS)
``qos_account:<qos>``       the QOS's MaxTRESPerAccount (each account's jobs in the QOS)
==========================  =====================================================================

Usage is computed from the snapshot, as Slurm counts it: the GPUs of RUNNING jobs (GRES per node times their
nodes), plus our own pending extension jobs (they will count once they start), plus what this cycle grants.
Accounts are matched by name only: a parent account's limit is not applied to its sub-accounts' jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from slurm_elastic.policy.model import ElasticUnit, Scalar
from slurm_elastic.slurm.model import Job

KINDS = ("account", "user", "qos", "qos_user", "qos_account")
_LABELS = {
    "account": "account {account} GrpTRES",
    "user": "association {account}/{user} GrpTRES",
    "qos": "QOS {qos} GrpTRES",
    "qos_user": "QOS {qos} MaxTRESPerUser (user {user})",
    "qos_account": "QOS {qos} MaxTRESPerAccount (account {account})",
}


def scope_key(kind: str, name: str, user: str | None = None) -> str:
    """``scope_key("account", "nlp")`` -> ``account:nlp``; ``("user", "nlp", "alice")`` -> ``user:nlp/alice``."""
    if kind not in KINDS:
        raise ValueError(f"unknown GPU limit scope {kind!r} (known: {', '.join(KINDS)})")
    return f"{kind}:{name}/{user}" if kind == "user" else f"{kind}:{name}"


def _scopes(job: Job) -> list[tuple[str, str, str]]:
    """(limit key, usage key, label) of every scope that limits ``job``."""
    account, user, qos = job.account or "", job.user, job.qos or ""
    out: list[tuple[str, str, str]] = []
    for kind in KINDS:
        if kind in ("account", "user") and not account:
            continue
        if kind.startswith("qos") and not qos:
            continue
        if kind == "account":
            limit_key = usage_key = scope_key("account", account)
        elif kind == "user":
            limit_key = usage_key = scope_key("user", account, user)
        elif kind == "qos":
            limit_key = usage_key = scope_key("qos", qos)
        elif kind == "qos_user":
            limit_key, usage_key = scope_key("qos_user", qos), f"qos_user:{qos}/{user}"
        else:
            limit_key, usage_key = scope_key("qos_account", qos), f"qos_account:{qos}/{account}"
        out.append((limit_key, usage_key, _LABELS[kind].format(account=account, user=user, qos=qos)))
    return out


def _job_gpus(job: Job) -> int:
    return job.gpus_per_node() * (len(job.nodes) if job.nodes else job.node_count)


class GpuLimitTracker:
    """GPU usage per limited scope during one walk; :meth:`cap` before a grant, :meth:`commit` after it."""

    def __init__(self, limits: Mapping[str, int], jobs: Iterable[Job], units: Iterable[ElasticUnit],
                 extension_qos: str | None = None) -> None:
        self.limits = {k: int(v) for k, v in limits.items() if v is not None and v >= 0}
        self.used: dict[str, int] = {}
        if not self.limits:
            return
        for job in jobs:
            if job.is_running:
                self._add(job, _job_gpus(job))
        for unit in units:
            pending = sum(e.node_count for e in unit.extensions if e.is_pending)
            if pending:  # our pending extensions will count in the QOS they were submitted in
                leader = unit.job
                as_ext = replace(leader, qos=extension_qos) if extension_qos else leader
                self._add(as_ext, pending * leader.gpus_per_node())

    @property
    def active(self) -> bool:
        return bool(self.limits)

    def _add(self, job: Job, gpus: int) -> None:
        if gpus <= 0:
            return
        for limit_key, usage_key, _ in _scopes(job):
            if limit_key in self.limits:
                self.used[usage_key] = self.used.get(usage_key, 0) + gpus

    def cap(self, job: Job, gpus_per_node: int, want: int, inputs: dict[str, Scalar]) -> tuple[int, str]:
        """How many of ``want`` nodes (``gpus_per_node`` GPUs each) the limits leave room for, and the text of
        the tightest limit (empty when none limits). Records ``gpu_limit_left`` and ``gpu_limit_scope``."""
        if not self.limits or gpus_per_node <= 0:
            return want, ""
        allowed, why, tightest = want, "", None
        for limit_key, usage_key, label in _scopes(job):
            limit = self.limits.get(limit_key)
            if limit is None:
                continue
            used = self.used.get(usage_key, 0)
            left = max(0, limit - used)
            if tightest is None or left < tightest[0]:
                tightest = (left, limit_key)
            nodes = left // gpus_per_node
            if nodes < allowed:
                allowed = nodes
                why = (f"{label} gres/gpu={limit} with {used} GPU(s) in use leaves {left} "
                       f"({gpus_per_node} per node)")
        if tightest is not None:
            inputs["gpu_limit_left"] = tightest[0]
            inputs["gpu_limit_scope"] = tightest[1]
        return allowed, why

    def commit(self, job: Job, gpus: int) -> None:
        if self.limits:
            self._add(job, gpus)
