"""Judging moves: legality, mates, best moves, and playing strength (win probability, move loss,
accuracy, puzzles).

Owns the one legal-move check (`legal_moves`, `is_legal`), the mate check (`mates`) and the best
moves of a list of evals (`best_of`); every other module asks here. Chess only: imports no torch
and nothing of the model, trainer or engine. Evals are pawns for the side to move, mate-aware as in the `E:` column
(mate in n = (100000 - n) / 100). A move's quality is the drop in the mover's expected score:
`loss = win_prob(best) - win_prob(move)`, with Lichess's logistic model of the engine score,
win% = 50 + 50 * (2 / (1 + exp(-0.00368208 * cp)) - 1), i.e. 1 / (1 + exp(-0.00368208 * cp)).
A loss of 0.2 (20 points of expected score) or more is a blunder; Lichess turns the loss into a
per-move accuracy, 103.1668 * exp(-0.04354 * loss%) - 3.1669.

A `JudgedPosition` carries every legal move's eval from one Stockfish search, so any answer is
judged without an engine, and so is the floor every figure is shown against: a uniformly random
legal move on the same positions (its expectation is exact, over all legal moves).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Iterable, Sequence

import chess

WP_SLOPE = 0.00368208  # per centipawn (Lichess)
BLUNDER = 0.2  # expected-score loss from which a move is a blunder
NEAR_BEST = 0.05  # a tactic's solving moves lose at most this much
TACTIC_WIN = 0.7  # a tactic's best move keeps at least this expected score
TACTIC_MARGIN = 0.3  # and every move that does not solve it loses at least this much
EVAL_CAP = 1000.0  # pawns; mate scores sit at the ends of this range


def win_prob(pawns: float) -> float:
    """Expected score of the side to move for an eval in pawns (mates map to ~0 or ~1)."""
    cp = max(-EVAL_CAP, min(EVAL_CAP, pawns)) * 100.0
    return 1.0 / (1.0 + math.exp(-WP_SLOPE * cp))


def move_loss(best: float, move: float) -> float:
    """Expected score lost by playing a move of eval `move` where the best move has eval `best`."""
    return max(0.0, win_prob(best) - win_prob(move))


def accuracy(loss: float) -> float:
    """Lichess per-move accuracy in percent (100 for a best move) from an expected-score loss."""
    return max(0.0, min(100.0, 103.1668 * math.exp(-0.04354 * loss * 100.0) - 3.1669))


def legal_moves(position: str | chess.Board) -> set[str]:
    """The legal moves of a position (a FEN or a board) in UCI; empty for an unreadable FEN."""
    if isinstance(position, str):
        try:
            position = chess.Board(position)
        except ValueError:
            return set()
    return {m.uci() for m in position.legal_moves}


def is_legal(position: str | chess.Board, move: str | None) -> bool:
    """Whether `move` (UCI text, possibly malformed or None) is a legal move of the position."""
    return move is not None and move in legal_moves(position)


ILLEGAL_KINDS = ("unreadable", "no_piece", "own_piece", "geometry", "blocked", "castling", "promotion", "check")


def illegal_kind(fen: str, move: str | None) -> str | None:
    """Why a move is illegal in a position, or None for a legal one: what a model still gets wrong.

    unreadable (not a UCI move), no_piece (the from-square holds no piece of the side to move),
    own_piece (the to-square holds one), geometry (the piece cannot move that way even on an empty
    board), blocked (it could on an empty board: a piece in the way, or a pawn capture onto an empty
    square), castling (no right, a piece between, or through check), promotion (a missing or
    needless promotion piece), check (otherwise fine, but the king is left in check)."""
    board = chess.Board(fen)
    try:
        m = chess.Move.from_uci(move or "")
    except ValueError:
        return "unreadable"
    if not m:  # the null move 0000
        return "unreadable"
    if board.is_legal(m):
        return None
    piece = board.piece_at(m.from_square)
    if piece is None or piece.color != board.turn:
        return "no_piece"
    target = board.piece_at(m.to_square)
    if target is not None and target.color == board.turn:
        return "own_piece"
    if board.is_pseudo_legal(m):
        return "check"
    rank, file = chess.square_rank, chess.square_file
    if (piece.piece_type == chess.KING and rank(m.from_square) == rank(m.to_square)
            and abs(file(m.from_square) - file(m.to_square)) == 2):
        return "castling"
    alone = chess.Board(None)
    alone.set_piece_at(m.from_square, piece)
    alone.turn = board.turn
    reach = {x.to_square for x in alone.pseudo_legal_moves}
    if piece.piece_type == chess.PAWN:
        reach |= set(alone.attacks(m.from_square))  # its captures, with something to capture
    if m.to_square not in reach:
        return "geometry"
    last = rank(m.to_square) in (0, 7) and piece.piece_type == chess.PAWN
    if last != bool(m.promotion) or (m.promotion in (chess.PAWN, chess.KING)):
        return "promotion"
    return "blocked"


def mates(fen: str, move: str) -> bool:
    """Whether the legal move `move` checkmates at once."""
    board = chess.Board(fen)
    board.push_uci(move)
    return board.is_checkmate()


def mating_moves(position: str | chess.Board, moves: Iterable[chess.Move] | None = None) -> list[str]:
    """Every move that checkmates at once (among `moves`, default every legal move), sorted. Only a move
    that may give check (`_checking_squares`) is played out: this runs on every training position (`data
    judge`) and every puzzle read (their solutions are checked), and reading the GPU recipe's 19,576 mates
    took 7.7 s on 2 CPU cores playing every legal move, 3.9 s so."""
    if isinstance(position, str):
        try:
            position = chess.Board(position)
        except ValueError:
            return []
    board, found = position.copy(stack=False), []
    uncover, reach = _checking_squares(board)
    for move in board.legal_moves if moves is None else moves:
        if (chess.BB_SQUARES[move.from_square] & uncover or move.promotion
                or reach[board.piece_type_at(move.from_square)] & chess.BB_SQUARES[move.to_square]):
            board.push(move)
            if board.is_checkmate():
                found.append(move.uci())
            board.pop()
    return sorted(found)


def _checking_squares(board: chess.Board) -> tuple[int, dict[int, int]]:
    """Where a move of the side to move may give check, by bitboards that ignore what blocks a line: the
    squares it may uncover a slider of its own from (between the other king and such a slider on its line),
    and, for each piece type, the squares from which that piece attacks the king. A move neither from an
    uncovering square nor to a reaching one gives no check. Castling and en passant move a second piece, so
    every move of a king on its back rank while castling rights remain, and every pawn move where en
    passant is possible, counts as uncovering; so does every move where the other king is missing."""
    king = board.king(not board.turn)
    if king is None:
        return chess.BB_ALL, {}
    diagonals = chess.BB_DIAG_ATTACKS[king][0]  # a bishop's and a rook's reach from the king on an empty board
    lines = chess.BB_RANK_ATTACKS[king][0] | chess.BB_FILE_ATTACKS[king][0]
    ours = board.occupied_co[board.turn]
    uncover = board.kings & ours & (chess.BB_RANK_1 | chess.BB_RANK_8) if board.castling_rights else 0
    if board.ep_square is not None:
        uncover |= board.pawns & ours
    for slider in chess.scan_forward(((board.bishops | board.queens) & ours & diagonals)
                                     | ((board.rooks | board.queens) & ours & lines)):
        uncover |= chess.between(king, slider)
    return uncover, {chess.PAWN: chess.BB_PAWN_ATTACKS[not board.turn][king], chess.KING: 0,
                     chess.KNIGHT: chess.BB_KNIGHT_ATTACKS[king], chess.BISHOP: diagonals, chess.ROOK: lines,
                     chess.QUEEN: diagonals | lines}


def best_of(moves: Sequence[str], evals: Sequence[float]) -> tuple[str, ...]:
    """All moves whose eval equals the maximum (relative to the side to move): each is a best move."""
    if not moves:
        return ()
    top = max(evals)
    return tuple(m for m, e in zip(moves, evals) if e == top)


@dataclass(frozen=True)
class JudgedPosition:
    """A position and every legal move's eval (pawns, mover's view), from one engine search."""

    fen: str
    evals: dict[str, float]

    @property
    def best_eval(self) -> float:
        return max(self.evals.values())

    def loss(self, move: str) -> float:
        return move_loss(self.best_eval, self.evals[move])

    def best_moves(self) -> tuple[str, ...]:
        return best_of(tuple(self.evals), tuple(self.evals.values()))

    def top(self, k: int = 5) -> tuple[str, ...]:
        """The k best moves (ties in stored order)."""
        return tuple(sorted(self.evals, key=lambda m: -self.evals[m])[:k])

    def to_dict(self) -> dict:
        return {"fen": self.fen, "evals": dict(self.evals)}

    @classmethod
    def from_dict(cls, d: dict) -> "JudgedPosition":
        evals = d["evals"]
        if not isinstance(evals, dict) or not all(isinstance(e, (int, float)) and not isinstance(e, bool)
                                                  and math.isfinite(e) for e in evals.values()):
            raise ValueError(f"field 'evals' must map each legal move to a finite number, got {evals!r}"[:160])
        evals = {m: float(e) for m, e in evals.items()}
        _check_fen(d["fen"])
        legal = legal_moves(d["fen"])
        if not legal or set(evals) != legal:
            raise ValueError(f"'evals' must hold exactly the {len(legal)} legal moves of {d['fen']!r} "
                             f"(missing {sorted(legal - set(evals))[:3]}, extra {sorted(set(evals) - legal)[:3]})")
        return cls(d["fen"], evals)


def _check_fen(fen) -> chess.Board:
    """The board of a row's 'fen', or ValueError naming the field."""
    if not isinstance(fen, str):
        raise ValueError(f"field 'fen' must be a string (a FEN), got {fen!r}"[:160])
    try:
        return chess.Board(fen)
    except (ValueError, TypeError) as e:
        raise ValueError(f"field 'fen' {fen!r} is not a position ({e})") from None


