"""The GRPO run configuration: one flat dataclass, YAML presets, `--key value` overrides.

Every field has a help text (shown by `rookworld train --help` and in docs/configuration.md), is
validated in `validate()`, and is read by the trainer. Flat names keep overrides simple:
`--kl-coef 0.02` on the command line, `KL_COEF=0.02` in train.sh, `kl_coef: 0.02` in YAML.

Owns the fields, their defaults and help, reading presets and overrides, and what follows from
the fields (sampling settings per task and step, the P:/A: split of a batch). Its rules are
`config_checks`. Imports no torch and nothing of the model or trainer.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from rookworld_rlvr.paths import no_such_file
from rookworld_rlvr.tasks.rewards import ENV_COMPONENTS, POLICY_COMPONENTS, RewardConfig
from rookworld_rlvr.yaml_text import load_file, load_text

LOSS_TYPES, LEVELS = ("grpo", "bnpo", "dr_grpo", "dapo"), ("token", "sequence")
KL_ESTIMATORS, SCALES = ("k1", "k2", "k3", "exact"), ("group", "batch", "none")
# Fields that were removed, and why: an old preset or command line gets this instead of "unknown field".
REMOVED = {
    "adv_clip": "removed: with group scaling |advantage| <= (G - 1) / sqrt(G) (2.47 at G = 8), so a clip at 3 or 5 "
                "never bound",
    "lora_dropout": "removed: dropout is off in every GRPO forward pass (sampler, policy and reference log-probs "
                    "must agree), so 0 was its only legal value",
    "resample_zero_variance": "replaced by dynamic_sampling (DAPO: the same rounds, with oversampling and its cost logged)",
    "kl_divergence_threshold": "renamed guard_kl_mean: one signal of the collapse guard",
    "kl_max_recoveries": "renamed guard_max_recoveries: shared by every collapse guard signal",
    "compile": "removed: it compiled the model's forward, which the GPT-2 paths (one forward over prompt and "
               "length buckets, the cascade decode step) never call, so it turned them off instead and recompiled "
               "at every new batch shape (32 s a step against 0.7 on a CPU); compiling those paths needs "
               "shape-stable steps first",
}


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: json.loads(json.dumps(d)), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    # -- model -------------------------------------------------------------------------------
    model: str = _f("models/rookworld-board", "policy to train: a local directory or a Hub id (jrahn/RookWorld-LM-124M)")
    device: str = _f("auto", "auto | cpu | cuda | cuda:N | mps (CUDA: float32 products in TF32 unless IEEE was chosen)")
    ref_device: str | None = _f(None, "device for the frozen reference model (default: same as device)")
    autocast: str = _f("none", "none | bf16 | auto: bf16 autocast with fp32 master weights (auto = where the hardware supports bf16 well)")
    backward_dtype: str = _f("auto", "auto | float32 | bf16: dtype of the policy pass's backward matrix products; its forward "
                                     "(log-probs, ratios) stays float32 (auto = bf16 where a bf16 product measures >= 1.5x "
                                     "faster; plain GPT-2 policies only)")
    record_rollout: str = _f("auto", "auto | always | never: keep each layer's projection outputs and the logits from "
                                     "sampling and skip those matrix products (the LM head's included) in the first "
                                     "update on the batch (the same log-probs and gradients). Memory per row and new "
                                     "token, for the whole batch: about 36 x n_embd x n_layer bytes, plus 4 x "
                                     "vocabulary for the logits (64 rows x 100 of GPT-2 124M: 2.1 GB, plus 1.3 GB with "
                                     "its 50k vocabulary). auto = on a CPU from n_embd 512 (124M, 768 wide: a 40% "
                                     "shorter policy pass; the tiny model, 256 wide: no gain), and on GPUs (unmeasured "
                                     "there). Plain GPT-2 policies without autocast or LoRA; the log says if it is on")
    decode_graph: bool = _f(False, "decode with a shape-stable step: every row stays in the batch to the end and, on "
                                   "CUDA, each token (its draw, its bookkeeping, the whole model's step) replays one "
                                   "captured CUDA graph (one launch instead of hundreds from Python); the same samples "
                                   "up to float reordering. Plain GPT-2 policies (LoRA included); its step records "
                                   "nothing (record_rollout off)")
    threads: int | None = _f(None, "torch intra-op threads (default: torch's choice)")
    step_timeout_minutes: float = _f(10.0, "under torchrun: how long a rank waits for the others at a step's "
                                           "collectives (rewards, gradients, metrics, the shares of a held-out "
                                           "evaluation) and at their first meeting before the run fails, so that a "
                                           "rank that hangs ends the run (torchrun then stops the others) instead of "
                                           "holding every device; while rank 0 alone sets up the run or saves, the "
                                           "others wait up to 15 minutes; a rank still there this long after the run "
                                           "is done is killed. No effect in one process")
    # -- data ----------------------------------------------------------------------------------
    data: str = _f("data/train.jsonl.xz", "training prompts: our JSONL (.gz, .xz) or upstream RookWorld text lines")
    eval_data: str = _f("data/eval.jsonl.gz", "held-out set for the greedy evaluation")
    eval_limit: int = _f(200, "eval_data samples per task per evaluation (0 = all); the other held-out sets run whole")
    eval_batch_size: int = _f(64, "prompts a held-out evaluation decodes at once (same answers; a GPU gains most)")
    eval_cache: str = _f("", "folder where the evaluation of the weights a run starts from keeps its greedy answers, by "
                         "weights, machine and code: a later run from them reads them back instead ('' = off)")
    skip_invalid: bool = _f(False, "skip and count malformed data lines instead of stopping")
    layout: str = _f("compact", "P: prompt layout: compact | padded (upstream columns; use for RookWorld-LM)")
    mix_env_ratio: float = _f(0.5, "share of A: (environment) prompts in each batch")
    env_terminal_share: float | None = _f(None, "share of A: prompts drawn from game-ending transitions (terminated or "
                                                "truncated; 8.6% of the shipped training set); null = as they occur in the data")
    check_share: float | None = _f(None, "share of the P: prompts (other than puzzles) drawn from training positions where "
                                         "the side to move is in check (8% of the shipped P: data), where a base plays "
                                         "most of its illegal moves; null = as they occur in the data")
    puzzle_data: str | None = _f(None, "training puzzles (JSONL rows {fen, solutions, kind}: mates in one, tactics): P: "
                                       "prompts with a verified binary reward (1 for a solving B: in a well-formed answer)")
    mix_puzzle_ratio: float = _f(0.0, "share of P: prompts drawn from puzzle_data")
    strength_data: str | None = _f("data/strength.jsonl.gz", "judged held-out positions (`rookworld data judge`): each "
                                                             "evaluation reports move quality next to a random legal "
                                                             "mover on them (null = skip: the verdict's move row is "
                                                             "then the held-out P: samples' legal best moves)")
    history_eval_data: str | None = _f("data/eval_histories.jsonl.gz", "held-out A: transitions with 1-9 moves of history "
                                                                    "(game starts, games set up from a position; `rookworld "
                                                                    "data histories`): each evaluation reports their "
                                                                    "next state per history length (null = skip)")
    puzzle_eval_data: str | None = _f("data/puzzles_eval.jsonl.gz", "held-out puzzles each evaluation solves (null = skip)")
    # -- batch and sampling --------------------------------------------------------------------
    steps: int = _f(60, "optimizer steps (one batch of prompts per step)")
    max_minutes: float | None = _f(None, "wall-clock budget of the run in minutes, counted over resumes (evaluations "
                                         "included): the run ends, evaluated and saved, after the first step past it, "
                                         "and the lr schedule runs on the larger of step/steps and time used/budget, so "
                                         "it decays when the time ends (null = run all `steps`; runs ended by time are "
                                         "not reproducible step for step)")
    batch_positions: int = _f(8, "prompts per step (B)")
    group_size: int = _f(8, "completions per prompt (G)")
    temperature: float = _f(1.0, "sampling temperature (the trainer's log-probs use the same temperature)")
    top_p: float = _f(1.0, "nucleus sampling")
    top_k: int = _f(0, "top-k sampling (0 = off)")
    max_new_tokens: int = _f(100, "completion length limit (tokens): of the samples (where task_sampling and phases do "
                                  "not set one per task) and of the held-out evaluation")
    task_sampling: dict = _f({}, "per-task overrides of temperature, top_p, top_k, max_new_tokens (each under its "
                             "field's rule), e.g. {P: {temperature: 1.2, max_new_tokens: 80}}")
    phases: list = _f([], "task phases, each in force from its start on, over the fields and task_sampling: [{start: "
                      "0, mix_env_ratio: 0.0, temperature: ...}, {start: 30, task_sampling: {A: {...}}}] (settings "
                      "under their fields' rules; starts in order, from step 0, no two at one step; a phase that "
                      "starts after the last step is warned of)")
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
    lora_targets: str = _f("c_attn,c_proj,c_fc", "comma-separated module names (a name's last part) that get adapters (GPT-2: c_attn,c_proj,c_fc; a name that matches no module taking adapters, or a weight tied to another module, like lm_head, is refused)")
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
    quality_advantage: float = _f(0.0, "add to each legal P: sample's advantage this x (its quality minus the mean quality "
                                       "of its group's legal samples): a signal for the better legal move that the "
                                       "legal-against-illegal spread does not drown (grpo/quality_term.py; 0 = off)")
    reward_signal: bool = _f(True, "false: a control run, every advantage 0: sampling, scoring, logs, KL and the anchor as "
                                   "given, and no reward reaches a weight; what a run's change owes its rewards "
                                   "(needs anchor_coef > 0)")
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
    anchor_data: str | None = _f(None, "the anchor's ground-truth answers, a file like data's (null = data's): prompts "
                                       "from one set of positions, the anchor holding another")
    anchor_positions: str = _f("all", "the P: positions whose answers the anchor trains on: all | out_of_check (none in "
                                      "check: a skill in check is then GRPO's alone, not taught by the true answers)")
    anchor_batch: int = _f(16, "anchor samples per step (split evenly over anchor_tasks); their forward and "
                               "backward are time/anchor in metrics.jsonl")
    anchor_order: str = _f("best-first", "P: candidate order of the anchor's answers: best-first (how the shipped base "
                                         "was trained: `rookworld sft --order best-first`) | given (as stored; upstream "
                                         "RookWorld shuffled them). An order the base was not trained on pulls it "
                                         "away from its own answers")
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
    rollback_lr_factor: float = _f(0.3, "LR multiplier after each rollback (non-finite, or a collapse guard's recovery); "
                                          "0.3 brings lr 1e-3 to 9e-5 in two recoveries (0.5 left it collapsing)")
    rollback_kl_factor: float = _f(1.0, "β multiplier after each collapse guard recovery (1 = unchanged; β 0 stays 0)")
    guard_valid_drop: float | None = _f(0.3, "collapse guard: a task's sampled well-formed share (valid/P, valid/A) more "
                                             "than this below its recent median (null = off)")
    guard_reward_drop: float | None = _f(0.2, "collapse guard: a task's training reward (reward/P, reward/A) more than "
                                              "this below its recent median (null = off)")
    guard_kl_mean: float | None = _f(0.5, "collapse guard: mean per-token KL to the reference above this (null = off; "
                                          "with kl_coef 0 the reference pass runs for it unless both KL bounds are null)")
    guard_kl_max: float | None = _f(5.0, "collapse guard: the largest per-completion mean KL (kl_seq_max) above this "
                                         "(null = off)")
    guard_entropy_factor: float | None = _f(2.0, "collapse guard: policy entropy more than this factor above or below "
                                                 "its recent median (null = off)")
    guard_truncation_rise: float | None = _f(0.3, "collapse guard: the share of completions cut at the length limit "
                                                  "more than this above its recent median (null = off)")
    guard_eval_drop: float | None = _f(0.02, "collapse guard: a held-out evaluation more than this below the best so "
                                             "far, and beyond 2 standard errors of the change paired over the same "
                                             "rows (rolls back to the best one; with eval_every 0 only the final "
                                             "evaluation is checked; null = off)")
    guard_window: int = _f(10, "steps of accepted history whose median the relative collapse signals compare with "
                               "(they start after 3)")
    guard_patience: int = _f(2, "steps in a row a signal must be out of bounds before the guard acts")
    guard_max_recoveries: int = _f(3, "collapse recoveries (roll back to the last good state before the signal went "
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
    score_overlap: str = _f("auto", "auto | always | never: start the Stockfish searches that scoring needs (legal best "
                                    "moves outside a sample's top 5) for the rows that finish while the rest of the batch "
                                    "still decodes; the rewards are the same. auto = when the policy is not on the CPU "
                                    "(on a CPU the engine would take the decode's cores)")
    engine_cache: str | None = _f("data/.cache/engine.sqlite", "SQLite analysis cache shared across runs (null = memory only)")
    # -- run ---------------------------------------------------------------------------------------
    output_dir: str = _f("runs/default", "run directory (config, metrics, checkpoints, report)")
    seed: int = _f(0, "seed for data order, sampling and initialisation")
    resume: bool = _f(False, "continue from the latest checkpoint in output_dir (each setting that "
                             "differs from the checkpoint's is said; it takes effect from there on)")
    eval_every: int = _f(0, "greedy held-out evaluation every N steps (0 = only before and after)")
    save_every: int = _f(20, "checkpoint every N steps (and before and after each held-out evaluation)")
    keep_last: int = _f(2, "checkpoints kept (plus the best by eval reward)")
    tensorboard: bool = _f(True, "write TensorBoard events to output_dir/tb (a resume hides the steps it redoes)")
    wandb: bool = _f(False, "log each step to a Weights & Biases run named as output_dir (the `wandb` extra and a "
                     "login, or WANDB_MODE=offline); a resume goes on in it (its id: output_dir/wandb_id)")
    report: bool = _f(True, "write plots and report.html at the end (matplotlib: the `report` extra)")
    progress: bool = _f(True, "progress bars: the steps, and each held-out evaluation's tasks (written to a file or a "
                              "pipe, each bar stays on its line: no cursor moves)")

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
        """Sampling settings and mix ratio in force for a task at a step: the fields, the task's task_sampling, then
        each phase that has started (its settings, then its task_sampling), a later one over an earlier."""
        s = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "max_new_tokens":
             self.max_new_tokens, "mix_env_ratio": self.mix_env_ratio, **self.task_sampling.get(task, {})}
        for phase in self.phases:
            if phase.get("start", 0) <= step:
                s.update({k: v for k, v in phase.items() if k in s})
                s.update(phase.get("task_sampling", {}).get(task, {}))
        return s

    def task_counts(self, step: int) -> dict[str, int]:
        """Global prompts per task at `step`: the batch split by the P:/A: mix in force (phases)."""
        n_env = round(self.batch_positions * self.sampling_for("A", step)["mix_env_ratio"])
        return {"P": self.batch_positions - n_env, "A": n_env}

    def validate(self) -> None:
        """Raise ValueError naming the first field that breaks a rule (`config_checks`)."""
        from rookworld_rlvr.config_checks import validate
        validate(self)

    @property
    def uses_reference(self) -> bool:
        """The reference pass runs for the KL penalty, or for the collapse guard's KL signals."""
        return self.kl_coef > 0 or self.guard_kl_mean is not None or self.guard_kl_max is not None

    def sampled_tasks(self) -> set[str]:
        """Tasks that get prompts at some step (the mix at step 0 and at every phase start)."""
        out = set()
        for step in [0] + [p["start"] for p in self.phases if p["start"] < self.steps]:
            out |= {task for task, n in self.task_counts(step).items() if n}
        return out

    def inert_settings(self, names: Iterable[str] | None = None, processes: int | None = 1) -> list[str]:
        """Settings among `names` (default: every field away from its default) that cannot take effect
        under the rest of this configuration in `processes` processes, each with the reason (`config_checks`)."""
        from rookworld_rlvr.config_checks import inert_settings
        return inert_settings(self, names, processes)

    # -- io ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        from rookworld_rlvr.data.io import atomic_write_text

        atomic_write_text(path, [yaml.safe_dump(self.to_dict(), sort_keys=False)])


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def coerce(name: str, text: str) -> Any:
    """Parse a command-line / environment string for field `name` (YAML syntax: 1e-5, true, null, {a: 1})."""
    if name not in FIELDS:
        from rookworld_rlvr.config_checks import unknown_field
        raise ValueError(unknown_field(name))
    if text.strip() == "":
        if str(FIELDS[name].type).split(" | ")[0] == "str":
            return ""  # an empty path or name: eval_data '' = no evaluation
        raise ValueError(f"config field '{name}' needs a value, got an empty one")
    try:
        value = load_text(text)
    except yaml.YAMLError as e:
        raise ValueError(f"config field '{name}': cannot read {text!r} ({getattr(e, 'problem', None) or e})") from None
    if str(FIELDS[name].type).split(" | ")[0] == "str" and value is not None and not isinstance(value, str):
        value = str(text)  # a name that YAML would read as a number or a date stays the text given
    return typed(name, value)


