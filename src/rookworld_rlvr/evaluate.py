"""Greedy evaluation of a chess LM: both tasks, playing strength, puzzles and self-play.

Owns the evaluation run: which prompts are answered (each task in its own batches, the P:
answers of judged positions and puzzles), and how its results dict is laid out. What the
numbers mean is `metrics` (pure: completions in, metrics out); generation is
`model.completions`; self-play is `play.selfplay_metrics`; the command line is `eval_cli`.

- strength (judged positions): expected-score loss, accuracy and blunder rate of the legal
  B: moves, and best-move match, each next to a uniformly random legal mover on the same
  positions (`random`; see tasks.strength); puzzles: solve rate per kind, next to random.
- `legal_moves`: every P: answer (tasks, judged positions, puzzles, self-play) is decoded among
  legal moves only: the numbers then measure the model's choice among legal moves, and its
  legality and distinct candidates are 100% by construction (see legal_decoding).
- `histories`: held-out A: transitions with short histories (game starts, games set up from a
  position), scored apart from the main A: set so that its figure stays comparable; the
  `histories` section has the A: metrics and their slices by history length.
- a greedy prompt asked twice (the judged positions are among the shipped eval set's P: samples)
  is completed once and its answer reused (`meta.reused_answers` counts them).
- the P: and A: prompts of a batch share one token budget: `max_new_tokens` is capped to what
  the model's context leaves after the batch's longest prompt (`meta.capped_batches` counts it).

Imports torch and the model package inside functions only, so `rookworld --help` stays fast.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from rookworld_rlvr.data.io import Sample
from rookworld_rlvr.metrics import TASK_NAMES, needs_engine, position_slices, score_completions, share, sliced
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks import strength
from rookworld_rlvr.tasks.rewards import RewardScorer
from rookworld_rlvr.tasks.strength import JudgedPosition, Puzzle

if TYPE_CHECKING:
    from rookworld_rlvr.model.journal import Journal
    from rookworld_rlvr.model.completions import Completer, Spread


@dataclass
class EvalConfig:
    layout: str = "compact"  # P: prompt layout ("compact" or "padded")
    batch_size: int = 64
    max_new_tokens: int = 120  # P: and A: completions; capped to the model context per batch
    limit: int | None = None  # per task
    temperature: float = 0.0  # task completions: 0 = greedy; > 0 samples (how often are samples well-formed?)
    selfplay_games: int = 0
    selfplay_max_plies: int = 200
    selfplay_temperature: float = 0.0  # 0 = greedy
    selfplay_top_k: int = 0  # 0 = off; only used when sampling
    seed: int = 0  # sampling seed (temperature > 0, self-play)
    engine_depth: int = 8  # for the Stockfish pool evaluate builds when it needs one
    legal_moves: bool = False  # P: answers decoded among legal moves only (see legal_decoding)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        checks = [
            ("layout", self.layout in pol_task.LAYOUTS, f"one of {pol_task.LAYOUTS}"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("max_new_tokens", self.max_new_tokens >= 1, ">= 1"),
            ("limit", self.limit is None or self.limit >= 0, ">= 0 or None"),
            ("temperature", self.temperature >= 0, ">= 0 (0 = greedy)"),
            ("selfplay_games", self.selfplay_games >= 0, ">= 0"),
            ("selfplay_games", self.selfplay_games <= 1 or self.selfplay_temperature > 0, "at most 1 at "
             "selfplay_temperature 0 (greedy games from the start are one game played again; a temperature samples)"),
            ("selfplay_max_plies", self.selfplay_max_plies >= 1, ">= 1"),
            ("selfplay_temperature", self.selfplay_temperature >= 0, ">= 0 (0 = greedy)"),
            ("selfplay_top_k", self.selfplay_top_k >= 0, ">= 0"),
            ("engine_depth", self.engine_depth >= 1, ">= 1"),
            ("legal_moves", isinstance(self.legal_moves, bool), "True or False"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"EvalConfig.{name} must be {rule}, got {getattr(self, name)!r}")


def progress_bar(enabled: bool, total: int, desc: str, unit: str = "row"):
    from rookworld_rlvr.progress import bar

    return bar(total=total, desc=desc, unit=unit, enabled=enabled, leave=False)


def limit_per_task(samples: Iterable[Sample], limit: int | None) -> list[Sample]:
    """The first `limit` samples of each task, in input order (reading stops once both have them)."""
    if limit is None:
        return list(samples)
    seen = {"P": 0, "A": 0}
    kept = []
    for s in samples:
        if seen[s.task] < limit:
            seen[s.task] += 1
            kept.append(s)
        if min(seen.values()) >= limit:
            break
    return kept


def _generate_tasks(gen: Completer, samples: Sequence[Sample], config: EvalConfig,
                    progress: bool, label: str = "eval") -> tuple[list[str], list[str]]:
    """Greedy (or sampled, with config.temperature) completions for every sample; each task in its own batches
    (its progress bar named `label` and the task)."""
    from rookworld_rlvr.model.completions import sampling

    completions = [""] * len(samples)
    reasons = [""] * len(samples)
    settings = sampling(config.temperature, config.seed)
    for task in TASK_NAMES:
        idx = [i for i, s in enumerate(samples) if s.task == task]
        if not idx:
            continue
        with progress_bar(progress, len(idx), f"{label} {task}") as bar:
            texts, why = gen.run([samples[i].render(config.layout)[0] for i in idx], bar=bar, **settings)
        for i, t, r in zip(idx, texts, why):
            completions[i], reasons[i] = t, r
    return completions, reasons


def _answers(gen: Completer, fens: Sequence[str], layout: str, progress: bool,
             desc: str) -> list[pol_task.PolicyParse]:
    """Greedy P: answers for positions, parsed."""
    prompts = [pol_task.prompt(fen, layout) for fen in fens]
    with progress_bar(progress, len(prompts), desc) as bar:
        texts, _ = gen.run(prompts, bar=bar)
    return [pol_task.parse_completion(t) for t in texts]


def strength_metrics(gen: Completer, positions: Sequence[JudgedPosition], layout: str, progress: bool) -> dict:
    """Move quality of the greedy B: and the M: candidates on judged positions, each next to a
    random legal mover on the same positions (see tasks.strength)."""
    if not positions:
        return {"n": 0}
    parses = _answers(gen, [p.fen for p in positions], layout, progress, "strength")
    legal = [p.move is not None and p.move in pos.evals for p, pos in zip(parses, positions)]
    return {**strength.move_quality(positions, [p.move for p in parses]),
            "candidates": strength.candidate_quality(positions, [p.moves for p in parses]),
            "slices": sliced(position_slices([p.fen for p in positions]), "legal", legal)}


def puzzle_metrics(gen: Completer, puzzles: Sequence[Puzzle], layout: str, progress: bool) -> dict:
    """Share of puzzles whose greedy B: is a solving move, per kind, next to a random legal mover."""
    if not puzzles:
        return {}
    parses = _answers(gen, [p.fen for p in puzzles], layout, progress, "puzzles")
    return strength.puzzle_scores(puzzles, [p.move for p in parses])


def _scorer_with_engine(scorer: RewardScorer | None, samples: Sequence[Sample], completions: Sequence[str],
                        depth: int, stack: ExitStack) -> RewardScorer:
    """The given scorer, or one with a Stockfish pool (closed by `stack`) when a move's quality needs it."""
    if scorer is not None and scorer.engine is not None:
        return scorer
    if not needs_engine(samples, completions):
        return scorer or RewardScorer()
    from rookworld_rlvr.engine import EngineConfig, StockfishPool

    pool = stack.enter_context(StockfishPool(EngineConfig(depth=depth)))
    return RewardScorer(config=scorer.config if scorer is not None else None, engine=pool)


