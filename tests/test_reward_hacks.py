"""Adversarial reward suite: the answers a policy could learn instead of chess, each with the rule
its reward must obey. A reward that a degenerate answer can max out trains the degenerate answer.

Rules:
- below truth: scores less than the true answer;
- below honest: scores less than an honest but weak answer to the same prompt (it names legal
  candidates once each, or it moves the piece, even to the wrong square);
- no better than malformed: scores at most what unreadable output scores.

Every rule is checked under each shaping (linear, graduated, binary) with the default weights,
on real positions (the upstream reference sample, random games) with a real Stockfish. A shaped
reward has few values (graduated: 5 levels, binary: 2), so two wrong answers can share a level:
there "below honest" means never above it (strictly below under linear, where nothing is
rounded). "Below truth" is strict under every shaping.
"""

from __future__ import annotations

import random

import chess
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import random_transitions
from rookworld_rlvr.tasks import environment as E
from rookworld_rlvr.tasks import policy as P
from rookworld_rlvr.tasks.rewards import RewardConfig, RewardScorer

SHAPINGS = ("linear", "graduated", "binary")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    from rookworld_rlvr.engine import EngineConfig, StockfishPool

    with StockfishPool(EngineConfig(depth=8, workers=2, cache_path=str(tmp_path_factory.mktemp("c") / "e.sqlite"))) as p:
        yield p


@pytest.fixture(scope="module", params=SHAPINGS)
def scorer(request, pool):
    return RewardScorer(RewardConfig(shaping=request.param), engine=pool)


@pytest.fixture(scope="module")
def positions(reference_lines) -> list[P.PolicyTruth]:
    """Reference positions with five distinct candidates and at least 15 legal moves."""
    truths = [P.parse_line(line) for line in reference_lines]
    return [t for t in truths if len(t.moves) == 5 and chess.Board(t.fen).legal_moves.count() >= 15][:12]


@pytest.fixture(scope="module")
def transitions() -> list[E.EnvTruth]:
    return [t for t in random_transitions(120, seed=11) if not t.truncated and not t.terminated][:12]


def p_answer(moves, evals, best) -> str:
    return f"M: {' '.join(moves)} E: {' '.join(str(float(e)) for e in evals)} B: {best}"


def outside_moves(t: P.PolicyTruth, k: int, seed: int = 0) -> list[str]:
    """k legal moves that are not among the truth's candidates."""
    legal = sorted(m.uci() for m in chess.Board(t.fen).legal_moves if m.uci() not in t.moves)
    return random.Random(seed).sample(legal, k)


def honest_weak(t: P.PolicyTruth) -> str:
    """The best move and four legal moves outside the engine's top 5, each once, with the truth's
    lowest eval written for the unknown ones: weak but honest."""
    best = t.best[0]
    moves = [best] + outside_moves(t, 4)
    evals = [t.evals[t.moves.index(best)]] + [min(t.evals)] * 4
    return p_answer(moves, evals, best)


def total(scorer, prompt, completion, truth) -> float:
    return scorer.score(prompt, completion, truth).total


def below_honest(scorer, hack: float, honest: float) -> bool:
    """Strictly below under linear shaping; never above under the rounded shapings (see top)."""
    return hack < honest if scorer.config.shaping == "linear" else hack <= honest


# -- P: ---------------------------------------------------------------------------------------------


def test_repeated_top_move_scores_below_an_honest_answer(positions, scorer):
    for t in positions:
        best = t.best[0]
        e = t.evals[t.moves.index(best)]
        prompt = P.prompt(t.fen)
        honest = total(scorer, prompt, honest_weak(t), t)
        for hack in (p_answer([best] * 5, [e] * 5, best), p_answer([best] * 5, [e], best),
                     p_answer([best, best, best] + list(t.moves[:2]), [e] * 5, best)):
            assert below_honest(scorer, total(scorer, prompt, hack, t), honest), (t.fen, hack)
            assert total(scorer, prompt, hack, t) < total(scorer, prompt, P.completion(t), t)


