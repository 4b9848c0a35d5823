"""Read an opted-in job's adaptive-batch file for the policy (docs/goodput.md, "Adaptive batch size").

``<WorkDir>/.slurm-elastic/gradstats-<job id>.jsonl``, written by :mod:`slurm_elastic.goodput` (``opt_in``,
``publish_grad_stats``), read with the same safety and cost rules as the goodput file
(:func:`slurm_elastic.controller.goodput.read_file`: the path from Slurm's job record, a regular file owned by the
job's user, appended bytes only, at most the last 64 KiB at once, the last 4,096 records kept). What the records
leave (:func:`slurm_elastic.batchsize.read_state`: the latest opt-in, statistics and step-time fit) becomes
``JobUtilization.adaptive``; the policy then ranks the unit's grows by the goodput model.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slurm_elastic.batchsize import AdaptiveState, read_state
from slurm_elastic.controller.goodput import FileState, Refused, read_job_file
from slurm_elastic.goodput import DIR_NAME
from slurm_elastic.policy import ElasticUnit

log = logging.getLogger(__name__)


def parse_records(data: bytes, *, now: float) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of the complete lines in ``data`` and how many non-empty lines were not one; a record
    dated more than 5 s in the future counts as bad."""
    out: list[dict[str, Any]] = []
    bad = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            rec = None
        at = rec.get("time") if isinstance(rec, dict) else None
        if not isinstance(rec, dict) or not isinstance(at, (int, float)) or at > now + 5.0:
            bad += 1
            continue
        out.append(rec)
    return out, bad


@dataclass
class GradStatsReader:
    files: dict[str, FileState] = field(default_factory=dict)
    _logged: set[tuple[str, str]] = field(default_factory=set)

    def path_for(self, unit: ElasticUnit) -> str | None:
        work_dir = unit.job.working_dir
        if not work_dir or not os.path.isabs(work_dir):
            return None
        return os.path.join(work_dir, DIR_NAME, f"gradstats-{unit.unit_id}.jsonl")

    def read_unit(self, unit: ElasticUnit, now: datetime, gpus_per_node: int) -> AdaptiveState | None:
        """The unit's adaptive-batch state; None when it has no file, did not opt in, or the file is refused
        (logged once per path and reason)."""
        path = self.path_for(unit)
        if path is None:
            return None
        try:
            state = read_job_file(unit, path, self.files.get(path), now=now.timestamp(), parse=parse_records)
        except Refused as e:
            self._refused(unit, path, str(e))
            return None
        if state is None:
            self.files.pop(path, None)
            return None
        self.files[path] = state
        return read_state(state.reports, max(1, gpus_per_node))

    def forget(self, keep: set[str]) -> None:
        """Drop the state of files of units no longer running."""
        for path in [p for p in self.files if p not in keep]:
            self.files.pop(path, None)

    def _refused(self, unit: ElasticUnit, path: str, why: str) -> None:
        if (path, why) not in self._logged:
            self._logged.add((path, why))
            log.warning("job %s: not reading its adaptive-batch file %s: %s", unit.job.display_id, path, why)
        self.files.pop(path, None)
