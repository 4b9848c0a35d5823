#!/usr/bin/env python3
"""A compact DLRM-style model for elastic data-parallel training under torchrun.

Sparse features go through EmbeddingBag tables, dense features through a bottom MLP; their pairwise dot-product
interactions feed a top MLP (the DLRM structure). Same contract as train_elastic.py (README.md): the ranks agree
at each step boundary whether a resize is coming, rank 0 checkpoints (model, Adagrad state, step) and
acknowledges, all hold until the restart; every (re)start resumes from the checkpoint; rank 0 logs
``rendezvous world_size=N``, ``step=N loss=X world=W`` and ``resumed step=N``.
The checkpoint/acknowledge/hold helpers are the package's (:mod:`slurm_elastic.torch_resize`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

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


class DLRM(nn.Module):
    def __init__(self, tables: int = 8, rows: int = 100_000, dim: int = 16, dense: int = 13) -> None:
        super().__init__()
        self.rows = rows
        self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense, 64), nn.ReLU(), nn.Linear(64, dim))
        n = tables + 1
        self.top = nn.Sequential(nn.Linear(n * (n - 1) // 2 + dim, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        feats = torch.stack([x, *(e(s) for e, s in zip(self.emb, sparse, strict=True))], dim=1)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        i, j = torch.triu_indices(feats.shape[1], feats.shape[1], offset=1)
        return self.top(torch.cat([x, inter[:, i, j]], dim=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--step-seconds", type=float, default=0.0)
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--checkpoint-every", type=int, default=200)
    args = ap.parse_args()
    install_grace_handler()
    device = worker_device()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rendezvous world_size={world} rank={rank} restart={os.environ.get('TORCHELASTIC_RESTART_COUNT')} "
          f"t={time.time():.3f}", flush=True)
    torch.manual_seed(0)
    model = DLRM(tables=args.tables, rows=args.rows).to(device)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
    step = load(args.checkpoint, model, opt)
    if rank == 0:
        print(f"resumed step={step} world={world}", flush=True)
    mark_step, mark_time = step, time.monotonic()
    while step < args.steps:
        dense = torch.randn(args.batch, 13, device=device)
        sparse = [torch.randint(0, args.rows, (args.batch, 4), device=device) for _ in model.emb]
        label = (dense[:, 0] > 0).float()
        loss = nn.functional.binary_cross_entropy_with_logits(model(dense, sparse).squeeze(1), label)
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # data-parallel: average gradients over the current world
            if p.grad is not None:
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
            publish(samples_per_s=(step - mark_step) * args.batch * world / (now - mark_time), nodes=nodes_from_env())
            mark_step, mark_time = step, now
        if stats[1].item() > 0:
            before_resize(step, rank, args.checkpoint, model, opt)
        elif rank == 0 and step % args.checkpoint_every == 0:
            save(args.checkpoint, model, opt, step)
        time.sleep(args.step_seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
