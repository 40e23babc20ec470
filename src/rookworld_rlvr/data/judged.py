"""Held-out sets for playing strength: judged positions and puzzles, built once with Stockfish.

`rookworld data judge` picks held-out positions, has Stockfish evaluate every legal move of each
(one multipv search per position) and writes them as JSONL rows `{"fen", "evals"}`; among them it
finds tactics (one move keeps a decisive win), and among every position it is given, the mates
in one. Evaluation then needs no engine: any answer, and a random legal mover, is judged by
looking its move up. Puzzle rows are `{"fen", "solutions", "kind"}`; the older mate-in-one TSV
(`FEN<TAB>mating moves`) reads as puzzles of kind mate1.

Owns the judged-set files (reading, writing, building them). Chess and files only: imports no
torch and nothing of the model or trainer.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Iterable, TypeVar

import chess

from rookworld_rlvr.data.io import (DataError, atomic_write_text, can_fork, data_lines, forked_map, gc_paused,
                                    iter_samples, json_object, read_samples, text_lines)
from rookworld_rlvr.interrupt import chunk_size, pool_size
from rookworld_rlvr.tasks.strength import (JudgedPosition, Puzzle, check_puzzle, could_be_tactic, is_legal, mates,
                                           mating_moves, tactic_of)

T = TypeVar("T")


PARALLEL_PUZZLES = 5_000  # from this many rows on (about a second of checks on one core) they are read in forked
# processes: a puzzle row costs ~0.2 ms (every move that may mate is played out), so the GPU recipe's 19,576 mates
# took 4.1 s at each GRPO start, on 2 cores 2.6 s so


def _parse_rows(job: tuple[Path, Callable[[dict], T], str, list[tuple[int, str]]]) -> tuple[list[T], str | None]:
    """Some of a file's (line number, line) pairs parsed, and the first bad one's error naming file:line."""
    path, parse, fields, lines = job
    out = []
    for lineno, line in lines:
        if line.lstrip().startswith("#"):
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"a row must be a JSON object ({fields}), got a {type(row).__name__}")
            out.append(parse(row))
        except KeyError as e:
            return out, f"{path}:{lineno}: no field {e} (a row has {fields})"
        except (ValueError, TypeError) as e:
            return out, f"{path}:{lineno}: {e}"
    return out, None


def _read_rows(path: str | Path, parse: Callable[[dict], T], fields: str, workers: int | None = None) -> list[T]:
    """Every row parsed, in order; a bad one is a DataError naming file:line (a missing field with the `fields` a
    row has), the file's first. From PARALLEL_PUZZLES rows on, `workers` forked processes (default: the cores this
    process may use, `pool_size`) parse chunks of it."""
    path = Path(path)
    workers = workers or pool_size()
    with gc_paused():
        lines = list(data_lines(path))
        parallel = can_fork(workers, len(lines), at_least=PARALLEL_PUZZLES)
        size = chunk_size(len(lines), workers) if parallel else max(len(lines), 1)
        jobs = [(path, parse, fields, lines[i:i + size]) for i in range(0, len(lines), size)]
        out: list[T] = []
        for rows, error in forked_map(_parse_rows, jobs, workers) if parallel else map(_parse_rows, jobs):
            if error:
                raise DataError(error)
            out += rows
    return out


def read_judged(path: str | Path) -> list[JudgedPosition]:
    """Judged positions; a bad row raises DataError naming file:line."""
    return _read_rows(path, JudgedPosition.from_dict,
                      "'fen' and 'evals' of every legal move, as `rookworld data judge` writes them")


def read_puzzles(path: str | Path) -> list[Puzzle]:
    """Puzzles from JSONL(.gz), or mates in one from a `FEN<TAB>mating moves` TSV."""
    if str(path).endswith((".tsv", ".txt")):
        return [Puzzle(fen, tuple(moves), "mate1") for fen, moves in load_mate_in_one(path)]
    return _read_rows(path, Puzzle.from_dict,
                      "'fen', 'solutions' and 'kind', as `rookworld data judge --puzzles-out` writes them")


def _mate_line(line: str) -> tuple[str, list[str]]:
    """Parse `FEN<TAB>move move ...`; each move must be legal and mate."""
    if "\t" not in line:
        raise ValueError("expected `FEN<TAB>mating moves`")
    fen, moves_text = line.split("\t", 1)
    fen = fen.strip()
    if fen.startswith("P:"):
        fen = fen[2:].strip()
    try:
        chess.Board(fen)
    except ValueError as e:
        raise ValueError(f"bad FEN {fen!r}: {e}") from None
    moves = moves_text.split()
    if not moves:
        raise ValueError("no mating moves after the tab")
    for mv in moves:
        if not is_legal(fen, mv):
            raise ValueError(f"{mv!r} is not a legal UCI move in {fen}")
        if not mates(fen, mv):
            raise ValueError(f"{mv} does not mate in {fen}")
    return fen, moves


def load_mate_in_one(path: str | Path) -> list[tuple[str, list[str]]]:
    """Positions from `FEN<TAB>mating UCI moves` lines (FEN optionally prefixed `P: `).

    Blank lines and lines starting with '#' are skipped; a bad line raises DataError
    (a ValueError) starting with `file:line:`.
    """
    out = []
    for lineno, line in text_lines(path):
        try:
            out.append(_mate_line(line))
        except ValueError as e:
            raise DataError(f"{path}:{lineno}: {e}") from None
    return out


def write_rows(path: str | Path, rows: Iterable[dict]) -> None:
    atomic_write_text(path, (json.dumps(r, separators=(",", ":")) + "\n" for r in rows))


def _spread(fen: str) -> str:
    """Order positions by a hash of their FEN: consecutive positions of one game spread apart."""
    return hashlib.sha1(fen.encode()).hexdigest()


def held_out_positions(paths: Iterable[str | Path]) -> dict[str, tuple[float, ...]]:
    """Distinct P: positions of the given sample files that have a legal move, in file order, each with the
    evals its sample recorded (the generator's best moves)."""
    seen: dict[str, tuple[float, ...]] = {}
    for path in paths:
        for s in iter_samples(path):
            if s.task == "P" and s.fen not in seen and any(chess.Board(s.fen).legal_moves):
                seen[s.fen] = tuple(s.truth.evals)
    return seen


def mates_in_one(fens: Iterable[str]) -> list[Puzzle]:
    return [Puzzle(f, tuple(m), "mate1") for f in fens if (m := mating_moves(f))]


def judge(sources: list[str], out: str | None, puzzles_out: str | None, n_positions: int, tactic_pool: int,
          depth: int, workers: int, cache_path: str | None, progress: bool = True,
          exclude: Iterable[str] = (), screen: bool = False) -> dict:
    """Judge `n_positions` held-out positions (the strength set, written to `out`) and up to `tactic_pool`
    more to find tactics; write both sets. Positions are taken in hash order of their FEN, none of them in
    `exclude` (compared without the move clocks). With `screen`, the tactic pool takes only positions whose
    recorded evals could make a tactic (`could_be_tactic`): a large source judged for its tactics alone."""
    from rookworld_rlvr.engine import EngineConfig, StockfishPool

    if n_positions and not out:
        raise ValueError("a strength set of positions needs a file to go to (--out), or --positions 0")
    excluded = {board_key(f) for f in exclude}
    held = held_out_positions(sources)
    fens = sorted((f for f in held if board_key(f) not in excluded), key=_spread)
    pool_fens = [f for f in fens[n_positions:] if not screen or could_be_tactic(held[f])][:tactic_pool]
    picked = fens[:n_positions] + pool_fens
    tables = []
    if picked:  # mates in one alone (--positions 0 --tactic-pool 0) take python-chess, no engine
        with StockfishPool(EngineConfig(depth=depth, workers=workers, cache_path=cache_path)) as pool:
            tables = pool.move_tables(picked, progress=progress)
    judged = [JudgedPosition(f, t) for f, t in zip(picked, tables)]
    if out:
        write_rows(out, (p.to_dict() for p in judged[:n_positions]))
    summary = {"positions": min(n_positions, len(judged)), "depth": depth, "candidates": len(fens),
               "excluded": len(held) - len(fens)}
    if puzzles_out:
        tactics = [t for p in judged if (t := tactic_of(p)) is not None]
        mates = mates_in_one(fens)
        mate_fens = {p.fen for p in mates}
        tactics = [t for t in tactics if t.fen not in mate_fens]  # a mate in one is its own kind
        write_rows(puzzles_out, (p.to_dict() for p in mates + tactics))
        summary.update(mate1=len(mates), tactic=len(tactics), tactic_searched=len(judged))
    return summary


def positions_of(path: str | Path) -> set[str]:
    """Every position a file holds (what a held-out set must not share with a training set): a
    sample file's P: FENs and A: FENs before and after the move; a puzzle, judged-position or
    mate-in-one file's FENs. The kind is read from the first row."""
    path = Path(path)
    if str(path).endswith((".tsv", ".txt")):
        lines = list(text_lines(path))
        if any("\t" in text for _, text in lines):  # mates in one: `FEN<TAB>moves`
            return {p.fen for p in read_puzzles(path)}
        return {_listed_fen(path, lineno, text) for lineno, text in lines}  # `rookworld data openings`: a FEN a line
    first = _first_row(path)
    if "solutions" in first:
        return {p.fen for p in read_puzzles(path)}
    if "evals" in first and "task" not in first:
        return {p.fen for p in read_judged(path)}
    out: set[str] = set()
    for s in read_samples(path):  # in several processes from 50,000 rows on (a training set as --exclude)
        out.add(s.fen)
        if s.task == "A":
            out.add(s.truth.new_fen)
    return out


def positions_of_files(paths: Iterable[str | Path] | None) -> set[str]:
    """Every position the files hold (`positions_of`), together: what `--exclude` leaves out."""
    return set().union(*(positions_of(p) for p in paths or ()))


def _listed_fen(path: Path, lineno: int, text: str) -> str:
    """A line of a FEN list, which must be a position: a line that is none would leave nothing out without a word."""
    from rookworld_rlvr.engine import parse_board

    try:
        parse_board(text)
    except ValueError as e:
        raise DataError(f"{path}:{lineno}: {e}") from None
    return text


def _first_row(path: Path) -> dict:
    for lineno, line in data_lines(path):
        if not line.lstrip().startswith("#"):
            return json_object(path, lineno, line)
    return {}


def board_key(fen: str) -> str:
    """A position without its move clocks: the same position reached at another move number is the same."""
    return " ".join(fen.split()[:4])


def check_positions(sources: Iterable[str | Path], derive: bool, exclude: set[str], n: int | None,
                    seed: int = 0) -> list[Puzzle]:
    """`check` puzzles: positions where the side to move is in check, none of them in `exclude`
    (compared without the move clocks).

    From each sample file: its P: positions in check and the in-check positions its A: moves lead
    to (positions from games). With `derive`, also every position one checking move away from a P:
    position (python-chess alone makes these, so there are as many as wanted). Deduplicated, then
    at most `n` in a seeded shuffle (None = all). Costs no engine."""
    import random

    from rookworld_rlvr.tasks.environment import fen_of

    found: dict[str, None] = {}
    for path in sources:
        for s in iter_samples(path):
            found[s.fen] = None
            if s.task == "A" and not s.truth.terminated:
                found[s.truth.new_fen] = None
            if derive and s.task == "P":
                board = chess.Board(s.fen)
                for move in list(board.legal_moves):
                    if board.gives_check(move):
                        board.push(move)
                        found[fen_of(board)] = None
                        board.pop()
    excluded = {board_key(f) for f in exclude}
    puzzles = [p for fen in found if board_key(fen) not in excluded and (p := check_puzzle(fen)) is not None]
    random.Random(seed).shuffle(puzzles)
    return puzzles if n is None else puzzles[:n]


def openings(n: int, seed: int, depth: int, cache_path: str | None, permille: int = 40,
             max_eval: float | None = 1.0, side: str = "eval", exclude: Iterable[str] = ()) -> list[str]:
    """`n` opening positions: 4 to 10 plies from the start, each ply one of Stockfish's top 5 moves at
    random; kept when the FEN falls on `side` of the data split (the same hash rule as `data generate`:
    "eval", the held-out openings for matches, which no training sample has; "train" for training
    positions), is none of `exclude` (without the move clocks), and the side to move is within
    `max_eval` pawns of equality (None: any)."""
    import random

    from rookworld_rlvr.data.generate import is_eval_fen
    from rookworld_rlvr.engine import EngineConfig, StockfishPool
    from rookworld_rlvr.tasks.environment import fen_of

    rng = random.Random(seed)
    excluded = {board_key(f) for f in exclude}
    found: dict[str, None] = {}
    with StockfishPool(EngineConfig(depth=depth, workers=1, cache_path=cache_path)) as pool:
        while len(found) < n:
            board = chess.Board()
            for _ in range(rng.randrange(4, 11)):
                board.push_uci(rng.choice(pool.analyse(fen_of(board)).moves))
            fen = fen_of(board)
            if (is_eval_fen(fen, permille) == (side == "eval") and fen not in found and not board.is_game_over()
                    and board_key(fen) not in excluded):
                top = pool.analyse(fen).evals if max_eval is not None else None
                if max_eval is None or (top and abs(top[0]) <= max_eval):
                    found[fen] = None
    return list(found)