@dataclass(frozen=True)
class Puzzle:
    """A position with the moves that solve it: `mate1` (every mating move), `tactic` (the
    moves that keep a decisive win that every other move throws away, by Stockfish) or `check`
    (the side to move is in check and every legal move solves it: a legality test, where a
    random legal mover always succeeds)."""

    fen: str
    solutions: tuple[str, ...]
    kind: str  # mate1 | tactic | check

    def to_dict(self) -> dict:
        return {"fen": self.fen, "solutions": list(self.solutions), "kind": self.kind}

    @classmethod
    def from_dict(cls, d: dict) -> "Puzzle":
        kind = d.get("kind")
        if kind not in PUZZLE_KINDS:
            raise ValueError(f"field 'kind' must be one of {PUZZLE_KINDS}, got {kind!r}")
        fen, solutions = d["fen"], d["solutions"]
        if not isinstance(solutions, (list, tuple)) or not all(isinstance(m, str) for m in solutions):
            raise ValueError(f"field 'solutions' must be a list of moves, got {solutions!r}"[:160])
        solutions = tuple(solutions)
        board = _check_fen(fen)
        moves = list(board.legal_moves)
        legal = {m.uci() for m in moves}
        if not solutions or not set(solutions) <= legal:
            raise ValueError(f"field 'solutions' must be legal moves of {fen!r}, got {list(solutions)}")
        if kind == "mate1" and set(solutions) != set(mates := mating_moves(board, moves)):
            raise ValueError(f"field 'solutions' must be every mating move of {fen!r}: {mates}")
        if kind == "check" and (not board.is_check() or set(solutions) != legal):
            raise ValueError(f"a check puzzle's side to move must be in check and its 'solutions' every legal move "
                             f"of {fen!r}")
        return cls(fen, solutions, kind)


