"""`A:` samples whose move is a near miss: the illegal moves a model that half knows the rules writes.

The base's illegal best moves are mostly of three kinds (`tasks.strength.illegal_kind`): the king is
left in check, a piece is in the way, or the move lands on an own piece. The `A:` task already has
an answer for an illegal move (the board unchanged, reward -1, truncated), but upstream's illegal
rows are few and far from these. This builds them from the `A:` positions of a training set,
keeping each position's game history, so the environment task sees the attacks and blocked lines
that the policy gets wrong.

Owns the near-miss moves and the samples built on them. Chess and files only: imports no torch and
nothing of the model or trainer.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Iterable

import chess

from rookworld_rlvr.data.io import DataError, Sample
from rookworld_rlvr.tasks.environment import EnvTruth, transition

KINDS = ("check", "blocked", "own_piece")


def near_misses(fen: str) -> dict[str, list[str]]:
    """The side to move's illegal moves that the piece could make on an empty board, by kind:
    check (the king is left in check), blocked (exactly one piece in the way, or a pawn capturing
    onto an empty square or pushing into a piece), own_piece (it lands on an own piece).

    A slider running through several pieces is left out: nobody's near miss. Pawns that reach the
    last rank promote to a queen, so no move is illegal for its promotion alone."""
    board = chess.Board(fen)
    found: dict[str, list[str]] = {k: [] for k in KINDS}
    for square in chess.SquareSet(board.occupied_co[board.turn]):
        piece = board.piece_at(square)
        alone = chess.Board(None)
        alone.set_piece_at(square, piece)
        alone.turn = board.turn
        reach = {m.to_square for m in alone.pseudo_legal_moves}
        if piece.piece_type == chess.PAWN:
            reach |= set(alone.attacks(square))
        for to in sorted(reach):
            last = chess.square_rank(to) in (0, 7) and piece.piece_type == chess.PAWN
            move = chess.Move(square, to, chess.QUEEN if last else None)
            if board.is_legal(move):
                continue
            target = board.piece_at(to)
            if target is not None and target.color == board.turn:
                kind = "own_piece"
            elif board.is_pseudo_legal(move):
                kind = "check"
            else:
                between = chess.SquareSet(chess.between(square, to)) & board.occupied
                if piece.piece_type != chess.PAWN and len(between) != 1:
                    continue
                kind = "blocked"
            found[kind].append(move.uci())
    return {k: v for k, v in found.items() if v}


def near_miss_samples(samples: Iterable[Sample], n: int, seed: int = 0) -> tuple[list[Sample], Counter]:
    """Up to `n` `A:` samples, one per `A:` position of `samples` (legal-move rows, taken in a seeded
    random order): a kind drawn uniformly among those the position has, then a move of that kind.
    The previous moves of the row's history are kept. Returns the samples and the count per kind."""
    if n < 1:
        raise ValueError(f"near misses: n must be >= 1, got {n}")
    rows = [s for s in samples if s.task == "A" and isinstance(s.truth, EnvTruth) and not s.truth.truncated]
    if not rows:
        raise DataError("near misses: the source has no A: samples with a legal move to start from")
    rng = random.Random(seed)
    rng.shuffle(rows)
    made: list[Sample] = []
    kinds: Counter = Counter()
    for s in rows:
        if len(made) == n:
            break
        found = near_misses(s.truth.fen)
        if not found:
            continue
        kind = rng.choice(sorted(found))
        move = rng.choice(found[kind])
        made.append(Sample("A", transition(s.truth.fen, move, s.truth.history.split()[:-1]), source="nearmiss"))
        kinds[kind] += 1
    return made, kinds


def write_near_misses(source: str | Path, out: str | Path, n: int, seed: int = 0) -> dict:
    """`rookworld data near-misses`: read `source`, write the near-miss samples to `out`."""
    from rookworld_rlvr.data.io import read_samples, write_samples

    made, kinds = near_miss_samples(read_samples(source), n, seed)
    return {"written": write_samples(out, made), "kinds": dict(sorted(kinds.items())), "out": str(out)}
