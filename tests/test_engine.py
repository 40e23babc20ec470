"""The Stockfish pool against the real engine: conventions, cache, crashes, hangs, cleanup."""

from __future__ import annotations

import multiprocessing
import logging
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import chess
import chess.engine
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rookworld_rlvr.engine import (
    Analysis,
    EngineCacheError,
    EngineConfig,
    EngineError,
    StockfishNotFound,
    StockfishPool,
    find_stockfish,
    score_to_pawns,
)
from rookworld_rlvr.tasks.strength import best_of

from conftest import find_stockfish_or_none  # noqa: E402

STOCKFISH = find_stockfish_or_none()  # as a user's run finds it; the stockfish_path fixture skips (or fails) without
DEPTH = 6
START = chess.STARTING_FEN
MATE_IN_1 = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # a1a8#
MATED_IN_1 = "k7/8/1K6/8/8/8/8/7R b - - 0 1"  # only Kb8, then Rh8#
STALEMATE = "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1"
CHECKMATE = "R5k1/5ppp/8/8/8/8/8/6K1 b - - 0 1"
BLACK_UP_QUEEN = "4k3/8/8/3q4/8/8/8/4K3 b - - 0 1"
STALEMATING_MOVE = ("7k/8/6K1/8/8/8/8/5Q2 w - - 0 1", "f1f7")
VARIED = [
    "2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34",
    "rq3r2/2pb3k/4pp2/n2p2B1/p7/2P5/1PP1QPPP/R3R1K1 w - - 0 20",
    "8/8/7R/8/8/7p/r4K2/7k w - - 16 112",
    "3rr1k1/5ppp/2p5/1p5q/3nPP2/2N1n2P/B1PR2K1/3R4 w - - 0 32",
    "8/1n3pk1/6p1/3N3p/P2RPK1P/r5P1/8/8 w - - 9 50",
    "8/p2n1rkp/bp1p2p1/2pP4/P1P1P1P1/3BQ2P/1P4K1/8 w - - 1 30",
    "rnb1kb1r/pp1p3p/2pP2p1/2q5/2P1pPp1/2N4B/PP3P1P/R2QK1NR w KQkq - 0 12",
    "r4rk1/ppnb2bp/3p3q/2pPpB2/2P4N/P1N3PP/1P2Q3/1K3R1R b - - 4 20",
]

pytestmark = pytest.mark.usefixtures("stockfish_path")


def config(**kw) -> EngineConfig:
    return EngineConfig(**{"path": STOCKFISH, "depth": DEPTH, "workers": 2, **kw})


def gone(pid: int) -> bool:
    """True when the process no longer exists, not even as a zombie."""
    return not os.path.exists(f"/proc/{pid}")  # a zombie still has its /proc entry


def wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture(scope="module")
def pool():
    with StockfishPool(config()) as p:
        yield p


@pytest.fixture(scope="module")
def reference(pool) -> dict[str, Analysis]:
    """Ground truth for VARIED at DEPTH, to compare every other path against."""
    return {a.fen: a for a in pool.analyse_many(VARIED)}


# -- locating the binary and configuration ------------------------------------------


def test_find_stockfish_prefers_explicit_path_then_env(monkeypatch):
    monkeypatch.delenv("STOCKFISH_PATH", raising=False)
    assert find_stockfish(STOCKFISH) == STOCKFISH
    assert os.access(find_stockfish(), os.X_OK)  # /usr/games fallback
    monkeypatch.setenv("STOCKFISH_PATH", STOCKFISH)
    assert find_stockfish() == STOCKFISH


