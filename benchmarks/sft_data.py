"""What `rookworld sft` does before its first step, in one process and in several: reading a sample file
(`read_samples`) and turning it into token rows (`encode` against `encode_many`), the rows cache that spares
a resume both (`sft --rows-cache`, filled as `sft --encode-only` fills it: the workers parse, encode and flatten
parts of the file, `encode_into`; then read back, equal).

    python benchmarks/sft_data.py [--data data/train.jsonl.xz] [--workers 8]

On a GPU machine these minutes are GPU minutes: its base trains on about 1.5M rows (scripts/gpu_base.sh). Prints
seconds and microseconds per row for each, and checks that both ways give the same samples and rows.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from rookworld_rlvr.chess_tokenizers import build_board_tokenizer
from rookworld_rlvr.data.io import read_samples
from rookworld_rlvr.sft_cache import cache_key, encode_into, load_rows
from rookworld_rlvr.sft_rows import encode, encode_many


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/train.jsonl.xz")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    one, t_read1 = timed(lambda: read_samples(args.data, workers=1))
    many, t_read = timed(lambda: read_samples(args.data, workers=args.workers))
    assert many == one
    tok = build_board_tokenizer()
    rows1, t_enc1 = timed(lambda: encode(tok, one, "compact", "best-first"))
    rows, t_enc = timed(lambda: encode_many(tok, one, "compact", "best-first", workers=args.workers))
    assert rows == rows1
    by_task = {t: [r for r, s in zip(rows, one) if s.task == t] for t in ("P", "A")}
    cache = os.path.join(tempfile.mkdtemp(prefix="sft-rows-"), "rows.safetensors")
    key, t_key = timed(lambda: cache_key(args.data, tok, "compact", "best-first", False))
    _, t_fill = timed(lambda: encode_into(cache, key, args.data, tok, "compact", "best-first", False,
                                          workers=args.workers))
    back, t_load = timed(lambda: load_rows(cache, key))
    assert back == by_task
    n = len(one)
    print(f"{n} rows of {args.data}, {args.workers} workers on {os.cpu_count()} cores")
    print(f"rows cache (sft --rows-cache): {os.path.getsize(cache) / 1e6:.0f} MB, key {t_key:.1f} s, filled by "
          f"{args.workers} workers in {t_fill:.1f} s ({t_fill / n * 1e6:.0f} us/row; read_samples and encode_many take "
          f"{t_read + t_enc:.1f} s), read back in {t_load:.1f} s ({t_load / n * 1e6:.0f} us/row)")
    os.remove(cache)
    print("| step | 1 process s | us/row | {w} processes s | us/row | speed-up |".format(w=args.workers))
    print("|---|---|---|---|---|---|")
    for name, a, b in (("read_samples", t_read1, t_read), ("encode", t_enc1, t_enc)):
        print(f"| {name} | {a:.1f} | {a / n * 1e6:.0f} | {b:.1f} | {b / n * 1e6:.0f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
