"""`rookworld data generate`: positions from games -> annotated P: and A: samples.

Games mix Stockfish-guided play at varied strength (a softmax over the multipv-5 evals,
so stronger or weaker by temperature) with random moves; optional PGN/FEN files add
positions. Every position is annotated by the engine pool (that annotation also chooses the
engine moves, so no search is wasted). Each block of games is a shard written atomically,
so an interrupted run resumes without duplicates; the merge deduplicates and splits train
and eval by FEN hash (no FEN in both splits).

Owns building the training and held-out sets from games. Chess and files only: imports no torch
and nothing of the model or trainer.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import lzma
import math
import multiprocessing as mp
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import chess
import chess.pgn

from rookworld_rlvr.data.io import (DataError, Sample, atomic_write_text, field_problem, iter_samples, open_text,
                                    text_lines, write_samples)
from rookworld_rlvr.engine import Analysis, EngineConfig, StockfishPool, faults, parse_board
from rookworld_rlvr.paths import no_such_file
from rookworld_rlvr.tasks import environment as env_task
from rookworld_rlvr.tasks.policy import PolicyTruth
from rookworld_rlvr.tasks.strength import best_of, legal_moves, mating_moves


@dataclass
class GenerateConfig:
    out_dir: str = "data"
    games: int = 700
    games_per_shard: int = 10
    seed: int = 0
    workers: int = 2
    depth: int | None = 8
    time: float | None = None
    multipv: int = 5
    max_plies: int = 160
    random_game_share: float = 0.15  # games played with uniformly random moves only
    random_move_prob: float = 0.1  # per move in engine games
    temperatures: tuple[float, ...] = (0.05, 0.3, 1.0)  # softmax temperature in pawns over multipv evals
    illegal_share: float = 0.03  # extra A: samples with an illegal move
    short_history_share: float = 0.2  # A: samples copied with their history cut to 1 .. len - 1 moves (data.histories)
    eval_per_task: int = 1000
    eval_permille: int = 40  # share of FENs (by hash) reserved for eval
    extra_positions: tuple[str, ...] = ()  # PGN (.pgn) or FEN-per-line files
    cache_path: str | None = None  # engine cache; default <out_dir>/.cache/engine.sqlite

    def inert_settings(self) -> list[str]:
        """Settings of the games given where none is played (games 0: the positions alone), each named (the command
        warns of them: they were taken without a word)."""
        d = GenerateConfig()
        return [f"{name}: no game is played (games 0)" for name in ("games_per_shard", "max_plies", "random_game_share",
                "random_move_prob", "temperatures", "illegal_share", "short_history_share")
                if not self.games and getattr(self, name) != getattr(d, name)]

    def validate(self) -> None:
        if self.games < (0 if self.extra_positions else 1) or self.games_per_shard < 1 or self.workers < 1:
            raise ValueError("games, games_per_shard and workers must be >= 1 (games 0 with extra_positions: "
                             "those positions labelled alone)")
        if not 0 <= self.random_game_share <= 1 or not 0 <= self.random_move_prob <= 1:
            raise ValueError("random_game_share and random_move_prob must be in [0, 1]")
        if not 0 <= self.illegal_share < 1:
            raise ValueError("illegal_share must be in [0, 1)")
        if not 0 <= self.short_history_share <= 1:
            raise ValueError("short_history_share must be in [0, 1]")
        if not 0 < self.eval_permille < 1000:
            raise ValueError("eval_permille must be in (0, 1000)")
        if self.max_plies < 1 or self.eval_per_task < 0:
            raise ValueError(f"max_plies must be >= 1 and eval_per_task >= 0, got {self.max_plies} and "
                             f"{self.eval_per_task}")
        if any(not t > 0 for t in self.temperatures):  # a NaN weighed every move NaN; inf: a random mover's game
            raise ValueError(f"temperatures must be > 0 (inf: random moves), got {list(self.temperatures)}")
        for f in self.extra_positions:
            if not Path(f).exists():
                raise ValueError(f"extra_positions: {no_such_file(f)}")
        self.engine_config().validate()

    def engine_config(self, workers: int = 1) -> EngineConfig:
        cache = self.cache_path or str(Path(self.out_dir) / ".cache" / "engine.sqlite")
        return EngineConfig(depth=self.depth, time=self.time, multipv=self.multipv, workers=workers, cache_path=cache)


START_FEN = chess.Board().fen(en_passant="fen")


def is_eval_fen(fen: str, permille: int) -> bool:
    """Deterministic split by position: the same FEN always lands in the same split. The start
    position is always on the training side: every game passes through it, and holding it out
    would leave a model that never saw a game's first move (its hash falls on the held-out side)."""
    if fen == START_FEN:
        return False
    return int(hashlib.sha1(fen.encode()).hexdigest()[:8], 16) % 1000 < permille


