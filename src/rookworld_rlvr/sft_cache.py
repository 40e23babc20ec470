"""The training rows of `rookworld sft`, read and encoded once and kept in a file (`--rows-cache`).

Reading and encoding 1.5M samples costs minutes of a GPU machine's time before the first step, and
again at every resume. The cache holds the rows of one data file for one tokenizer and encoding
(layout, order, legal sets) as flat integer arrays in safetensors (never a pickle), keyed by the
data file's SHA-256 and those settings: a resume, or a run that another process prepared the rows
for (`--encode-only`), reads them in seconds; other data or settings encode afresh and replace the
file. Owns the file format and filling it; `sft_rows` owns the rows. Imports the data reader (`data.io`); numpy
and safetensors inside functions.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing as mp
import time
from pathlib import Path

from rookworld_rlvr.data.io import data_lines, file_sha256, gc_paused, parse_lines, read_samples
from rookworld_rlvr.interrupt import chunk_size, forked_pool, pool_size
from rookworld_rlvr.sft_rows import Row, encode, encode_many

FORMAT = 1
TASKS = ("P", "A")


def cache_key(data: str | Path, tokenizer, layout: str, order: str, legal: bool) -> str:
    """What the rows depend on: the data's bytes, the tokenizer's rules and the encoding settings."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    rules = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return json.dumps({"format": FORMAT, "data_sha256": file_sha256(data),
                       "tokenizer_sha256": hashlib.sha256(rules.encode()).hexdigest(), "eos": tokenizer.eos_token_id,
                       "layout": layout, "order": order, "legal": legal}, sort_keys=True)


def _offsets(lengths: list[int]):
    import numpy as np

    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


def _arrays(by_task: dict[str, list[Row]], token) -> dict:
    """The rows (data rows only: no own-answer fields) as the cache's flat arrays, token ids as `token`."""
    import numpy as np

    arrays = {}
    for task in TASKS:
        rows = by_task.get(task, [])
        if any(r.learn_from is not None or r.weight != 1.0 for r in rows):
            raise ValueError("the rows cache holds data rows only (no learn_from, weight 1)")
        legal = [entry for r in rows for entry in r.legal]
        arrays.update({
            f"{task}.ids": np.fromiter(itertools.chain.from_iterable(r.ids for r in rows), token),
            f"{task}.ids_off": _offsets([len(r.ids) for r in rows]),
            f"{task}.prompt_len": np.array([r.prompt_len for r in rows], np.int32),
            f"{task}.bans": np.array([b for r in rows for b in r.bans], np.int32).reshape(-1, 2),
            f"{task}.bans_off": _offsets([len(r.bans) for r in rows]),
            f"{task}.moves": np.frombuffer("\n".join(" ".join(r.moves) for r in rows).encode(), np.uint8).copy(),
            f"{task}.legal_pos": np.array([p for p, _ in legal], np.int32),
            f"{task}.legal_off": _offsets([len(r.legal) for r in rows]),
            f"{task}.legal_ids": np.fromiter(itertools.chain.from_iterable(ids for _, ids in legal), token),
            f"{task}.legal_ids_off": _offsets([len(ids) for _, ids in legal]),
        })
    return arrays


def _concat(parts: list[dict]) -> dict:
    """Consecutive parts' arrays as one: offsets moved on by what came before, move lists joined."""
    import numpy as np

    out = {}
    for task in TASKS:
        for name in ("ids", "prompt_len", "bans", "legal_pos", "legal_ids"):
            out[f"{task}.{name}"] = np.concatenate([p[f"{task}.{name}"] for p in parts])
        for name in ("ids_off", "bans_off", "legal_off", "legal_ids_off"):
            offs, total = [np.zeros(1, np.int64)], 0
            for p in parts:
                offs.append(p[f"{task}.{name}"][1:] + total)
                total = int(offs[-1][-1]) if len(offs[-1]) else total
            out[f"{task}.{name}"] = np.concatenate(offs)
        moves = [bytes(p[f"{task}.moves"]) for p in parts if len(p[f"{task}.prompt_len"])]
        out[f"{task}.moves"] = np.frombuffer(b"\n".join(moves), np.uint8).copy()
    return out


def _write(path: str | Path, arrays: dict, key: str) -> None:
    from safetensors.numpy import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(arrays, str(tmp), metadata={"key": key})
    tmp.replace(path)


_JOB: tuple | None = None  # (path, lines, tokenizer, layout, order, legal, token): set before the fork


def _encode_part(bounds: tuple[int, int]) -> dict:
    path, lines, tokenizer, layout, order, legal, token = _JOB
    samples = parse_lines(path, lines[bounds[0]:bounds[1]])
    return _arrays({t: encode(tokenizer, [s for s in samples if s.task == t], layout, order, legal) for t in TASKS},
                   token)