def test_truths_candidates_with_a_wrong_best_score_below_the_truth(positions, scorer):
    for t in positions:
        prompt = P.prompt(t.fen)
        worst = min(zip(t.evals, t.moves))[1]
        for best in (worst, outside_moves(t, 1, seed=3)[0]):
            if best in t.best:
                continue
            hack = p_answer(t.moves, t.evals, best)
            assert total(scorer, prompt, hack, t) < total(scorer, prompt, P.completion(t), t), (t.fen, best)


def test_a_losing_best_move_scores_below_an_honest_weak_answer(positions, pool, scorer):
    """Of the moves outside the top 5, the one Stockfish likes least, played as B: in an otherwise
    honest answer, scores below the honest answer that plays the best move."""
    checked = 0
    for t in positions:
        outside = [m for m in (mv.uci() for mv in chess.Board(t.fen).legal_moves) if m not in t.moves]
        evals = pool.move_evals(t.fen, outside)
        worst, worst_eval = min(zip(outside, evals), key=lambda x: x[1])
        if max(t.evals) - worst_eval < 2.0:  # not a losing move here
            continue
        checked += 1
        honest = honest_weak(t)
        losing = honest.rsplit("B:", 1)[0] + f"B: {worst}"
        prompt = P.prompt(t.fen)
        assert below_honest(scorer, total(scorer, prompt, losing, t), total(scorer, prompt, honest, t)), (t.fen, worst)
    assert checked >= 3


def test_empty_sections_score_below_an_honest_answer(positions, scorer):
    """The best move alone, without candidates or evals, is not an honest answer's equal."""
    for t in positions:
        prompt, best = P.prompt(t.fen), t.best[0]
        honest = total(scorer, prompt, honest_weak(t), t)
        for hack in (f"M: E: B: {best}", f"B: {best}", f"M: {best} E: B: {best}", f"M: {best} E: 1.0 B: {best}"):
            assert below_honest(scorer, total(scorer, prompt, hack, t), honest), (t.fen, hack)


def test_duplicated_sections_score_below_the_truth(positions, scorer):
    for t in positions:
        prompt, best, truth = P.prompt(t.fen), t.best[0], P.completion(t)
        evals = " ".join(map(str, t.evals))
        for hack in (truth + f" B: {best}", truth.replace("E:", f"M: {' '.join(t.moves)} E:", 1),
                     f"M: {' '.join(t.moves)} E: {evals} E: {evals} B: {best}"):
            assert total(scorer, prompt, hack, t) < total(scorer, prompt, truth, t), (t.fen, hack)


def test_overlong_and_junk_output_scores_below_the_truth(positions, scorer):
    for t in positions:
        prompt, truth = P.prompt(t.fen), P.completion(t)
        best = total(scorer, prompt, truth, t)
        for hack in (truth + " " + t.best[0] * 20, truth + " B: " + " ".join(t.moves), truth + " ###",
                     truth.replace(" E:", " ### E:"), truth + "\n" + truth):
            assert total(scorer, prompt, hack, t) < best, (t.fen, hack)


def test_junk_without_a_move_is_no_better_than_malformed(positions, scorer):
    t = positions[0]
    prompt = P.prompt(t.fen)
    malformed = total(scorer, prompt, "garbage", t)
    for hack in ("", "M: E: B:", "M: ### E: ### B: ###", "B: zz99", "M: e2e4 E: 0.1 B: e9e9", "~" * 80):
        assert total(scorer, prompt, hack, t) <= malformed, hack


# -- A: ---------------------------------------------------------------------------------------------


def moved_wrong(t: E.EnvTruth) -> str:
    """An honest but wrong answer: the moved piece lands on another square (a different legal move
    of the same piece when there is one, else another legal move); flags as for an ordinary move."""
    board = chess.Board(t.fen)
    frm = t.move[:2]
    others = [m for m in board.legal_moves if m.uci() != t.move]
    same_piece = [m for m in others if m.uci()[:2] == frm]
    board.push((same_piece or others)[0])
    return f"{E.fen_of(board)}+{t.reward}+0+0"


