#!/usr/bin/env python3
"""The smallest program that keeps the elastic contract (standard library only; README.md).

The leader's first task trains (here: counts steps, ``--steps`` of them, or until the job ends); every other task
(more nodes of the leader, extension jobs) stands by for its share of the work, and ends when the checkpoint says
training is done. Before a resize -- the grace signal (SIGUSR1, forwarded by the launcher) or
the notice of :mod:`slurm_elastic.resize` -- the trainer saves its checkpoint and acknowledges it. It logs
``resumed step=N`` and ``step=N loss=X world=W``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

from slurm_elastic import resize

GRACE = {"requested": False}


def _on_grace(signum: int, frame: object) -> None:
    GRACE["requested"] = True


def save(path: Path, step: int, loss: float, *, done: bool = False) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "loss": loss, "done": done}))
    tmp.replace(path)


def finished(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text()).get("done"))
    except (OSError, ValueError, AttributeError):
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--step-seconds", type=float, default=0.5)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--steps", type=int, default=0, help="end after this many steps (0: train until the job ends)")
    args = ap.parse_args()
    signal.signal(signal.SIGUSR1, _on_grace)
    trainer = os.environ.get("SLURM_ELASTIC_ROLE", "leader") == "leader" and os.environ.get("SLURM_PROCID") == "0"
    if not trainer:
        while not finished(args.checkpoint):  # a real program would take part in the work here
            time.sleep(1)
        return
    state = json.loads(args.checkpoint.read_text()) if args.checkpoint.exists() else {"step": 0, "loss": 1.0}
    step, loss = int(state["step"]), float(state["loss"])
    print(f"resumed step={step}", flush=True)
    while not args.steps or step < args.steps:
        step += 1
        loss *= 0.999
        print(f"step={step} loss={loss:.4f} world={os.environ.get('SLURM_JOB_NUM_NODES', '?')}", flush=True)
        if GRACE["requested"] or resize.resize_pending():
            save(args.checkpoint, step, loss)
            acked = resize.acknowledge(step)
            print(f"checkpoint saved at step {step} (resize){'; notice acknowledged' if acked else ''}", flush=True)
            GRACE["requested"] = False
        elif step % args.checkpoint_every == 0:
            save(args.checkpoint, step, loss)
        time.sleep(args.step_seconds)
    save(args.checkpoint, step, loss, done=True)
    print(f"training done at step {step}", flush=True)


if __name__ == "__main__":
    main()
