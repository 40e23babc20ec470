"""Greedy evaluation of a chess LM: both tasks, playing strength, puzzles and self-play.

Generation and scoring are separate on purpose: `score_completions` is a pure function of
(samples, completions, scorer), so the metric code can be checked with ground-truth and
corrupted completions without any model, and `evaluate` only adds batched generation.

Metric conventions (all shares are in [0, 1]):
- policy `invalid`: the completion does not parse (`PolicyParse.valid` is False);
  `distinct_legal_candidates`: distinct legal moves written in M: (a repeat counts once);
  `repeated_candidates`: share of answers that write a move twice; `best_acc_raw_labels`
  compares B: with the label written in the source data (None when no sample carries a label;
  in the upstream data black's B: label is the fifth-ranked candidate, which is why the
  ground truth is recomputed from the evals).
- strength (judged positions): expected-score loss, accuracy and blunder rate of the legal
  B: moves, and best-move match, each next to a uniformly random legal mover on the same
  positions (`random`; see tasks.strength); puzzles: solve rate per kind, next to random.
- environment `nls`: normalised Levenshtein similarity of the first '+' field to the true
  FEN, 0 when there is no such field; `reward_mae`: |truth - predicted| with the prediction
  clipped to [-1, 1] (the reward range) and an unparseable reward counted as 0.
- the P: and A: prompts of a batch share one token budget: `max_new_tokens` is capped to what
  the model's context leaves after the batch's longest prompt (`meta.capped_batches` counts it).

torch and the model package are imported inside functions so `rookworld --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import chess

from rookworld_rlvr.data.io import DataError, Sample, atomic_write_text, iter_samples
from rookworld_rlvr.tasks import environment as env_task
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks import strength
from rookworld_rlvr.tasks.rewards import ENV_COMPONENTS, POLICY_COMPONENTS, RewardResult, RewardScorer
from rookworld_rlvr.tasks.strength import JudgedPosition, Puzzle

if TYPE_CHECKING:
    from rookworld_rlvr.engine import StockfishPool

TASK_NAMES = {"P": "policy", "A": "environment"}
POLICY_METRICS = ("invalid", "legal_best", "best_acc", "best_acc_raw_labels", "top5_overlap",
                  "distinct_legal_candidates", "repeated_candidates", "mean_reward")
ENV_METRICS = ("invalid", "next_state_acc", "nls", "reward_acc", "reward_mae", "terminated_acc",
               "truncated_acc", "mean_reward")
SECTIONS = ("strength", "puzzles", "policy", "environment", "selfplay")
NOT_METRICS = ("examples", "meta")  # sections that the tables skip


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

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        checks = [
            ("layout", self.layout in pol_task.LAYOUTS, f"one of {pol_task.LAYOUTS}"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("max_new_tokens", self.max_new_tokens >= 1, ">= 1"),
            ("limit", self.limit is None or self.limit >= 0, ">= 0 or None"),
            ("temperature", self.temperature >= 0, ">= 0 (0 = greedy)"),
            ("selfplay_games", self.selfplay_games >= 0, ">= 0"),
            ("selfplay_max_plies", self.selfplay_max_plies >= 1, ">= 1"),
            ("selfplay_temperature", self.selfplay_temperature >= 0, ">= 0 (0 = greedy)"),
            ("selfplay_top_k", self.selfplay_top_k >= 0, ">= 0"),
            ("engine_depth", self.engine_depth >= 1, ">= 1"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"EvalConfig.{name} must be {rule}, got {getattr(self, name)!r}")


# -- scoring (pure) --------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _share(flags: Iterable[bool]) -> float | None:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else None


def _component_means(results: Sequence[RewardResult], names: Sequence[str]) -> dict[str, float | None]:
    return {k: _mean([r.components.get(k, 0.0) for r in results]) for k in names}


def policy_metrics(samples: Sequence[Sample], completions: Sequence[str],
                   results: Sequence[RewardResult]) -> dict[str, Any]:
    """P: metrics from completions and their rewards (truth comes from the samples)."""
    out: dict[str, Any] = {"n": len(samples), **{k: None for k in POLICY_METRICS}}
    if not samples:
        return out
    parses = [pol_task.parse_completion(c) for c in completions]
    legal = [strength.legal_moves(s.truth.fen) for s in samples]
    labelled = [(p, s.truth.label) for p, s in zip(parses, samples) if s.truth.label is not None]
    out.update(
        invalid=_share(not p.valid for p in parses),
        legal_best=_share(p.best in lg for p, lg in zip(parses, legal)),
        best_acc=_share(p.best is not None and p.best in s.truth.best for p, s in zip(parses, samples)),
        best_acc_raw_labels=_share(p.best == label for p, label in labelled),
        top5_overlap=_mean([len(set(p.moves or []) & set(s.truth.moves)) / len(s.truth.moves)
                            for p, s in zip(parses, samples)]),
        # a move written twice counts once: five copies of one legal move are 1 candidate, not 5
        distinct_legal_candidates=_mean([len(set(p.moves or []) & lg) for p, lg in zip(parses, legal)]),
        repeated_candidates=_share(len(p.moves or []) != len(set(p.moves or [])) for p in parses),
        mean_reward=_mean([r.total for r in results]),
        n_labelled=len(labelled),
        components=_component_means(results, POLICY_COMPONENTS),
    )
    return out


def _predicted_reward(parsed: env_task.EnvParse) -> float:
    """The reward the model wrote, clipped to [-1, 1]; 0 when unreadable (see module doc)."""
    r = parsed.reward
    if r is None or not math.isfinite(r):
        return 0.0
    return max(-1.0, min(1.0, r))


def environment_metrics(samples: Sequence[Sample], completions: Sequence[str],
                        results: Sequence[RewardResult]) -> dict[str, Any]:
    """A: metrics from completions and their rewards."""
    out: dict[str, Any] = {"n": len(samples), **{k: None for k in ENV_METRICS}}
    if not samples:
        return out
    parses = [env_task.parse_completion(c) for c in completions]
    pairs = list(zip(parses, [s.truth for s in samples]))
    out.update(
        invalid=_share(not p.valid for p in parses),
        next_state_acc=_share(p.new_fen == t.new_fen for p, t in pairs),
        nls=_mean([env_task.fen_similarity(p.new_fen, t.new_fen) if p.new_fen else 0.0 for p, t in pairs]),
        reward_acc=_share(p.reward is not None and abs(p.reward - t.reward) < 1e-9 for p, t in pairs),
        reward_mae=_mean([abs(t.reward - _predicted_reward(p)) for p, t in pairs]),
        terminated_acc=_share(p.terminated == t.terminated for p, t in pairs),
        truncated_acc=_share(p.truncated == t.truncated for p, t in pairs),
        exact_acc=_share(r.correct for r in results),
        mean_reward=_mean([r.total for r in results]),
        components=_component_means(results, ENV_COMPONENTS),
    )
    return out


def needs_engine(samples: Sequence[Sample], completions: Sequence[str]) -> bool:
    """True when a P: completion names a legal B: outside the truth's moves (its quality needs Stockfish)."""
    for s, c in zip(samples, completions):
        if s.task != "P":
            continue
        best = pol_task.parse_completion(c).best
        if best and best not in s.truth.moves and pol_task.UCI_RE.match(best) and best in strength.legal_moves(s.truth.fen):
            return True
    return False


