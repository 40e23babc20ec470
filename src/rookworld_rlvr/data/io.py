"""Samples on disk: JSONL (optionally gzip or xz) and upstream RookWorld text lines.

A row is `{"task": "P"|"A", "prompt": ..., "completion": ..., "truth": {...}}` in the compact
layout; `truth` is what scoring needs, so other layouts are re-rendered from it, and a row may
hold `truth` alone (`write_samples(..., truth_only=True)`: a third of the bytes, the same samples).
Every write is atomic (temp file + rename) and every bad row is reported as `file:line: reason`.

Owns `Sample` and the sample files. Chess and files only: imports no torch and nothing of the
model or trainer.
"""

from __future__ import annotations

import gc
import gzip
import hashlib
import io
import json
import lzma
import math
import multiprocessing as mp
import os
import random
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import chess

from rookworld_rlvr.atomic import current_umask, named
from rookworld_rlvr.interrupt import chunk_size, forked_pool, pool_size
from rookworld_rlvr.paths import no_such_file
from rookworld_rlvr.tasks import environment as env_task
from rookworld_rlvr.tasks import policy as pol_task
from rookworld_rlvr.tasks.environment import EnvTruth
from rookworld_rlvr.tasks.policy import FormatError, PolicyTruth


class DataError(ValueError):
    """A bad input row; the message starts with `file:line:`."""


@dataclass
class Sample:
    task: str  # "P" or "A"
    truth: PolicyTruth | EnvTruth
    source: str = ""

    def render(self, layout: str = "compact", order: str = "given") -> tuple[str, str]:
        """(prompt, completion) in the requested layout and P: candidate order (A: has one layout)."""
        if self.task == "P":
            # a puzzle has solving moves, not a written answer: it is a prompt only (GRPO)
            answer = pol_task.completion(self.truth, layout, order) if isinstance(self.truth, PolicyTruth) else ""
            return pol_task.prompt(self.truth.fen, layout), answer
        t = self.truth
        return env_task.prompt(t.fen, t.move, t.history), env_task.completion(t)

    @property
    def fen(self) -> str:
        return self.truth.fen

    def to_row(self) -> dict:
        prompt, completion = self.render("compact")
        row = {"task": self.task, "prompt": prompt, "completion": completion, "truth": self.truth.to_dict()}
        if self.source:
            row["source"] = self.source
        return row


def legal_uci(board: chess.Board, move: str) -> bool:
    """A legal UCI move of `board` as the environment writes it (checked without listing every legal move:
    rows are read by the 100,000). python-chess also takes a king onto its own rook (e8h8) as castling; the
    environment, like UCI, knows castling as e8g8 only, so that spelling is not legal here."""
    try:
        parsed = chess.Move.from_uci(move)
        return board.is_legal(parsed) and board.uci(parsed) == move
    except (ValueError, TypeError):
        return False


# the JSON type of each field of a row's truth ([t]: a list of them); `label` (P:) and `source` may be left out
_TRUTH_FIELDS = {
    "P": {"fen": str, "moves": [str], "evals": [float], "best": [str], "label": (str, None)},
    "A": {"fen": str, "move": str, "history": str, "new_fen": str, "reward": float, "terminated": bool,
          "truncated": bool},
}
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _of_type(value, want) -> bool:
    """`value` is JSON of type `want` (a number is an int or float, an integer an int; neither is a bool)."""
    if want in (int, float):
        return isinstance(value, int if want is int else (int, float)) and not isinstance(value, bool)
    return isinstance(value, want)


def field_problem(fields: dict, obj: dict, prefix: str) -> str | None:
    """The first field of the JSON object `obj` that is not of its type in `fields` (a type; [type]: a list of them;
    (type, None): that type, or null or left out), as "field 'prefix.name' must be ..., got ..."; None if none is."""
    for name, want in fields.items():
        value = obj.get(name)
        if isinstance(want, tuple):  # optional
            ok, what = value is None or _of_type(value, want[0]), _TYPE_NAMES[want[0]]
        elif isinstance(want, list):
            ok = isinstance(value, list) and all(_of_type(v, want[0]) for v in value)
            what = f"a list of {_TYPE_NAMES[want[0]].split()[1]}s"
        else:
            ok, what = _of_type(value, want), _TYPE_NAMES[want]
        if not ok:
            return f"field '{prefix}.{name}' must be {what}, got {'nothing' if name not in obj else repr(value)[:80]}"
    return None


