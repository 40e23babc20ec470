"""Game records: a generation's Stockfish answers, replayed into the same data with no engine, and refused
when the replay would not give the same data."""

import json
import lzma
from pathlib import Path

import pytest

from rookworld_rlvr.cli import main
from rookworld_rlvr.data.generate import GenerateConfig, generate
from rookworld_rlvr.data.io import DataError
from rookworld_rlvr.data.records import read_records, record, replay


def _files(root: Path) -> dict[str, bytes]:
    """Everything a generation writes that a user reads: the shards, the splits, the mates in one."""
    names = ["train.jsonl.gz", "eval.jsonl.gz", "mate_in_one.tsv"]
    out = {n: (root / n).read_bytes() for n in names}
    out.update({f".shards/{p.name}": p.read_bytes() for p in sorted((root / ".shards").glob("shard_*.jsonl"))})
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, stockfish_path):
    root = tmp_path_factory.mktemp("records")
    cfg = GenerateConfig(out_dir=str(root / "gen"), games=5, games_per_shard=2, max_plies=24, workers=1, depth=3,
                         eval_per_task=5, eval_permille=200, seed=4)
    generate(cfg, progress=False)
    summary = record(cfg.out_dir, root / "games.jsonl.xz", workers=2, progress=False)
    return cfg, root / "games.jsonl.xz", summary


def _rewrite(src: Path, dst: Path, edit) -> Path:
    lines = lzma.decompress(src.read_bytes()).decode().splitlines(keepends=True)
    dst.write_bytes(lzma.compress("".join(edit(lines)).encode()))
    return dst


