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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import os
import queue
import shutil
import sqlite3
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Sequence, TypeVar

import chess
import chess.engine

__all__ = [
    "Analysis",
    "EngineConfig",
    "EngineError",
    "StockfishNotFound",
    "StockfishPool",
    "find_stockfish",
    "score_to_pawns",
]

LOG = logging.getLogger(__name__)
T = TypeVar("T")

MATE_SCORE = 100_000
MATING_MOVE_EVAL = MATE_SCORE / 100  # 1000.0: the move delivers mate
_FALLBACK_PATHS = ("/usr/games/stockfish", "/usr/local/bin/stockfish")
_INSTALL_HINT = (
    "Install it (Debian/Ubuntu: `apt-get install stockfish`; the binary lands in "
    "/usr/games/stockfish, which is usually not on PATH) or point STOCKFISH_PATH "
    "at the executable."
)
# Failures after which the engine is killed and the request retried.
_ENGINE_FAILURES = (
    chess.engine.EngineError,
    TimeoutError,
    asyncio.TimeoutError,
    concurrent.futures.TimeoutError,
    OSError,
    EOFError,
)


class StockfishNotFound(RuntimeError):
    """The Stockfish executable could not be located."""


class EngineError(RuntimeError):
    """Analysis failed even after killing, restarting and retrying the engine."""


def _executable(path: str) -> str | None:
    """Absolute path of `path` if it names an executable file (bare names use PATH)."""
    if os.sep not in path:
        found = shutil.which(path)
        return os.path.abspath(found) if found else None
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return os.path.abspath(path)
    return None


def find_stockfish(path: str | None = None) -> str:
    """Locate Stockfish: explicit path, else $STOCKFISH_PATH, else PATH, else usual spots.

    An explicit path or a set STOCKFISH_PATH that does not work is an error
    rather than a silent fallback, so a misconfiguration is never hidden.
    """
    if path is not None:
        found = _executable(path)
        if found is None:
            raise StockfishNotFound(f"Stockfish not found at {path!r}. {_INSTALL_HINT}")
        return found
    env = os.environ.get("STOCKFISH_PATH")
    if env:
        found = _executable(env)
        if found is None:
            raise StockfishNotFound(f"STOCKFISH_PATH={env!r} is not an executable file. {_INSTALL_HINT}")
        return found
    for candidate in ("stockfish", *_FALLBACK_PATHS):
        found = _executable(candidate)
        if found is not None:
            return found
    looked = ", ".join(("PATH", *_FALLBACK_PATHS))
    raise StockfishNotFound(f"Stockfish not found (looked in {looked}). {_INSTALL_HINT}")


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
            ("time", self.time is None or self.time > 0, "> 0 or None"),
            ("multipv", self.multipv >= 1, ">= 1"),
            ("threads", self.threads >= 1, ">= 1"),
            ("hash_mb", self.hash_mb >= 1, ">= 1"),
            ("workers", self.workers >= 1, ">= 1"),
            ("timeout", self.timeout > 0, "> 0"),
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
    evals: tuple[float, ...]

    def best_moves(self) -> tuple[str, ...]:
        """Every move sharing the top eval: each is a correct best move."""
        if not self.evals:
            return ()
        top = max(self.evals)
        return tuple(m for m, e in zip(self.moves, self.evals) if e == top)


def score_to_pawns(score: chess.engine.Score) -> float:
    """Pawns for the side to move; mate in n -> (100000 - n) / 100, mated -> negative."""
    return round(score.score(mate_score=MATE_SCORE) / 100, 2)


def _parse_board(fen: str) -> chess.Board:
    """A valid standard-chess board, or ValueError naming the FEN (bad FENs crash engines)."""
    try:
        board = chess.Board(fen)
    except ValueError as exc:
        raise ValueError(f"invalid FEN {fen!r}: {exc}") from None
    if not board.is_valid():
        raise ValueError(f"invalid FEN {fen!r}: position status {board.status()!r}")
    return board


def _parse_move(board: chess.Board, move: str, fen: str) -> chess.Move:
    """The legal move named by `move` (UCI), or ValueError naming move and FEN."""
    try:
        parsed = chess.Move.from_uci(move)
    except ValueError:
        raise ValueError(f"malformed UCI move {move!r} for FEN {fen!r}") from None
    if parsed not in board.legal_moves:
        raise ValueError(f"illegal move {move!r} in FEN {fen!r}")
    return parsed


