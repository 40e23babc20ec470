"""Games: the referee, Elo intervals, players (random, Stockfish, a tiny model), `rookworld match`
and the model as a UCI engine driven by python-chess."""

from __future__ import annotations

import io
import json
import math
import random
import sys
from pathlib import Path

import chess
import chess.engine
import chess.pgn
import pytest
import torch

from rookworld_rlvr.cli import main
from rookworld_rlvr.data.io import DataError
from rookworld_rlvr.play import (ModelPlayer, RandomPlayer, StockfishPlayer, elo_interval, elo_of, format_summary,
                                 play_match, read_openings)
from rookworld_rlvr.uci import UCIEngine
from rookworld_rlvr.verdict import Z95, score_interval, wilson

START = chess.STARTING_FEN
OPENINGS = [START, "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2"]

pytestmark = pytest.mark.usefixtures("one_thread")


class Scripted:
    """Plays a fixed list of moves per colour, then nothing (None: an unreadable answer)."""

    def __init__(self, name: str, white: list[str], black: list[str]) -> None:
        self.name, self.script = name, {chess.WHITE: white, chess.BLACK: black}

    def moves(self, boards):
        out = []
        for b in boards:
            line = self.script[b.turn]
            k = len(b.move_stack) // 2
            out.append(line[k] if k < len(line) else None)
        return out


def test_referee_ends_games_by_mate_illegal_and_missing_moves():
    # game 1: A (white) walks into fool's mate, B (black) mates. Game 2, colours swapped: after
    # e2e4 e7e5 d1h5, A (black) has no move left in its script: an unreadable answer loses.
    a = Scripted("a", ["f2f3", "g2g4"], ["e7e5"])
    b = Scripted("b", ["e2e4", "d1h5"], ["e7e5", "d8h4"])
    res = play_match(a, b, [START])
    first, second = res.games
    assert (first.result, first.termination) == ("0-1", "checkmate")
    assert [m.uci() for m in first.board.move_stack] == ["f2f3", "e7e5", "g2g4", "d8h4"]
    # second game: b white e2e4, a black e7e5, b d1h5, a has no more moves: loses by no_move
    assert (second.result, second.termination) == ("1-0", "no_move")
    illegal = Scripted("c", ["e2e5"], [])
    res = play_match(illegal, RandomPlayer(), [START])
    assert res.games[0].termination == "illegal_move" and res.games[0].result == "0-1"
    s = res.summary()
    assert s["games"] == 2 and s["wins"] + s["draws"] + s["losses"] == 2
    # one game per opening, A with white (scripts/game_positions.py: a greedy model's twin is the same game)
    once = play_match(a, b, [START, START], both_colours=False)
    assert [(g.white, g.black, g.termination) for g in once.games] == [("a", "b", "checkmate")] * 2


@pytest.mark.timeout(30)
def test_a_player_that_answers_fewer_boards_than_asked_is_an_error_not_a_match_that_never_ends():
    class Short(RandomPlayer):  # drops its last answer: that game would be asked again for ever
        def moves(self, boards):
            return super().moves(boards)[:-1]

    with pytest.raises(ValueError, match="zip"):
        play_match(Short(), Scripted("b", ["e2e4"], ["e7e5"]), [START])


