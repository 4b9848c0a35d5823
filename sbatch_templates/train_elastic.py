#!/usr/bin/env python3
"""A small elastic data-parallel training loop for torchrun (CPU/gloo or GPU/nccl).

Contract with slurm-elastic (README.md): at every step boundary the ranks agree whether a resize is coming (the
grace signal, which the launcher forwards, or the notice of :mod:`slurm_elastic.resize`); if so rank 0 saves a
checkpoint (model, optimizer, step) and acknowledges it, and all ranks hold until the resize restarts them. On
every (re)start training resumes from the checkpoint. Rank 0 logs ``rendezvous world_size=N``, each step as
``step=N loss=X world=W`` and each resume as ``resumed step=N``, so the output shows what a resize cost.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from slurm_elastic import resize
from slurm_elastic.goodput import nodes_from_env, publish

GRACE = {"requested": False}  # set by the signal handler, read at the next step boundary
DEVICE = [torch.device("cpu")]  # this worker's device, set at start (worker_device)
REPORT_EVERY = 20  # steps between two throughput reports (rank 0 only)


def _on_grace(signum: int, frame: object) -> None:
    GRACE["requested"] = True


def save(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
    tmp.replace(path)  # atomic: a restart never reads half a checkpoint


def load(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=True, map_location=DEVICE[0])
    model.load_state_dict(state["model"])
    if "optimizer" in state:
        opt.load_state_dict(state["optimizer"])
    return int(state["step"])


def worker_device() -> torch.device:
    """This worker's GPU: torchrun starts one worker per GPU (the template's --nproc-per-node) and numbers them
    LOCAL_RANK on each node; the CPU where torch sees no CUDA."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def agree(done: bool) -> bool:
    """All ranks leave the hold together; a peer whose node was taken makes this fail (restart)."""
    flag = torch.tensor([1.0 if done else 0.0], device=DEVICE[0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


def hold(notice_id: str, rank: int) -> None:
    """Hold until the resize restarts the group. On a shrink that is a failed collective: say so before torch's
    traceback and torchrun's ``failed (exitcode: 1)``, which are how the restart looks."""
    try:
        resize.hold(notice_id, agree=agree)
    except RuntimeError as e:  # gloo/NCCL: "Connection closed by peer", DistBackendError, ...
        print(f"slurm-elastic: rank {rank}: a peer left during the hold ({type(e).__name__}): the resize took its "
              "node; torchrun restarts the workers at the new size and they resume from the checkpoint. The "
              "traceback and 'failed (exitcode: 1)' below are that restart, not a crash.", file=sys.stderr,
              flush=True)
        raise


def before_resize(step: int, rank: int, checkpoint: Path, model: torch.nn.Module,
                  opt: torch.optim.Optimizer) -> None:
    """Checkpoint (rank 0), acknowledge the notice, hold until the resize restarts the group."""
    if rank == 0:
        save(checkpoint, model, opt, step)
    notice = resize.read_notice()
    box = [notice.id if notice is not None and rank == 0 else None]
    dist.broadcast_object_list(box, src=0)  # every rank holds for the same notice, or none does
    if rank == 0:
        acked = notice is not None and resize.acknowledge(step)
        print(f"checkpoint saved at step {step} (resize){'; notice acknowledged' if acked else ''}", flush=True)
    GRACE["requested"] = False
    if box[0] is not None:
        hold(box[0], rank)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--step-seconds", type=float, default=0.5)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    args = ap.parse_args()
    signal.signal(signal.SIGUSR1, _on_grace)
    DEVICE[0] = device = worker_device()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rendezvous world_size={world} rank={rank} restart={os.environ.get('TORCHELASTIC_RESTART_COUNT')}",
          flush=True)
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
