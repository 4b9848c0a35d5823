"""The controller's read path when the job_submit plugin is not installed.

The controller reads a new job's script once (the adapter runs ``scontrol write batch_script JOBID -``; for a
component of a heterogeneous job, the script is the leader's) and hands the text here together with the
component's het offset. Invalid directives do not stop anything at that point: the job simply is not
elastic, and the reason is kept so that ``explain`` can show it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slurm_elastic.directives.parser import parse_script, select_component
from slurm_elastic.directives.spec import DirectiveError, DirectiveWarning, ElasticSpec

Status = Literal["elastic", "not_elastic", "invalid"]


@dataclass(frozen=True)
class JobDirectives:
    """What one job's (or het component's) script says about elasticity."""

    status: Status
    spec: ElasticSpec | None
    errors: tuple[DirectiveError, ...]
    warnings: tuple[DirectiveWarning, ...]
    reason: str  # one line for the store and for explain

    @property
    def elastic(self) -> bool:
        return self.spec is not None


def directives_for_job(script: str | bytes | None, het_job_offset: int | None = None) -> JobDirectives:
    """Parse ``script`` (None: Slurm had no script, e.g. an salloc job) for the job or het component.

    Never raises for any script content.
    """
    if script is None:
        return JobDirectives("not_elastic", None, (), (), "no batch script")
    result = parse_script(script)
    selection = select_component(result, het_job_offset)
    errors = result.errors or selection.errors
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        reason = f"invalid #ELASTIC directives, ignored: line {first.line}: {first.describe()}{more}"
        return JobDirectives("invalid", None, errors, result.warnings, reason)
    spec = selection.spec
    if spec is None:
        if result.directive_lines == 0:
            reason = "no #ELASTIC directives"
        else:
            reason = f"no #ELASTIC directives for het component {het_job_offset}"
        return JobDirectives("not_elastic", None, (), result.warnings, reason)
    return JobDirectives("elastic", spec, (), result.warnings, f"#ELASTIC directives: {spec.to_normalized()}")
