"""No option without an effect: every config field, set away from its default (or from the test's
base), changes the update, the samples, the logs or the files as its help text says.

One table, one row per field (a field with several modes has a row per mode); the last test
checks the table covers every field of TrainConfig. Real components: a tiny GPT-2, the real
trainer, real files; a dense toy reward where the field is not about rewards, the real scorer
(and Stockfish) where it is; monkeypatch only injects the non-finite losses the NaN guard needs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from test_trainer import _Result, varied_reward

from rookworld_rlvr.config import FIELDS, TrainConfig, load_config
from rookworld_rlvr.data.io import DataError, read_samples
from rookworld_rlvr.grpo.state import save
from rookworld_rlvr.grpo.passes import task_slices
from rookworld_rlvr.grpo.prompts import ends_game
from rookworld_rlvr.grpo.runlog import banner
from rookworld_rlvr.grpo.trainer import Trainer, TrainingStopped
from rookworld_rlvr.tasks.strength import in_check

BASE = dict(eval_data="", strength_data=None, puzzle_eval_data=None, history_eval_data=None, steps=2, batch_positions=2, group_size=4, max_new_tokens=16, lr=1e-3, warmup_steps=0,
            save_every=100, tensorboard=False, progress=False, report=False, seed=1, engine_cache=None, device="cpu",
            backward_dtype="float32", mix_env_ratio=0.5)


def flat_on_p(prompts, completions, truths, weights):
    """P: groups all equal (no signal), A: groups varied: work for dynamic sampling."""
    return [r if p.startswith("A") else _Result(0.0) for p, r in zip(prompts, varied_reward(prompts, completions,
                                                                                                 truths, weights))]


class _Scored:
    def __init__(self, total, components):
        self.total, self.components, self.valid_format = total, components, True


def quality_only(prompts, completions, truths, weights):
    """P: rows all legal, of one total (a flat group) but of different quality; A: rows varied."""
    out = varied_reward(prompts, completions, truths, weights)
    return [r if p.startswith("A") else _Scored(0.5, {"best_legal": 1.0, "quality": r.total})
            for p, r in zip(prompts, out)]


def _p_advantages(env: "Env", over: dict) -> list[float]:
    tr = env.trainer(over, quality_only)
    batch = tr.assemble(tr.collect(0, {}))
    return [a for r, a in zip(batch.rows, batch.advantages.tolist()) if r.task == "P"]


@dataclass
class Env:
    tmp: Path
    model: Path
    data: Path
    other_model: Path
    n: int = 0
    cache: dict = field(default_factory=dict)

    def config(self, over: dict) -> TrainConfig:
        self.n += 1
        fields = {"model": str(self.model), "data": str(self.data / "train.jsonl"),
                  "output_dir": str(self.tmp / f"run{self.n}"), **BASE, **over}
        return load_config(None, fields)

    def trainer(self, over: dict, reward=varied_reward, eval_fn=None) -> Trainer:
        cfg = self.config(over)
        return Trainer(cfg, reward, read_samples(cfg.data), eval_fn, log=lambda *_: None)


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_model_dir, small_data, one_thread):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookworld_rlvr.model import save_pretrained_atomic

    tmp = tmp_path_factory.mktemp("options")
    torch.manual_seed(1)  # the same architecture, other weights
    other = AutoModelForCausalLM.from_config(AutoModelForCausalLM.from_pretrained(tiny_model_dir).config)
    save_pretrained_atomic(other, AutoTokenizer.from_pretrained(tiny_model_dir), tmp / "other_model")
    return Env(tmp, tiny_model_dir, small_data, tmp / "other_model")


# -- probes: what a run of one configuration shows ----------------------------------------------------------
def _flat(tr) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in tr.sampler().parameters()])


def collect(env: Env, over: dict, reward=varied_reward) -> dict:
    tr = env.trainer(over, reward)
    groups = tr.collect(0, {})
    rows = [r for g in groups for r in g]
    return {"tr": tr, "groups": groups, "rows": rows, "texts": [r.text for r in rows],
            "prompts": [r.prompt for r in rows], "tasks": [g[0].task for g in groups],
            "logp": [r.sampler_logp for r in rows]}


def steps(env: Env, over: dict, n: int = 1, reward=varied_reward, start: int = 0) -> dict:
    """n train steps (from step `start`: the LR schedule reads it); records, weights, last gradients."""
    tr = env.trainer(over, reward)
    tr.step = start
    records = [tr.train_step() for _ in range(n)]
    grads = torch.cat([p.grad.flatten() for p in tr.policy.parameters() if p.grad is not None])
    return {"tr": tr, "records": records, "last": records[-1], "weights": _flat(tr), "grads": grads}


def train(env: Env, over: dict, eval_fn=None, capsys=None) -> dict:
    tr = env.trainer(over, eval_fn=eval_fn)
    tr.train()
    run = Path(tr.cfg.output_dir)
    lines = lambda name: [json.loads(x) for x in (run / name).read_text().splitlines()] if (run / name).exists() else []  # noqa: E731
    return {"tr": tr, "run": run, "metrics": lines("metrics.jsonl"), "evals": lines("eval.jsonl"),
            "checkpoints": sorted(p.name for p in (run / "checkpoints").iterdir())}


def nan_step(env: Env, over: dict) -> dict:
    """One step whose loss is NaN (injected into the policy's log-probs): skip, roll back or stop."""
    import rookworld_rlvr.grpo.passes as passes_mod

    tr = env.trainer({"save_every": 1, **over})
    save(tr)
    real = passes_mod.token_logprobs

    def faulty(model, *a, **k):
        out = real(model, *a, **k)
        if torch.is_grad_enabled():
            out["logprobs"] = out["logprobs"] * float("nan")
        return out

    passes_mod.token_logprobs = faulty
    stopped = None
    try:
        tr.train_step()
    except TrainingStopped as e:
        stopped = str(e)
    finally:
        passes_mod.token_logprobs = real
    return {"guard": tr.nan_guard.state_dict(), "lr_scale": tr.lr_scale, "stopped": stopped}


def rewards(env: Env, over: dict) -> list[float]:
    """The real scorer that `rookworld train` builds from this configuration, on fixed completions:
    a P: answer with the true best move and wrong evals, one with a legal non-best move, garbage,
    an A: answer with a wrong FEN, and a right one."""
    from rookworld_rlvr.grpo.cli import build

    cfg = env.config({"mix_env_ratio": 0.5, **over})
    tr, pool = build(cfg, log=lambda *_: None)
    try:
        samples = read_samples(cfg.data)
        p = next(s for s in samples if s.task == "P" and len(s.truth.moves) >= 3)
        a = next(s for s in samples if s.task == "A" and not ends_game(s))
        (pp, pc), (ap, ac) = p.render(cfg.layout), a.render(cfg.layout)
        fields = ac.split("+")
        side = " b " if " w " in fields[0] else " w "
        wrong_fen = "+".join([fields[0].replace(" w ", side).replace(" b ", side)] + fields[1:])  # readable, wrong
        evals_off = pc.replace("E:", "E: 9.9", 1)
        other = pc.rsplit("B:", 1)[0] + "B: " + next(m for m in p.truth.moves if m != p.truth.best)
        completions = [evals_off, other, "garbage", wrong_fen, ac]
        prompts = [pp, pp, pp, ap, ap]
        truths = [p.truth, p.truth, p.truth, a.truth, a.truth]
        weights = {"P": tr.curriculum.weights("P", 0, cfg.policy_weights),
                   "A": tr.curriculum.weights("A", 0, cfg.env_weights)}
        return [r.total for r in tr.reward_fn(prompts, completions, truths, weights)]
    finally:
        pool.close()


def differ(a: torch.Tensor | list, b: torch.Tensor | list) -> bool:
    if isinstance(a, list):
        return a != b
    return a.shape != b.shape or not torch.equal(a, b)


# The collapse guard's bounds: the same records, fed to the guard the trainer built, fire only with
# the bound moved from its default (H: a healthy step's record).
H = {"valid/P": 1.0, "reward/P": 0.55, "kl_mean": 0.02, "kl_seq_max": 0.3, "entropy": 0.5, "truncation_rate": 0.0}
GUARD_STREAMS = [
    ("guard_valid_drop", 0.05, [H] * 4 + [{**H, "valid/P": 0.9}] * 2),
    ("guard_reward_drop", 0.05, [H] * 4 + [{**H, "reward/P": 0.45}] * 2),
    ("guard_kl_mean", 0.01, [H] * 2),
    ("guard_kl_max", 0.1, [H] * 2),
    ("guard_entropy_factor", 1.5, [H] * 4 + [{**H, "entropy": 0.9}] * 2),
    ("guard_truncation_rise", 0.05, [H] * 4 + [{**H, "truncation_rate": 0.1}] * 2),
    ("guard_patience", 1, [H] * 4 + [{**H, "kl_mean": 9.0}, H]),
    # the median of the last 3 accepted rewards (0.45) is 0.25 above 0.2; that of the last 10 (0.3) is not
    ("guard_window", 3, [{**H, "reward/P": 0.3}] * 7 + [{**H, "reward/P": 0.45}] * 3 + [{**H, "reward/P": 0.2}] * 2),
]


def _guard_events(env: Env, over: dict, stream: list[dict]) -> list[tuple[int, str, str]]:
    guard = env.trainer(over).guard
    return [(i + 1, e.action, e.signal) for i, rec in enumerate(stream) if (e := guard.observe(i + 1, rec))]


def _recovered(env: Env, over: dict) -> Trainer:
    tr = env.trainer({"steps": 4, **over})
    save(tr)
    try:
        for _ in range(3):
            tr.train_step()
    except TrainingStopped:
        pass
    return tr


# -- the table ---------------------------------------------------------------------------------------------
@dataclass
class Row:
    field: str
    over: dict
    probe: Callable[..., Any]  # (env, overrides) -> observation; cached per base
    check: Callable[[Any, Any], bool]  # (base observation, this observation) -> the documented effect is there
    base: dict = field(default_factory=dict)  # settings both runs share (e.g. updates_per_batch 2 for clips)
    id: str = ""

    def key(self) -> str:
        return self.id or f"{self.field}={json.dumps(self.over.get(self.field), default=str)}"


def P(fn, **kw):
    """A probe with fixed keyword arguments, comparable for caching."""
    def probe(env, over):
        return fn(env, over, **kw)
    probe.name = f"{fn.__qualname__}@{id(fn)}{sorted(kw.items(), key=str)}"  # lambdas differ by id
    return probe


STEP, STEP2, COLLECT = P(steps), P(steps, n=2), P(collect)
MU2 = {"updates_per_batch": 2}
ADAPTIVE = {"kl_mode": "adaptive"}
lens = lambda o, task=None: [len(r.completion_ids) for r in o["rows"] if task in (None, r.task)]  # noqa: E731
last = lambda o, k: o["last"].get(k)  # noqa: E731


def _cuda_or_error(field_name):
    def probe(env, over):
        try:
            return env.trainer(over)
        except ValueError as e:
            return e
    probe.name = f"device:{field_name}"

    def check(_, got):
        if torch.cuda.is_available():
            tr = got
            return (tr.device if field_name == "device" else tr.ref_device).type == "cuda"
        return isinstance(got, ValueError) and "CUDA is not available" in str(got)
    return probe, check


def _built_collect(env: Env, over: dict) -> list:
    """The truths of one collected batch of the trainer `rookworld train` builds (puzzles included)."""
    from rookworld_rlvr.grpo.cli import build

    try:
        tr, pool = build(env.config(over), log=lambda *_: None)
    except ValueError as e:
        return e
    try:
        return [type(r.truth).__name__ for g in tr.collect(0, {}) for r in g]
    finally:
        pool.close()


ROWS = [
    # -- model ---------------------------------------------------------------------------------------------
    Row("model", {"model": "OTHER"}, COLLECT, lambda b, o: differ(b["logp"], o["logp"])),
    Row("device", {"device": "cuda"}, *_cuda_or_error("device")),
    Row("ref_device", {"ref_device": "cuda"}, *_cuda_or_error("ref_device")),
    Row("autocast", {"autocast": "bf16", "backward_dtype": "auto"}, COLLECT,
        lambda b, o: o["tr"].amp == torch.bfloat16 and differ(b["logp"], o["logp"])),
    Row("backward_dtype", {"backward_dtype": "bf16"}, STEP,
        lambda b, o: differ(b["grads"], o["grads"]) and (b["grads"] - o["grads"]).norm() < 1e-2 * b["grads"].norm()),
    Row("record_rollout", {"record_rollout": "always"}, COLLECT,
        lambda b, o: all(r.recorded is not None for r in o["rows"]) and all(r.recorded is None for r in b["rows"])),
    Row("decode_graph", {"decode_graph": True}, P(lambda env, over: env.trainer(over).graph_note),
        lambda b, o: b.startswith("eager") and o.startswith("shape-stable")),  # same samples: test_trainer.py
    Row("threads", {"threads": "NTHREADS"}, P(lambda env, over: _threads(env, over)), lambda b, o: o == b + 1),
    # two ranks, one 1.5 s late at a step's collective (the waits for rank 0: test_distributed.py)
    Row("step_timeout_minutes", {"step_timeout_minutes": 0.01}, P(lambda env, over: _late_rank(env, over)),
        lambda b, o: b == [0.0, 1.0] and o.startswith("error")),
    # -- data ----------------------------------------------------------------------------------------------
    Row("data", {"data": "EVALFILE"}, COLLECT, lambda b, o: set(b["prompts"]).isdisjoint(o["prompts"])),
    Row("anchor_data", {"anchor_data": "EVALFILE"}, P(lambda env, over: _anchor_prompts(env, over)),
        lambda b, o: o[1] <= o[0] and b[1] <= b[0] and b[1].isdisjoint(o[1]),  # from the training data, or its file
        base={"anchor_coef": 1.0, "anchor_batch": 4, "mix_env_ratio": 0.0}),
    Row("anchor_positions", {"anchor_positions": "out_of_check"}, P(lambda env, over: _anchor_checks(env, over)),
        lambda b, o: b[0] > 0 and o[0] == 0 and o[1] == b[1],  # every P: answer out of check, and only those
        base={"anchor_coef": 1.0, "anchor_batch": 4, "anchor_tasks": "P", "mix_env_ratio": 0.0}),
    Row("eval_data", {"eval_data": "EVALFILE"}, P(lambda env, over: _evaluate(env, over)),
        lambda b, o: b is None and o["policy"]["n"] > 0),
    Row("eval_limit", {"eval_limit": 1}, P(lambda env, over: _evaluate(env, over)),
        lambda b, o: (o["policy"]["n"], o["environment"]["n"]) == (1, 1) and b["policy"]["n"] == 2,
        base={"eval_data": "EVALFILE", "eval_limit": 2}),
    # the held-out prompts decoded one at a time instead of 64 at once: the same answers, item for item
    Row("eval_batch_size", {"eval_batch_size": 1}, P(lambda env, over: _evaluate(env, over)),
        lambda b, o: (b["meta"]["config"]["batch_size"], o["meta"]["config"]["batch_size"]) == (64, 1)
        and all(b[t][k] == o[t][k] and len(b[t][k]) == 2 for t in ("policy", "environment") for k in b[t]
                if k.endswith("_items")) and any(k.endswith("_items") for k in b["environment"]),
        base={"eval_data": "EVALFILE", "eval_limit": 2}),
    # the base's evaluation of a second run from the same weights: its answers read back, the same results
    Row("eval_cache", {"eval_cache": "CACHEDIR"}, P(lambda env, over: _evaluate_twice(env, over)),
        lambda b, o: not b[1] and o[1] == [f"held-out evaluation at step 0: {o[2]} batches of answers read from the "
                                          f"evaluation cache {o[3]}"] and o[2] > 0 and b[0] == o[0],
        base={"eval_data": "EVALFILE", "eval_limit": 2}),
    Row("strength_data", {"strength_data": "JUDGEDFILE"}, P(lambda env, over: _evaluate(env, over)),
        lambda b, o: "strength" not in b and o["strength"]["n"] == 2 and "random" in o["strength"],
        base={"eval_data": "EVALFILE", "eval_limit": 1}),
    Row("puzzle_eval_data", {"puzzle_eval_data": "PUZZLEFILE"}, P(lambda env, over: _evaluate(env, over)),
        lambda b, o: "puzzles" not in b and o["puzzles"]["mate1"]["n"] == 1,
        base={"eval_data": "EVALFILE", "eval_limit": 1}),
    Row("history_eval_data", {"history_eval_data": "HISTFILE"}, P(lambda env, over: _evaluate(env, over)),
        lambda b, o: "histories" not in b and o["histories"]["n"] == 3
        and o["histories"]["slices"]["history_1"]["n"] == 3, base={"eval_data": "EVALFILE", "eval_limit": 1}),
    Row("puzzle_data", {"puzzle_data": "PUZZLEFILE"}, P(_built_collect),
        lambda b, o: isinstance(b, ValueError) and "no training puzzles" in str(b) and "Puzzle" in o,
        base={"mix_puzzle_ratio": 0.5, "puzzle_data": "EMPTYPUZZLES", "mix_env_ratio": 0.0}),
    Row("mix_puzzle_ratio", {"mix_puzzle_ratio": 0.5}, P(_built_collect),
        lambda b, o: "Puzzle" not in b and o.count("Puzzle") == o.count("PolicyTruth"),
        base={"puzzle_data": "PUZZLEFILE", "mix_env_ratio": 0.0}),
    Row("skip_invalid", {"skip_invalid": True}, P(lambda env, over: _build(env, over)),
        lambda b, o: isinstance(b, DataError) and o == "built", base={"data": "BADFILE"}),
    Row("layout", {"layout": "padded"}, COLLECT,
        lambda b, o: [p for p, t in zip(b["prompts"], b["rows"]) if t.task == "P"] !=
                     [p for p, t in zip(o["prompts"], o["rows"]) if t.task == "P"]),
    Row("mix_env_ratio", {"mix_env_ratio": 1.0}, COLLECT, lambda b, o: set(b["tasks"]) == {"P", "A"} and set(o["tasks"]) == {"A"}),
    Row("env_terminal_share", {"env_terminal_share": 1.0}, COLLECT,
        lambda b, o: all(ends_game(g[0]) for g in o["groups"]) and not all(ends_game(g[0]) for g in b["groups"]),
        base={"mix_env_ratio": 1.0, "batch_positions": 4}),
    Row("check_share", {"check_share": 1.0}, COLLECT,
        lambda b, o: all(in_check(g[0].truth.fen) for g in o["groups"])
        and not all(in_check(g[0].truth.fen) for g in b["groups"]),
        base={"mix_env_ratio": 0.0, "batch_positions": 4}),
    # -- batch and sampling --------------------------------------------------------------------------------
    Row("steps", {"steps": 3}, P(lambda env, over: len(train(env, over)["metrics"])), lambda b, o: (b, o) == (2, 3)),
    Row("max_minutes", {"max_minutes": 1e-4}, P(lambda env, over: len(train(env, over)["metrics"])),  # 6 ms: one step
        lambda b, o: (b, o) == (2, 1)),
    Row("batch_positions", {"batch_positions": 4}, COLLECT, lambda b, o: (len(b["groups"]), len(o["groups"])) == (2, 4)),
    Row("group_size", {"group_size": 2}, COLLECT, lambda b, o: {len(g) for g in o["groups"]} == {2}),
    Row("temperature", {"temperature": 0.5}, COLLECT, lambda b, o: differ(b["logp"], o["logp"])),
    Row("top_p", {"top_p": 0.3}, COLLECT, lambda b, o: b["texts"] != o["texts"]),
    Row("top_k", {"top_k": 2}, COLLECT, lambda b, o: b["texts"] != o["texts"]),
    Row("max_new_tokens", {"max_new_tokens": 3}, COLLECT, lambda b, o: max(lens(o)) == 3 < max(lens(b))),
    Row("task_sampling", {"task_sampling": {"P": {"max_new_tokens": 3}}}, COLLECT,
        lambda b, o: max(lens(o, "P")) == 3 < max(lens(o, "A"))),
    Row("phases", {"phases": [{"start": 0, "mix_env_ratio": 1.0}]}, COLLECT, lambda b, o: set(o["tasks"]) == {"A"}),
    # -- optimisation --------------------------------------------------------------------------------------
    Row("lr", {"lr": 1e-2}, STEP, lambda b, o: last(o, "lr") == 1e-2 and differ(b["weights"], o["weights"])),
    Row("warmup_steps", {"warmup_steps": 4}, STEP, lambda b, o: last(o, "lr") == pytest.approx(last(b, "lr") / 4)),
    Row("min_lr_ratio", {"min_lr_ratio": 0.5}, P(steps, start=1),
        lambda b, o: last(o, "lr") == pytest.approx(1e-3 * 0.75) and last(b, "lr") == pytest.approx(1e-3 * 0.55)),
    Row("weight_decay", {"weight_decay": 0.5}, STEP, lambda b, o: differ(b["weights"], o["weights"])),
    Row("grad_clip", {"grad_clip": 1e-4}, STEP,
        lambda b, o: o["grads"].norm() <= 1e-4 * (1 + 1e-5) < b["grads"].norm()),  # float32 norm rounding
    Row("updates_per_batch", {"updates_per_batch": 2}, STEP, lambda b, o: "last_loss" in o["last"] and "last_loss" not in b["last"]),
    Row("minibatch_size", {"minibatch_size": 4}, STEP,  # the same update in 4 passes of 1 group instead of 2 of 2
        lambda b, o: [len(task_slices(t.assemble(t.collect(1, {})).rows, t.cfg.group_size, t.cfg.minibatch_size))
                      for t in (b["tr"], o["tr"])] == [2, 4]
                     and torch.allclose(b["grads"], o["grads"], rtol=1e-4, atol=1e-6), base={"batch_positions": 4}),
    # -- LoRA ----------------------------------------------------------------------------------------------
    Row("lora_r", {"lora_r": 4}, P(lambda env, over: env.trainer(over)), lambda b, o: o.n_trainable < b.n_trainable),
    Row("lora_alpha", {"lora_alpha": 64.0}, STEP, lambda b, o: differ(b["weights"], o["weights"]), base={"lora_r": 4}),
    Row("lora_targets", {"lora_targets": "c_attn"}, P(lambda env, over: env.trainer(over)),
        lambda b, o: o.n_trainable < b.n_trainable, base={"lora_r": 4}),
    # -- loss ----------------------------------------------------------------------------------------------
    # (where every completion runs to its limit, dr_grpo's budget is each row's length: the check needs one that stops)
    *[Row("loss_type", {"loss_type": t}, STEP,
          lambda b, o: last(o, "loss") != last(b, "loss") and last(b, "truncation_rate") < 1,
          base={"max_new_tokens": 48}) for t in ("bnpo", "dr_grpo", "dapo")],
    Row("importance_sampling_level", {"importance_sampling_level": "sequence"}, STEP,
        lambda b, o: differ(b["weights"], o["weights"]), base={**MU2, "lr": 1e-2}),
    Row("clip_range", {"clip_range": 0.01}, STEP, lambda b, o: last(o, "last_clip_frac") > last(b, "last_clip_frac"), base=MU2),
    Row("clip_low", {"clip_low": 0.01}, STEP, lambda b, o: differ(b["weights"], o["weights"]), base=MU2),
    Row("clip_high", {"clip_high": 0.01}, STEP, lambda b, o: differ(b["weights"], o["weights"]), base=MU2),
    Row("clip_delta", {"clip_delta": 1.02}, STEP, lambda b, o: differ(b["weights"], o["weights"]),
        base={**MU2, "lr": 1e-2, "clip_high": 0.01}),
    Row("tis_cap", {"tis_cap": 2.0}, STEP,  # float32 sampler and trainer agree to ~1e-5: weights ~1, logged
        lambda b, o: abs(last(o, "tis_weight_mean") - 1) < 1e-4 and "tis_weight_mean" not in b["last"]),
    *[Row("scale_rewards", {"scale_rewards": s}, STEP, lambda b, o: last(o, "adv/std") != last(b, "adv/std"))
      for s in ("batch", "none")],
    Row("std_floor", {"std_floor": 10.0}, STEP, lambda b, o: last(o, "adv/max") < last(b, "adv/max")),
    Row("std_floor_mode", {"std_floor_mode": "add"}, STEP, lambda b, o: last(o, "adv/max") < last(b, "adv/max")),
    Row("quality_advantage", {"quality_advantage": 2.0}, P(_p_advantages),  # a flat P: group learns from quality
        lambda b, o: set(b) == {0.0} and len(set(o)) > 1 and abs(sum(o)) < 1e-5),
    Row("reward_signal", {"reward_signal": False}, P(lambda env, over: _rewards_reach_weights(env, over)),
        lambda b, o: b and not o, base={"anchor_coef": 1.0, "anchor_batch": 4}),  # the anchor alone trains
    Row("reward_norm", {"reward_norm": True}, STEP, lambda b, o: last(o, "adv/std") != last(b, "adv/std"),
        base={"scale_rewards": "none"}),
    Row("reward_norm_momentum", {"reward_norm_momentum": 0.5}, STEP2,
        lambda b, o: last(o, "adv/std") != last(b, "adv/std"), base={"scale_rewards": "none", "reward_norm": True}),
    Row("truncated_completions", {"truncated_completions": "mask"}, STEP,
        lambda b, o: differ(b["grads"], o["grads"]) and last(o, "truncation_rate") > 0, id="truncated_completions=mask"),
    Row("truncated_completions", {"truncated_completions": "malformed"}, STEP,
        lambda b, o: last(o, "reward/mean") < last(b, "reward/mean"), id="truncated_completions=malformed"),
    Row("entropy_coef", {"entropy_coef": 0.5}, STEP, lambda b, o: differ(b["grads"], o["grads"])),
    Row("anchor_coef", {"anchor_coef": 1.0, "anchor_batch": 4}, STEP, lambda b, o: "anchor_nll" in o["last"] and "anchor_nll" not in b["last"]),
    Row("anchor_tasks", {"anchor_tasks": "P"}, STEP, lambda b, o: last(o, "anchor_nll") != last(b, "anchor_nll"),
        base={"anchor_coef": 1.0, "anchor_batch": 4}),
    Row("anchor_batch", {"anchor_batch": 2}, STEP, lambda b, o: last(o, "anchor_nll") != last(b, "anchor_nll"),
        base={"anchor_coef": 1.0, "anchor_batch": 4}),
    Row("anchor_order", {"anchor_order": "given"}, STEP, lambda b, o: last(o, "anchor_nll") != last(b, "anchor_nll"),
        base={"anchor_coef": 1.0, "anchor_batch": 4, "anchor_tasks": "P"}),
    # -- KL ------------------------------------------------------------------------------------------------
    Row("kl_coef", {"kl_coef": 0.0}, STEP2, lambda b, o: last(b, "kl_loss") > 0 == last(o, "kl_loss") and last(o, "kl_mean") > 0,
        id="kl_coef=0 (KL still measured for the guard)"),
    Row("kl_coef", {"kl_coef": 0.0}, STEP, lambda b, o: b["tr"].ref is not None and o["tr"].ref is None and "kl_mean" not in o["last"],
        base={"guard_kl_mean": None, "guard_kl_max": None}, id="kl_coef=0 (no KL guard: no reference pass)"),
    *[Row("kl_estimator", {"kl_estimator": k}, STEP2, lambda b, o: last(o, "kl_mean") != last(b, "kl_mean"))
      for k in ("k2", "exact")],
    Row("kl_estimator", {"kl_estimator": "k1", "kl_coef": 0.0}, STEP2, lambda b, o: last(o, "kl_mean") != last(b, "kl_mean"),
        base={"kl_coef": 0.0}, id="kl_estimator=k1 (measured for the KL guard, beta 0)"),
    Row("kl_clamp", {"kl_clamp": 1e-6}, STEP2, lambda b, o: last(o, "kl_clamped") > 0 == last(b, "kl_clamped")),
    Row("kl_mode", {"kl_mode": "adaptive"}, STEP, lambda b, o: o["tr"].kl_ctl.beta != b["tr"].kl_ctl.beta),
    Row("kl_target", {"kl_target": 1e-9}, STEP2, lambda b, o: o["tr"].kl_ctl.beta > b["tr"].kl_ctl.beta, base=ADAPTIVE),
    Row("kl_horizon", {"kl_horizon": 1}, STEP, lambda b, o: o["tr"].kl_ctl.beta < b["tr"].kl_ctl.beta, base=ADAPTIVE),
    Row("kl_coef_min", {"kl_coef_min": 0.04}, STEP, lambda b, o: o["tr"].kl_ctl.beta == 0.04 > b["tr"].kl_ctl.beta, base=ADAPTIVE),
    Row("kl_coef_max", {"kl_coef_max": 0.01}, STEP, lambda b, o: o["tr"].kl_ctl.beta == 0.01 < b["tr"].kl_ctl.beta, base=ADAPTIVE),
    Row("kl_warmup_steps", {"kl_warmup_steps": 1}, STEP, lambda b, o: (last(b, "beta"), last(o, "beta")) == (0.04, 0.0)),
    Row("kl_warmup_factor", {"kl_warmup_factor": 0.5}, STEP, lambda b, o: last(o, "beta") == 0.02, base={"kl_warmup_steps": 1}),
    Row("ref_refresh_every", {"ref_refresh_every": 1}, STEP,
        lambda b, o: torch.equal(_flat_ref(o), o["weights"]) and not torch.equal(_flat_ref(b), b["weights"])),
    Row("ref_mix_alpha", {"ref_mix_alpha": 0.5}, STEP,
        lambda b, o: not torch.equal(_flat_ref(o), o["weights"]), base={"ref_refresh_every": 1}),
    # -- stability -----------------------------------------------------------------------------------------
    Row("nan_max_consecutive", {"nan_max_consecutive": 1}, P(nan_step),
        lambda b, o: (b["guard"]["rollbacks"], b["guard"]["total_skips"], o["guard"]["rollbacks"]) == (0, 1, 1)),
    Row("nan_max_rollbacks", {"nan_max_rollbacks": 0}, P(nan_step), lambda b, o: o["stopped"] and not b["stopped"],
        base={"nan_max_consecutive": 1}),
    Row("rollback_lr_factor", {"rollback_lr_factor": 0.25}, P(nan_step),
        lambda b, o: (b["lr_scale"], o["lr_scale"]) == (0.3, 0.25), base={"nan_max_consecutive": 1}),
    *[Row(name, {name: value}, P(lambda env, over, s=stream: _guard_events(env, over, s)),
          lambda b, o: b == [] and len(o) == 1)
      for name, value, stream in GUARD_STREAMS],
    Row("guard_eval_drop", {"guard_eval_drop": 0.01}, P(lambda env, over: env.trainer(over).guard.observe_eval(5, 0.58, 0.6)),
        lambda b, o: b is None and o.signal == "eval"),
    Row("guard_max_recoveries", {"guard_max_recoveries": 0},
        P(lambda env, over: [a for _, a, _ in _guard_events(env, over, [H] * 4 + [{**H, "kl_mean": 9.0}] * 2)]),
        lambda b, o: (b, o) == (["recover"], ["stop"])),
    Row("guard_snapshot_every", {"guard_snapshot_every": 1}, P(lambda env, over: sorted(steps(env, over, n=2)["tr"].snapshots)),
        lambda b, o: (b, o) == ([0], [0, 1])),
    Row("rollback_kl_factor", {"rollback_kl_factor": 2.0}, P(lambda env, over: _recovered(env, over).beta_scale),
        lambda b, o: (b, o) == (1.0, 2.0), base={"guard_kl_mean": 1e-9, "guard_patience": 1, "guard_max_recoveries": 1}),
    Row("dynamic_sampling", {"dynamic_sampling": 1}, P(collect, reward=flat_on_p),
        lambda b, o: o["tr"].collect_stats["dynamic/rounds"] == 1 and o["tr"].prompts.state["P"]["cursor"] == 2
                     and b["tr"].prompts.state["P"]["cursor"] == 1),
    Row("dynamic_sampling_oversample", {"dynamic_sampling_oversample": 3.0}, P(collect, reward=flat_on_p),
        lambda b, o: (b["tr"].prompts.state["P"]["cursor"], o["tr"].prompts.state["P"]["cursor"]) == (2, 4),
        base={"dynamic_sampling": 1}),
    # -- rewards (the scorer `rookworld train` builds) ------------------------------------------------------
    *[Row("reward_shaping", {"reward_shaping": s}, P(rewards), lambda b, o: b[:2] != o[:2]) for s in ("graduated", "binary")],
    Row("malformed_penalty", {"malformed_penalty": -0.9}, P(rewards), lambda b, o: (b[2], o[2]) == (-0.3, -0.9)),
    Row("next_state_partial", {"next_state_partial": 0.0}, P(rewards), lambda b, o: o[3] < b[3] and o[4] == b[4]),
    # the legal non-best move loses little: a smaller scale takes more of its quality credit
    Row("quality_scale", {"quality_scale": 0.01}, P(rewards), lambda b, o: o[1] < b[1] and o[0] == b[0]),
    Row("policy_weights", {"policy_weights": {"format": 1.0, "best_legal": 0.0, "quality": 0.0,
                                              "candidates": 0.0, "evals": 0.0}}, P(rewards), lambda b, o: o[:2] != b[:2]),
    Row("env_weights", {"env_weights": {"format": 1.0, "next_state": 0.0, "reward": 0.0, "terminated": 0.0,
                                        "truncated": 0.0}}, P(rewards), lambda b, o: o[3] != b[3]),
    Row("curriculum", {"curriculum": {"P": [[0, {"evals": 5.0}]]}}, P(rewards), lambda b, o: o[0] != b[0]),
    Row("engine_depth", {"engine_depth": 1}, P(lambda env, over: _analyse(env, over)), lambda b, o: b != o),
    Row("engine_workers", {"engine_workers": 2}, P(lambda env, over: _engines(env, over)), lambda b, o: (b, o) == (1, 2)),
    # (that the searches start early with the same rewards: test_trainer's score_overlap tests)
    Row("score_overlap", {"score_overlap": "always"}, P(lambda env, over: _overlap(env, over)),
        lambda b, o: (b, o) == ("after generation", "during generation")),
    Row("engine_cache", {"engine_cache": "CACHEFILE"}, P(lambda env, over: _cache_file(env, over)), lambda b, o: o and not b),
    # -- run -------------------------------------------------------------------------------------------------
    Row("output_dir", {"output_dir": "OUTDIR"}, P(lambda env, over: train(env, over)["run"]),
        lambda b, o: o.name == "chosen" and (o / "metrics.jsonl").exists()),
    Row("seed", {"seed": 2}, COLLECT, lambda b, o: b["texts"] != o["texts"]),
    Row("resume", {"resume": True}, P(lambda env, over: _resumed_step(env, over)), lambda b, o: (b, o) == (0, 1)),
    Row("eval_every", {"eval_every": 1}, P(lambda env, over: [e["step"] for e in train(env, over, _toy_eval)["evals"]]),
        lambda b, o: (b, o) == ([0, 2], [0, 1, 2])),
    Row("save_every", {"save_every": 1}, P(lambda env, over: train(env, over)["checkpoints"]),
        lambda b, o: (b, o) == (["step_000000", "step_000002"], ["step_000001", "step_000002"])),
    Row("keep_last", {"keep_last": 3}, P(lambda env, over: train(env, over)["checkpoints"]), lambda b, o: len(o) > len(b),
        base={"save_every": 1, "steps": 3}),
    Row("tensorboard", {"tensorboard": True}, P(lambda env, over: _writer_files(env, over)), lambda b, o: o and not b),
    Row("wandb", {"wandb": True}, P(lambda env, over: _wandb(env, over)),
        lambda b, o: b == "none" and o == "1 offline run"),
    Row("report", {"report": True}, P(lambda env, over: _cli_report(env, over)), lambda b, o: o and not b),
    Row("progress", {"progress": True}, P(lambda env, over: _bar(env, over)), lambda b, o: "grpo" in o and "grpo" not in b),
]


# -- helpers of single rows --------------------------------------------------------------------------------
def _evaluate(env: Env, over: dict):
    from rookworld_rlvr.grpo.cli import build

    tr, pool = build(env.config(over), log=lambda *_: None)
    try:
        return tr.evaluate()
    finally:
        pool.close()


def _evaluate_twice(env: Env, over: dict) -> tuple:
    """The base evaluation of a second run (of two from the same weights) without its timings, what that run
    logged, the batches the first run decoded and the cache file it wrote (None without eval_cache)."""
    from rookworld_rlvr.grpo.cli import build

    over = {k: (str(env.tmp / f"eval-cache{env.n}") if v == "CACHEDIR" else v) for k, v in over.items()}
    for logged in ([], []):
        tr, pool = build(env.config(over), log=logged.append)
        try:
            res = tr.evaluate()
        finally:
            pool.close()
    files = list(Path(over["eval_cache"]).iterdir()) if over.get("eval_cache") else [None]
    batches = len(Path(files[0]).read_text().splitlines()) - 1 if files[0] else 0
    return ({k: v for k, v in res.items() if k not in ("seconds", "meta")}, [m for m in logged if m.startswith("held-out")],
            batches, files[0])


def _anchor_prompts(env: Env, over: dict) -> tuple[set, set]:
    """The prompts of `anchor_data` (or of `data` where it is null), and those of the anchor's first
    two steps in the trainer `rookworld train` builds."""
    from rookworld_rlvr.grpo.cli import build

    cfg = env.config(over)
    tr, pool = build(cfg, log=lambda *_: None)
    pool.close()
    source = {s.render(cfg.layout)[0] for s in read_samples(cfg.anchor_data or cfg.data) if s.task == "A"}
    return source, {p for _ in range(2) for p, _ in tr.anchor.pairs()}


def _rewards_reach_weights(env: Env, over: dict) -> bool:
    """Whether one step's new weights depend on the rewards: the same step (same samples) under the
    toy reward and under its opposite."""
    def opposite(*args):
        return [_Result(1.0 - r.total) for r in varied_reward(*args)]

    return not torch.equal(steps(env, over)["weights"], steps(env, over, reward=opposite)["weights"])


def _anchor_checks(env: Env, over: dict) -> tuple[int, int]:
    """Of the anchor's P: answers over 60 steps (four epochs of the 60 training positions): how many
    distinct positions in check, and how many distinct positions out of check."""
    tr = env.trainer(over)
    fens = {p.split("P: ", 1)[1].strip() for _ in range(60) for p, _ in tr.anchor.pairs()}
    return sum(map(in_check, fens)), sum(not in_check(f) for f in fens)


def _build(env: Env, over: dict):
    from rookworld_rlvr.grpo.cli import build

    try:
        _, pool = build(env.config(over), log=lambda *_: None)
    except DataError as e:
        return e
    pool.close()
    return "built"


def _stops(env: Env, over: dict) -> str | None:
    tr = env.trainer({"save_every": 1, **over})
    save(tr)
    try:
        for _ in range(3):
            tr.train_step()
    except TrainingStopped as e:
        return str(e)
    return None


def _flat_ref(o: dict) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in o["tr"].ref.parameters()])


