"""Helpers shared by the CSV loaders: rows with their line numbers, typed field conversion, typed errors."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO

from slurm_elastic.sim.errors import TraceFormatError


def split_selector(workload: str) -> tuple[str, str | None]:
    """``PATH#SELECTOR`` -> (PATH, SELECTOR); the selector picks a tar member or a sub-cluster."""
    path, sep, selector = workload.partition("#")
    return path, (selector if sep and selector else None)


def open_text(path: str) -> IO[str]:
    try:
        return open(path, newline="", encoding="utf-8")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise TraceFormatError(path, None, f"cannot read: {exc.strerror or exc}") from exc


def csv_rows(source: str, lines: Iterable[str], required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row) for each data row; reject a missing header column or a short/long row."""
    reader = csv.reader(lines)
    try:
        header = next(reader)
    except StopIteration:
        raise TraceFormatError(source, 1, "empty file (expected a header line)") from None
    except csv.Error as exc:
        raise TraceFormatError(source, reader.line_num, f"bad CSV: {exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(source, reader.line_num + 1, f"not UTF-8 text: {exc.reason}") from None
    header = [h.strip() for h in header]
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceFormatError(source, 1, f"missing column(s) {', '.join(missing)} in header {','.join(header)}")
    while True:
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceFormatError(source, reader.line_num, f"bad CSV: {exc}") from None
        except UnicodeDecodeError as exc:
            raise TraceFormatError(source, reader.line_num + 1, f"not UTF-8 text: {exc.reason}") from None
        if not values or all(not v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise TraceFormatError(
                source,
                reader.line_num,
                f"expected {len(header)} fields ({','.join(header)}), got {len(values)}",
            )
        yield reader.line_num, dict(zip(header, values, strict=True))


def text_lines(data: bytes, source: str) -> Iterable[str]:
    try:
        return io.StringIO(data.decode("utf-8"), newline="")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(source, None, f"not UTF-8 text: {exc}") from None


def number(source: str, line: int, row: Mapping[str, str], name: str, *, minimum: float = 0.0) -> float:
    raw = row.get(name, "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise TraceFormatError(source, line, f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < minimum:
        raise TraceFormatError(source, line, f"{name}={raw!r} must be a finite number >= {minimum:g}")
    return value


def integer(source: str, line: int, row: Mapping[str, str], name: str, *, minimum: int = 0) -> int:
    raw = row.get(name, "").strip()
    try:
        value = int(raw)
    except ValueError:
        try:
            as_float = float(raw)
        except ValueError:
            raise TraceFormatError(source, line, f"{name}={raw!r} is not an integer") from None
        if not as_float.is_integer():
            raise TraceFormatError(source, line, f"{name}={raw!r} is not an integer") from None
        value = int(as_float)
    if value < minimum:
        raise TraceFormatError(source, line, f"{name}={raw!r} must be >= {minimum}")
    return value