def evaluate(model, tokenizer, samples: list[Sample], *, config: EvalConfig | None = None,
             scorer: RewardScorer | None = None, strength_set: Sequence[JudgedPosition] | None = None,
             puzzles: Sequence[Puzzle] | None = None, histories: Sequence[Sample] | None = None,
             progress: bool = False, return_examples: int = 0, spread: Spread | None = None,
             journal: Journal | None = None) -> dict:
    """Greedy metrics of `model` (JSON-serialisable; see `metrics` for definitions).

    Keys: policy, environment, meta; strength (move quality next to a random mover) when judged
    positions are given; puzzles when puzzles are given; selfplay when config.selfplay_games > 0;
    examples when return_examples > 0. A Stockfish pool is built (and closed) only when a P:
    completion needs it and `scorer` has no engine. `spread` (grpo.distributed.spread, under
    torchrun) shares greedy generation and scoring out among the processes, each of which calls
    this with the same arguments and gets the same result as one process would. `journal`
    (model.journal) holds greedy batches an interrupted run of this evaluation completed (they are
    not completed again) and takes each batch completed now.
    """
    from rookworld_rlvr.model.completions import Completer, sampling
    from rookworld_rlvr.play import selfplay_metrics

    config = config or EvalConfig()
    config.validate()
    samples = limit_per_task(samples, config.limit)
    constraint = None
    if config.legal_moves:
        from rookworld_rlvr.legal_decoding import LegalMoveDecoding

        constraint = LegalMoveDecoding(tokenizer)
    # remember: a prompt the sets share (the judged positions are among eval_data's P: samples) is completed once
    gen = Completer(model, tokenizer, config.max_new_tokens, config.batch_size, constraint, spread, remember=True,
                    journal=journal)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    completions, reasons = _generate_tasks(gen, samples, config, progress)
    timings["generate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ExitStack() as stack:
        used = _scorer_with_engine(scorer, samples, completions, config.engine_depth, stack)
        results = score_completions(samples, completions, used, layout=config.layout, examples=return_examples,
                                    spread=spread)
    timings["score"] = time.perf_counter() - t0
    for task, name in TASK_NAMES.items():
        why = [r for s, r in zip(samples, reasons) if s.task == task]
        results[name]["hit_max_tokens"] = share(r == "length" for r in why)
    if histories:
        t0 = time.perf_counter()
        texts, _ = _generate_tasks(gen, histories, config, progress, "histories")
        results["histories"] = score_completions(histories, texts, used if samples else RewardScorer(),
                                                 layout=config.layout, spread=spread)["environment"]
        timings["histories"] = time.perf_counter() - t0
    if strength_set:
        t0 = time.perf_counter()
        results["strength"] = strength_metrics(gen, strength_set, config.layout, progress)
        timings["strength"] = time.perf_counter() - t0
    if puzzles:
        t0 = time.perf_counter()
        results["puzzles"] = puzzle_metrics(gen, puzzles, config.layout, progress)
        timings["puzzles"] = time.perf_counter() - t0
    if config.selfplay_games > 0:
        t0 = time.perf_counter()
        results["selfplay"] = selfplay_metrics(
            gen, config.selfplay_games, config.selfplay_max_plies, config.layout,
            sampling(config.selfplay_temperature, config.seed, config.selfplay_top_k), progress)
        timings["selfplay"] = time.perf_counter() - t0
    results["meta"] = {"config": asdict(config), "seconds": {k: round(v, 3) for k, v in timings.items()},
                       "capped_batches": gen.capped_batches, "reused_answers": gen.reused}
    return results
