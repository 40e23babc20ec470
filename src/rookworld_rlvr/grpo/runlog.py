"""The run directory's logs: metrics.jsonl (one record per step), eval.jsonl, events.jsonl, and
what a fresh run or a rollback does to them, and the banner that opens a run's log.

Owns the step record (what a step logs: loss metrics, rewards per task and component,
advantages, lengths, timings; reduced over ranks, so every rank holds the same) and the files.
Imports torch (the batch's tensors); nothing of the model package or chess.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from rookworld_rlvr import __version__
from rookworld_rlvr.atomic import write_text
from rookworld_rlvr.data.io import atomic_write_text, read_log
from rookworld_rlvr.grpo import distributed as dist
from rookworld_rlvr.grpo.loss import zero_variance_groups
from rookworld_rlvr.grpo.quality_term import legal_position_move
from rookworld_rlvr.grpo.rollout import Batch

if TYPE_CHECKING:
    from rookworld_rlvr.grpo.trainer import Trainer


def git_commit() -> str:
    """The short commit of the code that runs (for the banner), or "unknown"."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def banner(tr: Trainer) -> str:
    """The run's first lines: version, model, precision and sampling choices, every config field."""
    cfg = tr.cfg
    lora = f"; LoRA r={cfg.lora_r} ({tr.n_trainable / 1e6:.3f}M trainable)" if cfg.lora_r else ""
    lines = [f"rookworld-rlvr {__version__} (git {git_commit()}) GRPO",
             f"policy {cfg.model}: {tr.n_params / 1e6:.2f}M parameters on {tr.device}{lora}"
             f"{', bf16 autocast' if tr.amp else ''}; reference {'off (beta 0, no KL guard)' if not tr.use_ref else 'on ' + str(tr.ref_device)}"
             f"{' (beta 0: for the KL guard only)' if tr.use_ref and cfg.kl_coef == 0 else ''}"
             f"{' (the base with adapters disabled)' if cfg.lora_r and tr.use_ref else ''}",
             f"policy pass: forward {'bf16 autocast' if tr.amp else 'float32'}, backward products {tr.grad_note}; "
             f"forward projections {tr.record_note}; decoding {tr.graph_note}; scoring {tr.overlap_note}",
             "config:"]
    lines += [f"  {k}: {json.dumps(v)}" for k, v in cfg.to_dict().items()]
    return "\n".join(lines)


@contextmanager
def timed(timings: dict[str, float], phase: str, device: torch.device | None = None) -> Iterator[None]:
    """Add the block's wall time to timings[phase]. On a GPU the device is synchronised at both
    ends, so the phase's kernels count in its own time, not in the next phase's. Under torch.profiler
    the block is a range named phase/<phase> (benchmarks/gpu_check.py --profile)."""
    sync = device is not None and device.type == "cuda"
    if sync:
        torch.cuda.synchronize(device)
    t0 = time.time()
    try:
        with torch.profiler.record_function(f"phase/{phase}"):
            yield
    finally:
        if sync:
            torch.cuda.synchronize(device)
        timings[phase] = timings.get(phase, 0.0) + time.time() - t0


def append_jsonl(path: Path, record: dict) -> None:
    write_text(path, json.dumps(record, default=float) + "\n")


def set_aside(run_dir: Path, log: Callable[[str], None]) -> None:
    """Rename a previous run in `run_dir` to `<run_dir>-<time>`: a fresh run never mixes with an old
    one, and nothing is deleted."""
    if not ((run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()):
        return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime((run_dir / "config.yaml").stat().st_mtime
                                                          if (run_dir / "config.yaml").exists() else time.time()))
    aside = run_dir.with_name(f"{run_dir.name}-{stamp}")
    run_dir.rename(aside)
    log(f"moved the previous run in {run_dir} to {aside} (use resume: true to continue it)")


def truncate_logs(run_dir: Path, step: int, events: int | None = None, evaluated: bool = True) -> None:
    """Drop log records of steps after `step` (a restored checkpoint): they will be redone; so will the
    evaluation at `step` unless `evaluated` (a checkpoint saved before it). A resume also gives `events`,
    how many guard events its checkpoint had seen: the later ones are dropped, since the resumed run
    redoes their steps and logs them again (a rollback keeps every event)."""
    def rewrite(name: str, keep: Callable[[list[dict]], list[dict]]) -> None:
        path = run_dir / name
        if path.exists():
            rows = keep(read_log(path, warn=lambda m: print(m, file=sys.stderr)))
            atomic_write_text(path, [json.dumps(r, default=float) + "\n" for r in rows])

    rewrite("metrics.jsonl", lambda rows: [r for r in rows if r.get("step", 0) <= step])
    rewrite("eval.jsonl", lambda rows: [r for r in rows if r.get("step", 0) < step + evaluated])
    if events is not None:
        rewrite("events.jsonl", lambda rows: rows[:events])


