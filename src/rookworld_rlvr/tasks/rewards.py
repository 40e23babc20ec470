"""Verifiable rewards: one entry point, named components, explainable totals.

Every component scores in [0, 1]; the total is the weighted mean of the components, shaped
(`linear`; `graduated`: 5 levels 0.2..1.0, the top one only for an answer right in every
component; `binary`: 1 for a correct, well-formed answer). Output that cannot be read at all
(P: no parseable B: move; A: not four '+'-separated fields) gets the mild `malformed_penalty`.
A ground-truth completion scores exactly 1.0, the maximum; every corruption of it scores less.

The rewards pay for chess content, not form (tests/test_reward_hacks.py holds the known hacks):
- P: `quality` is the B: move's expected score against Stockfish's best (win probability,
  tasks.strength), for any legal move; candidates count once each and a repeat counts against
  the answer; evals are scored per distinct move.
- A: a wrong next state earns credit only for what the move changed (environment.change_credit):
  a copy of the input board earns none.
- Puzzles (a `Puzzle` truth): 1 when B: is a solving move in a well-formed answer, else 0.

Owns scoring. Chess only: imports no torch and nothing of the model or trainer; the engine is
passed in (a `StockfishPool`), never started here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from rookworld_rlvr.tasks import environment as env_task
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks import strength
from rookworld_rlvr.tasks.environment import EnvTruth
from rookworld_rlvr.tasks.policy import PolicyTruth
from rookworld_rlvr.tasks.strength import Puzzle, best_of

if TYPE_CHECKING:  # the engine is optional: sample truth makes it unnecessary
    from rookworld_rlvr.engine import StockfishPool

POLICY_COMPONENTS = ("format", "best_legal", "quality", "candidates", "evals")
ENV_COMPONENTS = ("format", "next_state", "reward", "terminated", "truncated")
PUZZLE_COMPONENTS = ("format", "solved")
SHAPINGS = ("linear", "graduated", "binary")
EVAL_CLIP = 20.0  # pawns; mate scores (~1000) clip here so a mate/non-mate mix-up is a large error


@dataclass
class RewardConfig:
    """How completions are scored. Weights are relative; unnamed components keep defaults."""

    policy_weights: dict[str, float] = field(default_factory=lambda: {
        "format": 0.1, "best_legal": 0.2, "quality": 0.4, "candidates": 0.2, "evals": 0.1})
    env_weights: dict[str, float] = field(default_factory=lambda: {
        "format": 0.1, "next_state": 0.6, "reward": 0.1, "terminated": 0.1, "truncated": 0.1})
    shaping: str = "linear"  # linear | graduated | binary
    malformed_penalty: float = -0.3
    # expected-score loss (win probability, tasks.strength) at which the best move's quality reaches 0:
    # a random legal move loses about 0.11 on typical positions, a blunder 0.2 or more
    quality_scale: float = 0.3
    eval_scale: float = 3.0  # pawns of eval error at which an eval scores 0
    # most next-state credit a readable but wrong FEN can earn (0 = exact or nothing); the credit counts
    # only what the move changed, so a copy of the input board earns none
    next_state_partial: float = 0.8

    def validate(self) -> None:
        for name, weights, known in (("policy_weights", self.policy_weights, POLICY_COMPONENTS),
                                     ("env_weights", self.env_weights, ENV_COMPONENTS)):
            unknown = set(weights) - set(known)
            if unknown:
                raise ValueError(f"reward.{name}: unknown component(s) {sorted(unknown)}; known: {list(known)}")
            if any(not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0 or not math.isfinite(w)
                   for w in weights.values()):
                raise ValueError(f"reward.{name}: weights must be finite numbers >= 0")
            if sum(weights.values()) <= 0:
                raise ValueError(f"reward.{name}: at least one weight must be positive")
        if self.shaping not in SHAPINGS:
            raise ValueError(f"reward.shaping must be one of {SHAPINGS}, got {self.shaping!r}")
        if not -1.0 <= self.malformed_penalty <= 0.0:
            raise ValueError("reward.malformed_penalty must be in [-1, 0]")
        if not 0 < self.quality_scale <= 1:
            raise ValueError(f"reward.quality_scale must be in (0, 1] (an expected-score loss), got {self.quality_scale}")
        if self.eval_scale <= 0:
            raise ValueError("reward.eval_scale must be > 0")
        if not 0.0 <= self.next_state_partial < 1.0:
            raise ValueError(f"reward.next_state_partial must be in [0, 1), got {self.next_state_partial}"
                             " (1 would pay a wrong FEN like the exact one)")


@dataclass
class RewardResult:
    total: float
    components: dict[str, float]
    valid_format: bool
    task: str  # "P" or "A"
    notes: list[str] = field(default_factory=list)
    correct: bool = False  # P: best move is a true best move; A: every field exact; puzzle: solved


def task_of(prompt: str) -> str:
    """'P' or 'A' from the prompt prefix."""
    head = prompt.lstrip()[:2]
    if head in ("P:", "A:"):
        return head[0]
    raise ValueError(f"prompt must start with 'P:' or 'A:', got {prompt[:20]!r}")


def fen_of_prompt(prompt: str) -> str:
    body = prompt.strip()[2:].strip()
    return body.split("+")[0].strip() if task_of(prompt) == "A" else body


def truth_from_dict(task: str, d: dict | str | None) -> PolicyTruth | EnvTruth | Puzzle | None:
    if d is None:
        return None
    if isinstance(d, str):
        d = json.loads(d)
    if task == "P":
        return Puzzle.from_dict(d) if "solutions" in d else PolicyTruth.from_dict(d)
    return EnvTruth.from_dict(d)


def _shape(q: float, shaping: str, correct: bool, valid: bool) -> float:
    """linear: q. graduated: 5 levels 0.2 .. 1.0, where 1.0 needs q = 1 (every component right).
    binary: 1 for a correct answer in valid format, else 0."""
    if shaping == "linear":
        return q
    if shaping == "binary":
        return 1.0 if correct and valid else 0.0
    if q >= 1.0 - 1e-9:
        return 1.0
    return min(0.8, max(0.2, math.ceil(q * 5 - 1e-9) / 5))


def _weighted(components: dict[str, float], weights: dict[str, float]) -> float:
    total_w = sum(weights.get(k, 0.0) for k in components)
    return sum(weights.get(k, 0.0) * v for k, v in components.items()) / total_w


def _clip_eval(x: float) -> float:
    return max(-EVAL_CLIP, min(EVAL_CLIP, x))


class RewardScorer:
    """Scores completions of both tasks and puzzles.

    The P: quality of a legal B: outside the sample's candidates needs that move's eval: with an
    engine it is searched (and cached); without one it is bounded by the lowest candidate eval (a
    move outside Stockfish's top 5 is no better than its 5th), and the result's notes say so. A P:
    prompt without a truth needs the engine for the whole analysis.
    """

    def __init__(self, config: RewardConfig | None = None, engine: "StockfishPool | None" = None) -> None:
        self.config = config or RewardConfig()
        self.config.validate()
        self.engine = engine

    # -- truth -----------------------------------------------------------------------------
    def truth_for(self, prompt: str) -> PolicyTruth | EnvTruth:
        """Compute the truth of a prompt: python-chess for A:, the engine for P:."""
        task = task_of(prompt)
        if task == "A":
            fen, move, history = prompt.strip()[2:].strip()[:-1].split("+")
            hist = history.split()
            return env_task.transition(fen.strip(), move.strip(), hist[:-1])
        fen = fen_of_prompt(prompt)
        analysis = self._engine().analyse(fen)
        return PolicyTruth(fen, analysis.moves, analysis.evals, best_of(analysis.moves, analysis.evals))

    def _engine(self) -> "StockfishPool":
        if self.engine is None:
            raise RuntimeError(
                "this P: sample carries no truth and no Stockfish pool was given to RewardScorer; "
                "pass engine=StockfishPool(...) (Stockfish: apt-get install stockfish, or set STOCKFISH_PATH), "
                "or give each sample its truth (never a stub)")
        return self.engine

    # -- scoring ---------------------------------------------------------------------------
    def score(self, prompt: str, completion: str, truth: Any = None,
              weights: dict[str, float] | None = None) -> RewardResult:
        task = task_of(prompt)
        truth = truth_from_dict(task, truth) if isinstance(truth, (dict, str)) else truth
        if truth is None:
            truth = self.truth_for(prompt)
        if isinstance(truth, Puzzle):
            return self._score_puzzle(completion, truth)
        if task == "P":
            return self._score_policy(completion, truth, weights or self.config.policy_weights)
        return self._score_env(completion, truth, weights or self.config.env_weights)

    def score_batch(self, prompts: Sequence[str], completions: Sequence[str], truths: Sequence[Any] | None = None,
                    weights: dict[str, dict[str, float]] | None = None) -> list[RewardResult]:
        """Score many; engine work (missing truths, moves outside the candidates) is spread over the pool."""
        truths = list(truths) if truths is not None else [None] * len(prompts)
        if not len(prompts) == len(completions) == len(truths):  # one of each a row: a shorter list is a mistake
            raise ValueError(f"score_batch: {len(prompts)} prompts, {len(completions)} completions and "
                             f"{len(truths)} truths: one of each per row")
        tasks = [task_of(p) for p in prompts]
        truths = [truth_from_dict(t, x) if isinstance(x, (dict, str)) else x for t, x in zip(tasks, truths)]
        missing = [i for i, (t, x) in enumerate(zip(tasks, truths)) if x is None and t == "P"]
        if missing:
            analyses = self._engine().analyse_many([fen_of_prompt(prompts[i]) for i in missing])
            for i, a in zip(missing, analyses):
                truths[i] = PolicyTruth(a.fen, a.moves, a.evals, best_of(a.moves, a.evals))
        if self.engine is not None:  # one batched search for legal best moves outside the candidates
            self._prefetch_move_evals(completions, truths)
        weights = weights or {}
        return [self.score(p, c, x, weights.get(t)) for p, c, x, t in zip(prompts, completions, truths, tasks)]

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], truths: Sequence[Any] | None,
                 weights: dict[str, dict[str, float]] | None = None) -> list[RewardResult]:
        """`score_batch`: a scorer is the trainer's reward function (`grpo.rollout.RewardFn`)."""
        return self.score_batch(prompts, completions, truths, weights)

    def prefetch(self, completions: Sequence[str], truths: Sequence[Any]) -> None:
        """Run now, into the engine's cache, the searches that scoring these completions will need
        (legal best moves outside their truth's candidates), so that `score_batch` finds them there:
        the trainer calls it for the rows that finish while the rest of the batch still decodes.
        `truths` are the samples' truth objects. The rewards are the same either way; without an engine
        it does nothing."""
        if self.engine is not None:
            self._prefetch_move_evals(completions, truths)

    def _prefetch_move_evals(self, completions, truths) -> None:
        """Search every legal best move outside its candidates, of every position, in one pool call."""
        pairs: set[tuple[str, str]] = set()
        for c, x in zip(completions, truths, strict=True):
            if not isinstance(x, PolicyTruth):
                continue
            best = pol_task.parse_completion(c).move
            if best and best not in x.moves and strength.is_legal(x.fen, best):
                pairs.add((x.fen, best))
        if pairs:
            self.engine.move_evals_many(sorted(pairs))

    def _move_value(self, truth: PolicyTruth, move: str, n_legal: int, notes: list[str]) -> float:
        """The eval of a legal move: the truth's, the engine's, or (no engine) the bound below."""
        if move in truth.moves:
            return truth.evals[truth.moves.index(move)]
        if self.engine is not None:
            return self.engine.move_eval(truth.fen, move)
        if len(truth.moves) >= n_legal:  # cannot happen for a complete truth; be safe
            return min(truth.evals)
        notes.append("eval of a move outside the candidates bounded by the lowest candidate (no engine)")
        return min(truth.evals)

    def _score_policy(self, completion: str, truth: PolicyTruth, weights: dict[str, float]) -> RewardResult:
        cfg = self.config
        parsed = pol_task.parse_completion(completion)
        notes = list(parsed.errors)
        best = parsed.move
        if best is None:
            comps = {k: 0.0 for k in POLICY_COMPONENTS}
            return RewardResult(cfg.malformed_penalty, comps, False, "P", notes or ["no B: move"])
        legal = strength.legal_moves(truth.fen)
        # well-formed = parses, and lists as many distinct legal candidates as the position allows (up to 5)
        complete = len(set(parsed.moves or []) & legal) >= min(5, len(legal))
        well_formed = parsed.valid and complete
        if parsed.valid and not complete:
            notes.append("fewer distinct legal candidates than the position allows")
        c: dict[str, float] = {"format": 1.0 if well_formed else 0.5, "best_legal": 1.0 if best in legal else 0.0}
        correct = best in legal and (best in truth.best or strength.mates(truth.fen, best))  # a mate found is a best move
        if best not in legal:
            notes.append(f"illegal best move {best}")
            c["quality"] = 0.0
        elif correct:
            c["quality"] = 1.0
        else:
            c["quality"] = move_quality(max(truth.evals), self._move_value(truth, best, len(legal), notes),
                                        cfg.quality_scale)
        c["candidates"] = _candidate_score(parsed.moves or [], truth, legal)
        c["evals"] = self._eval_score(parsed, truth)
        q = _weighted(c, weights)
        return RewardResult(_shape(q, cfg.shaping, correct, well_formed), c, well_formed, "P", notes, correct)

    def _eval_score(self, parsed: pol_task.PolicyParse, truth: PolicyTruth) -> float:
        """Mean over distinct written moves of 1 - |eval error| / eval_scale (moves outside the
        truth's candidates and repeats score 0), over at least as many moves as the truth has."""
        if not parsed.moves or parsed.evals is None or len(parsed.evals) != len(parsed.moves):
            return 0.0
        true = dict(zip(truth.moves, truth.evals))
        first = dict(zip(reversed(parsed.moves), reversed(parsed.evals)))  # each move's first written eval
        scores = []
        for m, e in first.items():
            if m in true:
                err = abs(_clip_eval(e) - _clip_eval(true[m]))
                scores.append(max(0.0, 1.0 - err / self.config.eval_scale) if err > 1e-9 else 1.0)
        return sum(scores) / max(len(first), len(truth.moves))

    def _score_env(self, completion: str, truth: EnvTruth, weights: dict[str, float]) -> RewardResult:
        cfg = self.config
        parsed = env_task.parse_completion(completion)
        notes = list(parsed.errors)
        if completion.count("+") != 3 or parsed.new_fen is None:
            comps = {k: 0.0 for k in ENV_COMPONENTS}
            return RewardResult(cfg.malformed_penalty, comps, False, "A", notes or ["malformed"])
        c = {"format": 1.0 if parsed.valid else 0.5}
        if parsed.new_fen == truth.new_fen:
            c["next_state"] = 1.0
        else:
            c["next_state"] = cfg.next_state_partial * env_task.change_credit(truth.fen, truth.new_fen, parsed.new_fen)
            notes.append("next state differs")
        c["reward"] = 1.0 if parsed.reward is not None and abs(parsed.reward - truth.reward) < 1e-9 else 0.0
        c["terminated"] = 1.0 if parsed.terminated == truth.terminated else 0.0
        c["truncated"] = 1.0 if parsed.truncated == truth.truncated else 0.0
        correct = parsed.valid and all(v == 1.0 for v in c.values())
        q = _weighted(c, weights)
        return RewardResult(_shape(q, cfg.shaping, correct, parsed.valid), c, parsed.valid, "A", notes, correct)

    def _score_puzzle(self, completion: str, puzzle: Puzzle) -> RewardResult:
        """A verified binary reward: 1 when B: is a solving move and the answer is well-formed."""
        parsed = pol_task.parse_completion(completion)
        notes = list(parsed.errors)
        if parsed.move is None:
            return RewardResult(self.config.malformed_penalty, {k: 0.0 for k in PUZZLE_COMPONENTS}, False, "P",
                                notes or ["no B: move"])
        solved = parsed.move in puzzle.solutions
        c = {"format": 1.0 if parsed.valid else 0.5, "solved": 1.0 if solved else 0.0}
        total = 1.0 if solved and parsed.valid else 0.0
        return RewardResult(total, c, parsed.valid, "P", notes, solved)


def move_quality(best_eval: float, move_eval: float, quality_scale: float) -> float:
    """`quality` of a legal move that is not a best move (those score 1): 1 - its expected-score loss /
    quality_scale, in [0, 0.99], so full credit comes only for a best move."""
    return min(0.99, max(0.0, 1.0 - strength.move_loss(best_eval, move_eval) / quality_scale))


def _candidate_score(written: list[str], truth: PolicyTruth, legal: set[str]) -> float:
    """Half for distinct legal moves (up to as many as the position allows, at most 5), half for
    overlap with the truth's candidates; each repeated move takes back one move's worth."""
    want = max(1, min(5, len(legal)))
    distinct = list(dict.fromkeys(written))
    good = [m for m in distinct if m in legal]
    overlap = len(set(good) & set(truth.moves)) / len(truth.moves) if truth.moves else 0.0
    repeats = len(written) - len(distinct)
    return max(0.0, min(1.0, 0.5 * min(1.0, len(good) / want) + 0.5 * overlap - repeats / want))


_DEFAULT: RewardScorer | None = None


def score(prompt: str, completion: str, truth: Any = None, engine: "StockfishPool | None" = None) -> RewardResult:
    """One entry point with default weights. Works without Stockfish when `truth` is given (a P:
    move outside the truth's candidates is then bounded, see RewardScorer); else pass `engine`."""
    global _DEFAULT
    if engine is not None:
        return RewardScorer(engine=engine).score(prompt, completion, truth)
    if _DEFAULT is None:
        _DEFAULT = RewardScorer()
    return _DEFAULT.score(prompt, completion, truth)


class TRLRewardFunction:
    """A reward function for TRL's GRPOTrainer(reward_funcs=[...]).

    TRL calls it as f(prompts=..., completions=..., **dataset_columns); the `truth` column
    (dicts or JSON strings) carries the answer. With truths it needs no Stockfish. For a dataset
    without a truth column, construct it with `engine=StockfishPool()`: Stockfish is then
    required at construction (StockfishNotFound says how to install it).
    """

    __name__ = "rookworld_reward"

    def __init__(self, scorer: RewardScorer | None = None, engine: "StockfishPool | None" = None) -> None:
        self.scorer = scorer or RewardScorer(engine=engine)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        truths = kwargs.get("truth")
        prompts = [_as_text(p) for p in prompts]
        completions = [_as_text(c) for c in completions]
        if truths is None and self.scorer.engine is None and any(task_of(p) == "P" for p in prompts):
            raise ValueError("TRLRewardFunction: the dataset has no 'truth' column and no engine was given: "
                             "add the column (rookworld data files carry it) or pass engine=StockfishPool()")
        return [r.total for r in self.scorer.score_batch(prompts, completions, truths)]


def _as_text(x: Any) -> str:
    """TRL passes plain strings, or chat-style lists of {"role", "content"} messages."""
    if isinstance(x, str):
        return x
    if isinstance(x, list) and x and isinstance(x[-1], dict):
        return str(x[-1].get("content", ""))
    return str(x)
