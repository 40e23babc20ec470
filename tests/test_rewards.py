"""Rewards: the truth scores the maximum, every corruption scores less, nothing raises."""

import json
import random
import statistics

import chess
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import random_transitions
from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.tasks import environment as E
from rookworld_rlvr.tasks import policy as P
from rookworld_rlvr.tasks import rewards
from rookworld_rlvr.tasks.rewards import RewardConfig, RewardScorer, TRLRewardFunction, score


@pytest.fixture(scope="module")
def policy_truths(reference_lines):
    return [P.parse_line(line) for line in reference_lines]


@pytest.fixture(scope="module")
def env_truths():
    return random_transitions(250, seed=3)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    from rookworld_rlvr.engine import EngineConfig, StockfishPool

    with StockfishPool(EngineConfig(depth=8, workers=2, cache_path=str(tmp_path_factory.mktemp("c") / "e.sqlite"))) as p:
        yield p


@pytest.fixture(scope="module")
def scorer(pool):
    """Real Stockfish: a corrupted B: can be a legal move outside the top 5, which needs a search."""
    return RewardScorer(engine=pool)


def test_ground_truth_scores_the_maximum(policy_truths, env_truths, scorer):
    assert len(policy_truths) >= 200 and len(env_truths) >= 200
    kinds = {(t.reward, t.terminated, t.truncated) for t in env_truths}
    assert {(1.0, True, False), (0.5, True, False), (-1.0, False, True), (0.001, False, False)} <= kinds
    for layout in P.LAYOUTS:
        for t in policy_truths:
            r = scorer.score(P.prompt(t.fen, layout), P.completion(t, layout), t)
            assert r.total == 1.0 and r.valid_format and r.correct, r
    for t in env_truths:
        r = scorer.score(E.prompt(t.fen, t.move, t.history), E.completion(t), t)
        assert r.total == 1.0 and r.correct, r


def test_truth_from_python_chess_when_the_sample_has_none(env_truths, scorer):
    for t in env_truths[:50]:
        assert scorer.score(E.prompt(t.fen, t.move, t.history), E.completion(t)).total == 1.0


def test_malformed_gets_the_mild_penalty(policy_truths, env_truths):
    t = policy_truths[0]
    for shaping in ("linear", "graduated", "binary"):
        s = RewardScorer(RewardConfig(shaping=shaping))
        assert s.score(P.prompt(t.fen), "garbage", t).total == -0.3
        a = env_truths[0]
        assert s.score(E.prompt(a.fen, a.move, a.history), "garbage", a).total == -0.3
    assert RewardScorer(RewardConfig(malformed_penalty=-0.1)).score(P.prompt(t.fen), "", t).total == -0.1


def test_policy_reward_is_graduated_by_move_quality(policy_truths, scorer):
    t = next(t for t in policy_truths if len(t.moves) == 5 and len(set(t.evals)) == 5)
    ranked = [m for _, m in sorted(zip(t.evals, t.moves), reverse=True)]
    totals = []
    for move in ranked:
        comp = P.completion(P.PolicyTruth(t.fen, t.moves, t.evals, (move,), move))
        totals.append(scorer.score(P.prompt(t.fen), comp, t).total)
    assert totals == sorted(totals, reverse=True) and totals[0] == 1.0 and totals[-1] < totals[0]
    illegal = P.completion(t).rsplit("B:", 1)[0] + "B: a1a1"
    assert scorer.score(P.prompt(t.fen), illegal, t).total < min(totals)


def test_shapings(policy_truths):
    t = policy_truths[0]
    comp = P.completion(t).replace(P.format_eval(t.evals[0]), "9.5", 1)  # one eval wrong, the rest right
    lin = RewardScorer(RewardConfig(shaping="linear")).score(P.prompt(t.fen), comp, t).total
    grad = RewardScorer(RewardConfig(shaping="graduated")).score(P.prompt(t.fen), comp, t).total
    binary = RewardScorer(RewardConfig(shaping="binary")).score(P.prompt(t.fen), comp, t).total
    assert 0.8 < lin < 1 and grad == 0.8 and binary == 1.0  # graduated keeps 1.0 for an answer right everywhere
    malformed_best = "M: " + " ".join(t.moves[:4]) + " E: 1.0 B: " + t.best_move  # the best move, ill-formed
    assert RewardScorer(RewardConfig(shaping="binary")).score(P.prompt(t.fen), malformed_best, t).total == 0.0
    for q, level in ((0.05, 0.2), (0.21, 0.4), (0.59, 0.6), (0.61, 0.8), (0.999, 0.8)):
        assert rewards._shape(q, "graduated", False, True) == level
    assert rewards._shape(1.0, "graduated", True, True) == 1.0


