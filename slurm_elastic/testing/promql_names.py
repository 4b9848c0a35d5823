"""Metric names referenced by PromQL expressions (for checking dashboards against real /metrics output)."""

from __future__ import annotations

import re

_FUNCS_AND_WORDS = frozenset({
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "changes", "delta", "histogram_quantile",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool",
    "label_values", "topk", "bottomk", "abs", "clamp_min", "clamp_max", "time", "vector", "scalar",
    "avg_over_time", "max_over_time", "min_over_time", "last_over_time", "quantile",
})
_STRIP = (re.compile(r'"(?:[^"\\]|\\.)*"'), re.compile(r"\{[^}]*\}"), re.compile(r"\[[^\]]*\]"),
          re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"))
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    text = expr
    for pattern in _STRIP:
        text = pattern.sub(" ", text)
    out: set[str] = set()
    for m in _IDENT.finditer(text):
        name = m.group(0)
        rest = text[m.end():].lstrip()
        if name in _FUNCS_AND_WORDS or rest.startswith("(") or re.fullmatch(r"\d.*", name):
            continue
        if text[max(0, m.start() - 1)] in "0123456789.":
            continue  # part of a number such as 1e3
        out.add(name)
    return out
