"""``#ELASTIC`` batch script directives: the grammar, the spec they produce and its normalized form.

This package is the single source of truth; plugins/job_submit.lua mirrors it and the shared vectors in
tests/vectors/directives.json keep the two in step. Pure: no I/O anywhere in here.
"""

from slurm_elastic.directives.admin_comment import embed, extract, spec_from_admin_comment
from slurm_elastic.directives.batch_script import JobDirectives, directives_for_job
from slurm_elastic.directives.options import FORMAT_VERSION, OPTIONS, OptionDef
from slurm_elastic.directives.parser import ComponentSelection, ParseResult, parse_script, select_component
from slurm_elastic.directives.spec import (
    DirectiveError,
    DirectiveWarning,
    ElasticSpec,
    SpecError,
    SpecFormatError,
    from_normalized,
)

__all__ = [
    "FORMAT_VERSION",
    "OPTIONS",
    "ComponentSelection",
    "DirectiveError",
    "DirectiveWarning",
    "ElasticSpec",
    "JobDirectives",
    "OptionDef",
    "ParseResult",
    "SpecError",
    "SpecFormatError",
    "directives_for_job",
    "embed",
    "extract",
    "from_normalized",
    "parse_script",
    "select_component",
    "spec_from_admin_comment",
]
