"""The rules a `TrainConfig` must follow, and the settings that cannot take effect under the rest.

`validate` raises ValueError naming the first field that breaks a rule; `inert_settings` lists
the settings that are legal but have no effect here (the trainer and the dry run warn about
them). Owns the rules. Imports nothing of the model, the trainer's loop or chess; the curriculum
checks itself (`grpo.control.CurriculumSchedule`, imported when validating).
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Iterable, Iterator

import yaml

from rookworld_rlvr.config import FIELDS, KL_ESTIMATORS, LEVELS, LOSS_TYPES, REMOVED, SCALES, TrainConfig


# fields whose only rule is a lower bound, a share in [0, 1], a closed set of choices, or > 0 unless null
AT_LEAST = {"steps": 1, "batch_positions": 1, "top_k": 0, "max_new_tokens": 1, "warmup_steps": 0,
            "weight_decay": 0, "grad_clip": 0, "updates_per_batch": 1, "minibatch_size": 0, "entropy_coef": 0,
            "kl_coef": 0, "kl_horizon": 1, "kl_warmup_steps": 0, "kl_warmup_factor": 0, "ref_refresh_every": 0,
            "nan_max_consecutive": 1, "nan_max_rollbacks": 0, "guard_window": 3, "guard_patience": 1,
            "guard_max_recoveries": 0, "guard_snapshot_every": 1, "dynamic_sampling": 0,
            "dynamic_sampling_oversample": 1, "eval_limit": 0, "eval_batch_size": 1, "eval_every": 0, "save_every": 1,
            "keep_last": 1, "engine_depth": 1, "engine_workers": 1}
SHARES = ("mix_env_ratio", "mix_puzzle_ratio", "min_lr_ratio", "ref_mix_alpha")
CHOICES = {"loss_type": LOSS_TYPES, "importance_sampling_level": LEVELS, "scale_rewards": SCALES,
           "kl_estimator": KL_ESTIMATORS, "std_floor_mode": ("max", "add"), "kl_mode": ("fixed", "adaptive"),
           "truncated_completions": ("score", "mask", "malformed"), "anchor_tasks": ("A", "P", "PA"),
           "anchor_order": ("best-first", "given"),
           "anchor_positions": ("all", "out_of_check"),
           "layout": ("compact", "padded"), "autocast": ("none", "bf16", "auto"),
           "backward_dtype": ("auto", "float32", "bf16"), "record_rollout": ("auto", "always", "never"),
           "score_overlap": ("auto", "always", "never")}
POSITIVE_OR_NULL = ("guard_valid_drop", "guard_reward_drop", "guard_kl_mean", "guard_kl_max", "guard_truncation_rise",
                    "guard_eval_drop")


# each sampling setting a phase or `task_sampling` may set: its type and rule, as for the field of its name
SAMPLING = {"temperature": (float, lambda v: v > 0, "> 0"), "top_p": (float, lambda v: 0 < v <= 1, "in (0, 1]"),
            "top_k": (int, lambda v: v >= 0, ">= 0"), "max_new_tokens": (int, lambda v: v >= 1, ">= 1"),
            "mix_env_ratio": (float, lambda v: 0 <= v <= 1, "in [0, 1]")}


def sampling_overrides(name: str, value: dict | list) -> dict | list:
    """`task_sampling` ({P|A: settings}) or `phases` ([{start, name, settings, task_sampling}, ...]) with each
    setting as its field's type; a ValueError names the field, the entry and the setting that is unknown, of
    another type or outside its rule (a phase's `temperature: hot` would otherwise reach the sampler as it is)."""
    from rookworld_rlvr.config import typed

    def settings(where: str, over, allowed: set[str]) -> dict:
        if not isinstance(over, dict):
            raise ValueError(f"config field '{name}': {where} needs a mapping of sampling settings (e.g. "
                             f"{{temperature: 0.8}}), got {over!r}")
        if extra := set(over) - allowed:
            raise ValueError(f"config field '{name}': {where} has unknown keys {sorted(extra)}; "
                             f"known: {sorted(allowed)}")
        out = dict(over)
        for key in set(over) & set(SAMPLING):
            kind, rule, text = SAMPLING[key]
            try:
                out[key] = typed(key, over[key])
                ok = rule(out[key])
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"config field '{name}': {where} {key} must be "
                                 f"{'an integer' if kind is int else 'a number'} {text}, got {over[key]!r}")
        return out

    def per_task(where: str, over) -> dict:
        if not isinstance(over, dict) or not set(over) <= {"P", "A"}:
            raise ValueError(f"config field '{name}': {where}needs a mapping of P and A to sampling settings, "
                             f"got {over!r}")
        return {task: settings(f"{where}{task}", s, set(SAMPLING) - {"mix_env_ratio"}) for task, s in over.items()}

    if name == "task_sampling":
        return per_task("", value)
    phases = []
    for i, phase in enumerate(value):
        if not isinstance(phase, dict) or not isinstance(phase.get("start"), int) or isinstance(phase["start"], bool):
            raise ValueError(f"config field 'phases': entry {i} needs a mapping with an integer 'start', got {phase!r}")
        phase = settings(f"entry {i}", phase, set(SAMPLING) | {"start", "name", "task_sampling"})
        if "task_sampling" in phase:
            phase["task_sampling"] = per_task(f"entry {i} task_sampling ", phase["task_sampling"])
        phases.append(phase)
    return phases


