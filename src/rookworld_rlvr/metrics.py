"""Metrics of answers: pure functions of (samples, completions, rewards), no model.

Owns what the held-out numbers mean, so they can be checked with ground-truth and corrupted
completions alone (`evaluate` only adds generation). Conventions (all shares are in [0, 1]):
- policy `invalid`: the completion does not parse (`PolicyParse.valid` is False); `random`:
  what a random legal mover earns in `best_acc` and `top5_overlap` on the same positions;
  `distinct_legal_candidates`: distinct legal moves written in M: (a repeat counts once);
  `repeated_candidates`: share of answers that write a move twice; `best_acc_raw_labels`
  compares B: with the label written in the source data (None when no sample carries a label;
  in the upstream data black's B: label is the fifth-ranked candidate, which is why the
  ground truth is recomputed from the evals).
- environment `nls`: normalised Levenshtein similarity of the first '+' field to the true
  FEN, 0 when there is no such field; a copy of the input board earns most of it (a move
  changes a few characters), so `nls_copy`, that copy's similarity on the same rows, is its
  floor; `reward_mae`: |truth - predicted| with the prediction clipped to [-1, 1] (the reward
  range) and an unparseable reward counted as 0. Most transitions are ordinary moves (reward
  0.001, not terminated, not truncated), so `constant` holds what writing each field's most
  common value on every row earns: the floor of `reward_acc`, `reward_mae`, `terminated_acc` and
  `truncated_acc` (on the shipped held-out set 0.870, 0.098, 0.904 and 0.966).
- `held_out_reward`: the one number a run is judged by (best checkpoint, collapse guard, sweeps);
  each task's `rewards` (one per row, in the samples' order) let two evaluations of the same rows be
  compared pairwise (`held_out_se`).

Chess only: imports no torch and nothing of the model or trainer.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

from rookworld_rlvr.data.io import Sample
from rookworld_rlvr.tasks import environment as env_task
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks import strength
from rookworld_rlvr.tasks.rewards import ENV_COMPONENTS, POLICY_COMPONENTS, RewardResult, RewardScorer

TASK_NAMES = {"P": "policy", "A": "environment"}
POLICY_METRICS = ("invalid", "legal_best", "best_acc", "best_acc_raw_labels", "top5_overlap",
                  "distinct_legal_candidates", "repeated_candidates", "mean_reward")
ENV_METRICS = ("invalid", "next_state_acc", "nls", "nls_copy", "reward_acc", "reward_mae", "terminated_acc",
               "truncated_acc", "mean_reward")


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def share(flags) -> float | None:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else None


def phase(fen: str) -> str:
    """The phase of the game a position is in, by its move number: opening (moves 1-10),
    middlegame (11-30) or late (after move 30)."""
    move = int(fen.split()[5]) if len(fen.split()) > 5 and fen.split()[5].isdigit() else 1
    return "opening" if move <= 10 else "middlegame" if move <= 30 else "late"


def position_slices(fens: Sequence[str]) -> dict[str, list[int]]:
    """Indices of P: positions per slice: in check or not, out of check with a king move that would
    step into check (a part of not_in_check), and the phase of the game."""
    out: dict[str, list[int]] = {}
    for i, fen in enumerate(fens):
        out.setdefault("in_check" if strength.in_check(fen) else "not_in_check", []).append(i)
        if strength.king_can_step_into_check(fen):
            out.setdefault("king_can_step_into_check", []).append(i)
        out.setdefault(phase(fen), []).append(i)
    names = ("in_check", "not_in_check", "king_can_step_into_check", "opening", "middlegame", "late")
    return {k: out[k] for k in names if k in out}


def transition_slices(truths: Sequence[env_task.EnvTruth]) -> dict[str, list[int]]:
    """Indices of A: transitions per slice: history length (1 = a game start, 2-9, 10) and the
    kind of move (ordinary, game-ending, illegal). An average over all of them hides a model that
    fails every first move or every mate."""
    out: dict[str, list[int]] = {}
    for i, t in enumerate(truths):
        n = len(t.history.split())
        out.setdefault("history_1" if n <= 1 else "history_2_9" if n < env_task.HISTORY_LEN else "history_10",
                       []).append(i)
        kind = "illegal" if t.truncated else "game_ending" if t.terminated else "ordinary"
        out.setdefault(kind, []).append(i)
    order = ("history_1", "history_2_9", "history_10", "ordinary", "game_ending", "illegal")
    return {k: out[k] for k in order if k in out}


def items(flags: Iterable[bool]) -> list[int]:
    """Per-item outcomes as 0/1, kept beside a share (`NAME_items`) so that two evaluations of the same
    items can be compared item by item (`verdict`: a paired interval of the change)."""
    return [int(bool(f)) for f in flags]


def sliced(slices: dict[str, list[int]], name: str, flags: Sequence[bool]) -> dict[str, dict]:
    """{slice: {n, name: share of flags over the slice, name_items: the flags}} for each non-empty slice."""
    return {k: {"n": len(idx), name: share(flags[i] for i in idx), f"{name}_items": items(flags[i] for i in idx)}
            for k, idx in slices.items()}


def _component_means(results: Sequence[RewardResult], names: Sequence[str]) -> dict[str, float | None]:
    return {k: mean([r.components.get(k, 0.0) for r in results]) for k in names}


def _policy(samples: Sequence[Sample], completions: Sequence[str], results: Sequence[RewardResult]) -> dict:
    """P: metrics of a non-empty task slice (truth comes from the samples)."""
    parses = [pol_task.parse_completion(c) for c in completions]
    legal = [strength.legal_moves(s.truth.fen) for s in samples]
    labelled = [(p, s.truth.label) for p, s in zip(parses, samples) if s.truth.label is not None]
    legal_best = [p.best in lg for p, lg in zip(parses, legal)]
    return dict(
        invalid=share(not p.valid for p in parses),
        legal_best=share(legal_best),
        legal_best_items=items(legal_best),
        items_of=strength.fingerprint(s.render("compact")[0] for s in samples),
        best_acc=share(p.best is not None and p.best in s.truth.best for p, s in zip(parses, samples)),
        best_acc_raw_labels=share(p.best == label for p, label in labelled),
        top5_overlap=mean([len(set(p.moves or []) & set(s.truth.moves)) / len(s.truth.moves)
                           for p, s in zip(parses, samples)]),
        # a move written twice counts once: five copies of one legal move are 1 candidate, not 5
        distinct_legal_candidates=mean([len(set(p.moves or []) & lg) for p, lg in zip(parses, legal)]),
        repeated_candidates=share(len(p.moves or []) != len(set(p.moves or [])) for p in parses),
        mean_reward=mean([r.total for r in results]),
        n_labelled=len(labelled),
        random=random_mover(samples, legal),
        components=_component_means(results, POLICY_COMPONENTS),
        slices=sliced(position_slices([s.truth.fen for s in samples]), "legal_best", legal_best),
    )


def _predicted_reward(parsed: env_task.EnvParse) -> float:
    """The reward the model wrote, clipped to [-1, 1]; 0 when unreadable (see module doc)."""
    r = parsed.reward
    if r is None or not math.isfinite(r):
        return 0.0
    return max(-1.0, min(1.0, r))


def _environment(samples: Sequence[Sample], completions: Sequence[str], results: Sequence[RewardResult]) -> dict:
    """A: metrics of a non-empty task slice."""
    parses = [env_task.parse_completion(c) for c in completions]
    pairs = list(zip(parses, [s.truth for s in samples]))
    return dict(
        invalid=share(not p.valid for p in parses),
        next_state_acc=share(p.new_fen == t.new_fen for p, t in pairs),
        next_state_acc_items=items(p.new_fen == t.new_fen for p, t in pairs),
        items_of=strength.fingerprint(s.render("compact")[0] for s in samples),
        nls=mean([env_task.fen_similarity(p.new_fen, t.new_fen) if p.new_fen else 0.0 for p, t in pairs]),
        nls_copy=mean([env_task.fen_similarity(t.fen, t.new_fen) for _, t in pairs]),
        reward_acc=share(p.reward is not None and abs(p.reward - t.reward) < 1e-9 for p, t in pairs),
        reward_mae=mean([abs(t.reward - _predicted_reward(p)) for p, t in pairs]),
        terminated_acc=share(p.terminated == t.terminated for p, t in pairs),
        truncated_acc=share(p.truncated == t.truncated for p, t in pairs),
        exact_acc=share(r.correct for r in results),
        mean_reward=mean([r.total for r in results]),
        components=_component_means(results, ENV_COMPONENTS),
        slices=sliced(transition_slices([t for _, t in pairs]), "next_state_acc",
                      [p.new_fen == t.new_fen for p, t in pairs]),
        constant=constant_answers([t for _, t in pairs]),
    )


def random_mover(samples: Sequence[Sample], legal: Sequence[set[str]]) -> dict[str, float | None]:
    """The floor of `best_acc` and `top5_overlap`, exactly: a random legal B: move is best with chance
    best / legal; each true candidate is among 5 distinct random legal moves with chance min(5, legal) / legal."""
    best = [len(set(s.truth.best) & lg) / len(lg) if lg else 0.0 for s, lg in zip(samples, legal, strict=True)]
    top = [min(5, len(lg)) / len(lg) if lg else 0.0 for lg in legal]
    return dict(best_acc=mean(best), top5_overlap=mean(top))


def constant_answers(truths: Sequence) -> dict[str, float | None]:
    """What one answer on every row earns: each field's most common true value (the first of a tie)."""
    def common(values: list) -> Any:
        return Counter(values).most_common(1)[0][0]  # a tie: the value seen first

    reward = common([t.reward for t in truths])
    terminated, truncated = common([t.terminated for t in truths]), common([t.truncated for t in truths])
    return dict(reward_acc=share(abs(t.reward - reward) < 1e-9 for t in truths),
                reward_mae=mean([abs(t.reward - reward) for t in truths]),
                terminated_acc=share(t.terminated == terminated for t in truths),
                truncated_acc=share(t.truncated == truncated for t in truths))


