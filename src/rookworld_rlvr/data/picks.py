"""Picks: which of a game record's replayed samples a training set keeps, so that the merges that chose them
need not run again.

Taking a record's new samples (scripts/gpu_more_data.sh) is a replay, which spreads over every core, and two
`data merge` runs, which re-read the known training set and spend most of their time in one process: about a
minute each per record on a fast core, in a row for three records, while a GPU waits for the data. Their result
depends only on the record, the known set and the held-out files, so it is computed once where time is cheap
(`rookworld data picks`: the replay's shards and the merged files give, for each shard line, whether the merges
kept that sample) and shipped as a small file. `rookworld data replay RECORD --picks PICKS` then plays the games
on every core and keeps the picked samples as it goes: no shard files, no merge. The picked samples must hash to
what the merges kept (the SHA-256 of their sorted lines), so the result is the same rows, or an error.

A picks file is xz JSON lines: a header (format, the record's SHA-256, the recipe key, counts, digest), then one
line per shard: its sample count and its kept lines as a bitmap (base64). The key names what the merges depended
on besides the record (the known set, the held-out files, the A: cap); the caller builds it and a file made for
another key is refused.

Owns the picks format: making a picks file and replaying a record with one. Imports python-chess (through the
records and the generator); no torch, no engine.
"""

from __future__ import annotations

import base64
import hashlib
import json
import lzma
import multiprocessing as mp
import random
from pathlib import Path

from rookworld_rlvr.data.io import DataError, Sample, atomic_write_text, file_sha256, iter_samples, read_samples

FORMAT = "rookworld-picks/1"


def row_text(s: Sample) -> str:
    """A sample's line as `write_samples(truth_only=True)` writes it (without rendering what it leaves out)."""
    row = {"task": s.task, "truth": s.truth.to_dict(), **({"source": s.source} if s.source else {})}
    return json.dumps(row, separators=(",", ":")) + "\n"


def rows_digest(rows: list[str]) -> str:
    """The identity of a set of samples: their lines, sorted, hashed (order-free: the merges shuffle)."""
    return hashlib.sha256("".join(sorted(rows)).encode()).hexdigest()