PUZZLE_KINDS = ("mate1", "tactic", "check")


def in_check(fen: str) -> bool:
    """The side to move is in check."""
    return chess.Board(fen).is_check()


def king_can_step_into_check(fen: str) -> bool:
    """Out of check, and a king move (castling aside) would step into check: where GRPO on positions
    in check costs legality, since it teaches the policy to move its king more."""
    board = chess.Board(fen)
    if board.is_check():
        return False
    king = board.king(board.turn)
    return any(m.from_square == king and not board.is_castling(m) and not board.is_legal(m)
               for m in board.generate_pseudo_legal_moves())


def check_puzzle(fen: str) -> Puzzle | None:
    """A `check` puzzle when the side to move is in check and has a legal move, else None."""
    board = chess.Board(fen)
    legal = sorted(m.uci() for m in board.legal_moves)
    return Puzzle(fen, tuple(legal), "check") if board.is_check() and legal else None


def tactic_of(pos: JudgedPosition, win: float = TACTIC_WIN, margin: float = TACTIC_MARGIN,
              max_solutions: int = 2) -> Puzzle | None:
    """A tactic when the best move keeps an expected score >= `win`, at most `max_solutions` moves
    stay within NEAR_BEST of it, and every other move loses at least `margin`."""
    if win_prob(pos.best_eval) < win:
        return None
    solving = [m for m in pos.evals if pos.loss(m) <= NEAR_BEST]
    others = [pos.loss(m) for m in pos.evals if m not in solving]
    if len(solving) > max_solutions or not others or min(others) < margin:
        return None
    return Puzzle(pos.fen, tuple(sorted(solving)), "tactic")


