"""Game records: a `data generate` run's Stockfish answers in a small file that rebuilds its data anywhere.

Nearly all of a generation's time goes to Stockfish; everything else (the moves played, the shuffles, the
illegal, terminal and short-history A: rows, the split) follows from the seed. A record keeps only the
engine's answers, in the order the games asked for them: one JSON line per game, each analysed position as
`"e2e4 d2d4 ...|0.31 0.25 ..."` (moves in the engine's rank order, evals in pawns). `rookworld data replay`
plays the same games against these answers instead of Stockfish and writes the same shards, train and eval
files, byte for byte, on a machine with no engine: about 16 bytes per position in xz, where a P: row alone
takes 32 and its A: rows 38 more.

A replay that drifts (another python-chess, a damaged file) is caught, not trained on: each answer's best
move must be legal where it is used, and each game's positions must hash to what the recording saw.

Owns the record format: making a record from a finished generation (its shards and engine cache), reading
one, and the pools that record and replay. Imports python-chess and the engine pool; no torch.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol

import chess

from rookworld_rlvr.data.io import DataError, atomic_write_text, data_lines, iter_samples, legal_uci
from rookworld_rlvr.engine import Analysis, StockfishPool
from rookworld_rlvr.engine_process import engine_identity, find_stockfish

FORMAT = "rookworld-games/1"
Answer = tuple[tuple[str, ...], tuple[float, ...]]  # an analysis without its FEN: moves and evals


class Analyser(Protocol):
    def analyse(self, fen: str) -> Analysis: ...


@dataclass(frozen=True)
class GameRecord:
    game: int
    answers: tuple[Answer, ...]  # one per analysed position, in the order the game asked
    positions: str  # digest of the analysed FENs in order: a replay that reached other positions fails


def digest(fens: Iterable[str]) -> str:
    return hashlib.sha1("\n".join(fens).encode()).hexdigest()[:16]


def encode_answer(answer: Answer) -> str:
    moves, evals = answer
    return " ".join(moves) + "|" + " ".join(repr(float(e)) for e in evals)


def decode_answer(text: str, where: str) -> Answer:
    if not isinstance(text, str):
        raise DataError(f"{where}: an answer must be the string 'MOVES|EVALS', got {text!r}"[:200])
    moves, sep, evals = text.partition("|")
    try:
        answer = tuple(moves.split()), tuple(float(e) for e in evals.split())
    except ValueError:
        answer = None
    if not sep or answer is None or len(answer[0]) != len(answer[1]):
        raise DataError(f"{where}: an answer must be 'MOVES|EVALS' with as many evals as moves, got {text!r}")
    return answer


class RecordingPool:
    """Stockfish's answers, passed on and kept: what one game asked, for its record."""

    def __init__(self, pool: Analyser) -> None:
        self.pool, self.fens, self.answers = pool, [], []

    def analyse(self, fen: str) -> Analysis:
        a = self.pool.analyse(fen)
        self.fens.append(fen)
        self.answers.append((a.moves, a.evals))
        return a

    def record(self, game: int) -> GameRecord:
        return GameRecord(game, tuple(self.answers), digest(self.fens))


class ReplayPool:
    """A game's recorded answers given back in order, each checked against the position that asks for it."""

    def __init__(self, record: GameRecord, where: str) -> None:
        self.rec, self.where, self.fens = record, where, []

    def analyse(self, fen: str) -> Analysis:
        n = len(self.fens)
        if n == len(self.rec.answers):
            raise DataError(f"{self.where}: game {self.rec.game} asks for a position more than the {n} recorded "
                            "(the replay differs from the recording: another python-chess, or another record)")
        moves, evals = self.rec.answers[n]
        if moves and not legal_uci(chess.Board(fen), moves[0]):
            raise DataError(f"{self.where}: game {self.rec.game}, position {n + 1}: the recorded best move "
                            f"{moves[0]} is illegal in {fen} (the replay differs from the recording)")
        self.fens.append(fen)
        return Analysis(fen, moves, evals)

    def check_done(self) -> None:
        if len(self.fens) != len(self.rec.answers) or digest(self.fens) != self.rec.positions:
            raise DataError(f"{self.where}: game {self.rec.game} reached other positions than were recorded "
                            f"({len(self.fens)} of {len(self.rec.answers)} answers used)")


def read_header(path: str | Path) -> dict:
    """A record's first line (format, generate config, engine, python-chess), checked."""
    line = next(data_lines(Path(path)), (0, ""))[1]  # a damaged or cut compressed file: an error naming it
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}:1: not a JSON line ({e})") from None
    if not isinstance(row, dict) or row.get("format") != FORMAT or not isinstance(row.get("config"), dict):
        raise DataError(f"{path}:1: not a game record (its first line must name format {FORMAT!r} and hold the "
                        "generate config)")
    return row


