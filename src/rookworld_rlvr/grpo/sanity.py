"""Two sanity tools that catch silent GRPO failures before a long run does.

`check_batch`: one batch with the configured model and data; prints what a person debugging
a run looks at first and fails loudly when something is off (KL not 0 at step 0, every
reward equal, NaN, most completions truncated).

`overfit`: the overfit-one-batch test: train repeatedly on one fixed batch and judge it by
the greedy reward on that batch. If this does not rise, a long run will not either.

Owns these checks; they drive a `Trainer` through its own steps. Imports torch and the model
package; nothing of chess.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from contextlib import nullcontext

from rookworld_rlvr.grpo.loss import kl_k3, zero_variance_groups
from rookworld_rlvr.grpo.passes import task_slices
from rookworld_rlvr.model import generate, tf32_in_effect


def _stats(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"mean {statistics.mean(xs):+.3f}  min {min(xs):+.3f}  max {max(xs):+.3f}"


def _kl_ratio(trainer, batch) -> tuple[float, float, float]:
    """(mean k3 KL to the reference, max |ratio - 1| against the sampler, mean ratio), from the
    trainer's own no-grad passes: each task's sampling temperature, the run's autocast, its packing."""
    cfg = trainer.cfg
    passes = trainer.passes(0)
    slices = task_slices(batch.rows, cfg.group_size, cfg.minibatch_size)
    mask = batch.completion_mask.bool()

    def logprobs(model, context, device) -> torch.Tensor:
        return torch.cat([part["logprobs"] for part in passes.frozen(model, context, batch, slices, device)])

    pol = logprobs(trainer.forward_model, nullcontext(), trainer.device)
    kl = float("nan")  # not measured without a reference (beta 0, no threshold)
    if trainer.use_ref:
        kl = float(kl_k3(pol, logprobs(*trainer.reference(), trainer.ref_device))[mask].mean())
    ratio = torch.exp(pol - batch.sampler_logp)[mask]
    return kl, float((ratio - 1).abs().max()), float(ratio.mean())


def product_bits(trainer) -> int | None:
    """Significant bits the run's matrix products keep: 8 under bf16 autocast, 11 for float32 in TF32 (on
    CUDA, unless the process chose IEEE float32), None in IEEE float32."""
    if trainer.amp is not None:
        return 8
    return 11 if tf32_in_effect(trainer.device) else None


def ratio_tolerance(trainer, batch, bits: int | None) -> float:
    """How far max |ratio - 1| of the sampled tokens may be from 0 when sampler and trainer are both
    right. In IEEE float32 only the summation order differs (1e-4). With rounded products (bf16
    autocast, or TF32) the sampler's decode step and the trainer's one forward round at different
    places: each layer's products err by up to 2^-bits relative (`bits`: `product_bits`), so a logit z carries
    up to n_layer * 2^-bits * |z| and a log-prob (z_t - logsumexp z) twice that of the largest logit.
    That largest |z| is read from the trainer's logits of the first group (one no-grad pass of G rows)."""
    if bits is None:
        return 1e-4
    group = slice(0, trainer.cfg.group_size)
    with torch.no_grad():
        logits = trainer.passes(0).logprobs(trainer.forward_model, batch, group, trainer.device, want_logits=True)["logits"]
    top = float(logits[batch.completion_mask[group].bool().to(logits.device)].abs().max())
    return math.expm1(2 * trainer.policy.config.n_layer * 2.0**-bits * top)


def check_batch(trainer, max_truncation: float = 0.5, out=print) -> int:
    """Collect one batch, print diagnostics, take one step. Returns 0 when healthy, 1 otherwise."""
    problems: list[str] = []
    t0 = time.time()
    timings: dict[str, float] = {}
    groups = trainer.collect(0, timings)
    batch = trainer.assemble(groups)
    out(f"collected {len(batch.rows)} completions in {time.time() - t0:.1f}s "
        f"(generate {timings.get('generate', 0):.1f}s, score {timings.get('score', 0):.1f}s)")
    for task in ("P", "A"):
        rows = [r for r in batch.rows if r.task == task]
        if not rows:
            continue
        parse = sum(r.valid for r in rows) / len(rows)
        trunc = sum(r.finish == "length" for r in rows) / len(rows)
        out(f"{task}: {len(rows)} completions, {parse:.0%} parse, {trunc:.0%} truncated without EOS")
        out(f"   reward  {_stats([r.reward for r in rows])}")
        for comp in rows[0].components:
            out(f"   {comp:<11} {_stats([r.components.get(comp, 0.0) for r in rows])}")
        if trunc > max_truncation:
            problems.append(f"{task}: {trunc:.0%} of completions truncated (> {max_truncation:.0%}): raise max_new_tokens "
                            "or check that the model emits its stop token")
        out(f"   example: {rows[0].prompt!r} -> {rows[0].text!r} (reward {rows[0].reward:+.3f})")
    flat = int(zero_variance_groups(batch.rewards, trainer.cfg.group_size).sum())
    n_groups = len(batch.rows) // trainer.cfg.group_size
    out(f"zero-variance groups: {flat} of {n_groups}")
    if float(batch.rewards.max() - batch.rewards.min()) < 1e-8:
        problems.append("every reward in the batch is equal: no learning signal (check the base model and the reward)")
    kl0, ratio_dev, ratio_mean = _kl_ratio(trainer, batch)
    bits = product_bits(trainer)
    tol, rounded = ratio_tolerance(trainer, batch, bits), {8: "bf16", 11: "TF32"}.get(bits)
    out(f"before the update: KL {kl0:.2e} (must be 0), ratio {ratio_mean:.6f} (max |ratio-1| {ratio_dev:.1e}, "
        f"must be <= {tol:.1e}{f' ({rounded} rounding)' if rounded else ''})")
    if math.isfinite(kl0) and abs(kl0) > 1e-6:
        problems.append(f"KL to the reference is {kl0:.2e} before any update (policy and reference differ)")
    if ratio_dev > tol:
        problems.append(f"sampler and trainer disagree on log-probs (max |ratio-1| = {ratio_dev:.2e} > {tol:.1e}, "
                        f"{f'{rounded} rounding' if rounded else 'float32'}): padding, positions, temperature "
                        "or dropout")
    m = trainer.update(batch, 0, timings)
    kl1, _, _ = _kl_ratio(trainer, batch)
    out(f"one step: loss {m.get('loss', float('nan')):+.4f}, grad norm {m.get('grad_norm', float('nan')):.4f}, "
        f"KL after {kl1:.2e}, clip fraction {m.get('clip_frac', 0):.3f}")
    if not all(math.isfinite(x) for x in (m.get("loss", float("nan")), m.get("grad_norm", float("nan")))):
        problems.append("non-finite loss or gradient norm on the first step")
    for p in problems:
        out(f"FAIL: {p}")
    out("check-batch: ok" if not problems else f"check-batch: {len(problems)} problem(s)")
    return 0 if not problems else 1


