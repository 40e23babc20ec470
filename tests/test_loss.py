"""GRPO loss maths: hand-computed values, estimator properties, padding safety."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rookworld_rlvr.grpo.loss import (
    aggregate,
    clipped_surrogate,
    exact_kl,
    group_advantages,
    grpo_loss,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
    zero_variance_groups,
)

# ------------------------------------------------------------------------------- KL


def test_kl_formulas_by_hand():
    logp = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    d = [0.5, -1.0, 0.0]  # logp - ref
    assert torch.allclose(kl_k1(logp, ref), torch.tensor(d))
    assert torch.allclose(kl_k2(logp, ref), torch.tensor([0.125, 0.5, 0.0]))
    # r = ref - logp = -d
    expected_k3 = [math.exp(-x) + x - 1 for x in d]
    assert torch.allclose(kl_k3(logp, ref), torch.tensor(expected_k3))
    for kind, fn in (("k1", kl_k1), ("k2", kl_k2), ("k3", kl_k3)):
        assert torch.allclose(kl_estimate(logp, ref, kind, clamp=None), fn(logp, ref))
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(logp, ref, "k4")


def test_k3_estimates_kl_policy_to_ref_and_reversed_sign_does_not():
    g = torch.Generator().manual_seed(0)
    logp_all = torch.log_softmax(1.5 * torch.randn(10, generator=g, dtype=torch.float64), -1)
    ref_all = torch.log_softmax(1.5 * torch.randn(10, generator=g, dtype=torch.float64), -1)
    p, q = logp_all.exp(), ref_all.exp()
    kl_pq = (p * (logp_all - ref_all)).sum().item()
    kl_qp = (q * (ref_all - logp_all)).sum().item()

    idx = torch.multinomial(p, 200_000, replacement=True, generator=g)  # samples from the policy
    logp, ref = logp_all[idx], ref_all[idx]
    k3 = kl_k3(logp, ref).mean().item()
    k1 = kl_k1(logp, ref).mean().item()
    reversed_k3 = kl_k3(ref, logp).mean().item()  # r = logp - ref_logp: the wrong sign

    assert kl_pq > 0.3  # distributions clearly differ
    assert abs(k3 - kl_pq) / kl_pq < 0.03
    assert abs(k1 - kl_pq) / kl_pq < 0.05
    assert abs(reversed_k3 - kl_pq) / kl_pq > 0.25
    assert abs(kl_qp - kl_pq) / kl_pq > 0.1  # KL is not symmetric here


def test_exact_kl_by_hand():
    logits = torch.tensor([[[0.0, math.log(2.0)]]])  # p = (1/3, 2/3)
    ref_logits = torch.zeros(1, 1, 2)  # q = (1/2, 1/2)
    expected = (1 / 3) * math.log((1 / 3) / 0.5) + (2 / 3) * math.log((2 / 3) / 0.5)
    out = exact_kl(logits, ref_logits)
    assert out.shape == (1, 1)
    assert out.item() == pytest.approx(expected, rel=1e-6)
    assert exact_kl(logits, logits).abs().max().item() < 1e-7


def test_exact_kl_matches_expectation_of_k3():
    g = torch.Generator().manual_seed(1)
    logits, ref_logits = torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    logp, ref = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    # E_p[k3] over the full vocabulary is exactly KL(p || q)
    expected = (logp.exp() * kl_k3(logp, ref)).sum(-1)
    assert torch.allclose(exact_kl(logits, ref_logits), expected, atol=1e-5)


def test_exact_kl_handles_masked_vocab():
    logits = torch.tensor([[[0.0, -math.inf, 1.0]]])
    ref_logits = torch.tensor([[[0.0, -math.inf, 0.0]]])
    assert torch.isfinite(exact_kl(logits, ref_logits)).all()


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_clamp_prevents_inf_and_nan(kind):
    logp = torch.tensor([-1e4, -1e-3, 0.0, -math.inf], requires_grad=True)
    ref = torch.tensor([-1e-3, -1e4, -math.inf, -1e-3])
    kl = kl_estimate(logp, ref, kind, clamp=10.0)
    assert torch.isfinite(kl).all()
    assert kl.abs().max().item() <= 10.0
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    # unclamped k3 with r = +1e4 overflows: the clamp is what saves it
    if kind == "k3":
        assert not torch.isfinite(kl_estimate(logp, ref, kind, clamp=None)).all()


def test_kl_clamp_does_not_change_values_below_it():
    logp = torch.linspace(-3, 0, 50)
    ref = torch.linspace(0, -3, 50)
    raw = kl_estimate(logp, ref, "k3", clamp=None)
    clamped = kl_estimate(logp, ref, "k3", clamp=10.0)
    assert torch.equal(torch.where(raw < 10, raw, torch.full_like(raw, 10.0)), clamped)


def test_entropy_from_logits():
    from rookworld_rlvr.model.logprobs import entropy_of

    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, -1e9, -1e9, -1e9]]])
    ent = entropy_of(logits, logits.logsumexp(-1))
    assert ent[0, 0].item() == pytest.approx(math.log(4))
    assert ent[0, 1].item() == pytest.approx(0.0, abs=1e-6)


# ------------------------------------------------------------------- identity invariant


def test_policy_equals_reference_gives_zero_kl_ratio_one_no_clip():
    g = torch.Generator().manual_seed(2)
    logp = torch.log_softmax(torch.randn(4, 6, 9, generator=g), -1)[..., 0]
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]] * 2 + [[1, 1, 1, 1, 1, 1]] * 2)  # left padding
    for kind in ("k1", "k2", "k3"):
        kl = kl_estimate(logp, logp.clone(), kind)
        assert torch.equal(kl, torch.zeros_like(kl))
    _, stats = clipped_surrogate(logp, logp.clone(), torch.tensor([1.0, -1.0, 0.5, 0.0]), mask=mask)
    assert stats["ratio_mean"] == 1.0 and stats["ratio_max"] == 1.0
    assert stats["clip_frac"] == 0.0
    out = grpo_loss(logp, logp.detach(), logp.detach(), torch.tensor([1.0, -1.0, 0.5, 0.0]), mask, beta=0.1)
    assert out.kl_mean == 0.0 and out.kl_max == 0.0 and out.kl_min == 0.0
    assert out.ratio_mean == 1.0 and out.clip_frac == 0.0
    logits = torch.randn(4, 6, 9, generator=g)
    assert torch.equal(exact_kl(logits, logits.clone()), torch.zeros(4, 6))


# ------------------------------------------------------------------------- advantages


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0])  # two groups of three
    # group 1: mean 1/3, unbiased std sqrt(1/3); group 2: mean 5/3, std sqrt(4/3)
    adv = group_advantages(rewards, 3, "group")
    s1, s2 = math.sqrt(1 / 3), math.sqrt(4 / 3)
    expected = [2 / 3 / s1, -1 / 3 / s1, -1 / 3 / s1, -2 / 3 / s2, 4 / 3 / s2, -2 / 3 / s2]
    assert torch.allclose(adv, torch.tensor(expected))
    centred = torch.tensor([2 / 3, -1 / 3, -1 / 3, -2 / 3, 4 / 3, -2 / 3])
    assert torch.allclose(group_advantages(rewards, 3, "none"), centred)
    assert torch.allclose(group_advantages(rewards, 3, "batch"), centred / rewards.std())


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_variance_group_gets_exact_zero(scale):
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.0, 1.0, 0.5])
    adv = group_advantages(rewards, 3, scale)
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[:6], torch.zeros(6))
    assert adv[6:].abs().sum() > 0
    # a batch where every group is flat: batch std is nonzero but advantages are still zero
    flat = group_advantages(torch.tensor([0.3] * 4 + [1.0] * 4), 4, scale)
    assert torch.equal(flat, torch.zeros(8))
    assert torch.equal(zero_variance_groups(rewards, 3), torch.tensor([True, True, False]))


def test_std_floor_keeps_noise_from_blowing_up():
    rewards = torch.tensor([0.0, 1e-6, 0.0, 1e-6])  # tiny but non-zero variance
    for mode in ("max", "add"):
        adv = group_advantages(rewards, 4, "group", std_floor=0.1, floor_mode=mode)
        assert adv.abs().max().item() <= 1e-5  # divided by ~the floor 0.1, not by ~6e-7
    no_floor = group_advantages(rewards, 4, "group", std_floor=0.0)
    assert no_floor.abs().max().item() > 0.5  # without it the noise is blown up to O(1)


def test_std_floor_modes_by_hand():
    """One of 8 rewards 0.1 above the others: mean 0.0125, unbiased std sqrt(0.00875 / 7) = 0.0354.
    max(std, 0.05) divides by 0.05 and shrinks the advantages by 29%; std + eps by std + eps."""
    rewards = torch.tensor([0.0] * 7 + [0.1], dtype=torch.float64)
    centred = torch.tensor([-0.0125] * 7 + [0.0875], dtype=torch.float64)
    std = math.sqrt(0.00875 / 7)
    unfloored = centred / std
    as_max = group_advantages(rewards, 8, "group", std_floor=0.05, floor_mode="max")
    as_add = group_advantages(rewards, 8, "group", std_floor=1e-4, floor_mode="add")
    assert torch.allclose(as_max, centred / 0.05, rtol=1e-12, atol=0)
    assert torch.allclose(as_add, centred / (std + 1e-4), rtol=1e-12, atol=0)
    assert as_max[-1] / unfloored[-1] == pytest.approx(std / 0.05)  # 0.707: 29% lost
    assert as_add[-1] / unfloored[-1] == pytest.approx(std / (std + 1e-4))  # 0.997
    # a group whose std is above the floor: "max" leaves it alone, "add" still adds the floor
    wide = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    s = math.sqrt(1 / 3)
    assert torch.allclose(group_advantages(wide, 4, "group", 0.05, "max"), (wide - 0.5) / s, rtol=1e-12, atol=0)
    assert torch.allclose(group_advantages(wide, 4, "group", 0.05, "add"), (wide - 0.5) / (s + 0.05), rtol=1e-12, atol=0)
    # batch scaling floors the batch std the same way
    assert torch.allclose(group_advantages(rewards, 4, "batch", 1.0, "add"),
                          (rewards - torch.tensor([0.0] * 4 + [0.025] * 4, dtype=torch.float64)) / (rewards.std() + 1.0),
                          rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="std floor mode"):
        group_advantages(rewards, 8, "group", 0.05, "min")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=8, max_size=8), st.sampled_from([2, 4, 8]),
       st.sampled_from(["max", "add"]))
def test_group_scaled_advantages_are_bounded_so_they_need_no_clip(values, group, mode):
    """|A| <= (G - 1) / sqrt(G) under group scaling, for any rewards: the largest deviation from a
    group mean is at most sqrt((G - 1) / G) * sqrt(sum of squared deviations), and that sum is
    (G - 1) * std^2. 2.47 at G = 8, 1.5 at G = 4: an advantage clip at 3 or 5 never binds."""
    adv = group_advantages(torch.tensor(values, dtype=torch.float64), group, "group", 1e-12, mode)
    assert adv.abs().max().item() <= (group - 1) / math.sqrt(group) + 1e-9


def test_group_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="unknown advantage scale"):
        group_advantages(torch.zeros(4), 2, "global")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0, 1e-7]), min_size=8, max_size=8),
    st.sampled_from(["group", "batch", "none"]),
)
def test_advantages_always_finite_and_zero_mean_per_group(values, scale):
    adv = group_advantages(torch.tensor(values, dtype=torch.float64), 4, scale)
    assert torch.isfinite(adv).all()
    assert adv.view(2, 4).sum(1).abs().max().item() < 1e-9


# ------------------------------------------------------------- surrogate and aggregation

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_aggregate_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])
    assert aggregate(per_token, MASK, "grpo").item() == pytest.approx((6 / 3 + 9 / 2) / 2)  # 3.25
    assert aggregate(per_token, MASK, "bnpo").item() == pytest.approx(15 / 5)
    assert aggregate(per_token, MASK, "dr_grpo", max_completion_length=4).item() == pytest.approx(15 / 8)
    assert aggregate(per_token, MASK, "dr_grpo").item() == pytest.approx(15 / 6)  # falls back to C
    assert aggregate(per_token, MASK, "dapo", num_items_in_batch=10).item() == pytest.approx(1.5)
    assert aggregate(per_token, MASK, "dapo").item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="unknown loss type"):
        aggregate(per_token, MASK, "ppo")


def _example():
    """Rows with A = +1 and A = -1; ratios chosen to hit each clip branch (eps 0.2)."""
    old = torch.full((2, 3), -1.0)
    ratios = torch.tensor([[1.0, 1.5, 0.5], [0.5, 1.5, 1.0]])
    logp = (old + ratios.log()).requires_grad_(True)
    ref = logp.detach() - torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.0]])  # logp - ref per token
    adv = torch.tensor([1.0, -1.0])
    return logp, old, ref, adv


def test_clipped_surrogate_by_hand():
    logp, old, _, adv = _example()
    per_token, stats = clipped_surrogate(logp, old, adv, 0.2, 0.2, MASK)
    # A=+1: r=1 -> -1; r=1.5 -> -min(1.5, 1.2) = -1.2 (high clip); r=0.5 -> -min(0.5, 0.8) = -0.5
    # A=-1: r=0.5 -> -min(-0.5, -0.8) = 0.8 (low clip); r=1.5 -> -min(-1.5, -1.2) = 1.5
    assert torch.allclose(per_token[0], torch.tensor([-1.0, -1.2, -0.5]), atol=1e-6)
    assert torch.allclose(per_token[1, :2], torch.tensor([0.8, 1.5]), atol=1e-6)
    assert stats["clip_low"] == pytest.approx(1 / 5)
    assert stats["clip_high"] == pytest.approx(1 / 5)
    assert stats["clip_frac"] == pytest.approx(2 / 5)
    assert stats["ratio_mean"] == pytest.approx((1 + 1.5 + 0.5 + 0.5 + 1.5) / 5)
    assert stats["ratio_max"] == pytest.approx(1.5)
    # clipped tokens get no gradient; the others get -A * ratio
    (per_token * MASK).sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, 0.0, -0.5], [0.0, 1.5, 0.0]]), atol=1e-6)


# pg sums per row: -2.7 (3 tokens), 2.3 (2 tokens); k2 = d^2 / 2 per token: 0.005, 0.02, 0.045 (sum
# 0.07) and 0.08, 0.125 (sum 0.205); beta = 0.1
HAND = {
    "grpo": dict(pg=(-2.7 / 3 + 2.3 / 2) / 2, kl=(0.07 / 3 + 0.205 / 2) / 2, kw={}),
    "bnpo": dict(pg=-0.4 / 5, kl=0.275 / 5, kw={}),
    "dr_grpo": dict(pg=-0.4 / 6, kl=0.275 / 6, kw={"max_completion_length": 3}),
    "dapo": dict(pg=-0.4 / 8, kl=0.275 / 8, kw={"num_items_in_batch": 8}),
}


@pytest.mark.parametrize("loss_type", list(HAND))
def test_grpo_loss_by_hand(loss_type):
    logp, old, ref, adv = _example()
    h = HAND[loss_type]
    out = grpo_loss(logp, old, ref, adv, MASK, beta=0.1, kl_kind="k2", loss_type=loss_type, **h["kw"])
    assert out.policy_loss == pytest.approx(h["pg"], abs=1e-6)
    assert out.kl_loss == pytest.approx(0.1 * h["kl"], abs=1e-6)
    assert out.loss.item() == pytest.approx(h["pg"] + 0.1 * h["kl"], abs=1e-6)
    assert out.kl_mean == pytest.approx(0.055, abs=1e-6)
    assert out.kl_max == pytest.approx(0.125, abs=1e-6)
    assert out.kl_min == pytest.approx(0.005, abs=1e-6)
    assert out.kl_seq_max == pytest.approx(0.205 / 2, abs=1e-6)  # the second completion's mean
    assert out.kl_clamped == 0.0
    # the policy term's scale is the aggregate of |per-token surrogate| (its value is ~0 by construction)
    per_token, _ = clipped_surrogate(logp, old, adv, 0.2, 0.2, MASK)
    scale = aggregate(per_token.abs(), MASK, loss_type, **h["kw"]).item()
    share = abs(0.1 * h["kl"]) / (scale + abs(0.1 * h["kl"]))
    assert out.kl_share == pytest.approx(share, abs=1e-6)
    assert out.clip_frac == pytest.approx(0.4)
    assert out.loss.requires_grad
    assert set(out.metrics()) >= {"loss", "policy_loss", "kl_mean", "clip_low", "ratio_max"}


def test_padding_with_inf_and_nan_is_inert():
    logp, old, ref, adv = _example()
    clean = grpo_loss(logp, old, ref, adv, MASK, beta=0.1, kl_kind="k3").loss.item()

    bad_logp = logp.detach().clone()
    bad_logp[1, 2] = -math.inf
    bad_logp.requires_grad_(True)
    bad_old, bad_ref = old.clone(), ref.clone()
    bad_old[1, 2], bad_ref[1, 2] = math.nan, math.nan
    ent = torch.ones(2, 3)
    ent[1, 2] = math.nan
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
        bad_logp.grad = None
        out = grpo_loss(
            bad_logp, bad_old, bad_ref, adv, MASK.bool(), beta=0.1, loss_type=loss_type,
            entropy=ent, entropy_coef=0.01,
        )
        assert math.isfinite(out.loss.item())
        out.loss.backward()
        assert torch.isfinite(bad_logp.grad).all()
        assert bad_logp.grad[1, 2].item() == 0.0
        assert out.entropy == pytest.approx(1.0)
    same = grpo_loss(bad_logp, bad_old, bad_ref, adv, MASK, beta=0.1, kl_kind="k3").loss.item()
    assert same == pytest.approx(clean, abs=1e-6)


def test_entropy_bonus_and_missing_reference():
    logp, old, _, adv = _example()
    ent = torch.full((2, 3), 2.0)
    base = grpo_loss(logp, old, None, adv, MASK, beta=0.1)
    bonus = grpo_loss(logp, old, None, adv, MASK, beta=0.1, entropy=ent, entropy_coef=0.5)
    assert bonus.loss.item() == pytest.approx(base.loss.item() - 0.5 * 2.0)
    assert base.kl_loss == 0.0 and base.kl_share == 0.0 and base.entropy is None


def test_precomputed_exact_kl_is_used_and_beta_zero_drops_kl():
    logp, old, ref, adv = _example()
    kl = torch.full((2, 3), 0.2)
    out = grpo_loss(logp, old, ref, adv, MASK, beta=1.0, kl=kl, loss_type="bnpo")
    assert out.kl_mean == pytest.approx(0.2) and out.kl_loss == pytest.approx(0.2)
    zero = grpo_loss(logp, old, ref, adv, MASK, beta=0.0, loss_type="bnpo")
    assert zero.loss.item() == pytest.approx(zero.policy_loss)
    assert zero.kl_mean > 0 and zero.kl_share == 0.0  # still measured, not penalised


# ----------------------------------------------------------------- KL gradients in the loss


def _categorical(seed: int = 3, size: int = 6):
    g = torch.Generator().manual_seed(seed)
    theta = (1.5 * torch.randn(size, generator=g, dtype=torch.float64)).requires_grad_(True)
    ref = torch.log_softmax(1.5 * torch.randn(size, generator=g, dtype=torch.float64), -1)
    return theta, ref


def _grad(fn, theta):
    theta.grad = None
    fn().backward()
    return theta.grad.clone()


def test_expected_gradient_of_each_kl_estimator_in_the_loss():
    """On a categorical pi = softmax(theta), the loss differentiates each estimator through log pi of
    tokens drawn from pi (no score-function term). Exactly, over the whole support:
    E_pi[grad k1] = 0, E_pi[grad k2] = grad KL(pi || ref), E_pi[grad k3] = grad KL(ref || pi)."""
    theta, ref = _categorical()
    p = lambda: torch.softmax(theta, -1)  # noqa: E731
    logp = lambda: torch.log_softmax(theta, -1)  # noqa: E731
    reverse = _grad(lambda: (p() * (logp() - ref)).sum(), theta)  # grad KL(pi || ref)
    forward = _grad(lambda: (ref.exp() * (ref - logp())).sum(), theta)  # grad KL(ref || pi)
    assert (reverse - forward).norm() > 0.2 * reverse.norm()  # the two gradients clearly differ here

    def expected(kind):  # sum_x pi(x) grad k(x), weights held fixed: the expectation over sampled tokens
        # (no clamp: one token here has k3 = 15, and the clamp, tested below, zeroes its gradient)
        return _grad(lambda: (p().detach() * kl_estimate(logp(), ref, kind, clamp=None)).sum(), theta)

    # kl_estimate works in float32 (eps 6e-8) on log-ratios below 4 and values below 16, summed over
    # 6 terms: 1e-6 bounds that rounding; the gradients themselves are of size 0.1-0.4
    assert expected("k1").abs().max().item() < 1e-6
    torch.testing.assert_close(expected("k2"), reverse, rtol=0, atol=1e-6)
    torch.testing.assert_close(expected("k3"), forward, rtol=0, atol=1e-6)


def test_the_loss_kl_term_has_that_gradient_on_sampled_tokens():
    """grpo_loss itself, on tokens sampled from pi (advantages 0, beta 1, token mean): its gradient is
    a Monte-Carlo estimate of E_pi[grad k]; it lands within 5 standard errors of grad KL(ref || pi)
    for k3 and of grad KL(pi || ref) for k2. The standard error comes from the exact per-token
    gradients (their variance under pi over n samples), so the bound is the sampling arithmetic."""
    theta, ref = _categorical()
    n = 100_000
    idx = torch.multinomial(torch.softmax(theta.detach(), -1), n, replacement=True,
                            generator=torch.Generator().manual_seed(5))
    p = torch.softmax(theta.detach(), -1)
    targets = {"k2": lambda: (torch.softmax(theta, -1) * (torch.log_softmax(theta, -1) - ref)).sum(),
               "k3": lambda: (ref.exp() * (ref - torch.log_softmax(theta, -1))).sum()}
    for kind, exact in targets.items():
        per_token = torch.stack([_grad(lambda x=x: kl_estimate(torch.log_softmax(theta, -1)[x], ref[x], kind, None), theta)
                                 for x in range(len(p))])  # grad of k at each support point
        mean = (p[:, None] * per_token).sum(0)
        se = ((p[:, None] * (per_token - mean) ** 2).sum(0) / n).sqrt()
        logp = torch.log_softmax(theta, -1)[idx].float()[None]
        out = grpo_loss(logp, logp.detach(), ref[idx].float()[None], torch.zeros(1), torch.ones(1, n),
                        beta=1.0, kl_kind=kind, kl_clamp=None, loss_type="bnpo")
        got = _grad(lambda: out.loss, theta)
        # 5 standard errors (a 6e-7 chance per component); + 1e-5 for the float32 sum of 1e5 terms
        assert ((got - _grad(exact, theta)).abs() <= 5 * se + 1e-5).all(), (kind, got, se)


def test_k1_as_a_penalty_is_refused_but_can_still_be_measured():
    logp, old, ref, adv = _example()
    with pytest.raises(ValueError, match="k1.*zero expected gradient"):
        grpo_loss(logp, old, ref, adv, MASK, beta=0.1, kl_kind="k1")
    out = grpo_loss(logp, old, ref, adv, MASK, beta=0.0, kl_kind="k1")  # measured only
    assert out.kl_mean == pytest.approx(0.3, abs=1e-6) and out.kl_loss == 0.0


def test_tokens_at_the_kl_clamp_are_counted_and_get_no_kl_gradient():
    logp = torch.tensor([[-0.1, -0.2, -12.0, -0.3]], requires_grad=True)
    ref = torch.tensor([[-0.1, -0.25, -0.1, -5.3]])  # r = 0, -0.05, 11.9, -5: k3 = 0, 0.001, ~1.5e5, 4.0
    mask = torch.ones(1, 4)
    out = grpo_loss(logp, None, ref, torch.zeros(1), mask, beta=1.0, kl_kind="k3", kl_clamp=10.0, loss_type="bnpo")
    assert out.kl_clamped == pytest.approx(1 / 4) and out.kl_max == 10.0
    out.loss.backward()
    assert logp.grad[0, 2].item() == 0.0  # clamped: no gradient at all
    assert logp.grad[0, 1].item() != 0.0
    k2 = grpo_loss(logp, None, ref, torch.zeros(1), mask, beta=1.0, kl_kind="k2", kl_clamp=10.0, loss_type="bnpo")
    assert k2.kl_clamped == pytest.approx(2 / 4)  # k2 = r^2 / 2 = 70.8 and 12.5 on tokens 2 and 3


# ------------------------------------------------------------------ aggregation: dr_grpo


def test_dr_grpo_weighs_every_token_the_same_whatever_the_longest_completion():
    """Dr. GRPO divides by the generation budget, a constant: a batch whose longest completion is
    3 tokens and one whose longest is 6 give the first row's tokens the same weight 1 / (N * budget)."""
    weights = []
    for mask in (torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
                 torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])):
        per_token = torch.ones_like(mask, requires_grad=True)
        aggregate(per_token, mask, "dr_grpo", max_completion_length=8).backward()
        weights.append(per_token.grad[0, :2])
    assert torch.equal(weights[0], weights[1]) and weights[0][0].item() == 1 / (2 * 8)
    per_token = torch.ones(2, 3, requires_grad=True)  # per-row budgets (tasks with their own limits)
    aggregate(per_token, MASK, "dr_grpo", max_completion_length=torch.tensor([4.0, 8.0])).backward()
    assert torch.equal(per_token.grad, torch.tensor([[1 / 8, 1 / 8, 1 / 8], [1 / 16, 1 / 16, 0.0]]))