def _check_truth_fields(task: str, truth: dict) -> None:
    """Each field of a `task` row's truth is there and of its JSON type, or a FormatError names the first that is
    not (a list where a move is due, a number where a FEN is: the chess checks after this read them as typed)."""
    if problem := field_problem(_TRUTH_FIELDS[task], truth, "truth"):
        raise FormatError(problem)


def sample_from_row(row: dict) -> Sample:
    """Validate a JSONL row; raises FormatError naming the field."""
    if not isinstance(row, dict):
        raise FormatError("row is not a JSON object")
    task = row.get("task")
    if task not in ("P", "A"):
        raise FormatError(f"field 'task' must be 'P' or 'A', got {task!r}")
    truth = row.get("truth")
    if not isinstance(truth, dict):
        raise FormatError("field 'truth' must be an object")
    if not isinstance(row.get("source", ""), str):
        raise FormatError(f"field 'source' must be a string, got {row['source']!r}"[:120])
    _check_truth_fields(task, truth)
    t = PolicyTruth.from_dict(truth) if task == "P" else EnvTruth.from_dict(truth)
    try:
        board = chess.Board(t.fen)
    except ValueError as e:
        raise FormatError(f"field 'truth.fen' is not a position: {t.fen!r} ({e})") from None
    if task == "P":
        if not t.moves or len(t.moves) != len(t.evals):
            raise FormatError("field 'truth': moves and evals must be non-empty and of equal length")
        if not set(t.best) <= set(t.moves) or not t.best:
            raise FormatError("field 'truth.best' must be a non-empty subset of truth.moves")
        if not all(math.isfinite(e) for e in t.evals):
            raise FormatError(f"field 'truth.evals' must be finite numbers, got {list(t.evals)}")
        illegal = [m for m in t.moves if not legal_uci(board, m)]
        if illegal:
            raise FormatError(f"field 'truth.moves' holds moves that are not legal in the position: {illegal}")
    else:
        moves = t.history.split()
        if not moves or moves[-1] != t.move:
            raise FormatError("field 'truth.history' must end with truth.move")
        if legal_uci(board, t.move) == t.truncated:
            raise FormatError(f"field 'truth.truncated' is {t.truncated} but {t.move} is "
                              f"{'not legal' if not t.truncated else 'legal'} in the position (an illegal move, and "
                              "only that, is truncated)")
    sample = Sample(task, t, row.get("source", ""))
    if "prompt" in row and row["prompt"] != sample.render("compact")[0]:
        raise FormatError("field 'prompt' does not match 'truth'")
    return sample


def sample_from_line(line: str) -> Sample:
    """An upstream RookWorld text line: `P: ...`, `A: ...` or an environment line without prefix."""
    s = line.strip()
    if s.startswith("P:"):
        return Sample("P", pol_task.parse_line(s), "rookworld")
    return Sample("A", env_task.parse_line(s), "rookworld")


_COMPRESSED = {".gz": gzip.open, ".xz": lzma.open}  # by the file name's last suffix, on reading and writing
_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of undecodable bytes


def open_text(path: Path) -> io.TextIOBase:
    """Undecodable bytes are kept as lone surrogates, so the line that holds them gets the error."""
    if path.suffix in _COMPRESSED:
        return io.TextIOWrapper(_COMPRESSED[path.suffix](path, "rb"), encoding="utf-8", errors="surrogateescape")
    return open(path, encoding="utf-8", errors="surrogateescape")


def is_jsonl(path: str | Path) -> bool:
    name = Path(path).name
    return name.endswith(tuple(base + z for base in (".jsonl", ".json") for z in ("", *_COMPRESSED)))


@dataclass
class ReadReport:
    read: int = 0
    invalid: int = 0
    errors: list[str] = field(default_factory=list)  # first few `file:line: reason`


def data_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a data file's non-blank lines; an unreadable file is a DataError."""
    if not path.exists():
        raise DataError(no_such_file(path))
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a data file")
    lineno = 0
    try:
        with open_text(path) as fh:
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    yield lineno, line
    except (OSError, EOFError, lzma.LZMAError) as e:  # not gzip/xz, cut short, unreadable
        raise DataError(f"{path}: cannot be read after line {lineno} ({type(e).__name__}: {e}); a truncated or "
                        "corrupt file?") from None