def test_elo_interval_from_per_game_scores():
    assert elo_of(0.5) == 0 and elo_of(0.75) == pytest.approx(-400 * math.log10(1 / 0.75 - 1))
    scores = [1.0] * 60 + [0.5] * 20 + [0.0] * 20
    elo, lo, hi = elo_interval(scores)
    assert elo == pytest.approx(elo_of(0.7))
    # each end is a true score q at which the observed 0.7 lies 1.96 standard errors away, a game's
    # variance at q being q (1 - q) - draws / 4
    for end in (lo, hi):
        q = 1 / (1 + 10 ** (-end / 400))
        assert (0.7 - q) ** 2 == pytest.approx(Z95 ** 2 * (q * (1 - q) - 0.2 / 4) / 100)
    assert lo < elo_of(0.7) < hi
    # without draws it is Wilson's interval
    assert score_interval(0.8, 0.0, 10) == pytest.approx(wilson(0.8, 10))
    elo, lo, hi = elo_interval([1.0] * 10)  # a clean sweep stays finite
    assert math.isfinite(elo) and lo <= elo <= hi
    # every game the same result: the games' variance is 0, and the interval is Wilson's, not a point
    k = Z95 ** 2 / 4
    elo, lo, hi = elo_interval([0.0] * 4)
    assert elo == lo == pytest.approx(elo_of(0.125)) and hi == pytest.approx(elo_of(k / (1 + k)))
    elo, lo, hi = elo_interval([0.5] * 4)  # four draws say the score is near 0.5, not exactly 0.5
    assert elo == 0 and lo == pytest.approx(-hi) and hi > 150
    assert elo_interval([1.0] * 10)[1] < elo_interval([1.0] * 40)[1] < elo_interval([1.0] * 40)[0]
    # an even match reads Elo +0, never -0 (the float is -0.0 there)
    elo, lo, hi = elo_interval([1.0] * 98 + [0.5] * 4 + [0.0] * 98)
    line = format_summary({"a": "A", "b": "B", "games": 200, "wins": 98, "draws": 4, "losses": 98, "score": 0.5,
                           "elo": elo, "elo_low": lo, "elo_high": hi, "mean_plies": 11.4, "terminations": {}})
    assert "score 0.500, Elo +0 (95% CI -48 .. +48)" in line
    # one side scored every point: the estimate is no number, so only the interval's finite end is said (the
    # clamped -338 after four losses is no measurement)
    for scores, said in (([0.0] * 4, "Elo -7 or lower (95% CI; every game lost)"),
                         ([1.0] * 4, "Elo +7 or higher (95% CI; every game won)")):
        elo, lo, hi = elo_interval(scores)
        line = format_summary({"a": "A", "b": "B", "games": 4, "wins": 4 * scores[0], "draws": 0,
                               "losses": 4 - 4 * scores[0], "score": scores[0], "elo": elo, "elo_low": lo,
                               "elo_high": hi, "mean_plies": 40.0, "terminations": {"checkmate": 4}})
        assert said in line and "338" not in line


def test_a_short_match_is_not_called_won_on_luck():
    """8 wins in 10 games happen 5.5% of the time between equal sides: not a win beyond the noise (the
    normal approximation on the games' own variance called it one: Elo +27 .. +512). Over matches
    drawn at random, the interval holds the true score about 95% of the time at 10 and 20 games
    (that approximation: 80-89% at 10 games)."""
    elo, lo, hi = elo_interval([1.0] * 8 + [0.0] * 2)
    assert lo < 0 < elo < hi
    rng = random.Random(0)
    for n in (10, 20):
        for win, draw in ((0.5, 0.0), (0.7, 0.1), (0.8, 0.0), (0.85, 0.1)):
            true = win + draw / 2
            held = 0
            for _ in range(2000):
                scores = [1.0 if (u := rng.random()) < win else 0.5 if u < win + draw else 0.0 for _ in range(n)]
                low, high = score_interval(sum(scores) / n, scores.count(0.5) / n, n)
                held += low <= true <= high
            assert held / 2000 >= 0.92, (n, win, draw, held / 2000)


def test_stockfish_beats_a_random_mover_and_pgn_round_trips(tmp_path):
    sf = StockfishPlayer(skill=20, depth=2)
    try:
        res = play_match(sf, RandomPlayer(seed=1), OPENINGS, max_plies=200)
    finally:
        sf.close()
    s = res.summary()
    assert s["games"] == 4 and s["score"] >= 0.75 and s["elo_low"] > 0
    for g in res.games:
        parsed = chess.pgn.read_game(__import__("io").StringIO(g.pgn()))
        assert parsed.headers["Result"] == g.result and parsed.end().board().fen() == g.board.fen()


