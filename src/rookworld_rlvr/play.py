"""Games: model against model, a random mover or Stockfish (`rookworld match A B`: `match_cli`).

Games are colour-swapped pairs from held-out opening positions; python-chess referees. A move
that cannot be read or is illegal loses the game at once (an engine that cannot move legally
cannot play). Games end by checkmate, stalemate, insufficient material, the 75-move rule,
fivefold repetition, a claimable draw (threefold, fifty moves) or a ply limit (a draw). All
games advance together: each ply, every model move of that ply is one batched generation.

The result is the score of A, the Elo difference with a 95% confidence interval (Wilson's score
interval, draws taken into its variance), how the games ended, and the games as PGN.

Also self-play for the evaluation (`selfplay_metrics`: the model against itself from the start position,
ended at its first unreadable or illegal move). Owns games, their referee and the models' moves kept beside
a match's output until it is written (model.journal); the model is reached through `model.completions`
(imported inside functions, so `rookworld --help` stays fast).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import chess
import chess.engine
import chess.pgn

from rookworld_rlvr.tables import fmt_elo
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks.environment import fen_of
from rookworld_rlvr.tasks.strength import is_legal, legal_moves
from rookworld_rlvr.verdict import score_interval


class Player(Protocol):
    name: str

    def moves(self, boards: Sequence[chess.Board]) -> list[str | None]:
        """One move (UCI) per board, or None when no move could be read; legality is the referee's job."""


class RandomPlayer:
    """A uniformly random legal mover: the floor every model must beat."""

    def __init__(self, seed: int = 0) -> None:
        self.name = "random"
        self._rng = random.Random(seed)

    def moves(self, boards: Sequence[chess.Board]) -> list[str | None]:
        return [self._rng.choice(sorted(legal_moves(b))) for b in boards]


class StockfishPlayer:
    """Stockfish at limited strength: `Skill Level` 0..20 and a depth limit per move. Every engine
    call (start, configure, each move, quit) waits at most `timeout` seconds: a hung engine is an
    error, never a match that waits forever."""

    def __init__(self, skill: int = 0, depth: int = 1, path: str | None = None, timeout: float = 30.0) -> None:
        from rookworld_rlvr.engine import engine_identity, find_stockfish

        if not 0 <= skill <= 20 or depth < 1 or not 0 < timeout < math.inf:
            raise ValueError(f"stockfish player: skill must be in 0..20, depth >= 1 and timeout finite and > 0, got "
                             f"{skill}, {depth}, {timeout}")
        self.name = f"stockfish:{skill}:{depth}"
        path = find_stockfish(path)
        engine_identity(path, timeout)  # a program that is no UCI engine is said by name (StockfishNotFound)
        self._engine = chess.engine.SimpleEngine.popen_uci(path, timeout=timeout)
        try:
            self._engine.configure({"Skill Level": skill, "Threads": 1, "Hash": 16})
        except BaseException:
            self.close()
            raise
        # python-chess bounds a call's wait only when the limit has a time: a search stops at `depth` long
        # before `timeout`, and a hung engine is given up after twice that
        self._limit = chess.engine.Limit(depth=depth, time=timeout)

    def moves(self, boards: Sequence[chess.Board]) -> list[str | None]:
        return [self._engine.play(b, self._limit).move.uci() for b in boards]

    def close(self) -> None:
        """Quit the engine, or kill it when it does not answer; safe to call twice."""
        try:
            self._engine.quit()
        except Exception:  # noqa: BLE001 - a hung or dead engine: kill it below
            pass
        self._engine.close()


class ModelPlayer:
    """A chess LM answering `P:` prompts; its move is the `B:` of the answer (greedy by default;
    `legal_moves`: decoded among legal moves only, see legal_decoding)."""

    def __init__(self, model, tokenizer, name: str, layout: str = "compact", temperature: float = 0.0,
                 seed: int = 0, max_new_tokens: int = 120, batch_size: int = 64, legal_moves: bool = False,
                 journal=None) -> None:
        from rookworld_rlvr.legal_decoding import LegalMoveDecoding
        from rookworld_rlvr.model.completions import Completer, sampling

        self.name, self.journal = name, journal
        # journal (model.journal): greedy answers of a match stopped part way, read back instead of computed again
        self._gen = Completer(model, tokenizer, max_new_tokens, batch_size,
                              LegalMoveDecoding(tokenizer) if legal_moves else None, journal=journal)
        self._sampling = sampling(temperature, seed)
        self.layout = layout

    def answers(self, boards: Sequence[chess.Board]) -> list[pol_task.PolicyParse]:
        return answers(self._gen, boards, self.layout, self._sampling)

    def moves(self, boards: Sequence[chess.Board]) -> list[str | None]:
        return [p.move for p in self.answers(boards)]


