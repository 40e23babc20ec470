"""Training controls: each one's effect, and exact resume through state_dict."""

from __future__ import annotations

import copy
import math
import statistics

import pytest
import torch

from rookworld_rlvr.grpo.control import CurriculumSchedule, KLController, RewardNormalizer, adamw, cosine_lr
from rookworld_rlvr.grpo.guards import CollapseGuard, NonFiniteGuard
from rookworld_rlvr.grpo.monitor import SymptomMonitor

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


HEALTHY = {"valid/P": 1.0, "valid/A": 0.9, "reward/P": 0.55, "reward/A": 0.8, "kl_mean": 0.02, "kl_seq_max": 0.3,
           "entropy": 0.5, "truncation_rate": 0.0, "reward/mean": 0.6}


def _feed(guard, records, start=1):
    """Records at steps start, start + 1, ...; returns (step, event) of every event."""
    out = []
    for i, rec in enumerate(records):
        ev = guard.observe(start + i, rec)
        if ev is not None:
            out.append((start + i, ev))
    return out


@pytest.mark.parametrize("signal,bad,bound", [
    ("valid/P", 0.6, 1.0 - 0.3), ("valid/A", 0.55, 0.9 - 0.3), ("reward/P", 0.3, 0.55 - 0.2),
    ("reward/A", 0.5, 0.8 - 0.2), ("kl_mean", 0.8, 0.5), ("kl_seq_max", 6.0, 5.0), ("entropy", 1.2, 0.5 * 2.0),
    ("entropy", 0.2, 0.5 / 2.0), ("truncation_rate", 0.5, 0.0 + 0.3),
])
def test_collapse_guard_fires_on_each_signal_after_patience(signal, bad, bound):
    guard = CollapseGuard(patience=2, max_recoveries=1)
    assert _feed(guard, [HEALTHY] * 5) == []
    fired = _feed(guard, [{**HEALTHY, signal: bad}] * 3, start=6)
    step, ev = fired[0]
    assert step == 7 and ev.first_step == 6 and ev.signal == signal and ev.action == "recover"  # the 2nd bad step
    assert ev.value == pytest.approx(bad) and ev.bound == pytest.approx(bound)
    assert ev.reference == (None if signal.startswith("kl") else pytest.approx(HEALTHY[signal]))
    assert signal in ev.message and "recovery 1/1" in ev.message
    again = CollapseGuard(patience=2, max_recoveries=0)  # no recoveries left: stop, naming the knob
    _feed(again, [HEALTHY] * 5)
    (_, stop), = _feed(again, [{**HEALTHY, signal: bad}] * 2, start=6)
    knob = {"valid": "guard_valid_drop", "reward": "guard_reward_drop", "kl_mean": "guard_kl_mean",
            "kl_seq_max": "guard_kl_max", "entropy": "guard_entropy_factor", "truncation_rate": "guard_truncation_rise"}
    assert stop.action == "stop" and knob[signal.split("/")[0]] in stop.message and "lower lr" in stop.message


def test_collapse_guard_needs_history_keeps_bad_values_out_and_resets_on_a_good_one():
    guard = CollapseGuard(patience=2)
    # relative signals wait for 3 accepted values; the absolute KL bound does not
    assert _feed(guard, [{**HEALTHY, "valid/P": 0.0}] * 2) == []
    assert _feed(CollapseGuard(patience=2), [{**HEALTHY, "kl_mean": 2.0}] * 2)[0][0] == 2
    guard = CollapseGuard(patience=3)
    _feed(guard, [HEALTHY] * 4)
    assert _feed(guard, [{**HEALTHY, "reward/P": 0.1}] * 2 + [HEALTHY] + [{**HEALTHY, "reward/P": 0.1}] * 2, 5) == []
    assert list(guard.history["reward/P"]) == [0.55] * 5  # the four bad values never entered the median
    assert guard.streaks == {"reward/P": [8, 2]}
    # a slow drift moves the median along and never fires; reward/mean (task mix) is not a signal
    slow = CollapseGuard(patience=1)
    assert _feed(slow, [{**HEALTHY, "reward/P": 0.55 - 0.03 * i, "reward/mean": -5.0 * i} for i in range(15)]) == []