def test_match_cli_plays_a_tiny_model_against_random(tmp_path, tiny_model_dir, capsys, torch_threads, monkeypatch):
    openings = tmp_path / "openings.txt"
    openings.write_text("# two openings\n" + "\n".join(OPENINGS) + "\n")
    pgn, out = tmp_path / "games.pgn", tmp_path / "match.json"
    assert main(["match", str(tiny_model_dir), "random", "--openings", str(openings), "--games", "4",
                 "--pgn", str(pgn), "--json", str(out), "--quiet", "--max-plies", "20",
                 "--threads", str(torch_threads + 1)]) == 0
    assert torch.get_num_threads() == torch_threads + 1  # --threads: the model played on that many
    summary = json.loads(out.read_text())
    assert summary["games"] == 4 and 0 <= summary["score"] <= 1
    assert sum(summary["terminations"].values()) == 4
    assert pgn.read_text().count("[Event ") == 4
    assert "Elo" in capsys.readouterr().out
    for games, error in (("3", "even number"), ("6", "has 2 openings")):
        assert main(["match", str(tiny_model_dir), "random", "--openings", str(openings), "--games", games]) == 1
        assert error in capsys.readouterr().err
    # a player kind mistyped reads as a Hub id, which does not load (here the Hub is out of reach): the kind it was
    # likely meant to be is named
    from huggingface_hub import constants

    from conftest import UNREACHABLE_HUB

    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE_HUB)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    for typo, meant in (("stokfish:3", "stockfish[:SKILL[:DEPTH]]"), ("randon", "random")):
        assert main(["match", str(tiny_model_dir), typo, "--openings", str(openings), "--games", "2"]) == 1
        err = capsys.readouterr().err
        assert f"error: player '{typo}' did not start: ModelLoadError: " in err and f"(did you mean {meant}?)" in err
    monkeypatch.chdir(tmp_path)  # the default openings are the checkout's data/openings.txt: named with the option
    assert main(["match", str(tiny_model_dir), "random", "--games", "2"]) == 1
    assert capsys.readouterr().err.strip() == f"error: --openings data/openings.txt: no such file in {tmp_path}"
    bad = tmp_path / "bad.txt"
    bad.write_text(START + "\nnot a fen\n")
    with pytest.raises(DataError, match=r"bad\.txt:2: bad FEN"):
        read_openings(bad)
    # a folder, or a file that is not text, is one line naming it (they were an IsADirectoryError's and a
    # UnicodeDecodeError's tracebacks, the second without the file)
    bad.write_bytes(START.encode() + b"\n\xff\xfe\n")
    for given, error in ((tmp_path, f"{tmp_path}: is a directory, not a data file"),
                         (bad, f"{bad}:2: not valid UTF-8 text")):
        assert main(["match", "random", "stockfish", "--openings", str(given), "--games", "2"]) == 1
        assert capsys.readouterr().err.strip() == f"error: --openings {error}"


def test_match_batch_size_decodes_a_plys_moves_in_batches_of_that_size_and_plays_the_same_games(tmp_path,
                                                                                               tiny_model_dir, capsys):
    """--batch-size: a model's moves of one ply decoded that many at once (on a GPU fewer, larger decode steps);
    greedy answers do not depend on it, so the games are the same, move for move."""
    from rookworld_rlvr.model import completions

    openings = tmp_path / "openings.txt"
    openings.write_text("\n".join(OPENINGS) + "\n")
    batches, real_run = [], completions.Completer.run

    def counted(self, prompts, **kw):
        batches.append((self.batch_size, len(prompts)))
        return real_run(self, prompts, **kw)

    pgns = {}
    for size in ("64", "1"):
        pgns[size] = tmp_path / f"games-{size}.pgn"
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(completions.Completer, "run", counted)
            assert main(["match", str(tiny_model_dir), "random", "--openings", str(openings), "--games", "4",
                         "--pgn", str(pgns[size]), "--quiet", "--max-plies", "16", "--legal-moves",
                         "--batch-size", size]) == 0
    assert {b for b, _ in batches} == {64, 1} and any(n > 1 for _, n in batches)  # plies with moves of several games
    assert pgns["1"].read_text() == pgns["64"].read_text() and pgns["1"].read_text().count("[Event ") == 4
    assert main(["match", str(tiny_model_dir), "random", "--openings", str(openings), "--games", "2",
                 "--batch-size", "0"]) == 1 and "--batch-size must be >= 1, got 0" in capsys.readouterr().err


