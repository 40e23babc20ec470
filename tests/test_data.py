"""Data: generation (deterministic, resumable, split by position), import, stats, atomic writes."""

import gzip
import json
import lzma
import os
from pathlib import Path

import pytest

from conftest import REFERENCE, REPO, UNREACHABLE_HUB, held_out_files, random_transitions
from rookworld_rlvr.cli import main
from rookworld_rlvr.data.generate import GenerateConfig, generate
from rookworld_rlvr.data.importer import import_data
from rookworld_rlvr.data.io import DataError, ReadReport, Sample, iter_samples, read_samples, write_samples
from rookworld_rlvr.tasks import environment as E

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    cfg = GenerateConfig(out_dir=str(root / "a"), games=4, games_per_shard=2, max_plies=12, workers=1, depth=5,
                         eval_per_task=5, eval_permille=200, seed=3)
    summary = generate(cfg, progress=False)
    return cfg, summary


def test_generate_writes_valid_splits_without_shared_positions(generated):
    cfg, summary = generated
    train = read_samples(f"{cfg.out_dir}/train.jsonl.gz")
    evals = read_samples(f"{cfg.out_dir}/eval.jsonl.gz")
    assert summary["train_P"] > 0 and summary["train_A"] > 0 and summary["eval_P"] > 0
    assert {s.fen for s in train}.isdisjoint({s.fen for s in evals})
    for s in train + evals:
        if s.task == "P":
            assert 1 <= len(s.truth.moves) <= 5 and set(s.truth.best) <= set(s.truth.moves)
        else:
            assert E.transition(s.truth.fen, s.truth.move, s.truth.history.split()[:-1]) == s.truth
    keys = [json.dumps(s.to_row(), sort_keys=True) for s in train]
    assert len(keys) == len(set(keys)), "duplicates"


def test_generate_with_no_games_labels_the_positions_given_and_nothing_else(tmp_path, stockfish_path, capsys):
    """`data generate --games 0 --positions F` (scripts/game_positions.py's positions): each position a P:
    sample with Stockfish's legal top moves, on its side of the split; without positions, 0 games is refused."""
    import chess

    from rookworld_rlvr.data.generate import is_eval_fen
    from rookworld_rlvr.tasks.environment import fen_of

    board, fens = chess.Board(), []
    for move in ("g1f3", "c7c6", "e2e4"):  # after c7c6 the position is on the held-out side (eval_permille 40)
        board.push_uci(move)
        fens.append(fen_of(board))
    assert [is_eval_fen(f, 40) for f in fens] == [False, True, False]
    (tmp_path / "fens.txt").write_text("".join(f + "\n" for f in fens))
    out = tmp_path / "gen"
    assert main(["data", "generate", "--out", str(out), "--games", "0", "--workers", "1", "--depth", "5",
                 "--positions", str(tmp_path / "fens.txt"), "--quiet"]) == 0
    train, held = read_samples(out / "train.jsonl.gz"), read_samples(out / "eval.jsonl.gz")
    assert sorted(s.fen for s in train) == sorted([fens[0], fens[2]]) and [s.fen for s in held] == [fens[1]]
    for s in train + held:
        assert s.task == "P" and len(s.truth.moves) == 5
        assert all(chess.Move.from_uci(m) in chess.Board(s.fen).legal_moves for m in s.truth.moves)
    assert main(["data", "generate", "--out", str(tmp_path / "none"), "--games", "0", "--quiet"]) == 1
    assert "games 0 with extra_positions: those positions labelled alone" in capsys.readouterr().err


def test_positions_from_pgn_games_are_those_before_each_move_and_names_in_latin_1_do_no_harm(tmp_path, stockfish_path):
    """`--positions` of a PGN (gzip too): the position before every move of every game's main line, each once; an
    old database's player names in Latin-1 are not read."""
    import chess

    from rookworld_rlvr.data.generate import read_extra_positions
    from rookworld_rlvr.tasks.environment import fen_of

    pgn = b'[Event "a"]\n[White "M\xfcller"]\n\n1. e4 e5 (1... c5) 2. Nf3 *\n\n[Event "b"]\n\n1. d4 c5 *\n'
    (tmp_path / "g.pgn.gz").write_bytes(gzip.compress(pgn))
    def after(*moves: str) -> str:
        board = chess.Board()
        for m in moves:
            board.push_san(m)
        return fen_of(board)

    want = [after(), after("e4"), after("e4", "e5"), after("d4")]  # the main lines' positions, each once
    assert read_extra_positions((str(tmp_path / "g.pgn.gz"),)) == want
    out = tmp_path / "gen"
    assert main(["data", "generate", "--out", str(out), "--games", "0", "--workers", "1", "--depth", "5",
                 "--positions", str(tmp_path / "g.pgn.gz"), "--quiet"]) == 0
    rows = read_samples(out / "train.jsonl.gz") + read_samples(out / "eval.jsonl.gz")
    assert sorted(s.fen for s in rows) == sorted(want)


@pytest.mark.parametrize("name,text,why", [
    ("f.txt", "# openings\n" + START + "\n\n8/8/8/8/8/8/8/8 w - - 0 1\n",
     "f.txt:4: invalid FEN '8/8/8/8/8/8/8/8 w - - 0 1': not a legal position (no white king, no black king, empty)"),
    ("f.txt", START + "\nnot a fen\n", "f.txt:2: invalid FEN 'not a fen'"),
    ("f.txt", b"\xff\xfe\n", "f.txt:1: not valid UTF-8 text"),
    ("f.txt", "# nothing\n", "f.txt: holds no position"),
    ("f.txt.gz", b"cut", "f.txt.gz: cannot be read"),
    ("dir", None, "dir: is a directory, not a PGN or FEN file"),
    ("f.pgn", '[Event "a"]\n\n1. e4 *\n\n\n[Event "b"]\n\n1. e4 e5 2. Kf7 *\n',
     "f.pgn:6: game 2: illegal san: 'Kf7' in "),
    ("f.pgn", '[Event "a"]\n[FEN "8/8/8/8/8/8/8/8 w - - 0 1"]\n\n1. e4 *\n',
     "f.pgn:1: game 1: its set-up position '8/8/8/8/8/8/8/8 w - - 0 1' is not a legal one (no white king"),
    ("f.pgn", '[Event "a"]\n[FEN "garbage"]\n\n1. e4 *\n', "f.pgn:1: game 1: expected 8 rows"),
    ("f.pgn", '[Event "a"]\n[Variant "Atomic"]\n\n1. e4 *\n',
     "f.pgn:1: game 1: a game of Atomic: only standard chess is labelled"),
    ("f.pgn", "hello world\n", "f.pgn: holds no position (no game with a move)"),
], ids=["no-kings", "bad-fen", "not-utf8", "no-position", "not-gzip", "directory", "pgn-illegal-move",
        "pgn-setup-no-kings", "pgn-setup-garbage", "pgn-variant", "pgn-no-game"])