# --------------------------------------------------------- GSPO, two-sided clip, sampler IS


def test_sequence_level_ratio_and_clip_by_hand():
    """GSPO: one ratio per completion, exp(mean log ratio), clipped as a whole. Row 0: log ratios
    0.1, 0.2, 0.3 -> s = e^0.2 = 1.2214 > 1.2 with A = +1: clipped, loss -1.2 per token, no gradient.
    Row 1: -0.1, 0.1 -> s = 1 with A = -1: loss 1 per token; the token sum -|y| s A has gradient
    -A s = 1 at each token (each token moves s by s / |y|)."""
    old = torch.full((2, 3), -1.0)
    logp = (old + torch.tensor([[0.1, 0.2, 0.3], [-0.1, 0.1, 0.0]])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    per_token, stats = clipped_surrogate(logp, old, adv, 0.2, 0.2, MASK, level="sequence")
    s0 = math.exp(0.2)
    assert torch.allclose(per_token[0], torch.full((3,), -1.2), atol=1e-6)
    assert torch.allclose(per_token[1, :2], torch.ones(2), atol=1e-6)
    assert stats["clip_high"] == pytest.approx(3 / 5) and stats["clip_low"] == 0.0
    assert stats["ratio_mean"] == pytest.approx((3 * s0 + 2 * 1.0) / 5, rel=1e-6)
    assert stats["ratio_max"] == pytest.approx(s0, rel=1e-6)
    (per_token * MASK).sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]), atol=1e-6)
    token, _ = clipped_surrogate(logp.detach(), old, adv, 0.2, 0.2, MASK, level="token")
    assert not torch.allclose(token[0], per_token[0].detach())  # token level clips only the 0.3 token
    with pytest.raises(ValueError, match="importance sampling level"):
        clipped_surrogate(logp, old, adv, mask=MASK, level="group")