def test_weights_change_the_total(policy_truths):
    t = policy_truths[1]
    comp = P.completion(t).split("E:")[0] + "E: 0.0 B: " + t.best_move  # eval section wrong
    only_best = RewardScorer(RewardConfig(policy_weights={"format": 0, "best_legal": 1, "quality": 0,
                                                          "candidates": 0, "evals": 0}))
    assert only_best.score(P.prompt(t.fen), comp, t).total == 1.0
    assert RewardScorer().score(P.prompt(t.fen), comp, t).total < 1.0
    with pytest.raises(ValueError, match="unknown component"):
        RewardConfig(policy_weights={"nope": 1.0}).validate()


def test_next_state_partial_sets_the_credit_of_a_near_miss_fen(env_truths):
    """A readable FEN with one field wrong earns at most `next_state_partial` of the next-state credit."""
    t = next(t for t in env_truths if not t.terminated)
    fields = t.new_fen.split(" ")
    fields[1] = "b" if fields[1] == "w" else "w"  # side to move wrong, board right: a near miss
    near = E.completion(t).replace(t.new_fen, " ".join(fields), 1)
    prompt = E.prompt(t.fen, t.move, t.history)
    default = RewardScorer(TrainConfig().reward_config()).score(prompt, near, t)
    strict = RewardScorer(TrainConfig(next_state_partial=0.0).reward_config()).score(prompt, near, t)
    changed = sum(a != b for a, b in zip(E._elements(t.fen), E._elements(t.new_fen)))  # squares and fields
    # every changed element right but the side to move: most of the credit
    assert default.components["next_state"] == pytest.approx(0.8 * (changed - 1) / changed)
    assert strict.components["next_state"] == 0.0 and strict.total < default.total
    assert {k: v for k, v in strict.components.items() if k != "next_state"} == \
        {k: v for k, v in default.components.items() if k != "next_state"}
    exact = RewardScorer(TrainConfig(next_state_partial=0.0).reward_config()).score(prompt, E.completion(t), t)
    assert exact.total == 1.0
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="next_state_partial"):
            TrainConfig(next_state_partial=bad).validate()


def _corrupt(text: str, rng: random.Random) -> str:
    ops = [
        lambda s: s[:-1],
        lambda s: s[: rng.randrange(len(s))],
        lambda s: s.replace(" ", "", 1),
        lambda s: "".join(rng.sample(s, len(s))),
    ]
    i = rng.randrange(len(text))
    ops += [
        lambda s: s[:i] + rng.choice("abcdefgh12345678+-.0 ") + s[i + 1:],
        lambda s: s[:i] + s[i + 1:],
        lambda s: s[:i] + rng.choice("qkbnrp0123456789") + s[i:],
    ]
    return rng.choice(ops)(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6))
def test_corruptions_score_lower_on_average_and_never_raise(seed, policy_truths, env_truths, scorer):
    rng = random.Random(seed)
    t = rng.choice(policy_truths)
    a = rng.choice(env_truths)
    p_scores, a_scores = [], []
    for _ in range(8):
        bad = _corrupt(P.completion(t), rng)
        if bad.split() != P.completion(t).split():
            p_scores.append(scorer.score(P.prompt(t.fen), bad, t).total)
        bad = _corrupt(E.completion(a), rng)
        if bad != E.completion(a):
            a_scores.append(scorer.score(E.prompt(a.fen, a.move, a.history), bad, a).total)
    for s in p_scores + a_scores:
        assert -0.3 <= s <= 1.0
    if p_scores:
        assert statistics.mean(p_scores) < 1.0
    if a_scores:
        assert statistics.mean(a_scores) < 1.0


def test_ten_thousand_fuzzed_strings_raise_nothing(policy_truths, env_truths, scorer):
    rng = random.Random(0)
    alphabet = "PMEBA:+-. 0123456789abcdefghkqrnpKQRBNP/w\n\t" + "".join(chr(c) for c in range(33, 127))
    t, a = policy_truths[5], env_truths[5]
    pieces = [P.completion(t), E.completion(a), "M:", "E:", "B:", "+", "999.99", "-1.0", "e2e4", "a7a8q"]
    for i in range(10_000):
        if i % 2:
            s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 120)))
        else:
            s = " ".join(rng.choice(pieces) for _ in range(rng.randrange(0, 6)))
        r1 = scorer.score(P.prompt(t.fen), s, t)
        r2 = scorer.score(E.prompt(a.fen, a.move, a.history), s, a)
        assert -1.0 <= r1.total <= 1.0 and -1.0 <= r2.total <= 1.0


