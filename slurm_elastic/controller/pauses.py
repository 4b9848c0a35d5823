"""Operator pauses (``slurm-elastic pause``) folded into the policy for one cycle (pure).

A paused unit still goes through the whole policy and is recorded as a hold with reason PAUSED (its intent in
the message). The pauses become the policy's global ``paused_jobs``: that check comes before every scoped
``paused`` value, so no partition, account, QOS, profile or directive setting can un-pause a paused job."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import cast

from slurm_elastic.policy import ElasticUnit, PolicyConfig
from slurm_elastic.policy.config import LayerSet
from slurm_elastic.store.records import PauseRecord, PauseScope


def paused_units(units: Iterable[ElasticUnit], pauses: Iterable[PauseRecord]) -> frozenset[int]:
    pauses = list(pauses)
    if any(p.scope is PauseScope.GLOBAL for p in pauses):
        return frozenset(u.unit_id for u in units)
    parts = {p.target for p in pauses if p.scope is PauseScope.PARTITION}
    jobs = {p.target for p in pauses if p.scope is PauseScope.JOB}
    return frozenset(u.unit_id for u in units
                     if u.job.partition in parts or str(u.unit_id) in jobs
                     or (u.job.het_job_id is not None and str(u.job.het_job_id) in jobs))


def _with(layers: LayerSet, ids: frozenset[int]) -> LayerSet:
    have = cast(tuple[int, ...], layers.global_values.get("paused_jobs", ()))
    values = dict(layers.global_values)
    values["paused_jobs"] = tuple(sorted(set(have) | ids))
    return replace(layers, global_values=values)


def with_paused_jobs(cfg: PolicyConfig, ids: frozenset[int]) -> PolicyConfig:
    """``cfg`` with ``ids`` added to ``paused_jobs`` wherever it can be set (the base and every profile)."""
    if not ids:
        return cfg
    profiles = {name: _with(layers, ids) if "paused_jobs" in layers.global_values else layers
                for name, layers in cfg.profiles.items()}
    return replace(cfg, base=_with(cfg.base, ids), profiles=profiles)