def test_a_match_stopped_part_way_replays_its_kept_moves_and_ends_as_the_straight_match(tmp_path, tiny_model_dir,
                                                                                        batch_fault, capsys):
    """Two greedy models (legal moves only, so the games run to the ply limit), Ctrl-C as the fifth batch of moves
    starts: the four answered are kept beside --json. The same command again computes only the rest and writes
    the straight match's summary and PGN; the kept moves go once it is written."""
    import shutil

    from safetensors.torch import load_file, save_file

    other = tmp_path / "other"  # a second player: the tiny model with one weight a float32 step away
    shutil.copytree(tiny_model_dir, other)
    weights = load_file(other / "model.safetensors")
    name = sorted(weights)[0]
    weights[name].view(-1)[0] = torch.nextafter(weights[name].view(-1)[0], torch.tensor(1.0))
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    openings = tmp_path / "openings.txt"
    openings.write_text("\n".join(OPENINGS) + "\n")

    def match(out, stop_at=None):
        batch_fault.calls, batch_fault.stop_at = 0, stop_at
        rc = main(["match", str(tiny_model_dir), str(other), "--openings", str(openings), "--games", "4",
                   "--legal-moves", "--max-plies", "10", "--pgn", str(out / "games.pgn"), "--json",
                   str(out / "match.json"), "--quiet"])
        return rc, batch_fault.calls

    rc, whole = match(tmp_path / "a")
    # 40 plies: A's first batch is the 2 games it opens with white, then B moves in all 4, A in all 4, ...
    assert rc == 0 and whole == 11
    assert match(tmp_path / "b", stop_at=5) == (130, 5)
    kept = [tmp_path / "b" / f"match.json.{role}-answers.jsonl" for role in "ab"]
    assert [len(p.read_text().splitlines()) for p in kept] == [1 + 2, 1 + 2]
    assert all(f"2 batches of moves are kept in {p}: the same command replays them" in err
               for p, err in zip(kept, [capsys.readouterr().err] * 2))
    assert match(tmp_path / "b") == (0, whole - 4) and not any(p.exists() for p in kept)
    assert capsys.readouterr().err.count("2 batches of moves from an earlier run of this match") == 2
    for file in ("games.pgn", "match.json"):
        assert (tmp_path / "b" / file).read_text() == (tmp_path / "a" / file).read_text()


def test_model_as_uci_engine_driven_by_python_chess(tiny_model_dir):
    """python-chess plays a game against `rookworld uci`: every move it answers is legal (a random
    tiny model writes few legal moves, so the fallbacks are exercised and announced)."""
    engine = chess.engine.SimpleEngine.popen_uci(
        [sys.executable, "-m", "rookworld_rlvr", "uci", "--model", str(tiny_model_dir), "--device", "cpu"],
        timeout=300)  # start-up imports torch and loads the model: slow on a busy machine
    try:
        assert engine.id["name"].startswith("rookworld")
        board = chess.Board()
        for _ in range(6):
            result = engine.play(board, chess.engine.Limit(time=5.0))
            assert result.move in board.legal_moves
            board.push(result.move)
    finally:
        engine.quit()