def validate(cfg: TrainConfig) -> None:
    """Raise ValueError naming the first field that breaks a rule."""

    def need(ok: bool, name: str, rule: str) -> None:
        if not ok:
            raise ValueError(f"config field '{name}' {rule} (got {getattr(cfg, name, None)!r})")

    need(cfg.group_size >= 2, "group_size", "must be >= 2 (advantages compare completions of one prompt)")
    for name, low in AT_LEAST.items():
        need(getattr(cfg, name) >= low, name, f"must be >= {low}")
    for name in SHARES:
        need(0 <= getattr(cfg, name) <= 1, name, "must be in [0, 1]")
    for name, choices in CHOICES.items():
        need(getattr(cfg, name) in choices, name, f"must be one of {', '.join(choices)}")
    for name in POSITIVE_OR_NULL:
        need(getattr(cfg, name) is None or getattr(cfg, name) > 0, name, "must be > 0 or null")
    for name in ("temperature", "lora_alpha", "std_floor", "kl_clamp", "kl_target"):
        need(getattr(cfg, name) > 0, name, "must be > 0")
    need(cfg.lr > 0 and math.isfinite(cfg.lr), "lr", "must be > 0")
    need(cfg.max_minutes is None or (cfg.max_minutes > 0 and math.isfinite(cfg.max_minutes)), "max_minutes",
         "must be > 0 or null")
    need(cfg.step_timeout_minutes > 0 and math.isfinite(cfg.step_timeout_minutes), "step_timeout_minutes",
         "must be > 0")
    need(0 < cfg.top_p <= 1, "top_p", "must be in (0, 1]")
    need(cfg.env_terminal_share is None or 0 <= cfg.env_terminal_share <= 1, "env_terminal_share",
         "must be in [0, 1] or null")
    need(cfg.check_share is None or 0 <= cfg.check_share <= 1, "check_share", "must be in [0, 1] or null")
    need(cfg.mix_puzzle_ratio == 0 or bool(cfg.puzzle_data), "mix_puzzle_ratio",
         "needs puzzle_data (the puzzles to draw from)")
    need(cfg.lora_r >= 0, "lora_r", "must be >= 0 (0 = off)")
    need(any(t.strip() for t in cfg.lora_targets.split(",")), "lora_targets", "must name at least one module")
    need(cfg.lora_r == 0 or cfg.ref_refresh_every == 0, "ref_refresh_every",
         "must be 0 with LoRA (the reference is the base model with the adapters disabled)")
    need(cfg.lora_r == 0 or cfg.ref_device is None, "ref_device",
         "must be null with LoRA (the reference is the policy's own base model, on device)")
    need(0 < cfg.clip_range < 1, "clip_range", "must be in (0, 1)")
    need(cfg.clip_low is None or 0 < cfg.clip_low < 1, "clip_low", "must be in (0, 1)")
    need(cfg.clip_high is None or cfg.clip_high > 0, "clip_high", "must be > 0")
    need(cfg.clip_delta is None or cfg.clip_delta > 1 + cfg.eps_high, "clip_delta",
         f"must be > 1 + ε_high ({1 + cfg.eps_high}) or null")
    need(cfg.tis_cap is None or cfg.tis_cap >= 1, "tis_cap", "must be >= 1 or null")
    need(not cfg.reward_norm or cfg.scale_rewards == "none", "reward_norm",
         "needs scale_rewards none: under group or batch scaling the EMA's mean and std cancel out")
    need(cfg.quality_advantage >= 0 and math.isfinite(cfg.quality_advantage), "quality_advantage",
         "must be finite and >= 0")
    need(0 <= cfg.reward_norm_momentum < 1, "reward_norm_momentum", "must be in [0, 1)")
    need(cfg.anchor_coef >= 0 and math.isfinite(cfg.anchor_coef), "anchor_coef", "must be finite and >= 0")
    need(cfg.reward_signal or cfg.anchor_coef > 0, "reward_signal",
         "false needs anchor_coef > 0: with every advantage 0 and no anchor nothing trains (the KL holds the policy)")
    need(cfg.anchor_batch >= len(cfg.anchor_tasks) and cfg.anchor_batch % len(cfg.anchor_tasks) == 0,
         "anchor_batch", f"must be a positive multiple of the number of anchor_tasks ({len(cfg.anchor_tasks)})")
    need(cfg.kl_estimator != "k1" or (cfg.kl_coef == 0 and cfg.kl_coef_min == 0), "kl_estimator",
         "k1 has a zero expected gradient: as a penalty (kl_coef > 0) it pulls toward nothing; use k3 (the "
         "gradient of KL(ref || policy), DeepSeekMath/TRL) or k2 (of KL(policy || ref))")
    need(0 <= cfg.kl_coef_min <= cfg.kl_coef_max, "kl_coef_min", "must be in [0, kl_coef_max]")
    need(cfg.ref_mix_alpha == 0 or cfg.ref_refresh_every > 0, "ref_mix_alpha", "needs ref_refresh_every > 0")
    need(0 < cfg.rollback_lr_factor <= 1, "rollback_lr_factor", "must be in (0, 1]")
    need(cfg.rollback_kl_factor >= 1 and math.isfinite(cfg.rollback_kl_factor), "rollback_kl_factor", "must be >= 1")
    need(cfg.guard_entropy_factor is None or cfg.guard_entropy_factor > 1, "guard_entropy_factor",
         "must be > 1 or null")
    need(not (cfg.backward_dtype == "float32" and cfg.autocast == "bf16"), "backward_dtype",
         "float32 contradicts autocast bf16 (its backward products are bf16)")
    need(not (cfg.backward_dtype == "bf16" and cfg.lora_r), "backward_dtype",
         "bf16 needs a plain GPT-2 policy: not with lora_r (use auto or float32)")
    need(not (cfg.record_rollout == "always" and cfg.decode_graph), "record_rollout",
         "always records the sampler's projections, which the decode_graph step does not: not both")
    need(not (cfg.record_rollout == "always" and (cfg.lora_r or cfg.autocast == "bf16")),
         "record_rollout", "always needs a plain GPT-2 policy: not with lora_r or autocast bf16 (use auto)")
    need(cfg.threads is None or cfg.threads >= 1, "threads", "must be >= 1")
    cfg.reward_config().validate()
    sampling_overrides("task_sampling", cfg.task_sampling)  # (raises on a bad one; load_config stored them typed)
    sampling_overrides("phases", cfg.phases)
    starts = [p["start"] for p in cfg.phases]
    need(all(s >= 0 for s in starts) and all(a < b for a, b in zip(starts, starts[1:])), "phases",
         "must start at steps >= 0, in order, no two at one step (there the later would leave the earlier nothing "
         "to do)")
    from rookworld_rlvr.grpo.control import CurriculumSchedule

    try:
        CurriculumSchedule(cfg.curriculum).check({"P": cfg.policy_weights, "A": cfg.env_weights})
    except ValueError as e:
        raise ValueError(f"config field 'curriculum': {e}") from None


