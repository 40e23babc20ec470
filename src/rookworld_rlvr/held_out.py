"""The held-out sets a training config names, and how they are judged.

Owns reading a config's `eval_data` (its first `eval_limit` per task), `strength_data`,
`puzzle_eval_data` and `history_eval_data`, and the evaluation settings the config gives them
(layout, answer length, batch size, Stockfish depth). The trainer's evaluations and `rookworld eval
--held-out` both come through here, so a model judged afterwards meets the rows and settings its
run's figures came from. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.data.io import Sample, read_samples
from rookworld_rlvr.data.judged import read_judged, read_puzzles
from rookworld_rlvr.evaluate import EvalConfig, limit_per_task
from rookworld_rlvr.tasks.strength import JudgedPosition, Puzzle


@dataclass
class HeldOut:
    """What one evaluation of a run answers: without `samples` the other sets are not read (no evaluation)."""

    samples: list[Sample]
    judged: list[JudgedPosition] | None
    puzzles: list[Puzzle] | None
    histories: list[Sample] | None


def config_file(path: str) -> str:
    """A config file, or a run directory's `config.yaml` (what `rookworld train` wrote there)."""
    run = Path(path) / "config.yaml"
    return str(run) if Path(path).is_dir() and run.is_file() else path


def eval_config(cfg: TrainConfig) -> EvalConfig:
    return EvalConfig(layout=cfg.layout, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.eval_batch_size,
                      limit=cfg.eval_limit or None, engine_depth=cfg.engine_depth)


def read_held_out(cfg: TrainConfig) -> HeldOut:
    """The config's held-out rows; a bad row raises DataError naming file:line (in `eval_data`, `skip_invalid`
    skips it)."""
    samples = read_samples(cfg.eval_data, skip_invalid=cfg.skip_invalid) if cfg.eval_data else []
    if not samples:
        return HeldOut([], None, None, None)
    return HeldOut(samples=limit_per_task(samples, cfg.eval_limit or None),
                   judged=read_judged(cfg.strength_data) if cfg.strength_data else None,
                   puzzles=read_puzzles(cfg.puzzle_eval_data) if cfg.puzzle_eval_data else None,
                   histories=[s for s in read_samples(cfg.history_eval_data) if s.task == "A"]
                   if cfg.history_eval_data else None)