def pack(bits: list[bool]) -> str:
    out = bytearray((len(bits) + 7) // 8)
    for i, b in enumerate(bits):
        if b:
            out[i >> 3] |= 1 << (i & 7)
    return base64.b64encode(bytes(out)).decode()


def unpack(text: str, n: int) -> list[bool]:
    raw = base64.b64decode(text.encode(), validate=True)
    if len(raw) != (n + 7) // 8:
        raise ValueError(f"a bitmap of {len(raw)} bytes for {n} samples")
    return [bool(raw[i >> 3] >> (i & 7) & 1) for i in range(n)]


def _shard_rows(path: Path) -> list[str]:
    return [row_text(s) for s in iter_samples(path)]


def make_picks(record: str | Path, replay_dir: str | Path, merged: list[str | Path], out: str | Path, key: str,
               workers: int = 2) -> dict:
    """A picks file for `record` from its replay (`data replay --out replay_dir`, shards kept) and the files
    the merges wrote from it: each merged sample is found, truth and all, at its first line in the shards, in
    shard order (the line the replay's deduplication kept)."""
    from rookworld_rlvr.data import generate as gen
    from rookworld_rlvr.data.records import read_header

    recorded = read_header(record)["config"]
    cfg = gen.config_of(replay_dir)
    if gen.recorded_settings(cfg) != recorded:
        raise ValueError(f"{replay_dir}: not a replay of {record} (another configuration)")
    wanted = {row_text(s): s.task for path in merged for s in read_samples(path)}
    shards = [gen._shard_path(cfg, s) for s in range(-(-cfg.games // cfg.games_per_shard))]
    missing = [p for p in shards if not p.exists()]
    if missing:
        raise ValueError(f"{replay_dir}: {len(missing)} of {len(shards)} shards are missing (a replay not finished)")
    with mp.get_context("spawn").Pool(workers) as pool:
        shard_rows = pool.map(_shard_rows, shards, chunksize=8)
    claimed: set[str] = set()
    lines = []
    for i, rows in enumerate(shard_rows):
        bits = []
        for row in rows:
            bits.append(row in wanted and row not in claimed)
            if bits[-1]:
                claimed.add(row)
        lines.append(json.dumps({"shard": i, "samples": len(rows), "keep": pack(bits)}) + "\n")
    if len(claimed) != len(wanted):
        raise ValueError(f"{len(wanted) - len(claimed)} of the {len(wanted)} samples of {', '.join(map(str, merged))} "
                         f"are not in the replay of {record} (merged from another record?)")
    counts = {t: sum(v == t for v in wanted.values()) for t in ("P", "A")}
    header = {"format": FORMAT, "record": Path(record).name, "record_sha256": file_sha256(record), "key": key,
              "samples": counts, "digest": rows_digest(list(wanted))}
    atomic_write_text(out, [json.dumps(header) + "\n", *lines])
    return {"out": str(out), "picked": counts, "shards": len(shards), "bytes": Path(out).stat().st_size}


def read_picks(path: str | Path) -> tuple[dict, list[list[bool]]]:
    """A picks file's header and its bitmaps, one per shard in order; anything else is a DataError naming it."""
    try:
        with lzma.open(path, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh]
        header = rows[0]
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ValueError(f"its first line must name format {FORMAT!r}")
        bitmaps = []
        for i, row in enumerate(rows[1:]):
            if row.get("shard") != i:
                raise ValueError(f"line {i + 2}: expected shard {i}")
            bitmaps.append(unpack(row["keep"], row["samples"]))
    except (OSError, EOFError, lzma.LZMAError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise DataError(f"{path}: not a readable picks file ({e}); make it again with `rookworld data picks`") from None
    return header, bitmaps


def _picked_shard(args: tuple) -> tuple[list[str], list[str]]:
    """One shard's games replayed on the record's answers; its picked samples as truth-only lines (P:, A:)."""
    from rookworld_rlvr.data.generate import play_game
    from rookworld_rlvr.data.records import ReplayPool

    cfg, shard, games, bits, where = args
    samples: list[Sample] = []
    for g in games:
        pool = ReplayPool(g, where)
        samples.extend(play_game(g.game, cfg, pool))
        pool.check_done()
    if len(samples) != len(bits):
        raise DataError(f"{where}: shard {shard} made {len(samples)} samples, its picks know {len(bits)} (the replay "
                        "differs from the one the picks were made from)")
    rows: dict[str, list[str]] = {"P": [], "A": []}
    for s, keep in zip(samples, bits):
        if keep:
            rows[s.task].append(row_text(s))
    return rows["P"], rows["A"]


def replay_picks(record: str | Path, picks: str | Path, key: str, out_p: str | Path, out_a: str | Path,
                 workers: int = 2) -> dict:
    """The record's picked samples, replayed on `workers` processes, written truth-only (shuffled, seeded) to
    out_p (P:) and out_a (A:); refused when the picks were made for another record or another key, and an
    error when what the replay picks is not what the merges kept."""
    from rookworld_rlvr.data import generate as gen
    from rookworld_rlvr.data.records import read_records

    header, bitmaps = read_picks(picks)
    if header.get("record_sha256") != file_sha256(record):
        raise DataError(f"{picks}: made for another record than {record} (its SHA-256 differs)")
    if header.get("key") != key:
        raise DataError(f"{picks}: made for another recipe (key {header.get('key')!r}, this one {key!r}): take the "
                        "samples with `data replay` and `data merge`, as scripts/gpu_more_data.sh does")
    recorded, games = read_records(record)
    cfg = gen.config_from(recorded["config"], Path(out_p).parent, workers)
    per = cfg.games_per_shard
    if len(bitmaps) != -(-len(games) // per):
        raise DataError(f"{picks}: {len(bitmaps)} shards, {record} has {-(-len(games) // per)}")
    jobs = [(cfg, i, games[i * per:(i + 1) * per], bits, str(record)) for i, bits in enumerate(bitmaps)]
    rows: dict[str, list[str]] = {"P": [], "A": []}
    with mp.get_context("spawn").Pool(workers) as pool:
        for p, a in pool.imap(_picked_shard, jobs, chunksize=4):
            rows["P"] += p
            rows["A"] += a
    counts = {t: len(rows[t]) for t in ("P", "A")}
    if counts != header.get("samples") or rows_digest(rows["P"] + rows["A"]) != header.get("digest"):
        raise DataError(f"{picks}: the replay picked {counts} samples, not the {header.get('samples')} the merges kept "
                        "(or other ones): the replay differs from the one the picks were made from")
    for task, path in (("P", out_p), ("A", out_a)):
        random.Random(f"picks:{task}").shuffle(rows[task])
        atomic_write_text(path, rows[task])
    return {"P": counts["P"], "A": counts["A"], "out": [str(out_p), str(out_a)]}
