"""Training controls: each one's effect, and exact resume through state_dict."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rookworld_rlvr.grpo.control import (
    CurriculumSchedule,
    KLController,
    KLThresholdGuard,
    NonFiniteGuard,
    RewardNormalizer,
    SymptomMonitor,
    adamw,
    cosine_lr,
)

# ----------------------------------------------------------------------- KL controller


def test_kl_warmup_factor_zero_means_no_kl_during_warmup():
    ctl = KLController(beta=0.04, warmup_steps=3, warmup_factor=0.0)
    assert [ctl.value(s) for s in range(5)] == [0.0, 0.0, 0.0, 0.04, 0.04]
    half = KLController(beta=0.04, warmup_steps=2, warmup_factor=0.5)
    assert [half.value(s) for s in range(3)] == [0.02, 0.02, 0.04]


def test_fixed_controller_ignores_updates():
    ctl = KLController(beta=0.1, mode="fixed", target=0.01)
    ctl.update(5.0)
    assert ctl.value(0) == 0.1


def test_adaptive_beta_moves_toward_target_by_hand():
    up = KLController(beta=0.1, mode="adaptive", target=0.05, horizon=100, beta_max=1.0)
    # kl/target - 1 = 1.0, clipped to 0.2: beta *= 1 + 0.2 * 10 / 100
    assert up.update(0.1, n_steps=10) == pytest.approx(0.1 * 1.02)
    down = KLController(beta=0.1, mode="adaptive", target=0.05, horizon=100)
    # kl/target - 1 = -0.4 -> -0.2
    assert down.update(0.03, n_steps=10) == pytest.approx(0.1 * 0.98)
    small = KLController(beta=0.1, mode="adaptive", target=0.05, horizon=100)
    # inside the clip: error = 0.055/0.05 - 1 = 0.1
    assert small.update(0.055) == pytest.approx(0.1 * (1 + 0.1 / 100))
    same = KLController(beta=0.1, mode="adaptive", target=0.05, horizon=100)
    assert same.update(0.05) == pytest.approx(0.1)


def test_adaptive_beta_respects_clamp():
    ctl = KLController(beta=0.1, mode="adaptive", target=0.05, horizon=10, beta_min=0.05, beta_max=0.2)
    for _ in range(100):
        ctl.update(10.0)
    assert ctl.value(0) == 0.2
    for _ in range(100):
        ctl.update(0.0)
    assert ctl.value(0) == 0.05
    with pytest.raises(ValueError):
        KLController(beta=0.1, mode="adaptive", target=0.0)
    with pytest.raises(ValueError):
        KLController(beta=0.1, mode="sometimes")


def test_kl_controller_state_round_trip():
    a = KLController(beta=0.1, mode="adaptive", target=0.05, horizon=10)
    for kl in (0.2, 0.1, 0.3):
        a.update(kl)
    b = KLController(beta=0.1, mode="adaptive", target=0.05, horizon=10)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for kl in (0.01, 0.5, 0.07):
        assert a.update(kl) == b.update(kl)


# ----------------------------------------------------------------------------- guards


def test_kl_threshold_guard_recovers_then_stops():
    guard = KLThresholdGuard(threshold=1.0, max_recoveries=2)
    assert guard.check(0.5) == "ok"
    assert guard.check(1.5) == "recover"
    assert guard.check(0.2) == "ok"
    assert guard.check(2.0) == "recover"
    assert guard.check(3.0) == "stop"
    msg = guard.message
    assert "3" in msg and "threshold 1.0" in msg
    for knob in ("learning rate", "beta", "clip"):
        assert knob in msg
    assert KLThresholdGuard(None).check(1e9) == "ok"


def test_kl_threshold_guard_state_round_trip():
    a = KLThresholdGuard(threshold=1.0, max_recoveries=1)
    assert a.check(2.0) == "recover"
    b = KLThresholdGuard(threshold=1.0, max_recoveries=1)
    b.load_state_dict(a.state_dict())
    assert b.check(2.0) == "stop"


def test_non_finite_guard_skip_rollback_stop_sequence():
    guard = NonFiniteGuard(max_consecutive=3, max_rollbacks=2, lr_factor=0.5)
    nan = float("nan")
    assert guard.check(1.0, 0.5) == "ok"
    assert [guard.check(nan, 1.0) for _ in range(3)] == ["skip", "skip", "rollback"]
    assert guard.lr_scale == 0.5
    # a finite step resets the run of skips
    assert guard.check(nan, 1.0) == "skip"
    assert guard.check(torch.tensor(0.3), torch.tensor(1.0)) == "ok"
    assert [guard.check(1.0, float("inf")) for _ in range(3)] == ["skip", "skip", "rollback"]
    assert guard.lr_scale == 0.25
    assert [guard.check(torch.tensor(nan)) for _ in range(3)] == ["skip", "skip", "stop"]
    assert "non-finite loss" in guard.message and "learning rate" in guard.message


def test_non_finite_guard_state_round_trip():
    a = NonFiniteGuard(max_consecutive=2, max_rollbacks=1)
    a.check(math.nan)
    b = NonFiniteGuard(max_consecutive=2, max_rollbacks=1)
    b.load_state_dict(a.state_dict())
    seq = [math.nan, math.nan, math.nan, math.nan]
    assert [a.check(x) for x in seq] == [b.check(x) for x in seq] == ["rollback", "skip", "stop", "skip"]


# ------------------------------------------------------------------ reward normaliser


def test_reward_normalizer_by_hand():
    norm = RewardNormalizer(momentum=0.5)
    out = norm.normalize(torch.tensor([0.0, 2.0]))  # first batch: mean 1, var 1
    assert torch.allclose(out, torch.tensor([-1.0, 1.0]))
    # second batch mean 3, var 0; half-half mixture with (mean 1, var 1) -> mean 2,
    # var = 0.5 * (1 + (1 - 2)**2) + 0.5 * (0 + (3 - 2)**2) = 1.5
    out = norm.normalize(torch.tensor([3.0, 3.0]))
    assert norm.mean == pytest.approx(2.0) and norm.var == pytest.approx(1.5)
    assert torch.allclose(out, torch.full((2,), 1 / math.sqrt(1.5)))


def test_reward_normalizer_safe_and_disabled():
    norm = RewardNormalizer(momentum=0.9)
    out = norm.normalize(torch.tensor([5.0]))
    assert torch.equal(out, torch.tensor([0.0]))
    assert torch.isfinite(norm.normalize(torch.tensor([5.0, 5.0]))).all()
    off = RewardNormalizer(momentum=0.9, enabled=False)
    r = torch.tensor([1.0, 7.0])
    assert off.normalize(r) is r


def test_reward_normalizer_state_round_trip():
    a = RewardNormalizer(momentum=0.8)
    a.normalize(torch.tensor([0.0, 1.0, 3.0]))
    b = RewardNormalizer(momentum=0.8)
    b.load_state_dict(a.state_dict())
    batch = torch.tensor([2.0, -1.0])
    assert torch.equal(a.normalize(batch), b.normalize(batch))


# ------------------------------------------------------------ optimizer and schedules


def _gpt2():
    """A 2-layer GPT-2 with tied embeddings, the same weights on every call."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1)
    return GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=32, n_layer=2, n_embd=32, n_head=4)).eval()


