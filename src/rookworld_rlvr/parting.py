"""The watch over a finished run's ranks on one machine: none may keep torchrun waiting.

torchrun waits for every rank to exit, so a rank that hangs once the run is done and saved (in
NCCL's teardown, say, or stopped) would hold torchrun and its GPUs for good. `grpo.distributed.finish`
starts this watch, in a process of its own, on each machine's first rank after the ranks' last
meeting; the ranks then exit. The watch ends as soon as every rank of its machine has ended, and
SIGKILLs those still running after the step timeout, saying so; it watches the rank that started it
too. Run as `python -m rookworld_rlvr.parting RANKS MINUTES` (RANKS: JSON [[rank, pid, started]]).

Owns the watch and how a process is recognised (its start time); Linux (/proc). Imports nothing but
the standard library, so it starts in a moment.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from contextlib import suppress
from pathlib import Path


def started(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot), while it runs (a zombie has ended); None
    where it does not, or there is no /proc. With the pid it names one process, even once the pid is reused."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def watch(ranks: list[tuple[int, int, int]], minutes: float, every: float = 0.1) -> list[int]:
    """Wait until every (rank, pid, started) has ended, at most `minutes`; SIGKILL the rest, saying so.
    Returns the ranks killed."""
    deadline = time.time() + minutes * 60
    while (left := [(r, pid) for r, pid, t in ranks if started(pid) == t]) and time.time() < deadline:
        time.sleep(every)
    for r, pid in left:
        print(f"rank {r} (pid {pid}) had not ended {minutes:g} minutes (step_timeout_minutes) after the run was "
              "done and saved: killing it, so that torchrun does not wait for it", file=sys.stderr, flush=True)
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [r for r, _ in left]


if __name__ == "__main__":
    watch([tuple(x) for x in json.loads(sys.argv[1])], float(sys.argv[2]))