@pytest.mark.parametrize("script,why", [
    ("exit 0", "no `uciok` to `uci` (it exited with code 0)"),
    ("echo 'usage: tool FILE' >&2; exit 2", "no `uciok` to `uci` (it exited with code 2: usage: tool FILE)"),
    ("echo 'id name Half 1'; cat >/dev/null", "no `uciok` to `uci` (it exited with code 0: id name Half 1)"),
    ("exec sleep 60", "no `uciok` to `uci` within 1.0 s"),
], ids=["exits", "another-program", "no-uciok", "mute"])
def test_a_program_that_does_not_answer_uci_is_refused_when_the_pool_is_made(tmp_path, script, why):
    """STOCKFISH_PATH naming another program (or a broken binary) is said when the pool is made, naming it and
    what it did. Before, it was taken (as an engine without a name), and each search failed after its retries,
    blamed on the position: `rookworld train` judged its base's held-out answers for a minute, then stopped with
    `Stockfish failed on FEN ... after 3 attempts`. A match's Stockfish player alike (was `EngineTerminatedError`)."""
    from rookworld_rlvr.play import StockfishPlayer

    fake = tmp_path / "notfish"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    with pytest.raises(StockfishNotFound) as info:
        StockfishPool(EngineConfig(path=str(fake), timeout=1.0))
    assert str(info.value).startswith(f"{fake} does not answer as a UCI engine: {why}")
    with pytest.raises(StockfishNotFound, match="does not answer as a UCI engine"):  # `rookworld match stockfish`
        StockfishPlayer(path=str(fake), timeout=1.0)