def _policy_sample(a: Analysis, rng: random.Random) -> Sample | None:
    if not a.moves:
        return None
    order = list(range(len(a.moves)))
    rng.shuffle(order)  # upstream shuffled candidates together with their evals
    moves = tuple(a.moves[i] for i in order)
    evals = tuple(a.evals[i] for i in order)
    return Sample("P", PolicyTruth(a.fen, moves, evals, best_of(moves, evals)), "gen")


def _illegal_move(board: chess.Board, rng: random.Random) -> str:
    """A plausible-looking illegal move: own piece to a square it cannot reach, or random squares."""
    legal = legal_moves(board)
    own = [sq for sq in chess.SQUARES if board.color_at(sq) == board.turn]
    while True:
        frm = rng.choice(own) if own and rng.random() < 0.8 else rng.randrange(64)
        uci = chess.square_name(frm) + chess.square_name(rng.randrange(64))
        if uci not in legal and uci[:2] != uci[2:]:
            return uci


def _pick_move(board: chess.Board, a: Analysis, temp: float, random_prob: float, rng: random.Random) -> chess.Move:
    legal = list(board.legal_moves)
    if temp == math.inf or rng.random() < random_prob or not a.moves:
        return rng.choice(legal)
    weights = [math.exp((min(e, 50) - min(a.evals[0], 50)) / temp) for e in a.evals]
    return chess.Move.from_uci(rng.choices(a.moves, weights)[0])


def play_game(game_id: int, cfg: GenerateConfig, pool: StockfishPool) -> list[Sample]:
    """One game; every position becomes a P: sample and every move an A: sample."""
    rng = random.Random(f"{cfg.seed}:{game_id}")
    temp = math.inf if rng.random() < cfg.random_game_share else rng.choice(cfg.temperatures)
    board = chess.Board()
    history: list[str] = []
    out: list[Sample] = []
    for _ in range(rng.choice((0, 2, 4, 6, 8))):  # a few random opening plies for variety, each an A: sample
        move = rng.choice(list(board.legal_moves)).uci()
        out.append(Sample("A", env_task.transition(env_task.fen_of(board), move, history[-9:]), "gen"))
        board.push_uci(move)
        history.append(move)
    for _ in range(cfg.max_plies):
        if board.is_game_over(claim_draw=True):
            break
        fen = env_task.fen_of(board)
        a = pool.analyse(fen)
        p = _policy_sample(a, rng)
        if p is not None:
            out.append(p)
        if rng.random() < cfg.illegal_share:
            bad = _illegal_move(board, rng)
            out.append(Sample("A", env_task.transition(fen, bad, history[-9:]), "gen-illegal"))
        for mv in board.legal_moves:  # terminal transitions are rare in play: add every mating/stalemating move
            board.push(mv)
            ends = board.is_checkmate() or board.is_stalemate()
            board.pop()
            if ends:
                out.append(Sample("A", env_task.transition(fen, mv.uci(), history[-9:]), "gen-terminal"))
        move = _pick_move(board, a, temp, cfg.random_move_prob, rng)
        out.append(Sample("A", env_task.transition(fen, move.uci(), history[-9:]), "gen"))
        board.push(move)
        history.append(move.uci())
    from rookworld_rlvr.data.histories import short_history_copies

    short = random.Random(f"{cfg.seed}:{game_id}:short")  # its own stream: the game's draws are unchanged
    return out + list(short_history_copies(out, cfg.short_history_share, short))