def encode_into(cache: str | Path, key: str, data: str | Path, tokenizer, layout: str, order: str, legal: bool,
                workers: int | None = None) -> int:
    """Fill `cache` from `data` with no rows in this process: forked workers (default: `interrupt.pool_size()`,
    the cores it may use, at most 16) each parse, encode and flatten a part of the lines, and this process joins
    their arrays. Reading samples and rows back into one process was most of --encode-only's time (on 2 cores 130
    of 313 s for 1.4M rows, and it does not spread over more cores). Token ids as uint16 where the vocabulary
    fits (half the bytes); returns the count."""
    import numpy as np

    global _JOB
    lines = list(data_lines(Path(data)))
    token = np.uint16 if len(tokenizer) <= 2**16 else np.int32
    workers = workers or pool_size()
    size = chunk_size(len(lines), workers)
    bounds = [(i, i + size) for i in range(0, len(lines), size)] or [(0, 0)]
    _JOB = (data, lines, tokenizer, layout, order, legal, token)  # the workers inherit it: no line is pickled to them
    try:
        if workers > 1 and "fork" in mp.get_all_start_methods():
            with forked_pool(workers) as pool:  # as read_samples: the workers never run torch
                parts = pool.map(_encode_part, bounds)
        else:
            parts = [_encode_part(b) for b in bounds]
    finally:
        _JOB = None
    arrays = _concat(parts)
    _write(cache, arrays, key)
    return sum(len(arrays[f"{t}.prompt_len"]) for t in TASKS)


def load_rows(path: str | Path, key: str) -> dict[str, list[Row]] | None:
    """The rows kept at `path` for `key`; None where the file holds another key's rows. A damaged file is
    an error that names it (delete it to encode afresh)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "np") as fh:
            if (fh.metadata() or {}).get("key") != key:
                return None
            arrays = {name: fh.get_tensor(name) for name in fh.keys()}
        with gc_paused():  # millions of rows made (gc_paused says what it saves)
            return {task: _rows(arrays, task) for task in TASKS}
    except (OSError, ValueError, KeyError, IndexError, SafetensorError) as exc:
        raise ValueError(f"sft.rows_cache: {path}: not a readable rows cache ({exc}); delete it to encode the "
                         "data afresh") from exc


def _stored_key(path: str | Path) -> str | None:
    """The key a cache file was written for; None where it cannot be read."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "np") as fh:
            return (fh.metadata() or {}).get("key")
    except (OSError, SafetensorError):
        return None


def _rows(arrays: dict, task: str) -> list[Row]:
    get = lambda name: arrays[f"{task}.{name}"]  # noqa: E731
    ids_off, bans_off, legal_off, legal_ids_off = (get(n).tolist() for n in ("ids_off", "bans_off", "legal_off",
                                                                            "legal_ids_off"))
    n = len(ids_off) - 1
    ids, prompt_len = get("ids").tolist(), get("prompt_len").tolist()
    bans = [tuple(b) for b in get("bans").tolist()]
    legal_pos, legal_ids = get("legal_pos").tolist(), get("legal_ids").tolist()
    sets = [(legal_pos[j], tuple(legal_ids[legal_ids_off[j]:legal_ids_off[j + 1]])) for j in range(len(legal_pos))]
    moves = bytes(get("moves")).decode().split("\n") if n else []
    if not (len(prompt_len) == n == len(bans_off) - 1 == len(legal_off) - 1 == len(moves)
            and ids_off[-1] == len(ids) and bans_off[-1] == len(bans) and legal_off[-1] == len(sets)
            and legal_ids_off[-1] == len(legal_ids)):
        raise ValueError(f"the {task}: arrays disagree in length")
    return [Row(ids[ids_off[i]:ids_off[i + 1]], prompt_len[i], tuple(bans[bans_off[i]:bans_off[i + 1]]),
                tuple(moves[i].split()), legal=tuple(sets[legal_off[i]:legal_off[i + 1]])) for i in range(n)]


def training_rows(data: str | Path, tokenizer, layout: str, order: str, legal: bool,
                  cache: str | Path | None = None, say=print, load: bool = True) -> dict[str, list[Row]]:
    """The rows of `data` by task: from `cache` when it holds them, else read, encoded and (with `cache`) kept.
    With `load` False (filling the cache only), a cache that holds them is left as it is and nothing is returned."""
    if not cache:
        samples = read_samples(data)
        return {t: encode_many(tokenizer, [s for s in samples if s.task == t], layout, order, legal=legal) for t in TASKS}
    start = time.monotonic()  # the seconds the messages give: a GPU machine's minutes before the first step

    def took() -> str:
        return f" ({time.monotonic() - start:.1f} s)"

    key = cache_key(data, tokenizer, layout, order, legal)
    if Path(cache).exists():
        if not load and _stored_key(cache) == key:
            say(f"sft: the rows cache {cache} holds these rows already")
            return {}
        if load and (rows := load_rows(cache, key)) is not None:
            say(f"sft: {sum(map(len, rows.values()))} rows from the rows cache {cache}{took()}")
            return rows
        say(f"sft: the rows cache {cache} does not hold these rows (other data or settings): encoding afresh")
    n = encode_into(cache, key, data, tokenizer, layout, order, legal)
    rows = load_rows(cache, key) if load else {}  # the rows as the cache gives them: the same as encoding's
    say(f"sft: {n} rows kept in {cache}{took()}")
    return rows
