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
    entropy_from_logits,
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
    assert torch.isfinite(entropy_from_logits(logits)).all()


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
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, -1e9, -1e9, -1e9]]])
    ent = entropy_from_logits(logits)
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


def test_std_floor_and_clip_hold():
    rewards = torch.tensor([0.0, 1e-6, 0.0, 1e-6])  # tiny but non-zero variance
    adv = group_advantages(rewards, 4, "group", std_floor=0.1)
    assert adv.abs().max().item() <= 1e-5  # divided by the floor 0.1, not by ~6e-7
    no_floor = group_advantages(rewards, 4, "group", std_floor=0.0)
    assert no_floor.abs().max().item() > 0.5  # without it the noise is blown up to O(1)
    clipped = group_advantages(torch.tensor([0.0, 0.0, 0.0, 10.0]), 4, "none", clip=2.0)
    assert torch.allclose(clipped, torch.tensor([-2.0, -2.0, -2.0, 2.0]))
    blown = group_advantages(rewards, 4, "group", std_floor=0.0, clip=1.0)
    assert blown.abs().max().item() <= 1.0


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
    ref = logp.detach() - torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.0]])  # k1 per token
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


# pg sums per row: -2.7 (3 tokens), 2.3 (2 tokens); k1 sums: 0.6 (3), 0.9 (2); beta = 0.1
HAND = {
    "grpo": dict(pg=(-2.7 / 3 + 2.3 / 2) / 2, kl=(0.6 / 3 + 0.9 / 2) / 2, kw={}),
    "bnpo": dict(pg=-0.4 / 5, kl=1.5 / 5, kw={}),
    "dr_grpo": dict(pg=-0.4 / 6, kl=1.5 / 6, kw={"max_completion_length": 3}),
    "dapo": dict(pg=-0.4 / 8, kl=1.5 / 8, kw={"num_items_in_batch": 8}),
}


@pytest.mark.parametrize("loss_type", list(HAND))
def test_grpo_loss_by_hand(loss_type):
    logp, old, ref, adv = _example()
    h = HAND[loss_type]
    out = grpo_loss(logp, old, ref, adv, MASK, beta=0.1, kl_kind="k1", loss_type=loss_type, **h["kw"])
    assert out.policy_loss == pytest.approx(h["pg"], abs=1e-6)
    assert out.kl_loss == pytest.approx(0.1 * h["kl"], abs=1e-6)
    assert out.loss.item() == pytest.approx(h["pg"] + 0.1 * h["kl"], abs=1e-6)
    assert out.kl_mean == pytest.approx(0.3, abs=1e-6)
    assert out.kl_max == pytest.approx(0.5, abs=1e-6)
    assert out.kl_min == pytest.approx(0.1, abs=1e-6)
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
