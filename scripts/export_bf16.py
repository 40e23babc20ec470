#!/usr/bin/env python
"""A model directory as bf16 safetensors shards that fit what a GPU machine sends back (at most 8 files of
16 MiB, 64 MiB in all): `python scripts/export_bf16.py MODEL_DIR OUT_DIR [--shard-mb 15]`.

The export loads in float32 again with `rookworld_rlvr.model.load_policy` (bf16 rounds each weight to 8
significant bits; the copy is for shipping, training continues from the float32 checkpoint). Exit 1 when the
files would not come back.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

MAX_FILES, MAX_FILE_MB, MAX_TOTAL_MB = 8, 16, 64
# what from_pretrained reads beside the weights: copied as they are (config.json with its dtype set to bfloat16)
BESIDE_WEIGHTS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json")


def export(model_dir: Path, out: Path, shard_mb: int = 15) -> list[Path]:
    """The weights cast to bf16 and written in shards of at most `shard_mb` MB with an index (huggingface_hub's
    `save_torch_state_dict`: the shard and index names `save_pretrained` writes), the other files beside them.
    Tensors in, tensors out: the model is never built, so transformers is not imported (2.6 s an export instead
    of 5.0 on 2 CPU cores; a GPU call exports two to four times against its deadline)."""
    import torch
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files or not (model_dir / "config.json").is_file():
        raise SystemExit(f"export_bf16: {model_dir} is no model directory (no *.safetensors weights or no config.json)")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(f))
    out.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()},
                          out, max_shard_size=f"{shard_mb}MB")
    for name in BESIDE_WEIGHTS:
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, out / name)
    config = json.loads((out / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
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
