"""Stockfish as the source of truth: a small, robust, cached analysis pool.

Rewards are only as good as their labels, so this module never fakes an
analysis: a missing binary raises, a crashed or hung engine is killed and
restarted, and a request that keeps failing raises `EngineError`.

Evals are pawns relative to the side to move, mate-aware: mate in n for the
side to move is ``(100000 - n) / 100`` (999.99 for mate in 1), being mated in
n is the negative of that, and "already mated" is -1000.0.  This is how the
``E:`` column of the P: task writes evals (`rookworld_rlvr.tasks.policy`).

Results are deterministic for a given FEN and limits when ``depth`` limits the
search and ``threads == 1``: every search starts from a cleared engine
(``ucinewgame``).  Time limits and several threads are inherently noisy.

`move_eval` is minus the (multipv 1) eval of the position after the move, so a
mating move is 1000.0 and a move that mates in n (n counted from the original
position) is ``(100000 - (n - 1)) / 100``: one hundredth above the parent's
multipv eval of the same move, because the reply position is one move closer.

Owns the pool: which processes run, retries, the cache's keys and values, the per-position requests. Talking to
one process is `engine_process`. Chess only: imports no torch and nothing of the model or trainer.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os
import queue
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import chess
import chess.engine

from rookworld_rlvr.engine_cache import AnalysisCache, EngineCacheError
from rookworld_rlvr.engine_process import (ENGINE_FAILURES, LOG, Engine, Loop, StockfishNotFound, engine_identity,
                                           find_stockfish)
from rookworld_rlvr.tasks.strength import is_legal

__all__ = [
    "Analysis",
    "EngineCacheError",
    "EngineConfig",
    "EngineError",
    "StockfishNotFound",
    "engine_identity",
    "StockfishPool",
    "find_stockfish",
    "score_to_pawns",
]

T = TypeVar("T")

MATE_SCORE = 100_000
MATING_MOVE_EVAL = MATE_SCORE / 100  # 1000.0: the move delivers mate


class EngineError(RuntimeError):
    """Analysis failed even after killing, restarting and retrying the engine."""


@dataclass(frozen=True)
class EngineConfig:
    """Search limits and pool settings; only depth/time/multipv change results."""

    path: str | None = None
    depth: int | None = 8
    time: float | None = None
    multipv: int = 5
    threads: int = 1
    hash_mb: int = 16
    workers: int = 2
    timeout: float = 30.0
    retries: int = 2
    cache_path: str | None = None

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if self.depth is None and self.time is None:
            raise ValueError("EngineConfig: at least one of depth or time must be set (both are None)")
        checks = [
            ("depth", self.depth is None or self.depth >= 1, ">= 1 or None"),
            ("time", self.time is None or 0 < self.time < math.inf, "a finite number > 0 or None"),
            ("multipv", self.multipv >= 1, ">= 1"),
            ("threads", self.threads >= 1, ">= 1"),
            ("hash_mb", self.hash_mb >= 1, ">= 1"),
            ("workers", self.workers >= 1, ">= 1"),
            ("timeout", 0 < self.timeout < math.inf, "a finite number > 0"),  # inf: a hung engine held all
            ("retries", self.retries >= 0, ">= 0"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"EngineConfig.{name} must be {rule}, got {getattr(self, name)!r}")

    def limits_key(self) -> str:
        """The part of a cache key that decides the result (not threads/hash/workers)."""
        return f"depth={self.depth};time={self.time};multipv={self.multipv}"


@dataclass(frozen=True)
class Analysis:
    """Stockfish's top moves (UCI, rank order) and their evals for one position."""

    fen: str
    moves: tuple[str, ...]
    evals: tuple[float, ...]  # its best moves: tasks.strength.best_of(moves, evals)


def score_to_pawns(score: chess.engine.Score) -> float:
    """Pawns for the side to move; mate in n -> (100000 - n) / 100, mated -> negative."""
    return round(score.score(mate_score=MATE_SCORE) / 100, 2)


def parse_board(fen: str) -> chess.Board:
    """A valid standard-chess board, or ValueError naming the FEN and what is wrong (bad FENs crash engines)."""
    try:
        board = chess.Board(fen)
    except ValueError as exc:
        raise ValueError(f"invalid FEN {fen!r}: {exc}") from None
    if not board.is_valid():
        raise ValueError(f"invalid FEN {fen!r}: not a legal position ({faults(board)})")
    return board


def faults(board: chess.Board) -> str:
    """What makes a position illegal, in words: `no white king, opposite check`."""
    return ", ".join(f.name.lower().replace("_", " ") for f in chess.Status if f and f in board.status())


def _parse_move(board: chess.Board, move: str, fen: str) -> chess.Move:
    """The legal move named by `move` (UCI), or ValueError naming move and FEN."""
    if not is_legal(board, move):
        raise ValueError(f"illegal move {move!r} in FEN {fen!r}")
    return chess.Move.from_uci(move)