class _Cache:
    """In-memory dict in front of an optional SQLite file shared between processes.

    Every write is its own autocommitted INSERT OR REPLACE, so a crash never
    leaves half a row; WAL mode and a busy timeout let processes share the file.
    """

    def __init__(self, path: str | None) -> None:
        self._mem: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if path is not None:
            self._db = self._open(path)

    @staticmethod
    def _open(path: str) -> sqlite3.Connection:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        db = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout=60000")
        for attempt in range(50):  # switching to WAL needs a moment of exclusive access
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                break
            except sqlite3.OperationalError:
                if attempt == 49:
                    raise
                time.sleep(0.1)
        db.execute("PRAGMA synchronous=NORMAL")
        return db

    def get(self, key: str) -> Any | None:
        with self._lock:
            if key in self._mem:
                return self._mem[key]
            if self._db is None:
                return None
            row = self._db.execute("SELECT value FROM cache WHERE key = ?", (key,)).fetchone()
            if row is None:
                return None
            value = self._mem[key] = json.loads(row[0])
            return value

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._mem[key] = value
            if self._db is not None:
                self._db.execute("INSERT OR REPLACE INTO cache (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class _Loop:
    """An asyncio loop on a daemon thread: drives every engine without blocking exit.

    (python-chess's SimpleEngine uses non-daemon threads, which make the
    interpreter hang at exit before atexit handlers could close the engines.)
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._on_error)
        self._thread = threading.Thread(target=self.loop.run_forever, name="stockfish-pool", daemon=True)
        self._thread.start()

    @staticmethod
    def _on_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """A dead engine leaves unretrieved futures inside python-chess; we already handled it."""
        if isinstance(context.get("exception"), chess.engine.EngineTerminatedError):
            LOG.debug("ignored after engine death: %s", context.get("message"))
        else:
            loop.default_exception_handler(context)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run `coro` on the loop; cancel it if the caller stops waiting for any reason."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self.loop.close()


class _Engine:
    """One Stockfish process; started lazily, killed on any failure."""

    def __init__(self, path: str, config: EngineConfig, loop: _Loop) -> None:
        self._path = path
        self._config = config
        self._loop = loop
        self._transport: asyncio.SubprocessTransport | None = None
        self._protocol: chess.engine.UciProtocol | None = None

    @property
    def pid(self) -> int | None:
        return None if self._transport is None else self._transport.get_pid()

    def start(self) -> None:
        async def spawn() -> tuple[asyncio.SubprocessTransport, chess.engine.UciProtocol]:
            # setpgrp: a Ctrl-C in the terminal must not kill engines behind our back.
            transport, protocol = await chess.engine.popen_uci(self._path, setpgrp=True)
            try:
                await protocol.configure({"Threads": self._config.threads, "Hash": self._config.hash_mb})
                await protocol.ping()
            except BaseException:
                transport.close()
                raise
            return transport, protocol

        timeout = self._config.timeout
        self._transport, self._protocol = self._loop.run(asyncio.wait_for(spawn(), timeout), timeout + 5.0)

    def analyse(self, board: chess.Board, limit: chess.engine.Limit, multipv: int) -> list[chess.engine.InfoDict]:
        """Search from a cleared engine (fresh `game` -> ucinewgame) so results are reproducible."""
        if self._protocol is None:
            self.start()
        assert self._protocol is not None
        timeout = self._config.timeout + (limit.time or 0.0)
        coro = self._protocol.analyse(
            board, limit, multipv=multipv, game=object(), info=chess.engine.INFO_SCORE | chess.engine.INFO_PV
        )
        return self._loop.run(_unless_dead(coro, self._protocol, timeout), timeout + 5.0)

    def kill(self) -> None:
        """SIGKILL the process (works on hung or stopped ones) and wait until it is reaped."""
        transport, protocol = self._transport, self._protocol
        self._transport = self._protocol = None
        if transport is None or protocol is None or self._loop.loop.is_closed():
            return

        async def reap() -> None:
            transport.close()
            try:
                await asyncio.wait_for(asyncio.shield(protocol.returncode), 5.0)
            except (TimeoutError, asyncio.CancelledError):
                LOG.warning("stockfish pid %s was not reaped within 5 s", transport.get_pid())

        try:
            self._loop.run(reap(), 10.0)
        except Exception as exc:  # closing must not fail
            LOG.warning("closing stockfish failed: %r", exc)


async def _unless_dead(coro: Coroutine[Any, Any, T], protocol: chess.engine.Protocol, timeout: float) -> T:
    """Await `coro`, failing fast if the engine dies and with TimeoutError if it hangs.

    python-chess 1.11 misses an engine death between `ucinewgame` and `readyok`
    (the caller would wait forever), so we also watch the process exit code.
    """
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task, protocol.returncode}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    if protocol.returncode.done():
        raise chess.engine.EngineTerminatedError(f"engine process died (exit code: {protocol.returncode.result()})")
    raise TimeoutError(f"engine gave no answer within {timeout} s")


def _shutdown(engines: list[_Engine], loop: _Loop, cache: _Cache) -> None:
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
        self._limits_key = config.limits_key()
        self._cache = _Cache(config.cache_path)
        self._loop = _Loop()
        self._engines = [_Engine(self.path, config, self._loop) for _ in range(config.workers)]
        self._idle: queue.LifoQueue[_Engine] = queue.LifoQueue()  # reuse warm engines first
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

    def _engine_pids(self) -> list[int]:
        """Pids of the running engines (for tests and debugging)."""
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
                except _ENGINE_FAILURES as exc:
                    last = exc
                    LOG.warning("stockfish failed on %r (attempt %d): %r; restarting it", fen, attempt + 1, exc)
                    engine.kill()
                    self._count("restarts")
            raise EngineError(f"Stockfish failed on FEN {fen!r} after {self.config.retries + 1} attempts: {last!r}")
        finally:
            self._idle.put(engine)

    def _resolve(self, jobs: dict[str, Callable[[], T]], progress: bool = False) -> dict[str, T]:
        """Values for every key: from the cache, else computed on the pool and stored at once."""
        found: dict[str, T] = {}
        misses = []
        for key in jobs:
            value = self._cache.get(key)
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
        self._check_open()
        boards = [_parse_board(fen) for fen in fens]
        # Key on the normalised FEN (irrelevant en-passant squares dropped); None = game over.
        keys = [f"A|{b.fen()}|{self._limits_key}" if any(b.legal_moves) else None for b in boards]
        jobs: dict[str, Callable[[], dict[str, list]]] = {}
        for fen, board, key in zip(fens, boards, keys):
            if key is not None and key not in jobs:
                jobs[key] = functools.partial(self._analysis_value, board, fen)
        found = self._resolve(jobs, progress)
        results = []
        for fen, key in zip(fens, keys):
            value = found[key] if key is not None else {"moves": [], "evals": []}
            results.append(Analysis(fen=fen, moves=tuple(value["moves"]), evals=tuple(value["evals"])))
        return results

    def move_tables(self, fens: Sequence[str], progress: bool = False) -> list[dict[str, float]]:
        """Every legal move of each FEN with its eval (pawns, for the side to move), from one
        search per position with multipv = the number of legal moves: all moves judged by the same
        search, so their differences are consistent. Empty for positions without legal moves."""
        self._check_open()
        boards = [_parse_board(fen) for fen in fens]
        keys = [f"T|{b.fen()}|{self._limits_key}" if any(b.legal_moves) else None for b in boards]
        jobs: dict[str, Callable[[], dict[str, float]]] = {}
        for fen, board, key in zip(fens, boards, keys):
            if key is not None and key not in jobs:
                jobs[key] = functools.partial(self._table_value, board, fen)
        found = self._resolve(jobs, progress)
        return [dict(found[k]) if k is not None else {} for k in keys]

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
        self._check_open()
        board = _parse_board(fen)
        parsed = [_parse_move(board, move, fen) for move in moves]
        keys = [f"M|{board.fen()}|{m.uci()}|{self._limits_key}" for m in parsed]
        jobs = {k: functools.partial(self._move_eval_value, board, m, fen) for k, m in zip(keys, parsed)}
        found = self._resolve(jobs)
        return [found[k] for k in keys]


def _progress(iterable: Any, total: int) -> Any:
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc="stockfish", unit="pos")