def test_uci_threads_and_a_bad_thread_count(tiny_model_dir, monkeypatch, capsys, torch_threads):
    """`rookworld uci --threads N` serves on N torch threads; 0 or a word is an error naming the flag."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"uci\nisready\nquit\n")))
    assert main(["uci", "--model", str(tiny_model_dir), "--device", "cpu", "--threads", str(torch_threads + 1)]) == 0
    assert torch.get_num_threads() == torch_threads + 1 and "readyok" in capsys.readouterr().out
    for command in (["uci", "--model", str(tiny_model_dir)], ["match", "random", "stockfish"],
                    ["eval", "--model", str(tiny_model_dir), "--data", "x.jsonl"]):
        for bad, why in (("0", "must be at least 1, got 0"), ("two", "must be an integer, got 'two'")):
            with pytest.raises(SystemExit) as stop:
                main([*command, "--threads", bad])
            assert stop.value.code == 2 and f"argument --threads: {why}" in capsys.readouterr().err


def test_uci_engine_protocol_and_fallback_announcement(tiny_model_dir):
    from rookworld_rlvr.model.load import load_policy

    model, tok = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    out = io.StringIO()
    eng = UCIEngine(ModelPlayer(model, tok, "tiny", max_new_tokens=16), "tiny", out)
    for line in ("uci", "isready", "position startpos moves e2e4 e7e5", "go movetime 100", "position fen "
                 "7k/8/8/8/8/8/8/K7 w - - 0 1", "go", "position nonsense", "frobnicate"):
        try:
            eng.handle(line)
        except ValueError as e:
            eng.send(f"info string error: {e}")
    assert eng.handle("quit") is False
    lines = out.getvalue().splitlines()
    assert lines[:4] == ["id name rookworld tiny", "id author rookworld-rlvr",
                         "option name MultiPV type spin default 1 min 1 max 5", "uciok"] and lines[4] == "readyok"
    moves = [ln.split()[1] for ln in lines if ln.startswith("bestmove")]
    assert len(moves) == 2
    assert chess.Move.from_uci(moves[1]) in chess.Board("7k/8/8/8/8/8/8/K7 w - - 0 1").legal_moves
    assert any("position: expected startpos or fen" in ln for ln in lines)
    assert any("unknown command frobnicate" in ln for ln in lines)


def test_uci_scores_read_the_e_column_mates_included():
    """An E: eval becomes the UCI score a GUI shows: centipawns, and the mate encoding (100000 - n) / 100 as
    `mate n` (negative: the side to move is mated); the eval of a move that mates (1000.0) is mate 1."""
    from rookworld_rlvr.uci import score_words

    assert [score_words(e) for e in (0.32, -2.0, 0.0, 150.0, -899.0)] == ["cp 32", "cp -200", "cp 0", "cp 15000",
                                                                           "cp -89900"]
    assert [score_words(e) for e in (999.99, 999.97, -999.98, 1000.0)] == ["mate 1", "mate 3", "mate -2", "mate 1"]
    for e in (999.99, -999.98, 4.41):  # python-chess reads them as the engine's own convention writes them
        words = score_words(e).split()
        score = chess.engine.Mate(int(words[1])) if words[0] == "mate" else chess.engine.Cp(int(words[1]))
        assert round(score.score(mate_score=100_000) / 100, 2) == e


def test_uci_analysis_shows_the_models_own_evals_of_its_candidates(capsys):
    """With the shipped base: before each bestmove an `info` line gives the move played with the model's E:
    eval of it; with MultiPV 3 the answer's other legal candidates follow, best eval first, each with its own
    eval. python-chess's analyse reads them. Bad or unknown options are named and change nothing."""
    from rookworld_rlvr.model.load import load_policy
    from rookworld_rlvr.uci import serve

    shipped = Path(__file__).resolve().parents[1] / "models" / "rookworld-board"
    model, tok = load_policy(str(shipped), device="cpu", verbose=False)
    player = ModelPlayer(model, tok, "base", batch_size=1)
    fen = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"
    answer = player.answers([chess.Board(fen)])[0]
    evals = dict(zip(answer.moves, answer.evals))
    legal = {m.uci() for m in chess.Board(fen).legal_moves}
    assert answer.best in legal and len([m for m in evals if m in legal]) >= 3  # what the test needs of the base

    # searchmoves: a candidate of the answer other than its B:, and a legal move the answer does not list
    searched = next(m for m in answer.moves if m in legal and m != answer.best)
    unlisted = min(legal - set(answer.moves))
    out = io.StringIO()
    serve(UCIEngine(player, "base", out), [f"position fen {fen}", "go", "setoption name MultiPV value 3", "go",
                                           "setoption name MultiPV value 9", "setoption name Hash value 64",
                                           "setoption name MultiPV value 1", "go movetime 100",
                                           f"go searchmoves {unlisted} {searched} wtime x", "go searchmoves e2e4"])
    lines = out.getvalue().splitlines()
    single = f"info depth 1 score cp {round(evals[answer.best] * 100)} pv {answer.best}"
    assert lines[:2] == [single, f"bestmove {answer.best}"]
    rest = sorted((m for m in evals if m in legal and m != answer.best), key=lambda m: -evals[m])
    assert lines[2:6] == [f"info depth 1 multipv {i} score cp {round(evals[m] * 100)} pv {m}"
                          for i, m in enumerate([answer.best, *rest[:2]], start=1)] + [f"bestmove {answer.best}"]
    assert lines[6:10] == ["info string setoption: MultiPV needs an integer 1-5, got '9'",
                           "info string unknown option 'Hash'", single, f"bestmove {answer.best}"]
    # searchmoves: the move among those given (the answer's M: candidate there); none of them legal: every move
    assert lines[10:14] == [
        "info string go: wtime needs an integer, got 'x'",
        f"info string model move {answer.best} is not among searchmoves; playing {searched} (first searched M: "
        "candidate)", f"info depth 1 score cp {round(evals[searched] * 100)} pv {searched}", f"bestmove {searched}"]
    assert lines[14:] == ["info string go: no legal move among searchmoves e2e4; searching every move", single,
                          f"bestmove {answer.best}"]