def read_records(path: str | Path) -> tuple[dict, list[GameRecord]]:
    """The record's header (format, generate config, engine, python-chess) and its games, checked."""
    path = Path(path)
    games: list[GameRecord] = []
    header: dict | None = None
    for n, line in data_lines(path):
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{where}: not a JSON line ({e})") from None
        if header is None:
            header = read_header(path)
            continue
        if not isinstance(row, dict) or row.get("game") != len(games) or not isinstance(row.get("answers"), list) \
                or not isinstance(row.get("positions"), str):
            raise DataError(f"{where}: expected game {len(games)} as {{'game', 'answers', 'positions'}}")
        answers = tuple(decode_answer(a, f"{where}: answer {i + 1}") for i, a in enumerate(row["answers"]))
        games.append(GameRecord(row["game"], answers, row["positions"]))
    if header is None:
        raise DataError(f"{path}: empty, not a game record")
    if len(games) != header["config"].get("games"):
        raise DataError(f"{path}: holds {len(games)} games, its config says {header['config'].get('games')} "
                        "(a cut file?)")
    return header, games


def write_records(path: str | Path, header: dict, games: list[GameRecord]) -> None:
    def lines() -> Iterable[str]:
        yield json.dumps({"format": FORMAT, **header}, sort_keys=True) + "\n"
        for g in games:
            yield json.dumps({"game": g.game, "positions": g.positions,
                              "answers": [encode_answer(a) for a in g.answers]}) + "\n"

    atomic_write_text(path, lines())


_POOL: StockfishPool | None = None  # one per recording process, on the generation's engine cache


def _record_shard(args: tuple[object, int]) -> tuple[list[GameRecord], dict[str, int]]:
    """One shard's games replayed on the engine cache, each answer kept; the replay must equal the shard."""
    from rookworld_rlvr.data import generate as gen

    global _POOL
    cfg, shard = args
    if _POOL is None:
        _POOL = StockfishPool(cfg.engine_config(workers=1))
    before = _POOL.stats
    first = shard * cfg.games_per_shard
    records, samples = [], []
    for g in range(first, min(first + cfg.games_per_shard, cfg.games)):
        rec = RecordingPool(_POOL)
        samples.extend(gen.play_game(g, cfg, rec))
        records.append(rec.record(g))
    path = gen._shard_path(cfg, shard)
    if samples != list(iter_samples(path)):
        raise DataError(f"{path}: replaying its games on the engine cache gave other samples (a cache that lacks "
                        "some of its analyses, answered now by another Stockfish): this generation cannot be recorded")
    return records, {k: v - before.get(k, 0) for k, v in _POOL.stats.items()}


def record(gen_dir: str | Path, out: str | Path, workers: int = 2, progress: bool = True) -> dict:
    """A record of the finished generation in `gen_dir` (its shards and engine cache; Stockfish is asked only
    for what the cache lacks, and the result must equal every shard)."""
    from rookworld_rlvr.data import generate as gen
    from rookworld_rlvr.progress import bar

    cfg = gen.config_of(gen_dir)
    if cfg.extra_positions:
        raise ValueError(f"{gen_dir}: made with extra positions ({', '.join(cfg.extra_positions)}); a record holds "
                         "games only")
    shards = range(-(-cfg.games // cfg.games_per_shard))
    missing = [s for s in shards if not gen._shard_path(cfg, s).exists()]
    if missing:
        raise ValueError(f"{gen_dir}: {len(missing)} of {len(shards)} shards are not made yet; rerun its "
                         "`data generate` command to finish them")
    games: list[GameRecord] = []
    totals: dict[str, int] = {}
    with mp.get_context("spawn").Pool(workers) as ps:
        for recs, stats in bar(ps.imap(_record_shard, [(cfg, s) for s in shards]), total=len(shards),
                               desc="recording (shards)", enabled=progress):
            games.extend(recs)
            totals = {k: totals.get(k, 0) + v for k, v in stats.items()}
    engine = engine_identity(find_stockfish(cfg.engine_config().path))
    write_records(out, {"config": gen.recorded_settings(cfg), "engine": engine, "python_chess": chess.__version__}, games)
    positions = sum(len(g.answers) for g in games)
    return {"games": len(games), "positions": positions, "engine": engine, "out": str(out),
            "bytes": Path(out).stat().st_size, "engine_searches": totals.get("engine_calls", 0)}


def replay(path: str | Path, out_dir: str | Path, workers: int = 2, progress: bool = True) -> dict:
    """The recorded generation made again in `out_dir` (shards, train and eval files), without Stockfish."""
    from rookworld_rlvr.data import generate as gen

    header = read_header(path)  # its own errors name the file and line
    try:
        cfg = gen.config_from(header["config"], out_dir, workers)
    except (TypeError, KeyError) as e:
        raise DataError(f"{path}:1: a config this version cannot replay ({e})") from None
    except ValueError as e:  # a setting of the wrong kind
        raise DataError(f"{path}:1: {e}") from None
    try:
        cfg.validate()
    except ValueError as e:  # a setting out of its range: the record's, not the command line's
        raise DataError(f"{path}:1: its config: {e}") from None
    return gen.generate(cfg, progress=progress, replay=str(path))