def answers(gen, boards: Sequence[chess.Board], layout: str, sampling: dict) -> list[pol_task.PolicyParse]:
    """The model's parsed P: answers for the boards, one batched generation (`gen`: a Completer)."""
    texts, _ = gen.run([pol_task.prompt(fen_of(b), layout) for b in boards], **sampling)
    return [pol_task.parse_completion(t) for t in texts]


@dataclass
class Game:
    white: str
    black: str
    opening: str
    board: chess.Board
    result: str = "*"  # 1-0, 0-1, 1/2-1/2
    termination: str = ""

    def pgn(self) -> str:
        game = chess.pgn.Game.from_board(self.board)
        game.headers.update({"Event": "rookworld match", "White": self.white, "Black": self.black,
                             "Result": self.result, "Termination": self.termination})
        return str(game)


@dataclass
class MatchResult:
    a: str
    b: str
    games: list[Game] = field(default_factory=list)

    def scores(self) -> list[float]:
        """A's score in each game."""
        out = []
        for g in self.games:
            a_white = g.white == self.a
            out.append({"1-0": 1.0 if a_white else 0.0, "0-1": 0.0 if a_white else 1.0}.get(g.result, 0.5))
        return out

    def summary(self) -> dict[str, Any]:
        scores = self.scores()
        s = sum(scores) / len(scores)
        wins, draws = scores.count(1.0), scores.count(0.5)
        ends: dict[str, int] = {}
        for g in self.games:
            ends[g.termination] = ends.get(g.termination, 0) + 1
        elo, lo, hi = elo_interval(scores)
        plies = [len(g.board.move_stack) for g in self.games]
        return {"a": self.a, "b": self.b, "games": len(scores), "score": s, "wins": wins, "draws": draws,
                "losses": len(scores) - wins - draws, "elo": elo, "elo_low": lo, "elo_high": hi,
                "mean_plies": sum(plies) / len(plies), "terminations": dict(sorted(ends.items()))}


def elo_of(score: float) -> float:
    """Elo difference for an expected score in (0, 1)."""
    return -400.0 * math.log10(1.0 / score - 1.0)


def elo_interval(scores: Sequence[float]) -> tuple[float, float, float]:
    """Elo difference and its 95% interval from per-game scores (1, 1/2, 0): the score interval of
    `verdict.score_interval`, Wilson's with the draws' share of the variance taken out. A score of 0
    or 1 is moved half a game inward so the Elo stays finite."""
    n = len(scores)
    if n == 0:
        raise ValueError("no games")
    mean = sum(scores) / n
    low, high = score_interval(mean, sum(1 for x in scores if x == 0.5) / n, n)
    edge = 0.5 / n

    def clamp(x: float) -> float:
        return min(1.0 - edge, max(edge, x))

    return elo_of(clamp(mean)), elo_of(clamp(low)), elo_of(clamp(high))


def _ended(board: chess.Board, max_plies: int, start_plies: int) -> tuple[str, str] | None:
    outcome = board.outcome(claim_draw=True)
    if outcome is not None:
        return outcome.result(), outcome.termination.name.lower()
    if len(board.move_stack) - start_plies >= max_plies:
        return "1/2-1/2", "max_plies"
    return None


