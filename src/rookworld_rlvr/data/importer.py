"""`rookworld data import` and `rookworld data stats`.

Import reads upstream RookWorld text lines (P: lines, A: lines with or without the `A: `
prefix) or a Hugging Face dataset (by name, or a folder of its files), corrects the upstream `B:` label quirk (ground
truth = the move with the highest eval for the side to move) and writes our JSONL.

Owns reading upstream data. Chess and files only: imports no torch and nothing of the model or
trainer (`datasets` and `hub`, the Hub's reach, inside a function, for Hub names).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterator

from rookworld_rlvr.data.io import DataError, ReadReport, Sample, iter_samples, sample_from_line, write_samples
from rookworld_rlvr.paths import no_such_file
from rookworld_rlvr.tasks.policy import FormatError


def _dataset_lines(name: str, split: str) -> Iterator[tuple[str, str]]:
    """The text of each row of a Hugging Face dataset: a Hub name, or a folder of its files (a snapshot carried
    to a machine without network; `datasets` reads its parquet, JSON or CSV files)."""
    try:
        import datasets
    except ImportError:
        raise SystemExit("importing a Hugging Face dataset needs the `datasets` package: "
                         "pip install 'rookworld-rlvr[hub]'") from None
    from rookworld_rlvr import hub

    local = Path(name).is_dir()
    what = "the dataset folder" if local else "the Hub dataset"
    if not local and (why := hub.out_of_reach()):  # datasets would retry each file for a minute, then raise
        raise DataError(f"{name}: cannot import the Hub dataset: {why} (a copy in the local cache loads with "
                        "HF_HUB_OFFLINE=1; or import a folder of its files, or a local file of upstream lines)")
    try:
        ds = datasets.load_dataset(name, split=split)
    except (ConnectionError, OSError, ValueError) as e:  # no such dataset or split, offline without a cached copy
        raise DataError(f"{name}: cannot import {what}: {type(e).__name__}: {str(e).splitlines()[0]}") from e
    column = "text" if "text" in ds.column_names else ds.column_names[0]
    for i, row in enumerate(ds):
        yield f"{name}[{split}]:{i + 1}", row[column]


def import_data(src: str, out: str, skip_invalid: bool = False, split: str = "train", limit: int | None = None) -> dict:
    """Import and write `out`; returns {"read", "written", "invalid", "labels_corrected", "errors"}."""
    report = ReadReport()
    if Path(src).is_file():
        samples: Iterator[Sample] = iter_samples(src, skip_invalid, report)
    else:
        if "/" not in src and not Path(src).is_dir():
            raise DataError(f"{no_such_file(src)} (and not a Hub dataset name like jrahn/rookworld_7m)")
        samples = _from_lines(_dataset_lines(src, split), skip_invalid, report)
    corrected = 0

    def counted() -> Iterator[Sample]:
        nonlocal corrected
        for i, s in enumerate(samples):
            if limit is not None and i >= limit:
                return
            if s.task == "P" and s.truth.label is not None and s.truth.label not in s.truth.best:
                corrected += 1
            yield s

    written = write_samples(out, counted())
    return {"read": report.read, "written": written, "invalid": report.invalid,
            "labels_corrected": corrected, "errors": report.errors}


def _from_lines(lines: Iterator[tuple[str, str]], skip_invalid: bool, report: ReadReport) -> Iterator[Sample]:
    for where, text in lines:
        if not text.strip():
            continue
        report.read += 1
        try:
            yield sample_from_line(text)
        except (FormatError, ValueError) as e:
            if not skip_invalid:
                raise DataError(f"{where}: {e}") from None
            report.invalid += 1
            if len(report.errors) < 10:
                report.errors.append(f"{where}: {e}")


def stats(path: str) -> dict:
    """Counts that tell whether a data file is fit to train on."""
    tasks: Counter = Counter()
    sources: Counter = Counter()
    fens: dict[str, set] = {"P": set(), "A": set()}
    env = Counter()
    n_moves = Counter()
    black = corrected = 0
    for s in iter_samples(path):
        tasks[s.task] += 1
        sources[s.source or "-"] += 1
        fens[s.task].add(s.fen)
        if s.task == "P":
            n_moves[len(s.truth.moves)] += 1
            black += s.fen.split()[1] == "b"
            corrected += s.truth.label is not None and s.truth.label not in s.truth.best
        else:
            t = s.truth
            kind = "illegal" if t.truncated else ("checkmate" if t.reward == 1.0 else ("draw" if t.terminated else "move"))
            env[kind] += 1
    return {
        "samples": sum(tasks.values()), "P": tasks["P"], "A": tasks["A"],
        "unique_fens_P": len(fens["P"]), "unique_fens_A": len(fens["A"]),
        "P_black_to_move": black, "P_candidate_counts": dict(sorted(n_moves.items())),
        "P_labels_not_best": corrected, "A_kinds": dict(env), "sources": dict(sources),
    }
