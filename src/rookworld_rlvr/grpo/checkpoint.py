"""Atomic checkpoints: a directory appears complete or not at all.

Layout: `<run>/checkpoints/step_000040/` holds the policy and tokenizer in Hugging Face
format (loadable with plain `AutoModelForCausalLM`) and `trainer_state.pt` (optimizer,
RNG states, controllers, data cursors, step). Everything is written into a temporary
directory beside it, fsynced, then renamed, so a kill during a save leaves the previous
checkpoint as the latest.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from rookworld_rlvr.model.load import write_pretrained

STATE_FILE = "trainer_state.pt"
_STEP_RE = re.compile(r"^step_(\d{6,})$")


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (renamed into place, state file present), oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_RE.match(p.name)
        if m and (p / STATE_FILE).exists():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, state: dict[str, Any]) -> Path:
    """Write model + tokenizer + trainer state atomically; returns the checkpoint path."""
    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        write_pretrained(model, tokenizer, tmp)
        torch.save(state, tmp / STATE_FILE)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_state(path: str | Path) -> dict[str, Any]:
    return torch.load(Path(path) / STATE_FILE, weights_only=False, map_location="cpu")


def prune(run_dir: str | Path, keep_last: int, keep: set[int] = frozenset()) -> None:
    """Delete old checkpoints (and leftovers of interrupted saves), keeping the last N and `keep`."""
    found = list_checkpoints(run_dir)
    for step, path in found[:-keep_last] if keep_last else found:
        if step not in keep:
            shutil.rmtree(path, ignore_errors=True)
    root = Path(run_dir) / "checkpoints"
    for p in root.glob(".step_*.tmp-*") if root.exists() else []:
        shutil.rmtree(p, ignore_errors=True)