def logged_events(run_dir: Path) -> int:
    """The guard events in the run's events.jsonl (a torn last line not counted)."""
    path = run_dir / "events.jsonl"
    return len(read_log(path, warn=lambda m: None)) if path.exists() else 0


def best_summary(best: tuple[float, int] | None, final_score: float | None, step: int) -> dict | None:
    """Which of `best/` (the best held-out evaluation, base included) and `final/` is better, and by
    how much held-out reward: what summary.json says of the two directories."""
    if best is None:
        return None
    score, best_step = best
    out = {"step": best_step, "held_out_reward": score, "final_step": step, "final_held_out_reward": final_score}
    if final_score is not None:
        out["final_minus_best"] = final_score - score
        out["better"] = "same" if best_step == step or final_score == score else (
            "final" if final_score > score else "best")
    return out


def _by_source(rows: list) -> dict[str, list]:
    """Rows by what scored them: P: positions, puzzles (their components are format and solved,
    `RewardScorer._score_puzzle`) and A:."""
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault("puzzle" if r.task == "P" and "solved" in r.components else r.task, []).append(r)
    return out


def prompt_noise(rewards: list[float], group_size: int) -> float:
    """The standard error of a batch's mean reward from the prompts drawn: the spread of the
    groups' mean rewards over the square root of their number (rows come group by group). A
    batch of hard prompts can sit this far below the usual reward without anything having
    changed in the policy; the collapse guard widens its reward bound by it."""
    means = [sum(rewards[i:i + group_size]) / group_size for i in range(0, len(rewards) - group_size + 1, group_size)]
    if len(means) < 2:
        return 0.0
    centre = sum(means) / len(means)
    return math.sqrt(sum((m - centre) ** 2 for m in means) / (len(means) - 1) / len(means))


def step_record(step: int, batch: Batch, m: dict, timings: dict, seconds: float, group_size: int, use_ref: bool,
                drawn: dict[str, float]) -> dict[str, Any]:
    """The metrics.jsonl record of step `step` (0-based) from its batch, the update's metrics `m`,
    the phase timings and what the sampler drew (`drawn`: rollout.collect's stats)."""
    rows = batch.rows
    rec: dict[str, Any] = {"step": step + 1}
    rec.update({k: v for k, v in m.items() if isinstance(v, (int, float))})
    if not use_ref:  # beta 0 and no threshold: no reference pass, so KL is not measured (not 0)
        for k in ("kl_mean", "kl_max", "kl_min", "kl_loss"):
            rec.pop(k, None)
    rec["reward/mean"] = float(batch.rewards.mean())
    rec["zero_var_share"] = float(zero_variance_groups(batch.rewards, group_size).float().mean())
    rec.update(drawn)  # what the sampler drew: all of it, and dynamic sampling's cost
    rec["adv/mean"], rec["adv/std"] = float(batch.advantages.mean()), float(batch.advantages.std())
    rec["adv/min"], rec["adv/max"] = float(batch.advantages.min()), float(batch.advantages.max())
    lengths = [len(r.completion_ids) for r in rows]  # what was sampled (truncated_completions mask hides some)
    rec["completion_len/mean"], rec["completion_len/max"] = sum(lengths) / len(lengths), float(max(lengths))
    rec["truncation_rate"] = sum(r.finish == "length" for r in rows) / len(rows)
    for task in ("P", "A"):  # P: counts its puzzle rows too (what the guards watch)
        tr = [r for r in rows if r.task == task]
        if tr:
            rec[f"reward/{task}"] = sum(r.reward for r in tr) / len(tr)
            rec[f"valid/{task}"] = sum(r.valid for r in tr) / len(tr)
            rec[f"reward_se/{task}"] = prompt_noise([r.reward for r in tr], group_size)
    for source, tr in _by_source(rows).items():  # components per source, never diluted by the other's rows
        if source == "puzzle":
            rec["reward/puzzle"] = sum(r.reward for r in tr) / len(tr)
        for comp in dict.fromkeys(k for r in tr for k in r.components):
            rec[f"reward/{source}/{comp}"] = sum(r.components.get(comp, 0.0) for r in tr) / len(tr)
    legal = [r for r in rows if legal_position_move(r.components)]
    if legal:  # move quality apart from legality (reward/P/quality counts an illegal move as 0)
        rec["reward/P/quality_legal"] = sum(r.components["quality"] for r in legal) / len(legal)
    rec["beta"] = m.get("beta", 0.0)
    rec["kl_share"] = m.get("kl_share", 0.0)
    rec["reward_mean"] = rec["reward/mean"]
    rec["truncation"] = rec["truncation_rate"]
    for k, v in timings.items():
        rec[f"time/{k}"] = round(v, 4)
    rec["time/step"] = round(seconds, 3)
    rec["time/other"] = round(seconds - sum(timings.values()), 4)
    return dist.reduce_metrics(rec)  # one record for the whole global batch, the same on every rank
