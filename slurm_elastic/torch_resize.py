"""The resize contract for torch data-parallel training under torchrun: checkpoint, acknowledge, hold.

What the training templates (sbatch_templates/train_elastic.py, train_dlrm.py, train_adaptive.py) share, so that
a user's own script can do the same with a few imports from the installed package: at a step boundary where the
ranks agree a resize is coming (the grace signal, which the launcher forwards as SIGUSR1, or the notice of
:mod:`slurm_elastic.resize`), :func:`before_resize` has rank 0 save a checkpoint (model, optimizer, step) and
acknowledge the notice, then every rank holds until the resize restarts the group; on every (re)start
:func:`load` resumes from the checkpoint.

Needs torch (the job's environment, not the controller's or the agent's); nothing else of the package imports it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from slurm_elastic import resize

GRACE = {"requested": False}  # set by the signal handler, read at the next step boundary
DEVICE = [torch.device("cpu")]  # this worker's device, set at start (worker_device)
FIRST = [True]  # no step taken yet by this process (first_step)


def on_grace(signum: int, frame: object) -> None:
    GRACE["requested"] = True


def install_grace_handler(signum: int = signal.SIGUSR1) -> None:
    """The launcher forwards the job's grace signal to the workers as SIGUSR1."""
    signal.signal(signum, on_grace)


def save(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
    tmp.replace(path)  # atomic: a restart never reads half a checkpoint


def load(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """The step to resume at (0 without a checkpoint); model and optimizer state loaded in place."""
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=True, map_location=DEVICE[0])
    model.load_state_dict(state["model"])
    if "optimizer" in state:
        opt.load_state_dict(state["optimizer"])
    return int(state["step"])


def worker_device() -> torch.device:
    """This worker's GPU: torchrun starts one worker per GPU (the template's --nproc-per-node) and numbers them
    LOCAL_RANK on each node; the CPU where torch sees no CUDA. Also the device :func:`load` maps onto."""
    if not torch.cuda.is_available():
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    DEVICE[0] = device
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
        # notice_t (the controller's write) and t (now): the notice -> checkpoint phase of the resize
        when = f" notice={notice.id} notice_t={notice.time:.3f}" if notice is not None else ""
        print(f"checkpoint saved at step {step} (resize){'; notice acknowledged' if acked else ''}{when} "
              f"t={time.time():.3f}", flush=True)
    GRACE["requested"] = False
    if box[0] is not None:
        hold(box[0], rank)


def first_step(step: int, world: int) -> None:
    """Rank 0, after each step: log the first step of this (re)start with its time, ``first step=N world=W
    t=T`` (the last phase of a resize: bench/resize_phases.py)."""
    if FIRST[0]:
        FIRST[0] = False
        print(f"first step={step} world={world} t={time.time():.3f}", flush=True)