class _CountedLines:
    """A text file's `readline` that counts lines, and where the latest game began (python-chess's PGN reader
    reads a game by `readline` alone): a game's error names its line."""

    def __init__(self, fh) -> None:
        self.fh, self.lineno, self.start = fh, 0, 0

    def readline(self) -> str:
        line = self.fh.readline()
        self.lineno += bool(line)
        if not self.start and line.strip() and not line.startswith(("%", ";")):
            self.start = self.lineno
        return line


class _Collected(chess.pgn.GameBuilder):
    """python-chess's game builder keeping a game's errors without logging them: the error names its file."""

    def handle_error(self, error: Exception) -> None:
        self.game.errors.append(error)


def _pgn_positions(path: Path) -> Iterator[tuple[int, str]]:
    """(line where its game begins, FEN) of the position before every move of every game's main line; a game
    python-chess reads with an error (an illegal move, a set-up position that is none) or of a variant is a
    DataError naming the file, line and game. Names in another encoding than UTF-8 do no harm: they are not read."""
    with open_text(path) as fh:
        lines = _CountedLines(fh)
        for number in itertools.count(1):
            lines.start = 0
            if (game := chess.pgn.read_game(lines, Visitor=_Collected)) is None:
                return
            where = f"{path}:{lines.start}: game {number}"
            try:
                board = game.board()
            except ValueError as e:
                raise DataError(f"{where}: {e}") from None
            if type(board) is not chess.Board or board.chess960:
                raise DataError(f"{where}: a game of {game.headers.get('Variant', 'Chess960')}: only standard chess "
                                "is labelled")
            if not board.is_valid():
                raise DataError(f"{where}: its set-up position {board.fen()!r} is not a legal one ({faults(board)})")
            if game.errors:
                raise DataError(f"{where}: {game.errors[0]}")
            for mv in game.mainline_moves():
                yield lines.start, env_task.fen_of(board)
                board.push(mv)


def _fen_positions(path: Path) -> Iterator[tuple[int, str]]:
    """(line, FEN) of a FEN-a-line file (the first tab-separated field, `P: ` before it allowed; '#' comments)."""
    for lineno, text in text_lines(path):
        fen = text.split("\t")[0].strip().removeprefix("P: ")
        try:
            parse_board(fen)
        except ValueError as e:
            raise DataError(f"{path}:{lineno}: {e}") from None
        yield lineno, fen


def read_extra_positions(paths: tuple[str, ...]) -> list[str]:
    """The positions of `extra_positions` files (PGN: every position of every game; otherwise a FEN a line), each
    once, in order: read whole before any game is played, so that a bad line stops the command before its hours
    of Stockfish. A file that holds no position is an error too (a position without a legal move counts as one,
    and is not labelled)."""
    out: dict[str, None] = {}
    for p in map(Path, paths):
        if p.is_dir():
            raise DataError(f"{p}: is a directory, not a PGN or FEN file")
        pgn = p.name.removesuffix(p.suffix if p.suffix in (".gz", ".xz") else "").endswith(".pgn")
        read = 0
        try:
            for read, (_, fen) in enumerate((_pgn_positions if pgn else _fen_positions)(p), 1):
                out.setdefault(fen)
        except (OSError, EOFError, lzma.LZMAError) as e:
            raise DataError(f"{p}: cannot be read ({type(e).__name__}: {e}); a truncated or corrupt file?") from None
        if not read:
            raise DataError(f"{p}: holds no position" + (" (no game with a move)" if pgn else ""))
    return list(out)


def _shard_path(cfg: GenerateConfig, shard: int) -> Path:
    return Path(cfg.out_dir) / ".shards" / f"shard_{shard:05d}.jsonl"