def _shutdown(engines: list[Engine], loop: Loop, cache: AnalysisCache) -> None:
    """Close everything; a module function so weakref.finalize holds no pool reference."""
    for engine in engines:
        engine.kill()
    loop.stop()
    cache.close()


class StockfishPool:
    """A pool of Stockfish processes with a persistent cache; one pool per process.

    Thread-safe. Use as a context manager or call close(); it is also closed at
    interpreter exit (weakref.finalize registers with atexit).
    """

    def __init__(self, config: EngineConfig = EngineConfig()) -> None:
        config.validate()
        self.config = config
        self.path = find_stockfish(config.path)
        self._limit = chess.engine.Limit(depth=config.depth, time=config.time)
        self.identity = engine_identity(self.path, config.timeout)
        self._limits_key = f"{self.identity};{config.limits_key()}"  # another engine version answers apart
        self._cache = AnalysisCache(config.cache_path)
        self._loop = Loop()
        self._engines = [Engine(self.path, config, self._loop) for _ in range(config.workers)]
        self._idle: queue.LifoQueue[Engine] = queue.LifoQueue()  # reuse warm engines first
        for engine in self._engines:
            self._idle.put(engine)
        self._stats = {"hits": 0, "misses": 0, "restarts": 0, "engine_calls": 0}
        self._stats_lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _shutdown, self._engines, self._loop, self._cache)

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Kill all engines (no zombies) and close the cache; idempotent."""
        self._closed = True
        if os.getpid() == self._pid:
            self._finalizer()
        else:
            self._finalizer.detach()

    def __enter__(self) -> StockfishPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stats(self) -> dict[str, int]:
        """Counters: cache hits/misses, engine restarts after failures, engine searches."""
        with self._stats_lock:
            return dict(self._stats)

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self._stats[name] += n

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("StockfishPool is closed")
        if os.getpid() != self._pid:
            raise RuntimeError("StockfishPool was created in another process; build one pool per process")

    @property
    def pids(self) -> list[int]:
        """Process ids of the engines running now (engines start at their first search): for
        monitoring, and for checking that none outlives the pool."""
        return [pid for pid in (e.pid for e in self._engines) if pid is not None]

    # -- engine calls with retries ---------------------------------------------------

    def _search(self, board: chess.Board, multipv: int, fen: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """Top moves and evals from an engine; kill, restart and retry on crashes and hangs."""
        engine = self._idle.get()
        last: BaseException | None = None
        try:
            for attempt in range(self.config.retries + 1):
                self._check_open()
                try:
                    infos = engine.analyse(board, self._limit, multipv)
                    self._count("engine_calls")
                    lines = [
                        (info["pv"][0].uci(), score_to_pawns(info["score"].relative))
                        for info in infos
                        if info.get("pv") and "score" in info
                    ]
                    if not lines:
                        raise chess.engine.EngineError(f"no principal variation in {infos!r}")
                    return tuple(m for m, _ in lines), tuple(e for _, e in lines)
                except ENGINE_FAILURES as exc:
                    last = exc
                    LOG.warning("stockfish failed on %r (attempt %d): %r; restarting it", fen, attempt + 1, exc)
                    engine.kill()
                    self._count("restarts")
            raise EngineError(f"Stockfish failed on FEN {fen!r} after {self.config.retries + 1} attempts: {last!r}")
        finally:
            self._idle.put(engine)

    def _resolve(self, jobs: dict[str, Callable[[], T]], valid: Callable[[Any], bool],
                 progress: bool = False) -> dict[str, T]:
        """Values for every key: from the cache where it holds a `valid` one, else computed on the pool and stored
        at once."""
        found: dict[str, T] = {}
        misses = []
        for key in jobs:
            value = self._cache.get(key, valid)
            if value is None:
                misses.append(key)
            else:
                found[key] = value
        self._count("hits", len(found))
        self._count("misses", len(misses))

        def compute(key: str) -> T:
            value = jobs[key]()
            self._cache.put(key, value)  # stored now, so an error elsewhere loses nothing
            return value

        found.update(zip(misses, self._map(compute, misses, progress)))
        return found

    def _map(self, func: Callable[[T], Any], items: Sequence[T], progress: bool) -> list[Any]:
        """func over items on one thread per engine; cancels pending work on any error."""
        if len(items) <= 1 or self.config.workers == 1:
            iterator = map(func, items)
            return list(_progress(iterator, len(items)) if progress else iterator)
        executor = concurrent.futures.ThreadPoolExecutor(self.config.workers, thread_name_prefix="stockfish-call")
        try:
            futures = [executor.submit(func, item) for item in items]
            done = concurrent.futures.as_completed(futures)
            for future in _progress(done, len(futures)) if progress else done:
                future.result()  # surface the first error early
            return [f.result() for f in futures]
        finally:
            executor.shutdown(wait=False, cancel_futures=True)

    # -- analyses --------------------------------------------------------------------

    def _analysis_value(self, board: chess.Board, fen: str) -> dict[str, list]:
        moves, evals = self._search(board, self.config.multipv, fen)
        return {"moves": list(moves), "evals": list(evals)}

    def analyse(self, fen: str) -> Analysis:
        """Top `multipv` moves and evals; empty for checkmate/stalemate (no engine call)."""
        return self.analyse_many([fen])[0]

    def analyse_many(self, fens: Sequence[str], progress: bool = False) -> list[Analysis]:
        """Analyse many FENs over the pool; duplicates searched once; output in input order."""
        found = self._per_position("A", fens, self._analysis_value, _is_analysis, progress)
        return [Analysis(fen, tuple(v["moves"]), tuple(v["evals"])) if v is not None else Analysis(fen, (), ())
                for fen, v in zip(fens, found)]

    def move_tables(self, fens: Sequence[str], progress: bool = False) -> list[dict[str, float]]:
        """Every legal move of each FEN with its eval (pawns, for the side to move), from one
        search per position with multipv = the number of legal moves: all moves judged by the same
        search, so their differences are consistent. Empty for positions without legal moves."""
        tables = self._per_position("T", fens, self._table_value, _is_table, progress)
        return [dict(v) if v is not None else {} for v in tables]

    def _per_position(self, kind: str, fens: Sequence[str], value: Callable[[chess.Board, str], T],
                      valid: Callable[[Any], bool], progress: bool) -> list[T | None]:
        """`value(board, fen)` of each FEN, cached under `kind` and the normalised FEN (irrelevant
        en-passant squares dropped); duplicates computed once; None where the game is over."""
        self._check_open()
        boards = [parse_board(fen) for fen in fens]
        keys = [f"{kind}|{b.fen()}|{self._limits_key}" if any(b.legal_moves) else None for b in boards]
        jobs: dict[str, Callable[[], T]] = {}
        for fen, board, key in zip(fens, boards, keys):
            if key is not None and key not in jobs:
                jobs[key] = functools.partial(value, board, fen)
        found = self._resolve(jobs, valid, progress)
        return [found[k] if k is not None else None for k in keys]

    def _table_value(self, board: chess.Board, fen: str) -> dict[str, float]:
        n = board.legal_moves.count()
        moves, evals = self._search(board, n, fen)
        if len(set(moves)) != n:
            raise EngineError(f"Stockfish returned {len(set(moves))} of {n} legal moves for {fen!r}")
        return dict(zip(moves, evals))

    # -- move evals ------------------------------------------------------------------

    def _move_eval_value(self, board: chess.Board, move: chess.Move, fen: str) -> float:
        """Minus the eval of the position after `move`, searched fresh at multipv 1."""
        after = board.copy(stack=False)
        after.push(move)
        after = chess.Board(after.fen())  # no move history: the same search as analysing that FEN
        outcome = after.outcome()
        if outcome is not None:
            return MATING_MOVE_EVAL if outcome.winner is not None else 0.0
        _, evals = self._search(after, 1, f"{fen} after {move.uci()}")
        return -evals[0] + 0.0  # + 0.0 turns -0.0 into 0.0

    def move_eval(self, fen: str, move: str) -> float:
        """Eval of playing `move` (UCI, legal) at `fen`, for the side to move at `fen`.

        Minus the eval of the resulting position; a mating move is 1000.0, a
        move that ends the game in a draw 0.0.
        """
        return self.move_evals(fen, [move])[0]

    def move_evals(self, fen: str, moves: Sequence[str]) -> list[float]:
        """move_eval for several moves of one position, spread over the pool."""
        return self.move_evals_many([(fen, move) for move in moves])

    def move_evals_many(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """move_eval for (FEN, move) pairs of any number of positions: every search not in the cache
        is spread over the pool at once (a batch's positions no longer wait for each other)."""
        self._check_open()
        keys, jobs = [], {}
        for fen, move in pairs:
            board = parse_board(fen)
            parsed = _parse_move(board, move, fen)
            key = f"M|{board.fen()}|{parsed.uci()}|{self._limits_key}"
            keys.append(key)
            jobs.setdefault(key, functools.partial(self._move_eval_value, board, parsed, fen))
        found = self._resolve(jobs, _is_eval)
        return [found[k] for k in keys]


# what a search gives, as the cache keeps it: a row that is not (hand-edited, another version's) is searched again
def _is_eval(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_analysis(value: Any) -> bool:
    moves, evals = (value.get("moves"), value.get("evals")) if isinstance(value, dict) else (None, None)
    return (isinstance(moves, list) and isinstance(evals, list) and len(moves) == len(evals)
            and all(isinstance(m, str) for m in moves) and all(map(_is_eval, evals)))


def _is_table(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(m, str) and _is_eval(e) for m, e in value.items())


def _progress(iterable: Any, total: int) -> Any:
    from rookworld_rlvr.progress import bar

    return bar(iterable, total=total, desc="stockfish", unit="pos")
