"""`A:` transitions of every history length, made by python-chess alone (no engine).

An environment model must simulate a game from its first move: a history of 1 move (a game
start, or a game set up from a position), 2-9 moves, and the full 10. Data generated from the
middle of games holds almost only full histories, and a model trained on it writes ten moves of
history where it was given one. Two sources fix that:
- `short_history_copies`: a transition again with its history cut to its last k moves, k in
  1 .. len - 1, as if the game had been set up k - 1 moves earlier. The answer (the next state,
  reward and flags) depends on the position and the move alone, so it is unchanged;
- `opening_transitions`: games from the start position, each ply a random legal move, every
  transition with its true history from the first move on.
Each keeps to one side of the FEN-hash split of `data generate` (`side`), so held-out sets stay
held out.

Owns making those rows. Chess and files only: imports no torch and nothing of the model.
"""

from __future__ import annotations

import random
from typing import Iterable, Iterator

import chess

from rookworld_rlvr.data.generate import is_eval_fen
from rookworld_rlvr.data.io import Sample
from rookworld_rlvr.tasks import environment as env_task

SIDES = ("train", "eval", "any")


def on_side(fen: str, side: str, permille: int = 40) -> bool:
    """Whether a position belongs to `side` of the FEN-hash split ("any": both)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    return side == "any" or is_eval_fen(fen, permille) == (side == "eval")


def cut_history(truth: env_task.EnvTruth, k: int) -> env_task.EnvTruth:
    """The same transition with only the last `k` moves of its history (the move itself last)."""
    moves = truth.history.split()
    if not 1 <= k <= len(moves):
        raise ValueError(f"k must be in 1 .. {len(moves)}, got {k}")
    return env_task.EnvTruth(truth.fen, truth.move, " ".join(moves[-k:]), truth.new_fen, truth.reward,
                             truth.terminated, truth.truncated)


def short_history_copies(samples: Iterable[Sample], share: float, rng: random.Random,
                         lengths: Iterable[int] | None = None) -> Iterator[Sample]:
    """For each A: sample with a history of 2 or more moves, with probability `share`, a copy
    whose history is cut to k moves (source "<source>-short"): k drawn uniformly from `lengths`
    where shorter than the history (default: any of 1 .. len - 1)."""
    if not 0 <= share <= 1:
        raise ValueError(f"the share of short-history copies must be in [0, 1], got {share}")
    allowed = sorted(set(lengths)) if lengths is not None else None
    if allowed is not None and (not allowed or allowed[0] < 1):
        raise ValueError(f"history lengths must be >= 1, got {allowed}")
    for s in samples:
        if s.task != "A":
            continue
        n = len(s.truth.history.split())
        choices = [k for k in allowed if k < n] if allowed is not None else list(range(1, n))
        if choices and rng.random() < share:
            yield Sample("A", cut_history(s.truth, rng.choice(choices)), f"{s.source or 'gen'}-short")


def opening_transitions(games: int, max_plies: int, seed: int, side: str = "train",
                        permille: int = 40) -> list[Sample]:
    """Every transition of `games` random games from the start position, up to `max_plies` plies
    each (drawn uniformly from 1 .. max_plies), with its true history; only positions on `side`
    of the split are kept, the start position on the training side (see `is_eval_fen`)."""
    if games < 0 or max_plies < 1:
        raise ValueError(f"opening games must be >= 0 and their plies >= 1, got {games} and {max_plies}")
    rng = random.Random(f"{seed}:openings")
    out: list[Sample] = []
    for _ in range(games):
        board, history = chess.Board(), []
        for _ in range(rng.randint(1, max_plies)):
            legal = list(board.legal_moves)
            if not legal:
                break
            move = rng.choice(legal).uci()
            fen = env_task.fen_of(board)
            if on_side(fen, side, permille):
                out.append(Sample("A", env_task.transition(fen, move, history[-9:]), "opening"))
            board.push_uci(move)
            history.append(move)
    return out