def test_missing_binary_raises_with_install_hint(monkeypatch, tmp_path):
    with pytest.raises(StockfishNotFound, match="apt-get install stockfish") as info:
        find_stockfish(str(tmp_path / "no-such-stockfish"))
    assert "STOCKFISH_PATH" in str(info.value) and "/usr/games" in str(info.value)
    with pytest.raises(StockfishNotFound):
        StockfishPool(EngineConfig(path=str(tmp_path / "nope")))
    monkeypatch.setenv("STOCKFISH_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(StockfishNotFound, match="STOCKFISH_PATH"):
        find_stockfish()
    with pytest.raises(StockfishNotFound, match="apt-get"):
        StockfishPool(EngineConfig())


def test_config_validation_names_the_field():
    EngineConfig().validate()
    EngineConfig(depth=None, time=0.05).validate()
    with pytest.raises(ValueError, match="depth.*time"):
        EngineConfig(depth=None, time=None).validate()
    for field, bad in [("multipv", 0), ("workers", 0), ("timeout", 0.0), ("retries", -1), ("depth", 0),
                       ("timeout", math.inf), ("timeout", math.nan), ("time", math.inf), ("time", math.nan)]:
        with pytest.raises(ValueError, match=field):
            EngineConfig(**{field: bad}).validate()
    with pytest.raises(ValueError, match="depth"):
        StockfishPool(EngineConfig(path=STOCKFISH, depth=None, time=None))


def test_limits_key_depends_only_on_search_limits():
    base = EngineConfig()
    assert base.limits_key() == EngineConfig(threads=4, hash_mb=64, workers=7, cache_path="x").limits_key()
    assert len({base.limits_key(), EngineConfig(depth=9).limits_key(), EngineConfig(multipv=3).limits_key(),
                EngineConfig(time=0.1).limits_key()}) == 4


# -- conventions ---------------------------------------------------------------------


def test_score_to_pawns_convention():
    assert score_to_pawns(chess.engine.Cp(42)) == 0.42
    assert score_to_pawns(chess.engine.Cp(-200)) == -2.0 and str(score_to_pawns(chess.engine.Cp(-200))) == "-2.0"
    assert score_to_pawns(chess.engine.Cp(0)) == 0.0
    assert score_to_pawns(chess.engine.Mate(1)) == 999.99
    assert score_to_pawns(chess.engine.Mate(-2)) == -999.98
    assert score_to_pawns(chess.engine.Mate(0)) == -1000.0  # already mated
    assert score_to_pawns(chess.engine.MateGiven) == 1000.0


@given(st.integers(min_value=1, max_value=300))
def test_mate_scores_match_the_data_format(n):
    assert score_to_pawns(chess.engine.Mate(n)) == (100000 - n) / 100
    assert score_to_pawns(chess.engine.Mate(-n)) == -(100000 - n) / 100
    assert str(score_to_pawns(chess.engine.Mate(n))) == str((100000 - n) / 100)


def test_best_moves_are_all_moves_sharing_the_top_eval():
    a = Analysis("x", ("e2e4", "d2d4", "g1f3"), (0.3, 0.3, 0.1))
    assert best_of(a.moves, a.evals) == ("e2e4", "d2d4")
    assert best_of((), ()) == ()


# -- analyses against the real engine ------------------------------------------------


def test_startpos(pool):
    a = pool.analyse(START)
    assert a.fen == START and len(a.moves) == 5 and len(a.evals) == 5
    legal = {m.uci() for m in chess.Board().legal_moves}
    assert set(a.moves) <= legal and len(set(a.moves)) == 5
    assert all(abs(e) < 1.5 for e in a.evals)
    assert list(a.evals) == sorted(a.evals, reverse=True)
    assert best_of(a.moves, a.evals)[0] == a.moves[0]


def test_mate_in_one_is_999_99(pool):
    a = pool.analyse(MATE_IN_1)
    assert a.moves[0] == "a1a8" and a.evals[0] == 999.99
    assert best_of(a.moves, a.evals) == ("a1a8",)
    assert all(e < 100 for e in a.evals[1:])


def test_getting_mated_is_negative(pool):
    a = pool.analyse(MATED_IN_1)
    assert a.moves == ("a8b8",) and a.evals == (-999.99,)


def test_evals_are_relative_to_the_side_to_move(pool):
    black = pool.analyse(BLACK_UP_QUEEN)
    assert black.evals and all(e > 5 for e in black.evals)
    white = pool.analyse(BLACK_UP_QUEEN.replace(" b ", " w "))
    assert white.evals and all(e < -5 for e in white.evals)


def test_game_over_positions_need_no_engine(pool):
    before = pool.stats["engine_calls"]
    for fen in (STALEMATE, CHECKMATE):
        a = pool.analyse(fen)
        assert a == Analysis(fen, (), ()) and best_of(a.moves, a.evals) == ()
    assert pool.stats["engine_calls"] == before


def test_invalid_fen_is_a_value_error_naming_it(pool):
    for fen in ("not a fen", "8/8/8/8/8/8/8/8 w - - 0 1", "4k3/8/8/8/8/8/8/4K2R x K - 0 1"):
        with pytest.raises(ValueError, match="invalid FEN") as info:
            pool.analyse(fen)
        assert fen in str(info.value)
    with pytest.raises(ValueError):
        pool.analyse_many([START, "garbage"])


def test_analyse_many_keeps_input_order_and_duplicates(pool, reference):
    fens = [VARIED[3], CHECKMATE, VARIED[0], VARIED[3], START]
    out = pool.analyse_many(fens)
    assert [a.fen for a in out] == fens
    assert out[0] == out[3] == reference[VARIED[3]] and out[2] == reference[VARIED[0]]
    assert out[1].moves == () and out[4].moves


def test_deterministic_regardless_of_order_and_engine(reference):
    with StockfishPool(config(workers=1)) as fresh:
        backwards = fresh.analyse_many(VARIED[::-1])
    assert backwards[::-1] == [reference[f] for f in VARIED]


# -- move evals ------------------------------------------------------------------------


def test_move_eval_conventions(pool):
    assert pool.move_eval(MATE_IN_1, "a1a8") == 1000.0
    assert pool.move_eval(*STALEMATING_MOVE) == 0.0
    assert pool.move_eval(MATED_IN_1, "a8b8") == -999.99  # the reply mates at once
    quiet = pool.move_eval(MATE_IN_1, "g1f2")
    assert 0 < quiet < 100
    assert pool.move_eval("4k3/8/8/3q4/8/8/8/4K3 b - - 0 1", "d5d4") > 5  # black keeps its queen
    assert pool.move_eval("4k3/8/8/8/8/8/8/3qK3 w - - 0 1", "e1d1") == 0.0  # KxQ: insufficient material


def test_move_eval_of_a_mate_in_two_counts_from_the_reply(pool):
    fen = "7k/8/8/8/8/8/R7/1R4K1 w - - 0 1"  # b1b7 then a2a8#
    a = pool.analyse(fen)
    assert best_of(a.moves, a.evals) == ("b1b7",) and a.evals[0] == 999.98
    assert pool.move_eval(fen, "b1b7") == 999.99  # the reply position is mated in 1


def test_move_eval_rejects_illegal_and_malformed_moves(pool):
    for move in ("e2e5", "zz", "a1a8q"):
        with pytest.raises(ValueError, match=move) as info:
            pool.move_eval(START, move)
        assert START in str(info.value)
    with pytest.raises(ValueError, match="invalid FEN"):
        pool.move_eval("nonsense", "e2e4")


def test_move_evals_batched_and_cached(pool):
    fen = VARIED[1]
    moves = [m.uci() for m in chess.Board(fen).legal_moves][:6]
    batch = pool.move_evals(fen, moves + moves[:2])
    calls = pool.stats["engine_calls"]
    hits = pool.stats["hits"]
    assert batch == [pool.move_eval(fen, m) for m in moves + moves[:2]]
    assert pool.stats["engine_calls"] == calls and pool.stats["hits"] == hits + 8
    assert all(isinstance(v, float) for v in batch)


def test_move_evals_of_many_positions_run_in_parallel_and_equal_one_by_one(tmp_path):
    """A batch's searches of several positions go to the pool at once (two engines both busy), and
    each value equals the one-position call's: the rewards do not change."""
    pairs = [(fen, m.uci()) for fen in VARIED[:4] for m in list(chess.Board(fen).legal_moves)[:3]]
    with StockfishPool(config(workers=2)) as fresh:
        busy, peak, real = [0], [0], fresh._move_eval_value

        def tracked(*a):
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
            try:
                return real(*a)
            finally:
                busy[0] -= 1

        fresh._move_eval_value = tracked
        together = fresh.move_evals_many(pairs)
    with StockfishPool(config(workers=1)) as serial:
        one_by_one = [serial.move_evals(fen, [move])[0] for fen, move in pairs]
    assert together == one_by_one
    assert peak[0] == 2, "the searches of different positions did not overlap"


# -- the persistent cache ------------------------------------------------------------


def test_sqlite_cache_makes_a_rerun_free(tmp_path, reference):
    path = str(tmp_path / "cache" / "engine.sqlite")
    with StockfishPool(config(cache_path=path)) as first:
        got = first.analyse_many(VARIED[:4])
        evals = first.move_evals(START, ["e2e4", "a2a3"])
        assert first.stats["engine_calls"] == 6 and first.stats["misses"] == 6
    assert got == [reference[f] for f in VARIED[:4]]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT count(*) FROM cache").fetchone()[0] == 6
    with StockfishPool(config(cache_path=path)) as again:
        assert again.analyse_many(VARIED[:4]) == got
        assert again.move_evals(START, ["e2e4", "a2a3"]) == evals
        assert again.stats == {"hits": 6, "misses": 0, "restarts": 0, "engine_calls": 0}
        assert again.pids == []  # engines start lazily: none were needed


def test_a_cache_file_sqlite_cannot_use_is_an_error_naming_it_and_is_left_as_it_is(tmp_path):
    """A cache path holding something else (a copy cut short, another file), or a cache whose pages were damaged:
    one error naming the file and what to do (SQLite alone said `file is not a database` with a traceback); the file
    is not touched, since other processes may share it."""
    bad = tmp_path / "engine.sqlite"
    bad.write_bytes(b"not a database" * 100)
    with pytest.raises(EngineCacheError, match=f"^engine cache {bad}: file is not a database \\(it holds only "
                                               "Stockfish analyses, made again as needed: delete it or move it aside"):
        StockfishPool(config(cache_path=str(bad)))
    assert bad.read_bytes() == b"not a database" * 100
    folder = tmp_path / "folder.sqlite"
    folder.mkdir()
    with pytest.raises(EngineCacheError, match=f"^engine cache {folder}: unable to open database file \\(give a file "
                                               "this process can write; `rookworld train` runs without one with "
                                               "--engine-cache null\\)$"):
        StockfishPool(config(cache_path=str(folder)))

    damaged = tmp_path / "damaged.sqlite"
    with sqlite3.connect(damaged) as db:
        db.execute("CREATE TABLE cache (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.executemany("INSERT INTO cache VALUES (?, ?)", [(f"k{i}", "x" * 50) for i in range(2000)])
    db.close()
    data = bytearray(damaged.read_bytes())
    data[4096:] = b"\xff" * (len(data) - 4096)  # every page but the first (the schema) overwritten
    damaged.write_bytes(bytes(data))
    with StockfishPool(config(cache_path=str(damaged))) as pool:
        with pytest.raises(EngineCacheError, match=f"^engine cache {damaged}: (database disk image is malformed|"
                                                   "file is not a database)"):
            pool.analyse_many([START])


def test_a_cache_row_that_is_not_what_a_search_gives_is_searched_again_and_replaced(tmp_path, caplog):
    """Rows edited by hand or written by another version of the pool: text that is not JSON ended every command
    in a JSONDecodeError, a value of another shape in a TypeError, and a move's eval that was text came back as its
    eval (a reward's input). Each is searched again, the answers are a fresh pool's, the rows are replaced, and a
    warning names the file once."""
    path = tmp_path / "engine.sqlite"
    with StockfishPool(config(cache_path=str(path))) as pool:
        fresh = (pool.analyse(START), pool.move_tables([START]), pool.move_evals(START, ["e2e4", "g1f3"]))
    with sqlite3.connect(path) as db:
        keys = [k for (k,) in db.execute("SELECT key FROM cache ORDER BY key")]
    bad = {"A": ['{"moves": 5}', '{"moves": ["e2e4"], "evals": []}', "{oops"], "T": ['[1, 2]', '{"e2e4": "x"}'],
           "M": ['"x"', "NaN", "true"]}
    for n in range(3):  # each kind's damaged rows in turn
        with sqlite3.connect(path) as db:
            db.executemany("UPDATE cache SET value = ? WHERE key = ?",
                           [(bad[k[0]][n % len(bad[k[0]])], k) for k in keys])
        db.close()
        caplog.clear()
        with StockfishPool(config(cache_path=str(path))) as pool:
            assert (pool.analyse(START), pool.move_tables([START]), pool.move_evals(START, ["e2e4", "g1f3"])) == fresh
            assert pool.stats["hits"] == 0 and pool.stats["misses"] == len(keys)
        first = bad[keys[0][0]][n % 3]  # the first row read: its text, in the one warning
        assert [r.getMessage() for r in caplog.records if "engine cache" in r.getMessage()] == [
            f"engine cache {path}: an entry that is not what a search gives ({first}) is searched again"]
        with StockfishPool(config(cache_path=str(path))) as pool:  # replaced: the next pool reads them
            assert pool.analyse(START) == fresh[0] and pool.stats["hits"] == 1


def _worker(cache_path: str, fens: list[str]) -> list[tuple]:
    with StockfishPool(config(cache_path=cache_path, workers=1)) as pool:
        return [(a.fen, a.moves, a.evals) for a in pool.analyse_many(fens)]


def test_two_processes_share_one_cache_file(tmp_path, reference):
    path = str(tmp_path / "shared.sqlite")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as procs:
        a, b = procs.starmap(_worker, [(path, VARIED[:6]), (path, VARIED[2:][::-1])])
    for fen, moves, evals in a + b:
        assert (moves, evals) == (reference[fen].moves, reference[fen].evals)
    with StockfishPool(config(cache_path=path)) as later:
        later.analyse_many(VARIED)
        assert later.stats["engine_calls"] == 0 and later.stats["hits"] == len(VARIED)


# -- crashes, hangs, cleanup ------------------------------------------------------------


def _kill_engine_after_calls(pool: StockfishPool, calls: list[int], killed: list[int]) -> None:
    """Kill the running engine as soon as pool.stats["engine_calls"] reaches each count."""
    for target in calls:
        while pool.stats["engine_calls"] < target:
            time.sleep(0.0005)
        pid = pool.pids[0]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)


def test_killed_engine_is_restarted_and_the_answer_is_still_right(reference):
    with StockfishPool(config(workers=1, timeout=20.0)) as pool:
        killed: list[int] = []
        killer = threading.Thread(target=_kill_engine_after_calls, args=(pool, [1, 3, 5], killed))
        killer.start()
        t = time.monotonic()
        out = pool.analyse_many(VARIED)  # the kills land mid-batch, mostly mid-search
        killer.join()
        assert out == [reference[f] for f in VARIED]
        assert time.monotonic() - t < 10, "a dead engine must be noticed at once, not after the timeout"
        # under load two kills can hit the same (already dead) process: count distinct processes
        assert 1 <= pool.stats["restarts"] == len(set(killed))
        assert pool.stats["engine_calls"] == len(VARIED)
        assert all(wait_gone(pid) for pid in killed)
        assert pool.pids and pool.pids[0] not in killed


def test_hung_engine_times_out_is_killed_and_restarted(reference):
    with StockfishPool(config(workers=1, timeout=1.0)) as pool:
        pool.analyse(START)
        (pid,) = pool.pids
        os.kill(pid, signal.SIGSTOP)
        t = time.monotonic()
        assert pool.analyse(VARIED[2]) == reference[VARIED[2]]
        assert 0.9 < time.monotonic() - t < 10
        assert pool.stats["restarts"] == 1 and wait_gone(pid)


def test_engine_that_keeps_failing_raises_engine_error_with_the_fen(tmp_path):
    fake = tmp_path / "broken-engine"  # answers `uci`, then dies
    fake.write_text("#!/bin/sh\nread line\necho uciok\nexit 3\n")
    fake.chmod(0o755)
    with StockfishPool(config(path=str(fake), retries=1, timeout=2.0)) as pool:
        with pytest.raises(EngineError, match="after 2 attempts") as info:
            pool.analyse(START)
        assert START in str(info.value) and pool.stats["restarts"] == 2
        assert pool.stats["engine_calls"] == 0


def test_close_kills_engines_and_is_idempotent():
    pool = StockfishPool(config())
    pool.analyse_many(VARIED[:4])
    pids = pool.pids
    assert len(pids) == 2
    pool.close()
    pool.close()
    assert all(gone(pid) for pid in pids)  # reaped before close() returns: no zombies
    with pytest.raises(EngineError, match="closed"):
        pool.analyse(START)


def test_keyboard_interrupt_inside_with_block_closes_the_pool():
    with pytest.raises(KeyboardInterrupt):
        with StockfishPool(config()) as pool:
            pool.analyse_many(VARIED[:2])
            pids = pool.pids
            raise KeyboardInterrupt
    assert pids and all(gone(pid) for pid in pids)


def test_interpreter_exit_closes_a_pool_nobody_closed():
    # The check is registered first, so atexit (last in, first out) runs it after the pool's hook.
    script = textwrap.dedent(f"""
        import atexit, os
        pids = []
        atexit.register(lambda: print("alive:", [p for p in pids if os.path.exists(f"/proc/{{p}}")]))
        from rookworld_rlvr.engine import EngineConfig, StockfishPool
        pool = StockfishPool(EngineConfig(path={STOCKFISH!r}, depth=4, workers=2))
        pool.analyse_many({VARIED[:2]!r})
        pids += pool.pids
        print("pids:", len(pids))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["pids: 2", "alive: []"], done.stdout


def test_a_call_still_waiting_when_the_loop_stops_ends_at_once_without_a_traceback(caplog):
    """A search still waiting when its pool closes (another search's error ended the run) is cancelled: its thread
    stops waiting at once, and nothing is reported. Before, it waited out its timeout (the engine's 30 s, at the
    process's exit), then cancelling it on the closed loop printed asyncio's `Event loop is closed` traceback, and
    the task left pending was reported as destroyed, under the run's error."""
    import asyncio
    import concurrent.futures
    import gc
    import threading
    import time

    from rookworld_rlvr.engine_process import Loop

    loop, raised = Loop(), []

    def wait() -> None:
        try:
            loop.run(asyncio.sleep(30), timeout=20.0)
        except BaseException as e:  # noqa: BLE001 (what the waiting thread sees)
            raised.append((e, time.monotonic()))

    waiting = threading.Thread(target=wait)
    with caplog.at_level(logging.ERROR):
        waiting.start()
        while not asyncio.all_tasks(loop.loop):
            time.sleep(0.01)
        stopped = time.monotonic()
        loop.stop()
        waiting.join(10)
        del loop
        gc.collect()
    assert len(raised) == 1 and isinstance(raised[0][0], concurrent.futures.CancelledError)
    assert raised[0][1] - stopped < 10, "the thread waited out its timeout"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
