"""The answers of a held-out evaluation in progress, on disk: a resumed run completes only what it lacks.

Owns the journal file of one evaluation (`eval_answers.jsonl` in the run directory): a header line
naming the step, then each greedy batch's answers as one JSON line, appended the moment the batch is
done, so that a signal or a kill during the evaluation (minutes on a CPU) loses only the batches in
flight. A batch is known by its prompts and token budget: the resumed evaluation forms the same
batches in the same order (`model.completions`), so a batch read back is the batch it would complete
and the results equal the uninterrupted run's. A line cut short by a kill is dropped on reading.
Imports json, hashlib and pathlib only; the trainer decides when a journal is valid (its step's
weights, the evaluation not yet returned) and shares rank 0's with the other ranks.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

NAME = "eval_answers.jsonl"


def batch_key(prompts: Sequence[str], budget: int) -> str:
    return hashlib.sha1(json.dumps([budget, list(prompts)]).encode()).hexdigest()


class Journal:
    """Greedy batches' answers by `batch_key`; written to `path` as they come (None: kept in memory only,
    as on the ranks that do not write)."""

    def __init__(self, path: Path | None = None, done: dict[str, tuple[list[str], list[str]]] | None = None) -> None:
        self.path = path
        self.done = dict(done or {})

    def get(self, prompts: Sequence[str], budget: int) -> tuple[list[str], list[str]] | None:
        return self.done.get(batch_key(prompts, budget))

    def add(self, prompts: Sequence[str], budget: int, texts: list[str], reasons: list[str]) -> None:
        key = batch_key(prompts, budget)
        if key in self.done:
            return
        self.done[key] = (list(texts), list(reasons))
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"key": key, "texts": texts, "reasons": reasons}) + "\n")
                fh.flush()


def read(path: Path, step: int) -> dict[str, tuple[list[str], list[str]]]:
    """The batches a journal of the evaluation at `step` holds (none if it is absent or of another step);
    a last line cut short by a kill is dropped."""
    if not path.exists():
        return {}
    lines = path.read_text(encoding="utf-8").split("\n")
    try:
        if json.loads(lines[0]).get("step") != step:
            return {}
    except (json.JSONDecodeError, AttributeError):
        return {}
    done = {}
    for line in lines[1:]:
        try:
            row = json.loads(line)
            done[row["key"]] = (row["texts"], row["reasons"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return done


def start(path: Path, step: int, done: dict) -> Journal:
    """A journal of the evaluation at `step` written afresh at `path`, holding `done` (what `read` found)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": step}) + "\n")
        for key, (texts, reasons) in done.items():
            fh.write(json.dumps({"key": key, "texts": texts, "reasons": reasons}) + "\n")
    return Journal(path, done)