_POOL: StockfishPool | None = None


def _run_shard(args: tuple[GenerateConfig, int, list | None, str]) -> int:
    """One shard's games, on Stockfish or (replay) on a record's answers for them."""
    cfg, shard, records, where = args
    global _POOL
    first = shard * cfg.games_per_shard
    samples: list[Sample] = []
    for g in range(first, min(first + cfg.games_per_shard, cfg.games)):
        if records is None:
            if _POOL is None:
                _POOL = StockfishPool(cfg.engine_config(workers=1))
            samples.extend(play_game(g, cfg, _POOL))
        else:
            from rookworld_rlvr.data.records import ReplayPool

            pool = ReplayPool(records[g - first], where)
            samples.extend(play_game(g, cfg, pool))
            pool.check_done()
    write_samples(_shard_path(cfg, shard), samples)
    return len(samples)


def _read_shard(path: Path) -> list[Sample]:
    return list(iter_samples(path))


def settings(cfg: GenerateConfig) -> dict:
    """What a shard's content depends on: everything but where it goes and how many processes make it."""
    return {k: v for k, v in asdict(cfg).items() if k not in ("workers", "out_dir")}


def recorded_settings(cfg: GenerateConfig) -> dict:
    """The settings a game record keeps, as JSON gives them back: all but the engine cache (a replay has its own)."""
    return {k: v for k, v in json.loads(json.dumps(settings(cfg))).items() if k != "cache_path"}


def config_from(fields: dict, out_dir: str | Path, workers: int = 2) -> GenerateConfig:
    """A GenerateConfig from `settings` read back from JSON (lists where the config holds tuples). A value of the
    wrong kind (a record edited or damaged) is a ValueError naming its field, not a TypeError deep in a shard."""
    if problem := field_problem({k: kind for k, kind in _KINDS.items() if k in fields}, fields, "config"):
        raise ValueError(problem)
    fields = {**fields, "temperatures": tuple(fields["temperatures"]),
              "extra_positions": tuple(fields["extra_positions"])}
    return GenerateConfig(out_dir=str(out_dir), workers=workers, **fields)


# each setting's JSON type, in `data.io.field_problem`'s terms
_KINDS = {"games": int, "games_per_shard": int, "seed": int, "workers": int, "depth": (int, None),
          "time": (float, None), "multipv": int, "max_plies": int, "random_game_share": float, "random_move_prob": float,
          "temperatures": [float], "illegal_share": float, "short_history_share": float, "eval_per_task": int,
          "eval_permille": int, "extra_positions": [str], "cache_path": (str, None)}


def config_of(gen_dir: str | Path) -> GenerateConfig:
    """The configuration a generation in `gen_dir` was made with (its shards' fingerprint)."""
    meta = Path(gen_dir, ".shards", "config.json")
    if not meta.exists():
        raise ValueError(f"{gen_dir}: not a `data generate` output (no {meta})")
    return config_from(json.loads(meta.read_text()), gen_dir)


