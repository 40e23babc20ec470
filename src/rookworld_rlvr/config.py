"""The GRPO run configuration: one flat dataclass, YAML presets, `--key value` overrides.

Every field has a help text (shown by `rookworld train --help` and in the README), is
validated in `validate()`, and is read by the trainer. Flat names keep overrides simple:
`--kl-coef 0.02` on the command line, `KL_COEF=0.02` in train.sh, `kl_coef: 0.02` in YAML.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from rookworld_rlvr.tasks.rewards import ENV_COMPONENTS, POLICY_COMPONENTS, RewardConfig

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
LEVELS = ("token", "sequence")
KL_ESTIMATORS = ("k1", "k2", "k3", "exact")
SCALES = ("group", "batch", "none")
# Fields that were removed, and why: an old preset or command line gets this instead of "unknown field".
REMOVED = {
    "adv_clip": "removed: with group scaling |advantage| <= (G - 1) / sqrt(G) (2.47 at G = 8), so a clip at 3 or 5 "
                "never bound",
    "lora_dropout": "removed: dropout is off in every GRPO forward pass (sampler, policy and reference log-probs "
                    "must agree), so 0 was its only legal value",
    "resample_zero_variance": "replaced by dynamic_sampling (DAPO: the same rounds, with oversampling and its cost logged)",
    "kl_divergence_threshold": "renamed guard_kl_mean: one signal of the collapse guard",
    "kl_max_recoveries": "renamed guard_max_recoveries: shared by every collapse guard signal",
}


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: json.loads(json.dumps(d)), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    # -- model -------------------------------------------------------------------------------
    model: str = _f("models/rookworld-tiny", "policy to train: a local directory or a Hub id (jrahn/RookWorld-LM-124M)")
    device: str = _f("auto", "auto | cpu | cuda | cuda:N | mps")
    ref_device: str | None = _f(None, "device for the frozen reference model (default: same as device)")
    autocast: str = _f("none", "none | bf16 | auto: bf16 autocast with fp32 master weights (auto = where the hardware supports bf16 well)")
    backward_dtype: str = _f("auto", "auto | float32 | bf16: dtype of the policy pass's backward matrix products; its forward "
                                     "(log-probs, ratios) stays float32 (auto = bf16 where a bf16 product measures >= 1.5x "
                                     "faster; plain GPT-2 policies only)")
    record_rollout: str = _f("auto", "auto | always | never: keep each layer's projection outputs from sampling and skip "
                                     "those matrix products in the first update on the batch (the same log-probs and "
                                     "gradients). Memory: about 36 x n_embd x n_layer bytes per row and new token, for the "
                                     "whole batch (2.1 GB for 124M, 64 rows x 100). auto = on a CPU, for models from n_embd "
                                     "512 (124M, 768 wide: a 40% shorter policy pass; the tiny model, 256 wide: no gain; "
                                     "unmeasured on GPUs: always tries it there). Plain GPT-2 policies without autocast, LoRA "
                                     "or compile; the log says if it is on")
    compile: bool = _f(False, "torch.compile the policy forward (GPU; little gain on CPU)")
    threads: int | None = _f(None, "torch intra-op threads (default: torch's choice)")
    # -- data ----------------------------------------------------------------------------------
    data: str = _f("data/train.jsonl.gz", "training prompts: our JSONL(.gz) or upstream RookWorld text lines")
    eval_data: str = _f("data/eval.jsonl.gz", "held-out set for the greedy evaluation")
    eval_limit: int = _f(200, "held-out samples per task in each evaluation (0 = all)")
    skip_invalid: bool = _f(False, "skip and count malformed data lines instead of stopping")
    layout: str = _f("compact", "P: prompt layout: compact | padded (upstream columns; use for RookWorld-LM)")
    mix_env_ratio: float = _f(0.5, "share of A: (environment) prompts in each batch")
    env_terminal_share: float | None = _f(None, "share of A: prompts drawn from game-ending transitions (terminated or "
                                                "truncated; 8.6% of the shipped training set); null = as they occur in the data")
    puzzle_data: str | None = _f(None, "training puzzles (JSONL rows {fen, solutions, kind}: mates in one, tactics): P: "
                                       "prompts with a verified binary reward (1 for a solving B: in a well-formed answer)")
    mix_puzzle_ratio: float = _f(0.0, "share of P: prompts drawn from puzzle_data")
    strength_data: str | None = _f("data/strength.jsonl.gz", "judged held-out positions (`rookworld data judge`): each "
                                                             "evaluation reports move quality next to a random legal "
                                                             "mover on them (null = skip)")
    puzzle_eval_data: str | None = _f("data/puzzles_eval.jsonl.gz", "held-out puzzles each evaluation solves (null = skip)")
    # -- batch and sampling --------------------------------------------------------------------
    steps: int = _f(60, "optimizer steps (one batch of prompts per step)")
    batch_positions: int = _f(8, "prompts per step (B)")
    group_size: int = _f(8, "completions per prompt (G)")
    temperature: float = _f(1.0, "sampling temperature (the trainer's log-probs use the same temperature)")
    top_p: float = _f(1.0, "nucleus sampling")
    top_k: int = _f(0, "top-k sampling (0 = off)")
    max_new_tokens: int = _f(100, "completion length limit (tokens): of the samples (where task_sampling and phases do "
                                  "not set one per task) and of the held-out evaluation")
    task_sampling: dict = _f({}, "per-task overrides, e.g. {P: {temperature: 1.2, max_new_tokens: 80}}")
    phases: list = _f([], "task phases: [{start: 0, mix_env_ratio: 0.0, temperature: ...}, {start: 30, ...}]")
    # -- optimisation --------------------------------------------------------------------------
    lr: float = _f(2e-5, "peak learning rate (AdamW)")
    warmup_steps: int = _f(5, "linear LR warm-up steps")
    min_lr_ratio: float = _f(0.1, "cosine schedule floor as a share of lr")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    grad_clip: float = _f(1.0, "gradient-norm clip (0 = off)")
    updates_per_batch: int = _f(1, "μ: passes over each batch (>1 makes the clipped ratio matter)")
    minibatch_size: int = _f(0, "completions per forward/backward (gradient accumulation); 0 = whole batch")
    # -- LoRA (optional, needs peft) --------------------------------------------------------------
    lora_r: int = _f(0, "LoRA rank: train low-rank adapters instead of every weight (0 = off, full fine-tuning; needs peft). "
                        "The reference is the base with adapters disabled; checkpoints are saved merged")
    lora_alpha: float = _f(16.0, "LoRA scale numerator: adapter output x lora_alpha / lora_r")
    lora_targets: str = _f("c_attn,c_proj,c_fc", "comma-separated module names that get adapters (GPT-2: c_attn,c_proj,c_fc; a weight tied to another module, like lm_head, is refused)")
    # -- GRPO loss ------------------------------------------------------------------------------
    loss_type: str = _f("grpo", "how token losses are averaged: grpo (each completion's token mean, then the mean over "
                                "completions) | bnpo (token mean of the batch) | dr_grpo (token sum / (completions x the "
                                "task's max_new_tokens): a constant, no length bias) | dapo (token mean of the global batch)")
    importance_sampling_level: str = _f("token", "token | sequence: the ratio to the sampling policy and its clip per token "
                                                 "(PPO, GRPO) or per completion, exp of the mean per-token log ratio "
                                                 "(GSPO, Zheng et al. 2025, who clip at 3e-4 / 4e-4). Needs updates_per_batch > 1")
    clip_range: float = _f(0.2, "ε: clip the ratio to [1-ε_low, 1+ε_high]; sets both unless given. Needs updates_per_batch > 1 "
                                "(with one update per batch the ratio is exactly 1)")
    clip_low: float | None = _f(None, "ε_low (default: clip_range)")
    clip_high: float | None = _f(None, "ε_high (default: clip_range; DAPO uses 0.28)")
    clip_delta: float | None = _f(None, "two-sided clipping (TRL delta): cap the ratio at delta for tokens with negative "
                                        "advantage, whose loss the PPO clip leaves unbounded; > 1 + ε_high (null = off). "
                                        "Needs updates_per_batch > 1")
    tis_cap: float | None = _f(None, "sampler correction (truncated importance sampling): weight each token's policy loss by "
                                     "min(π_old / π_sampler, tis_cap), where the sampler's log-probs can differ from the "
                                     "trainer's (bf16 autocast, recorded rollouts, another inference engine); logged as "
                                     "tis_weight_mean / tis_weight_max / tis_capped next to logp_sampler_diff (null = off)")
    scale_rewards: str = _f("group", "advantage scaling: group | batch | none")
    std_floor: float = _f(0.05, "floor of the std that scales advantages (see std_floor_mode)")
    std_floor_mode: str = _f("max", "max: divide by max(std, std_floor), which shrinks groups whose std is below the floor "
                                    "(one of 8 rewards 0.1 apart: -29% at 0.05) | add: divide by std + std_floor (TRL, "
                                    "with std_floor 1e-4)")
    reward_norm: bool = _f(False, "divide advantages by an EMA of the reward std (needs scale_rewards none: group or batch "
                                  "scaling would cancel it)")
    reward_norm_momentum: float = _f(0.9, "EMA momentum of the reward normaliser")
    truncated_completions: str = _f("score", "completions that hit max_new_tokens: score (rewarded like any other) | mask "
                                             "(left out of the loss, still in their group's advantages; TRL "
                                             "mask_truncated_completions) | malformed (rewarded malformed_penalty)")
    entropy_coef: float = _f(0.0, "entropy bonus coefficient")
    anchor_coef: float = _f(0.0, "weight of a supervised loss on ground-truth training answers next to the GRPO loss "
                                 "(InstructGPT's PPO-ptx): holds tasks the rewards would erode; 0 = off")
    anchor_tasks: str = _f("A", "tasks whose ground-truth answers the anchor trains on: A, P or PA")
    anchor_batch: int = _f(16, "anchor samples per step (split evenly over anchor_tasks)")
    # -- KL control ------------------------------------------------------------------------------
    kl_coef: float = _f(0.04, "β: weight of KL(policy || reference); 0 skips the reference pass")
    kl_estimator: str = _f("k3", "KL on sampled tokens, r = log(ref / policy): k3 = e^r - r - 1 (DeepSeekMath, TRL: its "
                                 "value estimates KL(policy || ref) without bias; its gradient in the loss is that of "
                                 "KL(ref || policy)) | k2 = r^2 / 2 (its gradient is that of KL(policy || ref)) | k1 = -r "
                                 "(zero expected gradient: only with kl_coef 0, to log and guard KL) | exact (the "
                                 "full-vocabulary KL(policy || ref), value and gradient)")
    kl_clamp: float = _f(10.0, "clamp per-token KL values to this bound before averaging; clamped tokens get no KL "
                               "gradient (their share is logged as kl_clamped)")
    kl_mode: str = _f("fixed", "fixed | adaptive β")
    kl_target: float = _f(0.05, "adaptive: target KL")
    kl_horizon: int = _f(100, "adaptive: controller horizon in steps")
    kl_coef_min: float = _f(0.0, "adaptive: lower clamp of β")
    kl_coef_max: float = _f(1.0, "adaptive: upper clamp of β")
    kl_warmup_steps: int = _f(0, "steps during which β is multiplied by kl_warmup_factor")
    kl_warmup_factor: float = _f(0.0, "β multiplier during warm-up (0 = no KL penalty)")
    ref_refresh_every: int = _f(0, "copy the policy into the reference every K steps (0 = never)")
    ref_mix_alpha: float = _f(0.0, "with ref_refresh_every: ref = α·policy + (1-α)·ref (0 = plain copy)")
    # -- stability guards ----------------------------------------------------------------------
    nan_max_consecutive: int = _f(3, "non-finite steps in a row before a rollback")
    nan_max_rollbacks: int = _f(2, "rollbacks before the run stops")
    rollback_lr_factor: float = _f(0.5, "LR multiplier after each rollback (non-finite, or a collapse guard's recovery)")
    rollback_kl_factor: float = _f(1.0, "β multiplier after each collapse guard recovery (1 = unchanged; β 0 stays 0)")
    guard_valid_drop: float | None = _f(0.3, "collapse guard: a task's sampled well-formed share (valid/P, valid/A) more "
                                             "than this below its recent median (null = off)")
    guard_reward_drop: float | None = _f(0.2, "collapse guard: a task's training reward (reward/P, reward/A) more than "
                                              "this below its recent median (null = off)")
    guard_kl_mean: float | None = _f(1.0, "collapse guard: mean per-token KL to the reference above this (null = off; "
                                          "with kl_coef 0 the reference pass runs for it unless both KL bounds are null)")
    guard_kl_max: float | None = _f(5.0, "collapse guard: the largest per-completion mean KL (kl_seq_max) above this "
                                         "(null = off)")
    guard_entropy_factor: float | None = _f(2.0, "collapse guard: policy entropy more than this factor above or below "
                                                 "its recent median (null = off)")
    guard_truncation_rise: float | None = _f(0.3, "collapse guard: the share of completions cut at the length limit "
                                                  "more than this above its recent median (null = off)")
    guard_eval_drop: float | None = _f(0.05, "collapse guard: a held-out evaluation more than this below the best so "
                                             "far (rolls back to the best one; with eval_every 0 only the final "
                                             "evaluation is checked; null = off)")
    guard_window: int = _f(10, "steps of accepted history whose median the relative collapse signals compare with "
                               "(they start after 3)")
    guard_patience: int = _f(2, "steps in a row a signal must be out of bounds before the guard acts")
    guard_max_recoveries: int = _f(2, "collapse recoveries (roll back to the last good state before the signal went "
                                      "out of bounds, LR x rollback_lr_factor) before the run stops with the cause")
    guard_snapshot_every: int = _f(5, "keep the training state in memory every N steps as a rollback target (between "
                                      "checkpoints; about 3 x the trainable weights' size each, at most "
                                      "guard_patience / N + 2 kept)")
    dynamic_sampling: int = _f(0, "DAPO dynamic sampling: at most this many rounds of replacing groups whose rewards "
                                  "are all equal with groups of fresh prompts, until every group differs (0 = off); "
                                  "its cost is logged (dynamic/extra_per_kept: extra completions per kept group)")
    dynamic_sampling_oversample: float = _f(1.0, "fresh prompts drawn per missing group in each dynamic sampling round "
                                                 "(> 1: fewer rounds, more discarded groups)")
    # -- rewards ---------------------------------------------------------------------------------
    reward_shaping: str = _f("linear", "linear | graduated (5 levels) | binary")
    malformed_penalty: float = _f(-0.3, "reward of unreadable output")
    next_state_partial: float = _f(0.8, "A: most next-state credit for a readable wrong FEN, in [0, 1) (0 = exact or "
                                        "nothing); the credit counts only what the move changed")
    quality_scale: float = _f(0.3, "P: expected-score loss of the B: move against Stockfish's best at which its quality "
                                   "credit reaches 0 (a random legal move loses about 0.11, a blunder >= 0.2)")
    policy_weights: dict = _f(dict(RewardConfig().policy_weights), f"P: component weights {POLICY_COMPONENTS}")
    env_weights: dict = _f(dict(RewardConfig().env_weights), f"A: component weights {ENV_COMPONENTS}")
    curriculum: dict = _f({}, "weights over steps: {P: [[0, {format: 1.0}], [20, {...}]], A: [...]}")
    engine_depth: int = _f(8, "Stockfish depth for truths the data lacks and moves outside the top 5")
    engine_workers: int = _f(1, "Stockfish processes")
    engine_cache: str | None = _f("data/.cache/engine.sqlite", "SQLite analysis cache shared across runs (null = memory only)")
    # -- run ---------------------------------------------------------------------------------------
    output_dir: str = _f("runs/default", "run directory (config, metrics, checkpoints, report)")
    seed: int = _f(0, "seed for data order, sampling and initialisation")
    resume: bool = _f(False, "continue from the latest checkpoint in output_dir")
    eval_every: int = _f(0, "greedy held-out evaluation every N steps (0 = only before and after)")
    save_every: int = _f(20, "checkpoint every N steps")
    keep_last: int = _f(2, "checkpoints kept (plus the best by eval reward)")
    tensorboard: bool = _f(True, "write TensorBoard events to output_dir/tb")
    wandb: bool = _f(False, "log to Weights & Biases (needs wandb installed and a login)")
    report: bool = _f(True, "write plots and report.html at the end")
    progress: bool = _f(True, "progress bar")

    # ---------------------------------------------------------------------------------------------
    @property
    def eps_low(self) -> float:
        return self.clip_range if self.clip_low is None else self.clip_low

    @property
    def eps_high(self) -> float:
        return self.clip_range if self.clip_high is None else self.clip_high

    @property
    def anchor_per_task(self) -> int:
        """Anchor samples of each of `anchor_tasks` per step (global, before sharding over ranks)."""
        return self.anchor_batch // len(self.anchor_tasks)

    def reward_config(self) -> RewardConfig:
        return RewardConfig(policy_weights=dict(self.policy_weights), env_weights=dict(self.env_weights),
                            shaping=self.reward_shaping, malformed_penalty=self.malformed_penalty,
                            next_state_partial=self.next_state_partial, quality_scale=self.quality_scale)

    def sampling_for(self, task: str, step: int) -> dict:
        """Sampling settings and mix ratio in force for a task at a step (phases, then task overrides)."""
        s = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
             "max_new_tokens": self.max_new_tokens, "mix_env_ratio": self.mix_env_ratio}
        for phase in self.phases:
            if phase.get("start", 0) <= step:
                s.update({k: v for k, v in phase.items() if k in s})
                s.update(phase.get("task_sampling", {}).get(task, {}))
        s.update(self.task_sampling.get(task, {}))
        return s

    def validate(self) -> None:
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"config field '{name}' {rule} (got {getattr(self, name, None)!r})")

        need(self.steps >= 1, "steps", "must be >= 1")
        need(self.batch_positions >= 1, "batch_positions", "must be >= 1")
        need(self.group_size >= 2, "group_size", "must be >= 2 (advantages compare completions of one prompt)")
        need(self.temperature > 0, "temperature", "must be > 0")
        need(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        need(self.top_k >= 0, "top_k", "must be >= 0")
        need(self.max_new_tokens >= 1, "max_new_tokens", "must be >= 1")
        need(0 <= self.mix_env_ratio <= 1, "mix_env_ratio", "must be in [0, 1]")
        need(self.env_terminal_share is None or 0 <= self.env_terminal_share <= 1, "env_terminal_share",
             "must be in [0, 1] or null")
        need(0 <= self.mix_puzzle_ratio <= 1, "mix_puzzle_ratio", "must be in [0, 1]")
        need(self.mix_puzzle_ratio == 0 or bool(self.puzzle_data), "mix_puzzle_ratio",
             "needs puzzle_data (the puzzles to draw from)")
        need(self.lr > 0 and math.isfinite(self.lr), "lr", "must be > 0")
        need(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        need(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(self.grad_clip >= 0, "grad_clip", "must be >= 0")
        need(self.updates_per_batch >= 1, "updates_per_batch", "must be >= 1")
        need(self.minibatch_size >= 0, "minibatch_size", "must be >= 0")
        need(self.lora_r >= 0, "lora_r", "must be >= 0 (0 = off)")
        need(self.lora_alpha > 0, "lora_alpha", "must be > 0")
        need(any(t.strip() for t in self.lora_targets.split(",")), "lora_targets", "must name at least one module")
        need(self.lora_r == 0 or self.ref_refresh_every == 0, "ref_refresh_every",
             "must be 0 with LoRA (the reference is the base model with the adapters disabled)")
        need(self.lora_r == 0 or self.ref_device is None, "ref_device",
             "must be null with LoRA (the reference is the policy's own base model, on device)")
        need(self.loss_type in LOSS_TYPES, "loss_type", f"must be one of {LOSS_TYPES}")
        need(self.importance_sampling_level in LEVELS, "importance_sampling_level", f"must be one of {LEVELS}")
        need(0 < self.clip_range < 1, "clip_range", "must be in (0, 1)")
        need(self.clip_low is None or 0 < self.clip_low < 1, "clip_low", "must be in (0, 1)")
        need(self.clip_high is None or self.clip_high > 0, "clip_high", "must be > 0")
        need(self.scale_rewards in SCALES, "scale_rewards", f"must be one of {SCALES}")
        need(self.clip_delta is None or self.clip_delta > 1 + self.eps_high, "clip_delta",
             f"must be > 1 + ε_high ({1 + self.eps_high}) or null")
        need(self.tis_cap is None or self.tis_cap >= 1, "tis_cap", "must be >= 1 or null")
        need(self.std_floor > 0, "std_floor", "must be > 0")
        need(self.std_floor_mode in ("max", "add"), "std_floor_mode", "must be max or add")
        need(not self.reward_norm or self.scale_rewards == "none", "reward_norm",
             "needs scale_rewards none: under group or batch scaling the EMA's mean and std cancel out")
        need(0 <= self.reward_norm_momentum < 1, "reward_norm_momentum", "must be in [0, 1)")
        need(self.truncated_completions in ("score", "mask", "malformed"), "truncated_completions",
             "must be score, mask or malformed")
        need(self.entropy_coef >= 0, "entropy_coef", "must be >= 0")
        need(self.anchor_coef >= 0 and math.isfinite(self.anchor_coef), "anchor_coef", "must be finite and >= 0")
        need(self.anchor_tasks in ("A", "P", "PA"), "anchor_tasks", "must be A, P or PA")
        need(self.anchor_batch >= len(self.anchor_tasks) and self.anchor_batch % len(self.anchor_tasks) == 0,
             "anchor_batch", f"must be a positive multiple of the number of anchor_tasks ({len(self.anchor_tasks)})")
        need(self.kl_coef >= 0, "kl_coef", "must be >= 0")
        need(self.kl_estimator in KL_ESTIMATORS, "kl_estimator", f"must be one of {KL_ESTIMATORS}")
        need(self.kl_estimator != "k1" or (self.kl_coef == 0 and self.kl_coef_min == 0), "kl_estimator",
             "k1 has a zero expected gradient: as a penalty (kl_coef > 0) it pulls toward nothing; use k3 (the "
             "gradient of KL(ref || policy), DeepSeekMath/TRL) or k2 (of KL(policy || ref))")
        need(self.kl_clamp > 0, "kl_clamp", "must be > 0")
        need(self.kl_mode in ("fixed", "adaptive"), "kl_mode", "must be fixed or adaptive")
        need(self.kl_target > 0, "kl_target", "must be > 0")
        need(self.kl_horizon >= 1, "kl_horizon", "must be >= 1")
        need(0 <= self.kl_coef_min <= self.kl_coef_max, "kl_coef_min", "must be in [0, kl_coef_max]")
        need(self.kl_warmup_steps >= 0, "kl_warmup_steps", "must be >= 0")
        need(self.kl_warmup_factor >= 0, "kl_warmup_factor", "must be >= 0")
        need(self.ref_refresh_every >= 0, "ref_refresh_every", "must be >= 0")
        need(0 <= self.ref_mix_alpha <= 1, "ref_mix_alpha", "must be in [0, 1]")
        need(self.ref_mix_alpha == 0 or self.ref_refresh_every > 0, "ref_mix_alpha", "needs ref_refresh_every > 0")
        need(self.nan_max_consecutive >= 1, "nan_max_consecutive", "must be >= 1")
        need(self.nan_max_rollbacks >= 0, "nan_max_rollbacks", "must be >= 0")
        need(0 < self.rollback_lr_factor <= 1, "rollback_lr_factor", "must be in (0, 1]")
        need(self.rollback_kl_factor >= 1 and math.isfinite(self.rollback_kl_factor), "rollback_kl_factor", "must be >= 1")
        for name in ("guard_valid_drop", "guard_reward_drop", "guard_kl_mean", "guard_kl_max", "guard_truncation_rise",
                     "guard_eval_drop"):
            need(getattr(self, name) is None or getattr(self, name) > 0, name, "must be > 0 or null")
        need(self.guard_entropy_factor is None or self.guard_entropy_factor > 1, "guard_entropy_factor",
             "must be > 1 or null")
        need(self.guard_window >= 3, "guard_window", "must be >= 3")
        need(self.guard_patience >= 1, "guard_patience", "must be >= 1")
        need(self.guard_max_recoveries >= 0, "guard_max_recoveries", "must be >= 0")
        need(self.guard_snapshot_every >= 1, "guard_snapshot_every", "must be >= 1")
        need(self.dynamic_sampling >= 0, "dynamic_sampling", "must be >= 0")
        need(self.dynamic_sampling_oversample >= 1, "dynamic_sampling_oversample", "must be >= 1")
        need(self.layout in ("compact", "padded"), "layout", "must be compact or padded")
        need(self.autocast in ("none", "bf16", "auto"), "autocast", "must be none, bf16 or auto")
        need(self.backward_dtype in ("auto", "float32", "bf16"), "backward_dtype", "must be auto, float32 or bf16")
        need(not (self.backward_dtype == "float32" and self.autocast == "bf16"), "backward_dtype",
             "float32 contradicts autocast bf16 (its backward products are bf16)")
        need(not (self.backward_dtype == "bf16" and (self.lora_r or self.compile)), "backward_dtype",
             "bf16 needs a plain GPT-2 policy: not with lora_r or compile (use auto or float32)")
        need(self.record_rollout in ("auto", "always", "never"), "record_rollout", "must be auto, always or never")
        need(not (self.record_rollout == "always" and (self.lora_r or self.compile or self.autocast == "bf16")),
             "record_rollout", "always needs a plain GPT-2 policy: not with lora_r, compile or autocast bf16 (use auto)")
        need(self.eval_limit >= 0, "eval_limit", "must be >= 0")
        need(self.eval_every >= 0, "eval_every", "must be >= 0")
        need(self.save_every >= 1, "save_every", "must be >= 1")
        need(self.keep_last >= 1, "keep_last", "must be >= 1")
        need(self.engine_depth >= 1, "engine_depth", "must be >= 1")
        need(self.engine_workers >= 1, "engine_workers", "must be >= 1")
        need(self.threads is None or self.threads >= 1, "threads", "must be >= 1")
        self.reward_config().validate()
        known = set(self.sampling_for("P", 0))
        for task, over in self.task_sampling.items():
            need(task in ("P", "A"), "task_sampling", "keys must be P or A")
            need(set(over) <= known - {"mix_env_ratio"}, "task_sampling", f"may set only {sorted(known - {'mix_env_ratio'})}")
        for i, phase in enumerate(self.phases):
            need(isinstance(phase, dict) and isinstance(phase.get("start"), int), "phases", f"entry {i} needs an integer 'start'")
            extra = set(phase) - known - {"start", "name", "task_sampling"}
            need(not extra, "phases", f"entry {i} has unknown keys {sorted(extra)}")
        starts = [p["start"] for p in self.phases]
        need(starts == sorted(starts), "phases", "must be sorted by start")
        from rookworld_rlvr.grpo.control import CurriculumSchedule

        try:
            CurriculumSchedule(self.curriculum).check({"P": self.policy_weights, "A": self.env_weights})
        except ValueError as e:
            raise ValueError(f"config field 'curriculum': {e}") from None

    @property
    def uses_reference(self) -> bool:
        """The reference pass runs for the KL penalty, or for the collapse guard's KL signals."""
        return self.kl_coef > 0 or self.guard_kl_mean is not None or self.guard_kl_max is not None

    def sampled_tasks(self) -> set[str]:
        """Tasks that get prompts at some step (the mix at step 0 and at every phase start)."""
        out = set()
        for step in [0] + [p["start"] for p in self.phases if p["start"] < self.steps]:
            n_env = round(self.batch_positions * self.sampling_for("A", step)["mix_env_ratio"])
            out |= ({"A"} if n_env else set()) | ({"P"} if n_env < self.batch_positions else set())
        return out

    def inert_settings(self, names: Iterable[str] | None = None) -> list[str]:
        """Settings among `names` (default: every field away from its default) that cannot take effect
        under the rest of this configuration, each with the reason. The trainer logs them as warnings."""
        defaults = TrainConfig()
        names = set(names) if names is not None else {f for f in FIELDS if getattr(self, f) != getattr(defaults, f)}
        tasks = self.sampled_tasks()
        rules: list[tuple[tuple[str, ...], bool, str]] = [
            (("clip_range", "clip_low", "clip_high", "clip_delta", "importance_sampling_level"),
             self.updates_per_batch == 1, "with updates_per_batch 1 the ratio to the sampling policy is exactly 1: "
                                          "no clip binds and the sequence-level ratio gives the token-level gradient"),
            (("kl_target", "kl_horizon", "kl_coef_min", "kl_coef_max"), self.kl_mode == "fixed",
             "adaptive-KL settings with kl_mode fixed"),
            (("kl_warmup_factor",), self.kl_warmup_steps == 0, "kl_warmup_steps is 0"),
            (("kl_mode", "kl_warmup_steps", "ref_refresh_every", "ref_mix_alpha", "rollback_kl_factor"),
             self.kl_coef == 0, "kl_coef 0: no KL penalty"),
            (("kl_estimator", "kl_clamp", "ref_device"), not self.uses_reference,
             "no reference pass (kl_coef 0 and no KL guard)"),
            (("guard_eval_drop",), not self.eval_data, "eval_data is empty (no evaluation)"),
            (("anchor_tasks", "anchor_batch"), self.anchor_coef == 0, "anchor_coef is 0"),
            (("lora_alpha", "lora_targets"), self.lora_r == 0, "lora_r is 0 (full fine-tuning)"),
            (("reward_norm_momentum",), not self.reward_norm, "reward_norm is off"),
            (("std_floor", "std_floor_mode"), self.scale_rewards == "none", "scale_rewards none divides by nothing"),
            (("dynamic_sampling_oversample",), self.dynamic_sampling == 0, "dynamic_sampling is 0"),
            (("env_terminal_share",), "A" not in tasks, "no A: prompts are sampled (mix_env_ratio 0 in every phase)"),
            (("eval_limit", "eval_every"), not self.eval_data, "eval_data is empty (no evaluation)"),
        ]
        out = [f"{name}: {reason}" for fields, cond, reason in rules if cond for name in fields if name in names]
        for task, over in self.task_sampling.items():
            if task not in tasks and "task_sampling" in names:
                out.append(f"task_sampling: {task}: {sorted(over)} has no effect: no {task}: prompts are sampled")
        for key in ("temperature", "top_p", "top_k"):
            if key in names and tasks and all(key in self.task_sampling.get(t, {}) for t in tasks):
                out.append(f"{key}: every sampled task sets its own {key} in task_sampling")
        return out

    # -- io ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        from rookworld_rlvr.data.io import atomic_write_text

        atomic_write_text(path, [yaml.safe_dump(self.to_dict(), sort_keys=False)])


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def unknown_field(name: str) -> str:
    """The error for a name that is not a field: why it was removed, or the closest fields."""
    if name in REMOVED:
        return f"config field '{name}' was {REMOVED[name]}"
    close = [n for n in FIELDS if n.split("_")[0] == name.split("_")[0]][:5]
    return f"unknown config field '{name}'" + (f"; did you mean one of {close}?" if close else "")