def test_collapse_guard_names_the_earliest_streak_and_off_signals_never_fire():
    guard = CollapseGuard(patience=2)
    _feed(guard, [HEALTHY] * 4)
    fired = _feed(guard, [{**HEALTHY, "entropy": 5.0}, {**HEALTHY, "entropy": 5.0, "valid/P": 0.1},
                          {**HEALTHY, "entropy": 5.0, "valid/P": 0.1}], start=5)
    assert [(s, e.signal, e.first_step, e.also) for s, e in fired] == [(6, "entropy", 5, ["valid/P"])]
    assert "also out of bounds: valid/P" in fired[0][1].message
    off = CollapseGuard(valid_drop=None, reward_drop=None, kl_mean=None, kl_max=None, entropy_factor=None,
                        truncation_rise=None, eval_drop=None, patience=1)
    crazy = {"valid/P": 0.0, "reward/P": -1.0, "kl_mean": 99.0, "kl_seq_max": 99.0, "entropy": 99.0, "truncation_rate": 1.0}
    assert _feed(off, [HEALTHY] * 5 + [crazy] * 5) == [] and off.observe_eval(10, 0.0, 1.0) is None
    with pytest.raises(ValueError):
        CollapseGuard(entropy_factor=1.0)


def test_collapse_guard_evaluation_against_the_best_and_recoveries_then_stop():
    guard = CollapseGuard(eval_drop=0.05, max_recoveries=1)
    assert guard.observe_eval(10, 0.56, best=0.60) is None  # within 0.05 of the best
    ev = guard.observe_eval(20, 0.54, best=0.60)
    assert (ev.action, ev.signal, ev.reference, ev.bound) == ("recover", "eval", 0.60, pytest.approx(0.55))
    assert "the best so far 0.6" in ev.message
    stop = guard.observe_eval(30, 0.50, best=0.60)
    assert stop.action == "stop" and "guard_eval_drop" in stop.message and "1/1 recoveries" in stop.message


def test_collapse_guard_evaluation_judges_a_drop_against_its_paired_noise():
    """A change inside 2 paired standard errors is the evaluation's noise, not a drop; the same
    change measured on more rows (a smaller standard error) is one. guard_eval_drop stays the least drop."""
    guard = CollapseGuard(eval_drop=0.02)
    assert guard.observe_eval(10, 0.70, best=0.73, se=0.02) is None  # 0.03 < 2 x 0.02: 100 noisy rows
    ev = guard.observe_eval(10, 0.70, best=0.73, se=0.005)  # 0.03 > 2 x 0.005: 1,000 steady rows
    assert ev is not None and ev.bound == pytest.approx(0.71) and ev.noise == 0.005
    assert "(the best so far 0.73; paired standard error 0.005)" in ev.message
    assert guard.observe_eval(20, 0.715, best=0.73, se=0.0) is None  # below the least drop, however certain
    assert guard.observe_eval(20, 0.70, best=0.73, se=float("nan")) is not None  # unknown noise: the fixed bound


def test_collapse_guard_phase_reset_and_state_round_trip():
    a = CollapseGuard(patience=2)
    _feed(a, [HEALTHY] * 4 + [{**HEALTHY, "valid/P": 0.2}])
    b = CollapseGuard(patience=2)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    rest = [{**HEALTHY, "valid/P": 0.2}, HEALTHY, {**HEALTHY, "kl_mean": 3.0}, {**HEALTHY, "kl_mean": 3.0}]
    ea, eb = _feed(a, rest, 6), _feed(b, rest, 6)
    assert [(s, e.record()) for s, e in ea] == [(s, e.record()) for s, e in eb] and len(ea) == 2
    a.reset_history()
    assert a.history == {} and a.streaks == {} and a.recoveries == 2  # the counts survive a phase change


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
        for p, q in zip(a.parameters(), b.parameters(), strict=True):
            q.grad = p.grad.clone()
        opt.step()
        plain.step()
    start = _gpt2()
    moved = max((p - q).abs().max().item() for p, q in zip(a.parameters(), start.parameters(), strict=True))
    assert moved > 1e-2  # the steps did something, so agreeing below is not vacuous
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
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


