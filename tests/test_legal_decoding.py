"""Legal-move decoding: the grammar of an allowed `P:` answer, and real models (a random tiny one
with two tokenizers, the shipped base) whose constrained answers are legal where unconstrained
ones are not; `rookworld eval`, `match` and `uci` with `--legal-moves`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import chess
import pytest
import torch

from rookworld_rlvr.chess_tokenizers import build_chess_tokenizer, build_square_tokenizer
from rookworld_rlvr.cli import main
from rookworld_rlvr.legal_decoding import LegalMoveDecoding, continuations, eval_section, evals_ok, fen_of_prompt
from rookworld_rlvr.model.completions import Completer, sampling
from rookworld_rlvr.tasks import policy as pol
from rookworld_rlvr.tasks.strength import legal_moves

pytestmark = pytest.mark.usefixtures("one_thread")

SHIPPED = Path(__file__).resolve().parents[1] / "models" / "rookworld-board"
START = chess.STARTING_FEN
PROMOTE = "8/P6k/8/8/8/8/8/K7 w - - 0 1"  # a7a8q/r/b/n plus king moves
FENS = [START, PROMOTE, "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"]


def test_grammar_of_an_allowed_answer():
    legal = legal_moves(START)
    assert continuations("", legal) == ({"M: "}, False)
    assert continuations("M", legal) == ({": "}, False)
    assert continuations("X", legal) is None  # left the format before the constraint could act
    rest, end = continuations("M: e2", legal)
    assert rest == {"e3 ", "e4 "} and not end
    rest, _ = continuations("M: e2e4 ", legal)
    assert "e2e4 " not in rest and "d2d4 " in rest  # a written move cannot come again
    assert continuations("M: e2e4 d2d4 g1f3 c2c4 b1c3 ", legal) == ({"E:"}, False)  # five: then E:
    assert continuations("M: e2e4 d2d4 g1f3 c2c4 b1c3 ", legal, padded=True) == ({"E:", " "}, False)
    assert continuations("M: e2e4 d2d4 g1f3 c2c4 b1c3" + " " * 8, legal, padded=True) == ({"E:"}, False)
    assert continuations("M: e2e4 d2d4 g1f3 c2c4 b1c3 E", legal) == ({":"}, False)
    assert continuations("M: e2e4 E: 0.3", legal) is None  # evals: their own grammar, values the model's
    assert eval_section("M: e2e4 d2d4 E: 0.3") == (" 0.3", 2) and eval_section("M: e2e4 E: 1.0 B:") is None
    for body, n, ok in ((" 0.3 -1.14 ", 2, True), (" 0.3 -1.14 B", 2, True), (" 0.3 B", 2, False),
                        (" 0.3 -1.14 0.2", 2, False), (" -", 1, True), (" 12.", 1, True), (" 1.234", 1, False),
                        (" 1234", 1, False), (" 0.3  0.1", 2, False), ("0.3", 1, False), (" 0.3 x", 2, False),
                        (" 0.3  ", 1, False)):
        assert evals_ok(body, n) is ok, (body, n)
    assert evals_ok(" 0.3" + " " * 20 + "B", 1, padded=True) and not evals_ok(" 0.3" + " " * 40, 1, padded=True)
    assert continuations("M: e2e4 E: 0.3 B:", legal) == ({" "}, False)
    rest, end = continuations("M: e2e4 E: 0.3 B: g1", legal)
    assert rest == {"f3", "h3"} and not end
    assert continuations("M: e2e4 E: 0.3 B: g1f3", legal) == (set(), True)  # a legal move: the answer ends
    promo = legal_moves(PROMOTE)
    rest, end = continuations("M: e1 E: 1 B: a7a8", promo)
    assert rest == {"q", "r", "b", "n"} and not end  # a7a8 alone is not a move
    few = legal_moves("7k/8/8/8/8/8/8/K6R b - - 0 1")  # in check: h8g8 and h8g7 only
    assert few == {"h8g8", "h8g7"}
    assert continuations("M: " + " ".join(sorted(few)) + " ", few)[0] == {"E:"}
    assert fen_of_prompt(pol.prompt(START)) == START == fen_of_prompt(pol.prompt(START, "padded"))
    assert fen_of_prompt("A: " + START) is None and fen_of_prompt("P: not a fen ") is None


@pytest.mark.parametrize("build", [build_chess_tokenizer, build_square_tokenizer])
def test_random_tiny_model_lists_distinct_legal_moves(build):
    """An untrained model: without the constraint its M: is noise; with it, M: holds min(5, legal)
    distinct legal moves, one eval each and a legal B:, greedy and sampled."""
    from transformers import GPT2LMHeadModel

    from rookworld_rlvr.model import tiny_config

    tok = build()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(tiny_config(len(tok), n_positions=256)).eval()
    prompts = [pol.prompt(f) for f in FENS]
    plain, _ = Completer(model, tok, 120).run(prompts)
    assert not any(t.startswith("M: ") for t in plain)
    gen = Completer(model, tok, 120, constraint=LegalMoveDecoding(tok))
    for settings, layout in (({"greedy": True}, "compact"), (sampling(1.0, seed=3), "compact"),
                             ({"greedy": True}, "padded")):
        texts, _ = gen.run([pol.prompt(f, layout) for f in FENS], **settings)
        for fen, text in zip(FENS, texts, strict=True):
            legal = legal_moves(fen)
            assert text.startswith("M: ") and " E:" in text, text
            moves = text[3:text.index(" E:")].split()
            assert len(moves) == len(set(moves)) == min(5, len(legal)) and set(moves) <= legal, text
            parse = pol.parse_completion(text)
            assert parse.valid and parse.move in legal, (text, parse.errors)


def test_shipped_base_answers_legally_only_with_the_constraint():
    from rookworld_rlvr.model.load import load_policy

    model, tok = load_policy(str(SHIPPED), device="cpu", verbose=False)
    from rookworld_rlvr.data.judged import read_judged

    fens = [p.fen for p in read_judged(SHIPPED.parents[1] / "data" / "strength.jsonl.gz")[:24]]
    prompts = [pol.prompt(f) for f in fens]
    plain = [pol.parse_completion(t) for t in Completer(model, tok, 120).run(prompts)[0]]
    legal_sets = [legal_moves(f) for f in fens]
    assert sum(p.move in lg for p, lg in zip(plain, legal_sets, strict=True)) < len(fens)  # it does write illegal moves
    assert sum(len(set(p.moves or [])) < len(p.moves or []) for p in plain) > len(fens) // 2  # and repeats
    constrained = Completer(model, tok, 120, constraint=LegalMoveDecoding(tok)).run(prompts)[0]
    for text, legal in zip(constrained, legal_sets, strict=True):
        parse = pol.parse_completion(text)
        assert parse.valid, (text, parse.errors)
        assert parse.move in legal and len(set(parse.moves)) == min(5, len(legal)) and set(parse.moves) <= legal


def test_eval_match_and_uci_with_legal_moves(tmp_path, tiny_model_dir, capsys):
    from rookworld_rlvr.model.load import load_policy
    from rookworld_rlvr.play import ModelPlayer
    from rookworld_rlvr.uci import UCIEngine

    import gzip

    data, judged, out = tmp_path / "data.jsonl", tmp_path / "judged.jsonl", tmp_path / "eval.json"
    data.write_text("")
    with gzip.open(SHIPPED.parents[1] / "data" / "strength.jsonl.gz", "rt") as f:
        judged.write_text("".join(f.readline() for _ in range(12)))  # 12 of the shipped judged positions
    args = ["eval", "--model", str(tiny_model_dir), "--data", str(data), "--strength", str(judged),
            "--quiet", "--json", str(out), "--max-new-tokens", "80"]
    assert main(args) == 0
    assert json.loads(out.read_text())["strength"]["legal"] == 0  # a random model, unconstrained
    assert main(args + ["--legal-moves"]) == 0
    res = json.loads(out.read_text())
    assert res["strength"]["legal"] == 1.0 and res["meta"]["config"]["legal_moves"] is True
    capsys.readouterr()

    openings = tmp_path / "openings.txt"
    openings.write_text(START + "\n")
    summary = tmp_path / "match.json"
    assert main(["match", str(tiny_model_dir), "random", "--openings", str(openings), "--games", "2", "--quiet",
                 "--max-plies", "12", "--legal-moves", "--json", str(summary)]) == 0
    ends = json.loads(summary.read_text())["terminations"]
    assert "illegal_move" not in ends and "no_move" not in ends, ends

    model, tok = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    sink = io.StringIO()
    eng = UCIEngine(ModelPlayer(model, tok, "tiny", max_new_tokens=80, legal_moves=True), "tiny", sink)
    for line in ("position startpos moves e2e4", "go", "position fen " + PROMOTE, "go"):
        eng.handle(line)
    lines = sink.getvalue().splitlines()
    assert not any("is not legal" in ln for ln in lines), lines  # the model's own move, no fallback
    assert len([ln for ln in lines if ln.startswith("bestmove")]) == 2
