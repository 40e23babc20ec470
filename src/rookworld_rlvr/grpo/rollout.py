"""Rollouts: B prompts x G completions each, scored, and the batch an update trains on.

    prompts (PromptSampler) -> generate (G per prompt) -> reward_fn -> groups of Rows
    groups -> padded batch (model.padding) + group advantages (loss.group_advantages) -> Batch

Under torchrun every rank draws the same global prompts (so the prompt sampler, and its resume
state, is the same everywhere) and rolls out only its contiguous share of each task.

Owns sampling the groups (with DAPO dynamic sampling) and building the batch. Imports torch and
the model's `generate`; the rewards come in as a function (`reward_fn`), so nothing of chess.
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.grpo import distributed as dist
from rookworld_rlvr.grpo.control import RewardNormalizer
from rookworld_rlvr.grpo.loss import group_advantages
from rookworld_rlvr.grpo.prompts import PromptSampler
from rookworld_rlvr.grpo.quality_term import legal_position_move, legal_quality_advantages
from rookworld_rlvr.model import generate, gpt2_decode
from rookworld_rlvr.model.generate import positions_from_mask
from rookworld_rlvr.model.padding import pad, pad_pairs

RewardFn = Callable[[list[str], list[str], list[Any], dict], list[Any]]
# A reward function may also have `prefetch(completions, truths)`: the engine work its scoring will
# need, started for the rows that finish while the batch decodes (`tasks.rewards.RewardScorer`).


def decode_graph(on: bool, model, device: torch.device) -> tuple[bool, str]:
    """Whether rollouts decode with the shape-stable step (config `decode_graph`), and how."""
    if not on:
        return False, "eager steps, finished groups leave the batch"
    if not gpt2_decode.supports(model, any_mode=True):
        raise ValueError(f"config field 'decode_graph' needs a plain GPT-2 policy, not {type(model).__name__}")
    return True, ("shape-stable, one CUDA graph per rollout" if device.type == "cuda"
                  else f"shape-stable (run eagerly: CUDA graphs need CUDA, not {device.type})")


def score_overlap(setting: str, reward_fn: RewardFn, device: torch.device) -> tuple[bool, str]:
    """Whether scoring starts on finished rows during generation (config `score_overlap`), and why."""
    if setting == "never":
        return False, "after generation (score_overlap: never)"
    if not callable(getattr(reward_fn, "prefetch", None)):
        if setting == "always":
            raise ValueError("config field 'score_overlap': always needs a reward function with a prefetch method "
                             "(the Stockfish scorer of `rookworld train` has one)")
        return False, "after generation (the reward function has no prefetch)"
    if setting == "auto" and device.type == "cpu":
        return False, "after generation (score_overlap auto: on a CPU the engine would take the decode's cores)"
    return True, "as rows finish, during generation"


@dataclass
class Row:
    """One completion with everything the update needs."""

    task: str
    prompt: str
    truth: Any
    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logp: list[float]
    text: str
    finish: str
    reward: float = 0.0
    components: dict = field(default_factory=dict)
    valid: bool = False
    recorded: tuple | None = None  # the sampler's projections for this row (Generation.recorded_row)


@dataclass
class Batch:
    rows: list[Row]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_mask: torch.Tensor  # [N, C]
    sampler_logp: torch.Tensor  # [N, C]
    rewards: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N]
    n_completion: int


def shard_counts(cfg: TrainConfig, step: int) -> dict[str, int]:
    """Global prompts per task at `step` (`TrainConfig.task_counts`). Each rank takes 1/world of
    every task, so ranks hold equal rows per task (equal-size collectives, exact means of means)."""
    counts, w = cfg.task_counts(step), dist.world()
    if any(n % w for n in counts.values()):
        raise ValueError(f"batch_positions {cfg.batch_positions} at step {step} gives {counts['P']} P: and "
                         f"{counts['A']} A: prompts; with {w} processes both must divide by {w} (prompts are "
                         "sharded per task): change batch_positions or mix_env_ratio")
    return counts


def check_shardable(cfg: TrainConfig) -> None:
    """Fail at start, not at a later phase, when the batch cannot be split over the processes."""
    if cfg.batch_positions % dist.world():
        raise ValueError(f"config field 'batch_positions' ({cfg.batch_positions}) is the global number of "
                         f"prompts per step and must divide by the number of processes ({dist.world()})")
    for step in [0] + [ph["start"] for ph in cfg.phases]:
        shard_counts(cfg, step)
    if cfg.anchor_coef and cfg.anchor_per_task % dist.world():
        raise ValueError(f"config field 'anchor_batch' ({cfg.anchor_batch}) gives {cfg.anchor_per_task} samples per "
                         f"anchor task, which must divide by the number of processes ({dist.world()})")


def _flat(group: list[Row]) -> bool:
    return max(r.reward for r in group) - min(r.reward for r in group) < 1e-8


@dataclass
class Rollout:
    """One step's sampling: the model that samples and how, and the reward that scores."""

    model: Any
    tokenizer: Any
    reward_fn: RewardFn
    cfg: TrainConfig
    step: int
    generator: torch.Generator
    amp: torch.dtype | None
    record: bool  # keep the sampler's projections for the first update (grpo.precision.record_rollout)
    weights: dict[str, dict[str, float]]  # reward component weights per task at this step
    timings: dict[str, float]
    overlap: bool = False  # start scoring's engine work on rows that finish while others decode
    graph: bool = False  # the shape-stable decode step, a CUDA graph on CUDA (config decode_graph)

    def groups(self, by_task: dict[str, list]) -> list[list[Row]]:
        """G completions for each sample, scored; groups in task order (P: first).

        Tasks whose top-k and top-p agree share one decode loop, each prompt with its own task's
        temperature and token limit: one decode step of 64 rows costs much less than two of 32."""
        items = [(task, x) for task in ("P", "A") for x in by_task.get(task, [])]
        if not items:
            return []
        settings = {task: self.cfg.sampling_for(task, self.step) for task, _ in items}
        if len({(s["top_k"], s["top_p"]) for s in settings.values()}) == 1:
            calls = [items]
        else:
            calls = [[it for it in items if it[0] == task] for task in settings]
        rows: list[Row] = []
        for call in calls:
            rows += self._generate_and_score(call, settings)
        G = self.cfg.group_size
        return [rows[j: j + G] for j in range(0, len(rows), G)]

    def _generate_and_score(self, items: list, settings: dict) -> list[Row]:
        cfg, G = self.cfg, self.cfg.group_size
        prompts = [x.render(cfg.layout)[0] for _, x in items]
        first = settings[items[0][0]]
        truths = [items[i // G][1].truth for i in range(len(items) * G)]
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="score-overlap") as early:
            started: list[concurrent.futures.Future] = []

            def on_finished(rows: list[int], texts: list[str]) -> None:
                started.append(early.submit(self.reward_fn.prefetch, texts, [truths[i] for i in rows]))

            t0 = time.time()
            with torch.profiler.record_function("phase/generate"):  # (a range only under torch.profiler)
                g = generate(self.model, self.tokenizer, prompts,
                             max_new_tokens=[settings[t]["max_new_tokens"] for t, _ in items],
                             temperature=[settings[t]["temperature"] for t, _ in items], top_k=first["top_k"],
                             top_p=first["top_p"], num_return_sequences=G, generator=self.generator,
                             autocast_dtype=self.amp, record=self.record,
                             on_finished=on_finished if self.overlap else None, decode_graph=self.graph)
            self.timings["generate"] = self.timings.get("generate", 0.0) + time.time() - t0
            t0 = time.time()
            for future in started:
                future.result()  # an engine failure surfaces here, as it would in scoring
        n = len(g.texts)
        row_prompts = [prompts[i // G] for i in range(n)]
        results = self.reward_fn(row_prompts, g.texts, truths, self.weights)
        if len(results) != n:  # a result a completion, in order: others would pair rewards with the wrong rows
            raise ValueError(f"reward_fn returned {len(results)} results for {n} completions: one a completion")
        self.timings["score"] = self.timings.get("score", 0.0) + time.time() - t0
        rows = []
        for i in range(n):
            pm, cm = g.prompt_mask[i].bool(), g.completion_mask[i].bool()
            r = results[i]
            row = Row(items[i // G][0], row_prompts[i], truths[i], g.prompt_ids[i][pm].tolist(),
                      g.completion_ids[i][cm].tolist(), g.logprobs[i][cm].tolist(), g.texts[i],
                      g.finish_reasons[i], float(r.total), dict(r.components), bool(r.valid_format),
                      g.recorded_row(i) if self.record else None)
            if row.finish == "length" and cfg.truncated_completions == "malformed":
                row.reward, row.valid = cfg.malformed_penalty, False  # an answer cut off is not an answer
            rows.append(row)
        return rows


def collect(run: Rollout, prompts: PromptSampler) -> tuple[list[list[Row]], dict[str, float]]:
    """The step's groups (B prompts, mixed by the phase's ratio, x G completions, scored) and what
    the sampler drew to get them (`zero_var_share_sampled`; with dynamic sampling its cost).

    Dynamic sampling (DAPO): up to `dynamic_sampling` rounds replace groups whose rewards are all
    equal (no learning signal) with groups of fresh prompts of the same task: each round draws
    ceil(missing x dynamic_sampling_oversample) prompts (a multiple of the world size), every rank
    rolls out its share and fills its own flat places with its groups that differ, in order;
    groups left over are discarded."""
    cfg = run.cfg
    G, w = cfg.group_size, dist.world()
    counts = shard_counts(cfg, run.step)
    groups = run.groups({task: dist.shard(prompts.take(task, counts[task])) for task in ("P", "A")})
    n, lo = len(groups), dist.rank() * len(groups)  # this rank's groups in the global, rank-major order

    def global_flat(gs: list[list[Row]]) -> list[int]:
        return dist.all_gather_tensor(torch.tensor([_flat(g) for g in gs], dtype=torch.float32)).nonzero().flatten().tolist()

    flat = global_flat(groups)
    sampled, sampled_flat, rounds = n * w, len(flat), 0
    for _ in range(cfg.dynamic_sampling):
        if not flat:
            break
        rounds += 1
        for task in ("P", "A"):
            idx = [i for i in flat if groups[i % n][0].task == task]  # every rank has the same task layout
            if not idx:
                continue
            k = -(-math.ceil(len(idx) * cfg.dynamic_sampling_oversample) // w) * w
            fresh = run.groups({task: dist.shard(prompts.take(task, k))})
            sampled += k
            sampled_flat += len(global_flat(fresh))
            kept = iter(g for g in fresh if not _flat(g))
            for i in idx:
                if lo <= i < lo + n:
                    g = next(kept, None)
                    if g is None:
                        break
                    groups[i - lo] = g
        flat = global_flat(groups)
    stats = {"zero_var_share_sampled": sampled_flat / sampled}
    if cfg.dynamic_sampling:
        extra = (sampled - n * w) * G
        stats.update({"dynamic/rounds": rounds, "dynamic/extra_samples": extra,
                      "dynamic/extra_per_kept": extra / max(n * w - len(flat), 1), "dynamic/unfilled": len(flat)})
    return groups, stats


def assemble(groups: list[list[Row]], cfg: TrainConfig, normalizer: RewardNormalizer, pad_id: int,
             device: torch.device) -> Batch:
    """Left-pad prompts, right-pad completions, compute advantages."""
    rows = [r for g in groups for r in g]
    ids, mask, P = pad_pairs([r.prompt_ids for r in rows], [r.completion_ids for r in rows], pad_id)
    C = ids.shape[1] - P
    slogp, _ = pad([r.sampler_logp for r in rows], 0.0, "right", width=C, dtype=torch.float32)
    rewards = torch.tensor([r.reward for r in rows], dtype=torch.float32)
    # on the global reward vector (ranks hold equal rows, rank-major): group statistics, batch
    # scaling and the normaliser are those of one process; then this rank's slice
    everyone = dist.all_gather_tensor(rewards)
    shaped = normalizer.normalize(everyone) if cfg.reward_norm else everyone
    adv = group_advantages(shaped, cfg.group_size, cfg.scale_rewards, cfg.std_floor, cfg.std_floor_mode).float()
    if cfg.quality_advantage:  # P: positions only: puzzles and A: rows have no quality component
        quality = dist.all_gather_tensor(torch.tensor([r.components.get("quality", 0.0) for r in rows]))
        legal = dist.all_gather_tensor(torch.tensor([float(legal_position_move(r.components)) for r in rows]))
        adv = adv + cfg.quality_advantage * legal_quality_advantages(quality, legal > 0, cfg.group_size)
    if not cfg.reward_signal:  # a control run: the rewards are logged and reach no weight
        adv = torch.zeros_like(adv)
    adv = dist.shard(adv)
    completion = mask[:, P:].float()
    if cfg.truncated_completions == "mask":  # still in their groups' advantages, out of the loss
        completion[[i for i, r in enumerate(rows) if r.finish == "length"]] = 0.0
    return Batch(rows, ids.to(device), mask.to(device), positions_from_mask(mask).to(device), completion.to(device),
                 slogp.to(device), rewards, adv.to(device), C)
