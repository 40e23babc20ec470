"""Playing strength: the win-probability model, move quality next to a random mover, candidates,
puzzles, the judged sets on disk, and `rookworld data judge` with a real Stockfish."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import chess
import pytest

from rookworld_rlvr.cli import main
from rookworld_rlvr.data.io import DataError, Sample, write_samples
from rookworld_rlvr.data.judged import read_judged, read_puzzles
from rookworld_rlvr.tasks import policy as P
from rookworld_rlvr.tasks import strength as S

REPO = Path(__file__).resolve().parents[1]
BACK_RANK = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"  # a1a8 mates


def judged(fen: str, best: str, best_eval: float, rest: float) -> S.JudgedPosition:
    """Every legal move at `rest` pawns, except `best`."""
    moves = [m.uci() for m in chess.Board(fen).legal_moves]
    return S.JudgedPosition(fen, {m: (best_eval if m == best else rest) for m in moves})


def test_win_probability_is_lichess_logistic():
    assert S.win_prob(0.0) == 0.5
    # Lichess: win% = 50 + 50 * (2 / (1 + exp(-0.00368208 * cp)) - 1)
    for pawns in (-3.0, -0.5, 1.0, 4.41):
        lichess = 50 + 50 * (2 / (1 + math.exp(-0.00368208 * pawns * 100)) - 1)
        assert S.win_prob(pawns) == pytest.approx(lichess / 100)
    assert S.win_prob(999.99) > 0.999 and S.win_prob(-999.99) < 0.001  # mates sit at the ends
    assert S.move_loss(1.0, 1.0) == 0 and S.move_loss(1.0, 2.0) == 0  # never negative
    assert S.accuracy(0.0) == pytest.approx(100.0, abs=1e-3) and S.accuracy(0.5) == pytest.approx(
        103.1668 * math.exp(-0.04354 * 50) - 3.1669)


def test_move_quality_pairs_the_model_with_a_random_mover_on_the_same_positions():
    a = judged(BACK_RANK, "a1a8", 999.99, 0.0)
    b = judged(chess.STARTING_FEN, "e2e4", 0.3, -3.0)
    n_a, n_b = len(a.evals), len(b.evals)
    out = S.move_quality([a, b, b], ["a1a8", "e2e4", "e2e5"])  # mate, best, illegal
    assert out["n"] == 3 and out["legal"] == pytest.approx(2 / 3) and out["best"] == pytest.approx(2 / 3)
    assert out["legal_items"] == [1, 1, 0] and out["best_items"] == [1, 1, 0]  # per position, for a paired verdict
    assert out["loss_items"] == [0, 0, None] and out["blunder_items"] == [0, 0, None]
    assert out["items_of"] == S.move_quality([a, b, b], [None] * 3)["items_of"] != S.move_quality([b, a, b], [None] * 3)[
        "items_of"]  # the positions, in order, whatever the answers
    assert out["loss"] == 0 and out["blunder"] == 0 and out["accuracy"] == pytest.approx(S.accuracy(0))
    loss_a = (n_a - 1) * (S.win_prob(999.99) - S.win_prob(0.0)) / n_a
    loss_b = (n_b - 1) * (S.win_prob(0.3) - S.win_prob(-3.0)) / n_b
    # the random mover's move quality is judged on the positions where the model moved legally (a and b once)
    assert out["random"]["loss"] == pytest.approx((loss_a + loss_b) / 2)
    assert out["random"]["blunder"] == pytest.approx(((n_a - 1) / n_a + (n_b - 1) / n_b) / 2)
    # and its best-move rate, as the model's, on every position (the illegal answer's too)
    assert out["random"]["best"] == pytest.approx((1 / n_a + 2 / n_b) / 3)
    assert out["loss_below_random"] == 1.0 and out["blunder_below_random"] == 1.0
    # why the illegal ones are illegal, as shares of all positions: e2e5 is no pawn move
    assert out["illegal"]["geometry"] == pytest.approx(1 / 3)
    assert sum(out["illegal"].values()) == pytest.approx(1 - out["legal"])
    worse = S.move_quality([b], ["a2a3"])
    assert worse["blunder"] == 1 and worse["loss_below_random"] < 0  # worse than random on that position
    none = S.move_quality([b], [None])
    assert none["legal"] == 0 and none["loss"] is None and none["random"]["loss"] is None
    assert none["best"] == 0 and none["random"]["best"] == pytest.approx(1 / n_b)


def test_move_quality_says_how_sure_it_is():
    """The ratio against the random mover comes with a 95% interval over the positions: it holds the
    figure, narrows with more positions, and is the same for the same answers."""
    pos = judged(chess.STARTING_FEN, "e2e4", 0.3, -3.0)
    small = S.move_quality([pos] * 40, ["e2e4", "a2a3"] * 20)  # half best, half blunders
    ci = small["loss_below_random_ci"]
    assert ci["low"] < small["loss_below_random"] < ci["high"]
    blunders = small["blunder_below_random_ci"]
    assert blunders["low"] < small["blunder_below_random"] < blunders["high"]
    large = S.move_quality([pos] * 640, ["e2e4", "a2a3"] * 320)
    assert large["loss_below_random"] == pytest.approx(small["loss_below_random"])
    assert large["loss_below_random_ci"]["high"] - large["loss_below_random_ci"]["low"] < (ci["high"] - ci["low"]) / 2
    assert S.move_quality([pos] * 40, ["e2e4", "a2a3"] * 20)["loss_below_random_ci"] == ci
    perfect = S.move_quality([pos] * 10, ["e2e4"] * 10)["loss_below_random_ci"]
    assert perfect == {"low": 1.0, "high": 1.0}
    assert S.move_quality([pos], ["e2e4"])["loss_below_random_ci"] is None  # one position says nothing


@pytest.mark.parametrize("fen, move, kind", [
    (chess.STARTING_FEN, "g1f3", None),
    (chess.STARTING_FEN, None, "unreadable"),
    (chess.STARTING_FEN, "e2", "unreadable"),
    (chess.STARTING_FEN, "0000", "unreadable"),
    (chess.STARTING_FEN, "e3e4", "no_piece"),  # an empty square
    (chess.STARTING_FEN, "e7e5", "no_piece"),  # the opponent's pawn
    (chess.STARTING_FEN, "e1e2", "own_piece"),
    (chess.STARTING_FEN, "e2e5", "geometry"),
    (chess.STARTING_FEN, "b1b3", "geometry"),
    (chess.STARTING_FEN, "f1c4", "blocked"),  # through the e2 pawn
    (chess.STARTING_FEN, "e2d3", "blocked"),  # a pawn capture with nothing to capture
    ("4k3/8/8/8/8/8/8/R3KB1R w KQ - 0 1", "e1g1", "castling"),  # a piece between
    ("4k3/8/8/8/8/8/8/R3K2R w Q - 0 1", "e1g1", "castling"),  # no right
    ("4kr2/8/8/8/8/8/8/R3K2R w KQ - 0 1", "e1g1", "castling"),  # through check
    (chess.STARTING_FEN, "e2e4q", "promotion"),
    ("7k/4P3/8/8/8/8/8/K7 w - - 0 1", "e7e8", "promotion"),
    ("7k/4P3/8/8/8/8/8/K7 w - - 0 1", "e7e8q", None),
    ("4k3/8/8/8/8/8/8/r3K3 w - - 0 1", "e1d1", "check"),  # stays on the rook's rank
    ("4k3/8/8/8/8/8/3b4/4K2R w K - 0 1", "h1h2", "check"),  # ignores the check from d2
])
def test_illegal_moves_are_told_apart_by_why(fen, move, kind):
    assert S.illegal_kind(fen, move) == kind


def test_candidates_count_each_legal_move_once():
    b = judged(chess.STARTING_FEN, "e2e4", 0.3, 0.0)
    top = list(b.top(5))
    out = S.candidate_quality([b, b, b], [top, ["e2e4"] * 5, ["e2e4", "e2e5", "a1a1", "e2e4"]])
    assert out["distinct_legal"] == pytest.approx((5 + 1 + 1) / 3)
    assert out["all_distinct_legal"] == pytest.approx(1 / 3) and out["repeated"] == pytest.approx(2 / 3)
    assert out["top5_overlap"] == pytest.approx((1 + 0.2 + 0.2) / 3)
    assert out["random"]["top5_overlap"] == pytest.approx(5 / 20)


def test_puzzles_and_tactics():
    mate = S.Puzzle(BACK_RANK, ("a1a8",), "mate1")
    assert S.mating_moves(BACK_RANK) == ["a1a8"]
    out = S.puzzle_scores([mate, mate], ["a1a8", "h2h3"])
    assert out["mate1"]["solved"] == 0.5 and out["mate1"]["legal"] == 1.0 and out["mate1"]["solved_items"] == [1, 0]
    assert out["mate1"]["random"]["solved"] == pytest.approx(1 / len(S.legal_moves(BACK_RANK)))
    with pytest.raises(ValueError, match="every mating move"):
        S.Puzzle.from_dict({"fen": BACK_RANK, "solutions": ["h2h3"], "kind": "mate1"})
    won = judged(chess.STARTING_FEN, "e2e4", 5.0, -1.0)  # one move wins, every other loses
    assert S.tactic_of(won) == S.Puzzle(chess.STARTING_FEN, ("e2e4",), "tactic")
    assert S.tactic_of(judged(chess.STARTING_FEN, "e2e4", 0.5, 0.4)) is None  # nothing decisive
    many = S.JudgedPosition(won.fen, {m: (5.0 if m in ("e2e4", "d2d4", "c2c4") else -1.0) for m in won.evals})
    assert S.tactic_of(many) is None  # three moves win: not one move


def test_judged_sets_read_with_file_line_errors(tmp_path):
    good = judged(BACK_RANK, "a1a8", 999.99, 0.0)
    path = tmp_path / "s.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(good.to_dict()) + "\n")
        bad = good.to_dict()
        bad["evals"].pop("a1a8")
        fh.write(json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=r"s\.jsonl\.gz:2: 'evals' must hold exactly the \d+ legal moves"):
        read_judged(path)
    tsv = tmp_path / "m.tsv"
    tsv.write_text(f"{BACK_RANK}\ta1a8\n")
    assert read_puzzles(tsv) == [S.Puzzle(BACK_RANK, ("a1a8",), "mate1")]
    bad_puzzle = tmp_path / "p.jsonl"
    bad_puzzle.write_text(json.dumps({"fen": BACK_RANK, "solutions": ["a1a8"], "kind": "riddle"}) + "\n")
    with pytest.raises(DataError, match=r"p\.jsonl:1: field 'kind'"):
        read_puzzles(bad_puzzle)
    # the other kind of file, a row that is no object, a FEN that is no position: each named with its line
    with pytest.raises(DataError, match=r"p\.jsonl:1: no field 'evals' \(a row has 'fen' and 'evals' of every legal "
                                        r"move, as `rookworld data judge` writes them\)"):
        read_judged(bad_puzzle)
    bad_puzzle.write_text(json.dumps({"fen": BACK_RANK, "solutions": ["a1a8"], "kind": "mate1"}) + "\n[1, 2]\n")
    with pytest.raises(DataError, match=r"p\.jsonl:2: a row must be a JSON object \('fen', 'solutions' and 'kind', as "
                                        r"`rookworld data judge --puzzles-out` writes them\), got a list"):
        read_puzzles(bad_puzzle)
    for row, reader in (({"fen": "8/8/8 w - - 0 1", "solutions": ["a1a2"], "kind": "mate1"}, read_puzzles),
                        ({"fen": "8/8/8 w - - 0 1", "evals": {"a1a2": 0.0}}, read_judged)):
        bad_puzzle.write_text(json.dumps(row) + "\n")
        with pytest.raises(DataError, match=r"p\.jsonl:1: field 'fen' '8/8/8 w - - 0 1' is not a position"):
            reader(bad_puzzle)


COLLECTING: list[bool] = []


def _puzzle_noting_the_collector(row: dict) -> S.Puzzle:
    import gc

    COLLECTING.append(gc.isenabled())
    return S.Puzzle.from_dict(row)


def test_a_large_puzzle_file_read_in_parallel_gives_what_one_process_gives(tmp_path, monkeypatch):
    """The GPU recipe's 19,576 mates took 4 s to check at every GRPO start: from PARALLEL_PUZZLES rows on, forked
    workers check chunks of the file, with the same puzzles in the same order and the file's first bad line named
    (whichever worker finds one first), the garbage collector off while they are read and as it was after."""
    import gc

    from conftest import REPO
    from rookworld_rlvr.data import io as data_io
    from rookworld_rlvr.data import judged as judged_io

    with gzip.open(REPO / "data" / "puzzles_train_gpu.jsonl.gz", "rt") as fh:
        lines = [next(fh) for _ in range(1200)]
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("".join(lines[:600] + ["# a comment\n", "\n"] + lines[600:]))
    wrong = {**json.loads(lines[900]), "solutions": ["a1a1"]}
    bad.write_text("".join(lines[:700] + ["[1]\n"] + lines[700:900] + [json.dumps(wrong) + "\n"] + lines[900:]))
    forks = []
    real_context = data_io.mp.get_context
    monkeypatch.setattr(data_io.mp, "get_context", lambda method: forks.append(method) or real_context(method))
    monkeypatch.setattr(judged_io, "PARALLEL_PUZZLES", 1000)
    COLLECTING.clear()
    serial = judged_io._read_rows(good, _puzzle_noting_the_collector, "", workers=1)
    assert forks == [] and len(serial) == 1200 and serial == [S.Puzzle.from_dict(json.loads(x)) for x in lines]
    assert set(COLLECTING) == {False} and gc.isenabled()
    assert judged_io._read_rows(good, S.Puzzle.from_dict, "", workers=3) == serial and forks == ["fork"]
    for workers in (1, 3):
        with pytest.raises(DataError, match=rf"^{bad}:701: a row must be a JSON object \(\), got a list$"):
            judged_io._read_rows(bad, S.Puzzle.from_dict, "", workers=workers)
        assert gc.isenabled()
    monkeypatch.setattr(judged_io, "PARALLEL_PUZZLES", 5000)
    forks.clear()
    assert read_puzzles(good) == serial and forks == []  # below the bound: one process


def test_data_judge_builds_the_strength_set_and_puzzles_with_stockfish(tmp_path, capsys):
    fens = [BACK_RANK, chess.STARTING_FEN, "r1bqkbnr/pppp1ppp/2n5/4p3/2B1P3/5Q2/PPPP1PPP/RNB1K1NR w KQkq - 2 3"]
    samples = [Sample("P", P.PolicyTruth(f, ("a2a3",), (0.0,), ("a2a3",))) for f in fens[1:]]
    samples.insert(0, Sample("P", P.PolicyTruth(BACK_RANK, ("a1a8",), (999.99,), ("a1a8",))))
    src = tmp_path / "eval.jsonl"
    write_samples(src, samples)
    out, puzzles = tmp_path / "strength.jsonl.gz", tmp_path / "puzzles.jsonl"
    assert main(["data", "judge", str(src), "--out", str(out), "--puzzles-out", str(puzzles), "--positions", "3",
                 "--depth", "4", "--workers", "1", "--cache", str(tmp_path / "c.sqlite"), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["positions"] == 3 and summary["mate1"] >= 2  # a1a8, and Qxf7# in the scholar's position
    sets = read_judged(out)
    assert sorted(p.fen for p in sets) == sorted(fens)
    for p in sets:
        assert set(p.evals) == S.legal_moves(p.fen)  # every legal move judged
    back = next(p for p in sets if p.fen == BACK_RANK)
    assert back.best_moves() == ("a1a8",) and back.evals["a1a8"] > 999
    found = read_puzzles(puzzles)
    assert S.Puzzle(BACK_RANK, ("a1a8",), "mate1") in found


def test_data_judge_screens_a_large_source_for_tactics_and_leaves_out_excluded_positions(tmp_path, capsys):
    """`data judge --screen --exclude`: more held-out puzzles from a large source. Only positions whose recorded
    evals leave room for a tactic are judged (every legal move, a real Stockfish), and a position that another
    file holds, at any move number, is neither judged nor a puzzle."""
    hanging_queen = "q3k3/8/8/8/8/8/8/R3K3 w - - 0 1"  # Rxa8+ wins the queen; every other move loses the rook or draws
    assert S.could_be_tactic((9.0, 0.0, -0.2, -0.5, -5.0)) and not S.could_be_tactic((0.3, 0.2, 0.2, 0.1, 0.1))
    assert not S.could_be_tactic((9.0, 8.9, 8.8, 0.0)) and not S.could_be_tactic((9.0,))  # three win; one move known
    samples = [Sample("P", P.PolicyTruth(hanging_queen, ("a1a8", "e1d2"), (9.0, -5.0), ("a1a8",))),
               Sample("P", P.PolicyTruth(chess.STARTING_FEN, ("e2e4", "d2d4", "g1f3"), (0.3, 0.3, 0.2), ("e2e4",))),
               Sample("P", P.PolicyTruth(BACK_RANK, ("a1a8",), (999.99,), ("a1a8",)))]
    src, known = tmp_path / "held.jsonl", tmp_path / "train.jsonl"
    write_samples(src, samples)
    write_samples(known, [Sample("P", P.PolicyTruth(BACK_RANK.replace("0 1", "7 40"), ("a1a8",), (999.99,), ("a1a8",)))])

    def judge(*flags: str) -> tuple[dict, list[S.Puzzle]]:
        puzzles = tmp_path / "puzzles.jsonl"
        assert main(["data", "judge", str(src), "--out", "", "--puzzles-out", str(puzzles), "--positions", "0",
                     "--tactic-pool", "10", "--depth", "6", "--workers", "1", "--cache", str(tmp_path / "c.sqlite"),
                     "--quiet", *flags]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1]), read_puzzles(puzzles)

    summary, found = judge("--screen", "--exclude", str(known))
    assert summary["excluded"] == 1 and summary["candidates"] == 2 and summary["tactic_searched"] == 1
    assert found == [S.Puzzle(hanging_queen, ("a1a8",), "tactic")]  # the back-rank mate is the known file's
    summary, found = judge()  # unscreened: every position judged; nothing excluded, so the mate is a puzzle again
    assert summary["excluded"] == 0 and summary["tactic_searched"] == 3
    assert S.Puzzle(BACK_RANK, ("a1a8",), "mate1") in found and S.Puzzle(hanging_queen, ("a1a8",), "tactic") in found
    assert main(["data", "judge", str(src), "--out", "", "--positions", "3"]) == 1
    assert "needs a file to go to (--out)" in capsys.readouterr().err


def test_king_positions_keeps_the_a_rows_and_the_positions_in_check_or_where_a_king_move_would_step_into_it(
        tmp_path):
    """scripts/king_positions.py, whose training set docs/grpo-experiments.md draws prompts from: the A: rows
    and, of the P: rows, only those in check or with a king move into check, in the order of the file."""
    def p_row(fen: str) -> str:
        move = next(iter(chess.Board(fen).legal_moves)).uci()
        return json.dumps({"task": "P", "truth": {"fen": fen, "moves": [move], "evals": [0.0], "best": [move]}}) + "\n"

    a_row = json.dumps({"task": "A", "truth": {
        "fen": chess.STARTING_FEN, "move": "e2e4", "history": "e2e4",
        "new_fen": "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", "reward": 0.001, "terminated": False,
        "truncated": False}}) + "\n"
    safe, king, check = (p_row("4k3/8/8/8/8/8/8/4K2R b - - 0 1"), p_row("4k3/R7/8/8/8/8/8/4K3 b - - 0 1"),
                         p_row("4k3/8/8/8/8/8/8/4R1K1 b - - 0 1"))
    data = tmp_path / "train.jsonl"
    data.write_text(safe + king + a_row + check + safe)
    out = tmp_path / "king.jsonl"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "king_positions.py"), "--data", str(data),
                           "--out", str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, check=True)
    assert out.read_text() == a_row + king + check
    assert "1 P: positions in check, 1 out of check where a king move would step into check, 1 A: rows" in proc.stdout
    for keep, rows in (("king", a_row + king), ("out-of-check", a_row + safe + king + safe)):
        anchor = tmp_path / f"{keep}.jsonl"  # files for the anchor: no answer in check, where GRPO is to learn
        subprocess.run([sys.executable, str(REPO / "scripts" / "king_positions.py"), "--data", str(data), "--out",
                        str(anchor), "--keep", keep], env={**os.environ, "PYTHONPATH": str(REPO / "src")}, check=True)
        assert anchor.read_text() == rows, keep


def test_game_positions_keeps_every_position_of_a_game_its_last_included_on_the_training_side_only(tmp_path):
    """scripts/game_positions.py, whose prompts docs/grpo-experiments.md trains on: each position of a game
    once, in order, the last one (where an illegal move ended it) included, as the data writes FENs (the
    en-passant square after every double step); never a held-out position, an eval-side one or a game over."""
    import importlib.util
    from types import SimpleNamespace

    from rookworld_rlvr.data.generate import is_eval_fen
    from rookworld_rlvr.data.judged import board_key
    from rookworld_rlvr.tasks.environment import fen_of

    spec = importlib.util.spec_from_file_location("game_positions", REPO / "scripts" / "game_positions.py")
    gp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gp)

    def game(moves: str, start: str = chess.STARTING_FEN) -> SimpleNamespace:
        board = chess.Board(start)
        for m in moves.split():
            board.push_uci(m)
        return SimpleNamespace(board=board)

    def fens(moves: str) -> list[str]:
        board, out = chess.Board(), [fen_of(chess.Board())]
        for m in moves.split():
            board.push_uci(m)
            out.append(fen_of(board))
        return out

    line = "e2e4 e7e5 g1f3 b8c6 f1c4 g8f6"
    every = fens(line)
    assert "e3" in every[1].split()[3]  # written as the data writes it, though no pawn can take there
    held = {board_key(every[2])}
    kept = gp.game_positions([game(line), game("e2e4 e7e5 g1f3")], held)  # the second game: no new position
    assert kept == every[:2] + every[3:]  # the last position included (all of them on the training side)
    # each game's last 2 (--last 2): the first game's, then the second's but the held-out one
    assert gp.game_positions([game(line), game("e2e4 e7e5 g1f3")], held, last=2) == every[5:7] + every[3:4]
    # --but-last 2: the others; with --last 4, the first two of each game's last four
    assert gp.game_positions([game(line)], held, but_last=2) == every[:2] + every[3:5]
    assert gp.game_positions([game(line)], set(), last=4, but_last=2) == every[3:5]
    # --exclude FILE: its positions left out as the held-out ones are, whatever their move clocks
    listed = tmp_path / "seen.txt"
    listed.write_text(every[4].rsplit(" ", 2)[0] + " 7 30\n\n")
    assert gp.game_positions([game(line)], gp.listed_positions([listed]), last=4) == [every[3]] + every[5:]
    eval_side = fens("g1f3 c7c6")
    assert [is_eval_fen(f, gp.EVAL_PERMILLE) for f in eval_side] == [False, False, True]
    assert gp.game_positions([game("g1f3 c7c6")], set()) == eval_side[:2]
    mate = game("f2f3 e7e5 g2g4 d8h4")  # the last position is mate: a game over is no prompt
    assert fens("f2f3 e7e5 g2g4 d8h4")[-1] not in gp.game_positions([mate], set())
    assert {board_key(f) for f in (REPO / "data" / "openings.txt").read_text().split("\n")
            if f and not f.startswith("#")} <= gp.held_out_positions()


def test_the_shipped_training_openings_are_training_positions_and_a_held_out_one_is_named(tmp_path):
    """data/train_openings.txt, where `gpu_rl.sh --game-positions` plays the base's games (made once, so that a GPU
    call spends no minute on Stockfish's openings): 2,000 distinct openings, each on the training side and none a
    position of a held-out file. An openings file that holds a held-out position, too few openings or a line that
    is not a FEN stops game_positions.py, naming the file and the opening or line."""
    import importlib.util

    from rookworld_rlvr.data.generate import is_eval_fen

    spec = importlib.util.spec_from_file_location("game_positions", REPO / "scripts" / "game_positions.py")
    gp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gp)
    held = gp.held_out_positions()
    shipped = gp.training_openings(REPO / "data" / "train_openings.txt", 2000, held)
    assert len(set(shipped)) == 2000 and not any(is_eval_fen(f, gp.EVAL_PERMILLE) for f in shipped)
    mixed = tmp_path / "openings.txt"
    held_out = next(f for f in (REPO / "data" / "openings.txt").read_text().splitlines() if not f.startswith("#"))
    mixed.write_text(f"# two openings\n{shipped[0]}\n{held_out}\n")
    assert gp.training_openings(mixed, 1, held) == shipped[:1]
    with pytest.raises(SystemExit, match=f"{mixed}: opening 2 .* is a held-out position"):
        gp.training_openings(mixed, 2, held)
    mixed.write_text(f"{shipped[0]}\n{shipped[1]}\n")
    with pytest.raises(SystemExit, match=f"{mixed} holds 2 openings, not the 3 asked for"):
        gp.training_openings(mixed, 3, held)
    mixed.write_text(f"{shipped[0]}\nnot a fen\n")
    with pytest.raises(SystemExit, match=f"game_positions: {mixed}:2: bad FEN"):
        gp.training_openings(mixed, 2, held)
    for flag in ("--openings", "--batch-size"):  # a count of 0 is one line naming the flag, before any work
        proc = subprocess.run([sys.executable, str(REPO / "scripts" / "game_positions.py"), flag, "0", "--out",
                               str(tmp_path / "fens.txt")], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and f"argument {flag}: must be at least 1, got 0" in proc.stderr


def test_mating_moves_are_every_legal_move_that_mates_at_once():
    """The fast search (one board; only moves that may give check, by bitboards, are played) finds what
    playing every legal move finds: on the shipped training mates, training positions without one, the
    positions of random games (castling, en passant and promotions on the way), mates by castling, by en
    passant, by a king that uncovers a slider and by a rook along the edge, two promotions that both mate,
    a bad FEN."""
    import gzip
    import json
    import lzma
    import random

    from conftest import REPO

    def every_mate(fen: str) -> list[str]:  # every legal move played
        board, found = chess.Board(fen), []
        for move in board.legal_moves:
            board.push(move)
            found += [move.uci()] if board.is_checkmate() else []
            board.pop()
        return sorted(found)

    with gzip.open(REPO / "data/puzzles_train.jsonl.gz", "rt") as f:
        mates = [json.loads(line)["fen"] for _, line in zip(range(300), f)]
    with lzma.open(REPO / "data/train.jsonl.xz", "rt") as f:
        others = [json.loads(line)["truth"]["fen"] for _, line in zip(range(600), f)]
    rng, played = random.Random(0), []
    for _ in range(15):
        board = chess.Board()
        while len(board.move_stack) < 150 and not board.is_game_over():
            board.push(rng.choice(list(board.legal_moves)))
            played.append(board.fen())
    for fen in mates + others + played:
        assert S.mating_moves(fen) == every_mate(fen), fen
    assert all(S.mating_moves(f) for f in mates) and sum(map(bool, map(S.mating_moves, others))) < 60
    assert S.mating_moves("7k/4P3/6K1/8/8/8/8/8 w - - 0 1") == ["e7e8q", "e7e8r"]
    for fen, mate in (("1nb4N/r3n1p1/pq3p2/1pp1p2p/1P1k1PP1/4p2P/P1Q1P1R1/R3KB2 w Q - 0 31", "e1c1"),
                      ("rn2k1nr/p2p3p/b1p2pp1/2b3N1/1pPPp1P1/1N2P3/PP1BKPB1/1R1Q3q b kq c3 0 17", "b4c3"),
                      ("4q3/r3Nkr1/p1pp3B/4Q3/P7/3P4/1P3KBR/5RN1 w - - 3 36", "f2e3"),
                      ("8/8/8/5k1K/8/8/4p1q1/8 b - - 17 73", "g2h1")):
        assert mate in S.mating_moves(fen) and S.mating_moves(fen) == every_mate(fen), fen
    assert S.mating_moves("not a fen") == []
