"""Microsoft ITP traces (elasticflow-traces): ``job_id,submission_time,duration,num_gpu``.

``WORKLOAD`` is a CSV file, or the published ``raw-traces.tar.gz`` with the member after ``#``
(``raw-traces.tar.gz#cluster04`` or ``...#cluster04.csv``), read in place without extracting.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable

from slurm_elastic.sim.errors import TraceFormatError
from slurm_elastic.sim.loaders.common import csv_rows, integer, number, open_text, split_selector, text_lines
from slurm_elastic.sim.workload import JobSpec, Workload

COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")


def load_itp(workload: str) -> Workload:
    path, member = split_selector(workload)
    if path.endswith(_ARCHIVE_SUFFIXES):
        data, source = _read_member(path, member)
        return _parse(source, text_lines(data, source), workload)
    if member is not None:
        raise TraceFormatError(path, None, f"#{member} selects a member of an archive, but this is not one")
    with open_text(path) as handle:
        return _parse(path, handle, workload)


def _read_member(path: str, member: str | None) -> tuple[bytes, str]:
    try:
        archive = tarfile.open(path, "r:*")
    except (OSError, tarfile.TarError) as exc:
        raise TraceFormatError(path, None, f"cannot open archive: {exc}") from exc
    with archive:
        csvs = [m for m in archive.getmembers() if m.isfile() and m.name.endswith(".csv")]
        names = sorted(m.name.rsplit("/", 1)[-1] for m in csvs)
        if member is None:
            raise TraceFormatError(path, None, f"pick one member with #NAME: {', '.join(names)}")
        wanted = member if member.endswith(".csv") else f"{member}.csv"
        found = [m for m in csvs if m.name.rsplit("/", 1)[-1] == wanted]
        if not found:
            raise TraceFormatError(path, None, f"no member {wanted} (members: {', '.join(names)})")
        handle = archive.extractfile(found[0])
        if handle is None:  # pragma: no cover - isfile() members always extract
            raise TraceFormatError(path, None, f"cannot read member {wanted}")
        return handle.read(), f"{path}#{wanted}"


def _parse(source: str, lines: Iterable[str], workload: str) -> Workload:
    jobs: list[JobSpec] = []
    seen: dict[str, int] = {}
    for line, row in csv_rows(source, lines, COLUMNS):
        job_id = row["job_id"].strip()
        if not job_id:
            raise TraceFormatError(source, line, "empty job_id")
        if job_id in seen:
            raise TraceFormatError(source, line, f"job_id {job_id} already used on line {seen[job_id]}")
        seen[job_id] = line
        duration = number(source, line, row, "duration")
        if duration <= 0:
            raise TraceFormatError(source, line, f"duration={row['duration']!r} must be > 0")
        jobs.append(
            JobSpec(
                job_id=job_id,
                submit_time=number(source, line, row, "submission_time"),
                num_gpus=integer(source, line, row, "num_gpu", minimum=1),
                duration=duration,
                line=line,
            )
        )
    if not jobs:
        raise TraceFormatError(source, None, "no jobs")
    return Workload(source=workload, jobs=tuple(jobs))
