"""Keep freed host memory in the process for reuse (glibc), instead of handing it back to the OS.

A CPU training step allocates and frees the same large tensors over and over (a 124M policy pass:
activations of [3,500 tokens, 3,072] = 43 MB each). glibc serves every block above its mmap
threshold (at most 32 MB) with a fresh mmap and unmaps it on free, so every step writes to
brand-new pages that the kernel must fault in and zero: 250-280k page faults and ~1.5 s of a
28-30 s step of the 124M benchmark on our 2-core EPYC (after: ~200 faults). With mmap off and
the heap never trimmed, freed blocks stay in the heap and the next step reuses them.

The cost: the process keeps its peak heap until it exits (the resident size no longer shrinks
between phases; the peak itself did not grow in our runs). The setting is process-wide, so only
our entry points apply it, and only to CPU runs (`for_device`: `grpo.cli.build`, which logs it,
and `rookworld sft`), not library use of `Trainer`.

Owns the allocator policy, the one place that tunes it. Imports nothing of the package.
"""

from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_MAX = -4


def for_device(device) -> str | None:
    """Apply `keep_freed_memory` where a run's big tensors live in host memory (a CPU run) and
    return its log line; None on a GPU, whose tensors live in its own memory (torch's caching
    allocator there already reuses freed blocks) and whose process should hand freed host memory back."""
    return keep_freed_memory() if device.type == "cpu" else None


def keep_freed_memory() -> str:
    """Turn off glibc's mmap for large blocks and heap trimming; return what was done (a log line)."""
    if not sys.platform.startswith("linux"):
        return "host memory: allocator unchanged (not Linux)"
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl and others have no such symbol
    except (OSError, AttributeError):
        return "host memory: allocator unchanged (not glibc)"
    ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    if not ok:  # pragma: no cover - glibc accepts both values
        return "host memory: allocator unchanged (glibc refused mallopt)"
    return "host memory: freed blocks are kept for reuse (glibc: no mmap for large blocks, no trimming)"
