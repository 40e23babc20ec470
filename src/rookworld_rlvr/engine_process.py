"""One Stockfish process on the pool's event loop: found, started lazily, killed on any failure.

The pool (`engine.StockfishPool`) decides the processes' lifecycle and retries. Owns locating
Stockfish and talking to one process without ever blocking on a dead or hung one: an asyncio loop on a daemon
thread drives every engine (python-chess's SimpleEngine uses non-daemon threads, which make the
interpreter hang at exit before atexit handlers could close the engines), and every call watches
the process's exit code as well as its answer. Chess only: imports no torch and nothing of the
model or trainer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import shutil
import subprocess
import threading
from typing import TYPE_CHECKING, Any, Coroutine, TypeVar

import chess
import chess.engine

if TYPE_CHECKING:
    from rookworld_rlvr.engine import EngineConfig

LOG = logging.getLogger("rookworld_rlvr.engine")
T = TypeVar("T")

# Failures after which the engine is killed and the request retried.
ENGINE_FAILURES = (
    chess.engine.EngineError,
    TimeoutError,
    asyncio.TimeoutError,
    concurrent.futures.TimeoutError,
    OSError,
    EOFError,
)
_FALLBACK_PATHS = ("/usr/games/stockfish", "/usr/local/bin/stockfish")
_INSTALL_HINT = (
    "Install it (Debian/Ubuntu: `apt-get install stockfish`; the binary lands in "
    "/usr/games/stockfish, which is usually not on PATH) or point STOCKFISH_PATH "
    "at the executable."
)


class StockfishNotFound(RuntimeError):
    """No Stockfish to use: the executable could not be located, or it does not answer as a UCI engine."""


def _executable(path: str) -> str | None:
    """Absolute path of `path` if it names an executable file (bare names use PATH)."""
    if os.sep not in path:
        found = shutil.which(path)
        return os.path.abspath(found) if found else None
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return os.path.abspath(path)
    return None


@functools.lru_cache(maxsize=None)
def engine_identity(path: str, timeout: float = 30.0) -> str:
    """The engine's UCI `id name` ("Stockfish 16.1"): its analyses are cached under it, so another
    version's cached answers are never taken for this one's. An engine that answers `uciok` without
    its name is known by its path, size and modification time instead. A program that does not answer
    `uci` at all (another program at STOCKFISH_PATH, a broken binary) is StockfishNotFound, said at once:
    its every search would fail, each after its retries, and only where a search is first needed."""
    try:
        done = subprocess.run([path], input="uci\nquit\n", capture_output=True, text=True, errors="replace",
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise StockfishNotFound(f"{path} does not answer as a UCI engine: no `uciok` to `uci` within {timeout} s. "
                                f"{_INSTALL_HINT}") from None
    except OSError as e:
        raise StockfishNotFound(f"{path} cannot be run ({e.strerror or e}). {_INSTALL_HINT}") from None
    lines = [line.strip() for line in done.stdout.splitlines()]
    if "uciok" not in lines:
        said = next((ln for ln in (done.stderr + "\n" + done.stdout).splitlines() if ln.strip()), "")
        raise StockfishNotFound(f"{path} does not answer as a UCI engine: no `uciok` to `uci` (it exited with code "
                                f"{done.returncode}{': ' + said.strip()[:200] if said else ''}). {_INSTALL_HINT}")
    for line in lines:
        if line.startswith("id name "):
            return line[len("id name "):].strip()
    st = os.stat(path)
    return f"unnamed engine {path} ({st.st_size} bytes, modified {st.st_mtime_ns})"


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



class Loop:
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
            if not self.loop.is_closed():  # (a closed loop runs nothing more: its cancel would be a traceback)
                future.cancel()
            raise

    def stop(self) -> None:
        """Cancel what still runs (a search another thread waits on: it stops waiting at once, and no task is left
        pending to be reported when the closed loop is collected), then stop and close the loop."""
        if self.loop.is_closed():
            return

        async def cancel_pending() -> None:
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=2.0)

        try:
            asyncio.run_coroutine_threadsafe(cancel_pending(), self.loop).result(5.0)
        except (concurrent.futures.TimeoutError, RuntimeError):  # a loop that no longer runs
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self.loop.close()


class Engine:
    """One Stockfish process; started lazily, killed on any failure."""

    def __init__(self, path: str, config: EngineConfig, loop: Loop) -> None:
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