def test_two_sided_clip_bounds_negative_advantages_by_hand():
    """delta caps the ratio of A < 0 tokens (PPO's clip leaves -rA unbounded above 1 + eps).
    A = -1, eps 0.2, delta 2: r = 0.5 -> 0.8 (low clip), r = 1.5 -> 1.5 (free), r = 3 -> 2 (cut)."""
    old = torch.zeros(2, 3)
    ratios = torch.tensor([[0.5, 1.5, 3.0], [0.5, 1.5, 3.0]])
    logp = ratios.log().requires_grad_(True)
    adv = torch.tensor([-1.0, 1.0])
    ones = torch.ones(2, 3)
    per_token, stats = clipped_surrogate(logp, old, adv, 0.2, 0.2, ones, delta=2.0)
    assert torch.allclose(per_token[0], torch.tensor([0.8, 1.5, 2.0]), atol=1e-6)
    assert torch.allclose(per_token[1], torch.tensor([-0.5, -1.2, -1.2]), atol=1e-6)  # A > 0: as plain PPO
    assert stats["clip_delta"] == pytest.approx(1 / 6) and stats["clip_frac"] == pytest.approx(4 / 6)
    per_token.sum().backward()
    assert torch.allclose(logp.grad[0], torch.tensor([0.0, 1.5, 0.0]), atol=1e-6)  # -A * r where free
    plain, _ = clipped_surrogate(logp.detach(), old, adv, 0.2, 0.2, ones)
    assert plain[0, 2].item() == pytest.approx(3.0)  # without delta: unbounded