# -- a collapse, a hard batch and a certain answer are three different things ------------------------------

PER_TASK = {**{k: v for k, v in HEALTHY.items() if k != "entropy"}, "entropy/P": 0.5, "entropy/A": 0.3,
            "reward_se/P": 0.02, "reward_se/A": 0.02}


def test_a_deterministic_task_growing_certain_is_not_a_collapse_but_certainty_with_falling_reward_is():
    """A:'s entropy falling tenfold while its reward holds or rises is what a deterministic task
    should do: no event. The same fall with the reward falling too fires, naming entropy/A; a rise
    fires whatever the reward does; entropy/P is judged apart from entropy/A."""
    guard = CollapseGuard(patience=2)
    certain = [{**PER_TASK, "entropy/A": 0.3 * 0.5 ** i, "reward/A": min(0.99, 0.8 + 0.02 * i)} for i in range(12)]
    assert _feed(guard, certain) == []
    guard = CollapseGuard(patience=2)
    _feed(guard, [PER_TASK] * 5)
    (step, ev), = _feed(guard, [{**PER_TASK, "entropy/A": 0.03, "reward/A": 0.7}] * 2, start=6)
    assert step == 7 and ev.signal == "entropy/A" and ev.bound == pytest.approx(0.3 / 2.0)
    guard = CollapseGuard(patience=2)
    _feed(guard, [PER_TASK] * 5)
    (_, ev), = _feed(guard, [{**PER_TASK, "entropy/P": 1.5, "reward/P": 0.9}] * 2, start=6)
    assert ev.signal == "entropy/P" and ev.bound == pytest.approx(0.5 * 2.0)
    # with per-task entropies in the record, the all-task `entropy` (a mix of both) is not judged
    guard = CollapseGuard(patience=1)
    assert _feed(guard, [{**PER_TASK, "entropy": 0.5}] * 4 + [{**PER_TASK, "entropy": 0.01}] * 3) == []


def test_a_batch_of_hard_prompts_is_not_a_collapse_but_a_reward_fall_on_every_prompt_is():
    """Rewards swing with the prompts drawn. A batch whose mean is 0.24 below the usual, with group
    means spread so that its standard error is 0.11 (8 prompts between 0 and 0.9), is inside three
    standard errors: no event, for as long as such batches come. The same fall with every group
    low (standard error 0.02) is a collapse and fires; so does a fall far beyond the noise."""
    from rookworld_rlvr.grpo.runlog import prompt_noise

    group_means = [0.1, 0.0, 0.9, 0.2, 0.0, 0.1, 0.5, 0.3]
    rewards = [m for m in group_means for _ in range(8)]
    se = prompt_noise(rewards, 8)
    assert se == pytest.approx(statistics.stdev(group_means) / math.sqrt(8))
    assert 0.10 < se < 0.12 and prompt_noise([0.5] * 64, 8) == 0.0 and prompt_noise([0.3] * 8, 8) == 0.0
    usual = {**PER_TASK, "reward/P": 0.42}
    guard = CollapseGuard(patience=2)
    _feed(guard, [usual] * 6)
    assert _feed(guard, [{**usual, "reward/P": 0.18, "reward_se/P": se}] * 4, start=7) == []
    guard = CollapseGuard(patience=2)
    _feed(guard, [usual] * 6)
    (_, ev), = _feed(guard, [{**usual, "reward/P": 0.18, "reward_se/P": 0.02}] * 2, start=7)
    assert ev.signal == "reward/P" and ev.bound == pytest.approx(0.42 - 0.2)
    guard = CollapseGuard(patience=2)
    _feed(guard, [usual] * 6)
    (_, ev), = _feed(guard, [{**usual, "reward/P": -0.3, "reward_se/P": se}] * 2, start=7)
    assert ev.signal == "reward/P" and ev.bound == pytest.approx(0.42 - 3 * se)
