"""What ``doctor`` finds: one :class:`Finding` per check (or per agent), each OK, WARN or FAIL, with what to
change and where."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


class Verdict(enum.IntEnum):
    """Ordered: the report's worst status decides the exit status (0, 1, 2)."""

    OK = 0
    WARN = 1
    FAIL = 2


@dataclass(frozen=True)
class Finding:
    check: str      # stable name, e.g. "select_type", "agent:n1"
    status: Verdict
    detail: str     # what was found, with the values that decided
    fix: str = ""   # what to change and where ("" when OK)

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "status": self.status.name, "detail": self.detail, "fix": self.fix}


def ok(check: str, detail: str) -> Finding:
    return Finding(check, Verdict.OK, detail)


def warn(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, Verdict.WARN, detail, fix)


def fail(check: str, detail: str, fix: str) -> Finding:
    return Finding(check, Verdict.FAIL, detail, fix)


def worst(findings: Iterable[Finding]) -> Verdict:
    return max((f.status for f in findings), default=Verdict.OK)


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Key = value`` lines as a dict (the first occurrence of a key wins: the sections
    after it, e.g. cgroup.conf's, keep their own keys). From 23.11 on, a list setting prints one line per entry
    (``Prolog[0] = /a``, ``Prolog[1] = /b``): they are joined with commas under ``Prolog``, as 22.05 prints them.
    ``(null)`` stays as printed: :func:`value` reads it as unset."""
    out: dict[str, str] = {}
    listed: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, val = line.partition("=")
        key = key.strip()
        if not sep or not key or " " in key:
            continue
        m = _INDEXED.match(key)
        if m:
            listed.setdefault(m.group(1), []).append(val.strip())
        else:
            out.setdefault(key, val.strip())
    for key, values in listed.items():
        out.setdefault(key, ",".join(values))
    return out


_INDEXED = re.compile(r"^(\w+)\[\d+\]$")


def value(config: Mapping[str, str], key: str) -> str:
    """The setting, "" when unset (``(null)``, ``none``, ``N/A`` or absent)."""
    v = config.get(key, "").strip()
    return "" if v in ("(null)", "none", "None", "N/A") else v
