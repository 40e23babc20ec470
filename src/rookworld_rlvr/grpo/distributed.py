"""Multi-process training with torch.distributed: the few collectives the trainers need (GRPO, and
SFT, whose ranks train on shares of one batch and sum their gradients the same way).

`torchrun --nproc_per_node N -m rookworld_rlvr train ...` starts N copies of the same trainer.
Every rank draws the same global prompt list and keeps its own contiguous share of the groups,
so a prompt's group never spans ranks. Rewards are all-gathered, so group statistics are those
of one process; gradients are summed (each rank's loss is already scaled by its share of the
global batch), so an update equals the one-process update on the same global batch. Metrics are
reduced, so every rank's guards and controllers take the same decision.

Every function is a no-op with one process (no `WORLD_SIZE`, or 1): single-process code paths
do not change. No CUDA is assumed: gloo on CPU, NCCL only when training on CUDA.

Owns every collective of the package. Imports torch; nothing of the model or chess.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Sequence, TypeVar

import torch
import torch.distributed as dist

T, R = TypeVar("T"), TypeVar("R")

# How long a rank waits for the others. At a step's collectives (rewards, gradients, metrics, and the
# held-out evaluation's shares, `spread`) every rank has the same work, so a long wait means a rank
# hangs: the run then fails after `step_timeout_minutes` (the trainer's setting) and torchrun stops
# the rest, instead of holding every GPU. Where rank 0 alone sets up the run directory or writes a
# checkpoint or a model (`barrier`, `broadcast_object`), the others allow it LONE_WORK. Each kind of
# wait has a group of its own, as a group's timeout is set when it is made; the waits for rank 0
# time out after the step timeout on rank 0 itself (nobody works alone while rank 0 waits): a
# group's timeout is each process's own. The ranks' first meeting (init_process_group) waits the
# step timeout too: torchrun starts them at once and they meet right after importing torch, so they
# arrive seconds apart, and one that hangs before it (say, in its imports or its CUDA set-up) would
# otherwise hold the others for as long as the meeting allows.
LONE_WORK = timedelta(minutes=15)  # a save of a 124M model and its optimizer takes seconds on a local disk
_steps: Any = None  # the group of a step's collectives (init_from_env)
_waits_for_main: Any = None  # the group of `barrier` and `broadcast_object`
_step_minutes = 0.0  # init_from_env's step_timeout_minutes
_watching = False  # watch_torchrun's thread runs


class RankTimeout(RuntimeError):
    """A rank stopped waiting for the others (one hangs or died): the command says so in one line."""


@contextmanager
def _waiting(where: str):
    """A wait that timed out (gloo raises; NCCL's watchdog ends the process itself) says where and why."""
    try:
        yield
    except RuntimeError as e:
        if "timed out" not in str(e).lower() and "wait timeout" not in str(e):  # gloo's words, the store's
            raise
        lone = LONE_WORK.total_seconds() / 60
        who = rank() if active() else os.environ.get("RANK", "0")  # before the first meeting: torchrun's word
        raise RankTimeout(f"rank {who} stopped waiting for the other ranks at {where}: one of them hangs or "
                          f"died. A step's collectives (evaluations, the first meeting) wait step_timeout_minutes "
                          f"({_step_minutes:g}); the others wait {lone:g} minutes for rank 0's saves. ({e})") from e


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if active() else 0


def world() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0 writes logs, checkpoints and the final model; the other ranks only train."""
    return rank() == 0


def init_from_env(device: str, step_timeout_minutes: float) -> bool:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT).

    Does nothing without WORLD_SIZE > 1, except that any process torchrun started watches torchrun
    (`watch_torchrun`). NCCL when `device` resolves to CUDA, gloo otherwise
    (CPU). On CUDA each process takes the GPU `cuda:LOCAL_RANK` (set as the current device, which
    NCCL's object collectives need too; `local_device` maps a bare "cuda" to it). A step's
    collectives, and the ranks' first meeting, time out after `step_timeout_minutes`, the waits for
    rank 0 after LONE_WORK.
    Returns True when a process group is active."""
    global _steps, _waits_for_main, _step_minutes
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun, whatever the number of processes
        watch_torchrun()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or active():
        return active()
    from rookworld_rlvr.model import resolve_device

    cuda = torch.cuda.is_available() and resolve_device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    step, _step_minutes = timedelta(minutes=step_timeout_minutes), step_timeout_minutes
    with _waiting("their first meeting"):
        dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=step)
    _steps = dist.new_group(timeout=step)
    _waits_for_main = dist.new_group(timeout=step if dist.get_rank() == 0 else max(step, LONE_WORK))
    return True