def test_uci_protocol_a_bad_position_leaves_none_go_infinite_waits_and_nothing_kills_the_engine(tiny_model_dir):
    """After a position it cannot read, `go` answers 0000 with the reason (never a move for the old board);
    `position startpos e2e4` (no `moves`) is an error; `go infinite` holds its move until `stop`; a bad
    time control is named; a line that is not UTF-8 and an error while answering keep the engine alive."""

    from rookworld_rlvr.model.load import load_policy
    from rookworld_rlvr.uci import serve

    model, tok = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    out = io.StringIO()
    eng = UCIEngine(ModelPlayer(model, tok, "tiny", max_new_tokens=16), "tiny", out)
    script = ["position startpos moves e2e4", "position fen 8/8/8 w - - 0 1", "go",
              "position startpos e2e4", "go wtime 1000 btime abc",
              "position startpos moves e2e4", "go infinite", "isready", "stop",
              "bad \udcff byte", "position startpos moves e2e5", "go",
              "position fen 8/8/8/8/8/8/8/8 w - - 0 1", "go",
              "position fen 4k3/8/8/8/8/8/8/4K3 w KQkq - 0 1", "go", "quit", "isready"]
    serve(eng, script)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("info string error: position: bad FEN '8/8/8 w - - 0 1'")
    assert lines[1] == "info string no position: position: bad FEN '8/8/8 w - - 0 1' (expected 8 rows in position part of fen: '8/8/8')"
    assert lines[2] == "bestmove 0000"
    assert lines[3] == "info string error: position: expected 'moves' before 'e2e4'"
    assert lines[4] == "info string go: btime needs an integer, got 'abc'" and lines[6] == "bestmove 0000"
    held = lines.index("readyok")  # go infinite: nothing until stop
    assert not any(ln.startswith("bestmove") for ln in lines[7:held])
    move = lines[held + 1].split()[1]
    assert chess.Move.from_uci(move) in chess.Board("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1").legal_moves
    assert lines[held + 2] == "info string error: the line is not valid UTF-8; ignored"
    assert lines[held + 3].startswith("info string error: position: 'e2e5' is not a legal move")
    assert lines[held + 4].startswith("info string no position: position: 'e2e5' is not a legal move")
    # a FEN python-chess reads but no game reaches (no king): named, as the FEN it cannot read (it answered 0000
    # without a word)
    assert lines[held + 6] == "info string error: position: bad FEN '8/8/8/8/8/8/8/8 w - - 0 1' (not a legal " \
        "position: no white king, no black king, empty)"
    assert lines[held + 7].startswith("info string no position: position: bad FEN") and lines[held + 8] == \
        "bestmove 0000"
    # castling rights the board cannot have are dropped, as engines drop them: a king move is played
    last = lines[-1].split()
    assert last[0] == "bestmove"
    assert chess.Move.from_uci(last[1]) in chess.Board("4k3/8/8/8/8/8/8/4K3 w - - 0 1").legal_moves
    assert lines.count("readyok") == 1  # nothing after quit is answered

    class Broken:
        def answers(self, boards):
            raise RuntimeError("generation failed")

    out = io.StringIO()
    serve(UCIEngine(Broken(), "broken", out), ["position startpos", "go", "isready"])
    assert out.getvalue().splitlines() == ["info string error: generation failed", "readyok"]