def play_match(a: Player, b: Player, openings: Sequence[str], max_plies: int = 300, progress: bool = False,
               on_game_end: Callable[[Game], None] | None = None, both_colours: bool = True) -> MatchResult:
    """Two games per opening, A with white in the first (`both_colours` False: that one alone; a greedy model
    against itself would repeat it move for move); every game to its end. `on_game_end` is called with each
    game as it ends (the command writes its PGN then, so a crash later loses none)."""
    from rookworld_rlvr.progress import bar as progress_bar

    if a.name == b.name:
        raise ValueError(f"both players are named {a.name!r}: give them different names")
    result = MatchResult(a.name, b.name)
    for fen in openings:
        for white, black in ((a, b), (b, a)) if both_colours else ((a, b),):
            result.games.append(Game(white.name, black.name, fen, chess.Board(fen)))
    players = {a.name: a, b.name: b}
    starts = [len(g.board.move_stack) for g in result.games]
    live = list(range(len(result.games)))
    with progress_bar(total=len(live), desc=f"{a.name} vs {b.name}", unit="game", enabled=progress) as bar:
        while live:
            for name, player in players.items():
                turn = [i for i in live if not result.games[i].termination and
                        (result.games[i].white if result.games[i].board.turn else result.games[i].black) == name]
                if not turn:
                    continue
                for i, move in zip(turn, player.moves([result.games[i].board for i in turn]), strict=True):
                    g = result.games[i]
                    if not is_legal(g.board, move):
                        g.result = "0-1" if g.board.turn == chess.WHITE else "1-0"
                        g.termination = "illegal_move" if move is not None else "no_move"
                    else:
                        g.board.push_uci(move)
                        if end := _ended(g.board, max_plies, starts[i]):
                            g.result, g.termination = end
                    if g.termination:
                        bar.update(1)
                        if on_game_end is not None:
                            on_game_end(g)
            live = [i for i in live if not result.games[i].termination]
    return result


def selfplay_metrics(gen, games: int, max_plies: int, layout: str = "compact", sampling: dict | None = None,
                     progress: bool = False) -> dict:
    """The model plays both sides from the start position; python-chess referees.

    A game ends at the first unparseable or illegal B: move (other P: sections are not
    required), when the game is over (checkmate, stalemate, insufficient material,
    fivefold repetition, 75-move rule) or after `max_plies`. All games advance together,
    one batched generation per ply (`gen`: a `model.completions.Completer`; `sampling`: its
    settings, greedy by default).
    """
    from rookworld_rlvr.progress import bar as progress_bar

    boards = [chess.Board() for _ in range(games)]
    ended = {"illegal": 0, "game_over": 0, "max_plies": 0}
    alive = list(range(games))
    with progress_bar(total=max_plies, desc="self-play", unit="ply", enabled=progress, leave=False) as bar:
        for _ in range(max_plies):
            over = [g for g in alive if boards[g].is_game_over()]
            ended["game_over"] += len(over)
            alive = [g for g in alive if g not in over]
            if not alive:
                break
            still = []
            for g, answer in zip(alive, answers(gen, [boards[g] for g in alive], layout, sampling or {})):
                if not is_legal(boards[g], answer.move):
                    ended["illegal"] += 1
                else:
                    boards[g].push_uci(answer.move)
                    still.append(g)
            alive = still
            bar.update(1)
    ended["game_over"] += sum(boards[g].is_game_over() for g in alive)
    ended["max_plies"] += sum(not boards[g].is_game_over() for g in alive)
    plies = [len(b.move_stack) for b in boards]
    return {"games": games, "mean_legal_half_moves": sum(plies) / len(plies) if plies else None,
            "max_legal_half_moves": max(plies, default=None),
            **{f"ended_{k}": v for k, v in ended.items()}}


def read_openings(path: str | Path, limit: int | None = None) -> list[str]:
    """FENs, one per line ('#' comments allowed); each must be a legal position with a move."""
    from rookworld_rlvr.data.io import DataError, text_lines

    out = []
    for lineno, fen in text_lines(path):
        try:
            board = chess.Board(fen)
        except ValueError as e:
            raise DataError(f"{path}:{lineno}: bad FEN {fen!r}: {e}") from None
        if not board.is_valid() or not any(board.legal_moves):
            raise DataError(f"{path}:{lineno}: {fen!r} is not a position with a legal move")
        out.append(fen)
    return out[:limit] if limit else out


def format_summary(s: dict) -> str:
    ends = ", ".join(f"{k} {v}" for k, v in s["terminations"].items())
    return (f"{s['a']} vs {s['b']}: {s['games']} games, +{s['wins']} ={s['draws']} -{s['losses']}, "
            f"score {s['score']:.3f}, {fmt_elo(s)}, {s['mean_plies']:.1f} plies per game\nended by: {ends}")