def watch_torchrun(every: float = 0.5) -> None:
    """End this process when torchrun, its parent, dies. torchrun starts each rank in a session of its
    own, so when torchrun itself is killed (SIGKILL: the OOM killer, a job scheduler) nothing stops the
    ranks: they would train on unwatched, holding their GPUs, beside a resumed run that writes the same
    files. A thread checks the parent every `every` seconds against the parent the package was first
    imported under (torchrun may die during the imports); the rank then ends as a SIGKILL would end it
    (every save is atomic; its Stockfish engines quit at the end of their input). Once per process."""
    global _watching
    if _watching:
        return
    _watching = True
    from rookworld_rlvr import PARENT_AT_IMPORT as agent

    def watch() -> None:
        while os.getppid() == agent:
            time.sleep(every)
        print(f"rank {os.environ.get('RANK', '?')}: torchrun (pid {agent}) is gone: this rank stops too",
              file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="watch-torchrun", daemon=True).start()


def local_device(device: torch.device) -> torch.device:
    """A bare `cuda` means this rank's GPU (cuda:LOCAL_RANK) under torchrun, so that N ranks on
    one machine do not all train on GPU 0. Explicit indices and other devices are kept."""
    if device.type == "cuda" and device.index is None and world() > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def destroy() -> None:
    global _steps, _waits_for_main
    if active():
        dist.destroy_process_group()
    _steps = _waits_for_main = None


@contextmanager
def joined(device: str, step_timeout_minutes: float):
    """A command's run under torchrun: join the ranks (`init_from_env`) for the block, unless a group
    is up already; part with `finish` when the block ends, or `destroy` when it raises. One process:
    nothing."""
    mine = not active() and init_from_env(device, step_timeout_minutes)
    try:
        yield
    except BaseException:
        if mine:
            destroy()
        raise
    if mine:
        finish()


def finish() -> None:
    """End this rank's part in a run whose work is done (every rank calls it; after an error, `destroy`).

    torchrun waits for every rank to exit: one that hangs after the run (say, in NCCL's teardown, or
    stopped) would hold torchrun, and its GPUs, with the work already saved. So the ranks meet a last
    time and name their processes (as at a save, the others wait up to LONE_WORK for rank 0, which may
    still write a report, and rank 0 waits `step_timeout_minutes` for them); then each machine's first
    rank (LOCAL_RANK 0) starts the watch of `parting` over its machine's ranks, itself included, which
    SIGKILLs those still running the step timeout later (torchrun then reports the killed rank). Linux
    (/proc); elsewhere the ranks just part."""
    if world() == 1:
        destroy()
        return
    from rookworld_rlvr.parting import started

    me = (socket.gethostname(), os.getpid(), started(os.getpid()))
    everyone: list = [None] * world()
    with _waiting("their last meeting"):  # the others may wait for rank 0's last lone work (a report, say)
        dist.all_gather_object(everyone, me, group=_waits_for_main)
    destroy()
    if os.environ.get("LOCAL_RANK", "0") != "0" or me[2] is None:
        return
    mine = [[r, pid, t] for r, (host, pid, t) in enumerate(everyone) if host == me[0]]
    subprocess.Popen([sys.executable, "-m", "rookworld_rlvr.parting", json.dumps(mine), str(_step_minutes)],
                     stdin=subprocess.DEVNULL, start_new_session=True)  # outlives this rank, which it watches too


def barrier() -> None:
    """Wait until every rank is here (e.g. rank 0 has finished writing a checkpoint); the others
    wait up to LONE_WORK for rank 0."""
    if world() > 1:
        with _waiting("a barrier"):
            dist.barrier(group=_waits_for_main)


def _comm_device() -> torch.device:
    """NCCL moves CUDA tensors only; gloo is used with CPU tensors."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shard(items: Sequence | torch.Tensor):
    """This rank's contiguous share of a list or tensor (whose length the world size divides)."""
    n, w = len(items), world()
    if n % w:
        raise ValueError(f"{n} items cannot be split evenly over {w} processes")
    k = n // w
    return items[rank() * k: (rank() + 1) * k]


