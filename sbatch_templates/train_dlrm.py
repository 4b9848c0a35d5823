#!/usr/bin/env python3
"""A compact DLRM-style model for elastic data-parallel training under torchrun.

Sparse features go through EmbeddingBag tables, dense features through a bottom MLP; their pairwise dot-product
interactions feed a top MLP (the DLRM structure). Contract as in train_elastic.py: checkpoint on SIGUSR1, resume
on every (re)start, log ``rendezvous world_size=N``.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

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


class DLRM(nn.Module):
    def __init__(self, tables: int = 8, rows: int = 100_000, dim: int = 16, dense: int = 13) -> None:
        super().__init__()
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
    args = ap.parse_args()
    signal.signal(signal.SIGUSR1, _on_grace)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rendezvous world_size={world} rank={rank}", flush=True)
    model = DLRM()
    opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
    step = 0
    if args.checkpoint.exists():
        state = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        step = int(state["step"])
    mark_step, mark_time = step, time.monotonic()
    while step < args.steps:
        dense = torch.randn(128, 13)
        sparse = [torch.randint(0, 100_000, (128, 4)) for _ in model.emb]
        loss = nn.functional.binary_cross_entropy_with_logits(model(dense, sparse).squeeze(1),
                                                              torch.randint(0, 2, (128,)).float())
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        step += 1
        if rank == 0 and step - mark_step >= REPORT_EVERY:  # goodput: samples/s of the whole job (docs/goodput.md)
            now = time.monotonic()
            publish(samples_per_s=(step - mark_step) * 128 * world / (now - mark_time), nodes=nodes_from_env())
            mark_step, mark_time = step, now
        if rank == 0 and (GRACE["requested"] or step % 200 == 0):
            args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.checkpoint.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "step": step}, tmp)
            tmp.replace(args.checkpoint)
            GRACE["requested"] = False
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