TASK_METRICS: dict[str, tuple[tuple[str, ...], Callable[..., dict]]] = {
    "P": (POLICY_METRICS, _policy), "A": (ENV_METRICS, _environment)}


def task_metrics(task: str, samples: Sequence[Sample], completions: Sequence[str],
                 results: Sequence[RewardResult]) -> dict[str, Any]:
    """One task's metrics; every metric None (and n 0) when the task has no samples."""
    if not len(samples) == len(completions) == len(results):  # one of each an item: else a figure over fewer
        raise ValueError(f"{task}: {len(samples)} samples, {len(completions)} completions and {len(results)} results")
    names, compute = TASK_METRICS[task]
    out: dict[str, Any] = {"n": len(samples), **{k: None for k in names}}
    if samples:
        out.update(compute(samples, completions, results))
        out["rewards"] = [round(r.total, 4) for r in results]
    return out


def needs_engine(samples: Sequence[Sample], completions: Sequence[str]) -> bool:
    """True when a P: completion names a legal B: outside the truth's moves (its quality needs Stockfish)."""
    for s, c in zip(samples, completions, strict=True):
        if s.task != "P":
            continue
        best = pol_task.parse_completion(c).move
        if best and best not in s.truth.moves and strength.is_legal(s.truth.fen, best):
            return True
    return False


