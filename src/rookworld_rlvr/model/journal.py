"""The answers of an evaluation in progress, on disk: a resumed run completes only what it lacks.

Owns the journal file of one evaluation (`eval_answers.jsonl` in a training run's directory, or
beside `rookworld eval`'s JSON): a header line saying whose answers they are (the weights'
fingerprint, dtype, device, arithmetic and torch version, and what else the caller names: the step), then each
greedy batch's answers as one JSON line, appended the moment the batch is done, so that a signal or
a kill during the evaluation (minutes on a CPU) loses only the batches in flight. A batch is known
by its prompts and token budget: the resumed evaluation forms the same batches in the same order
(`model.completions`), so a batch read back is the batch it would complete and the results equal
the uninterrupted run's. A journal of other weights is not read, and a line cut short by a kill is
dropped on reading. A cache (`cache_file`, `keep`) holds a finished evaluation's answers for later runs.
Imports json, hashlib, os, pathlib and torch; the caller decides where a journal
lives and shares rank 0's with the other ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from rookworld_rlvr.atomic import write_text

NAME = "eval_answers.jsonl"


def batch_key(prompts: Sequence[str], budget: int) -> str:
    return hashlib.sha1(json.dumps([budget, list(prompts)]).encode()).hexdigest()


class Journal:
    """Greedy batches' answers by `batch_key`; written to `path` as they come (None: kept in memory only,
    as on the ranks that do not write)."""

    def __init__(self, path: Path | None = None, done: dict[str, tuple[list[str], list[str]]] | None = None,
                 header: dict[str, Any] | None = None) -> None:
        self.path, self.header = path, header
        self.done = dict(done or {})

    def get(self, prompts: Sequence[str], budget: int) -> tuple[list[str], list[str]] | None:
        found = self.done.get(batch_key(prompts, budget))
        return found if found is not None and len(found[0]) == len(prompts) else None  # else: made again

    def add(self, prompts: Sequence[str], budget: int, texts: list[str], reasons: list[str]) -> None:
        key = batch_key(prompts, budget)
        if key in self.done:
            return
        self.done[key] = (list(texts), list(reasons))
        if self.path is not None:
            write_text(self.path, json.dumps({"key": key, "texts": texts, "reasons": reasons}) + "\n")


def arithmetic(device: torch.device) -> str:
    """What decides a device's float rounding beside torch's version: on a CPU the instruction set torch
    dispatches to and the thread count (a product split among other threads sums in another order),
    on a GPU its name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads"
    return device.type


def identity(model: torch.nn.Module, **more: Any) -> dict[str, Any]:
    """Whose answers a journal holds: a hash of every weight's bytes (the same weights loaded again hash
    alike; one changed bit does not), their dtype, the device type, its arithmetic and torch's version
    (greedy answers can differ between them: a run stopped on one machine and resumed on another
    completes its evaluation afresh), and `more` (a training run's step, `rookworld eval`'s decoding
    options)."""
    digest = hashlib.blake2b(digest_size=16)
    dtypes, seen = set(), set()
    for name, t in model.state_dict().items():
        dtypes.add(str(t.dtype).removeprefix("torch."))
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        if (t.data_ptr(), t.numel()) not in seen:  # tied weights (the LM head) once: 0.65 s at 124M on a CPU
            seen.add((t.data_ptr(), t.numel()))
            digest.update(t.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy())
    device = next(model.parameters()).device
    return {"weights": digest.hexdigest(), "dtype": ",".join(sorted(dtypes)), "device": device.type,
            "arithmetic": arithmetic(device), "torch": torch.__version__, **more}


def read(path: Path, header: dict[str, Any]) -> dict[str, tuple[list[str], list[str]]]:
    """The batches a journal with this `header` (`identity`) holds: none if it is absent or of other
    weights or options; a last line cut short by a kill is dropped."""
    if not path.exists():
        return {}
    lines = path.read_text(encoding="utf-8").split("\n")
    try:
        if json.loads(lines[0]) != json.loads(json.dumps(header)):
            return {}
    except (json.JSONDecodeError, AttributeError):
        return {}
    done = {}
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if answers := _answers(row):
            done[answers[0]] = answers[1]
    return done


def _answers(row: Any) -> tuple[str, tuple[list[str], list[str]]] | None:
    """A journal line's batch key and answers; None where the line is not what `Journal.add` writes (cut short,
    damaged or edited: that batch is made again, never scored from it)."""
    if not isinstance(row, dict):
        return None
    key, texts, reasons = row.get("key"), row.get("texts"), row.get("reasons")
    whole = isinstance(texts, list) and isinstance(reasons, list) and len(texts) == len(reasons)
    if not (isinstance(key, str) and whole and all(isinstance(t, str) for t in texts + reasons)):
        return None
    return key, (texts, reasons)


def start(path: Path, header: dict[str, Any], done: dict) -> Journal:
    """A journal with this `header` written afresh at `path`, holding `done` (what `read` found)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, _text(header, done), append=False)
    return Journal(path, done, header)


def _text(header: dict[str, Any], done: dict) -> str:
    lines = [header] + [{"key": key, "texts": texts, "reasons": reasons} for key, (texts, reasons) in done.items()]
    return "".join(json.dumps(line) + "\n" for line in lines)


def resume(path: Path, header: dict[str, Any] | None,
           share: Callable[[Any], Any] | None = None, known: dict | None = None) -> Journal:
    """The journal at `path` for the evaluation `header` names: the batches an earlier run of it kept
    (and those `known` holds: a cache's, `read` with its own header), then written afresh with them. Under
    torchrun rank 0 alone passes a header (it reads and writes) and `share` (a broadcast) hands what it
    read to the other ranks, which keep it in memory."""
    done = {**(known or {}), **read(path, header)} if header is not None else None
    if share is not None:
        done = share(done)
    return start(path, header, done) if header is not None else Journal(None, done)


def cache_file(folder: str | Path, header: dict[str, Any]) -> Path:
    """Where a cache folder keeps the answers of the evaluation `header` names: one file per header."""
    return Path(folder) / f"{hashlib.sha1(json.dumps(header, sort_keys=True).encode()).hexdigest()[:20]}.jsonl"


def keep(path: Path, header: dict[str, Any], done: dict) -> None:
    """`done` written to `path` under `header` as `read` reads it, whole or not at all (a temporary file
    renamed over it: two runs that finish the same evaluation at once leave one of theirs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write_text(tmp, _text(header, done), append=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
