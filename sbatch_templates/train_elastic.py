#!/usr/bin/env python3
"""A small elastic data-parallel training loop for torchrun (CPU/gloo or GPU/nccl).

Contract with slurm-elastic: on SIGUSR1 (the grace signal) save a checkpoint at the next step boundary; on every
(re)start resume from the checkpoint. Each rendezvous logs ``rendezvous world_size=N`` so the membership can be
seen in the job's output.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

GRACE = {"requested": False}  # set by the signal handler, read by the training loop


try:  # the helper needs only the standard library; without the package on PYTHONPATH, the same line is written here
    from slurm_elastic.goodput import nodes_from_env, publish
except ImportError:
    import json

    def nodes_from_env() -> int | None:
        world, local = int(os.environ.get("WORLD_SIZE", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
        return world // local if world > 0 and local > 0 and world % local == 0 else None

    def publish(samples_per_s: float, *, nodes: int | None = None) -> bool:  # docs/goodput.md
        path = os.environ.get("SLURM_ELASTIC_GOODPUT_FILE")
        if not path or not 0 < samples_per_s < float("inf"):
            return False
        line = {"time": round(time.time(), 3), "samples_per_s": samples_per_s, **({"nodes": nodes} if nodes else {})}
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError:
            return False
        return True


REPORT_EVERY = 20  # steps between two throughput reports (rank 0 only)


def _on_grace(signum: int, frame: object) -> None:
    GRACE["requested"] = True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--step-seconds", type=float, default=0.5)
    args = ap.parse_args()
    signal.signal(signal.SIGUSR1, _on_grace)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rendezvous world_size={world} rank={rank} restart={os.environ.get('TORCHELASTIC_RESTART_COUNT')}",
          flush=True)
    model = torch.nn.Linear(64, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    if args.checkpoint.exists():
        state = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        step = int(state["step"])
    mark_step, mark_time = step, time.monotonic()
    while step < args.steps:
        x = torch.randn(32, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # data-parallel: average gradients over the current world
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        step += 1
        if rank == 0 and step - mark_step >= REPORT_EVERY:  # goodput: samples/s of the whole job (docs/goodput.md)
            now = time.monotonic()
            publish(samples_per_s=(step - mark_step) * 32 * world / (now - mark_time), nodes=nodes_from_env())
            mark_step, mark_time = step, now
        if rank == 0 and (GRACE["requested"] or step % 100 == 0):
            args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.checkpoint.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "step": step}, tmp)
            tmp.replace(args.checkpoint)
            if GRACE["requested"]:
                print(f"checkpoint saved at step {step} (grace signal)", flush=True)
            GRACE["requested"] = False
        time.sleep(args.step_seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
