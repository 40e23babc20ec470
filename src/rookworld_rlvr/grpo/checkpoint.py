"""Atomic checkpoints: a directory appears complete or not at all.

Layout: `<run>/checkpoints/step_000040/` holds the policy and tokenizer in Hugging Face
format (loadable with plain `AutoModelForCausalLM`) and the trainer state (optimizer, RNG
states, controllers, data cursors, step) as `trainer_state.safetensors` + `trainer_state.json`
(`rookworld_rlvr.statefile`: tensors and JSON, so loading a checkpoint someone handed you runs
no code; older versions wrote a pickle, `trainer_state.pt`, which is never opened). Everything
is written into a temporary directory beside it, fsynced, then renamed, so a kill during a save
leaves the previous checkpoint as the latest.

Owns the checkpoint directories (what `grpo.state` puts in them is its business). Imports torch
through `statefile` and the model package's saver; nothing of chess.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from rookworld_rlvr.atomic import remove_dirs, remove_leftovers, restore_aside, write_dir
from rookworld_rlvr.model.load import write_pretrained
from rookworld_rlvr.statefile import load_state as _read_state
from rookworld_rlvr.statefile import save_state, state_exists

STATE_NAME = "trainer_state"  # trainer_state.safetensors + trainer_state.json
STATE_FILES = (f"{STATE_NAME}.safetensors", f"{STATE_NAME}.json")
LEGACY_STATE_FILE = "trainer_state.pt"  # a pickle (older versions): never loaded
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
        if m and state_exists(p, STATE_NAME):
            found.append((int(m.group(1)), p))
    return sorted(found)


def restore_interrupted(run_dir: str | Path) -> None:
    """Put back a checkpoint that a kill left moved aside while its step was saved again."""
    root = Path(run_dir) / "checkpoints"
    for old in root.glob(".step_*.old-*") if root.exists() else []:
        restore_aside(root / old.name[1:].split(".old-")[0])


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint. Every `step_N` directory was renamed into place complete, so one
    without its state files (deleted, or an older version's pickle) is an error naming the file,
    never skipped for an older checkpoint or a fresh start."""
    restore_interrupted(run_dir)
    root = Path(run_dir) / "checkpoints"
    steps = sorted((int(m.group(1)), p) for p in (root.iterdir() if root.exists() else [])
                   if (m := _STEP_RE.match(p.name)) and p.is_dir())
    if not steps:
        return None
    path = steps[-1][1]
    _check_complete(path)
    return path


def _check_complete(path: Path) -> None:
    for name in STATE_FILES:
        if not (path / name).is_file():
            legacy = path / LEGACY_STATE_FILE
            why = (f"; it holds {legacy}, a pickled trainer state of an older version, which is never loaded "
                   "(unpickling runs whatever code the file carries): its model weights still load as a model"
                   if legacy.exists() else "")
            raise ValueError(f"{path / name}: missing, so {path} is not a complete checkpoint{why}; move {path} "
                             "aside to resume from the checkpoint before it")


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, state: dict[str, Any]) -> Path:
    """Write model + tokenizer + trainer state atomically; returns the checkpoint path."""
    def write(tmp: Path) -> None:
        write_pretrained(model, tokenizer, tmp)
        save_state(tmp, STATE_NAME, state)

    return write_dir(checkpoint_dir(run_dir, step), write)


def load_state(path: str | Path) -> dict[str, Any]:
    """The trainer state of checkpoint `path` (data only: tensors and JSON values, no code runs).
    A missing or malformed state file is a ValueError naming the file."""
    path = Path(path)
    _check_complete(path)
    state = _read_state(path, STATE_NAME)
    if not isinstance(state, dict) or "step" not in state:
        raise ValueError(f"{path / STATE_FILES[1]}: not a trainer state (no 'step')")
    return state


def export_model(path: str | Path, out: str | Path) -> Path:
    """The model and tokenizer of checkpoint `path`, without its trainer state, atomically at `out`
    (a plain Hugging Face directory, like `final/`)."""
    path = Path(path)

    def write(tmp: Path) -> None:
        for f in path.iterdir():
            if f.is_file() and not f.name.startswith(STATE_NAME):
                shutil.copy2(f, tmp / f.name)

    return write_dir(out, write)


def drop_after(run_dir: str | Path, step: int) -> list[int]:
    """Delete every checkpoint after `step` (a rollback abandoned them: the logs are cut back to
    `step`, and `latest_checkpoint` must not find them); returns their steps."""
    root = Path(run_dir) / "checkpoints"
    gone = sorted(int(m.group(1)) for p in (root.iterdir() if root.exists() else [])
                  if (m := _STEP_RE.match(p.name)) and int(m.group(1)) > step)
    # all renamed out of sight (instant) before any is deleted (slow): a kill cannot leave one half-deleted
    remove_dirs([checkpoint_dir(run_dir, s) for s in reversed(gone)])
    return gone


def remove_killed_leftovers(run_dir: str | Path) -> None:
    """Delete what killed saves and deletions left in a run folder (`.step_N.tmp-*`, `.step_N.del-*`, and
    those of `final/` and `best/`). A resume does it first: a run resumed at its end saves no checkpoint,
    so no prune would, and each leftover can be as large as a checkpoint."""
    root = Path(run_dir) / "checkpoints"
    if root.exists():
        remove_leftovers(root, "step_*")
    for name in ("final", "best"):
        remove_leftovers(Path(run_dir), name)


def prune(run_dir: str | Path, keep_last: int, keep: set[int] = frozenset()) -> None:
    """Delete old checkpoints (and leftovers of interrupted saves), keeping the last N and `keep`."""
    found = list_checkpoints(run_dir)
    # never half-deleted under its name, where a rollback could pick it
    remove_dirs([path for step, path in (found[:-keep_last] if keep_last else found) if step not in keep])
    root = Path(run_dir) / "checkpoints"
    if root.exists():
        remove_leftovers(root, "step_*")