def test_copying_the_input_board_scores_below_moving_the_piece_wrongly(transitions, scorer):
    for t in transitions:
        prompt = E.prompt(t.fen, t.move, t.history)
        honest = total(scorer, prompt, moved_wrong(t), t)
        assert honest > total(scorer, prompt, "garbage", t)
        for hack in (f"{t.fen}+0.001+0+0", f"{t.fen}+{t.reward}+0+0"):
            assert below_honest(scorer, total(scorer, prompt, hack, t), honest), (t.fen, t.move)


def test_a_answers_with_wrong_flags_or_junk_score_below_the_truth(transitions, scorer):
    for t in transitions:
        prompt, truth = E.prompt(t.fen, t.move, t.history), E.completion(t)
        best = total(scorer, prompt, truth, t)
        for hack in (f"{t.new_fen}+1.0+1+0", f"{t.new_fen}+-1.0+0+1", truth + "+0", truth + " ###",
                     f"{t.new_fen}+0.001", truth.replace("+", "++", 1)):
            assert total(scorer, prompt, hack, t) < best, (t.fen, hack)
        malformed = total(scorer, prompt, "garbage", t)
        for junk in ("", "+++", "~" * 40):
            assert total(scorer, prompt, junk, t) <= malformed, junk


# -- every corruption of a true answer scores below it ----------------------------------------------


ALPHABET = "abcdefgh12345678 /+-.PNBRQKpnbrqkw0EMB:"


def corrupt(text: str, edits: list[tuple[int, int, str]]) -> str:
    for kind, pos, ch in edits:
        i = pos % (len(text) + 1)
        if kind == 0:
            text = text[:i] + ch + text[i:]
        elif kind == 1 and text:
            text = text[:i] + text[i + 1:]
        elif text:
            text = text[:i] + ch + text[i + 1:]
    return text


EDITS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10_000), st.sampled_from(ALPHABET)), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 11), EDITS, st.sampled_from(SHAPINGS))
def test_every_corruption_of_a_true_policy_answer_scores_below_it(positions, pool, i, edits, shaping):
    t = positions[i % len(positions)]
    truth = P.completion(t)
    bad = corrupt(truth, edits)
    parsed = P.parse_completion(bad)
    if parsed.valid and _same_policy_answer(parsed, t):
        return  # an edit that only changed spacing, or an eval's spelling ("1.0" -> "1.00"): the same answer
    if shaping == "binary" and parsed.valid and parsed.best in t.best and _complete(parsed.moves or [], t.fen):
        return  # binary scores the decision (a best move, as many distinct legal candidates as allowed), not the rest
    s = RewardScorer(RewardConfig(shaping=shaping), engine=pool)
    assert s.score(P.prompt(t.fen), bad, t).total < s.score(P.prompt(t.fen), truth, t).total, bad


def _complete(moves: list[str], fen: str) -> bool:
    """As many distinct legal candidate moves as the position allows, up to 5 (a well-formed answer)."""
    legal = {m.uci() for m in chess.Board(fen).legal_moves}
    return len(set(moves) & legal) >= min(5, len(legal))


def _same_policy_answer(parsed: P.PolicyParse, t: P.PolicyTruth) -> bool:
    return parsed.moves == list(t.moves) and parsed.evals == list(t.evals) and parsed.best in t.best


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 11), EDITS, st.sampled_from(SHAPINGS))
def test_every_corruption_of_a_true_environment_answer_scores_below_it(transitions, i, edits, shaping):
    t = transitions[i % len(transitions)]
    truth = E.completion(t)
    bad = corrupt(truth, edits)
    p = E.parse_completion(bad)
    if p.valid and (p.new_fen, p.reward, p.terminated, p.truncated) == (t.new_fen, t.reward, t.terminated, t.truncated):
        return  # the same answer written differently (spacing, "0.001" -> "0.0010")
    s = RewardScorer(RewardConfig(shaping=shaping))
    prompt = E.prompt(t.fen, t.move, t.history)
    assert s.score(prompt, bad, t).total < s.score(prompt, truth, t).total, bad