def _analyse(env: Env, over: dict):
    from rookworld_rlvr.grpo.cli import build

    _, pool = build(env.config(over), log=lambda *_: None)
    try:  # a middlegame: depth 1 and depth 8 rank its moves differently
        return pool.analyse("r1bq1rk1/pp2bppp/2n1pn2/2pp4/3P4/2PBPN2/PP1N1PPP/R2QK2R w KQ - 0 8").evals
    finally:
        pool.close()


def _engines(env: Env, over: dict) -> int:
    from rookworld_rlvr.grpo.cli import build

    _, pool = build(env.config(over), log=lambda *_: None)
    try:
        pool.analyse_many(["r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
                           "rnbqkb1r/pppp1ppp/5n2/4p3/4P3/2N5/PPPP1PPP/R1BQKBNR w KQkq - 2 3"])
        return len(pool.pids)
    finally:
        pool.close()


def _overlap(env: Env, over: dict) -> str:
    """When `rookworld train`'s trainer scores, as its banner says."""
    from rookworld_rlvr.grpo.cli import build

    trainer, pool = build(env.config(over), log=lambda *_: None)
    pool.close()
    return "during generation" if "scoring as rows finish, during generation" in banner(trainer) else \
        "after generation" if "scoring after generation" in banner(trainer) else banner(trainer)


