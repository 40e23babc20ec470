#!/usr/bin/env python
"""The SFT calls behind a GPU base, kept beside it (`sft_history.jsonl` in its meta.tar), so that a base trained on
several GPU machines in turn (`scripts/gpu_base.sh --init`) says what it cost in all:

    python scripts/sft_history.py count MODEL_DIR      # the calls that trained MODEL_DIR (gpu_base.sh's seed)
    python scripts/sft_history.py describe MODEL_DIR   # the same in words: calls, steps, samples, minutes
    python scripts/sft_history.py write OUT --log L --state S [--init MODEL_DIR]   # MODEL_DIR's calls and this one

One JSON line a call: `init` (the model it started from; null: a fresh one), `steps`, `batch_size`, `samples`,
`minutes`. A model with no history but an `sft_log.jsonl` (a base sent back before histories were kept) counts as
one call of its log's steps; a model with neither as one call of unknown cost. Imports no torch: seconds matter on
a GPU machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

UNKNOWN = {"init": None, "steps": None, "batch_size": None, "samples": None, "minutes": None}


def _objects(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file, blank lines skipped; one that is not an object stops with its file:line."""
    found = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"sft_history: {path}:{n}: not a JSON line ({e.msg})") from None
        if not isinstance(value, dict):
            raise SystemExit(f"sft_history: {path}:{n}: not a JSON object")
        found.append(value)
    return found


def earlier(model: Path) -> list[dict]:
    """The calls that trained `model`, oldest first."""
    if (model / "sft_history.jsonl").exists():
        return _objects(model / "sft_history.jsonl")
    if (model / "sft_log.jsonl").exists() and (log := _objects(model / "sft_log.jsonl")):
        return [{**UNKNOWN, "steps": log[-1].get("step"), "minutes": log[-1].get("minutes")}]
    return [dict(UNKNOWN)]


def this_call(log: Path, state: Path, init: Path | None) -> dict:
    """One call's line from its SFT log (the last step and its seconds, over resumes) and checkpoint (the batch)."""
    last = _objects(log)[-1]
    batch = json.loads(state.read_text())["config"]["batch_size"]
    return {"init": str(init) if init else None, "steps": last["step"], "batch_size": batch,
            "samples": last["step"] * batch, "minutes": round(last["seconds"] / 60, 2)}


def describe(calls: list[dict]) -> str:
    """`2 calls: 14,000 steps, 3.58M samples, 17.0 minutes` (a figure a call did not record: `... not recorded`)."""
    def total(key: str):
        values = [c.get(key) for c in calls]
        return None if any(v is None for v in values) else sum(values)

    steps, samples, minutes = total("steps"), total("samples"), total("minutes")
    return f"{len(calls)} call{'' if len(calls) == 1 else 's'}: " + ", ".join([
        "steps not recorded" if steps is None else f"{steps:,} steps",
        "samples not recorded" if samples is None else f"{samples / 1e6:.2f}M samples",
        "minutes not recorded" if minutes is None else f"{minutes:.1f} minutes"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    for verb in ("count", "describe"):
        sub.add_parser(verb).add_argument("model", type=Path)
    w = sub.add_parser("write")
    w.add_argument("out", type=Path)
    w.add_argument("--log", type=Path, required=True)
    w.add_argument("--state", type=Path, required=True)
    w.add_argument("--init", type=Path)
    args = ap.parse_args(argv)
    if args.verb == "count":
        print(len(earlier(args.model)))
    elif args.verb == "describe":
        print(describe(earlier(args.model)))
    else:
        calls = (earlier(args.init) if args.init else []) + [this_call(args.log, args.state, args.init)]
        args.out.write_text("".join(json.dumps(c) + "\n" for c in calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
