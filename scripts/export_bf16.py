#!/usr/bin/env python
"""A model directory as bf16 safetensors shards that fit what a GPU machine sends back (at most 8 files of
16 MiB, 64 MiB in all): `python scripts/export_bf16.py MODEL_DIR OUT_DIR [--shard-mb 15]`.

The export loads in float32 again with `rookworld_rlvr.model.load_policy` (bf16 rounds each weight to 8
significant bits; the copy is for shipping, training continues from the float32 checkpoint). Exit 1 when the
files would not come back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MAX_FILES, MAX_FILE_MB, MAX_TOTAL_MB = 8, 16, 64


def export(model_dir: Path, out: Path, shard_mb: int = 15) -> list[Path]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size=f"{shard_mb}MB")
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return sorted(p for p in out.iterdir() if p.is_file())


def check(files: list[Path]) -> list[str]:
    """What would keep the files from coming back from the GPU machine."""
    mb = {p.name: p.stat().st_size / 2**20 for p in files}
    problems = [f"{name}: {size:.1f} MiB > {MAX_FILE_MB}" for name, size in mb.items() if size > MAX_FILE_MB]
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files > {MAX_FILES}")
    if sum(mb.values()) > MAX_TOTAL_MB:
        problems.append(f"{sum(mb.values()):.1f} MiB in all > {MAX_TOTAL_MB}")
    return problems


def report(files: list[Path], label: str, where: Path) -> int:
    """Print what `files` come to and why they would not come back; the exit status (1: they would not)."""
    problems = check(files)
    total = sum(p.stat().st_size for p in files) / 2**20
    print(f"{label}: {len(files)} files, {total:.1f} MiB in {where}" + "".join(f"; {p}" for p in problems))
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--shard-mb", type=int, default=15)
    args = ap.parse_args(argv)
    return report(export(args.model_dir, args.out, args.shard_mb), "export_bf16", args.out)


if __name__ == "__main__":
    sys.exit(main())