def _example(prompt: str, completion: str, sample: Sample, result: RewardResult) -> dict[str, Any]:
    return {"prompt": prompt, "completion": completion, "truth": sample.truth.to_dict(), "reward": result.total,
            "components": dict(result.components), "correct": result.correct, "notes": list(result.notes)}


def score_completions(samples: Sequence[Sample], completions: Sequence[str], scorer: RewardScorer, *,
                      layout: str = "compact", examples: int = 0) -> dict[str, Any]:
    """Metrics of both tasks for given completions, in the order of `samples`.

    Returns {"policy": {...}, "environment": {...}} (plus "examples" when examples > 0:
    the first `examples` rows of each task). A scorer without an engine raises when a
    legal B: outside the truth's moves needs Stockfish; see `needs_engine`.
    """
    if len(samples) != len(completions):
        raise ValueError(f"{len(samples)} samples but {len(completions)} completions")
    prompts = [s.render(layout)[0] for s in samples]
    results = scorer.score_batch(prompts, list(completions), [s.truth for s in samples]) if samples else []
    out: dict[str, Any] = {}
    for task, metrics in (("P", policy_metrics), ("A", environment_metrics)):
        idx = [i for i, s in enumerate(samples) if s.task == task]
        out[TASK_NAMES[task]] = metrics([samples[i] for i in idx], [completions[i] for i in idx],
                                        [results[i] for i in idx])
    if examples > 0:
        out["examples"] = {
            TASK_NAMES[task]: [_example(prompts[i], completions[i], samples[i], results[i])
                               for i in [i for i, s in enumerate(samples) if s.task == task][:examples]]
            for task in ("P", "A")
        }
    return out