def _greedy_reward(trainer, samples) -> float:
    prompts = [s.render(trainer.cfg.layout)[0] for s in samples]
    by_task: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_task.setdefault(s.task, []).append(i)
    total = 0.0
    for task, idx in by_task.items():
        mx = trainer.cfg.sampling_for(task, 0)["max_new_tokens"]
        g = generate(trainer.sampler(), trainer.tokenizer, [prompts[i] for i in idx], max_new_tokens=mx, greedy=True,
                     autocast_dtype=trainer.amp)
        res = trainer.reward_fn([prompts[i] for i in idx], g.texts, [samples[i].truth for i in idx], {})
        total += sum(r.total for r in res)
    return total / len(samples)


def _slope(ys: list[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    xm, ym = (n - 1) / 2, statistics.mean(ys)
    return sum((i - xm) * (y - ym) for i, y in enumerate(ys)) / sum((i - xm) ** 2 for i in range(n))


def overfit(trainer, steps: int, window: int = 20, max_kl_share: float = 0.7, max_grad_norm: float = 1e3,
            eval_every: int = 2, out=print) -> int:
    """Train on one fixed batch; pass when the moving average of greedy reward rises."""
    cfg = trainer.cfg
    counts = cfg.task_counts(0)
    fixed = {task: trainer.prompts.take(task, n) for task, n in counts.items()}
    trainer.prompts.take = lambda task, n: fixed[task][:n]  # the same batch every step
    samples = fixed["P"] + fixed["A"]
    t0 = time.time()
    greedy = [(0, _greedy_reward(trainer, samples))]
    out(f"step 0: greedy reward {greedy[0][1]:+.4f}")
    kl_shares, grad_norms = [], []
    for step in range(steps):
        timings: dict[str, float] = {}
        batch = trainer.assemble(trainer.collect(step, timings))
        m = trainer.update(batch, step, timings)
        trainer.step = step + 1
        kl_shares.append(m.get("kl_share", 0.0))
        grad_norms.append(m.get("grad_norm", float("nan")))
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            greedy.append((step + 1, _greedy_reward(trainer, samples)))
            out(f"step {step + 1}: greedy reward {greedy[-1][1]:+.4f}, sampled {float(batch.rewards.mean()):+.4f}, "
                f"KL {m.get('kl_mean', 0):.4f}, KL share {m.get('kl_share', 0):.2f}, grad norm {m.get('grad_norm', 0):.3f}")
    ys = [g for _, g in greedy]
    w = max(1, min(window // eval_every, len(ys) // 2))
    moving = [statistics.mean(ys[max(0, i - w + 1): i + 1]) for i in range(len(ys))]
    slope = _slope(moving) / eval_every
    finite = all(math.isfinite(g) for g in grad_norms)
    checks = [
        (f"{window}-step moving average of greedy reward rises: slope {slope:+.5f}/step "
         f"({moving[0]:+.4f} -> {moving[-1]:+.4f})", slope > 0),
        (f"KL share of the loss stays <= {max_kl_share:.0%}: max {max(kl_shares):.0%}", max(kl_shares) <= max_kl_share),
        (f"grad norms finite and <= {max_grad_norm:g}: max {max(grad_norms):.3f}", finite and max(grad_norms) <= max_grad_norm),
    ]
    out(f"overfit: {steps} steps in {(time.time() - t0) / 60:.1f} min; greedy reward {ys[0]:+.4f} -> {ys[-1]:+.4f}")
    for text, ok in checks:
        out(f"{'PASS' if ok else 'FAIL'}: {text}")
    return 0 if all(ok for _, ok in checks) else 1
