#!/usr/bin/env python3
"""A small elastic data-parallel training loop for torchrun (CPU/gloo or GPU/nccl).

Contract with slurm-elastic (README.md): at every step boundary the ranks agree whether a resize is coming (the
grace signal, which the launcher forwards, or the notice of :mod:`slurm_elastic.resize`); if so rank 0 saves a
checkpoint (model, optimizer, step) and acknowledges it, and all ranks hold until the resize restarts them. On
every (re)start training resumes from the checkpoint. Rank 0 logs ``rendezvous world_size=N``, each step as
``step=N loss=X world=W`` and each resume as ``resumed step=N``, so the output shows what a resize cost.
The checkpoint/acknowledge/hold helpers are the package's (:mod:`slurm_elastic.torch_resize`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from slurm_elastic import resize
from slurm_elastic.goodput import nodes_from_env, publish
from slurm_elastic.torch_resize import (
    GRACE,
    before_resize,
    first_step,
    install_grace_handler,
    load,
    save,
    worker_device,
)

REPORT_EVERY = 20  # steps between two throughput reports (rank 0 only)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--step-seconds", type=float, default=0.5)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    args = ap.parse_args()
    install_grace_handler()
    device = worker_device()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rendezvous world_size={world} rank={rank} restart={os.environ.get('TORCHELASTIC_RESTART_COUNT')} "
          f"t={time.time():.3f}", flush=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = load(args.checkpoint, model, opt)
    if rank == 0:
        print(f"resumed step={step} world={world}", flush=True)
    mark_step, mark_time = step, time.monotonic()
    while step < args.steps:
        x = torch.randn(32, 64, device=device)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # data-parallel: average gradients over the current world
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        step += 1
        # One collective for the log and the resize agreement: [loss sum, ranks that saw a signal or a notice]
        stats = torch.tensor([loss.item(), 1.0 if GRACE["requested"] or resize.resize_pending() else 0.0],
                             device=device)
        dist.all_reduce(stats)
        if rank == 0:
            print(f"step={step} loss={stats[0].item() / world:.4f} world={world}", flush=True)
            first_step(step, world)  # its time: when a resize's restart trained again
        if rank == 0 and step - mark_step >= REPORT_EVERY:  # goodput: samples/s of the whole job (docs/goodput.md)
            now = time.monotonic()
            publish(samples_per_s=(step - mark_step) * 32 * world / (now - mark_time), nodes=nodes_from_env())
            mark_step, mark_time = step, now
        if stats[1].item() > 0:
            before_resize(step, rank, args.checkpoint, model, opt)
        elif rank == 0 and step % args.checkpoint_every == 0:
            save(args.checkpoint, model, opt, step)
        time.sleep(args.step_seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