# -- generation ------------------------------------------------------------------------------------


def _progress_bar(enabled: bool, total: int, desc: str, unit: str = "row"):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False)


def _token_lengths(tokenizer, prompts: Sequence[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]


class _Generator:
    """Batched generation with the token budget capped to the model context."""

    def __init__(self, model, tokenizer, config: EvalConfig) -> None:
        from rookworld_rlvr.model.generate import max_positions

        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.context = max_positions(model)
        self.capped_batches = 0

    def budget(self, longest_prompt: int) -> int:
        """max_new_tokens, or what the context leaves after the longest prompt."""
        if self.context is None:
            return self.config.max_new_tokens
        room = self.context - longest_prompt
        if room < 1:
            raise ValueError(f"a prompt of {longest_prompt} tokens leaves no room in the model's context "
                             f"of {self.context} tokens")
        if room < self.config.max_new_tokens:
            self.capped_batches += 1
        return min(self.config.max_new_tokens, room)

    def run(self, prompts: Sequence[str], *, bar=None, **sampling: Any) -> tuple[list[str], list[str]]:
        """Completions and finish reasons in prompt order; batches of similar length (less padding)."""
        from rookworld_rlvr.model.generate import generate

        lengths = _token_lengths(self.tokenizer, prompts)
        order = sorted(range(len(prompts)), key=lambda i: lengths[i])
        texts: list[str] = [""] * len(prompts)
        reasons: list[str] = [""] * len(prompts)
        size = self.config.batch_size
        sampling = {"greedy": True, **sampling}
        for start in range(0, len(order), size):
            idx = order[start:start + size]
            budget = self.budget(max(lengths[i] for i in idx))
            gen = generate(self.model, self.tokenizer, [prompts[i] for i in idx], max_new_tokens=budget, **sampling)
            for i, text, reason in zip(idx, gen.texts, gen.finish_reasons):
                texts[i], reasons[i] = text, reason
            if bar is not None:
                bar.update(len(idx))
        return texts, reasons


def _limit_per_task(samples: Sequence[Sample], limit: int | None) -> list[Sample]:
    """The first `limit` samples of each task, in input order."""
    if limit is None:
        return list(samples)
    seen = {"P": 0, "A": 0}
    kept = []
    for s in samples:
        if seen[s.task] < limit:
            seen[s.task] += 1
            kept.append(s)
    return kept


def _sampling(temperature: float, seed: int, top_k: int = 0) -> dict[str, Any]:
    """`generate` keyword arguments: greedy at temperature 0, else seeded sampling."""
    import torch

    if temperature <= 0:
        return {"greedy": True}
    return {"greedy": False, "temperature": temperature, "top_k": top_k,
            "generator": torch.Generator().manual_seed(seed)}


def _generate_tasks(gen: _Generator, samples: Sequence[Sample], progress: bool) -> tuple[list[str], list[str]]:
    """Greedy (or sampled, with config.temperature) completions for every sample; each task in its own batches."""
    completions = [""] * len(samples)
    reasons = [""] * len(samples)
    sampling = _sampling(gen.config.temperature, gen.config.seed)
    for task in TASK_NAMES:
        idx = [i for i, s in enumerate(samples) if s.task == task]
        if not idx:
            continue
        with _progress_bar(progress, len(idx), f"eval {task}") as bar:
            texts, why = gen.run([samples[i].render(gen.config.layout)[0] for i in idx], bar=bar, **sampling)
        for i, t, r in zip(idx, texts, why):
            completions[i], reasons[i] = t, r
    return completions, reasons


def _best_move(completion: str) -> str | None:
    best = pol_task.parse_completion(completion).best
    return best if best and pol_task.UCI_RE.match(best) else None


def _answers(gen: _Generator, fens: Sequence[str], progress: bool, desc: str) -> list[pol_task.PolicyParse]:
    """Greedy P: answers for positions, parsed."""
    prompts = [pol_task.prompt(fen, gen.config.layout) for fen in fens]
    with _progress_bar(progress, len(prompts), desc) as bar:
        texts, _ = gen.run(prompts, bar=bar)
    return [pol_task.parse_completion(t) for t in texts]


def strength_metrics(gen: _Generator, positions: Sequence[JudgedPosition], progress: bool) -> dict:
    """Move quality of the greedy B: and the M: candidates on judged positions, each next to a
    random legal mover on the same positions (see tasks.strength)."""
    if not positions:
        return {"n": 0}
    parses = _answers(gen, [p.fen for p in positions], progress, "strength")
    moves = [p.best if p.best and pol_task.UCI_RE.match(p.best) else None for p in parses]
    return {**strength.move_quality(positions, moves),
            "candidates": strength.candidate_quality(positions, [p.moves for p in parses])}


def puzzle_metrics(gen: _Generator, puzzles: Sequence[Puzzle], progress: bool) -> dict:
    """Share of puzzles whose greedy B: is a solving move, per kind, next to a random legal mover."""
    if not puzzles:
        return {}
    parses = _answers(gen, [p.fen for p in puzzles], progress, "puzzles")
    return strength.puzzle_scores(puzzles, [p.best for p in parses])


def selfplay_metrics(gen: _Generator, games: int, progress: bool) -> dict:
    """The model plays both sides from the start position; python-chess referees.

    A game ends at the first unparseable or illegal B: move (other P: sections are not
    required), when the game is over (checkmate, stalemate, insufficient material,
    fivefold repetition, 75-move rule) or after `selfplay_max_plies`. All games advance
    together, one batched generation per ply.
    """
    cfg = gen.config
    boards = [chess.Board() for _ in range(games)]
    ended = {"illegal": 0, "game_over": 0, "max_plies": 0}
    sampling = _sampling(cfg.selfplay_temperature, cfg.seed, cfg.selfplay_top_k)
    alive = list(range(games))
    with _progress_bar(progress, cfg.selfplay_max_plies, "self-play", "ply") as bar:
        for _ in range(cfg.selfplay_max_plies):
            over = [g for g in alive if boards[g].is_game_over()]
            ended["game_over"] += len(over)
            alive = [g for g in alive if g not in over]
            if not alive:
                break
            prompts = [pol_task.prompt(env_task.fen_of(boards[g]), cfg.layout) for g in alive]
            texts, _ = gen.run(prompts, **sampling)
            still = []
            for g, text in zip(alive, texts):
                move = _best_move(text)
                if move is None or move not in strength.legal_moves(boards[g].fen()):
                    ended["illegal"] += 1
                else:
                    boards[g].push_uci(move)
                    still.append(g)
            alive = still
            bar.update(1)
    ended["game_over"] += sum(boards[g].is_game_over() for g in alive)
    ended["max_plies"] += sum(not boards[g].is_game_over() for g in alive)
    plies = [len(b.move_stack) for b in boards]
    return {"games": games, "mean_legal_half_moves": _mean(plies) if plies else None,
            "max_legal_half_moves": max(plies, default=None),
            **{f"ended_{k}": v for k, v in ended.items()}}


# -- the entry point -------------------------------------------------------------------------------


def _scorer_with_engine(scorer: RewardScorer | None, samples: Sequence[Sample], completions: Sequence[str],
                        depth: int, stack: ExitStack) -> RewardScorer:
    """The given scorer, or one with a Stockfish pool (closed by `stack`) when a move's quality needs it."""
    if scorer is not None and scorer.engine is not None:
        return scorer
    if not needs_engine(samples, completions):
        return scorer or RewardScorer()
    from rookworld_rlvr.engine import EngineConfig, StockfishPool

    pool: StockfishPool = stack.enter_context(StockfishPool(EngineConfig(depth=depth)))
    return RewardScorer(config=scorer.config if scorer is not None else None, engine=pool)


def evaluate(model, tokenizer, samples: list[Sample], *, config: EvalConfig | None = None,
             scorer: RewardScorer | None = None, strength_set: Sequence[JudgedPosition] | None = None,
             puzzles: Sequence[Puzzle] | None = None, progress: bool = False, return_examples: int = 0) -> dict:
    """Greedy metrics of `model` (JSON-serialisable; see the module docstring for definitions).

    Keys: policy, environment, meta; strength (move quality next to a random mover) when judged
    positions are given; puzzles when puzzles are given; selfplay when config.selfplay_games > 0;
    examples when return_examples > 0. A Stockfish pool is built (and closed) only when a P:
    completion needs it and `scorer` has no engine.
    """
    config = config or EvalConfig()
    config.validate()
    samples = _limit_per_task(samples, config.limit)
    gen = _Generator(model, tokenizer, config)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    completions, reasons = _generate_tasks(gen, samples, progress)
    timings["generate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ExitStack() as stack:
        used = _scorer_with_engine(scorer, samples, completions, config.engine_depth, stack)
        results = score_completions(samples, completions, used, layout=config.layout, examples=return_examples)
    timings["score"] = time.perf_counter() - t0
    for task, name in TASK_NAMES.items():
        why = [r for s, r in zip(samples, reasons) if s.task == task]
        results[name]["hit_max_tokens"] = _share(r == "length" for r in why)
    if strength_set:
        t0 = time.perf_counter()
        results["strength"] = strength_metrics(gen, strength_set, progress)
        timings["strength"] = time.perf_counter() - t0
    if puzzles:
        t0 = time.perf_counter()
        results["puzzles"] = puzzle_metrics(gen, puzzles, progress)
        timings["puzzles"] = time.perf_counter() - t0
    if config.selfplay_games > 0:
        t0 = time.perf_counter()
        results["selfplay"] = selfplay_metrics(gen, config.selfplay_games, progress)
        timings["selfplay"] = time.perf_counter() - t0
    results["meta"] = {"config": asdict(config), "seconds": {k: round(v, 3) for k, v in timings.items()},
                       "capped_batches": gen.capped_batches}
    return results


# -- mate-in-one positions -------------------------------------------------------------------------


def _mate_line(line: str) -> tuple[str, list[str]]:
    """Parse `FEN<TAB>move move ...`; each move must be legal and mate."""
    if "\t" not in line:
        raise ValueError("expected `FEN<TAB>mating moves`")
    fen, moves_text = line.split("\t", 1)
    fen = fen.strip()
    if fen.startswith("P:"):
        fen = fen[2:].strip()
    try:
        board = chess.Board(fen)
    except ValueError as e:
        raise ValueError(f"bad FEN {fen!r}: {e}") from None
    moves = moves_text.split()
    if not moves:
        raise ValueError("no mating moves after the tab")
    for mv in moves:
        if not pol_task.UCI_RE.match(mv) or chess.Move.from_uci(mv) not in board.legal_moves:
            raise ValueError(f"{mv!r} is not a legal UCI move in {fen}")
        after = board.copy(stack=False)
        after.push_uci(mv)
        if not after.is_checkmate():
            raise ValueError(f"{mv} does not mate in {fen}")
    return fen, moves


def load_mate_in_one(path: str | Path) -> list[tuple[str, list[str]]]:
    """Positions from `FEN<TAB>mating UCI moves` lines (FEN optionally prefixed `P: `).

    Blank lines and lines starting with '#' are skipped; a bad line raises DataError
    (a ValueError) starting with `file:line:`.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file")
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                out.append(_mate_line(line.rstrip("\n")))
            except ValueError as e:
                raise DataError(f"{path}:{lineno}: {e}") from None
    return out


# -- tables ----------------------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def flatten_metrics(results: dict) -> dict[str, Any]:
    """`section.metric` (and `section.components.name`) -> value, skipping examples and meta."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, d: dict) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(f"{prefix}{k}.", v)
            elif v is None or _is_number(v) or isinstance(v, str):
                flat[f"{prefix}{k}"] = v

    known = [s for s in SECTIONS if s in results] + [s for s in results if s not in SECTIONS and s not in NOT_METRICS]
    for section in known:
        if isinstance(results[section], dict):
            walk(f"{section}.", results[section])
    return flat


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def _fmt_delta(a: Any, b: Any) -> str:
    if not (_is_number(a) and _is_number(b)):
        return "-"
    d = b - a
    return f"{d:+d}" if isinstance(d, int) else f"{d:+.4f}"


def _render(rows: list[list[str]], numeric_from: int = 1) -> str:
    """Columns padded to their widest cell, ' | ' between, numbers right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, row in enumerate(rows):
        cells = [c.ljust(w) if i < numeric_from else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append(" | ".join(cells).rstrip())
        if j == 0:
            lines.append("-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def format_table(results: dict) -> str:
    """A plain-text table: one line per metric (`policy.best_acc | 0.1660`); empty tasks show only n."""
    empty = [f"{k}." for k, v in results.items() if isinstance(v, dict) and v.get("n") == 0]
    flat = {k: v for k, v in flatten_metrics(results).items()
            if not k.startswith(tuple(empty)) or k.endswith(".n")}
    if not flat:
        return "(no metrics)"
    return _render([["metric", "value"]] + [[k, _fmt(v)] for k, v in flat.items()])


def compare_table(base: dict, final: dict) -> str:
    """`metric | base | final | delta` for every numeric metric present in either result."""
    a, b = flatten_metrics(base), flatten_metrics(final)
    keys = list(a) + [k for k in b if k not in a]
    keys = [k for k in keys if _is_number(a.get(k)) or _is_number(b.get(k))]
    if not keys:
        return "(no numeric metrics)"
    rows = [["metric", "base", "final", "delta"]]
    rows += [[k, _fmt(a.get(k)), _fmt(b.get(k)), _fmt_delta(a.get(k), b.get(k))] for k in keys]
    return _render(rows)


# -- command line ----------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    d = EvalConfig()
    p.add_argument("--model", required=True, help="model directory or Hub id")
    p.add_argument("--data", required=True, help="our JSONL(.gz) or upstream RookWorld text lines (P: and A: mixed)")
    p.add_argument("--strength", metavar="FILE", help="judged positions (`rookworld data judge`): move quality of the "
                                                     "greedy B: next to a random legal mover, e.g. data/strength.jsonl.gz")
    p.add_argument("--puzzles", metavar="FILE", help="puzzles (JSONL from `rookworld data judge`, or `FEN<TAB>mating "
                                                    "moves` lines), e.g. data/puzzles_eval.jsonl.gz")
    p.add_argument("--limit", type=int, default=d.limit, help="samples per task (default: all)")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON (atomically)")
    p.add_argument("--selfplay", type=int, default=d.selfplay_games, metavar="N", help="self-play games")
    p.add_argument("--selfplay-max-plies", type=int, default=d.selfplay_max_plies)
    p.add_argument("--selfplay-temperature", type=float, default=d.selfplay_temperature, help="0 = greedy")
    p.add_argument("--temperature", type=float, default=d.temperature,
                   help="sample the task completions at this temperature (0 = greedy); 'invalid' then "
                        "measures how often sampled answers are malformed")
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed (--temperature, self-play)")
    p.add_argument("--layout", choices=pol_task.LAYOUTS, default=d.layout, help="P: prompt layout")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--depth", type=int, default=d.engine_depth, help="Stockfish depth for moves outside the top 5")
    p.add_argument("--examples", type=int, default=0, metavar="N", help="keep N examples per task in the JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--traceback", action="store_true", help="show tracebacks instead of one-line errors")


def _read_data(path: str, limit: int | None) -> list[Sample]:
    """Samples of both tasks; stops reading once both tasks have `limit`."""
    samples, seen = [], {"P": 0, "A": 0}
    for s in iter_samples(path):
        if limit is None or seen[s.task] < limit:
            samples.append(s)
            seen[s.task] += 1
        if limit is not None and min(seen.values()) >= limit:
            break
    return samples


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def _guarded(args: argparse.Namespace, what: str, func: Callable[[], Any]) -> tuple[bool, Any]:
    """Run `func`; on failure print `error: cannot <what>: ...` (unless --traceback)."""
    try:
        return True, func()
    except Exception as e:  # noqa: BLE001 - the message names what failed
        if args.traceback:
            raise
        _fail(f"cannot {what}: {e}")
        return False, None


def run(args: argparse.Namespace, name: str) -> int:
    config = EvalConfig(layout=args.layout, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                        limit=args.limit, selfplay_games=args.selfplay, selfplay_max_plies=args.selfplay_max_plies,
                        selfplay_temperature=args.selfplay_temperature, engine_depth=args.depth,
                        temperature=args.temperature, seed=args.seed)
    config.validate()
    ok, samples = _guarded(args, f"read data {args.data}", lambda: _read_data(args.data, args.limit))
    if not ok:
        return 1
    if not samples and not args.puzzles and not args.strength and not args.selfplay:
        return _fail(f"no samples in {args.data}")
    from rookworld_rlvr.data.judged import read_judged, read_puzzles

    judged = puzzles = None
    if args.strength:
        ok, judged = _guarded(args, f"read judged positions {args.strength}", lambda: read_judged(args.strength))
        if not ok:
            return 1
    if args.puzzles:
        ok, puzzles = _guarded(args, f"read puzzles {args.puzzles}", lambda: read_puzzles(args.puzzles))
        if not ok:
            return 1
    from rookworld_rlvr.model.load import load_policy

    ok, loaded = _guarded(args, f"load model {args.model}",
                          lambda: load_policy(args.model, device=args.device, dtype=args.dtype))
    if not ok:
        return 1
    model, tokenizer = loaded
    with ExitStack() as stack:
        scorer = _cli_scorer(samples, args.depth, stack)
        results = evaluate(model, tokenizer, samples, config=config, scorer=scorer, strength_set=judged,
                           puzzles=puzzles, progress=not args.quiet, return_examples=args.examples)
    results["meta"].update(model=args.model, data=args.data)
    print(format_table(results))
    if args.json:
        atomic_write_text(args.json, [json.dumps(results, indent=2) + "\n"])
        print(f"wrote {args.json}")
    return 0


def _cli_scorer(samples: Sequence[Sample], depth: int, stack: ExitStack) -> RewardScorer | None:
    """A scorer with a Stockfish pool when there are P: samples (engines start lazily)."""
    if not any(s.task == "P" for s in samples):
        return None
    from rookworld_rlvr.engine import EngineConfig, StockfishNotFound, StockfishPool

    try:
        pool = stack.enter_context(StockfishPool(EngineConfig(depth=depth)))
    except StockfishNotFound as e:  # evaluate asks again only if a completion needs it
        print(f"warning: {e}", file=sys.stderr)
        return None
    return RewardScorer(engine=pool)