def test_trl_adapter_takes_truth_from_dataset_columns(policy_truths, env_truths):
    fn = TRLRewardFunction()
    assert fn.__name__ == "rookworld_reward"
    t, a = policy_truths[0], env_truths[0]
    prompts = [P.prompt(t.fen), E.prompt(a.fen, a.move, a.history)]
    completions = [P.completion(t), "nonsense"]
    truths = [json.dumps(t.to_dict()), a.to_dict()]
    assert fn(prompts=prompts, completions=completions, truth=truths) == [1.0, -0.3]
    chat = [[{"role": "assistant", "content": P.completion(t)}], [{"role": "assistant", "content": E.completion(a)}]]
    assert fn(prompts, chat, truth=truths) == [1.0, 1.0]


def test_module_level_score_entry_point(env_truths):
    a = env_truths[0]
    r = score(E.prompt(a.fen, a.move, a.history), E.completion(a), a.to_dict())
    assert r.total == 1.0 and set(r.components) == {"format", "next_state", "reward", "terminated", "truncated"}


def test_a_batch_whose_lists_differ_in_length_is_refused_not_scored_short(env_truths):
    """One prompt, completion and truth a row: a list shorter than the others would leave rows unscored."""
    prompts = [E.prompt(a.fen, a.move, a.history) for a in env_truths[:2]]
    completions = [E.completion(a) for a in env_truths[:2]]
    assert [r.total for r in RewardScorer().score_batch(prompts, completions)] == [1.0, 1.0]
    with pytest.raises(ValueError, match="2 prompts, 1 completions and 2 truths: one of each per row"):
        RewardScorer().score_batch(prompts, completions[:1])
    with pytest.raises(ValueError, match="2 prompts, 2 completions and 1 truths"):
        RewardScorer().score_batch(prompts, completions, [env_truths[0].to_dict()])


def test_policy_without_truth_and_without_engine_is_a_clear_error(policy_truths):
    with pytest.raises(RuntimeError, match="no Stockfish pool"):
        RewardScorer().score(P.prompt(policy_truths[0].fen), P.completion(policy_truths[0]))


def test_engine_scores_moves_outside_the_top_five_and_missing_truth(pool):
    fen = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    s = RewardScorer(engine=pool)
    truth = s.truth_for(P.prompt(fen))
    assert len(truth.moves) == 5 and truth.best
    good = s.score(P.prompt(fen), P.completion(truth)).total
    assert good == 1.0
    weak = P.completion(truth).rsplit("B:", 1)[0] + "B: g1h3"  # legal, outside the top 5
    assert "g1h3" not in truth.moves
    r = s.score(P.prompt(fen), weak)
    assert 0 < r.components["quality"] < 1 and r.total < good
    blunder = "M: f2f3 E: 0.0 B: f2f3"
    batch = s.score_batch([P.prompt(fen)] * 3, [P.completion(truth), weak, blunder])
    assert [b.total for b in batch][0] == 1.0 and batch[1].total == r.total and batch[2].total < batch[1].total


def test_a_batch_searches_the_moves_outside_the_candidates_of_all_its_positions_in_one_pool_call(policy_truths,
                                                                                                 tmp_path):
    """Each position's outside moves used to be searched one position after another; now one
    `move_evals_many` call hands them all to the pool, and the scores equal one-by-one scoring."""
    from rookworld_rlvr.engine import EngineConfig, StockfishPool

    truths = [t for t in policy_truths if len(t.moves) == 5][:4]
    prompts, completions = [], []
    for t in truths:
        for move in sorted(m.uci() for m in chess.Board(t.fen).legal_moves if m.uci() not in t.moves)[:2]:
            prompts.append(P.prompt(t.fen))
            completions.append(P.completion(t).rsplit("B:", 1)[0] + f"B: {move}")
    with StockfishPool(EngineConfig(depth=6, workers=2)) as pool:
        calls = []
        real = pool.move_evals_many
        pool.move_evals_many = lambda pairs: calls.append(len(pairs)) or real(pairs)
        batch = RewardScorer(engine=pool).score_batch(prompts, completions, [t.to_dict() for t in truths
                                                                             for _ in range(2)])
        misses = pool.stats["misses"]
    assert calls[0] == len(prompts) and misses == len(prompts)  # all searched in the first call; then cache hits
    with StockfishPool(EngineConfig(depth=6, workers=1)) as alone:
        one = [RewardScorer(engine=alone).score(p, c, t.to_dict()) for p, c, t in
               zip(prompts, completions, [t for t in truths for _ in range(2)])]
    assert [b.total for b in batch] == [r.total for r in one]
    assert len({b.components["quality"] for b in batch}) > 2  # the searched evals differ from move to move


