"""`rookworld train --dry-run`: check everything that can be checked without a model or an engine.

Owns the dry run's checks and the printed plan, `device_problems` (the run's devices this machine lacks) and
`package_problems` (its logging sinks' missing packages): a warning here, an error at the start of a run.
Imports nothing of the trainer; the model package only for its checks of a model's location and of a device
(those import torch).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.data.io import ReadReport, read_samples
from rookworld_rlvr.paths import here, no_such_file


def _count(path: str, skip_invalid: bool) -> tuple[Counter, ReadReport]:
    """Samples per task and the malformed lines of a data file, read as a run reads it (`read_samples`: on
    forked workers, so a GPU machine's million rows take seconds, not a minute on one core)."""
    report = ReadReport()
    counts = Counter(s.task for s in read_samples(path, skip_invalid=True, report=report))
    if report.invalid and not skip_invalid:
        raise ValueError(f"{path}: {report.invalid} malformed lines (first: {report.errors[0]}); "
                         "fix them or set skip_invalid: true")
    return counts, report


def plan(cfg: TrainConfig) -> list[str]:
    """The phase schedule and step plan as printable lines."""
    lines = []
    boundaries = sorted({0} | {p["start"] for p in cfg.phases if p["start"] < cfg.steps})
    for i, start in enumerate(boundaries):
        end = boundaries[i + 1] if i + 1 < len(boundaries) else cfg.steps
        for task, n in cfg.task_counts(start).items():
            s = cfg.sampling_for(task, start)
            parts = [f"{cfg.mix_puzzle_ratio:.0%} puzzles"] if task == "P" and cfg.mix_puzzle_ratio else []
            if task == "P" and cfg.check_share is not None:
                parts.append(f"{cfg.check_share:.0%} of the {'rest' if parts else 'positions'} in check")
            of = f" ({', '.join(parts)})" if parts else ""
            lines.append(f"steps {start:>4}-{end - 1:<4} {task}: {n} prompts{of} x {cfg.group_size} completions, "
                         f"T={s['temperature']} top_p={s['top_p']} top_k={s['top_k']} max_new_tokens={s['max_new_tokens']}")
    per_step = cfg.batch_positions * cfg.group_size
    lines.append(f"{cfg.steps} steps x {per_step} completions = {cfg.steps * per_step} completions; "
                 f"{cfg.updates_per_batch} update(s) per batch; beta {cfg.kl_coef} ({cfg.kl_mode}, estimator {cfg.kl_estimator}"
                 f"{', warm-up ' + str(cfg.kl_warmup_steps) + ' steps x' + str(cfg.kl_warmup_factor) if cfg.kl_warmup_steps else ''})")
    evals = [s for s in range(1, cfg.steps + 1) if cfg.eval_every and s % cfg.eval_every == 0]
    lines.append(f"evaluations: before step 1, {'at steps ' + str(evals) + ', ' if evals else ''}and at the end")
    lines.append(f"checkpoints every {cfg.save_every} steps into {cfg.output_dir}/checkpoints (keep last {cfg.keep_last} + best)")
    return lines


def device_problems(cfg: TrainConfig) -> list[str]:
    """The run's devices (`device`, `ref_device`) this machine lacks, one line each (imports torch)."""
    from rookworld_rlvr.model.load import resolve_device

    problems = []
    for name in ("device", "ref_device"):
        if value := getattr(cfg, name):
            try:
                resolve_device(value)
            except ValueError as e:
                problems.append(f"config field '{name}': {e}")
    return problems


def package_problems(cfg: TrainConfig) -> list[str]:
    """The run's outputs (`tensorboard`, `wandb`, `report`) whose package this machine lacks, one line each: found
    before the models load, not when the first step's record or the report at the end is written."""
    from importlib.util import find_spec

    return [f"config field '{name}': true needs the {package} package (pip install {package}), or set {name}: false"
            for name, package in (("tensorboard", "tensorboard"), ("wandb", "wandb"), ("report", "matplotlib"))
            if getattr(cfg, name) and find_spec(package) is None]


def dry_run(cfg: TrainConfig, out=print) -> int:
    """Validate config, data and model location; print counts and the plan. Returns an exit code."""
    problems = []
    stops_here: list[str] = []  # warnings that this machine cannot start the run (it may be meant for another)
    out("config: valid")
    for note in cfg.inert_settings(processes=None):  # one process here; the run may have more
        out(f"warning: setting without effect: {note}")
    for name, path in (("data", cfg.data), ("anchor_data", cfg.anchor_data), ("eval_data", cfg.eval_data),
                       ("history_eval_data", cfg.history_eval_data)):
        if not path:
            continue
        if not Path(path).exists():
            problems.append(f"{name}: {no_such_file(path)}")
            continue
        try:
            counts, report = _count(path, cfg.skip_invalid)
        except ValueError as e:
            problems.append(str(e))
            continue
        out(f"{name}: {path}: P={counts['P']} A={counts['A']} malformed={report.invalid}")
        if name == "data":
            if cfg.mix_env_ratio < 1 and not counts["P"]:
                problems.append(f"data: {path} has no P: samples but mix_env_ratio < 1")
            if cfg.mix_env_ratio > 0 and not counts["A"]:
                problems.append(f"data: {path} has no A: samples but mix_env_ratio > 0")
        if cfg.anchor_coef and name == ("anchor_data" if cfg.anchor_data else "data"):
            problems += [f"{name}: {path} has no {t}: samples but anchor_tasks is {cfg.anchor_tasks}"
                         for t in cfg.anchor_tasks if not counts[t]]
    for name, path in (("puzzle_data", cfg.puzzle_data), ("strength_data", cfg.strength_data),
                       ("puzzle_eval_data", cfg.puzzle_eval_data)):
        if not path:
            continue
        from rookworld_rlvr.data.judged import read_judged, read_puzzles

        try:
            rows = read_judged(path) if name == "strength_data" else read_puzzles(path)
        except ValueError as e:
            problems.append(f"{name}: {e}")
            continue
        kinds = "" if name == "strength_data" else " (" + ", ".join(
            f"{k} {sum(p.kind == k for p in rows)}" for k in sorted({p.kind for p in rows})) + ")"
        out(f"{name}: {path}: {len(rows)} {'positions' if name == 'strength_data' else 'puzzles'}{kinds}")
    from rookworld_rlvr import hub
    from rookworld_rlvr.model.load import local_model_problem

    model = Path(cfg.model)
    if problem := local_model_problem(cfg.model):
        problems.append(f"model: {problem}")
    elif (model / "adapter_config.json").is_file() and not (model / "config.json").is_file():
        out(f"model: {cfg.model} (a PEFT adapter: its base model loads with it)")
    elif model.is_dir():
        cfg_json = json.loads((model / "config.json").read_text())
        out(f"model: {cfg.model} ({cfg_json.get('model_type', '?')}, {cfg_json.get('n_layer', '?')} layers x "
            f"{cfg_json.get('n_embd', '?')}, context {cfg_json.get('n_positions', '?')})")
        if cfg.lora_r:
            from rookworld_rlvr.grpo.lora import target_problem

            if problem := target_problem(cfg.model, cfg):
                problems.append(problem)
    elif why := hub.not_asked():
        if hub.cached(cfg.model):
            out(f"model: {cfg.model} (Hugging Face Hub id, from the local cache {hub.cache_dir()}: {why})")
        else:  # a warning only, as a device this machine lacks: the run may be meant for one with network
            out(f"model: {cfg.model} (Hugging Face Hub id)")
            stops_here.append("model")
            out(f"warning: {why} and the local cache ({hub.cache_dir()}) does not hold {cfg.model}, nor is it a "
                f"directory{here(cfg.model)}; the run stops at once here")
    else:
        out(f"model: {cfg.model} (Hugging Face Hub id; downloaded at load time)")
    for problem in device_problems(cfg):  # a warning only: a run prepared here may run on another machine
        stops_here.append("device")
        out(f"warning: {problem} on this machine; the run stops at once here")
    for problem in package_problems(cfg):  # the same: another machine may have the package
        stops_here.append("package")
        out(f"warning: {problem}; the run stops at once here")
    for line in plan(cfg):
        out(line)
    if problems:
        for p in problems:
            out(f"error: {p}")
        return 1
    if stops_here:  # the config is sound, but a user reading only the last line must not start it here
        out(f"dry run: ok for a machine that has what the {len(stops_here)} warning(s) above name; here the run "
            "stops at once")
    else:
        out("dry run: ok")
    return 0
