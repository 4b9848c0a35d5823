"""Read one Pollux application's measurements (placements.csv, scalability.csv, validation-<bsz>.csv)."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_elastic.sim.errors import TraceFormatError


@dataclass(frozen=True)
class PlacementRow:
    placement: tuple[int, ...]  # GPUs per node, e.g. (2, 2) for "22"
    local_bsz: int
    step_time: float
    sync_time: float


@dataclass(frozen=True)
class ScalabilityRow:
    num_nodes: int
    num_replicas: int
    local_bsz: int
    step_time: float
    sync_time: float


@dataclass(frozen=True)
class ValidationRow:
    progress: float
    iteration: float
    grad_sqr: float
    grad_var: float


@dataclass(frozen=True)
class AppMeasurements:
    name: str
    placements: tuple[PlacementRow, ...]
    scalability: tuple[ScalabilityRow, ...]
    validation: Mapping[int, tuple[ValidationRow, ...]]  # global batch size -> per-epoch rows, sorted by size


_VALIDATION_NAME = re.compile(r"^validation-(\d+)\.csv$")


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceFormatError(str(path), None, f"cannot read: {exc.strerror}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceFormatError(str(path), 1, f"missing column(s) {', '.join(missing)}")
        for row in reader:
            yield reader.line_num, row


def _field(path: Path, line: int, row: Mapping[str, str], name: str, conv: Callable[[str], float]) -> float:
    raw = row.get(name)
    try:
        value = conv(raw or "")
    except ValueError:
        raise TraceFormatError(str(path), line, f"{name}={raw!r} is not a number") from None
    if math.isnan(value) or value < 0:
        raise TraceFormatError(str(path), line, f"{name}={raw!r} must be a non-negative number")
    return value


def _int(raw: str) -> float:
    return float(int(raw))


def load_app(directory: Path) -> AppMeasurements:
    """Parse one application directory; every malformed row is reported with its file and line."""
    name = directory.name
    placements: list[PlacementRow] = []
    path = directory / "placements.csv"
    for line, row in _rows(path, ("placement", "local_bsz", "step_time", "sync_time")):
        text = row["placement"].strip()
        if not text.isdigit() or "0" in text:
            raise TraceFormatError(str(path), line, f"placement={text!r} is not a string of per-node GPU counts")
        placements.append(
            PlacementRow(
                placement=tuple(int(c) for c in text),
                local_bsz=int(_field(path, line, row, "local_bsz", _int)),
                step_time=_field(path, line, row, "step_time", float),
                sync_time=_field(path, line, row, "sync_time", float),
            )
        )
    scalability: list[ScalabilityRow] = []
    path = directory / "scalability.csv"
    for line, row in _rows(path, ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")):
        scalability.append(
            ScalabilityRow(
                num_nodes=int(_field(path, line, row, "num_nodes", _int)),
                num_replicas=int(_field(path, line, row, "num_replicas", _int)),
                local_bsz=int(_field(path, line, row, "local_bsz", _int)),
                step_time=_field(path, line, row, "step_time", float),
                sync_time=_field(path, line, row, "sync_time", float),
            )
        )
    validation: dict[int, tuple[ValidationRow, ...]] = {}
    for path in sorted(directory.glob("validation-*.csv")):
        match = _VALIDATION_NAME.match(path.name)
        if not match:
            continue
        rows = [
            ValidationRow(
                progress=_field(path, line, row, "progress", float),
                iteration=_field(path, line, row, "iteration", float),
                grad_sqr=_field(path, line, row, "grad_sqr", float),
                grad_var=_field(path, line, row, "grad_var", float),
            )
            for line, row in _rows(path, ("progress", "iteration", "grad_sqr", "grad_var"))
        ]
        validation[int(match.group(1))] = tuple(rows)
    if not placements or not validation:
        raise TraceFormatError(str(directory), None, "needs placements.csv and at least one validation-<bsz>.csv")
    return AppMeasurements(
        name=name,
        placements=tuple(placements),
        scalability=tuple(scalability),
        validation=dict(sorted(validation.items())),
    )