def test_change_credit_counts_only_what_the_move_changed():
    fen = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    t = E.transition(fen, "g1f3")
    assert E.change_credit(fen, t.new_fen, t.new_fen) == 1.0
    assert E.change_credit(fen, t.new_fen, fen) == 0.0  # the input board: nothing the move changed
    wrong_square = E.transition(fen, "g1h3").new_fen  # the right piece, the wrong square
    # changed: g1, f3, side to move, halfmove clock; the answer gets g1, the side and the clock
    # right, f3 wrong, and spoils h3: (3 - 1) / 4
    assert E.change_credit(fen, t.new_fen, wrong_square) == pytest.approx(0.5)
    assert E.change_credit(fen, t.new_fen, "garbage") == 0.0
    illegal = E.transition(fen, "e2e5")  # nothing changes: only the exact answer counts
    assert E.change_credit(fen, illegal.new_fen, E.transition(fen, "e2e4").new_fen) == 0.0


def test_quality_is_the_expected_score_against_the_best_and_a_mate_is_full_credit(pool):
    from rookworld_rlvr.tasks.strength import move_loss

    fen = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"  # a1a8 mates; Stockfish's top 5 holds it
    s = RewardScorer(engine=pool)
    truth = s.truth_for(P.prompt(fen))
    assert truth.best == ("a1a8",)
    mate = s.score(P.prompt(fen), P.completion(truth), truth)
    assert mate.components["quality"] == 1.0 and mate.correct
    quiet = "h2h3"
    r = s.score(P.prompt(fen), P.completion(truth).rsplit("B:", 1)[0] + f"B: {quiet}", truth)
    value = truth.evals[truth.moves.index(quiet)] if quiet in truth.moves else pool.move_eval(fen, quiet)
    expected = max(0.0, 1 - move_loss(max(truth.evals), value) / RewardConfig().quality_scale)
    assert r.components["quality"] == pytest.approx(min(expected, 0.99)) and not r.correct


def test_scoring_with_a_truth_needs_no_stockfish(policy_truths):
    """A legal B: outside the truth's candidates is bounded by the lowest candidate, not an error;
    the TRL adapter and score() run without an engine when the samples carry their truth."""
    t = next(t for t in policy_truths if len(t.moves) == 5)
    outside = sorted(m.uci() for m in chess.Board(t.fen).legal_moves if m.uci() not in t.moves)[0]
    comp = P.completion(t).rsplit("B:", 1)[0] + f"B: {outside}"
    r = score(P.prompt(t.fen), comp, t.to_dict())
    top, low = max(t.evals), min(t.evals)
    from rookworld_rlvr.tasks.strength import move_loss

    assert r.components["quality"] == pytest.approx(max(0.0, min(0.99, 1 - move_loss(top, low) / 0.3)))
    assert any("bounded" in n for n in r.notes)
    fn = TRLRewardFunction()
    assert fn([P.prompt(t.fen)], [comp], truth=[t.to_dict()]) == [r.total]
    with pytest.raises(ValueError, match="no 'truth' column"):
        fn([P.prompt(t.fen)], [comp])


def test_trl_adapter_without_truths_needs_stockfish_at_construction(monkeypatch):
    from rookworld_rlvr.engine import EngineConfig, StockfishNotFound, StockfishPool

    monkeypatch.setenv("STOCKFISH_PATH", "/nonexistent/stockfish")
    with pytest.raises(StockfishNotFound, match="apt-get install stockfish"):
        TRLRewardFunction(engine=StockfishPool(EngineConfig()))


def test_puzzle_truth_gives_a_verified_binary_reward():
    from rookworld_rlvr.tasks.strength import Puzzle

    fen = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"
    puzzle = Puzzle(fen, ("a1a8",), "mate1")
    s = RewardScorer()
    solved = "M: a1a8 h2h3 g2g3 f2f3 g1f1 E: 999.99 0.0 0.0 0.0 0.0 B: a1a8"
    assert s.score(P.prompt(fen), solved, puzzle).total == 1.0
    assert s.score(P.prompt(fen), solved.replace("B: a1a8", "B: h2h3"), puzzle).total == 0.0
    assert s.score(P.prompt(fen), "M: a1a8 E: B: a1a8", puzzle).total == 0.0  # solved, ill-formed
    assert s.score(P.prompt(fen), "nonsense", puzzle).total == -0.3
    assert s.score(P.prompt(fen), solved, puzzle.to_dict()).total == 1.0  # as a dataset column