def _cache_file(env: Env, over: dict) -> bool:
    from rookworld_rlvr.grpo.cli import build

    path = env.tmp / "engine.sqlite"
    over = {k: (str(path) if v == "CACHEFILE" else v) for k, v in over.items()}
    _, pool = build(env.config(over), log=lambda *_: None)
    try:
        pool.analyse("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
    finally:
        pool.close()
    return path.exists()


def _resumed_step(env: Env, over: dict) -> int:
    first = env.trainer({"steps": 1, "save_every": 1})
    first.train()
    return env.trainer({"output_dir": first.cfg.output_dir, **over}).step


def _toy_eval(model, tokenizer) -> dict:
    return {"policy": {"n": 1, "mean_reward": 0.5}}


def _writer_files(env: Env, over: dict) -> bool:
    from rookworld_rlvr.grpo.sinks import writer

    cfg = env.config(over)
    sinks = writer(cfg)
    if sinks is not None:
        sinks({"step": 1, "loss": 0.5})
        sinks.close()
    return (Path(cfg.output_dir) / "tb").exists() and any((Path(cfg.output_dir) / "tb").iterdir())


def _wandb(env: Env, over: dict) -> str:
    """Whether a record reaches a wandb run (offline: on this machine, under output_dir/wandb)."""
    from unittest.mock import patch

    from rookworld_rlvr.grpo.sinks import writer

    cfg = env.config(over)
    with patch.dict(os.environ, {"WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(env.tmp / "wandb_config")}):
        sinks = writer(cfg)
        if sinks is None:
            return "none"
        sinks({"step": 1, "loss": 0.5})
        sinks.close()
        import wandb

        wandb.teardown()  # its settings (offline) are not kept for the process
    runs = list(Path(cfg.output_dir).glob("wandb/offline-run-*/run-*.wandb"))
    return f"{len(runs)} offline run" if runs and runs[0].stat().st_size else "empty"


def _cli_report(env: Env, over: dict) -> bool:
    from rookworld_rlvr.grpo.cli import _train_here

    cfg = env.config({"steps": 1, **over})
    assert _train_here(cfg) == 0
    return (Path(cfg.output_dir) / "report.html").exists()


def _bar(env: Env, over: dict) -> str:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        env.trainer({"steps": 1, **over}).train()
    return err.getvalue()


def _resolve(env: Env, over: dict) -> dict:
    names = {"OTHER": str(env.other_model), "EVALFILE": str(env.data / "eval.jsonl"),
             "BADFILE": str(_bad_data(env)), "OUTDIR": str(env.tmp / "chosen"),
             "JUDGEDFILE": str(_judged_file(env)), "PUZZLEFILE": str(_puzzle_file(env)),
             "EMPTYPUZZLES": str(_puzzle_file(env, empty=True)), "HISTFILE": str(_history_file(env)),
             "NTHREADS": torch.get_num_threads() + 1}
    return {k: names.get(v, v) if isinstance(v, str) else v for k, v in over.items()}


MATE = "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1"  # a1a8 mates


def _history_file(env: Env) -> Path:
    """Three held-out A: transitions of the small data with their history cut to the move alone."""
    import random

    from rookworld_rlvr.data.histories import short_history_copies
    from rookworld_rlvr.data.io import read_samples, write_samples

    path = env.tmp / "histories.jsonl"
    if not path.exists():
        rows = [s for s in read_samples(env.data / "eval.jsonl") if s.task == "A"]
        write_samples(path, list(short_history_copies(rows, 1.0, random.Random(0), [1]))[:3])
    return path


def _judged_file(env: Env) -> Path:
    """Two judged positions (every legal move at 0.0 pawns, the best one higher)."""
    import chess

    from rookworld_rlvr.data.judged import write_rows

    path = env.tmp / "judged.jsonl"
    if not path.exists():
        rows = [{"fen": fen, "evals": {m.uci(): (5.0 if m.uci() == best else 0.0) for m in chess.Board(fen).legal_moves}}
                for fen, best in ((MATE, "a1a8"), (chess.STARTING_FEN, "e2e4"))]
        write_rows(path, rows)
    return path


def _puzzle_file(env: Env, empty: bool = False) -> Path:
    from rookworld_rlvr.data.judged import write_rows

    path = env.tmp / ("no_puzzles.jsonl" if empty else "puzzles.jsonl")
    if not path.exists():
        write_rows(path, [] if empty else [{"fen": MATE, "solutions": ["a1a8"], "kind": "mate1"}])
    return path


def _bad_data(env: Env) -> Path:
    path = env.tmp / "bad.jsonl"
    if not path.exists():
        path.write_text((env.data / "train.jsonl").read_text() + '{"task": "P", "truth": \n')
    return path


def _late_rank(env: Env, over: dict):
    """What rank 0's step collective returns when rank 1 comes 1.5 s late, under this config's timeout."""
    from test_distributed import spawn_waits

    cfg = env.config(over)
    return spawn_waits(cfg.step_timeout_minutes, "late", Path(cfg.output_dir))[0]["gather"]


def _threads(env: Env, over: dict) -> int:
    before = torch.get_num_threads()
    try:
        env.trainer(over)
        return torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_a_phase_is_in_force_from_its_start_over_the_fields_and_task_sampling():
    """`phases`, "each from its start on": a phase's settings and its own task_sampling win over the run's fields and
    task_sampling from its start, a later phase over an earlier. Before, the run's task_sampling won over every
    phase, so a phase setting a task's temperature that task_sampling also set did nothing (as in a preset
    that sets `task_sampling: {P: {temperature: 0.8}}`, `make train`'s)."""
    from conftest import REPO
    from rookworld_rlvr.grpo.dryrun import plan

    cfg = load_config(str(REPO / "configs" / "default.yaml"),
                      {"phases": [{"start": 50, "task_sampling": {"P": {"temperature": 0.5}}},
                                  {"start": 100, "top_k": 20, "temperature": 1.1}]})
    assert cfg.task_sampling["P"]["temperature"] == 0.8
    assert [cfg.sampling_for("P", step)["temperature"] for step in (0, 49, 50, 99, 100)] == [0.8, 0.8, 0.5, 0.5, 1.1]
    assert cfg.sampling_for("P", 100)["top_k"] == 20 and cfg.sampling_for("P", 99)["top_k"] == 0
    assert cfg.sampling_for("P", 50)["max_new_tokens"] == 80  # what no phase sets stays task_sampling's
    shown = [line for line in plan(cfg) if line.startswith("steps ") and " P: " in line]  # what --dry-run prints
    assert [" T=0.8 " in shown[0], " T=0.5 " in shown[1], " T=1.1 top_p=1.0 top_k=20 " in shown[2]] == [True] * 3, shown


@pytest.mark.parametrize("row", ROWS, ids=[r.key() for r in ROWS])
def test_every_option_has_its_documented_effect(env, row):
    base = _resolve(env, row.base)
    key = (row.probe.name, json.dumps(base, sort_keys=True, default=str))
    if key not in env.cache:
        env.cache[key] = row.probe(env, base)
    got = row.probe(env, {**base, **_resolve(env, row.over)})
    assert row.check(env.cache[key], got), (row.key(), env.cache[key] if not isinstance(env.cache[key], dict) else
                                             {k: v for k, v in env.cache[key].items() if k in ("last", "guard")},
                                             got if not isinstance(got, dict) else
                                             {k: v for k, v in got.items() if k in ("last", "guard")})


def test_the_table_covers_every_config_field():
    """A field without a row here is a field nobody showed to do anything."""
    assert {r.field for r in ROWS} == set(FIELDS), set(FIELDS) ^ {r.field for r in ROWS}
    for r in ROWS:  # every row really moves its field away from the base it compares with
        assert r.field in r.over and r.over[r.field] != r.base.get(r.field, BASE.get(r.field, getattr(TrainConfig(), r.field))), r.key()


def test_settings_that_cannot_take_effect_are_named_and_logged(env):
    import yaml
    from conftest import REPO

    cases = [({"clip_range": 0.1}, "clip_range: with updates_per_batch 1"),
             ({"clip_delta": 2.0}, "clip_delta: with updates_per_batch 1"),
             ({"importance_sampling_level": "sequence"}, "importance_sampling_level: with updates_per_batch 1"),
             ({"kl_target": 0.1}, "kl_target: adaptive-KL settings with kl_mode fixed"),
             ({"kl_warmup_factor": 0.5}, "kl_warmup_factor: kl_warmup_steps is 0"),
             ({"kl_coef": 0.0, "kl_estimator": "k2", "guard_kl_mean": None, "guard_kl_max": None},
              "kl_estimator: no reference pass"),
             ({"kl_coef": 0.0, "rollback_kl_factor": 2.0}, "rollback_kl_factor: kl_coef 0"),
             ({"eval_data": "", "guard_eval_drop": 0.1}, "guard_eval_drop: eval_data is empty"),
             ({"anchor_batch": 4}, "anchor_batch: anchor_coef is 0"),
             ({"anchor_data": "other.jsonl"}, "anchor_data: anchor_coef is 0"),
             ({"anchor_coef": 1.0, "anchor_positions": "out_of_check"}, "anchor_positions: the anchor has no P:"),
             ({"anchor_coef": 1.0, "reward_signal": False, "quality_advantage": 2.0},
              "quality_advantage: reward_signal false"),
             ({"lora_alpha": 8.0}, "lora_alpha: lora_r is 0"),
             ({"std_floor_mode": "add", "scale_rewards": "none"}, "std_floor_mode: scale_rewards none"),
             ({"dynamic_sampling_oversample": 2.0}, "dynamic_sampling_oversample: dynamic_sampling is 0"),
             ({"mix_env_ratio": 0.0, "env_terminal_share": 0.2}, "env_terminal_share: no A: prompts"),
             ({"mix_env_ratio": 1.0, "check_share": 0.5}, "check_share: no P: positions are sampled"),
             ({"anchor_coef": 1.0, "anchor_order": "given"}, "anchor_order: the anchor has no P: answers"),
             ({"mix_env_ratio": 1.0, "quality_advantage": 1.0}, "quality_advantage: no P: positions"),
             ({"mix_env_ratio": 0.0, "task_sampling": {"A": {"temperature": 0.7}}}, "task_sampling: A:"),
             ({"mix_env_ratio": 0.0, "temperature": 0.9, "task_sampling": {"P": {"temperature": 0.7}}},
              "temperature: every sampled task sets its own"),
             ({"eval_data": "", "eval_every": 5}, "eval_every: eval_data is empty"),
             ({"eval_data": "", "eval_batch_size": 256}, "eval_batch_size: eval_data is empty"),
             ({"step_timeout_minutes": 5.0}, "step_timeout_minutes: one process"),
             ({"steps": 10, "phases": [{"start": 0, "top_k": 5}, {"start": 10, "top_k": 9}]},
              "phases: entry 1 starts at step 10, after the run's last step (9): it never applies"),
             ({"steps": 10, "curriculum": {"A": [[0, {"next_state": 1.0}], [12, {"next_state": 0.5}]]}},
              "curriculum: A's entry of step 12 is after the run's last step (9): it never applies"),
             ({"steps": 10, "warmup_steps": 10, "min_lr_ratio": 0.5},
              "min_lr_ratio: warmup_steps is the run's steps or more: it ends in the warm-up"),
             ({"batch_positions": 4, "group_size": 4, "minibatch_size": 16},
              "minibatch_size: the batch's 16 completions fit one minibatch, as with 0"),
             ({"steps": 10, "kl_coef": 0.1, "ref_refresh_every": 10},
              "ref_refresh_every: 10, and the run has 10 steps: its first refresh would come after the last one")]
    for over, expected in cases:
        notes = load_config(None, over).inert_settings()
        assert any(n.startswith(expected) for n in notes), (over, notes)
    assert not load_config(None, {"clip_range": 0.1, "updates_per_batch": 2}).inert_settings()
    assert not load_config(None, {"step_timeout_minutes": 5.0}).inert_settings(processes=2)
    assert not load_config(None, {"step_timeout_minutes": 5.0}).inert_settings(processes=None)  # a dry run
    assert not load_config(None, {"mix_env_ratio": 0.0, "phases": [{"start": 1, "mix_env_ratio": 0.5}],
                                  "task_sampling": {"A": {"temperature": 0.7}}, "steps": 3}).inert_settings()
    bounds = ("guard_valid_drop", "guard_reward_drop", "guard_kl_mean", "guard_kl_max", "guard_entropy_factor",
              "guard_truncation_rise", "guard_eval_drop")
    for preset in sorted((REPO / "configs").glob("*.yaml")):  # the shipped presets set nothing idle ...
        given = yaml.safe_load(preset.read_text())
        cfg = load_config(str(preset))
        assert cfg.inert_settings(given) == [], preset.name
        assert all(getattr(cfg, b) is not None for b in bounds) and cfg.guard_max_recoveries > 0, preset.name  # ... and guard
    logs: list[str] = []
    cfg = env.config({"clip_range": 0.1})
    Trainer(cfg, varied_reward, read_samples(cfg.data), None, log=logs.append)
    assert any(line.startswith("warning: setting without effect: clip_range") for line in logs), logs


def test_each_shipped_preset_writes_a_run_directory_of_its_own():
    """Two presets that share an output_dir set each other's runs aside: `rookworld train --config
    configs/gpu-grpo.yaml` wrote into runs/default, where `make train`'s run was."""
    from conftest import REPO

    dirs = {p.name: load_config(str(p)).output_dir for p in sorted((REPO / "configs").glob("*.yaml"))}
    assert len(set(dirs.values())) == len(dirs), dirs


def test_removed_fields_say_why():
    for name, why in (("adv_clip", "never bound"), ("lora_dropout", "dropout is off"),
                      ("resample_zero_variance", "replaced by dynamic_sampling"),
                      ("compile", "never call, so it turned them off")):
        with pytest.raises(ValueError, match=f"'{name}' was .*{why}"):
            load_config(None, {name: "1"})
