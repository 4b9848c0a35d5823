"""Snapshot -> elastic units: spec from admin_comment or script (read once), invalid directives, extensions."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from slurm_elastic.controller import units
from slurm_elastic.controller.extension import ExtensionTag
from slurm_elastic.controller.units import SpecCache, build_units
from slurm_elastic.slurm.model import ClusterSnapshot, GresCount, Job

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
BASE = Job(job_id=0, name="j", user="alice", account="nlp", partition="train", qos="normal", priority=10,
           state="RUNNING", state_reason=None, nodes=("n1",), batch_host="n1", node_count=1,
           tres_per_node="gres:gpu:4", gres_per_node=(GresCount("gpu", None, 4),), time_limit_min=None,
           submit_time=NOW, start_time=NOW, end_time=None, comment="", admin_comment="")


def job(job_id: int, **kw: object) -> Job:
    return replace(BASE, job_id=job_id, **kw)  # type: ignore[arg-type]


def test_units_from_admin_comment_script_and_invalid() -> None:
    scripts = {2: "#!/bin/bash\n#ELASTIC --min-nodes 1 --max-nodes 3\nsrun x\n",
               3: "#!/bin/bash\n#ELASTIC --min-nodes 5 --max-nodes 2\nsrun x\n",
               4: "#!/bin/bash\nsrun plain\n"}
    reads: list[int] = []

    def read(job_id: int) -> str | None:
        reads.append(job_id)
        return scripts.get(job_id)

    key = "grow:1:9:1"
    snap = ClusterSnapshot(taken_at=NOW, nodes=(), partitions=(), jobs=(
        job(1, admin_comment="site note [elastic:v1 min=1 max=4]"),
        job(2), job(3), job(4),
        job(5, nodes=("n2",), batch_host="n2", comment=ExtensionTag(1, key).render()),
        job(6, user="bob", comment=ExtensionTag(1, key).render()),  # forged: another user
        job(7, state="PENDING", nodes=()),
    ))
    cache = SpecCache()
    res = build_units(snap, read_script=read, is_known_key=lambda p, k: (p, k) == (1, key), cache=cache)
    ids = [u.unit_id for u in res.units]
    assert ids == [1, 2]
    assert res.sources == {1: "admin_comment", 2: "script"}
    unit1 = res.units[0]
    assert unit1.max_nodes == 4 and [e.job_id for e in unit1.extensions] == [5] and unit1.current_nodes == 2
    assert 3 in res.not_elastic and "min" in res.not_elastic[3]
    assert 4 not in res.not_elastic  # no directives: simply not elastic, nothing to report
    assert sorted(reads) == [2, 3, 4]
    build_units(snap, read_script=read, is_known_key=lambda p, k: False, cache=cache)
    assert sorted(reads) == [2, 3, 4]  # scripts are read once per job, not once per cycle


def test_het_component_reads_the_leaders_script() -> None:
    script = "#!/bin/bash\n#ELASTIC --het-group 1 --min-nodes 1 --max-nodes 2\nsrun x\n"
    snap = ClusterSnapshot(taken_at=NOW, nodes=(), partitions=(), jobs=(
        job(8, het_job_id=8, het_job_offset=0), job(9, het_job_id=8, het_job_offset=1, nodes=("n2", "n3"),
                                                       batch_host="n2", node_count=2)))
    res = build_units(snap, read_script=lambda j: script if j == 8 else None, is_known_key=lambda p, k: False,
                      cache=SpecCache())
    assert [u.unit_id for u in res.units] == [9]
    assert res.units[0].max_nodes == 2 and res.units[0].current_nodes == 2


def test_each_distinct_admin_comment_spec_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of jobs carry a handful of distinct specs: each is parsed once, then served from the cache for
    every job and cycle that carries it; an invalid one is remembered with its reason; past MAX_COMMENTS the
    cache starts over."""
    parsed: list[str | None] = []
    real = units.spec_from_admin_comment

    def counting(comment: str | None) -> object:
        parsed.append(comment)
        return real(comment)

    monkeypatch.setattr(units, "spec_from_admin_comment", counting)
    same, other, bad = "[elastic:v1 min=1 max=4]", "note [elastic:v1 min=2 max=3]", "[elastic:v1 min=5 max=2]"
    snap = ClusterSnapshot(taken_at=NOW, nodes=(), partitions=(), jobs=tuple(
        job(i, admin_comment=(same, other, bad)[i % 3]) for i in range(1, 31)))
    cache = SpecCache()
    first = build_units(snap, read_script=lambda j: None, is_known_key=lambda p, k: False, cache=cache)
    again = build_units(snap, read_script=lambda j: None, is_known_key=lambda p, k: False, cache=cache)
    assert sorted(parsed, key=str) == sorted([same, other, bad])
    fresh = build_units(snap, read_script=lambda j: None, is_known_key=lambda p, k: False, cache=SpecCache())
    assert first == again == fresh and len(first.units) == 20
    assert {u.unit_id: u.max_nodes for u in first.units}[1] == 3 and len(first.not_elastic) == 10
    assert all("invalid elastic spec" in why for why in first.not_elastic.values())
    monkeypatch.setattr(units, "MAX_COMMENTS", 2)
    small = SpecCache()
    assert build_units(snap, read_script=lambda j: None, is_known_key=lambda p, k: False, cache=small) == fresh
    assert 1 <= len(small.by_comment) <= 2
