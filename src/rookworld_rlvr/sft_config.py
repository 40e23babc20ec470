"""`rookworld sft`'s settings: every field of a run, with its default and its checks.

Owns SFTConfig and its validation; the flags and their help are `sft_cli`, the training `sft`.
Imports nothing heavy (torch, transformers) at module level, so `rookworld --help` stays fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from rookworld_rlvr.paths import blocked_directory, no_such_file


@dataclass
class SFTConfig:
    data: str = "data/train.jsonl.xz"
    eval_data: str = "data/eval.jsonl.gz"  # held-out samples for eval_every; "" = none
    out: str = "runs/sft/model"
    init: str | None = None  # continue from this model directory instead of a fresh one
    # deepen the --init model to this many blocks before training (model.grow: the new blocks start as
    # exact no-ops, so the model begins where the init model stopped); 0 = keep its depth
    grow_layers: int = 0
    preset: str = "tiny"  # tiny | small | wide | gpt2-124m (fresh models only; model.load.PRESETS)
    # char | square | board, fresh models only (default board: square tokens for moves and FEN boards
    # written square by square); --init and --resume keep the model's own
    tokenizer: str | None = None
    n_positions: int = 320
    layout: str = "compact"
    order: str = "best-first"  # P: candidates in the target: best-first | given (see tasks.policy.ORDERS)
    loss_on: str = "full"  # full | completion
    # weight of the unlikelihood of writing an M: move twice (repeat_bans); 0 = likelihood only
    distinct_coef: float = 1.0
    # P: rows per step answered greedily by the model; where it repeats a move, that repeat is
    # pushed down (own_repeat_rows, weighted by distinct_coef); 0 = off
    own_repeats: int = 8
    # weight of the correction on those rows: the best true candidate the model had not listed, learned
    # where it repeated a move (DAgger); 0 = the ban alone
    own_targets: float = 0.0
    # weight of the legality loss: at every token of a P: move, -log of the probability that the token
    # continues a legal move not yet listed (sft_rows.legal_sets); 0 = off (measured on rookworld-board:
    # legality up, move quality and mates in one down; models/README.md)
    legal_coef: float = 0.0
    env_share: float = 0.5  # share of A: samples in each batch
    steps: int = 3000
    max_minutes: float | None = None  # the whole run's wall-clock budget, over resumes (the schedule follows it)
    # end this invocation after so many minutes, checkpointed; the schedule still follows --steps, so
    # --resume continues the same run (how a long run is spread over several invocations)
    stop_after_minutes: float | None = None
    stop_when: str | None = None  # end this invocation, checkpointed, once this file exists (say, more data is ready)
    # a file that keeps the rows read and encoded from --data (sft_cache): a resume or a later run reads them in
    # seconds; other data or settings encode afresh
    rows_cache: str | None = None
    encode_only: bool = False  # fill --rows-cache and stop (prepare the rows on the CPU while a GPU trains)
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    # the last N steps (of --steps) take the scheduled lr linearly down to zero (a warmup-stable-decay
    # cooldown): a long run ends on a cooldown without paying the cosine again; 0 = off
    cooldown_steps: int = 0
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # the gradient's norm is clipped to this; 0 = no clipping
    dropout: float = 0.0  # 0: the tiny model under-fits, and CPU attention runs ~4x slower with dropout
    # none | bf16 | auto (bf16 where the hardware does it well: CUDA with bf16, a CPU with AMX; on a CPU
    # without bf16 units, bf16 autocast measured 16x slower than float32)
    autocast: str = "none"
    eval_every: int = 500
    eval_samples: int = 200  # per task, greedy task metrics
    save_every: int = 500
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    # under torchrun: how long a rank waits for the others at a step (or an evaluation) before the run ends
    # (torchrun then stops the rest) instead of holding every device; rank 0's saves are waited for 15 minutes
    step_timeout_minutes: float = 10.0
    # torch.profiler over this many steps, its tables in OUT.profile.txt (step_profile); 0 = off
    profile_steps: int = 0
    profile_after: int = 20  # steps of each invocation before the profile: CUDA's start, the allocator's warm-up
    tensorboard: bool = False  # each step's log record as TensorBoard events in OUT.tb beside the model
    wandb: bool = False  # each step's log record to a wandb run named as OUT; its files and id in OUT.wandb

    def beside(self, suffix: str) -> Path:
        """`<out><suffix>` beside `out`: the run's log (.sft_log.jsonl), checkpoint, profile, TensorBoard events
        (.tb) and wandb files (.wandb)."""
        out = Path(self.out)
        return out.parent / f"{out.name}{suffix}"

    def checkpoint_dir(self) -> Path:
        """Where the run's checkpoint lives (what --resume continues from): `<out>.checkpoint` beside `out`."""
        return self.beside(".checkpoint")

    def inert_settings(self) -> list[str]:
        """Settings away from their defaults that nothing of this run reads, each with the reason (the command warns
        of them: they were taken without a word)."""
        d, out = SFTConfig(), []
        given = [name for name in ("eval_every", "eval_samples") if getattr(self, name) != getattr(d, name)]
        out += [f"{name}: no held-out evaluation (eval_data is empty)" for name in given if not self.eval_data]
        if self.profile_after != d.profile_after and not self.profile_steps:
            out.append("profile_after: no profile is taken (profile_steps 0)")
        own = [name for name in ("own_repeats", "own_targets") if getattr(self, name) != getattr(d, name)]
        if not (self.own_repeats and self.distinct_coef):
            out += [f"{name}: the model answers no rows of its own (own_repeats or distinct_coef is 0)" for name in own
                    if getattr(self, name)]
        return out

    def validate(self) -> None:
        from rookworld_rlvr.tasks.policy import LAYOUTS, ORDERS

        if self.order not in ORDERS:
            raise ValueError(f"sft.order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"sft.layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        for name, low in (("n_positions", 1), ("warmup_steps", 0), ("eval_every", 1), ("eval_samples", 0),
                          ("save_every", 1), ("threads", 1), ("profile_steps", 0), ("profile_after", 0)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"sft.{name} must be >= {low}, got {value}")
        if self.loss_on not in ("full", "completion"):
            raise ValueError("sft.loss_on must be 'full' or 'completion'")
        if self.autocast not in ("none", "bf16", "auto"):
            raise ValueError(f"sft.autocast must be 'none', 'bf16' or 'auto', got {self.autocast!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError("sft.dropout must be in [0, 1)")
        if not 0 <= self.own_targets or not math.isfinite(self.own_targets):
            raise ValueError(f"sft.own_targets must be finite and >= 0, got {self.own_targets}")
        if self.grow_layers < 0:
            raise ValueError(f"sft.grow_layers must be >= 0, got {self.grow_layers}")
        if self.grow_layers and not self.init:
            raise ValueError("sft.grow_layers deepens an --init model; a fresh model takes its shape from --preset")
        if self.own_repeats < 0:
            raise ValueError(f"sft.own_repeats must be >= 0, got {self.own_repeats}")
        for name in ("distinct_coef", "legal_coef", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not 0 <= value or not math.isfinite(value):
                raise ValueError(f"sft.{name} must be finite and >= 0, got {value}")
        if not 0 <= self.env_share <= 1:
            raise ValueError("sft.env_share must be in [0, 1]")
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"sft.{name} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):  # a NaN passed `lr <= 0` and trained every weight to NaN
            raise ValueError(f"sft.lr must be a finite number > 0, got {self.lr}")
        if not 0 <= self.cooldown_steps <= self.steps:
            raise ValueError(f"sft.cooldown_steps must be in [0, steps={self.steps}], got {self.cooldown_steps}")
        for name in ("max_minutes", "stop_after_minutes", "step_timeout_minutes"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"sft.{name} must be a positive number of minutes, got {value}")
        for name in ("tensorboard", "wandb"):  # found now, not after the data is read
            if getattr(self, name) and find_spec(name) is None:
                raise ValueError(f"sft.{name} needs the {name} package (pip install {name})")
        if self.encode_only and not self.rows_cache:
            raise ValueError("sft.encode_only fills a rows cache: give --rows-cache FILE")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"sft.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if blocked := blocked_directory(self.out):
            raise ValueError(f"sft.out: {blocked}")
        if not Path(self.data).exists():
            raise ValueError(f"sft.data: {no_such_file(self.data)}")
        if self.eval_data and not Path(self.eval_data).exists():
            raise ValueError(f"sft.eval_data: {no_such_file(self.eval_data)} (pass --eval-data '' to train "
                             "without a held-out evaluation)")
        from rookworld_rlvr.chess_tokenizers import TOKENIZERS
        from rookworld_rlvr.model.load import PRESETS

        if self.preset not in PRESETS:
            raise ValueError(f"sft.preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")

        if self.tokenizer is not None and self.tokenizer not in TOKENIZERS:
            raise ValueError(f"sft.tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        if self.tokenizer is not None and self.init:
            raise ValueError("sft.tokenizer applies to fresh models only: --init keeps the model's own tokenizer")
        for name in ("preset", "n_positions"):
            if self.init and getattr(self, name) != getattr(SFTConfig, name):  # (was taken for a fresh model alone)
                raise ValueError(f"sft.{name} shapes a fresh model only: --init keeps the model's own shape and context")
