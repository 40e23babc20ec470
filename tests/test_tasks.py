"""The two task formats: byte-exact rendering, tolerant parsing, python-chess truth."""

import chess
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import random_transitions
from rookworld_rlvr.tasks import environment as E
from rookworld_rlvr.tasks import policy as P
from rookworld_rlvr.tasks.policy import FormatError


def test_every_reference_line_parses_and_label_quirk_is_counted(reference_lines):
    truths = [P.parse_line(line) for line in reference_lines]
    assert len(truths) == 500
    not_best = [t for t in truths if t.label not in t.best]
    assert len(not_best) == 223
    assert sum(t.fen.split()[1] == "b" for t in not_best) == 220
    for t in truths:  # ground truth = the highest eval for the side to move
        top = max(t.evals)
        assert all(t.evals[t.moves.index(b)] == top for b in t.best)


def test_padded_layout_matches_upstream_columns(reference_lines):
    t = P.parse_line(reference_lines[0])
    line = P.render(t, "padded")
    assert line.index("M:") == 93 and line.index("E:") == 126 and line.index("B:") == 169
    assert not line.endswith(" ")
    # the reference file has an 89-wide FEN column (old artifact): same text once the FEN is re-padded
    ref = reference_lines[0]
    fen = ref[3:92].rstrip()
    assert P.render(P.PolicyTruth(fen, t.moves, t.evals, t.best, t.label), "padded")[93:].split() == ref[92:].split()[:-1] + [t.best_move]


def test_upstream_lines_rerender_byte_identical_when_label_is_kept(reference_lines):
    for line in reference_lines:
        t = P.parse_line(line)
        if t.label in t.best:
            rendered = P.render(t, "padded")
            assert rendered[:3] + rendered[3:93].rstrip() == line[:3] + line[3:92].rstrip()
            assert rendered[93:] == line[92:]  # everything after the FEN column is byte-identical


def test_eval_formatting_is_python_str_float():
    assert [P.format_eval(x) for x in (-2, 0, 4.41, 999.99)] == ["-2.0", "0.0", "4.41", "999.99"]


def test_compact_round_trip(reference_lines):
    for line in reference_lines[:50]:
        t = P.parse_line(line)
        again = P.parse_line(P.render(t, "compact"))
        assert (again.fen, again.moves, again.evals, again.best) == (t.fen, t.moves, t.evals, t.best)


@pytest.mark.parametrize("text,error", [
    ("E: 1.0 B: e2e4", "missing M:"),
    ("M: e2e4 B: e2e4", "missing E:"),
    ("M: e2e4 E: 0.3", "missing B:"),
    ("M: e2e4 zz99 E: 0.3 0.1 B: e2e4", "bad UCI"),
    ("M: e2e4 d2d4 E: 0.3 B: e2e4", "eval count mismatch"),
    ("M: e2e4 E: abc B: e2e4", "bad eval"),
    ("M: e2e4 E: 0.3 B:", "B: needs exactly one move"),
])
def test_policy_parse_reports_what_is_wrong(text, error):
    parsed = P.parse_completion(text)
    assert not parsed.valid
    assert any(error in e for e in parsed.errors), parsed.errors


def test_policy_parse_is_whitespace_insensitive():
    a = P.parse_completion("M: e2e4 d2d4   E: 0.3 0.2 B: e2e4")
    b = P.parse_completion("M:   e2e4    d2d4" + " " * 20 + "E:\t0.3 0.2" + " " * 30 + "B: e2e4")
    assert a.valid and b.valid and (a.moves, a.evals, a.best) == (b.moves, b.evals, b.best)


def test_parse_line_errors_name_the_problem():
    with pytest.raises(FormatError, match="bad FEN"):
        P.parse_line("P: notafen w - - 0 1 M: e2e4 E: 0.1 B: e2e4")
    with pytest.raises(FormatError, match="illegal move"):
        P.parse_line("P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 M: e2e5 E: 0.1 B: e2e5")


START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"


def test_environment_conventions():
    t = E.transition(START, "e2e4")
    assert E.render(t) == ("A: " + START + "+e2e4+e2e4+"
                           "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1+0.001+0+0")
    assert E.render(t, prefix=False) == E.render(t)[3:]
    mate = E.transition("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", "a1a8")
    assert (mate.reward, mate.terminated, mate.truncated) == (1.0, True, False)
    stale = E.transition("7k/8/6Q1/8/8/8/8/7K w - - 0 1", "g6f7")
    assert (stale.reward, stale.terminated) == (0.5, True)
    draw = E.transition("8/8/8/4k3/8/8/3nK3/8 w - - 0 1", "e2d2")
    assert (draw.reward, draw.terminated) == (0.5, True)
    bad = E.transition(START, "e2e5", ["g1f3"])
    assert (bad.new_fen, bad.reward, bad.terminated, bad.truncated) == (START, -1.0, False, True)
    assert E.render(bad).endswith("+-1.0+0+1")


def test_history_keeps_last_ten_including_current():
    prev = [f"m{i}" for i in range(15)]
    t = E.transition(START, "e2e4", prev)
    assert t.history.split() == prev[-9:] + ["e2e4"]


def test_environment_parse_and_line_check():
    for t in random_transitions(200, seed=1):
        line = E.render(t)
        assert E.parse_line(line) == t
        assert E.parse_line(line[3:]) == t  # upstream rows have no prefix
        parsed = E.parse_completion(E.completion(t))
        assert parsed.valid and parsed.new_fen == t.new_fen
    with pytest.raises(FormatError, match="disagrees with python-chess in new_fen"):
        E.parse_line(E.render(E.transition(START, "e2e4")).replace("4P3", "3P4"))


@pytest.mark.parametrize("text,error", [
    ("", "missing new FEN"),
    ("8/8/8/8/8/8/8/8 w - - 0 1+0.001+0", "expected 4"),
    (START + "+abc+0+0", "bad reward"),
    (START + "+0.001+2+0", "bad terminated"),
    ("xyz+0.001+0+0", "not a valid position"),
])
def test_environment_parse_reports_what_is_wrong(text, error):
    parsed = E.parse_completion(text)
    assert any(error in e for e in parsed.errors), parsed.errors


def test_fen_similarity_is_normalized_levenshtein():
    assert E.levenshtein("kitten", "sitting") == 3
    assert E.fen_similarity("abc", "abc") == 1.0
    assert E.fen_similarity("abcd", "abce") == pytest.approx(0.75)


def _edit_distance(a: str, b: str) -> int:
    """The textbook full-table recursion, nothing cut: what levenshtein must equal."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[-1][-1]


@given(st.text("ab/1", max_size=12), st.text("ab/1", max_size=12))
def test_levenshtein_cuts_a_shared_prefix_and_suffix_and_still_gives_the_edit_distance(a, b):
    """A two-letter alphabet makes a prefix and a suffix that overlap ("aba" / "aa") common."""
    assert E.levenshtein(a, b) == E.levenshtein(b, a) == _edit_distance(a, b)


def test_levenshtein_of_a_fen_and_the_fen_after_a_move():
    before, after = START, E.transition(START, "e2e4").new_fen
    assert E.levenshtein(before, after) == _edit_distance(before, after) == 7
    assert E.levenshtein("aa", "a") == E.levenshtein("", "abc") - 2 == 1


def test_en_passant_square_written_after_every_double_push():
    t = E.transition(START, "a2a4")  # no black pawn can capture: python-chess's default would omit it
    assert t.new_fen.split()[3] == "a3"
    assert chess.Board(t.new_fen).fen() != t.new_fen  # legal-only convention differs: we keep the standard one