def test_a_bad_positions_file_stops_generate_before_any_game_naming_file_and_line(name, text, why, tmp_path,
                                                                                   stockfish_path, monkeypatch, capsys):
    """`data generate --positions F` reads F whole before its games (hours of Stockfish): a line that is no legal
    position, a game python-chess cannot read or of a variant, a file without a position, not text or not there
    is one line naming it, and no game is played. Before, F was read after the games, its errors without file or
    line, or a traceback, an illegal move in a PGN logged and the game cut there, and a file of no position
    labelled nothing without a word."""
    monkeypatch.chdir(tmp_path)
    if text is None:
        Path(name).mkdir()
    else:
        (Path(name).write_text if isinstance(text, str) else Path(name).write_bytes)(text)
    Path("ok.txt").write_text(START + "\n")
    assert main(["data", "generate", "--out", "gen", "--games", "2", "--workers", "1", "--depth", "3",
                 "--max-plies", "4", "--positions", "ok.txt", name, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {why}") and err.count("\n") == 1, err
    assert not list(Path().glob("gen/.shards/shard_*")), "a game was played"


@pytest.mark.parametrize("options,notes", [
    ("--games 0 --max-plies 20 --temperatures 0.5 --random-move-prob 0.2",
     ["max_plies: no game is played (games 0)", "random_move_prob: no game", "temperatures: no game"]),
    ("--games 0 --depth 6", []),
    ("--games 4 --max-plies 20 --temperatures 0.5", []),
], ids=["game-settings-without-games", "labelling-settings", "games"])
def test_game_settings_where_no_game_is_played_are_named_before_the_work(options, notes, tmp_path, capsys):
    """`data generate --games 0 --positions F` labels F alone: a game's settings beside it were taken without a
    word; now each is a warning of a setting without effect (here, before the missing F stops the command)."""
    argv = ["data", "generate", "--out", str(tmp_path / "gen"), "--positions", str(tmp_path / "none.txt"),
            *options.split()]
    assert main(argv) == 1
    said = [line.removeprefix("warning: setting without effect: ") for line in capsys.readouterr().err.splitlines()
            if line.startswith("warning: setting without effect: ")]
    assert len(said) == len(notes) and all(s.startswith(n) for s, n in zip(said, notes)), said


def test_generated_a_rows_start_at_the_first_move_and_come_with_every_history_length(generated):
    """Every game's first transition is written (from the start position, a 1-move history) and kept
    on the training side; a fifth of the A: rows get a copy with a shorter history, whose answer is
    the same transition's."""
    from rookworld_rlvr.data.generate import START_FEN, is_eval_fen

    cfg, _ = generated
    train = [s for s in read_samples(f"{cfg.out_dir}/train.jsonl.gz") if s.task == "A"]
    starts = [s for s in train if s.fen == START_FEN]
    assert starts and all(len(s.truth.history.split()) == 1 for s in starts) and not is_eval_fen(START_FEN, 1000 - 1)
    short = [s for s in train if s.source.endswith("-short")]
    assert short and {len(s.truth.history.split()) for s in train} >= {1, 2, 3}
    for s in short:
        assert E.transition(s.truth.fen, s.truth.move, s.truth.history.split()[:-1]) == s.truth


def test_generate_is_deterministic_and_resumes_without_duplicates(generated, tmp_path):
    cfg, _ = generated
    from pathlib import Path

    again = GenerateConfig(**{**cfg.__dict__, "out_dir": str(tmp_path / "b"), "cache_path": None})
    generate(again, progress=False)
    a = gzip.decompress(Path(cfg.out_dir, "train.jsonl.gz").read_bytes())
    b = gzip.decompress(Path(again.out_dir, "train.jsonl.gz").read_bytes())
    assert a == b
    # interrupt: lose one shard, run again -> identical result, nothing duplicated
    (Path(again.out_dir) / ".shards" / "shard_00001.jsonl").unlink()
    generate(again, progress=False)
    assert gzip.decompress(Path(again.out_dir, "train.jsonl.gz").read_bytes()) == a
    # resuming with another configuration is refused
    with pytest.raises(ValueError, match="another configuration"):
        generate(GenerateConfig(**{**again.__dict__, "seed": 99}), progress=False)


def test_import_reference_corrects_labels_and_reports_json(reference_lines, tmp_path, capsys):
    out = tmp_path / "ref.jsonl"
    assert main(["data", "import", str(REFERENCE), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"read": 500, "written": 500, "invalid": 0, "labels_corrected": 223}
    samples = read_samples(out)
    assert all(s.truth.label is not None for s in samples)


def test_import_stops_at_a_malformed_line_with_file_and_line(tmp_path, reference_lines):
    src = tmp_path / "bad.txt"
    lines = reference_lines[:3] + ["P: this is not a fen M: e2e4 E: 0.1 B: e2e4"] + reference_lines[3:5]
    src.write_text("\n".join(lines))
    with pytest.raises(DataError, match=rf"{src}:4: bad FEN"):
        import_data(str(src), str(tmp_path / "o.jsonl"))
    assert not (tmp_path / "o.jsonl").exists(), "a failed import must not leave a partial file"
    summary = import_data(str(src), str(tmp_path / "o.jsonl"), skip_invalid=True)
    assert (summary["read"], summary["written"], summary["invalid"]) == (6, 5, 1)


def test_import_reads_a_dataset_folder_as_its_lines(tmp_path, reference_lines, monkeypatch, capsys):
    """A Hub dataset's files in a folder (a snapshot carried to a machine without network) import as the same
    lines in a text file do (the folder was refused: "is a directory, not a data file"); a malformed row is named
    by the folder, split and row, and a folder without data files or the split is one line."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "rookworld_snapshot"
    folder.mkdir()
    lines = reference_lines[:40]
    datasets.Dataset.from_dict({"text": lines}).to_parquet(str(folder / "train.parquet"))
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n")
    from_folder, from_text = tmp_path / "folder.jsonl", tmp_path / "text.jsonl"
    assert main(["data", "import", str(folder), "--out", str(from_folder), "--json"]) == 0
    assert main(["data", "import", str(tmp_path / "lines.txt"), "--out", str(from_text), "--json"]) == 0
    assert from_folder.read_text() == from_text.read_text() and len(read_samples(from_folder)) == 40
    assert main(["data", "import", str(folder), "--split", "test", "--out", str(tmp_path / "t.jsonl")]) == 1
    assert f"error: {folder}: cannot import the dataset folder: ValueError: Unknown split" in capsys.readouterr().err
    bad = tmp_path / "bad_snapshot"
    bad.mkdir()
    assert main(["data", "import", str(bad), "--out", str(tmp_path / "b.jsonl")]) == 1
    assert f"error: {bad}: cannot import the dataset folder: EmptyDatasetError" in capsys.readouterr().err
    datasets.Dataset.from_dict({"text": lines[:2] + ["P: this is not a fen M: e2e4 E: 0.1 B: e2e4"]}).to_parquet(
        str(bad / "train.parquet"))
    with pytest.raises(DataError, match=rf"{bad}\[train\]:3: bad FEN"):
        import_data(str(bad), str(tmp_path / "b.jsonl"))
    assert not (tmp_path / "b.jsonl").exists() and not (tmp_path / "t.jsonl").exists()


def test_import_environment_lines_with_and_without_prefix(tmp_path):
    ts = random_transitions(20, seed=5)
    src = tmp_path / "env.txt"
    src.write_text("\n".join(E.render(t, prefix=i % 2 == 0) for i, t in enumerate(ts)) + "\n")
    summary = import_data(str(src), str(tmp_path / "env.jsonl"))
    assert summary["written"] == 20
    assert [s.truth for s in read_samples(tmp_path / "env.jsonl")] == ts


def test_a_hub_dataset_out_of_reach_or_not_found_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch,
                                                                                answering_hub):
    """`data import owner/name`: a Hub out of reach is said at once (not after datasets' minute of retries and a
    traceback), and one that answers without the dataset in one line."""
    import subprocess
    import sys

    from huggingface_hub import constants

    out = tmp_path / "x.jsonl"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE_HUB)
    assert main(["data", "import", "someone/games", "--out", str(out)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: someone/games: cannot import the Hub dataset: the Hugging Face Hub "
                           f"{UNREACHABLE_HUB} is out of reach (") and "HF_HUB_OFFLINE=1" in line, line
    env = {**os.environ, "HF_ENDPOINT": answering_hub, "HF_HUB_OFFLINE": "0"}  # datasets reads it as it is imported
    run = subprocess.run([sys.executable, "-m", "rookworld_rlvr", "data", "import", "someone/games", "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1, run.stderr[-2000:]
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("error: someone/games: cannot import the Hub dataset: ") and "Traceback" not in line, line
    assert not out.exists()


def test_cli_errors_are_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "P", "truth": {"fen": "x"}}\n')
    assert main(["data", "stats", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:1:" in err and "truth" in err


@pytest.mark.parametrize("command,rest,hint", [
    ("train", ["--stepz", "3"], "--stepz: did you mean --steps?"),
    ("train", ["--kl_coeff=0.1"], "--kl_coeff: did you mean --kl_coef or --kl-coef"),
    ("data generate", ["--gams", "3"], "--gams: did you mean --games?"),
    ("match", ["a", "b", "c"], None),  # no option: nothing to mean (a and b are its two players)
])
def test_a_mistyped_option_is_named_with_the_options_of_its_command_it_may_mean(command, rest, hint, capsys):
    with pytest.raises(SystemExit) as e:
        main([*command.split(), *rest])
    err = capsys.readouterr().err.strip()
    unrecognized = " ".join(rest) if hint else rest[-1]
    assert e.value.code == 2 and err.startswith(f"rookworld {command}: error: unrecognized arguments: {unrecognized}")
    assert (hint in err) if hint else "did you mean" not in err
    assert err.endswith(f"(rookworld {command} --help lists its options)") and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv,why", [
    (["match", "random", "stockfish:0:1", "--max-plies", "0"], "argument --max-plies: must be at least 1, got 0"),
    (["match", "random", "stockfish:0:1", "--temperature", "-1"], "argument --temperature: must be a finite number"),
    (["uci", "--model", "m", "--temperature", "nan"], "argument --temperature: must be a finite number"),
    (["eval", "--model", "m", "--data", "d", "--examples", "-1"], "argument --examples: must be at least 0, got -1"),
    (["eval", "--model", "m", "--data", "d", "--limit", "-1"], "argument --limit: must be at least 0, got -1"),
    (["eval", "--model", "m", "--data", "d", "--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
    (["eval", "--model", "m", "--data", "d", "--selfplay-temperature", "-0.5"],
     "argument --selfplay-temperature: must be a finite number >= 0"),
    (["data", "judge", "f", "--out", "o", "--positions", "-1"], "argument --positions: must be at least 0, got -1"),
    (["data", "checks", "f", "--out", "o", "--n", "-1"], "argument --n: must be at least 1, got -1"),
    (["data", "openings", "--out", "o", "--n", "0"], "argument --n: must be at least 1, got 0"),
    (["overfit", "--overfit-steps", "0"], "argument --overfit-steps: must be at least 1, got 0"),
    (["check-batch", "--max-truncation", "-1"], "argument --max-truncation: must be a share in [0, 1], got -1"),
    (["sweep", "--trials", "0"], "argument --trials: must be at least 1, got 0"),
    # a wait that cannot end: an infinite Stockfish search per position, or a hung engine waited on for ever
    (["data", "generate", "--time", "inf"], "argument --time: must be a finite number of seconds > 0, got inf"),
    (["data", "generate", "--time", "0"], "argument --time: must be a finite number of seconds > 0, got 0"),
    (["match", "random", "stockfish:0:1", "--engine-timeout", "nan"],
     "argument --engine-timeout: must be a finite number of seconds > 0, got nan"),
    (["match", "random", "stockfish:0:1", "--engine-timeout", "inf"],
     "argument --engine-timeout: must be a finite number of seconds > 0, got inf"),
])
def test_an_option_value_that_means_nothing_is_an_error_naming_the_option(argv, why, capsys):
    """Before, `match --max-plies 0` played 100 games of no move, all drawn, a negative temperature was greedy, `data
    judge --positions -1` judged all but the last position, `data openings --n 0` wrote an empty file and `overfit
    --overfit-steps 0` failed on "max() arg is an empty sequence"."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and why in capsys.readouterr().err


def test_an_output_path_a_file_stands_in_the_way_of_is_named_before_any_work(tmp_path, capsys):
    """`match --json F/m.json` with F a file played every game and then failed to write, in FileExistsError's
    traceback (the games lost); `eval --json` failed so at its start. Every output option is checked as it is read:
    a file where a folder must be, a folder given as a file."""
    from rookworld_rlvr.cli_args import output_file

    blocker = tmp_path / "file"
    blocker.write_text("")
    in_file = f"{blocker} is a file, not a directory"
    cases = [(["match", "random", "stockfish:0:1", "--json", f"{blocker}/m.json"], "--json",
              f"{blocker}/m.json: {in_file}"),
             (["match", "random", "stockfish:0:1", "--pgn", str(tmp_path)], "--pgn",
              f"{tmp_path} is a directory; give a file name"),
             (["eval", "--model", "m", "--data", "d", "--json", f"{blocker}/a/e.json"], "--json",
              f"{blocker}/a/e.json: {in_file}"),
             (["data", "judge", "s", "--out", f"{blocker}/j.jsonl"], "--out", f"{blocker}/j.jsonl: {in_file}"),
             (["data", "import", "s", "--out", f"{blocker}/i.jsonl"], "--out", f"{blocker}/i.jsonl: {in_file}"),
             (["data", "generate", "--out", str(blocker)], "--out", in_file),
             (["report", "run", "--out", f"{blocker}/r"], "--out", f"{blocker}/r: {in_file}"),
             (["sweep", "--out", str(blocker)], "--out", in_file)]
    for argv, option, why in cases:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and f"error: argument {option}: {why}" in capsys.readouterr().err, argv
    assert output_file("") == "" and output_file(str(tmp_path / "new" / "x.json")) == str(tmp_path / "new" / "x.json")


@pytest.mark.parametrize("command,option,why", [
    ("sft", "--save-every 0", "sft.save_every must be >= 1, got 0"),
    ("sft", "--grad-clip -1", "sft.grad_clip must be finite and >= 0, got -1.0"),
    # a NaN learning rate passed the check (`lr <= 0` is false for it) and trained every weight to NaN
    ("sft", "--lr nan", "sft.lr must be a finite number > 0, got nan"),
    ("sft", "--lr inf", "sft.lr must be a finite number > 0, got inf"),
    ("sft", "--batch-size 0", "sft.batch_size must be >= 1, got 0"),
    ("sft", "--layout padde", "sft.layout must be one of padded, compact, got 'padde'"),
    # a fresh model's shape beside --init, whose model keeps its own (was taken without a word)
    ("sft", f"--init {REPO / 'models' / 'rookworld-board'} --preset small",
     "sft.preset shapes a fresh model only: --init keeps the model's own shape and context"),
    ("sft", f"--init {REPO / 'models' / 'rookworld-board'} --n-positions 512",
     "sft.n_positions shapes a fresh model only: --init keeps the model's own shape and context"),
    ("data generate", "--max-plies 0", "max_plies must be >= 1 and eval_per_task >= 0, got 0 and 1000"),
    ("data generate", "--eval-per-task -1", "max_plies must be >= 1 and eval_per_task >= 0, got 160 and -1"),
    # a NaN weighed every candidate move NaN, and games began
    ("data generate", "--temperatures 0.3 nan", "temperatures must be > 0 (inf: random moves), got [0.3, nan]"),
])
def test_a_setting_that_means_nothing_stops_the_command_before_any_work(command, option, why, tmp_path, capsys):
    """Before, `sft --save-every 0` failed with a ZeroDivisionError after its first step and `data generate
    --max-plies 0` wrote 700 games of no move."""
    out = tmp_path / "out"
    given = ["--data", str(REPO / "data" / "eval.jsonl.gz")] if command == "sft" else []
    assert main([*command.split(), *given, "--out", str(out), *option.split()]) == 1
    assert capsys.readouterr().err.strip() == f"error: {why}" and not list(tmp_path.iterdir())


def test_stats_counts(tmp_path, reference_lines):
    from rookworld_rlvr.data.importer import stats
    from rookworld_rlvr.tasks import policy as P

    path = tmp_path / "mix.jsonl.gz"
    write_samples(path, [Sample("P", P.parse_line(x)) for x in reference_lines[:10]] +
                  [Sample("A", t) for t in random_transitions(15)])
    st = stats(str(path))
    assert (st["samples"], st["P"], st["A"]) == (25, 10, 15)
    assert st["A_kinds"]["checkmate"] >= 1 and st["A_kinds"]["illegal"] >= 1


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path):
    path = tmp_path / "x.jsonl"
    write_samples(path, [Sample("A", t) for t in random_transitions(3)])
    before = path.read_bytes()

    def boom():
        yield Sample("A", random_transitions(1)[0])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_samples(path, boom())
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.jsonl"], "no temp files left behind"


def test_shipped_training_data_holds_no_held_out_position():
    """No position of the shipped training data is a held-out one: the eval set, the judged
    strength set, the held-out puzzles and the match openings (all from the eval side of the
    FEN-hash split that `data generate` uses)."""
    import gzip
    import json

    from conftest import REPO
    from rookworld_rlvr.data.generate import START_FEN, is_eval_fen
    from rookworld_rlvr.data.judged import read_judged, read_puzzles
    from rookworld_rlvr.play import read_openings

    data = REPO / "data"

    def board_key(fen: str) -> str:  # the position itself, whatever the clocks say (the split hashes the whole FEN)
        return " ".join(fen.split()[:4])

    import lzma

    # the truths' FENs alone (the reader and its checks are tested elsewhere; all 240k rows read in 2 s, not 25)
    truths = [json.loads(line)["truth"] for line in lzma.open(data / "train.jsonl.xz", "rt")]
    assert len(truths) > 200_000 and all(t["fen"] for t in truths) and sum("new_fen" in t for t in truths) > 100_000
    train = {board_key(t["fen"]) for t in truths}
    held_out = [json.loads(line)["truth"]["fen"] for line in gzip.open(data / "eval.jsonl.gz", "rt")]
    held_out += [p.fen for p in read_judged(data / "strength.jsonl.gz")]
    puzzles = read_puzzles(data / "puzzles_eval.jsonl.gz")
    held_out += [p.fen for p in puzzles if p.kind != "check"]
    held_out += read_openings(data / "openings.txt")
    held_out += [s.fen for s in read_samples(data / "eval_histories.jsonl.gz")]
    # the shipped eval set was split while the start position was on the held-out side (10 A: rows start
    # there); `data generate` now keeps it on the training side, since every game passes through it
    assert len(held_out) > 2500 and all(is_eval_fen(f, 40) or f == START_FEN for f in held_out)
    overlap = {board_key(f) for f in held_out} & train
    assert len(overlap) <= 0.005 * len(held_out), sorted(overlap)[:5]
    # positions in check are held out by exclusion: one checking move from a held-out position, and no
    # position of the training data (nor an A: result of it)
    checks = [p.fen for p in puzzles if p.kind == "check"]
    seen = train | {board_key(t["new_fen"]) for t in truths if "new_fen" in t}
    assert len(checks) == 600 and not {board_key(f) for f in checks} & seen


def test_merge_keeps_each_prompt_once_first_file_first_and_shuffles_by_seed(generated, tmp_path, capsys):
    """`rookworld data merge` is how the shipped train set was built from two generations."""
    import dataclasses

    cfg, _ = generated
    a = read_samples(f"{cfg.out_dir}/train.jsonl.gz")[:30]
    p = next(i for i in range(10, 20) if a[i].task == "P")
    relabelled = dataclasses.replace(a[p], truth=dataclasses.replace(a[p].truth, evals=tuple(
        e + 1.0 for e in a[p].truth.evals)))
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl.gz"
    write_samples(first, a[:20])
    write_samples(second, a[10:p] + [relabelled] + a[p + 1:30])  # 10 prompts also in the first file
    out = tmp_path / "merged.jsonl.gz"
    assert main(["data", "merge", str(first), str(second), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {"written": 30, "duplicates": 10, "left_out": 0, "out": str(out)}
    merged = read_samples(out)
    assert sorted(s.render("compact") for s in merged) == sorted(s.render("compact") for s in a)  # a[p] won
    assert [s.render("compact") for s in merged] != [s.render("compact") for s in a]  # shuffled ...
    again = tmp_path / "again.jsonl.gz"
    main(["data", "merge", str(first), str(second), "--out", str(again)])
    assert again.read_bytes() == out.read_bytes()  # ... the same way every time
    (tmp_path / "bad.jsonl").write_text(first.read_text() + '{"task": "Q"}\n')
    assert main(["data", "merge", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "x.jsonl")]) == 1
    assert f"{tmp_path / 'bad.jsonl'}:21: field 'task'" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def test_merge_keeps_tasks_leaves_out_held_out_positions_and_writes_truth_alone(generated, tmp_path, capsys):
    """How more training positions join without touching a held-out set: `--exclude` compares positions
    without their move clocks, before and after an A: move; `--truth-only` .xz rows read back as the same
    samples in a fraction of the bytes."""
    import dataclasses

    cfg, _ = generated
    rows = read_samples(f"{cfg.out_dir}/train.jsonl.gz")
    ps = [s for s in rows if s.task == "P"][:40]
    a_s = [s for s in rows if s.task == "A"][:40]
    src = tmp_path / "src.jsonl"
    write_samples(src, ps + a_s)
    moved = " ".join(ps[0].fen.split()[:4] + ["7", "42"])  # ps[0]'s position at other move clocks
    held = tmp_path / "held.jsonl"
    write_samples(held, [dataclasses.replace(ps[0], truth=dataclasses.replace(ps[0].truth, fen=moved)), ps[1]])
    out = tmp_path / "more.jsonl.xz"
    assert main(["data", "merge", str(src), "--out", str(out), "--tasks", "P", "--exclude", str(held),
                 "--truth-only"]) == 0
    assert len(ps) >= 20 and len(a_s) == 40
    assert json.loads(capsys.readouterr().out) == {"written": len(ps) - 2, "duplicates": 0, "left_out": 42,
                                                   "out": str(out)}
    merged = read_samples(out)
    assert sorted(s.render("compact") for s in merged) == sorted(s.render("compact") for s in ps[2:])
    lines = lzma.open(out, "rt").read().splitlines()
    assert len(lines) == len(ps) - 2 and all(set(json.loads(ln)) == {"task", "truth", "source"} for ln in lines)
    full = tmp_path / "full.jsonl.xz"
    assert main(["data", "merge", str(src), "--out", str(full), "--tasks", "P", "--exclude", str(held)]) == 0
    capsys.readouterr()
    assert read_samples(full) == merged and out.stat().st_size < 0.8 * full.stat().st_size
    # an A: row goes when the position after its move is held out (here in a FEN-a-line file, as the openings)
    after = tmp_path / "after.txt"
    after.write_text(f"# held out\n{a_s[0].truth.new_fen}\n")
    assert main(["data", "merge", str(src), "--out", str(tmp_path / "a.jsonl"), "--tasks", "A", "--exclude",
                 str(after)]) == 0
    key = " ".join(a_s[0].truth.new_fen.split()[:4])
    rest = [s for s in a_s if key not in {" ".join(f.split()[:4]) for f in (s.fen, s.truth.new_fen)}]
    assert a_s[0] not in rest and len(rest) >= 30
    assert json.loads(capsys.readouterr().out)["left_out"] == len(ps) + 40 - len(rest)
    assert sorted(s.render("compact") for s in read_samples(tmp_path / "a.jsonl")) == sorted(
        s.render("compact") for s in rest)


def test_merge_new_only_and_max(generated, tmp_path, capsys):
    """`--new-only FILE` leaves out the samples FILE already holds (by prompt: another history of the same move
    stays), `--max N` writes the first N of the shuffle."""
    import dataclasses

    cfg, _ = generated
    a_s = [s for s in read_samples(f"{cfg.out_dir}/train.jsonl.gz") if s.task == "A"][:30]
    src, known = tmp_path / "src.jsonl", tmp_path / "known.jsonl"
    write_samples(src, a_s)
    i = next(i for i in range(10, 30) if len(a_s[i].truth.history.split()) > 1)
    other = dataclasses.replace(a_s[i], truth=dataclasses.replace(a_s[i].truth, history=a_s[i].truth.move))
    write_samples(known, a_s[:10] + [other])
    assert main(["data", "merge", str(src), "--out", str(tmp_path / "new.jsonl"), "--new-only", str(known)]) == 0
    assert json.loads(capsys.readouterr().out)["written"] == 20
    assert sorted(s.render("compact") for s in read_samples(tmp_path / "new.jsonl")) == sorted(
        s.render("compact") for s in a_s[10:])
    assert main(["data", "merge", str(src), "--out", str(tmp_path / "few.jsonl"), "--max", "7"]) == 0
    capsys.readouterr()
    full = tmp_path / "all.jsonl"
    main(["data", "merge", str(src), "--out", str(full)])
    assert read_samples(tmp_path / "few.jsonl") == read_samples(full)[:7]
    with pytest.raises(SystemExit):
        main(["data", "merge", str(src), "--out", str(full), "--max", "0"])
    assert "--max: must be at least 1, got 0" in capsys.readouterr().err


def test_merge_keeps_one_side_of_the_split(generated, tmp_path, capsys):
    """`data generate`'s shards hold both sides of the FEN-hash split; `--side train` keeps what may be trained on."""
    from rookworld_rlvr.data.generate import is_eval_fen

    cfg, _ = generated
    shards = sorted(Path(cfg.out_dir, ".shards").glob("shard_*.jsonl"))
    rows = [s for f in shards for s in read_samples(f)]
    assert any(is_eval_fen(s.fen, 40) for s in rows) and not all(is_eval_fen(s.fen, 40) for s in rows)
    for side in ("train", "eval"):
        out = tmp_path / f"{side}.jsonl"
        assert main(["data", "merge", *map(str, shards), "--out", str(out), "--side", side]) == 0
        capsys.readouterr()
        kept = read_samples(out)
        assert kept and all(is_eval_fen(s.fen, 40) == (side == "eval") for s in kept)


def test_read_samples_in_parallel_gives_what_one_process_gives(tmp_path, monkeypatch):
    """Large files are parsed by forked workers: the same samples in the same order, the first bad line's
    error (whichever worker finds an error first), and the same report when bad lines are skipped."""
    from conftest import REPO
    from rookworld_rlvr.data import io as data_io

    with lzma.open(REPO / "data" / "train.jsonl.xz", "rt") as fh:
        lines = [next(fh) for _ in range(3000)]
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("".join(lines))
    bad.write_text("".join(lines[:1500] + ['{"task": "Q"}\n'] + lines[1500:2500] + ["not json\n"] + lines[2500:]))
    forks = []
    real = data_io.mp.get_context
    monkeypatch.setattr(data_io.mp, "get_context", lambda method: forks.append(method) or real(method))
    monkeypatch.setattr(data_io, "PARALLEL_ROWS", 1000)
    one, many = ReadReport(), ReadReport()
    serial = read_samples(good, report=one, workers=1)
    assert forks == [] and len(serial) == 3000
    assert read_samples(good, report=many, workers=3) == serial and many == one and forks == ["fork"]
    with pytest.raises(DataError, match=rf"{bad}:1501: field 'task'"):
        read_samples(bad, workers=3)
    one, many = ReadReport(), ReadReport()
    assert read_samples(bad, skip_invalid=True, report=many, workers=3) == read_samples(
        bad, skip_invalid=True, report=one, workers=1) == serial
    assert many == one and one.invalid == 2 and [e.split(": ")[0] for e in one.errors] == [f"{bad}:1501", f"{bad}:2502"]


def test_read_samples_parses_with_the_garbage_collector_off_and_leaves_it_as_it_was(tmp_path, monkeypatch):
    """The samples read so far are kept, so every pass of Python's cyclic collector during a read walks all of
    them and frees nothing (a fifth of a large file's reading time): it is off while read_samples parses each row,
    and as it was after, also when a bad line stops the read."""
    import gc

    from conftest import REPO
    from rookworld_rlvr.data import io as data_io

    with lzma.open(REPO / "data" / "train.jsonl.xz", "rt") as fh:
        lines = [next(fh) for _ in range(200)]
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("".join(lines))
    bad.write_text("".join(lines[:100]) + "not json\n")
    collecting: list[bool] = []  # the collector's state as each row is parsed
    parse = data_io.sample_from_row
    monkeypatch.setattr(data_io, "sample_from_row", lambda row: collecting.append(gc.isenabled()) or parse(row))
    try:
        assert gc.isenabled()
        assert len(read_samples(good, workers=1)) == 200 and collecting == [False] * 200 and gc.isenabled()
        with pytest.raises(DataError, match=f"{bad}:101"):
            read_samples(bad, workers=1)
        assert collecting == [False] * 300 and gc.isenabled()
        gc.disable()  # a caller that turned it off keeps it off
        read_samples(good, workers=1)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_more_samples_for_the_gpu_base_are_new_and_on_the_training_side(generated, tmp_path):
    """scripts/gpu_more_data.sh on an unfinished generation (shards only): its P: positions on the training side,
    none that the known training set (--known: rows of the shipped set and some of the games' own) or a
    held-out file holds; as many A: rows as asked, none the known set holds, none touching a held-out position;
    truth alone in xz. A --known file that is not there is named before anything runs."""
    import itertools
    import shutil
    import subprocess
    import sys

    from conftest import REPO
    from rookworld_rlvr.data.generate import is_eval_fen
    from rookworld_rlvr.data.judged import board_key, positions_of

    cfg, _ = generated
    gen = tmp_path / "gen"
    shutil.copytree(Path(cfg.out_dir, ".shards"), gen / ".shards")
    shards = [s for f in sorted(gen.glob(".shards/shard_*.jsonl")) for s in read_samples(f)]
    own = [s for s in shards if s.task == "P"][::3] + [s for s in shards if s.task == "A"][::9]
    known_rows = [*itertools.islice(iter_samples(REPO / "data" / "train.jsonl.xz"), 500), *own]
    write_samples(tmp_path / "known.jsonl.gz", known_rows)
    out = tmp_path / "more"
    cmd = ["bash", str(REPO / "scripts" / "gpu_more_data.sh"), str(gen), str(out), "--a-rows", "40",
           "--known", str(tmp_path / "known.jsonl.gz")]
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary, summary_a = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
    known = {board_key(f) for s in known_rows for f in (s.fen, *([s.truth.new_fen] if s.task == "A" else []))}
    held = {board_key(f) for path in held_out_files() for f in positions_of(path)}
    want = {s.render("compact") for s in shards if s.task == "P" and not is_eval_fen(s.fen, 40)
            and board_key(s.fen) not in known | held}
    got = read_samples(out / "more_p.jsonl.xz")
    assert summary["written"] == len(got) == len(want) > 0 and {s.render("compact") for s in got} == want
    assert any(board_key(s.fen) in known for s in shards if s.task == "P" and not is_eval_fen(s.fen, 40))
    prompts = {s.render("compact")[0] for s in known_rows}
    pool = {s.render("compact") for s in shards if s.task == "A" and not is_eval_fen(s.fen, 40)
            and s.render("compact")[0] not in prompts and not {board_key(s.fen), board_key(s.truth.new_fen)} & held}
    got_a = read_samples(out / "more_a.jsonl.xz")
    assert summary_a["written"] == len(got_a) == 40 < len(pool) and {s.render("compact") for s in got_a} <= pool
    for name in ("more_p.jsonl.xz", "more_a.jsonl.xz"):
        assert all(set(json.loads(line)) == {"task", "truth", "source"} for line in lzma.open(out / name, "rt"))
    proc = subprocess.run([*cmd[:-1], str(tmp_path / "gone.jsonl")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and f"--known {tmp_path / 'gone.jsonl'}: no such file" in proc.stderr


@pytest.mark.slow(seconds=11)
def test_openings_fall_on_the_side_of_the_split_asked_for(stockfish_path, tmp_path):
    """`data openings` (held-out, balanced) and scripts/game_positions.py's training-side openings: one
    function, the side and the balance check apart; an excluded position is never one of them."""
    import chess

    from rookworld_rlvr.data.generate import is_eval_fen
    from rookworld_rlvr.data.judged import board_key, openings
    from rookworld_rlvr.play import read_openings

    held = openings(3, 0, 5, None)
    assert len(set(held)) == 3 and all(is_eval_fen(f, 40) and not chess.Board(f).is_game_over() for f in held)
    train = openings(6, 0, 5, None, max_eval=None, side="train")
    assert len(set(train)) == 6 and not any(is_eval_fen(f, 40) for f in train)
    again = openings(6, 0, 5, None, max_eval=None, side="train", exclude=train[:1])
    assert board_key(train[0]) not in {board_key(f) for f in again} and again[:5] == train[1:]
    # `rookworld data openings --exclude`: openings no earlier match used, the others in the order they came
    first, excluded = tmp_path / "first.txt", tmp_path / "excluded.txt"
    args = ["data", "openings", "--n", "3", "--seed", "0", "--depth", "5", "--cache", str(tmp_path / "cache.sqlite")]
    assert main([*args, "--out", str(first)]) == 0
    excluded.write_text(first.read_text().split("\n", 2)[1] + "\n")  # below the header: the first opening
    out = tmp_path / "fresh.txt"
    assert main([*args, "--exclude", str(excluded), "--out", str(out)]) == 0
    fresh, before = read_openings(out), read_openings(first)
    assert before == held and len(fresh) == 3 and fresh[:2] == held[1:] and held[0] not in fresh


def test_positions_of_reads_the_match_openings():
    from conftest import REPO
    from rookworld_rlvr.data.judged import positions_of
    from rookworld_rlvr.play import read_openings

    fens = read_openings(REPO / "data" / "openings.txt")
    assert positions_of(REPO / "data" / "openings.txt") == set(fens) and len(fens) == 100


@pytest.mark.parametrize("name,text,why", [
    ("held.txt", START + "\nP: " + START + "\n", "held.txt:2: invalid FEN 'P: rnbqkbnr"),
    ("held.txt", b"\xff\n", "held.txt:1: not valid UTF-8 text"),
    ("held", None, "held: is a directory, not a data file"),
    ("held.jsonl", None, "held.jsonl: is a directory, not a data file"),
    ("gone.txt", "", "gone.txt: no such file"),
], ids=["not-a-fen", "not-utf8", "directory", "jsonl-directory", "missing"])
def test_an_exclude_file_that_cannot_be_read_whole_is_a_clear_error_and_nothing_is_written(
        name, text, why, generated, tmp_path, monkeypatch, capsys):
    """`--exclude` keeps held-out positions out of a training set: a line of its FEN list that is no FEN would have
    been taken as a position and left nothing out, without a word (and a folder or a missing file was a
    traceback). Now one line names the file and line, and no training set is written."""
    cfg, _ = generated
    monkeypatch.chdir(tmp_path)
    if text is None:
        Path(name).mkdir()
    elif name != "gone.txt":
        (Path(name).write_text if isinstance(text, str) else Path(name).write_bytes)(text)
    assert main(["data", "merge", f"{cfg.out_dir}/train.jsonl.gz", "--out", "more.jsonl", "--exclude", name]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {why}") and err.count("\n") == 1, err
    assert not Path("more.jsonl").exists()


def test_near_misses_are_the_illegal_moves_a_model_writes_sorted_by_kind():
    """Each kind on a position built to have it, and every move checked against the classifier
    `rookworld eval` reports (`illegal_kind`): a pinned knight (check), a rook behind its own pawn
    and a bishop behind an enemy one (blocked), a king onto its own rook (own piece)."""
    from rookworld_rlvr.data.nearmiss import near_misses
    from rookworld_rlvr.tasks.strength import illegal_kind

    fen = "4r1k1/8/p7/3p4/p7/1p2N3/1P6/R3K2B w - - 0 1"  # the e3 knight is pinned by the e8 rook
    found = near_misses(fen)
    everything = sum(found.values(), [])
    assert set(found) == {"check", "blocked", "own_piece"}
    assert {"e3d5", "e3g4"} <= set(found["check"])
    assert {"h1c6", "a1a5", "b2b3", "b2c3"} <= set(found["blocked"])  # one piece in the way; pawns
    assert "a1a7" not in everything and "a1a8" not in everything  # two pieces in the way: nobody's near miss
    assert "a1e1" in found["own_piece"]
    assert "a1a2" not in everything and "a1a4" not in everything  # legal
    for kind, moves in found.items():
        for move in moves:
            assert illegal_kind(fen, move) == kind, (move, kind)


def test_near_miss_samples_keep_the_history_and_carry_the_environments_answer(tmp_path, capsys):
    from rookworld_rlvr.data.nearmiss import near_miss_samples

    rows = [Sample("A", t) for t in random_transitions(60, seed=3)]
    made, kinds = near_miss_samples(rows, 20, seed=1)
    assert len(made) == 20 and sum(kinds.values()) == 20 and set(kinds) <= {"check", "blocked", "own_piece"}
    by_fen = {s.truth.fen: s.truth for s in rows if not s.truth.truncated}
    for s in made:
        t, origin = s.truth, by_fen[s.truth.fen]
        assert (t.new_fen, t.reward, t.terminated, t.truncated) == (t.fen, E.REWARD_ILLEGAL, False, True)
        assert t.history.split() == origin.history.split()[:-1][-(E.HISTORY_LEN - 1):] + [t.move]
        assert s.source == "nearmiss"
    assert [s.truth for s in near_miss_samples(rows, 20, seed=1)[0]] == [s.truth for s in made]

    src, out = tmp_path / "train.jsonl", tmp_path / "near.jsonl.gz"
    write_samples(src, rows)
    assert main(["data", "near-misses", str(src), "--out", str(out), "--n", "20", "--seed", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["written"] == 20 and [s.truth for s in read_samples(out)] == [s.truth for s in made]
    write_samples(src, read_samples(REFERENCE)[:3])  # P: rows only
    assert main(["data", "near-misses", str(src), "--out", str(out)]) == 1
    assert "no A: samples with a legal move" in capsys.readouterr().err


def test_histories_cut_the_history_keep_the_answer_and_keep_their_side_of_the_split(tmp_path, capsys):
    import random

    from rookworld_rlvr.data.generate import START_FEN, is_eval_fen
    from rookworld_rlvr.data.histories import opening_transitions, short_history_copies

    rows = [Sample("A", t) for t in random_transitions(60, seed=2)]
    cut = list(short_history_copies(rows, 1.0, random.Random(0), [1]))
    assert cut and all(len(s.truth.history.split()) == 1 and s.truth.history == s.truth.move for s in cut)
    assert all(E.transition(s.fen, s.truth.move) == s.truth for s in cut)  # the answer does not depend on history
    assert list(short_history_copies(rows, 0.0, random.Random(0))) == []
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        list(short_history_copies(rows, 1.5, random.Random(0)))
    starts = opening_transitions(30, 6, seed=0, side="train")
    assert any(s.fen == START_FEN and s.truth.history == s.truth.move for s in starts)
    assert all(not is_eval_fen(s.fen, 40) for s in starts)
    for s in starts:
        assert E.transition(s.fen, s.truth.move, s.truth.history.split()[:-1]) == s.truth
    src = tmp_path / "src.jsonl"
    write_samples(src, rows)
    assert main(["data", "histories", str(src), "--side", "any", "--cut-share", "1", "--lengths", "2",
                 "--openings", "3", "--out", str(tmp_path / "h.jsonl")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["short_history_copies"] > 0 and out["opening_transitions"] > 0
    assert out["written"] == len(read_samples(tmp_path / "h.jsonl"))


def test_check_positions_are_in_check_held_out_and_every_legal_move_solves_them(tmp_path, capsys):
    from rookworld_rlvr.data.judged import read_puzzles
    from rookworld_rlvr.tasks.strength import Puzzle, in_check, legal_moves

    rows = [Sample("A", t) for t in random_transitions(80, seed=5)]
    src, other = tmp_path / "src.jsonl", tmp_path / "other.jsonl"
    write_samples(src, rows[:60])
    write_samples(other, rows[60:])
    assert main(["data", "checks", str(src), "--exclude", str(other), "--out", str(tmp_path / "c.jsonl")]) == 0
    capsys.readouterr()
    puzzles = read_puzzles(tmp_path / "c.jsonl")
    excluded = {" ".join(f.split()[:4]) for s in rows[60:] for f in (s.fen, s.truth.new_fen)}
    assert puzzles and all(p.kind == "check" and in_check(p.fen) for p in puzzles)
    assert all(set(p.solutions) == legal_moves(p.fen) for p in puzzles)
    assert not {" ".join(p.fen.split()[:4]) for p in puzzles} & excluded
    with pytest.raises(ValueError, match="must be in check"):
        Puzzle.from_dict({"fen": "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1", "solutions": ["a1a8"], "kind": "check"})


def test_a_king_onto_its_own_rook_is_illegal_on_reading_as_in_the_environment(tmp_path):
    """python-chess reads e8h8 as castling; the environment (UCI: e8g8) calls it illegal and truncates. A
    generated row with that move read back (a 3,600-game generation stopped on one), and a P: answer listing it
    is refused."""
    from rookworld_rlvr.tasks.policy import PolicyTruth

    fen = "rnbqk2r/p1pp2pp/4Pn2/1P6/1b6/5N2/P2P1PPP/RNBQKB1R b KQkq - 1 7"
    truth = E.transition(fen, "e8h8", "f8b4 g1f3 e8h8")
    assert truth.truncated and truth.new_fen == fen
    castle = E.transition(fen, "e8g8", "g1f3 e8g8")
    assert not castle.truncated
    path = tmp_path / "rows.jsonl"
    write_samples(path, [Sample("A", truth), Sample("A", castle)])
    assert [s.truth for s in read_samples(path)] == [truth, castle]
    bad = PolicyTruth(fen, ("e8h8", "e8g8"), (0.1, 0.2), ("e8g8",))
    write_samples(path, [Sample("P", bad)])
    with pytest.raises(DataError, match=r"rows.jsonl:1: field 'truth.moves' holds moves that are not legal.*e8h8"):
        read_samples(path)


def test_the_shipped_training_mates_are_every_mate_in_one_of_the_training_positions(tmp_path, monkeypatch):
    """data/README.md's command for `puzzles_train.jsonl.gz`, on the training file's first rows: `data judge
    --positions 0 --tactic-pool 0` finds exactly the shipped mates among them with python-chess alone (no
    Stockfish there), and the shipped file keeps the training file's order (the order `make train`'s draws follow)."""
    monkeypatch.setenv("STOCKFISH_PATH", str(tmp_path / "no-stockfish"))
    from conftest import REPO
    from rookworld_rlvr.data.judged import read_puzzles

    data = REPO / "data"
    with lzma.open(data / "train.jsonl.xz", "rt") as f:
        head = [line for _, line in zip(range(4000), f)]
    part = tmp_path / "part.jsonl"
    part.write_text("".join(head))
    rows = [json.loads(line) for line in head]
    p_fens = list(dict.fromkeys(r["truth"]["fen"] for r in rows if r["task"] == "P"))
    out = tmp_path / "mates.jsonl.gz"
    assert main(["data", "judge", str(part), "--out", "", "--positions", "0", "--tactic-pool", "0",
                 "--puzzles-out", str(out), "--quiet"]) == 0
    found = read_puzzles(out)
    in_part = set(p_fens)
    shipped = [p for p in read_puzzles(data / "puzzles_train.jsonl.gz") if p.fen in in_part]
    assert len(shipped) >= 30 and {p.kind for p in found} == {"mate1"}
    assert sorted((p.fen, p.solutions) for p in found) == sorted((p.fen, p.solutions) for p in shipped)
    assert [p.fen for p in shipped] == [f for f in p_fens if f in {p.fen for p in shipped}]  # the training file's order


def test_the_gpu_recipes_training_mates_are_training_positions_and_none_held_out():
    """`puzzles_train_gpu.jsonl.gz` (configs/gpu-grpo.yaml's `puzzle_data`): mates in one, each position once,
    none of them (move clocks aside) a position of a held-out file, and every shipped training mate that is not
    one among them (23 of those 2,322 are: results of held-out `A:` moves, and one held-out mate with other clocks)."""
    from conftest import REPO, held_out_files
    from rookworld_rlvr.data.judged import board_key, positions_of_files
    from rookworld_rlvr.tasks.strength import Puzzle

    data = REPO / "data"
    with gzip.open(data / "puzzles_train_gpu.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    with gzip.open(data / "puzzles_train.jsonl.gz", "rt") as f:
        shipped = {json.loads(line)["fen"] for line in f}
    fens = [r["fen"] for r in rows]
    assert len(rows) > 15_000 and {r["kind"] for r in rows} == {"mate1"} and len(set(fens)) == len(fens)
    for r in rows[::20]:  # a twentieth read as the trainer reads them: every mating move, legal
        Puzzle.from_dict(r)
    held_out = {board_key(f) for f in positions_of_files(held_out_files())}
    assert not {board_key(f) for f in fens} & held_out
    assert {f for f in shipped if board_key(f) not in held_out} <= set(fens)
    assert len([f for f in shipped if board_key(f) in held_out]) == 23


def test_the_game_positions_preset_trains_on_training_positions_of_the_bases_games():
    """configs/game-positions.yaml: its prompts (data/game_positions.jsonl.xz, the last four positions of the base's
    own greedy games, labelled by Stockfish) are training-side positions, each FEN once, none (move clocks aside) a
    position of a held-out file, each with five legal candidates (fewer where fewer are legal) and a legal best move; it trains without an anchor
    of true answers (the base is its control), and every file it names is shipped."""
    import chess

    from conftest import REPO
    from rookworld_rlvr.config import load_config
    from rookworld_rlvr.data.generate import is_eval_fen
    from rookworld_rlvr.data.judged import board_key, positions_of_files

    cfg = load_config(str(REPO / "configs" / "game-positions.yaml"))
    assert cfg.data == "data/game_positions.jsonl.xz" and cfg.check_share is None
    assert cfg.anchor_coef == 0 and cfg.anchor_data is None
    assert all((REPO / f).is_file() for f in (cfg.data, cfg.eval_data, cfg.puzzle_data))
    rows = read_samples(REPO / cfg.data)
    fens = [s.truth.fen for s in rows]
    assert len(rows) == 4055 and {s.task for s in rows} == {"P"} and len(set(fens)) == len(fens)
    assert not any(is_eval_fen(f, 40) for f in fens)
    assert not {board_key(f) for f in fens} & {board_key(f) for f in positions_of_files(held_out_files())}
    for s in rows:
        board = chess.Board(s.truth.fen)
        assert len(s.truth.moves) == min(5, board.legal_moves.count())  # fewer where fewer moves are legal
        assert all(chess.Move.from_uci(m) in board.legal_moves for m in s.truth.moves + s.truth.best)
