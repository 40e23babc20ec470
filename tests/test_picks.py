"""Picks: a record's replay keeps the samples the merges chose, without the merges, and the same samples or an
error; scripts/gpu_base.sh takes a record's picks where they were made for the same data, and says when not."""

from __future__ import annotations

import base64
import gzip
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import held_out_files
from rookworld_rlvr.cli import main
from rookworld_rlvr.data.generate import GenerateConfig, generate
from rookworld_rlvr.data.io import DataError
from rookworld_rlvr.data.picks import make_picks, read_picks, replay_picks
from rookworld_rlvr.data.records import record

REPO = Path(__file__).resolve().parents[1]


def _record(root: Path, games: int, seed: int) -> Path:
    cfg = GenerateConfig(out_dir=str(root / f"gen{seed}"), games=games, games_per_shard=2, max_plies=20, workers=1,
                         depth=2, eval_per_task=3, eval_permille=200, seed=seed)
    generate(cfg, progress=False)
    rec = root / f"games{seed}.jsonl.xz"
    record(cfg.out_dir, rec, workers=1, progress=False)
    return rec


@pytest.fixture(scope="module")
def merged(tmp_path_factory, stockfish_path):
    """A record, its replay, and what two merges kept of it (the training side's P:, 7 of its A:)."""
    root = tmp_path_factory.mktemp("picks")
    rec = _record(root, 5, 4)
    assert main(["data", "replay", str(rec), "--out", str(root / "replay"), "--workers", "2", "--quiet"]) == 0
    train = str(root / "replay" / "train.jsonl.gz")
    assert main(["data", "merge", train, "--out", str(root / "more_p.jsonl"), "--tasks", "P", "--side", "train",
                 "--truth-only", "--seed", "more"]) == 0
    assert main(["data", "merge", train, "--out", str(root / "more_a.jsonl"), "--tasks", "A", "--side", "train",
                 "--truth-only", "--seed", "more", "--max", "7"]) == 0
    picks = root / "games.picks.xz"
    assert main(["data", "picks", str(rec), "--replay", str(root / "replay"), "--merged", str(root / "more_p.jsonl"),
                 str(root / "more_a.jsonl"), "--key", "k1", "--out", str(picks), "--workers", "2"]) == 0
    return root, rec, picks


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return sorted(fh)


def test_a_replay_with_picks_writes_the_merged_samples_and_no_shards(merged, tmp_path, capsys):
    root, rec, picks = merged
    capsys.readouterr()
    assert main(["data", "replay", str(rec), "--picks", str(picks), "--key", "k1", "--out", str(tmp_path / "o"),
                 "--workers", "2"]) == 0
    assert '"P": ' in capsys.readouterr().out
    for name in ("more_p.jsonl", "more_a.jsonl"):  # the same rows, byte for byte (in another order)
        assert _lines(tmp_path / "o" / name) == _lines(root / name)
    assert len(_lines(tmp_path / "o" / "more_a.jsonl")) == 7 and len(_lines(tmp_path / "o" / "more_p.jsonl")) > 20
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["more_a.jsonl", "more_p.jsonl"]
    header, bitmaps = read_picks(picks)
    assert header["samples"] == {"P": len(_lines(root / "more_p.jsonl")), "A": 7} and len(bitmaps) == 3


def test_picks_for_another_recipe_or_record_are_refused(merged, tmp_path, stockfish_path):
    root, rec, picks = merged
    out_p, out_a = tmp_path / "p.jsonl", tmp_path / "a.jsonl"
    with pytest.raises(DataError, match="made for another recipe"):
        replay_picks(rec, picks, "k2", out_p, out_a)
    other = _record(tmp_path, 3, 5)
    with pytest.raises(DataError, match="made for another record"):
        replay_picks(other, picks, "k1", out_p, out_a)
    # picks from merged files of another record than the one named
    assert main(["data", "replay", str(other), "--out", str(tmp_path / "r"), "--workers", "1", "--quiet"]) == 0
    with pytest.raises(ValueError, match="are not in the replay"):
        make_picks(other, tmp_path / "r", [root / "more_p.jsonl"], tmp_path / "x.picks.xz", "k1", workers=1)
    assert main(["data", "picks", str(other), "--replay", str(tmp_path / "r"), "--merged", str(root / "more_p.jsonl"),
                 "--key", "k1", "--out", str(tmp_path / "x.picks.xz"), "--workers", "1"]) == 1  # one line, no traceback
    # a sample of this record's position with other content (an eval changed): found by its whole line, not its FEN
    rows = [json.loads(line) for line in (root / "more_p.jsonl").read_text().splitlines()]
    rows[0]["truth"]["evals"][0] += 0.01
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"^1 of the \d+ samples of .* are not in the replay"):
        make_picks(rec, root / "replay", [edited], tmp_path / "x.picks.xz", "k1", workers=1)
    assert not out_p.exists() and not out_a.exists() and not (tmp_path / "x.picks.xz").exists()
    assert main(["data", "replay", str(rec), "--picks", str(picks), "--out", str(tmp_path / "o")]) == 1  # no --key
    assert main(["data", "replay", str(rec), "--key", "k1", "--out", str(tmp_path / "o")]) == 1  # no --picks
    assert not (tmp_path / "o").exists()