@pytest.mark.slow(seconds=13)
def test_a_full_game_through_python_chess_against_a_real_stockfish(tiny_model_dir, stockfish_path):
    """`rookworld uci` driven by python-chess's UCI client plays a whole game against Stockfish (skill 0):
    every move legal, the game ends by the rules."""
    model = chess.engine.SimpleEngine.popen_uci(
        [sys.executable, "-m", "rookworld_rlvr", "uci", "--model", str(tiny_model_dir), "--device", "cpu"], timeout=300)
    sf = chess.engine.SimpleEngine.popen_uci(stockfish_path, timeout=60)
    try:
        sf.configure({"Skill Level": 0})
        board = chess.Board()
        while not board.is_game_over(claim_draw=True) and board.ply() < 400:
            engine = model if board.turn == chess.WHITE else sf
            move = engine.play(board, chess.engine.Limit(time=2.0, depth=1 if engine is sf else None)).move
            assert move in board.legal_moves
            board.push(move)
        assert board.is_game_over(claim_draw=True), board.fen()
    finally:
        model.quit()
        sf.quit()


@pytest.mark.parametrize("players,options,notes", [
    ("stockfish:0:1 random", "--temperature 0.5 --batch-size 8", ["--temperature: no model plays",
                                                                  "--batch-size: no model plays"]),
    ("random stockfish", "--legal-moves --layout padded", ["--layout: no model plays", "--legal-moves: no model plays"]),
    ("{model} stockfish", "--seed 3", ["--seed: nothing is drawn (no random mover and no sampling model"]),
    ("{model} random", "--engine-timeout 5 --seed 2", ["--engine-timeout: no Stockfish plays"]),
    ("{model} stockfish", "--temperature 0.5 --seed 4 --engine-timeout 5", []),
], ids=["model-settings-without-a-model", "more-model-settings", "seed-without-draws", "engine-timeout-without-engine",
        "all-read"])
def test_a_match_option_that_no_player_reads_is_named_before_the_games(players, options, notes, tmp_path, capsys):
    """`rookworld match` options that tune a kind of player not in the match (a model's sampling where no model plays,
    the engine timeout where no Stockfish does, a seed where nothing is drawn) were taken without a word; now each is
    a warning of a setting without effect, printed before the games (here, before the missing openings stop them)."""
    from rookworld_rlvr.cli import main

    model = str(Path(__file__).resolve().parents[1] / "models" / "rookworld-board")
    argv = ["match", *players.format(model=model).split(), "--games", "2", "--openings", str(tmp_path / "none.txt"),
            *options.split()]
    assert main(argv) == 1
    said = [line.removeprefix("warning: setting without effect: ") for line in capsys.readouterr().err.splitlines()
            if line.startswith("warning: setting without effect: ")]
    assert len(said) == len(notes) and all(s.startswith(n) for s, n in zip(said, notes)), said
