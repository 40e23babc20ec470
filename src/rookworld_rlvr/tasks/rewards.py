"""Verifiable rewards: one entry point, named components, explainable totals.

Every component scores in [0, 1]; the total is the weighted mean of the components,
shaped (`linear`, `graduated` in 5 levels 0.2..1.0, or `binary`). Output that cannot be
read at all (P: no parseable B: move; A: not four '+'-separated fields) gets the mild
`malformed_penalty` instead. A ground-truth completion scores exactly 1.0, the maximum.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import chess

from rookworld_rlvr.tasks import environment as env_task
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks.environment import EnvTruth
from rookworld_rlvr.tasks.policy import PolicyTruth, best_of

if TYPE_CHECKING:  # the engine is optional: sample truth makes it unnecessary
    from rookworld_rlvr.engine import StockfishPool

POLICY_COMPONENTS = ("format", "best_legal", "best_rank", "best_cp", "candidates", "evals")
ENV_COMPONENTS = ("format", "next_state", "reward", "terminated", "truncated")
SHAPINGS = ("linear", "graduated", "binary")
EVAL_CLIP = 20.0  # pawns; mate scores (~1000) clip here so a mate/non-mate mix-up is a large error


@dataclass
class RewardConfig:
    """How completions are scored. Weights are relative; unnamed components keep defaults."""

    policy_weights: dict[str, float] = field(default_factory=lambda: {
        "format": 0.1, "best_legal": 0.3, "best_rank": 0.15, "best_cp": 0.15, "candidates": 0.2, "evals": 0.1})
    env_weights: dict[str, float] = field(default_factory=lambda: {
        "format": 0.1, "next_state": 0.6, "reward": 0.1, "terminated": 0.1, "truncated": 0.1})
    shaping: str = "linear"  # linear | graduated | binary
    malformed_penalty: float = -0.3
    cp_scale: float = 3.0  # pawns of loss against the best move at which best_cp reaches 0
    eval_scale: float = 3.0  # pawns of eval error at which an eval scores 0
    # most next-state credit a readable but wrong FEN can earn (0 = exact or nothing); partial credit
    # is a denser signal for a weak base, and on the shipped base 0 and 0.8 ended within noise
    next_state_partial: float = 0.8

    def validate(self) -> None:
        for name, weights, known in (("policy_weights", self.policy_weights, POLICY_COMPONENTS),
                                     ("env_weights", self.env_weights, ENV_COMPONENTS)):
            unknown = set(weights) - set(known)
            if unknown:
                raise ValueError(f"reward.{name}: unknown component(s) {sorted(unknown)}; known: {list(known)}")
            if any(w < 0 or not math.isfinite(w) for w in weights.values()):
                raise ValueError(f"reward.{name}: weights must be finite and >= 0")
            if sum(weights.values()) <= 0:
                raise ValueError(f"reward.{name}: at least one weight must be positive")
        if self.shaping not in SHAPINGS:
            raise ValueError(f"reward.shaping must be one of {SHAPINGS}, got {self.shaping!r}")
        if not -1.0 <= self.malformed_penalty <= 0.0:
            raise ValueError("reward.malformed_penalty must be in [-1, 0]")
        if self.cp_scale <= 0 or self.eval_scale <= 0:
            raise ValueError("reward.cp_scale and reward.eval_scale must be > 0")
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
    correct: bool = False  # P: best move is a true best move; A: every field exact


def task_of(prompt: str) -> str:
    """'P' or 'A' from the prompt prefix."""
    head = prompt.lstrip()[:2]
    if head in ("P:", "A:"):
        return head[0]
    raise ValueError(f"prompt must start with 'P:' or 'A:', got {prompt[:20]!r}")


def fen_of_prompt(prompt: str) -> str:
    body = prompt.strip()[2:].strip()
    return body.split("+")[0].strip() if task_of(prompt) == "A" else body


def truth_from_dict(task: str, d: dict | str | None) -> PolicyTruth | EnvTruth | None:
    if d is None:
        return None
    if isinstance(d, str):
        d = json.loads(d)
    return PolicyTruth.from_dict(d) if task == "P" else EnvTruth.from_dict(d)


def _shape(q: float, shaping: str, correct: bool) -> float:
    if shaping == "linear":
        return q
    if shaping == "binary":
        return 1.0 if correct else 0.0
    return max(0.2, math.ceil(q * 5 - 1e-9) / 5)  # graduated: 0.2, 0.4, 0.6, 0.8, 1.0


def _weighted(components: dict[str, float], weights: dict[str, float]) -> float:
    total_w = sum(weights.get(k, 0.0) for k in components)
    return sum(weights.get(k, 0.0) * v for k, v in components.items()) / total_w


def _clip_eval(x: float) -> float:
    return max(-EVAL_CLIP, min(EVAL_CLIP, x))


class RewardScorer:
    """Scores completions of both tasks. Asks the engine only when the sample carries no answer."""

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
                "pass engine=StockfishPool(...) (never a stub)")
        return self.engine

    # -- scoring ---------------------------------------------------------------------------
    def score(self, prompt: str, completion: str, truth: Any = None,
              weights: dict[str, float] | None = None) -> RewardResult:
        task = task_of(prompt)
        truth = truth_from_dict(task, truth) if isinstance(truth, (dict, str)) else truth
        if truth is None:
            truth = self.truth_for(prompt)
        if task == "P":
            return self._score_policy(completion, truth, weights or self.config.policy_weights)
        return self._score_env(completion, truth, weights or self.config.env_weights)

    def score_batch(self, prompts: Sequence[str], completions: Sequence[str], truths: Sequence[Any] | None = None,
                    weights: dict[str, dict[str, float]] | None = None) -> list[RewardResult]:
        """Score many; engine work (missing truths, moves outside the top 5) is spread over the pool."""
        truths = list(truths) if truths is not None else [None] * len(prompts)
        tasks = [task_of(p) for p in prompts]
        truths = [truth_from_dict(t, x) if isinstance(x, (dict, str)) else x for t, x in zip(tasks, truths)]
        missing = [i for i, (t, x) in enumerate(zip(tasks, truths)) if x is None and t == "P"]
        if missing:
            analyses = self._engine().analyse_many([fen_of_prompt(prompts[i]) for i in missing])
            for i, a in zip(missing, analyses):
                truths[i] = PolicyTruth(a.fen, a.moves, a.evals, best_of(a.moves, a.evals))
        if self.engine is not None:  # prefetch move evals for legal best moves outside the candidates
            self._prefetch_move_evals(tasks, completions, truths)
        weights = weights or {}
        return [self.score(p, c, x, weights.get(t)) for p, c, x, t in zip(prompts, completions, truths, tasks)]

    def _prefetch_move_evals(self, tasks, completions, truths) -> None:
        by_fen: dict[str, set[str]] = {}
        for t, c, x in zip(tasks, completions, truths):
            if t != "P":
                continue
            best = pol_task.parse_completion(c).best
            if best and best not in x.moves and _legal(x.fen, best):
                by_fen.setdefault(x.fen, set()).add(best)
        for fen, moves in by_fen.items():
            self.engine.move_evals(fen, sorted(moves))

    def _score_policy(self, completion: str, truth: PolicyTruth, weights: dict[str, float]) -> RewardResult:
        cfg = self.config
        parsed = pol_task.parse_completion(completion)
        notes = list(parsed.errors)
        if parsed.best is None or not pol_task.UCI_RE.match(parsed.best):
            comps = {k: 0.0 for k in POLICY_COMPONENTS}
            return RewardResult(cfg.malformed_penalty, comps, False, "P", notes or ["no B: move"])
        board = chess.Board(truth.fen)
        legal = {m.uci() for m in board.legal_moves}
        c: dict[str, float] = {"format": 1.0 if parsed.valid else 0.5}
        best = parsed.best
        c["best_legal"] = 1.0 if best in legal else 0.0
        correct = best in truth.best
        if best not in legal:
            notes.append(f"illegal best move {best}")
            c["best_rank"] = c["best_cp"] = 0.0
        else:
            ranked = sorted(zip(truth.evals, truth.moves), key=lambda t: -t[0])
            order = [m for _, m in ranked]
            top = ranked[0][0] if ranked else 0.0
            if correct:
                c["best_rank"], c["best_cp"] = 1.0, 1.0
            else:
                c["best_rank"] = (1.0 - order.index(best) / 5) if best in order else 0.0
                if best in truth.moves:
                    value = truth.evals[truth.moves.index(best)]
                else:
                    value = self._engine().move_eval(truth.fen, best)
                loss = max(0.0, _clip_eval(top) - _clip_eval(value))
                c["best_cp"] = max(0.0, 1.0 - loss / cfg.cp_scale)
                c["best_cp"] = min(c["best_cp"], 0.99)  # only a true best move earns full credit
        gen = list(dict.fromkeys(parsed.moves or []))
        if gen and truth.moves:
            legal_share = sum(m in legal for m in gen) / len(gen)
            overlap = len(set(gen) & set(truth.moves)) / len(truth.moves)
            extra = max(0, len(parsed.moves or []) - len(truth.moves))  # duplicates / too many
            c["candidates"] = max(0.0, 0.5 * legal_share + 0.5 * overlap - 0.1 * extra)
        else:
            c["candidates"] = 0.0
        c["evals"] = self._eval_score(parsed, truth)
        q = _weighted(c, weights)
        return RewardResult(_shape(q, cfg.shaping, correct), c, parsed.valid, "P", notes, correct)

    def _eval_score(self, parsed: pol_task.PolicyParse, truth: PolicyTruth) -> float:
        """Mean over written (move, eval) pairs of 1 - |error| / eval_scale; unknown moves score 0."""
        if not parsed.moves or parsed.evals is None or len(parsed.evals) != len(parsed.moves):
            return 0.0
        true = dict(zip(truth.moves, truth.evals))
        scores = []
        for m, e in zip(parsed.moves, parsed.evals):
            if m in true:
                err = abs(_clip_eval(e) - _clip_eval(true[m]))
                scores.append(max(0.0, 1.0 - err / self.config.eval_scale) if err > 1e-9 else 1.0)
            else:
                scores.append(0.0)
        return sum(scores) / max(len(scores), len(truth.moves))

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
            partial = 0.5 * env_task.fen_field_match(parsed.new_fen, truth.new_fen) + \
                0.5 * env_task.fen_similarity(parsed.new_fen, truth.new_fen)
            c["next_state"] = cfg.next_state_partial * partial
            notes.append("next state differs")
        c["reward"] = 1.0 if parsed.reward is not None and abs(parsed.reward - truth.reward) < 1e-9 else 0.0
        c["terminated"] = 1.0 if parsed.terminated == truth.terminated else 0.0
        c["truncated"] = 1.0 if parsed.truncated == truth.truncated else 0.0
        correct = parsed.valid and all(v == 1.0 for v in c.values())
        q = _weighted(c, weights)
        return RewardResult(_shape(q, cfg.shaping, correct), c, parsed.valid, "A", notes, correct)


def _legal(fen: str, move: str) -> bool:
    try:
        return chess.Move.from_uci(move) in chess.Board(fen).legal_moves
    except ValueError:
        return False


_DEFAULT: RewardScorer | None = None


def score(prompt: str, completion: str, truth: Any = None, engine: "StockfishPool | None" = None) -> RewardResult:
    """One entry point with default weights. Truth carried by a sample is used; else the engine is asked."""
    global _DEFAULT
    if engine is not None:
        return RewardScorer(engine=engine).score(prompt, completion, truth)
    if _DEFAULT is None:
        _DEFAULT = RewardScorer()
    return _DEFAULT.score(prompt, completion, truth)


class TRLRewardFunction:
    """A reward function for TRL's GRPOTrainer(reward_funcs=[...]).

    TRL calls it as f(prompts=..., completions=..., **dataset_columns); the `truth` column
    (dicts or JSON strings) carries the answer, else the engine is asked.
    """

    __name__ = "rookworld_reward"

    def __init__(self, scorer: RewardScorer | None = None) -> None:
        self.scorer = scorer or RewardScorer()

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        truths = kwargs.get("truth")
        prompts = [_as_text(p) for p in prompts]
        completions = [_as_text(c) for c in completions]
        return [r.total for r in self.scorer.score_batch(prompts, completions, truths)]


def _as_text(x: Any) -> str:
    """TRL passes plain strings, or chat-style lists of {"role", "content"} messages."""
    if isinstance(x, str):
        return x
    if isinstance(x, list) and x and isinstance(x[-1], dict):
        return str(x[-1].get("content", ""))
    return str(x)