def close_fields(name: str) -> list[str]:
    """The fields a mistyped `name` may mean: the closest spellings, then those of its first word (kl_, eval_)."""
    first = name.split("_")[0]
    return list(dict.fromkeys(difflib.get_close_matches(name, FIELDS, n=3)
                              + [f for f in FIELDS if f.split("_")[0] == first]))[:5]


def unknown_field(name: str) -> str:
    """The error for a name that is not a field: why it was removed, or the fields it may mean."""
    if name in REMOVED:
        return f"config field '{name}' was {REMOVED[name]}"
    close = close_fields(name)
    hint = f"; did you mean {'one of ' * (len(close) > 1)}{', '.join(map(repr, close))}?" if close else ""
    return f"unknown config field '{name}'{hint}"


def where_set(error: str, path: str | None, from_file: set[str]) -> str:
    """`error` led by `path:line` when the field it names was set in the YAML file at `path` (and not
    overridden on the command line), so that a bad value in a preset is found where it was written."""
    m = re.match(r"(?:(?:unknown )?config field '|reward\.)(\w+)", error)
    if not path or not m or m.group(1) not in from_file:
        return error
    node = yaml.compose(Path(path).read_text())
    field = next(((k, v) for k, v in node.value if k.value == m.group(1)), None)
    if field is None:
        return f"{path}: {error}"
    keys = list(_keys(field[1]))  # the first key inside the field's value that the error names, else the field's
    key = next((k for name in re.findall(r"'(\w+)'", error) for k in keys if k.value == name), field[0])
    return f"{path}:{key.start_mark.line + 1}: {error}"


