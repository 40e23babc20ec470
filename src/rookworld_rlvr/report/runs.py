"""The runs a report reads: one run directory's files, and per-step series of its metrics.

A run directory holds `metrics.jsonl` (one record per optimizer step, required),
`eval.jsonl` (one evaluation per line, base model first), `events.jsonl` (guard events),
`summary.json`, `config.yaml` and `match.json` (`rookworld match FINAL BASE --json RUN/match.json`; all
optional: a run still in progress has only some of them).
A bad last JSONL line is skipped: a live run may be mid-write. Any other line, or a `summary.json`,
`match.json` or `config.yaml` that cannot be read (all written whole), is skipped with a warning
naming it, so that a damaged file is not read as a shorter run.

Owns reading run directories. Pure Python (yaml inside a function): imports no torch, no chess.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from rookworld_rlvr.tables import flatten_metrics, number

@dataclass
class Run:
    """Everything the report reads from one run directory."""

    path: Path
    name: str
    metrics: list[dict]
    evals: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)  # guard events (events.jsonl): recoveries and stops
    match: dict = field(default_factory=dict)  # match.json: `rookworld match` of the final model against the base

    @property
    def stop(self) -> dict | None:
        """The guard event that stopped the run, if one did."""
        return next((e for e in reversed(self.events) if e.get("action") == "stop"), None)

    @property
    def base_eval(self) -> dict | None:
        """The base model's evaluation: summary.json, else the first eval.jsonl line."""
        return self.summary.get("base") or (self.evals[0] if self.evals else None)

    @property
    def final_eval(self) -> dict | None:
        """The last evaluation: summary.json, else the last eval.jsonl line (a run in progress)."""
        return self.summary.get("final") or (self.evals[-1] if self.evals else None)


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr)


def read_jsonl(path: Path) -> list[dict]:
    """JSON objects, one a line (gzip where the name ends in .gz); a bad last line is skipped (a live run may be
    mid-write), any other with a warning naming it."""
    if not path.is_file():
        return []
    rows = []
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = data.decode("utf-8", errors="replace").splitlines()
    for lineno, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif line.strip() and lineno < len(lines):
            _warn(f"{path}:{lineno}: skipped, not a JSON object: {line[:60]!r}")
    return rows


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    except yaml.YAMLError as e:
        data = e
    if not isinstance(data, dict):
        _warn(f"{path}: skipped, not a mapping of settings" + (f" ({data})" if isinstance(data, Exception) else ""))
        return {}
    return {str(k): v for k, v in data.items()}


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except ValueError as e:
        data = e
    if not isinstance(data, dict):
        _warn(f"{path}: skipped, not a JSON object" + (f" ({data})" if isinstance(data, Exception) else ""))
        return {}
    return data


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Read a run directory; FileNotFoundError naming the path when metrics.jsonl is missing."""
    path = Path(path)
    metrics_path = path / "metrics.jsonl"
    if not metrics_path.is_file():
        if path.is_file():  # metrics.jsonl itself, say, or a run's report.html
            raise FileNotFoundError(f"{path}: a file, not a run directory (give the folder that holds metrics.jsonl"
                                    + (f": {path.parent})" if (path.parent / "metrics.jsonl").is_file() else ")"))
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no such run directory")
        raise FileNotFoundError(f"{path}: no metrics.jsonl (not a GRPO run directory, nor a model with the log "
                                f"`rookworld sft` writes beside it, {path.name}.sft_log.jsonl?)")
    return Run(path=path, name=name or path.resolve().name, metrics=read_jsonl(metrics_path),
               evals=read_jsonl(path / "eval.jsonl"), config=_read_yaml(path / "config.yaml"),
               summary=_read_json(path / "summary.json"), events=read_jsonl(path / "events.jsonl"),
               match=_read_json(path / "match.json"))


def unique_names(paths: Sequence[Path]) -> list[str]:
    """Directory names, with the parent added where two runs share a name (legends must differ)."""
    names = [p.resolve().name for p in paths]
    return [f"{p.resolve().parent.name}/{n}" if names.count(n) > 1 else n for p, n in zip(paths, names)]


def series(records: Sequence[dict], key: str) -> tuple[list[float], list[float], int]:
    """(steps, finite values, number of non-finite values dropped) of `key`; absent records are skipped."""
    xs, ys, dropped = [], [], 0
    for i, rec in enumerate(records):
        v = number(rec.get(key))
        if v is None:
            continue
        if not math.isfinite(v):
            dropped += 1
            continue
        x = number(rec.get("step"))
        xs.append(x if x is not None else float(i + 1))
        ys.append(v)
    return xs, ys, dropped


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to `window` points (shorter at the start, so the line starts at step 1)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def is_noisy(values: Sequence[float]) -> bool:
    """Step-to-step jumps large against the range: a smoothed line then shows the trend."""
    if len(values) < 8:
        return False
    span = max(values) - min(values)
    if span <= 0:
        return False
    jumps = sorted(abs(b - a) for a, b in zip(values, values[1:]))
    return jumps[len(jumps) // 2] > 0.05 * span


def smoothing_window(n: int) -> int:
    return max(3, min(50, n // 10))


def eval_records(evals: Sequence[dict]) -> list[dict]:
    """Flat `section.metric` records with their step, so evaluations plot like metrics."""
    return [{"step": e.get("step", i), **flatten_metrics(e)} for i, e in enumerate(evals)]