def test_sampler_correction_by_hand():
    """TIS: w = min(exp(old - sampler), cap) on the policy term only; equal log-probs give w = 1."""
    logp, old, ref, adv = _example()
    sampler = old - torch.tensor([[0.5, -0.1, 0.0], [0.0, 0.0, 0.0]])  # raw weights e^0.5, e^-0.1, 1, 1, 1
    w = torch.tensor([[1.2, math.exp(-0.1), 1.0], [1.0, 1.0, 0.0]])
    out = grpo_loss(logp, old, ref, adv, MASK, beta=0.1, kl_kind="k3", loss_type="bnpo", sampler_logp=sampler,
                    tis_cap=1.2)
    plain = grpo_loss(logp, old, ref, adv, MASK, beta=0.1, kl_kind="k3", loss_type="bnpo")
    per_token, _ = clipped_surrogate(logp, old, adv, 0.2, 0.2, MASK)
    assert out.policy_loss == pytest.approx(float((per_token.detach() * w).sum() / 5), abs=1e-6)
    assert out.kl_loss == pytest.approx(plain.kl_loss, abs=1e-7)  # the KL term is not re-weighted
    assert out.tis_capped == pytest.approx(1 / 5) and out.tis_weight_max == pytest.approx(math.exp(0.5), rel=1e-6)
    assert out.tis_weight_mean == pytest.approx(float(w.sum() / 5), rel=1e-6)
    same = grpo_loss(logp, old, ref, adv, MASK, beta=0.1, loss_type="bnpo", sampler_logp=old.clone(), tis_cap=2.0)
    assert same.loss.item() == plain.loss.item() and same.tis_weight_mean == 1.0  # no mismatch, no change
