"""Bare ranks of a 2-process gloo world for the tests of how long a rank waits (step_timeout_minutes):
torch and the package's collectives alone, no trainer."""

import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp

from rookworld_rlvr.grpo import distributed as dist

WORLD = 2  # test_distributed.py's world too


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_waits(rank: int, port: int, minutes: float, plan: str, out: str) -> None:
    """One rank of a bare 2-rank world with a step timeout of `minutes` (no trainer: the waits alone).
    plan "lone": rank 0 works alone (sleeps) for 3 timeouts before a broadcast and again before a
    barrier, as when it evaluates or saves, then a step's collective; then rank 1 hangs (sleeps) until
    rank 0 has waited for it at a barrier and then at a step's collective. plan "late": rank 1
    arrives 1.5 s late at a step's collective. plan "lone_hang": rank 0 hangs in its lone work while rank 1
    waits for it at a barrier (LONE_WORK set to 3 s). plan "spread": both share out 5 items, then rank 0
    hangs in its share of the next spread until rank 1 gave up on it. Each rank writes what happened,
    with times."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1")
    T, folder = minutes * 60, Path(out)
    if plan == "lone_hang":  # the waits for rank 0's lone work at a test's scale: 3 s instead of 15 minutes
        dist.LONE_WORK = timedelta(seconds=3)
    assert dist.init_from_env("cpu", minutes)
    seen: dict = {}

    def timed(name: str, call) -> None:
        t0 = time.time()
        try:
            seen[name] = call()
        except Exception as e:  # noqa: BLE001 - what the wait ended with is the observation
            seen[name] = f"error: {type(e).__name__}: {e}"[:300]
        seen[name + "_s"] = time.time() - t0

    try:
        if plan == "spread":
            timed("spread", lambda: dist.spread(list(range(5)), lambda xs: [(x, rank) for x in xs]))
            if rank == 0:  # hangs in its share of the work (an evaluation's batch) until rank 1 gave up
                timed("spread_hung", lambda: dist.spread([0, 1], lambda xs: [_wait_for(folder / "rank1.json")]))
            else:
                timed("spread_hung", lambda: dist.spread([0, 1], lambda xs: xs))
        elif plan == "lone_hang":  # rank 0 hangs in its lone work (a save) until rank 1 gave up on it
            if rank == 0:
                _wait_for(folder / "rank1.json")
            else:
                timed("barrier_hung", lambda: dist.barrier() or "passed")
        elif plan == "late":
            time.sleep(1.5 * rank)
            timed("gather", lambda: dist.all_gather_tensor(torch.tensor([float(rank)])).tolist())
        else:
            time.sleep(3 * T * (rank == 0))
            timed("broadcast", lambda: dist.broadcast_object(f"from rank {rank}"))
            time.sleep(3 * T * (rank == 0))
            timed("barrier", lambda: dist.barrier() or "passed")
            timed("gather", lambda: dist.all_gather_tensor(torch.tensor([float(rank)])).tolist())
            if rank == 1:  # hung until rank 0 is done waiting (at most a minute)
                _wait_for(folder / "rank0.json")
            else:
                timed("barrier_hung", lambda: dist.barrier() or "passed")
                timed("gather_hung", lambda: dist.all_gather_tensor(torch.tensor([0.0])).tolist())
        (folder / f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy()


def _wait_for(path: Path) -> None:
    """Hang until `path` exists (at most a minute)."""
    for _ in range(6000):
        if path.exists():
            return
        time.sleep(0.01)


def spawn_waits(minutes: float, plan: str, out: Path) -> list[dict]:
    """Both ranks forked from this process (torch is imported already: a second each, where spawning takes
    five); they exchange one-number tensors only, so no thread pool of the parent's is needed."""
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank_waits, args=(free_port(), minutes, plan, str(out)), nprocs=WORLD, start_method="fork")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