def all_gather_tensor(t: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's 1-D tensor in rank order (all must have the same size), so all
    ranks see the same global vector. Returned on `t`'s device."""
    if world() == 1:
        return t
    x = t.detach().reshape(-1).to(_comm_device())
    out = [torch.empty_like(x) for _ in range(world())]
    with _waiting("a step's collective"):
        dist.all_gather(out, x, group=_steps)
    return torch.cat(out).to(t.device)


def all_reduce_sum(values: Sequence[float]) -> list[float]:
    """Each of `values` summed over the ranks (the same number of values on every rank), in one
    collective of one small tensor: cheaper than gathering objects (two collectives and pickles, on
    NCCL through the GPU) for what a step adds up, such as SFT's token counts and loss sums."""
    if world() == 1:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_comm_device())
    with _waiting("a step's collective"):
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=_steps)
    return t.tolist()


def all_gather_object(obj: Any) -> list:
    """Every rank's picklable `obj`, in rank order."""
    if world() == 1:
        return [obj]
    out: list = [None] * world()
    with _waiting("a step's collective"):
        dist.all_gather_object(out, obj, group=_steps)
    return out


def spread(items: Sequence[T], work: Callable[[list[T]], list[R]]) -> list[R]:
    """`work` done once over all `items`, shared out among the ranks: each rank calls it on its share
    (item i goes to rank i % world; items sorted by size stay balanced) and every rank gets every
    result, in item order. The held-out evaluation spreads its batches and its scoring so: on N GPUs
    it takes a 1/N of the time, and a rank that hangs in it fails the run after the step timeout.
    `work` returns one result per item, picklable. With one process: `work(items)`."""
    if world() == 1:
        return list(work(list(items)))
    w = world()
    share = list(items[rank()::w])
    mine = list(work(share))
    if len(mine) != len(share):
        raise ValueError(f"spread: work returned {len(mine)} results for {len(share)} items")
    shares = all_gather_object(mine)
    return [shares[i % w][i // w] for i in range(len(items))]


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (what the others pass is ignored); it doubles as a barrier,
    e.g. while rank 0 writes a checkpoint (the others wait up to LONE_WORK for it)."""
    if world() == 1:
        return obj
    box = [obj]
    with _waiting("rank 0's broadcast"):
        dist.broadcast_object_list(box, src=0, group=_waits_for_main)
    return box[0]


def all_reduce_grads(params: Sequence[torch.nn.Parameter]) -> None:
    """Sum the gradients of `params` over ranks, in one collective.

    Each rank's loss is already scaled by its share of the global batch, so the sum is the
    one-process gradient (DDP would average instead). A missing gradient counts as zeros, so every
    rank always takes part with the same buffer; a parameter ends with a gradient when any rank
    had one (and stays None, skipped by the optimizer, when none had). A non-finite value on one
    rank becomes non-finite on all, so every rank's guard sees it."""
    if world() == 1:
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    dev = _comm_device()
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float().to(dev)
             for p in params]
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=dev)
    flat = torch.cat(grads + [present])
    with _waiting("a step's collective"):
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=_steps)
    offset = 0
    for p, had in zip(params, flat[-len(params):].tolist()):
        n = p.numel()
        if had:
            g = flat[offset: offset + n].view_as(p).to(device=p.device, dtype=p.dtype)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
        offset += n


# Diagnostics whose worst value matters more than their mean.
MAX_KEYS = ("logp_sampler_diff",)


def reduce_values(key: str, values: list) -> Any:
    """Combine one metric's per-rank values: unchanged when all agree (exact, keeps ints),
    max for `*max` keys (and MAX_KEYS), min for `*min` keys, else the mean. Any NaN gives NaN,
    whatever the rank order, so all ranks' non-finite guards agree."""
    if all(v == values[0] for v in values[1:]):
        return values[0]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return values[0]  # text (e.g. a guard status): rank 0's
    if any(math.isnan(v) for v in values):
        return float("nan")
    if key.endswith("max") or key in MAX_KEYS:
        return max(values)
    if key.endswith("min"):
        return min(values)
    return sum(values) / len(values)


def reduce_metrics(metrics: dict) -> dict:
    """The same metrics record on every rank: per key, `reduce_values` over the ranks that have it.

    Ranks hold equal numbers of rows per task, so the mean of per-rank means is the global mean."""
    if world() == 1:
        return metrics
    every = all_gather_object(metrics)
    keys = list(dict.fromkeys(k for m in every for k in m))
    return {k: reduce_values(k, [m[k] for m in every if k in m]) for k in keys}