def generate(cfg: GenerateConfig, progress: bool = True, replay: str | None = None) -> dict:
    """Run (or resume) generation and write train/eval files; returns a summary. With `replay` (a game
    record of the same configuration, `data.records`), the engine's answers come from it: no Stockfish."""
    cfg.validate()
    extra = read_extra_positions(cfg.extra_positions)
    from rookworld_rlvr.progress import bar as progress_bar

    t0 = time.time()
    n_shards = math.ceil(cfg.games / cfg.games_per_shard)
    todo = [s for s in range(n_shards) if not _shard_path(cfg, s).exists()]
    Path(cfg.out_dir, ".shards").mkdir(parents=True, exist_ok=True)
    # a shard's content depends only on (seed, game ids): record them so a resume cannot mix configs
    meta = Path(cfg.out_dir, ".shards", "config.json")
    fingerprint = json.dumps(settings(cfg), sort_keys=True)
    if meta.exists() and meta.read_text() != fingerprint:
        raise ValueError(f"{meta}: existing shards were made with another configuration; remove {meta.parent} to start over")
    atomic_write_text(meta, [fingerprint])
    games: list | None = None
    if replay is not None:
        from rookworld_rlvr.data.records import read_records

        header, games = read_records(replay)
        if header["config"] != recorded_settings(cfg):
            raise ValueError(f"{replay}: recorded with another configuration than this generation's")
    per = cfg.games_per_shard
    jobs = [(cfg, s, None if games is None else games[s * per:(s + 1) * per], str(replay)) for s in todo]
    bar = progress_bar(total=n_shards, initial=n_shards - len(todo), desc="games (shards)", enabled=progress)
    ctx = mp.get_context("spawn")
    with ctx.Pool(cfg.workers) as workers:
        for _ in workers.imap_unordered(_run_shard, jobs):
            bar.update()
        bar.close()
        # read back in the same processes: checking a row costs python-chess about 0.1 ms, a million of them
        # 100 s in one process
        shards = workers.map(_read_shard, [_shard_path(cfg, sh) for sh in range(n_shards)], chunksize=4)
    samples = [s for shard in shards for s in shard]
    if extra:
        with StockfishPool(cfg.engine_config(workers=cfg.workers)) as pool:
            rng = random.Random(f"{cfg.seed}:extra")
            for a in pool.analyse_many(extra, progress=progress):
                if (p := _policy_sample(a, rng)) is not None:
                    samples.append(p)
    summary = write_splits(samples, cfg)
    summary["seconds"] = round(time.time() - t0, 1)
    summary["positions_per_second"] = round(summary["annotated_positions"] / max(summary["seconds"], 1e-9), 2)
    manifest = {"config": asdict(cfg), **({"replayed_from": str(replay)} if replay else {}), **summary}
    atomic_write_text(Path(cfg.out_dir) / "manifest.json", [json.dumps(manifest, indent=2)])
    return summary


def dedup_key(s: Sample) -> str:
    t = s.truth
    return f"P|{t.fen}" if s.task == "P" else f"A|{t.fen}|{t.move}|{t.history}"


def write_splits(samples: list[Sample], cfg: GenerateConfig) -> dict:
    """Deduplicate, split by FEN hash, cap eval at eval_per_task per task, write atomically."""
    seen: set[str] = set()
    train: list[Sample] = []
    evals: dict[str, list[Sample]] = {"P": [], "A": []}
    eval_positions: list[Sample] = []  # every eval-side P: position, for the mate-in-one set
    for s in samples:
        key = dedup_key(s)
        if key in seen:
            continue
        seen.add(key)
        if is_eval_fen(s.fen, cfg.eval_permille):
            if s.task == "P":
                eval_positions.append(s)
            if len(evals[s.task]) < cfg.eval_per_task:
                evals[s.task].append(s)
        else:
            train.append(s)
    rng = random.Random(f"{cfg.seed}:shuffle")
    rng.shuffle(train)
    out = Path(cfg.out_dir)
    write_samples(out / "train.jsonl.gz", train)
    write_samples(out / "eval.jsonl.gz", evals["P"] + evals["A"])
    mates = mate_in_one(eval_positions)
    atomic_write_text(out / "mate_in_one.tsv", [f"{fen}\t{' '.join(ms)}\n" for fen, ms in mates])
    count = lambda xs, t: sum(s.task == t for s in xs)  # noqa: E731
    return {
        "train_P": count(train, "P"), "train_A": count(train, "A"),
        "eval_P": len(evals["P"]), "eval_A": len(evals["A"]), "mate_in_one": len(mates),
        "annotated_positions": sum(s.task == "P" for s in samples),
    }


def mate_in_one(samples: list[Sample]) -> list[tuple[str, list[str]]]:
    """Positions (from P: samples) with at least one mating move, and all mating moves."""
    return [(s.fen, mates) for s in samples if (mates := mating_moves(s.fen))]