def test_a_replay_without_stockfish_writes_the_generations_files_byte_for_byte(recorded, tmp_path, monkeypatch,
                                                                                capsys):
    cfg, rec, summary = recorded
    header, games = read_records(rec)
    assert summary["games"] == len(games) == 5 and summary["positions"] == sum(len(g.answers) for g in games) > 50
    assert header["config"]["seed"] == 4 and header["engine"].startswith("Stockfish")
    # no engine anywhere: an explicit STOCKFISH_PATH that does not exist fails any attempt to start one
    monkeypatch.setenv("STOCKFISH_PATH", str(tmp_path / "no-stockfish"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert main(["data", "replay", str(rec), "--out", str(tmp_path / "again"), "--workers", "2", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["annotated_positions"] == summary["positions"]
    assert _files(tmp_path / "again") == _files(Path(cfg.out_dir))


def test_a_record_is_less_than_half_the_samples_it_makes(recorded):
    """The point of a record: what travels (xz) against the truth-only samples it rebuilds (xz). Here a few
    short games; on 3,600 long ones it is 6.1 MB against 32.5 bytes a P: row and 38 an A: row (data/README.md)."""
    cfg, rec, _ = recorded
    from rookworld_rlvr.data.io import read_samples, write_samples

    samples = read_samples(Path(cfg.out_dir, "train.jsonl.gz")) + read_samples(Path(cfg.out_dir, "eval.jsonl.gz"))
    write_samples(Path(cfg.out_dir, "truth.jsonl.xz"), samples, truth_only=True)
    assert rec.stat().st_size * 2 < Path(cfg.out_dir, "truth.jsonl.xz").stat().st_size


def test_a_replay_that_drifts_from_its_record_is_refused(recorded, tmp_path):
    """A record read with another configuration (here: another seed, so other games) reaches positions its
    answers were not made for: refused with the game named, before any file of the split is written."""
    _, rec, _ = recorded

    def other_seed(lines):
        head = json.loads(lines[0])
        head["config"]["seed"] = 5
        return [json.dumps(head) + "\n", *lines[1:]]

    bad = _rewrite(rec, tmp_path / "drift.jsonl.xz", other_seed)
    with pytest.raises(DataError, match=r"drift\.jsonl\.xz: game \d+.*(illegal|other positions|more than)"):
        replay(bad, tmp_path / "out", workers=1, progress=False)
    assert not (tmp_path / "out" / "train.jsonl.gz").exists()


def _unreadable_first_move(lines: list[str]) -> list[str]:
    """Game 0's first recorded best move made text that is no UCI move (a hand edit, another tool's record)."""
    game = json.loads(lines[1])
    game["answers"][0] = "zz" + game["answers"][0][4:]
    return [lines[0], json.dumps(game) + "\n", *lines[2:]]


def _header(lines: list[str], **settings) -> list[str]:
    """The record's first line with `settings` in its config (a hand edit, a damaged copy)."""
    head = json.loads(lines[0])
    head["config"].update(settings)
    return [json.dumps(head) + "\n", *lines[1:]]


@pytest.mark.parametrize("edit, message", [
    (lambda lines: lines[:-1], r"holds 4 games, its config says 5"),
    (_unreadable_first_move, r"bad\.jsonl\.xz: game 0, position 1: the recorded best move zz is illegal"),
    (lambda lines: [lines[0], lines[2], *lines[3:]], r":2: expected game 0"),
    (lambda lines: [lines[0], lines[1].replace("|", "#", 1), *lines[2:]], r":2: answer 1: an answer must be"),
    (lambda lines: ['{"task": "P"}\n', *lines[1:]], r":1: not a game record"),
    (lambda lines: ["not json\n"], r":1: not a JSON line"),
    # a setting of the wrong kind ended in a TypeError in the shards' slicing or the config's check; one out of
    # its range was named without the record
    (lambda lines: _header(lines, games_per_shard=1.5), r"bad\.jsonl\.xz:1: field 'config\.games_per_shard' must be "
                                                         r"an integer, got 1\.5$"),
    (lambda lines: _header(lines, temperatures={"a": 1}), r":1: field 'config\.temperatures' must be a list of "
                                                           r"numbers, got \{'a': 1\}$"),
    (lambda lines: _header(lines, depth="8"), r":1: field 'config\.depth' must be an integer, got '8'$"),
    (lambda lines: _header(lines, illegal_share=1.0), r"bad\.jsonl\.xz:1: its config: illegal_share must be in "
                                                       r"\[0, 1\)$"),
])
def test_a_damaged_record_is_a_clear_error_naming_file_and_line(recorded, tmp_path, edit, message):
    _, rec, _ = recorded
    bad = _rewrite(rec, tmp_path / "bad.jsonl.xz", edit)
    with pytest.raises(DataError, match=message):
        replay(bad, tmp_path / "out", workers=1, progress=False)


@pytest.mark.parametrize("cut", [0.5, None])
def test_a_record_whose_compressed_bytes_are_damaged_is_named(recorded, tmp_path, cut):
    """A record cut short in transfer, or not xz at all, is an error naming the file, not a bare LZMAError."""
    _, rec, _ = recorded
    data = rec.read_bytes()
    bad = tmp_path / "bad.jsonl.xz"
    bad.write_bytes(data[: int(len(data) * cut)] if cut else b"\xfd7zXZ\x00 not a record")
    with pytest.raises(DataError, match=rf"{bad}: cannot be read after line \d+ \((LZMAError|EOFError)"):
        replay(bad, tmp_path / "out", workers=1, progress=False)


def test_recording_needs_a_finished_generation_of_games(recorded, tmp_path, capsys):
    cfg, _, _ = recorded
    unfinished = GenerateConfig(**{**cfg.__dict__, "out_dir": str(tmp_path / "part"), "cache_path": None})
    generate(unfinished, progress=False)
    (tmp_path / "part" / ".shards" / "shard_00001.jsonl").unlink()
    with pytest.raises(ValueError, match="1 of 3 shards are not made yet; rerun"):
        record(tmp_path / "part", tmp_path / "r.jsonl.xz", workers=1, progress=False)
    assert main(["data", "record", str(tmp_path), "--out", str(tmp_path / "r.jsonl.xz")]) != 0
    assert capsys.readouterr().err.strip() == (f"error: {tmp_path}: not a `data generate` output "
                                               f"(no {tmp_path}/.shards/config.json)")
    assert not (tmp_path / "r.jsonl.xz").exists()


@pytest.mark.parametrize("name,games,seed", [("more_games.jsonl.xz", 3600, 2), ("more_games_2.jsonl.xz", 3000, 3),
                                            ("more_games_3.jsonl.xz", 1400, 4)])
def test_the_shipped_records_replay_their_games_here(name, games, seed):
    """data/more_games*.jsonl.xz, the GPU base's further positions: each record's first shard's games replay on
    this python-chess against its answers (each best move legal where it is used, each game's positions those
    recorded), and their P: rows carry the recorded answers."""
    from conftest import REPO
    from rookworld_rlvr.data.generate import config_from, play_game
    from rookworld_rlvr.data.records import ReplayPool

    path = REPO / "data" / name
    header, recorded = read_records(path)
    cfg = config_from(header["config"], "unused")
    assert (cfg.games, cfg.seed, cfg.depth) == (len(recorded), seed, 8) == (games, seed, 8)
    for rec in recorded[:cfg.games_per_shard]:
        pool = ReplayPool(rec, str(path))
        rows = [s for s in play_game(rec.game, cfg, pool) if s.task == "P"]
        pool.check_done()
        assert len(rows) == len(rec.answers) > 10
        for s, (moves, evals) in zip(rows, rec.answers, strict=True):
            assert sorted(zip(s.truth.moves, s.truth.evals)) == sorted(zip(moves, evals))