def test_damaged_or_altered_picks_are_named_and_write_nothing(merged, tmp_path):
    root, rec, picks = merged
    out_p, out_a = tmp_path / "p.jsonl", tmp_path / "a.jsonl"
    damaged = tmp_path / "damaged.picks.xz"
    damaged.write_bytes(picks.read_bytes()[:40])
    with pytest.raises(DataError, match=f"{damaged}: not a readable picks file"):
        replay_picks(rec, damaged, "k1", out_p, out_a)
    # one kept sample dropped from a shard's bitmap: the replay picks other samples than the merges kept
    lines = lzma.decompress(picks.read_bytes()).decode().splitlines(keepends=True)
    row = json.loads(lines[1])
    raw = bytearray(base64.b64decode(row["keep"]))
    first = next(i for i in range(len(raw) * 8) if raw[i >> 3] >> (i & 7) & 1)
    raw[first >> 3] ^= 1 << (first & 7)
    lines[1] = json.dumps({**row, "keep": base64.b64encode(bytes(raw)).decode()}) + "\n"
    altered = tmp_path / "altered.picks.xz"
    altered.write_bytes(lzma.compress("".join(lines).encode()))
    with pytest.raises(DataError, match="the replay picked"):
        replay_picks(rec, altered, "k1", out_p, out_a)
    assert not out_p.exists() and not out_a.exists()


@pytest.mark.slow(seconds=16)
def test_gpu_base_takes_the_records_picks_and_the_same_data_comes_out(tmp_path, stockfish_path):
    """--make-picks replays and merges each record and writes its picks beside it; the next run takes them (no
    merge) and trains on the same rows; a run on other data (the second record alone) replays and merges it,
    and says why."""
    recs = []
    for n in (3, 5):  # as in tests/test_gpu_rl.py: the first 3 games the same (the second's merges need the first's)
        folder = tmp_path / str(n)
        cfg = GenerateConfig(out_dir=str(folder / "gen"), games=n, max_plies=16, workers=1, depth=2, seed=9)
        generate(cfg, progress=False)
        recs.append(folder / "games.jsonl.xz")
        record(cfg.out_dir, recs[-1], workers=1, progress=False)
    env = {**os.environ, "PYTHON": sys.executable}

    def run(work: str, *args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_base.sh"), str(tmp_path / "out"), "--smoke",
                               "--data-only", *args], capture_output=True, text=True, timeout=600,
                              env={**env, "WORK": str(tmp_path / work)})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    both = ["--more-games", str(recs[0]), "--more-games", str(recs[1])]
    made = run("w1", *both, "--make-picks")
    assert made.stdout.count("replayed and merged at +") == 2
    assert all((r.parent / "games.picks.xz").exists() for r in recs)
    taken = run("w2", *both)
    assert all(f"{r} replayed with its picks ({r.parent / 'games.picks.xz'}) at +" in taken.stdout for r in recs)
    assert "merged" not in taken.stdout and not list((tmp_path / "w2").glob("more-*/replay"))
    assert _lines(tmp_path / "w2" / "train.jsonl.gz") == _lines(tmp_path / "w1" / "train.jsonl.gz")
    alone = run("w3", "--more-games", str(recs[1]))  # no first record: its merges keep other samples
    assert f"{recs[1].parent / 'games.picks.xz'} was made for other data" in alone.stdout
    assert f"{recs[1]} replayed and merged at +" in alone.stdout
    (recs[0].parent / "games.picks.xz").write_bytes(b"not xz")  # a damaged picks file: said, and merged instead
    damaged = run("w4", *both)
    assert f"{recs[0].parent / 'games.picks.xz'} cannot be read: {recs[0]} is replayed and merged" in damaged.stdout
    assert f"{recs[1]} replayed with its picks" in damaged.stdout
    assert _lines(tmp_path / "w4" / "train.jsonl.gz") == _lines(tmp_path / "w1" / "train.jsonl.gz")


def test_the_shipped_picks_were_made_for_the_shipped_data():
    """scripts/gpu_base.sh takes a record's picks only where their key names the data they were made for (its
    `keys` line: the A: cap, the shipped training set, the held-out files, the record and those before it). A
    held-out file or the training set changed without new picks would leave the GPU machine merging for minutes:
    remake them (`scripts/gpu_base.sh OUT --data-only --make-picks`, data/README.md)."""
    import hashlib

    held = held_out_files()
    sha = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
    records = [REPO / "data" / f"more_games{n}.jsonl.xz" for n in ("", "_2", "_3")]
    source = sha((REPO / "data" / "train.jsonl.xz").read_bytes())
    held_sha = sha(b"".join(f.read_bytes() for f in held))
    recs = ""
    for rec in records:  # the recipe gpu_base.sh runs: 200,000 A: rows shared evenly between the records
        recs += " " + sha(rec.read_bytes())
        key = sha(f"a_rows={200_000 // len(records)} source={source} held={held_sha} records={recs}\n".encode())[:32]
        made_for = json.loads(lzma.open(rec.with_name(rec.name.replace(".jsonl.xz", ".picks.xz")), "rt").readline())
        assert made_for["key"] == key, f"{rec.name}'s picks were made for other data"