def load_config(path: str | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """YAML preset (optional) + overrides (already typed, or strings to coerce). Unknown keys are errors."""
    data: dict[str, Any] = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"config file {path}: a directory, not a YAML file" if p.is_dir() else
                             f"config file {no_such_file(path)}")
        loaded = load_file(p) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: a config file must be a mapping of field: value")
        if unknown := [k for k in loaded if k not in FIELDS]:
            from rookworld_rlvr.config_checks import unknown_field, where_set
            raise ValueError(where_set(unknown_field(unknown[0]), path, {unknown[0]}))
        data.update(loaded)
    for k, v in (overrides or {}).items():
        if k not in FIELDS:
            from rookworld_rlvr.config_checks import unknown_field
            raise ValueError(unknown_field(k))
        data[k] = coerce(k, v) if isinstance(v, str) else v
    cfg = TrainConfig(**data)
    try:
        for name in FIELDS:  # each value as its field's type
            setattr(cfg, name, typed(name, getattr(cfg, name)))
        cfg.validate()
    except ValueError as e:  # name the file and line of a bad value that came from the YAML file
        from rookworld_rlvr.config_checks import where_set
        raise ValueError(where_set(str(e), path, set(data) - set(overrides or {}))) from None
    return cfg


def typed(name: str, v: Any) -> Any:
    """`v` as field `name`'s declared type (int, float, str, bool, dict, list; `| None` allows null):
    an integral float as an int, a number written as text (YAML 1.1 reads 1e-5 so) as a float, an
    int as a float; anything else is a ValueError naming the field."""
    kind = str(FIELDS[name].type)
    base, nullable = kind.split(" | ")[0], kind.endswith("| None")
    want = {"int": "an integer", "float": "a number", "str": "text", "bool": "true or false", "dict": "a mapping",
            "list": "a list"}[base]
    if v is None:
        if nullable:
            return None
        raise ValueError(f"config field '{name}' needs {want}, got an empty value")
    if base == "int" and isinstance(v, float) and v.is_integer():
        v = int(v)
    if base == "float" and isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            pass
    if base == "float" and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    python = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict, "list": list}[base]
    if not isinstance(v, python) or (base in ("int", "float") and isinstance(v, bool)):
        raise ValueError(f"config field '{name}' needs {want}, got {v!r}")
    if name in ("task_sampling", "phases"):  # each setting they set as its field's type
        from rookworld_rlvr.config_checks import sampling_overrides
        v = sampling_overrides(name, v)
    if name == "curriculum":
        for task, stages in v.items():
            if not isinstance(stages, list) or not all(isinstance(s, (list, tuple)) and len(s) == 2
                                                       and isinstance(s[1], dict) for s in stages):
                raise ValueError(f"config field 'curriculum': {task} needs a list of [step, {{component: weight}}] "
                                 f"pairs, got {stages!r}")
    return v


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
    """Markdown table of every field (for docs/configuration.md)."""
    rows = ["| field | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(TrainConfig):
        default = getattr(TrainConfig(), f.name)
        meaning = f.metadata["help"].replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{json.dumps(default)}` | {meaning} |")
    return "\n".join(rows)