def _example(prompt: str, completion: str, sample: Sample, result: RewardResult) -> dict[str, Any]:
    return {"prompt": prompt, "completion": completion, "truth": sample.truth.to_dict(), "reward": result.total,
            "components": dict(result.components), "correct": result.correct, "notes": list(result.notes)}


def score_completions(samples: Sequence[Sample], completions: Sequence[str], scorer: RewardScorer, *,
                      layout: str = "compact", examples: int = 0,
                      spread: Callable[[list, Callable[[list], list]], list] | None = None) -> dict[str, Any]:
    """Metrics of both tasks for given completions, in the order of `samples`.

    Returns {"policy": {...}, "environment": {...}} (plus "examples" when examples > 0:
    the first `examples` rows of each task). A scorer without an engine raises when a
    legal B: outside the truth's moves needs Stockfish; see `needs_engine`. `spread` (as
    `model.completions.Completer`'s) shares the rows' scoring out among processes.
    """
    if len(samples) != len(completions):
        raise ValueError(f"{len(samples)} samples but {len(completions)} completions")
    prompts = [s.render(layout)[0] for s in samples]

    def score(rows: list[int]) -> list:
        return scorer.score_batch([prompts[i] for i in rows], [completions[i] for i in rows],
                                  [samples[i].truth for i in rows]) if rows else []

    rows = list(range(len(samples)))
    results = spread(rows, score) if spread is not None else score(rows)
    out: dict[str, Any] = {}
    for task, name in TASK_NAMES.items():
        idx = [i for i, s in enumerate(samples) if s.task == task]
        out[name] = task_metrics(task, [samples[i] for i in idx], [completions[i] for i in idx],
                                 [results[i] for i in idx])
    if examples > 0:
        out["examples"] = {
            TASK_NAMES[task]: [_example(prompts[i], completions[i], samples[i], results[i])
                               for i in [i for i, s in enumerate(samples) if s.task == task][:examples]]
            for task in ("P", "A")
        }
    return out


def held_out_reward(res: dict | None) -> float | None:
    """The mean of the policy and environment mean_reward of an evaluation (over the tasks that
    were evaluated); None without an evaluation or without any task in it."""
    if not res:
        return None
    vals = [res[t]["mean_reward"] for t in ("policy", "environment") if (res.get(t) or {}).get("n")]
    return float(sum(vals) / len(vals)) if vals else None


def held_out_se(res: dict | None, ref: dict | None) -> float | None:
    """Standard error of held_out_reward(res) - held_out_reward(ref), paired over the rows both
    evaluations scored (the same rows in the same order: one run's held-out set). None when either
    lacks a task's per-row `rewards` or their rows differ: then there is nothing to pair.

    Paired, because most rows keep their answer from one evaluation to the next: the noise of a
    change is far below that of either mean (0.010-0.018 at 100 + 100 rows, 0.005 at 1,000 + 1,000)."""
    if not res or not ref:
        return None
    tasks = [t for t in ("policy", "environment") if (res.get(t) or {}).get("n")]
    if not tasks or tasks != [t for t in ("policy", "environment") if (ref.get(t) or {}).get("n")]:
        return None
    var = 0.0
    for t in tasks:
        a, b = res[t].get("rewards"), ref[t].get("rewards")
        if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b) or len(a) < 2:
            return None
        var += statistics.variance([x - y for x, y in zip(a, b)]) / len(a)
    return math.sqrt(var) / len(tasks)