def _keys(node) -> Iterator[yaml.Node]:
    """Every mapping key under a YAML node, in document order."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            yield k
            yield from _keys(v)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            yield from _keys(v)


def inert_settings(cfg: TrainConfig, names: Iterable[str] | None = None, processes: int | None = 1) -> list[str]:
    """Settings among `names` (default: every field away from its default) that cannot take effect
    under the rest of this configuration in `processes` processes (torchrun's ranks; None: not known,
    as in a dry run), each with the reason. The trainer logs them as warnings."""
    defaults = TrainConfig()
    names = set(names) if names is not None else {f for f in FIELDS if getattr(cfg, f) != getattr(defaults, f)}
    tasks = cfg.sampled_tasks()
    rules: list[tuple[tuple[str, ...], bool, str]] = [
        (("clip_range", "clip_low", "clip_high", "clip_delta", "importance_sampling_level"),
         cfg.updates_per_batch == 1, "with updates_per_batch 1 the ratio to the sampling policy is exactly 1: "
                                      "no clip binds and the sequence-level ratio gives the token-level gradient"),
        (("kl_target", "kl_horizon", "kl_coef_min", "kl_coef_max"), cfg.kl_mode == "fixed",
         "adaptive-KL settings with kl_mode fixed"),
        (("kl_warmup_factor",), cfg.kl_warmup_steps == 0, "kl_warmup_steps is 0"),
        (("kl_mode", "kl_warmup_steps", "ref_refresh_every", "ref_mix_alpha", "rollback_kl_factor"),
         cfg.kl_coef == 0, "kl_coef 0: no KL penalty"),
        (("kl_estimator", "kl_clamp", "ref_device"), not cfg.uses_reference,
         "no reference pass (kl_coef 0 and no KL guard)"),
        (("guard_eval_drop",), not cfg.eval_data, "eval_data is empty (no evaluation)"),
        (("anchor_tasks", "anchor_batch", "anchor_order", "anchor_data", "anchor_positions"), cfg.anchor_coef == 0,
         "anchor_coef is 0"),
        (("quality_advantage", "scale_rewards", "std_floor", "std_floor_mode", "reward_norm", "reward_norm_momentum"),
         not cfg.reward_signal, "reward_signal false: every advantage is 0"),
        (("anchor_order", "anchor_positions"), "P" not in cfg.anchor_tasks, "the anchor has no P: answers (anchor_tasks)"),
        (("lora_alpha", "lora_targets"), cfg.lora_r == 0, "lora_r is 0 (full fine-tuning)"),
        (("reward_norm_momentum",), not cfg.reward_norm, "reward_norm is off"),
        (("std_floor", "std_floor_mode"), cfg.scale_rewards == "none", "scale_rewards none divides by nothing"),
        (("dynamic_sampling_oversample",), cfg.dynamic_sampling == 0, "dynamic_sampling is 0"),
        (("quality_advantage",), "P" not in tasks or cfg.mix_puzzle_ratio == 1,
         "no P: positions are sampled (their quality is what the term compares)"),
        (("env_terminal_share",), "A" not in tasks, "no A: prompts are sampled (mix_env_ratio 0 in every phase)"),
        (("check_share",), "P" not in tasks or cfg.mix_puzzle_ratio == 1,
         "no P: positions are sampled (mix_env_ratio 1 or mix_puzzle_ratio 1)"),
        (("eval_limit", "eval_batch_size", "eval_every", "history_eval_data", "eval_cache"), not cfg.eval_data,
         "eval_data is empty (no evaluation)"),
        (("step_timeout_minutes",), processes == 1,
         "one process: it bounds how long torchrun's ranks wait for each other"),
        (("min_lr_ratio",), cfg.warmup_steps >= cfg.steps,
         "warmup_steps is the run's steps or more: it ends in the warm-up, before the cosine decay"),
        (("minibatch_size",), cfg.minibatch_size >= cfg.batch_positions * cfg.group_size,
         f"the batch's {cfg.batch_positions * cfg.group_size} completions fit one minibatch, as with 0"),
    ]
    out = [f"{name}: {reason}" for fields, cond, reason in rules if cond for name in fields if name in names]
    for task, over in cfg.task_sampling.items():
        if task not in tasks and "task_sampling" in names:
            out.append(f"task_sampling: {task}: {sorted(over)} has no effect: no {task}: prompts are sampled")
    for key in ("temperature", "top_p", "top_k"):
        if key in names and tasks and all(key in cfg.task_sampling.get(t, {}) for t in tasks):
            out.append(f"{key}: every sampled task sets its own {key} in task_sampling")
    last = f"after the run's last step ({cfg.steps - 1}): it never applies"
    if "phases" in names:
        out += [f"phases: entry {i} starts at step {p['start']}, {last}" for i, p in enumerate(cfg.phases)
                if p["start"] >= cfg.steps]
    if "curriculum" in names:
        out += [f"curriculum: {task}'s entry of step {entry[0]} is {last}" for task, entries in cfg.curriculum.items()
                for entry in entries if entry[0] >= cfg.steps]
    if "ref_refresh_every" in names and cfg.ref_refresh_every >= cfg.steps and cfg.uses_reference:
        out.append(f"ref_refresh_every: {cfg.ref_refresh_every}, and the run has {cfg.steps} steps: its first refresh "
                   "would come after the last one")
    return out
