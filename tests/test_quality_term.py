"""The legal-conditional quality advantage: hand values, its exact expected gradient, and the
measured problem it answers (a real scorer's rewards on a real position)."""

from __future__ import annotations

import itertools

import pytest
import torch

from rookworld_rlvr.grpo.loss import group_advantages
from rookworld_rlvr.grpo.quality_term import legal_quality_advantages
from rookworld_rlvr.tasks.policy import PolicyTruth, completion, prompt
from rookworld_rlvr.tasks.rewards import RewardScorer


def test_quality_is_centred_on_the_legal_samples_of_each_group():
    q = torch.tensor([0.2, 0.8, 0.0, 0.5, 0.9, 0.0, 0.3, 0.0])
    legal = torch.tensor([True, True, False, True, True, False, False, False])
    got = legal_quality_advantages(q, legal, 4)
    # group 1: legal 0.2, 0.8, 0.5 (mean 0.5); group 2: one legal sample, nothing to compare it with
    assert torch.allclose(got, torch.tensor([-0.3, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]))
    assert torch.equal(legal_quality_advantages(q, torch.zeros(8, dtype=torch.bool), 4), torch.zeros(8))
    with pytest.raises(ValueError, match="groups of 3"):
        legal_quality_advantages(q, legal, 3)


def test_its_expected_gradient_is_that_of_the_quality_among_legal_moves():
    """Exact, by enumerating every group of 3 from a 4-outcome policy (one outcome illegal): the
    term's expected policy gradient is E[max(n_legal - 1, 0)] * grad E[quality | legal], whatever
    the illegal outcome's probability."""
    theta = torch.tensor([0.3, -0.2, 0.5, 1.0], dtype=torch.float64, requires_grad=True)
    legal = torch.tensor([True, True, True, False])
    q = torch.tensor([0.2, 0.9, 0.5, 0.0], dtype=torch.float64)
    logp = torch.log_softmax(theta, 0)
    p = logp.exp()
    surrogate = torch.zeros((), dtype=torch.float64)
    weight = 0.0
    for ys in itertools.product(range(4), repeat=3):
        y = torch.tensor(ys)
        prob = p[y].prod().detach()
        term = legal_quality_advantages(q[y], legal[y], 3).double()
        surrogate = surrogate + prob * (term * logp[y]).sum()
        weight += float(prob) * max(int(legal[y].sum()) - 1, 0)
    (got,) = torch.autograd.grad(surrogate, theta, retain_graph=True)
    conditional = (p * q)[legal].sum() / p[legal].sum()
    (want,) = torch.autograd.grad(conditional, theta)
    assert torch.allclose(got, weight * want, rtol=1e-6, atol=1e-8)  # the term is float32
    assert want[1] > 0 > want[0]  # it raises the best legal move and lowers the worst


def test_it_speaks_for_quality_where_legality_dominates_the_group():
    """Four legal moves of different worth and four illegal answers, scored by the real scorer: the
    plain advantage separates legal from illegal far more than good from bad legal moves; the term
    adds exactly quality_advantage x each legal move's centred quality and leaves the illegal rows."""
    fen = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
    truth = PolicyTruth(fen, ("f1b5", "d2d4", "b1c3", "a2a4", "f3g1"), (0.4, 0.35, 0.2, -0.2, -0.5), ("f1b5",))
    text = completion(truth)
    head = text.rsplit("B:", 1)[0]
    answers = [head + f"B: {m}" for m in ("f1b5", "d2d4", "a2a4", "f3g1")] + [head + "B: e1e3"] * 4
    scorer = RewardScorer()
    results = [scorer.score(prompt(fen), a, truth) for a in answers]
    rewards = torch.tensor([r.total for r in results])
    quality = torch.tensor([r.components["quality"] for r in results])
    legal = torch.tensor([r.components["best_legal"] == 1.0 for r in results])
    assert legal.tolist() == [True] * 4 + [False] * 4 and quality[0] == 1.0 > quality[1] > quality[2] > quality[3]
    plain = group_advantages(rewards, 8)
    assert plain[3] - plain[4] > plain[0] - plain[3]  # the worst legal move sits nearer the best than the illegal ones
    with_term = plain + 4.0 * legal_quality_advantages(quality, legal, 8)
    assert torch.allclose(with_term[4:], plain[4:])
    assert torch.allclose((with_term - plain)[:4], 4.0 * (quality[:4] - quality[:4].mean()))
    assert with_term[0] - with_term[3] > plain[0] - plain[3] + 3.0 * (quality[0] - quality[3])


def test_reward_spread_splits_the_group_variance_exactly(tmp_path):
    """scripts/reward_spread.py, whose figures the docs quote: the split by hand on one group of four, and the
    random mover's quality by the reward's own scoring of each legal move."""
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from reward_spread import legality_split, random_mover_quality, random_mover_quality_on, shares
    finally:
        sys.path.pop(0)
    group = [(1.0, {"best_legal": 1.0, "quality": 1.0}), (0.6, {"best_legal": 1.0, "quality": 0.2}),
             (0.0, {"best_legal": 0.0, "quality": 0.0}), (0.0, {"best_legal": 0.0, "quality": 0.0})]
    got, var = shares([group], {"best_legal": 1.0, "quality": 1.0})  # reward = (legal + quality) / 2
    assert var == pytest.approx(0.72)
    assert got["best_legal"] == pytest.approx(0.4 / 0.72) and got["quality"] == pytest.approx(0.32 / 0.72)
    assert legality_split([group]) == pytest.approx((0.64 / 0.72, 0.08 / 0.72, 0.0))
    # the chance figure beside reward/P/quality_legal: the reward's own quality of each legal move, averaged
    import json

    fen, evals = "7k/8/8/8/8/8/8/K7 w - - 0 1", {"a1b2": 0.0, "a1a2": -0.5, "a1b1": -0.9}
    judged = tmp_path / "judged.jsonl"
    judged.write_text(json.dumps({"fen": fen, "evals": evals}) + "\n")
    got = random_mover_quality(str(judged), RewardScorer().config.quality_scale)
    truth = PolicyTruth(fen, tuple(evals), tuple(evals.values()), ("a1b2",))
    head = completion(truth).rsplit("B:", 1)[0]
    each = [RewardScorer().score(prompt(fen), head + f"B: {m}", truth).components["quality"] for m in evals]
    assert each[0] == 1.0 > each[1] > each[2] >= 0.0
    assert got == pytest.approx(sum(each) / 3)
    # and on a run's own prompts (what its quality_legal is read against): the same scoring, position by position
    from rookworld_rlvr.config import load_config

    cfg = load_config(None, {"engine_cache": None})
    other = "8/8/8/8/8/8/6k1/K7 w - - 0 1"  # the same three king moves, judged alike
    from dataclasses import replace

    on_prompts = random_mover_quality_on(cfg, {prompt(fen): truth, prompt(other): replace(truth, fen=other)})
    assert on_prompts == pytest.approx(sum(each) / 3)
