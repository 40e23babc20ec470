"""What a command says when its device runs out of memory.

torch's `OutOfMemoryError` names the allocation that failed, not what to change, and ends in a traceback; the run's
last checkpoint stands all the same. The commands say both in one line: the settings that bound the memory of what
ran out, and where `--resume` continues.

Owns `OutOfMemory` (the error the commands raise, printed as one line) and `is_out_of_memory`. Imports nothing of
the package; torch only where the process has loaded it already.
"""

from __future__ import annotations

import sys
from pathlib import Path


class OutOfMemory(RuntimeError):
    """The device ran out of memory; the message says what needs less and, for a run (`run` True), where
    `--resume` continues: `checkpoint`, or nowhere when it is None."""

    def __init__(self, error: BaseException, smaller: str, run: bool = False, checkpoint: Path | None = None) -> None:
        asked = ". ".join(str(error).strip().splitlines()[0].split(". ")[:3]).rstrip(".")  # what, and what is free
        resume = "" if not run else (f"; the same command with --resume continues from {checkpoint}" if checkpoint
                                     else "; no checkpoint of this run was written")
        super().__init__(f"out of memory ({asked}): {smaller}{resume}")


def is_out_of_memory(error: BaseException) -> bool:
    """torch's OutOfMemoryError (CUDA's, or another device's that raises it)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(error, torch.OutOfMemoryError)
