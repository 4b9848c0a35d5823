"""How the normalized spec lives in a job's admin_comment next to whatever an administrator wrote there.

The spec is one bracketed segment, ``[elastic:v1 min=1 max=3]``, anywhere in the text:

- writing (plugins/job_submit.lua at submit time, :func:`embed` here) replaces the first ``[elastic:...]``
  segment and deletes any further ones; with no segment, it appends `` [...]`` (or the segment alone when the
  admin_comment is empty). The rest of the text is kept byte for byte;
- reading takes the first segment; ``[elastic:off]`` is an administrator's switch that makes the job not
  elastic (the job_submit plugin keeps the segment when an admin later rewrites the admin_comment without
  one, see slurm_job_modify).

A second segment, ``[elastic-partitions:train,cold]``, keeps the partitions an elastic job was submitted to
(``sbatch -p train,cold``) when they are several: Slurm shows a running job only the one it runs in (squeue,
scontrol and sacct alike, measured on 22.05), and its extension jobs may use any of them
(:func:`submitted_partitions`). The plugin writes it as it writes the spec, and keeps it on an admin's rewrite.
"""

from __future__ import annotations

import re

from slurm_elastic.directives.spec import ElasticSpec, from_normalized

SEGMENT = re.compile(r"\[elastic:[^\[\]]*\]")  # no brackets inside: "[elastic: [elastic:v1]" is read right
OFF = "elastic:off"
PARTITIONS = re.compile(r"\[elastic-partitions:([^\[\]\s]*)\]")


def extract(admin_comment: str | None) -> str | None:
    """The body of the first ``[elastic:...]`` segment (without brackets), or None."""
    if not admin_comment:
        return None
    m = SEGMENT.search(admin_comment)
    return m.group(0)[1:-1] if m else None


def embed(admin_comment: str | None, body: str) -> str:
    """``admin_comment`` with its elastic segment set to ``[body]`` (see the module docstring)."""
    segment = f"[{body}]"
    if not admin_comment:
        return segment
    if SEGMENT.search(admin_comment) is None:
        return f"{admin_comment} {segment}"
    first = True

    def replace(_: re.Match[str]) -> str:
        nonlocal first
        if first:
            first = False
            return segment
        return ""

    return SEGMENT.sub(replace, admin_comment)


def spec_from_admin_comment(admin_comment: str | None) -> ElasticSpec | None:
    """The spec stored on a job, or None (no segment, or ``[elastic:off]``). Raises SpecFormatError."""
    body = extract(admin_comment)
    if body is None or body == OFF:
        return None
    return from_normalized(body)


def submitted_partitions(admin_comment: str | None) -> tuple[str, ...]:
    """The partitions of the job's ``[elastic-partitions:a,b]`` segment in the order given, each once; () without
    one (a job submitted to one partition, or before the plugin kept the list)."""
    m = PARTITIONS.search(admin_comment or "")
    return tuple(dict.fromkeys(p for p in m.group(1).split(",") if p)) if m else ()
