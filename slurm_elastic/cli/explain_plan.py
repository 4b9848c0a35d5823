"""``explain``'s round-plan lines (``allocator = true``): the size the plan gave a job, its finish-time fairness
rho and what rho rests on, the share a waiting job got.

Read from the job's newest decisions (their recorded inputs, policy/allocator.py and policy/plan.py): ``rho``,
``rigid_jct_s``, ``projected_jct_s``, ``remaining_s.source``, ``speed_source`` (every measured unit each cycle),
``plan_nodes`` (a unit the plan sized), ``rho_after_shrink``, ``admits`` and ``admit_share`` (a victim's
shrink-to-admit: the waiting job and the share the plan gave it), ``plan_share`` (a waiting job's mold: the share
it started at). Holds are stored when they change, so each line says when its decision was made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from slurm_elastic.policy.allocator import PROTECT_ABOVE


def _num(value: Any) -> float | None:
    """A recorded input as a number (inputs come back as numbers or as their text)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _when(d: Mapping[str, Any]) -> str:
    return datetime.fromisoformat(d["time"]).strftime("%Y-%m-%dT%H:%M:%S")


def _newest(decisions: Sequence[Mapping[str, Any]], key: str) -> Mapping[str, Any] | None:
    return next((d for d in decisions if key in (d.get("inputs") or {})), None)  # newest first


def plan_rows(decisions: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The ``explain`` head rows for the plan: ``plan``, ``rho``, ``admits`` and ``share``, each from the newest
    decision that recorded it (``decisions`` newest first); none when the allocator never sized this job."""
    rows: list[tuple[str, str]] = []
    if (d := _newest(decisions, "plan_nodes")) is not None:
        planned = _num(d["inputs"]["plan_nodes"])
        rows.append(("plan", f"{planned:.0f} node(s) planned, {d['current_nodes']} held ({d['action']} "
                             f"{d['reason']}, {_when(d)})" if planned is not None else "(unreadable)"))
    if (d := _newest(decisions, "rho")) is not None:
        i = d["inputs"]
        rho, rigid, projected = (_num(i.get(k)) for k in ("rho", "rigid_jct_s", "projected_jct_s"))
        text = f"{i['rho']}"
        if rigid is not None and projected is not None:
            text += f" = projected JCT {projected:,.0f} s / rigid-equivalent JCT {rigid:,.0f} s"
        text += (f"; remaining from {i.get('remaining_s.source', '?')}, speeds from {i.get('speed_source', '?')}"
                 f" ({_when(d)})")
        if rho is not None and rho > PROTECT_ABOVE:
            text += "; protected: never a victim, first for spare nodes"
        if (after := _num(i.get("rho_after_shrink"))) is not None:
            text += f"; {after:.3f} after the shrink"
        rows.append(("rho", text))
    if (d := _newest(decisions, "admits")) is not None:
        i = d["inputs"]
        share = f", planned at a share of {i['admit_share']} node(s)" if "admit_share" in i else ""
        rows.append(("admits", f"gave {d['current_nodes'] - d['target_nodes']} node(s) to waiting job(s) "
                               f"{i['admits']}{share} ({_when(d)})"))
    if (d := _newest(decisions, "plan_share")) is not None:
        i = d["inputs"]
        rows.append(("share", f"started on {d['target_nodes']} of its {d['current_nodes']} requested node(s); the "
                              f"round plan's share was {i['plan_share']} ({_when(d)})"))
    return rows