def could_be_tactic(evals: Sequence[float], win: float = TACTIC_WIN, margin: float = TACTIC_MARGIN,
                    slack: float = 0.15) -> bool:
    """Whether a position's best moves as the data generator recorded them (a shallower search, at most five)
    leave room for a tactic: the best keeps nearly `win` and the third best (the second, of two) loses
    nearly `margin`. A screen, not a verdict: it spares judging every legal move of positions that cannot be
    one, and `slack` lets the deeper judging search disagree a little with the shallow one."""
    if len(evals) < 2:
        return False
    best = max(evals)
    losses = sorted(move_loss(best, e) for e in evals)
    return win_prob(best) >= win - slack and losses[min(2, len(losses) - 1)] >= margin - slack


# -- metrics of answers ---------------------------------------------------------------------------


def fingerprint(keys: Iterable[str]) -> str:
    """A short digest of the items an evaluation scored, in order (`items_of`): the verdict pairs two
    evaluations' per-item outcomes only where it agrees, so that only the same items are paired."""
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _ratio_below(model: float | None, random: float | None) -> float | None:
    """How far below the random mover: 1 - model / random (0.25 = a quarter less)."""
    if model is None or not random:
        return None
    return 1.0 - model / random


def ratio_below_ci(model: Sequence[float], random_: Sequence[float], level: float = 0.95,
                   resamples: int = 1000, seed: int = 0) -> dict[str, float] | None:
    """Bootstrap interval of 1 - mean(model) / mean(random) over paired positions (percentile,
    fixed seed: the same answers always give the same interval). On 600 positions it spans 15-22
    points, wider than most differences between checkpoints of one run."""
    n = len(model)
    if n < 2:
        return None
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        below = _ratio_below(sum(model[i] for i in idx), sum(random_[i] for i in idx))  # sums: means' ratio
        if below is not None:
            stats.append(below)
    if not stats:
        return None
    stats.sort()
    tail = (1 - level) / 2
    return {"low": stats[int(tail * (len(stats) - 1))], "high": stats[int((1 - tail) * (len(stats) - 1))]}