def text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text before any `#` comment, stripped) of a text file's lines that hold any; a line that is not
    UTF-8 is a DataError naming it, and so is a file that cannot be read (`data_lines`): openings, mates in one."""
    for lineno, line in data_lines(Path(path)):
        if _NOT_UTF8.search(line):
            raise DataError(f"{path}:{lineno}: not valid UTF-8 text")
        if text := line.split("#")[0].strip():
            yield lineno, text


def iter_samples(path: str | Path, skip_invalid: bool = False, report: ReadReport | None = None) -> Iterator[Sample]:
    """Yield samples from JSONL or upstream text lines. Bad rows raise DataError(file:line) or are counted."""
    path = Path(path)
    report = report if report is not None else ReadReport()
    jsonl = is_jsonl(path)
    for lineno, line in data_lines(path):
        report.read += 1
        sample = _parse(path, lineno, line, jsonl, skip_invalid, report)
        if sample is not None:
            yield sample


def _parse(path: Path, lineno: int, line: str, jsonl: bool, skip_invalid: bool, report: ReadReport) -> Sample | None:
    """One line's sample; a bad line raises DataError(file:line), or is counted and gives None."""
    try:
        if _NOT_UTF8.search(line):
            raise FormatError("not valid UTF-8 text")
        return sample_from_row(json.loads(line)) if jsonl else sample_from_line(line)
    except (FormatError, json.JSONDecodeError, ValueError, RecursionError) as e:
        why = "JSON nested too deeply" if isinstance(e, RecursionError) else e
        msg = f"{path}:{lineno}: {why}"
        if not skip_invalid:
            raise DataError(msg) from None
        report.invalid += 1
        if len(report.errors) < 10:
            report.errors.append(msg)
        return None


PARALLEL_ROWS = 50_000  # from this many rows on, read_samples parses in several processes


def _parse_chunk(args: tuple[Path, bool, bool, list[tuple[int, str]]]) -> tuple[list[Sample], ReadReport, str]:
    """A worker's share of read_samples: its samples, its counts, and its first error ("" when none)."""
    path, jsonl, skip_invalid, chunk = args
    report, out = ReadReport(), []
    for lineno, line in chunk:
        report.read += 1
        try:
            sample = _parse(path, lineno, line, jsonl, skip_invalid, report)
        except DataError as e:
            return out, report, str(e)
        if sample is not None:
            out.append(sample)
    return out, report, ""