def test_adamw_is_fused_and_steps_like_plain_adamw_decaying_only_matrices():
    """The fused kernel must give AdamW's update: three steps on a tiny GPT-2 against PyTorch's
    single-tensor AdamW with the same groups, and biases / layer norms never decayed."""
    a, b = _gpt2(), _gpt2()
    opt = adamw(list(a.parameters()), lr=1e-2, betas=(0.9, 0.99), weight_decay=0.5)
    assert opt.defaults["fused"] and [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]
    assert all(p.dim() < 2 for p in opt.param_groups[1]["params"]) and opt.param_groups[1]["params"]
    decay = [p for p in b.parameters() if p.dim() >= 2]
    plain = torch.optim.AdamW([{"params": decay, "weight_decay": 0.5},
                               {"params": [p for p in b.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                              lr=1e-2, betas=(0.9, 0.99), foreach=False)
    x = torch.randint(1, 40, (2, 12))
    for _ in range(3):  # the same gradients into both (from a's loss): compares the optimizers alone
        opt.zero_grad()
        a(x, labels=x).loss.backward()
        for p, q in zip(a.parameters(), b.parameters()):
            q.grad = p.grad.clone()
        opt.step()
        plain.step()
    start = _gpt2()
    moved = max((p - q).abs().max().item() for p, q in zip(a.parameters(), start.parameters()))
    assert moved > 1e-2  # the steps did something, so agreeing below is not vacuous
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4)


def test_cosine_lr_shape():
    total, warm = 100, 10
    lrs = [cosine_lr(s, total, warm, min_ratio=0.1) for s in range(total + 5)]
    assert lrs[0] == pytest.approx(0.1)  # 1 / warmup: small but not a wasted step
    assert all(a < b for a, b in zip(lrs[:warm], lrs[1:warm]))
    assert lrs[warm - 1] == 1.0 and lrs[warm] == 1.0
    assert all(a >= b for a, b in zip(lrs[warm:], lrs[warm + 1 :]))
    assert lrs[(total + warm) // 2] == pytest.approx(0.55)  # halfway down the cosine
    assert lrs[total] == pytest.approx(0.1) and lrs[-1] == pytest.approx(0.1)
    assert cosine_lr(0, 50, 0, 0.0) == 1.0


def test_curriculum_switches_weights_at_named_step():
    cur = CurriculumSchedule(
        {"P": [(0, {"format": 1.0}), (100, {"format": 0.2, "best_move": 2.0})], "A": [[50, {"fen": 3.0}]]}
    )
    base = {"format": 0.5, "best_move": 1.0, "legal": 0.3}
    assert cur.weights("P", 0, base) == {"format": 1.0, "best_move": 1.0, "legal": 0.3}
    assert cur.weights("P", 99, base) == {"format": 1.0, "best_move": 1.0, "legal": 0.3}
    assert cur.weights("P", 100, base) == {"format": 0.2, "best_move": 2.0, "legal": 0.3}
    assert cur.weights("A", 49, {"fen": 1.0}) == {"fen": 1.0}
    assert cur.weights("A", 50, {"fen": 1.0}) == {"fen": 3.0}
    assert cur.weights("unscheduled", 10, base) == base
    with pytest.raises(ValueError, match="unknown components"):
        cur.weights("A", 60, {"other": 1.0})
    with pytest.raises(ValueError, match="unknown task"):
        cur.check({"P": base})


def test_curriculum_validation_errors():
    with pytest.raises(ValueError, match="strictly increasing"):
        CurriculumSchedule({"P": [(10, {}), (5, {})]})
    with pytest.raises(ValueError, match=">= 0"):
        CurriculumSchedule({"P": [(0, {"format": -1.0})]})
    with pytest.raises(ValueError, match="non-negative integer"):
        CurriculumSchedule({"P": [(-1, {})]})


# ------------------------------------------------------------------------ diagnostics


def _fired(mon: SymptomMonitor, step: int, **metrics: float) -> list[str]:
    return [w.split("[")[1].split("]")[0] for w in mon.observe(step, metrics)]


def test_symptom_monitor_fires_each_symptom():
    mon = SymptomMonitor(every=10, flat_steps=3)
    for step, kl in enumerate([0.02, 0.03, 0.04, 0.05, 0.06]):
        assert _fired(mon, step, kl_mean=kl, entropy=2.0, grad_norm=1.0, reward_mean=step) == []
    assert _fired(mon, 5, kl_mean=0.08, entropy=2.0, grad_norm=1.0, reward_mean=5) == ["kl_growth"]
    assert _fired(mon, 6, entropy=0.3) == ["entropy_collapse"]
    assert _fired(mon, 7, grad_norm=11.0) == ["grad_spike"]
    assert _fired(mon, 8, zero_var_share=0.6, clip_frac=0.6, truncation_rate=0.7) == [
        "zero_variance", "clip_fraction", "truncation",
    ]
    assert _fired(mon, 9, reward_mean=0.5) == []
    assert _fired(mon, 10, reward_mean=0.5) == []
    assert _fired(mon, 11, reward_mean=0.5) == ["reward_flat"]


def test_symptom_monitor_messages_name_knobs():
    mon = SymptomMonitor(every=1)
    (msg,) = mon.observe(3, {"clip_frac": 0.9})
    assert msg.startswith("step 3 [clip_fraction]") and "learning rate" in msg
    (msg,) = mon.observe(4, {"truncation_rate": 0.9})
    assert "max_new_tokens" in msg and "truncated_completions" in msg


def test_symptom_monitor_rate_limits_and_resumes():
    mon = SymptomMonitor(every=5)
    fired = [step for step in range(12) if mon.observe(step, {"zero_var_share": 0.9})]
    assert fired == [0, 5, 10]
    clone = SymptomMonitor(every=5)
    clone.load_state_dict(copy.deepcopy(mon.state_dict()))
    for step in range(12, 20):
        assert mon.observe(step, {"zero_var_share": 0.9}) == clone.observe(step, {"zero_var_share": 0.9})
    assert _fired(mon, 100, zero_var_share=float("nan")) == []