def move_quality(positions: Sequence[JudgedPosition], moves: Sequence[str | None]) -> dict:
    """Quality of one chosen move per position, next to a uniformly random legal mover.

    `loss`, `accuracy` and `blunder` are over the positions where the move is legal, and the
    random mover's figures in `random` are over those same positions (paired); `best` and
    `legal` are over all positions (an illegal move is not best), and so is the random mover's
    `best`: over the legal ones only it would leave out the positions a model fails, often those
    with few legal moves, where chance finds the best move most often. `loss_below_random` =
    1 - loss / random loss, with a bootstrap 95% interval in `loss_below_random_ci` (likewise for
    blunders).
    """
    if len(positions) != len(moves):
        raise ValueError(f"{len(positions)} positions but {len(moves)} moves")
    legal_items = [int(m is not None and m in p.evals) for p, m in zip(positions, moves)]
    best_items = [int(m in p.best_moves()) for p, m in zip(positions, moves)]
    loss_items = [p.loss(m) if ok else None for p, m, ok in zip(positions, moves, legal_items)]
    expected = [random_expectation(p) for p in positions]
    losses = [x for x in loss_items if x is not None]
    rand = [r for r, x in zip(expected, loss_items) if x is not None]
    out = {
        "n": len(positions),
        "legal": _mean(legal_items),
        "loss": _mean(losses),
        "accuracy": _mean([accuracy(x) for x in losses]),
        "blunder": _mean([1.0 if x >= BLUNDER else 0.0 for x in losses]),
        "best": _mean(best_items),
        # per position (None: an illegal move), for a paired comparison of two evaluations of the same positions
        # (verdict); losses to 4 decimals
        "items_of": fingerprint(p.fen for p in positions),
        "legal_items": legal_items,
        "best_items": best_items,
        "loss_items": [None if x is None else round(x, 4) for x in loss_items],
        "blunder_items": [None if x is None else int(x >= BLUNDER) for x in loss_items],
        "random_loss_items": [round(r["loss"], 4) for r in expected],
        "random_blunder_items": [round(r["blunder"], 4) for r in expected],
        "random": {**{k: _mean([r[k] for r in rand]) for k in ("loss", "accuracy", "blunder")},
                   "best": _mean([r["best"] for r in expected])},
    }
    kinds = [illegal_kind(p.fen, m) for p, m in zip(positions, moves) if m is None or m not in p.evals]
    # why the illegal moves are illegal, each kind a share of all positions (they sum to 1 - legal)
    out["illegal"] = {k: sum(x == k for x in kinds) / len(positions) for k in ILLEGAL_KINDS} if positions else {}
    out["loss_below_random"] = _ratio_below(out["loss"], out["random"]["loss"])
    out["blunder_below_random"] = _ratio_below(out["blunder"], out["random"]["blunder"])
    # 95% intervals (positions resampled, model and random mover paired)
    out["loss_below_random_ci"] = ratio_below_ci(losses, [r["loss"] for r in rand])
    out["blunder_below_random_ci"] = ratio_below_ci([float(x >= BLUNDER) for x in losses], [r["blunder"] for r in rand])
    return out


def random_expectation(pos: JudgedPosition) -> dict[str, float]:
    """Exact expectation of a uniformly random legal move's loss, accuracy, blunder and best rate."""
    losses = [pos.loss(m) for m in pos.evals]
    n = len(losses)
    return {"loss": sum(losses) / n, "accuracy": sum(accuracy(x) for x in losses) / n,
            "blunder": sum(x >= BLUNDER for x in losses) / n, "best": len(pos.best_moves()) / n}


def candidate_quality(positions: Sequence[JudgedPosition], candidates: Sequence[Sequence[str] | None]) -> dict:
    """The M: lists: distinct legal moves per answer (a repeat counts once), the share of answers
    with as many distinct legal moves as the position allows (up to 5), the share with a repeated
    move, and the overlap of the distinct moves with the engine's top 5, next to 5 random legal moves."""
    distinct, full, repeated, overlap, rand_overlap = [], [], [], [], []
    for pos, cands in zip(positions, candidates, strict=True):
        cands = list(cands or [])
        legal = [m for m in dict.fromkeys(cands) if m in pos.evals]
        want = min(5, len(pos.evals))
        top = set(pos.top(want))
        distinct.append(len(legal))
        full.append(1.0 if len(legal) >= want and len(cands) == len(set(cands)) else 0.0)
        repeated.append(1.0 if len(cands) != len(set(cands)) else 0.0)
        overlap.append(len(set(legal) & top) / want)
        rand_overlap.append(want / len(pos.evals))  # each top move is among 5 random ones with this chance
    return {"distinct_legal": _mean(distinct), "all_distinct_legal": _mean(full), "repeated": _mean(repeated),
            "top5_overlap": _mean(overlap), "random": {"top5_overlap": _mean(rand_overlap)}}


def puzzle_scores(puzzles: Sequence[Puzzle], moves: Sequence[str | None]) -> dict:
    """Solve rate per puzzle kind, next to a random legal mover's (solutions / legal moves)."""
    out: dict = {}
    for kind in PUZZLE_KINDS:
        pairs = [(p, m) for p, m in zip(puzzles, moves, strict=True) if p.kind == kind]
        if not pairs:
            continue
        solved = [int(m in p.solutions) for p, m in pairs]
        out[kind] = {
            "n": len(pairs),
            "solved": _mean(solved),
            "solved_items": solved,  # per puzzle, for a paired comparison of two evaluations (verdict)
            "items_of": fingerprint(p.fen for p, _ in pairs),
            "legal": _mean([1.0 if is_legal(p.fen, m) else 0.0 for p, m in pairs]),
            "random": {"solved": _mean([len(p.solutions) / len(legal_moves(p.fen)) for p, _ in pairs])},
        }
    return out