def file_sha256(path: str | Path) -> str:
    """A file's SHA-256 (hex), read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_lines(path: str | Path, lines: list[tuple[int, str]]) -> list[Sample]:
    """The samples of some of a file's (line number, line) pairs (`data_lines`); the first bad one is a DataError
    naming file:line."""
    samples, _, error = _parse_chunk((Path(path), is_jsonl(path), False, lines))
    if error:
        raise DataError(error)
    return samples


def forked_map(fn: Callable, items: list, workers: int) -> list:
    """`fn` over `items` in `workers` forked processes, in order. Fork, as torch's own DataLoader workers: the
    workers run python-chess alone, never torch, so a parent that has used torch (or CUDA) may fork them."""
    with forked_pool(workers) as pool:
        return pool.map(fn, items, chunksize=chunk_size(len(items), workers))


def can_fork(workers: int, n: int, at_least: int | None = None) -> bool:
    """Whether `n` items are worth `workers` forked processes: from `at_least` (PARALLEL_ROWS) on, where fork exists."""
    return workers > 1 and n >= (at_least or PARALLEL_ROWS) and "fork" in mp.get_all_start_methods()


def read_samples(path: str | Path, skip_invalid: bool = False, report: ReadReport | None = None,
                 workers: int | None = None) -> list[Sample]:
    """Every sample of a file, as iter_samples gives them. Validating a row costs ~0.1 ms (python-chess
    checks its moves), so from PARALLEL_ROWS rows on `workers` forked processes (default:
    `interrupt.pool_size()`, the cores it may use, at most 16) parse chunks of the file: the same samples in
    the same order, the same first error, the same report; a GPU run's 700k rows in seconds instead of
    minutes."""
    path = Path(path)
    report = report if report is not None else ReadReport()
    workers = workers or pool_size()
    with gc_paused():
        return _read_samples(path, skip_invalid, report, workers)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, and as it was after it. Reading a file makes
    objects by the million and keeps them all, so each of the collector's full passes walks every one read so
    far and frees none (a sample's objects hold no cycles; refcounting frees the boards it checked). Off, on 2
    cores (the forked workers inherit it): 240,198 rows in 12.7 s instead of 14.4, 960,792 in 42 s instead of 54,
    the same peak memory; SFT's rows cache loaded 1.4M rows in 7.5 s instead of 35."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read_samples(path: Path, skip_invalid: bool, report: ReadReport, workers: int) -> list[Sample]:
    lines = list(data_lines(path))
    parallel = can_fork(workers, len(lines))
    size = chunk_size(len(lines), workers) if parallel else max(len(lines), 1)
    chunks = [(path, is_jsonl(path), skip_invalid, lines[i:i + size]) for i in range(0, len(lines), size)]
    parts = forked_map(_parse_chunk, chunks, workers) if parallel else [_parse_chunk(c) for c in chunks]
    samples: list[Sample] = []
    for part, counts, error in parts:
        report.read += counts.read
        report.invalid += counts.invalid
        report.errors += counts.errors[:10 - len(report.errors)]
        if error:
            raise DataError(error)
        samples += part
    return samples


def json_object(path: Path, lineno: int, line: str) -> dict:
    """One line as a JSON object; anything else is a DataError naming file:line."""
    try:
        row = json.loads(line)
    except ValueError as e:
        raise DataError(f"{path}:{lineno}: not a JSON record ({e})") from None
    if not isinstance(row, dict):
        raise DataError(f"{path}:{lineno}: not a JSON object")
    return row


def read_log(path: str | Path, warn: Callable[[str], None] = print) -> list[dict]:
    """The JSON records of a run log (one object a line). A torn last line (no newline at the end:
    the process was killed mid-write) is dropped with a warning naming the file; any other line that
    is not a JSON object is a DataError naming file:line."""
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    torn = lines.pop() if lines else ""  # after the last newline: "" for a whole file
    records = [json_object(path, lineno, line) for lineno, line in enumerate(lines, 1) if line.strip()]
    if torn.strip():
        try:
            row = json.loads(torn)
        except ValueError:
            warn(f"warning: {path}:{len(lines) + 1}: ignoring a torn last line (the process was stopped while "
                 f"writing it): {torn[:60]!r}")
        else:
            if isinstance(row, dict):
                records.append(row)
    return records


def atomic_write_text(path: str | Path, chunks: Iterable[str]) -> None:
    """Write to a temp file beside `path`, fsync, rename: readers never see a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            if path.suffix == ".gz":  # mtime=0: identical bytes for identical content
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                    for chunk in chunks:
                        gz.write(chunk.encode("utf-8"))
            elif path.suffix == ".xz":  # 30-40% smaller than gzip on sample files; deterministic too
                with lzma.LZMAFile(raw, mode="wb", preset=9) as xz:
                    for chunk in chunks:
                        xz.write(chunk.encode("utf-8"))
            else:
                for chunk in chunks:
                    raw.write(chunk.encode("utf-8"))
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp creates 0600; published files get normal permissions
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise named(e, path) from e
        raise


def write_samples(path: str | Path, samples: Iterable[Sample], truth_only: bool = False) -> int:
    """Atomically write samples as JSONL (gzip or xz when the name ends in .gz or .xz); returns the
    count. `truth_only` leaves out the rendered prompt and completion, which reading re-renders."""
    count = 0

    def rows() -> Iterator[str]:
        nonlocal count
        for s in samples:
            count += 1
            row = s.to_row()
            if truth_only:
                del row["prompt"], row["completion"]
            yield json.dumps(row, separators=(",", ":")) + "\n"

    atomic_write_text(path, rows())
    return count


def merge_samples(paths: Iterable[str | Path], seed: str = "merge",
                  keep: Callable[[Sample], bool] | None = None) -> tuple[list[Sample], int, int]:
    """Several sample files as one training set: the first sample of each prompt is kept (so a
    position's P: answer or an A: transition is trained on once, whichever generation wrote it),
    then a shuffle seeded by `seed` mixes the sources. `keep` filters before deduplication (a task,
    positions held out). Returns (samples, duplicates dropped, samples `keep` left out). Each file is
    read by read_samples, in several processes when it is large (a game record's replay: ~800k rows)."""
    seen: set[str] = set()
    kept: list[Sample] = []
    dropped = left_out = 0
    for path in paths:
        for s in read_samples(path):
            if keep is not None and not keep(s):
                left_out += 1
                continue
            prompt = s.render("compact")[0]
            if prompt in seen:
                dropped += 1
                continue
            seen.add(prompt)
            kept.append(s)
    random.Random(seed).shuffle(kept)
    return kept, dropped, left_out
