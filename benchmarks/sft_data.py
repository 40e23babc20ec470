"""What `rookworld sft` does before its first step, in one process and in several: reading a sample file
(`read_samples`) and turning it into token rows (`encode` against `encode_many`), the rows cache that spares
a resume both (`sft --rows-cache`: written, read back, equal), and `sft --encode-only`'s way of filling it, where
the workers parse, encode and flatten parts of the file (`encode_into`: the same arrays).

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
from rookworld_rlvr.sft_cache import cache_key, encode_into, load_rows, save_rows
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
    _, t_save = timed(lambda: save_rows(cache, by_task, key))
    back, t_load = timed(lambda: load_rows(cache, key))
    assert back == by_task
    filled = cache + ".filled"
    _, t_fill = timed(lambda: encode_into(filled, key, args.data, tok, "compact", "best-first", False,
                                          workers=args.workers))
    assert load_rows(filled, key) == by_task
    os.remove(filled)
    n = len(one)
    print(f"{n} rows of {args.data}, {args.workers} workers on {os.cpu_count()} cores")
    print(f"rows cache (sft --rows-cache): {os.path.getsize(cache) / 1e6:.0f} MB, key {t_key:.1f} s, written in "
          f"{t_save:.1f} s, read back in {t_load:.1f} s ({t_load / n * 1e6:.0f} us/row)")
    os.remove(cache)
    print(f"sft --encode-only (encode_into, {args.workers} workers): {t_fill:.1f} s ({t_fill / n * 1e6:.0f} us/row), "
          f"where read_samples, encode_many and the write take {t_read + t_enc + t_save:.1f} s")
    print("| step | 1 process s | us/row | {w} processes s | us/row | speed-up |".format(w=args.workers))
    print("|---|---|---|---|---|---|")
    for name, a, b in (("read_samples", t_read1, t_read), ("encode", t_enc1, t_enc)):
        print(f"| {name} | {a:.1f} | {a / n * 1e6:.0f} | {b:.1f} | {b / n * 1e6:.0f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