def coerce(name: str, text: str) -> Any:
    """Parse a command-line / environment string for field `name` (YAML syntax: 1e-5, true, null, {a: 1})."""
    if name not in FIELDS:
        raise ValueError(unknown_field(name))
    value = yaml.safe_load(text) if text != "" else None
    default = TrainConfig().__getattribute__(name)
    if isinstance(value, str) and FIELDS[name].type in ("float", "float | None", "int", "int | None"):
        try:  # YAML 1.1 reads 1e-5 as a string
            value = float(value)
        except ValueError:
            raise ValueError(f"config field '{name}' needs a number, got {text!r}") from None
    if isinstance(default, bool) and not isinstance(value, bool):
        raise ValueError(f"config field '{name}' must be true or false, got {text!r}")
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(default, str) and value is not None and not isinstance(value, str):
        value = str(text)
    if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def load_config(path: str | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """YAML preset (optional) + overrides (already typed, or strings to coerce). Unknown keys are errors."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.exists():
            raise ValueError(f"config file {path}: no such file")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: a config file must be a mapping of field: value")
        for k in loaded:
            if k not in FIELDS:
                raise ValueError(f"{path}: {unknown_field(k)}")
        data.update(loaded)
    for k, v in (overrides or {}).items():
        if k not in FIELDS:
            raise ValueError(unknown_field(k))
        data[k] = coerce(k, v) if isinstance(v, str) else v
    cfg = TrainConfig(**data)
    _check_types(cfg)
    cfg.validate()
    return cfg


def _check_types(cfg: TrainConfig) -> None:
    defaults = TrainConfig()
    for name in FIELDS:
        v, d = getattr(cfg, name), getattr(defaults, name)
        if v is None or d is None:
            continue
        if isinstance(d, bool) != isinstance(v, bool) or (isinstance(d, (int, float)) and not isinstance(v, (int, float))) \
                or (isinstance(d, str) and not isinstance(v, str)) or (isinstance(d, dict) and not isinstance(v, dict)) \
                or (isinstance(d, list) and not isinstance(v, list)):
            raise ValueError(f"config field '{name}' must be of type {type(d).__name__}, got {v!r}")
        if isinstance(d, float) and isinstance(v, int):
            setattr(cfg, name, float(v))


def add_field_arguments(group: Any, show_defaults: bool = True) -> None:
    """One `--field-name V` (and `--field_name V`) option per field, stored as `cfg__<field>`."""
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        flags = ["--" + f.name.replace("_", "-")] + (["--" + f.name] if "_" in f.name else [])
        default = getattr(defaults, f.name)
        text = f.metadata["help"] + (f" (default: {json.dumps(default)})" if show_defaults else "")
        kw = {"nargs": "?", "const": "true"} if isinstance(default, bool) else {}
        group.add_argument(*flags, dest=f"cfg__{f.name}", default=None, metavar="V",
                           help=text.replace("%", "%%"), **kw)  # argparse %-formats help texts


def help_table() -> str:
    """Markdown table of every field (for the README)."""
    rows = ["| field | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(TrainConfig):
        default = getattr(TrainConfig(), f.name)
        meaning = f.metadata["help"].replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{json.dumps(default)}` | {meaning} |")
    return "\n".join(rows)
