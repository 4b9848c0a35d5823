#!/usr/bin/env python3
"""train_elastic.py with adaptive batch size: the job lets slurm-elastic choose its batch for its size.

Run it with torchrun_elastic.sbatch (``SLURM_ELASTIC_TRAIN_SCRIPT=$PWD/train_adaptive.py``, train_elastic.py
beside it: the checkpoint and resize contract is that file's). At every (re)start rank 0 opts in with the job's
limits and reads the plan for the current world from :func:`slurm_elastic.goodput.batch_plan` (per-replica
batch, accumulation steps, learning-rate factor; sqrt or AdaScale scaling, ``--lr-rule``) and every rank runs it.
Each step estimates the gradient noise from the gradient of the first half of the first micro-batch and the
all-reduced one (the global batch); every 20 steps rank 0 publishes the smoothed statistics and the measured
compute and step times (docs/goodput.md, "Adaptive batch size"). Rank 0 logs each plan as ``batch_plan
world=W local_batch=B accum_steps=A global_batch=M lr_factor=F basis=X``.

The model is a tiny linear regression on noisy targets (CPU/gloo is enough); ``--sample-seconds`` adds compute
time per sample so that step time grows with the batch as on a GPU.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from slurm_elastic import resize
from slurm_elastic.batchsize import GradNoiseEstimator
from slurm_elastic.goodput import AdaptiveBatch, batch_plan, nodes_from_env, opt_in, publish, publish_grad_stats
from slurm_elastic.torch_resize import (
    GRACE,
    before_resize,
    first_step,
    install_grace_handler,
    load,
    save,
    worker_device,
)

REPORT_EVERY = 20  # steps between two reports (rank 0 only)
INIT_BATCH, MAX_BATCH, MAX_LOCAL_BATCH, MIN_LOCAL_BATCH = 32, 512, 64, 8  # this job's limits
BASE_LR = 0.01  # tuned at INIT_BATCH


def the_plan(rank: int, world: int, lr_rule: str) -> AdaptiveBatch:
    """Rank 0 opts in (again: the file keeps only its tail) and reads the plan; every rank gets the same."""
    box: list[AdaptiveBatch | None] = [None]
    if rank == 0:
        opt_in(init_batch=INIT_BATCH, max_batch=MAX_BATCH, max_local_batch=MAX_LOCAL_BATCH,
               min_local_batch=MIN_LOCAL_BATCH, lr_rule=lr_rule)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        box[0] = batch_plan(nodes_from_env() or 1, local)
        if box[0] is None:  # could not read it: the initial batch, split over the world
            each = max(MIN_LOCAL_BATCH, -(-INIT_BATCH // world))
            box[0] = AdaptiveBatch(each, 0, each * world, 1.0, 1.0, 0.0, "fallback")
    dist.broadcast_object_list(box, src=0)
    plan = box[0]
    assert plan is not None
    return plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--sample-seconds", type=float, default=0.002, help="extra compute time per sample")
    ap.add_argument("--noise", type=float, default=3.0, help="target noise: more noise, larger useful batch")
    ap.add_argument("--lr-rule", choices=["sqrt", "adascale"], default="sqrt")
    ap.add_argument("--checkpoint-every", type=int, default=100)
    args = ap.parse_args()
    install_grace_handler()
    device = worker_device()  # one worker per GPU
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rendezvous world_size={world} rank={rank} restart={os.environ.get('TORCHELASTIC_RESTART_COUNT')} "
          f"t={time.time():.3f}", flush=True)
    torch.manual_seed(rank)
    model = torch.nn.Linear(64, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR)
    step = load(args.checkpoint, model, opt)
    plan = the_plan(rank, world, args.lr_rule)
    for group in opt.param_groups:
        group["lr"] = BASE_LR * plan.lr_factor
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = nodes_from_env() or 1
    if rank == 0:
        print(f"resumed step={step} world={world}", flush=True)
        print(f"batch_plan world={world} local_batch={plan.local_batch} accum_steps={plan.accum_steps} "
              f"global_batch={plan.global_batch} lr_factor={plan.lr_factor:.4f} basis={plan.basis}", flush=True)
    gns = GradNoiseEstimator(INIT_BATCH)
    params = list(model.parameters())
    mark_step, mark_time, compute_sum, step_sum = step, time.monotonic(), 0.0, 0.0
    micro = plan.accum_steps + 1
    while step < args.steps:
        began = time.monotonic()
        opt.zero_grad()
        first: list[torch.Tensor] = []
        b, half = plan.local_batch, max(1, plan.local_batch // 2)
        for m in range(micro):
            x = torch.randn(b, 64, device=device)
            y = x.sum(dim=1, keepdim=True) + args.noise * torch.randn(b, 1, device=device)
            # two backward passes per micro-batch: after the first half of the first one the gradient is that of
            # ``half`` samples (the small batch of the noise estimate; the all-reduced one is the big batch)
            for lo, hi in ((0, half), (half, b)):
                if hi > lo:
                    loss = (model(x[lo:hi]) - y[lo:hi]).pow(2).sum() / (b * micro)
                    loss.backward()
                if m == 0 and lo == 0:
                    first = [p.grad.detach() * (b * micro / half) for p in params if p.grad is not None]
            time.sleep(args.sample_seconds * b)  # the compute a real model would do
        computed = time.monotonic() - began
        small = torch.tensor([sum(float(g.pow(2).sum()) for g in first)], device=device)
        for p in params:  # data-parallel: average gradients over the current world
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= world
        dist.all_reduce(small)
        big = sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None)
        if plan.global_batch > half:
            gns.update(float(small.item()) / world, half, big, plan.global_batch)
        opt.step()
        step += 1
        compute_sum += computed
        step_sum += time.monotonic() - began
        flags = torch.tensor([loss.item() * micro * 2, 1.0 if GRACE["requested"] or resize.resize_pending() else 0.0],
                             device=device)
        dist.all_reduce(flags)
        if rank == 0:
            print(f"step={step} loss={flags[0].item() / world:.4f} world={world}", flush=True)
            first_step(step, world)  # its time: when a resize's restart trained again
        if rank == 0 and step - mark_step >= REPORT_EVERY:
            now, done = time.monotonic(), step - mark_step
            stats = gns.stats()
            # goodput: what an opted-in job publishes is samples/s x statistical efficiency
            eff = stats.efficiency(plan.global_batch) if stats is not None else 1.0
            publish(samples_per_s=done * plan.global_batch * eff / (now - mark_time), nodes=nodes)
            if stats is not None:
                publish_grad_stats(stats, nodes=nodes, gpus_per_node=local_world, local_batch=plan.local_batch,
                                   accum_steps=plan.accum_steps, compute_s=compute_sum / done,
                                   step_s=step_sum / done)
            mark_step, mark_time, compute_sum, step_sum = step, now, 0.0, 0.0
        if flags[1].item() > 0:
            before_resize(step, rank, args.checkpoint, model, opt)
        elif rank == 0 and step % args.checkpoint_every == 0:
            save(args.checkpoint, model, opt, step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
