"""A resize's phases from a torchrun template's output and the controller's journal (bench/resize_phases.py).

Each phase is the time from the decision (the journaled intent's ``created_at``) to:

* ``notice``: the controller wrote the resize notice (``notice_t=`` of rank 0's checkpoint line);
* ``checkpoint``: rank 0 saved the checkpoint and acknowledged (``checkpoint saved ... t=``);
* ``leave`` (a shrink): the released node's agent left the rendezvous (the launcher's ``left the rendezvous
  t=``); ``join`` (a grow): the extension's new agent asked to join (its first ``rendezvous join
  role=extension t=`` after the checkpoint; the running agents are already waiting in the round by then);
* ``reform``: an agent's rendezvous round completed at the new world size (``rendezvous complete world=W t=``);
* ``first_step``: rank 0's first step at the new size (``first step=N world=W t=``).

Lines come from every task of the leader and its extension jobs (one output file, ``--open-mode=append``).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

CKPT_RE = re.compile(r"checkpoint saved at step \d+ \(resize\).* notice_t=([\d.]+) t=([\d.]+)")
LEAVE_RE = re.compile(r"left the rendezvous t=([\d.]+)")
JOIN_RE = re.compile(r"rendezvous join role=extension t=([\d.]+)")
COMPLETE_RE = re.compile(r"rendezvous complete world=(\d+) rank=\S+ t=([\d.]+)")
FIRST_RE = re.compile(r"^first step=\d+ world=(\d+) t=([\d.]+)")
PHASES = ("notice", "checkpoint", "leave", "join", "reform", "first_step")


@dataclass(frozen=True)
class Events:
    checkpoints: tuple[tuple[float, float], ...]  # (notice written, acknowledged)
    leaves: tuple[float, ...]
    joins: tuple[float, ...]
    completes: tuple[tuple[int, float], ...]  # (world, time)
    first_steps: tuple[tuple[int, float], ...]  # (world, time)


def events(text: str) -> Events:
    ck, lv, jn, co, fs = [], [], [], [], []
    for line in text.splitlines():
        if m := CKPT_RE.search(line):
            ck.append((float(m.group(1)), float(m.group(2))))
        elif m := LEAVE_RE.search(line):
            lv.append(float(m.group(1)))
        elif m := JOIN_RE.search(line):
            jn.append(float(m.group(1)))
        elif m := COMPLETE_RE.search(line):
            co.append((int(m.group(1)), float(m.group(2))))
        elif m := FIRST_RE.search(line):
            fs.append((int(m.group(1)), float(m.group(2))))
    return Events(tuple(sorted(ck, key=lambda c: c[1])), tuple(sorted(lv)), tuple(sorted(jn)),
                  tuple(sorted(co, key=lambda c: c[1])), tuple(sorted(fs, key=lambda c: c[1])))


@dataclass
class Resize:
    kind: str  # "grow" | "shrink"
    decided: float  # Unix time of the journaled intent
    world: int  # the world size after it
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds after the decision

    def missing(self) -> list[str]:
        want = ("notice", "checkpoint", "leave" if self.kind == "shrink" else "join", "reform", "first_step")
        return [p for p in want if p not in self.phases]


def phases(resize: Resize, ev: Events, until: float | None = None) -> Resize:
    """Fill ``resize.phases`` from the events after its decision (and before ``until``, the next decision)."""
    t0 = resize.decided

    def inside(t: float) -> bool:
        return t >= t0 and (until is None or t < until)

    ck = next(((n, a) for n, a in ev.checkpoints if inside(a)), None)
    if ck is None:
        return resize
    resize.phases["notice"], resize.phases["checkpoint"] = ck[0] - t0, ck[1] - t0
    after = ck[0]  # the notice: a released agent leaves as soon as it reads it
    if resize.kind == "shrink":
        left = next((t for t in ev.leaves if inside(t) and t >= after), None)
        if left is not None:
            resize.phases["leave"] = left - t0
    else:
        joined = next((t for t in ev.joins if inside(t) and t >= ck[1]), None)
        if joined is not None:
            resize.phases["join"] = joined - t0
            after = joined
    done = next((t for w, t in ev.completes if inside(t) and t >= after and w == resize.world), None)
    if done is None:
        return resize
    resize.phases["reform"] = done - t0
    first = next((t for w, t in ev.first_steps if inside(t) and t >= done and w == resize.world), None)
    if first is not None:
        resize.phases["first_step"] = first - t0
    return resize


def medians(resizes: Sequence[Resize]) -> dict[str, dict[str, float]]:
    """kind -> phase -> median seconds after the decision (over the resizes that recorded that phase)."""
    out: dict[str, dict[str, float]] = {}
    for kind in ("grow", "shrink"):
        mine = [r for r in resizes if r.kind == kind]
        out[kind] = {p: round(statistics.median(vals), 2) for p in PHASES
                     if (vals := [r.phases[p] for r in mine if p in r.phases])}
    return out


def table(resizes: Sequence[Resize]) -> str:
    """Every resize's phases and the medians, as text."""
    rows = [f"{'resize':<14}" + "".join(f"{p:>12}" for p in PHASES)]
    for i, r in enumerate(resizes, 1):
        rows.append(f"{f'{i} {r.kind} ->{r.world}':<14}" + "".join(
            f"{r.phases[p]:>12.2f}" if p in r.phases else f"{'-':>12}" for p in PHASES))
    for kind, med in medians(resizes).items():
        rows.append(f"{f'median {kind}':<14}" + "".join(
            f"{med[p]:>12.2f}" if p in med else f"{'-':>12}" for p in PHASES))
    return "\n".join(rows)
