"""The GRPO trainer's invariants, on a real tiny GPT-2, real data files and real rewards."""

import json
import math

import pytest
import torch

from rookworld_rlvr.config import TrainConfig, load_config
from rookworld_rlvr.data.io import read_samples
from rookworld_rlvr.grpo import checkpoint as ckpt
from rookworld_rlvr.grpo.state import rollback, save
from rookworld_rlvr.grpo.passes import task_slices
from rookworld_rlvr.grpo.runlog import append_jsonl, banner
from rookworld_rlvr.grpo.trainer import Trainer, TrainingStopped
from rookworld_rlvr.model import token_logprobs
from rookworld_rlvr.tasks.rewards import RewardScorer

from numerics import (  # noqa: E402
    assert_bf16_rounding_close,
    assert_rounding_close,
    gradient_terms,
    logprob_terms,
    rounding_atol,
)


@pytest.fixture(scope="module")
def scorer():
    from rookworld_rlvr.engine import EngineConfig, StockfishPool

    with StockfishPool(EngineConfig(depth=6, workers=1)) as pool:
        yield RewardScorer(engine=pool)


class _Result:
    def __init__(self, total):
        self.total, self.components, self.valid_format = total, {"chars": total}, True


def varied_reward(prompts, completions, truths, weights):
    """A dense toy reward (share of digits) so a random model gets a learning signal."""
    return [_Result(sum(c.isdigit() for c in text) / max(len(text), 1)) for text in completions]


def make_fields(tmp_path, tiny_model_dir, small_data) -> dict:
    return dict(model=str(tiny_model_dir), data=str(small_data / "train.jsonl"), eval_data=str(small_data / "eval.jsonl"),
                output_dir=str(tmp_path / "run"), steps=3, batch_positions=2, group_size=4, max_new_tokens=24,
                lr=1e-3, warmup_steps=0, save_every=1, tensorboard=False, progress=False, report=False, seed=1,
                engine_cache=None, device="cpu", backward_dtype="float32")  # exact: runs compare bit for bit


def make(tmp_path, tiny_model_dir, small_data, scorer, reward_fn=None, log=None, **over):
    fields = make_fields(tmp_path, tiny_model_dir, small_data)
    fields.update(over)
    cfg = load_config(None, fields)
    train = read_samples(cfg.data)

    def chess_reward(prompts, completions, truths, weights):
        return scorer.score_batch(prompts, completions, truths, weights)

    return Trainer(cfg, reward_fn or chess_reward, train, None, log=log or (lambda *_: None))


def test_a_reward_function_that_returns_too_few_or_too_many_results_is_named(tmp_path, tiny_model_dir, small_data,
                                                                              scorer):
    """Your own reward function: one result a completion, in order; a list of another length is an error that says
    so, not a step on rewards paired with the wrong rows (too many) or an IndexError from inside the trainer."""
    for extra in (-1, 1):
        def reward(prompts, completions, truths, weights):
            results = scorer.score_batch(prompts, completions, truths, weights)
            return results[:-1] if extra < 0 else results + results[:1]

        tr = make(tmp_path / str(extra), tiny_model_dir, small_data, scorer, reward_fn=reward)
        n = tr.cfg.batch_positions * tr.cfg.group_size
        with pytest.raises(ValueError, match=f"reward_fn returned {n + extra} results for {n} completions"):
            tr.collect(0, {})


def test_step_zero_policy_equals_reference_on_mixed_left_padded_batch(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, mix_env_ratio=0.5)
    batch = tr.assemble(tr.collect(0, {}))
    assert {r.task for r in batch.rows} == {"P", "A"}
    assert (batch.attention_mask[:, 0] == 0).any(), "the batch must be left-padded"
    C = batch.n_completion
    with torch.no_grad():
        pol = token_logprobs(tr.policy, batch.input_ids, batch.attention_mask, batch.position_ids, C)["logprobs"]
        ref = token_logprobs(tr.ref, batch.input_ids, batch.attention_mask, batch.position_ids, C)["logprobs"]
    mask = batch.completion_mask.bool()
    assert torch.equal(pol[mask], ref[mask])
    # the sampler's log-probs (temperature 1) agree with the trainer's recomputation
    bound = rounding_atol(batch.sampler_logp, logprob_terms(tr.policy))
    assert_rounding_close(pol[mask], batch.sampler_logp[mask], logprob_terms(tr.policy), "sampler vs trainer")
    m = tr.update(batch, 0, {})
    assert m["kl_mean"] == 0.0 and m["kl_max"] == 0.0
    assert m["ratio_mean"] == 1.0 and m["ratio_max"] == 1.0  # exp(logp - logp.detach()) is exactly 1
    assert m["logp_sampler_diff"] <= bound
    assert 0 < m["logp_sampler_diff_mean"] <= m["logp_sampler_diff"]


def test_dropout_is_off_in_every_forward(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer)
    assert tr.policy.config.resid_pdrop > 0  # the config asks for dropout ...
    batch = tr.assemble(tr.collect(0, {}))
    tr.update(batch, 0, {})
    assert not tr.policy.training and not tr.ref.training  # ... and the trainer never switches it on
    x = batch.input_ids[:2]
    a = tr.policy(x).logits
    b = tr.policy(x).logits
    assert torch.equal(a, b)


def test_padding_and_prompt_tokens_never_enter_the_loss(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, kl_coef=0.0)
    batch = tr.assemble(tr.collect(0, {}))
    batch.advantages = torch.linspace(-1, 1, len(batch.rows))
    out = tr.passes(tr.step).logprobs(tr.policy, batch, slice(0, len(batch.rows)), tr.device, False, False)["logprobs"]
    # scramble tokens in padding positions (masked out): the completion log-probs must not move
    scrambled = batch.input_ids.clone()
    pad = batch.attention_mask == 0
    scrambled[pad] = torch.randint(2, 90, (int(pad.sum()),))
    batch2 = type(batch)(**{**batch.__dict__, "input_ids": scrambled})
    out2 = tr.passes(tr.step).logprobs(tr.policy, batch2, slice(0, len(batch.rows)), tr.device, False, False)["logprobs"]
    mask = batch.completion_mask.bool()
    assert_rounding_close(out2[mask], out[mask], logprob_terms(tr.policy), "log-probs")  # masked keys weigh exactly 0
    assert (out[~mask] == 0).all()


def test_end_to_end_few_steps_finish_and_log(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, steps=3)
    tr.train()
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for key in ("reward/mean", "kl_mean", "entropy", "clip_frac", "grad_norm", "kl_share", "zero_var_share",
                "completion_len/mean", "truncation_rate", "lr", "beta", "time/generate", "time/score",
                "time/reference", "time/policy", "time/optimizer"):
        assert key in records[0], key
    assert all(math.isfinite(r["loss"]) for r in records)
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
    assert (tmp_path / "run" / "config.yaml").exists()


def _metrics(path):
    return [{k: v for k, v in json.loads(x).items() if not k.startswith("time/")} for x in path.read_text().splitlines()]


@pytest.mark.parametrize("anchor_coef,backward", [(0.0, "float32"), (0.5, "bf16")], ids=["plain", "anchor-bf16"])
def test_resume_equals_straight_run(tmp_path, tiny_model_dir, small_data, scorer, anchor_coef, backward):
    def varied(prompts, completions, truths, weights):  # the chess reward plus a length term: every
        results = scorer.score_batch(prompts, completions, truths, weights)  # group has variance, so
        for r, c in zip(results, completions, strict=True):  # every step moves the weights and the lr schedule matters
            r.total += 0.01 * (len(c) % 7)
        return results

    anchor = dict(anchor_coef=anchor_coef, anchor_batch=4,  # the anchor's sample order resumes too
                  backward_dtype=backward)
    straight = make(tmp_path / "a", tiny_model_dir, small_data, scorer, reward_fn=varied, steps=4, **anchor)
    straight.train()
    part = make(tmp_path / "b", tiny_model_dir, small_data, scorer, reward_fn=varied, steps=4, **anchor)
    save(part)  # as train() does before its first step
    while part.step < 2:  # stop after 2 of 4 steps (cfg.steps stays 4: the lr schedule spans 4)
        append_jsonl(tmp_path / "b" / "run" / "metrics.jsonl", part.train_step())
    save(part)
    del part
    resumed = make(tmp_path / "b", tiny_model_dir, small_data, scorer, reward_fn=varied, steps=4, resume=True, **anchor)
    assert resumed.step == 2
    resumed.train()
    a = _metrics(tmp_path / "a" / "run" / "metrics.jsonl")
    b = _metrics(tmp_path / "b" / "run" / "metrics.jsonl")
    assert all(r["zero_var_share"] < 1 and r["kl_mean"] > 0 for r in a[1:])  # the steps compared did learn
    assert len(b) == 4 and [r.keys() for r in a] == [r.keys() for r in b]
    for x, y in zip(a[2:], b[-2:], strict=True):  # equal up to float rounding (a resumed process sums in another order)
        noise = {k for k in x if k.startswith("logp_sampler_diff")}  # these measure rounding itself (~1e-7)
        assert all(x[k] < 1e-4 and y[k] < 1e-4 for k in noise)
        x, y = ({k: v for k, v in r.items() if k not in noise} for r in (x, y))
        assert x == pytest.approx(y, rel=1e-6, abs=1e-9), {k: (x[k], y[k]) for k in x if x[k] != y[k]}
    assert ckpt.load_state(ckpt.latest_checkpoint(tmp_path / "a" / "run"))["step"] == 4


def test_a_resume_with_other_settings_says_each_one(tmp_path, tiny_model_dir, small_data, scorer):
    """`rookworld train --resume` continues exactly with the run's settings; one changed on the command line (a
    higher lr, more steps) takes effect from the resumed step on, and is said. Where the run is and how many
    threads it uses change nothing it computes: not said."""
    make(tmp_path, tiny_model_dir, small_data, scorer, steps=2).train()
    said: list[str] = []
    make(tmp_path, tiny_model_dir, small_data, scorer, log=said.append, steps=2, resume=True)
    assert said[-1].startswith("resumed from") and not any(line.startswith("resume:") for line in said)
    said.clear()
    make(tmp_path, tiny_model_dir, small_data, scorer, log=said.append, steps=3, lr=5e-4, threads=1, resume=True)
    changes = [line for line in said if line.startswith("resume:")]
    assert changes == ["resume: steps was 2 in the checkpoint, now 3 (from this step on)",
                       "resume: lr was 0.001 in the checkpoint, now 0.0005 (from this step on)"]


def test_kl_warmup_zeroes_beta(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, kl_coef=0.5, kl_warmup_steps=2, kl_warmup_factor=0.0, steps=3)
    tr.train()
    betas = [json.loads(x)["beta"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert betas == [0.0, 0.0, 0.5]


def test_nan_in_logits_skips_the_step_and_training_continues(tmp_path, tiny_model_dir, small_data, scorer, monkeypatch):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, steps=3, nan_max_consecutive=3)
    import rookworld_rlvr.grpo.passes as passes_mod

    real = passes_mod.token_logprobs
    calls = {"n": 0}

    def faulty(model, *a, **k):  # inject NaN into the policy's log-probs on the first update only
        out = real(model, *a, **k)
        if model is tr.policy and torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 1:
                out["logprobs"] = out["logprobs"] * float("nan")
        return out

    monkeypatch.setattr(passes_mod, "token_logprobs", faulty)
    before = [p.detach().clone() for p in tr.policy.parameters()]
    groups = tr.collect(0, {})
    m = tr.update(tr.assemble(groups), 0, {})
    assert m["guard"] == "skip"
    assert all(torch.equal(a, b) for a, b in zip(before, tr.policy.parameters(), strict=True)), \
        "a skipped step must not move weights"
    tr.train()  # the run goes on
    assert tr.step == 3


def test_rollback_restores_weights_and_lowers_lr(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, steps=2)
    save(tr)  # step 0
    saved = [p.detach().clone() for p in tr.policy.parameters()]
    with torch.no_grad():
        for p in tr.policy.parameters():
            p.add_(1.0)
    rollback(tr, "test")
    assert all(torch.equal(a, b) for a, b in zip(saved, tr.policy.parameters(), strict=True))
    assert tr.lr_scale == 0.3  # the default rollback_lr_factor


def test_kl_threshold_recovers_then_stops_with_a_message(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, varied_reward, steps=20, lr=0.05, kl_coef=0.01,
              guard_kl_mean=1e-6, guard_max_recoveries=1, save_every=100)
    with pytest.raises(TrainingStopped, match="kl_mean .* after 1/1 recoveries.*guard_kl_mean"):
        tr.train()
    assert tr.guard.recoveries == 1
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [(e["signal"], e["action"]) for e in events] == [("kl_mean", "recover"), ("kl_mean", "stop")]
    assert events[0]["to_step"] == 0 and events[0]["lr_scale"] == 0.3


def test_master_weights_stay_fp32_under_bf16(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, autocast="bf16", backward_dtype="auto", steps=2)
    tr.train()
    assert all(p.dtype == torch.float32 for p in tr.policy.parameters())
    for state in tr.opt.state.values():
        assert state["exp_avg"].dtype == torch.float32


def test_prompt_longer_than_context_is_a_clear_error(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, max_new_tokens=300)
    with pytest.raises(ValueError, match="exceeds the model's n_positions"):
        tr.collect(0, {})


def test_config_rejects_bad_values_and_unknown_fields(tmp_path):
    with pytest.raises(ValueError, match="group_size"):
        load_config(None, {"group_size": 1})
    with pytest.raises(ValueError, match="unknown config field 'kl_coeff'; did you mean one of 'kl_coef', "):
        load_config(None, {"kl_coeff": "0.1"})
    preset = tmp_path / "typo.yaml"  # a mistyped field in a file: its line, and the field it may mean
    preset.write_text("model: models/rookworld-board\nstepz: 3\n")
    with pytest.raises(ValueError, match=f"^{preset}:2: unknown config field 'stepz'; did you mean 'steps'\\?$"):
        load_config(str(preset))
    with pytest.raises(ValueError, match="loss_type"):
        load_config(None, {"loss_type": "ppo"})
    with pytest.raises(ValueError, match="backward_dtype"):
        load_config(None, {"backward_dtype": "float32", "autocast": "bf16"})
    with pytest.raises(ValueError, match="backward_dtype.*lora_r"):
        load_config(None, {"backward_dtype": "bf16", "lora_r": 4})
    with pytest.raises(ValueError, match="backward_dtype"):
        load_config(None, {"backward_dtype": "fp16"})
    for bad in ("0", "-1", "inf"):  # a wait of no time, or one that never ends
        with pytest.raises(ValueError, match=f"config field 'step_timeout_minutes' must be > 0 \\(got {bad}"):
            load_config(None, {"step_timeout_minutes": bad})
    cfg = load_config("configs/default.yaml", {"lr": "1e-5", "resume": "true"})
    assert cfg.lr == 1e-5 and cfg.resume is True


def test_trainer_checkpoint_loads_with_plain_transformers(tmp_path, tiny_model_dir, small_data, scorer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookworld_rlvr.model import generate

    tr = make(tmp_path, tiny_model_dir, small_data, scorer, steps=1)
    tr.train()
    path = ckpt.latest_checkpoint(tmp_path / "run")
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    prompt = "P: 8/8/8/8/8/8/8/k6K w - - 0 1 "
    ours = generate(tr.policy, tr.tokenizer, [prompt], max_new_tokens=10, greedy=True).completion_ids[0]
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    hf = model.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
    n = min(len(hf), len(ours))
    assert torch.equal(hf[:n], ours[:n])


def test_phases_and_curriculum_take_effect_on_the_same_trainer(tmp_path, tiny_model_dir, small_data, scorer):
    seen = []

    def recording_reward(prompts, completions, truths, weights):
        seen.append(weights)
        return varied_reward(prompts, completions, truths, weights)

    tr = make(tmp_path, tiny_model_dir, small_data, scorer, recording_reward, mix_env_ratio=0.0,
              phases=[{"start": 1, "mix_env_ratio": 1.0, "max_new_tokens": 8}],
              curriculum={"A": [[1, {"next_state": 0.0}]]})
    first = tr.collect(0, {})
    assert {g[0].task for g in first} == {"P"}
    second = tr.collect(1, {})
    assert {g[0].task for g in second} == {"A"}
    assert max(len(r.completion_ids) for g in second for r in g) <= 8
    assert seen[0]["A"]["next_state"] > 0 and seen[-1]["A"]["next_state"] == 0.0


def test_a_fresh_run_moves_an_old_run_aside(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, steps=1)
    tr.train()
    make(tmp_path, tiny_model_dir, small_data, scorer, steps=1)
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("run-")]
    assert len(moved) == 1 and (moved[0] / "metrics.jsonl").exists()


def test_env_terminal_share_fixes_the_share_of_game_ending_a_prompts(tmp_path, tiny_model_dir, small_data, scorer):
    from rookworld_rlvr.grpo.prompts import PromptSampler, ends_game

    train = read_samples(small_data / "train.jsonl")
    env = [s for s in train if s.task == "A"]
    assert 0 < sum(map(ends_game, env)) < len(env) / 4  # game-ending transitions are rare in the data
    sampler = PromptSampler({"A": env}, seed=3, terminal_share=0.25)
    drawn = sampler.take("A", 6)
    saved = json.loads(json.dumps(sampler.state))
    drawn += sampler.take("A", 10)
    assert [ends_game(s) for s in drawn] == [False, False, False, True] * 4
    resumed = PromptSampler({"A": env}, seed=3, terminal_share=0.25)
    resumed.load_state(saved)
    assert resumed.take("A", 10) == drawn[6:]
    natural = PromptSampler({"A": env}, seed=3).take("A", len(env))  # null: the data's own mix, each once
    assert sorted(map(id, natural)) == sorted(map(id, env))

    tr = make(tmp_path, tiny_model_dir, small_data, scorer, varied_reward, batch_positions=4, mix_env_ratio=1.0,
              env_terminal_share=0.5, max_new_tokens=4)
    groups = tr.collect(0, {})
    assert [ends_game(g[0]) for g in groups].count(True) == 2
    with pytest.raises(ValueError, match="no game-ending"):
        PromptSampler({"A": [s for s in env if not ends_game(s)]}, seed=0, terminal_share=0.1)
    with pytest.raises(ValueError, match="env_terminal_share"):
        TrainConfig(env_terminal_share=1.5).validate()


def test_mix_puzzle_ratio_draws_puzzles_with_a_verified_reward(tmp_path, tiny_model_dir, small_data, scorer):
    """A quarter of the P: prompts are puzzles, deterministically and across resumes; a puzzle row's
    reward comes from its solving moves (components format, solved), logged apart from the P: positions'."""
    from rookworld_rlvr.data.io import Sample
    from rookworld_rlvr.data.judged import write_rows
    from rookworld_rlvr.grpo.prompts import PromptSampler
    from rookworld_rlvr.tasks.strength import Puzzle

    mates = [Puzzle("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1", ("a1a8",), "mate1"),
             Puzzle("rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq g3 0 2", ("d8h4",), "mate1")]
    pol = [s for s in read_samples(small_data / "train.jsonl") if s.task == "P"]
    sampler = PromptSampler({"P": pol, "P_puzzle": [Sample("P", p) for p in mates]}, seed=3, puzzle_share=0.25)
    drawn = sampler.take("P", 4)
    saved = json.loads(json.dumps(sampler.state))
    drawn += sampler.take("P", 8)
    assert [isinstance(s.truth, Puzzle) for s in drawn] == [False, False, False, True] * 3
    resumed = PromptSampler({"P": pol, "P_puzzle": [Sample("P", p) for p in mates]}, seed=3, puzzle_share=0.25)
    resumed.load_state(saved)
    assert [s.fen for s in resumed.take("P", 8)] == [s.fen for s in drawn[4:]]

    path = tmp_path / "puzzles.jsonl"
    write_rows(path, (p.to_dict() for p in mates))
    from rookworld_rlvr.data.judged import read_puzzles

    over = dict(batch_positions=4, mix_env_ratio=0.0, max_new_tokens=8, mix_puzzle_ratio=0.5, puzzle_data=str(path))
    # the caller hands the trainer its puzzles (grpo.cli.build reads them): without them, an error that says so
    with pytest.raises(ValueError, match=r"'puzzle_data' is .*puzzles.jsonl: pass its puzzles as puzzles"):
        make(tmp_path, tiny_model_dir, small_data, scorer, **over)
    with pytest.raises(ValueError, match="'mix_puzzle_ratio' needs puzzle_data"):  # none named: the config says
        make(tmp_path, tiny_model_dir, small_data, scorer, **{**over, "puzzle_data": None})
    cfg = load_config(None, {**make_fields(tmp_path, tiny_model_dir, small_data), **over})
    tr = Trainer(cfg, lambda *a: scorer.score_batch(*a), read_samples(cfg.data), None, log=lambda *_: None,
                 puzzles=[Sample("P", p) for p in read_puzzles(path)])
    groups = tr.collect(0, {})
    puzzle_rows = [r for g in groups for r in g if isinstance(r.truth, Puzzle)]
    assert len(puzzle_rows) == 2 * tr.cfg.group_size
    assert all(set(r.components) == {"format", "solved"} and r.reward in (-0.3, 0.0, 1.0) for r in puzzle_rows)
    # the step's record keeps the two sources apart: P: components over the P: positions only
    from rookworld_rlvr.grpo.runlog import step_record

    rec = step_record(0, tr.assemble(groups), {}, {}, 1.0, tr.cfg.group_size, False, {})
    positions = [r for g in groups for r in g if not isinstance(r.truth, Puzzle)]
    assert rec["reward/puzzle"] == pytest.approx(sum(r.reward for r in puzzle_rows) / len(puzzle_rows))
    assert rec["reward/puzzle/solved"] == pytest.approx(sum(r.components["solved"] for r in puzzle_rows) / len(puzzle_rows))
    for comp in ("format", "quality", "candidates"):
        assert rec[f"reward/P/{comp}"] == pytest.approx(sum(r.components[comp] for r in positions) / len(positions))
    assert "reward/P/solved" not in rec and "reward/puzzle/quality" not in rec
    assert rec["reward/P"] == pytest.approx(sum(r.reward for r in puzzle_rows + positions) / len(puzzle_rows + positions))
    with pytest.raises(ValueError, match="mix_puzzle_ratio"):
        TrainConfig(mix_puzzle_ratio=0.5).validate()


def _answers_nll(tr, samples) -> float:
    """Per-token NLL of the samples' ground-truth answers (EOS included) under the policy."""
    from rookworld_rlvr.model.padding import pad_pairs
    from rookworld_rlvr.model.generate import positions_from_mask

    tok = tr.tokenizer
    pairs = [s.render("compact") for s in samples]
    answers = [ids + [tok.eos_token_id] for ids in tok([c for _, c in pairs], add_special_tokens=False)["input_ids"]]
    ids, mask, P = pad_pairs(tok([p for p, _ in pairs], add_special_tokens=False)["input_ids"], answers, tok.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(tr.policy, ids, mask, positions_from_mask(mask), ids.shape[1] - P)["logprobs"]
    return float(-logp.sum() / mask[:, P:].sum())


def test_anchor_trains_on_ground_truth_answers_and_plain_grpo_does_not(tmp_path, tiny_model_dir, small_data, scorer):
    env = [s for s in read_samples(small_data / "train.jsonl") if s.task == "A"][:12]
    over = dict(steps=3, reward_fn=varied_reward, mix_env_ratio=0.5, kl_coef=0.0)
    plain = make(tmp_path / "plain", tiny_model_dir, small_data, scorer, **over)
    before = _answers_nll(plain, env)
    plain.train()
    anchored = make(tmp_path / "anchor", tiny_model_dir, small_data, scorer, anchor_coef=1.0, anchor_batch=8, **over)
    assert _answers_nll(anchored, env) == pytest.approx(before)
    anchored.train()
    records = [json.loads(x) for x in (tmp_path / "anchor" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["anchor_nll"]) for r in records)
    after_plain, after_anchor = _answers_nll(plain, env), _answers_nll(anchored, env)
    assert after_anchor < before - 0.1  # the training data's A: answers became more likely ...
    assert after_anchor < after_plain - 0.1  # ... because of the anchor, not the rewards
    # the anchor draws its samples in its own order: GRPO saw the same prompts in both runs
    plain_log = [json.loads(x) for x in (tmp_path / "plain" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["reward/mean"] == plain_log[0]["reward/mean"]
    # its forward and backward are a phase of their own, apart from the GRPO pass, within the step's time
    assert all(r["time/anchor"] > 0 and r["time/policy"] > 0 and r["time/other"] >= 0 for r in records)
    assert not any("time/anchor" in r for r in plain_log)


def test_step_record_reports_move_quality_apart_from_legality():
    """reward/P/quality counts an illegal move as 0; quality_legal is the quality of the legal moves alone,
    so a run that only gets more legal shows up as flat there."""
    from types import SimpleNamespace

    from rookworld_rlvr.grpo.rollout import Row
    from rookworld_rlvr.grpo.runlog import step_record

    def row(legal: float, quality: float) -> Row:
        return Row("P", "", None, [1], [2], [0.0], "", "stop", quality, {"best_legal": legal, "quality": quality})

    rows = [row(1.0, 0.9), row(1.0, 0.5), row(0.0, 0.0), row(0.0, 0.0)]
    batch = SimpleNamespace(rows=rows, rewards=torch.tensor([0.9, 0.5, 0.0, 0.0]), advantages=torch.zeros(4))
    rec = step_record(0, batch, {}, {}, 1.0, 4, False, {})
    assert rec["reward/P/quality"] == pytest.approx(0.35) and rec["reward/P/quality_legal"] == pytest.approx(0.7)
    batch.rows = [row(0.0, 0.0)] * 4
    assert "reward/P/quality_legal" not in step_record(0, batch, {}, {}, 1.0, 4, False, {})


def test_anchor_config_is_validated():
    for over, field in (({"anchor_coef": -1.0}, "anchor_coef"), ({"anchor_tasks": "X"}, "anchor_tasks"),
                        ({"anchor_tasks": "PA", "anchor_batch": 3}, "anchor_batch"),
                        ({"reward_signal": False}, "reward_signal.*needs anchor_coef > 0")):
        with pytest.raises(ValueError, match=field):
            load_config(None, over)
    load_config(None, {"reward_signal": False, "anchor_coef": 1.0})  # the control run: the anchor alone trains


def test_anchor_without_its_tasks_samples_fails_before_any_work(tmp_path, tiny_model_dir, small_data, scorer):
    lines = (small_data / "train.jsonl").read_text().splitlines()
    only_p = tmp_path / "p.jsonl"
    only_p.write_text("\n".join(x for x in lines if json.loads(x)["task"] == "P") + "\n")
    with pytest.raises(ValueError, match=r"'anchor_tasks' \(A\) needs A: samples.*p.jsonl has none"):
        make(tmp_path, tiny_model_dir, small_data, scorer, data=str(only_p), mix_env_ratio=0.0, anchor_coef=1.0)


def test_anchor_out_of_check_without_such_positions_fails_before_any_work(tmp_path, tiny_model_dir, small_data,
                                                                          scorer):
    from rookworld_rlvr.tasks.strength import in_check

    lines = (small_data / "train.jsonl").read_text().splitlines()
    checks = tmp_path / "checks.jsonl"
    checks.write_text("".join(x + "\n" for x in lines if json.loads(x)["task"] == "A"
                              or in_check(json.loads(x)["truth"]["fen"])))
    with pytest.raises(ValueError, match=r"needs P: samples out of check \(anchor_positions\).*checks.jsonl has none"):
        make(tmp_path, tiny_model_dir, small_data, scorer, data=str(checks), mix_env_ratio=0.0, check_share=1.0,
             anchor_coef=1.0, anchor_tasks="PA", anchor_positions="out_of_check")


def test_positions_are_told_apart_by_check_once_for_the_sampler_and_the_anchor(tmp_path, tiny_model_dir, small_data,
                                                                               scorer, monkeypatch):
    """`check_share` splits the training P: rows by check; the anchor out of check takes the sampler's rows out of
    check (the same rows, in the same order) instead of parsing a GPU base's million positions again."""
    from rookworld_rlvr.grpo import prompts
    from rookworld_rlvr.grpo.prompts import out_of_check, split_tasks

    calls, real = [], prompts.in_check_flags
    monkeypatch.setattr(prompts, "in_check_flags", lambda rows, *a: calls.append(len(rows)) or real(rows, *a))
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, mix_env_ratio=0.5, check_share=0.25, anchor_coef=1.0,
              anchor_tasks="PA", anchor_positions="out_of_check")
    rows = split_tasks(read_samples(str(small_data / "train.jsonl")))["P"]
    assert calls == [len(rows)]
    assert tr.anchor.sampler.pools["P"] == out_of_check(rows) == tr.prompts.pools["P"] and len(calls) == 2


def test_anchor_or_puzzle_data_without_its_rows_is_an_error_before_the_models_load(tmp_path, tiny_model_dir,
                                                                                    small_data, scorer):
    with pytest.raises(ValueError, match=r"'anchor_data' is .*eval.jsonl: pass its samples as anchor_samples"):
        make(tmp_path, tiny_model_dir, small_data, scorer, anchor_coef=1.0, anchor_data=str(small_data / "eval.jsonl"))
    # said before the models load (a 124M model takes seconds): a model folder that is not there is not reached
    with pytest.raises(ValueError, match=r"'anchor_data' is .*eval.jsonl: pass its samples as anchor_samples"):
        make(tmp_path, tmp_path / "no-model", small_data, scorer, anchor_coef=1.0,
             anchor_data=str(small_data / "eval.jsonl"))
    with pytest.raises(ValueError, match=r"'puzzle_data' is .*eval.jsonl: pass its puzzles as puzzles"):
        make(tmp_path, tmp_path / "no-model", small_data, scorer, mix_puzzle_ratio=0.5,
             puzzle_data=str(small_data / "eval.jsonl"))


def test_anchor_sample_longer_than_context_is_a_clear_error(tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, anchor_coef=1.0, anchor_batch=4)
    tr.anchor.batch(tr.policy)  # fits the model's 320 positions
    tr.policy.config.n_positions = 64  # an A: prompt + answer is ~170 characters
    with pytest.raises(ValueError, match="anchor sample .* more than the model's context of 64"):
        tr.anchor.batch(tr.policy)


def test_entropy_bonus_reaches_the_gradient_and_a_logged_entropy_keeps_no_graph(tmp_path, tiny_model_dir, small_data,
                                                                                   scorer):
    """entropy_coef > 0 changes the update by the entropy term's gradient; with entropy_coef 0 the
    entropy is still logged, but computed without autograd (no softmax over the vocabulary kept)."""
    grads, entropies = {}, {}
    for coef in (0.0, 0.5):
        tr = make(tmp_path / str(coef), tiny_model_dir, small_data, scorer, reward_fn=varied_reward, kl_coef=0.0,
                  entropy_coef=coef)
        batch = tr.assemble(tr.collect(0, {}))
        o = tr.passes(tr.step).logprobs(tr.policy, batch, slice(0, len(batch.rows)), tr.device, False, True)
        assert (o["entropy"].grad_fn is not None) == (coef != 0)
        m = tr.update(batch, 0, {})
        entropies[coef] = m["entropy"]
        grads[coef] = torch.cat([p.grad.flatten() for p in tr.policy.parameters()])
    assert entropies[0.0] == pytest.approx(entropies[0.5], rel=1e-6)  # the same samples, the same entropy
    assert (grads[0.0] - grads[0.5]).norm() > 1e-3 * grads[0.0].norm()  # the bonus moved the gradient


def test_bf16_backward_keeps_the_forward_and_nearly_the_gradient(tmp_path, tiny_model_dir, small_data, scorer):
    """backward_dtype bf16: the policy pass's log-probs, ratios and KL are the float32 ones (the
    sampler agrees as closely), and the gradient differs from float32's only by bf16 rounding."""
    out = {}
    for dtype in ("float32", "bf16"):
        tr = make(tmp_path / dtype, tiny_model_dir, small_data, scorer, reward_fn=varied_reward, backward_dtype=dtype)
        assert tr.grad_note == dtype and (tr.grad_dtype is not None) == (dtype == "bf16")
        batch = tr.assemble(tr.collect(0, {}))
        tr.opt.step = lambda: None  # keep the weights: compare this step's gradients
        m = tr.update(batch, 0, {})
        out[dtype] = (m, torch.cat([p.grad.flatten() for p in tr.policy.parameters()]))
    (m32, g32), (m16, g16) = out["float32"], out["bf16"]
    for key in ("logp_sampler_diff", "ratio_mean", "kl_mean", "entropy", "loss"):
        assert m16[key] == m32[key], key
    assert not torch.equal(g16, g32)  # the bf16 products really ran
    assert_bf16_rounding_close(g16, g32, "policy gradient")  # (bounds the angle too: no cosine check needed)


def test_record_rollout_gives_the_recomputed_update_and_frees_its_memory(tmp_path, tiny_model_dir, small_data, scorer):
    """record_rollout: the rows carry the sampler's projection outputs; the first pass on them gives
    the log-probs and gradient of a recomputing pass; the update frees them after that pass (a second
    pass, μ = 2, recomputes). Where it cannot apply it is off and the banner says why."""
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, reward_fn=varied_reward, updates_per_batch=2,
              mix_env_ratio=0.5, record_rollout="always")  # auto leaves narrow models alone
    assert tr.record and "recorded projection outputs" in banner(tr)
    batch = tr.assemble(tr.collect(0, {}))
    assert all(r.recorded is not None for r in batch.rows)
    results = []
    for recorded in (False, True):
        tr.policy.zero_grad()
        for sl in task_slices(batch.rows, tr.cfg.group_size, tr.cfg.minibatch_size):
            logp = tr.passes(tr.step).logprobs(tr.forward_model, batch, sl, tr.device, False, False, recorded=recorded)["logprobs"]
            (logp * batch.advantages[sl, None] * batch.completion_mask[sl]).sum().backward()
            results.append(logp.detach())
        results.append(torch.cat([p.grad.flatten() for p in tr.policy.parameters()]))
    n = len(task_slices(batch.rows, tr.cfg.group_size, tr.cfg.minibatch_size))
    for plain, rec in zip(results[:n], results[n + 1:-1], strict=True):
        assert_rounding_close(rec, plain, logprob_terms(tr.policy), "recorded log-probs")
    assert_rounding_close(results[-1], results[n], gradient_terms(tr.policy, batch.attention_mask), "gradient")
    m = tr.update(batch, 0, {})
    bound = rounding_atol(batch.sampler_logp, logprob_terms(tr.policy))
    assert "last_loss" in m and m["logp_sampler_diff"] <= bound
    assert abs(m["ratio_mean"] - 1.0) <= bound  # μ = 2: old log-probs from a no-grad pass, so 1 up to rounding
    assert all(r.recorded is None for r in batch.rows)
    for i, (over, why) in enumerate(((dict(record_rollout="never"), "record_rollout: never"),
                                     (dict(record_rollout="auto"), "< 512, too narrow"),
                                     (dict(lora_r=4), "LoRA"),
                                     (dict(autocast="bf16", backward_dtype="auto"), "autocast"))):
        other = make(tmp_path / str(i), tiny_model_dir, small_data, scorer, **over)
        assert not other.record and why in other.record_note and other.record_note in banner(other)
        rows = other.collect(0, {})
        assert all(r.recorded is None for g in rows for r in g)
    with pytest.raises(ValueError, match="record_rollout"):
        make(tmp_path / "lora", tiny_model_dir, small_data, scorer, lora_r=4, record_rollout="always")
    from transformers import GPT2Config, GPT2LMHeadModel

    from rookworld_rlvr.grpo.precision import record_rollout

    wide = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=512, n_layer=1, n_head=8)).eval()
    assert record_rollout(load_config(None, {}), wide, None, torch.device("cpu"))[0]  # auto: on from 512 wide
    on_gpu = record_rollout(load_config(None, {}), wide, None, torch.device("cuda"))  # auto: measured on CPUs
    assert not on_gpu[0] and "always" in on_gpu[1]


def test_backward_dtype_auto_measures_and_a_resumed_run_keeps_its_choice(tmp_path, tiny_model_dir, small_data, scorer,
                                                                          monkeypatch):
    from rookworld_rlvr.model import bf16_grad

    assert bf16_grad.bf16_speedup(torch.device("cpu")) > 0
    monkeypatch.setattr(bf16_grad, "bf16_speedup", lambda device: 2.0)  # a CPU with fast bf16 products
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, backward_dtype="auto")
    assert tr.grad_dtype == torch.bfloat16 and "2.00x" in tr.grad_note
    assert "backward products bf16 (auto" in banner(tr)
    save(tr)
    monkeypatch.setattr(bf16_grad, "bf16_speedup", lambda device: 0.5)  # the same run on a slow machine
    assert make(tmp_path / "new", tiny_model_dir, small_data, scorer, backward_dtype="auto").grad_dtype is None
    resumed = make(tmp_path, tiny_model_dir, small_data, scorer, backward_dtype="auto", resume=True)
    assert resumed.grad_dtype == torch.bfloat16 and "as the run was started" in resumed.grad_note
    lora = make(tmp_path / "lora", tiny_model_dir, small_data, scorer, backward_dtype="auto", lora_r=4)
    assert lora.grad_dtype is None and "plain GPT-2" in lora.grad_note


def test_exact_kl_equals_the_full_vocabulary_kl_of_plain_passes(tmp_path, tiny_model_dir, small_data, scorer):
    """kl_estimator exact: the trainer's KL (from the grouped, length-bucketed scoring passes) is
    KL(policy || reference) over the whole vocabulary, as plain one-row-at-a-time passes compute it."""
    from rookworld_rlvr.grpo.loss import exact_kl

    tr = make(tmp_path, tiny_model_dir, small_data, scorer, reward_fn=varied_reward, kl_estimator="exact",
              kl_coef=0.1, mix_env_ratio=0.0, steps=4)
    tr.train_step()  # the policy moves away from the reference
    batch = tr.assemble(tr.collect(1, {}))
    mask = batch.completion_mask.bool()
    assert len(set(mask.sum(1).tolist())) > 1  # completions of several lengths: several buckets
    temp = tr.cfg.sampling_for("P", 1)["temperature"]
    with torch.no_grad():
        pol, ref = (token_logprobs(m, batch.input_ids, batch.attention_mask, batch.position_ids, batch.n_completion,
                                   temperature=temp, return_logits=True)["logits"] for m in (tr.policy, tr.ref))
    expected = exact_kl(pol, ref).clamp(max=tr.cfg.kl_clamp)[mask].mean()
    m = tr.update(batch, 1, {})
    assert expected > 1e-6
    # To first order, errors e_v and f_v in the policy's and reference's log-probs move a token's
    # KL = sum_v p_v (log p_v - log q_v) by sum_v p_v ((1 + r_v) e_v - f_v): at most (2 + max|r|) d for
    # log-probs off by d each, an absolute bound (KL(ref || policy) or k3 miss it by far more).
    # Measured: 4e-7 to 5e-6 of 4.6e-3, depending on the CPU's kernels.
    d = rounding_atol(pol, logprob_terms(tr.policy))
    r_max = float((torch.log_softmax(pol, -1) - torch.log_softmax(ref, -1)).abs()[mask].max())
    assert m["kl_mean"] == pytest.approx(float(expected), rel=0, abs=(2 + r_max) * d)


def test_keep_freed_memory_stops_page_faults_on_reused_tensors(tmp_path):
    """A step's large tensors, freed and allocated again, reuse the same pages: the CLI turns glibc's
    mmap of large blocks off, which on CPU saved ~1.5 s of page faults per 124M step. Run in a fresh
    process: the setting is process-wide."""
    import subprocess
    import sys

    script = """
import resource, torch
from rookworld_rlvr.hostmem import keep_freed_memory
print(keep_freed_memory())
def step():  # a step's pattern: big tensors (above glibc's largest mmap threshold) made, then freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    xs = [torch.empty(40 * 2**20 // 4).fill_(1.0) for _ in range(4)]
    del xs
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(*[step() for _ in range(6)])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split("\n")
    if not sys.platform.startswith("linux"):
        assert "unchanged" in out[0]
        return
    assert out[0].startswith("host memory: freed blocks are kept for reuse"), out
    faults = [int(n) for n in out[1].split()]
    # The first step faults in its 160 MB (40,960 pages, fewer where transparent huge pages are
    # always on); later steps reuse them (glibc's default: 40,960 every step on this kind of VM).
    assert faults[-1] < 1_000, faults


def test_host_memory_is_tuned_for_cpu_runs_only(monkeypatch):
    """A GPU run's tensors live on the GPU: its process keeps glibc's defaults (hands freed host
    memory back); the CPU run gets the tuning and logs it."""
    from rookworld_rlvr import hostmem

    calls = []
    monkeypatch.setattr(hostmem, "keep_freed_memory", lambda: calls.append(1) or "tuned")
    assert hostmem.for_device(torch.device("cuda")) is None and hostmem.for_device(torch.device("meta")) is None
    assert calls == []
    assert hostmem.for_device(torch.device("cpu")) == "tuned" and calls == [1]


def _frozen_weights_update(tr, batch):
    """The update's gradient on `batch`, the weights left as they were."""
    tr.opt.step = lambda: None
    m = tr.update(batch, 0, {})
    return m, torch.cat([p.grad.flatten() for p in tr.policy.parameters()])


def _widened(batch, extra: int):
    """The same batch with `extra` more padding columns after the completions: as if another
    completion of the batch had been `extra` tokens longer."""
    pad = lambda t, v=0: torch.cat([t, torch.full((t.shape[0], extra), v, dtype=t.dtype)], 1)  # noqa: E731
    return type(batch)(**{**batch.__dict__, "input_ids": pad(batch.input_ids), "attention_mask": pad(batch.attention_mask),
                          "position_ids": pad(batch.position_ids), "completion_mask": pad(batch.completion_mask),
                          "sampler_logp": pad(batch.sampler_logp), "n_completion": batch.n_completion + extra})


def test_dr_grpo_divides_by_the_generation_budget_not_the_longest_completion(tmp_path, tiny_model_dir, small_data, scorer):
    """Dr. GRPO's normaliser is a constant (the task's max_new_tokens), so a batch whose longest
    completion is longer weighs every token the same: widening the padded batch changes nothing."""
    out = []
    for extra in (0, 7):
        tr = make(tmp_path / str(extra), tiny_model_dir, small_data, scorer, reward_fn=varied_reward, loss_type="dr_grpo",
                  task_sampling={"P": {"max_new_tokens": 20}})  # P: rows have budget 20, A: rows 24
        batch = tr.assemble(tr.collect(0, {}))
        out.append(_frozen_weights_update(tr, _widened(batch, extra) if extra else batch))
    (m0, g0), (m1, g1) = out
    assert m0["loss"] == pytest.approx(m1["loss"], rel=1e-6)
    torch.testing.assert_close(g0, g1, rtol=1e-5, atol=1e-8)  # float32 sums over the same tokens
    # and it is the budget: a P: row's tokens weigh 1 / (N x 20), an A: row's 1 / (N x 24)
    tr = make(tmp_path / "w", tiny_model_dir, small_data, scorer, reward_fn=varied_reward, loss_type="dr_grpo",
              task_sampling={"P": {"max_new_tokens": 20}}, kl_coef=0.0)
    batch = tr.assemble(tr.collect(0, {}))
    captured = {}
    import rookworld_rlvr.grpo.step as step_mod

    real = step_mod.grpo_loss

    def spy(*a, **k):
        captured.setdefault("budget", []).append(k["max_completion_length"].tolist())
        return real(*a, **k)

    step_mod.grpo_loss = spy
    try:
        tr.update(batch, 0, {})
    finally:
        step_mod.grpo_loss = real
    budgets = [b for part in captured["budget"] for b in part]
    assert budgets == [20.0 if r.task == "P" else 24.0 for r in batch.rows]


def _flat_by_prompt(prompts, completions, truths, weights):
    """Prompts whose checksum is odd get one reward for the whole group (no signal); the others vary."""
    import zlib

    scores = varied_reward(prompts, completions, truths, weights)
    return [r if zlib.crc32(p.encode()) % 2 == 0 else _Result(0.25) for p, r in zip(prompts, scores)]


def test_dynamic_sampling_fills_the_batch_with_groups_that_differ_and_logs_the_cost(tmp_path, tiny_model_dir, small_data,
                                                                                      scorer):
    plain = make(tmp_path / "plain", tiny_model_dir, small_data, scorer, reward_fn=_flat_by_prompt, batch_positions=4,
                 mix_env_ratio=0.5)
    groups = plain.collect(0, {})
    flat = sum(max(r.reward for r in g) == min(r.reward for r in g) for g in groups)
    assert flat >= 1, "the check needs flat groups to replace"
    assert plain.collect_stats == {"zero_var_share_sampled": flat / 4}
    for oversample in (1.0, 2.0):
        tr = make(tmp_path / str(oversample), tiny_model_dir, small_data, scorer, reward_fn=_flat_by_prompt,
                  batch_positions=4, mix_env_ratio=0.5, dynamic_sampling=8, dynamic_sampling_oversample=oversample)
        groups = tr.collect(0, {})
        st = tr.collect_stats
        assert [g[0].task for g in groups] == ["P", "P", "A", "A"]  # the task mix is kept
        assert all(max(r.reward for r in g) > min(r.reward for r in g) for g in groups) and st["dynamic/unfilled"] == 0
        drawn = sum(v["cursor"] + v["epoch"] * len(tr.prompts.pools[k]) for k, v in tr.prompts.state.items())
        assert st["dynamic/extra_samples"] == (drawn - 4) * 4  # every extra prompt drawn cost G completions
        assert st["dynamic/extra_per_kept"] == st["dynamic/extra_samples"] / 4
        assert 1 <= st["dynamic/rounds"] <= 8
        assert st["zero_var_share_sampled"] > 0  # what the sampler met, unlike the batch's zero_var_share
    rec = tr.train_step()
    assert rec["zero_var_share"] == 0.0 and "dynamic/extra_per_kept" in rec


def test_truncated_completions_masked_out_of_the_loss_or_scored_malformed(tmp_path, tiny_model_dir, small_data, scorer):
    batches = {}
    for mode in ("score", "mask", "malformed"):
        tr = make(tmp_path / mode, tiny_model_dir, small_data, scorer, reward_fn=varied_reward, max_new_tokens=12,
                  batch_positions=4, truncated_completions=mode)  # 16 rows: some stop within 12 tokens, some not
        batches[mode] = tr.assemble(tr.collect(0, {}))
    score, mask, bad = batches["score"], batches["mask"], batches["malformed"]
    cut = [i for i, r in enumerate(score.rows) if r.finish == "length"]
    assert cut and len(cut) < len(score.rows), "the check needs truncated and finished completions"
    assert [r.text for r in mask.rows] == [r.text for r in score.rows]  # the same samples in each mode
    assert torch.equal(mask.advantages, score.advantages)  # still in their groups' advantages ...
    assert mask.completion_mask[cut].sum() == 0  # ... out of the loss
    keep = [i for i in range(len(score.rows)) if i not in cut]
    assert torch.equal(mask.completion_mask[keep], score.completion_mask[keep])
    assert all(bad.rows[i].reward == -0.3 and not bad.rows[i].valid for i in cut)  # malformed_penalty
    assert all(bad.rows[i].reward == score.rows[i].reward for i in keep)


def test_sampler_correction_reweights_tokens_where_the_sampler_differs(tmp_path, tiny_model_dir, small_data, scorer):
    """Where the sampler's log-probs are not the trainer's (a bf16 or external sampler), tis_cap
    weights each token by min(pi_old / pi_sampler, cap) and logs what it corrected; without a
    mismatch (float32 here) the weights are 1 to float32 rounding and the update is unchanged."""
    out = {}
    for name, cap, shift in (("plain", None, 0.0), ("tis", 2.0, 0.0), ("tis-mismatch", 2.0, 1.0)):
        tr = make(tmp_path / name, tiny_model_dir, small_data, scorer, reward_fn=varied_reward, tis_cap=cap)
        batch = tr.assemble(tr.collect(0, {}))
        if shift:  # a sampler that found every other token e^1 less likely than the trainer does
            batch.sampler_logp[:, ::2] -= shift * batch.completion_mask[:, ::2]
        out[name] = _frozen_weights_update(tr, batch)
    (mp, gp), (mt, gt), (mm, gm) = out["plain"], out["tis"], out["tis-mismatch"]
    assert "tis_weight_mean" not in mp and abs(mt["tis_weight_mean"] - 1) < 1e-4 and mt["tis_capped"] == 0.0
    torch.testing.assert_close(gt, gp, rtol=1e-3, atol=1e-7)  # weights 1 +- 1e-5: the same update
    assert mm["tis_capped"] > 0.3 and mm["tis_weight_max"] == pytest.approx(math.e, rel=1e-3)
    assert (gm - gp).norm() > 0.05 * gp.norm()


def test_check_share_draws_positions_in_check_beside_puzzles_and_resumes_exactly(small_data):
    """With a quarter of the P: prompts puzzles and half of the rest in check: exactly those shares,
    deterministically, and a resumed sampler draws what the straight one would have."""
    from rookworld_rlvr.data.io import Sample
    from rookworld_rlvr.grpo.prompts import PromptSampler
    from rookworld_rlvr.tasks.strength import Puzzle, in_check

    pol = [s for s in read_samples(small_data / "train.jsonl") if s.task == "P"]
    assert 0 < sum(in_check(s.fen) for s in pol) < len(pol)
    mates = [Sample("P", Puzzle("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1", ("a1a8",), "mate1"))]

    def sampler():
        return PromptSampler({"P": pol, "P_puzzle": mates}, seed=3, puzzle_share=0.25, check_share=0.5)

    straight = sampler()
    drawn = straight.take("P", 16)
    kinds = ["puzzle" if isinstance(s.truth, Puzzle) else "check" if in_check(s.fen) else "P" for s in drawn]
    assert kinds.count("puzzle") == 4 and kinds.count("check") == 6 and kinds.count("P") == 6
    half = sampler()
    first = half.take("P", 7)
    saved = json.loads(json.dumps(half.state))
    again = sampler()
    again.load_state(saved)
    assert [s.fen for s in first + again.take("P", 9)] == [s.fen for s in drawn]
    with pytest.raises(ValueError, match="no P: position of the training data is in check"):
        PromptSampler({"P": [s for s in pol if not in_check(s.fen)]}, seed=0, check_share=0.3)


def test_positions_in_check_are_told_apart_in_forked_workers_as_in_one_process(monkeypatch):
    """From PARALLEL_ROWS positions on (a GPU base's million P: rows), in_check_flags spreads them over forked
    workers: the same flags in the same order, so `check_share`'s pools and the anchor's `out_of_check` rows
    are those of one process."""
    import lzma

    from conftest import REPO
    from rookworld_rlvr.data import io as data_io
    from rookworld_rlvr.grpo import prompts
    from rookworld_rlvr.grpo.prompts import PromptSampler, in_check_flags, out_of_check
    from rookworld_rlvr.tasks.strength import in_check

    with lzma.open(REPO / "data" / "train.jsonl.xz", "rt") as fh:
        rows = [data_io.sample_from_row(json.loads(line)) for _, line in zip(range(6000), fh)]
    pol = [s for s in rows if s.task == "P"]
    serial = [in_check(s.fen) for s in pol]
    assert 0 < sum(serial) < len(pol) and in_check_flags(pol) == serial  # under PARALLEL_ROWS: one process
    forks = []
    real = data_io.mp.get_context
    monkeypatch.setattr(data_io.mp, "get_context", lambda method: forks.append(method) or real(method))
    monkeypatch.setattr(data_io, "PARALLEL_ROWS", 1000)
    monkeypatch.setattr(prompts, "pool_size", lambda: 2)  # the default workers, on any machine
    assert in_check_flags(pol, workers=2) == serial and forks == ["fork"]
    assert out_of_check(pol) == [s for s, check in zip(pol, serial) if not check] and len(forks) == 2
    split = PromptSampler({"P": pol}, seed=0, check_share=0.5).pools
    assert split["P_check"] == [s for s, check in zip(pol, serial) if check] and len(forks) == 3


def test_schedule_step_follows_the_larger_of_steps_and_time():
    from rookworld_rlvr.grpo.control import schedule_step

    assert schedule_step(3, 10, 1e9, None) == 3  # no budget: the step alone
    assert schedule_step(3, 10, 30.0, 60.0) == 5  # half the time used: halfway through the schedule
    assert schedule_step(8, 10, 30.0, 60.0) == 8  # steps ahead of the clock
    assert schedule_step(3, 10, 600.0, 60.0) == 10  # past the budget: the end of the schedule, not beyond


def test_max_minutes_ends_the_run_evaluated_and_saved_and_resume_does_not_train_on(
        tmp_path, tiny_model_dir, small_data, scorer):
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, steps=50, max_minutes=1e-4, eval_limit=4,
              save_every=20)  # 6 ms: over after the first step
    tr.eval_fn = lambda model, tokenizer: {"probe": 1.0}
    summary = tr.train()
    assert summary["steps"] == 1 and summary["ended_by_time"] is True
    assert summary["base"]["step"] == 0 and summary["final"]["step"] == 1  # evaluated at its end
    assert [s for s, _ in ckpt.list_checkpoints(tr.run_dir)][-1] == 1  # saved at its end
    assert (tr.run_dir / "final" / "config.json").exists()
    again = make(tmp_path, tiny_model_dir, small_data, scorer, steps=50, max_minutes=1e-4, eval_limit=4,
                 save_every=20, resume=True)
    assert again.clock >= 1e-4 * 60  # the time spent before the resume counts
    assert again.train()["steps"] == 1


def test_max_minutes_moves_the_lr_schedule_with_the_time_used(tmp_path, tiny_model_dir, small_data, scorer):
    from rookworld_rlvr.grpo.control import cosine_lr

    steps = 10
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, steps=steps, max_minutes=60.0)
    tr.clock = 30 * 60.0  # half the budget used before the first step
    m = tr.update(tr.assemble(tr.collect(0, {})), 0, {})
    assert m["lr"] == pytest.approx(tr.cfg.lr * cosine_lr(5, steps, 0, tr.cfg.min_lr_ratio))
    plain = make(tmp_path / "b", tiny_model_dir, small_data, scorer, steps=steps)
    assert plain.update(plain.assemble(plain.collect(0, {})), 0, {})["lr"] == pytest.approx(tr.cfg.lr)


def test_max_minutes_is_validated():
    with pytest.raises(ValueError, match="max_minutes"):
        load_config(None, {"max_minutes": 0})
    with pytest.raises(ValueError, match="max_minutes"):
        load_config(None, {"max_minutes": "-1"})


def test_a_run_whose_time_ends_on_a_rollback_still_ends_evaluated(tmp_path, tiny_model_dir, small_data, scorer):
    """The step a guard rolls back to was never evaluated: the final model and the final evaluation must agree."""
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, steps=50, max_minutes=60.0, save_every=1,
              guard_max_recoveries=3)
    tr.eval_fn = lambda model, tokenizer: {"probe": 1.0}
    real_step = tr.train_step

    def step_then_collapse():
        record = real_step()
        if tr.step == 2:  # a collapse at step 2 with the time up: back to step 1
            tr.clock = 3600.0
            rollback(tr, "injected collapse", 1)
            return None
        return record

    tr.train_step = step_then_collapse
    tr._tick = lambda: None  # the clock is the test's
    summary = tr.train()
    assert summary["steps"] == 1 and summary["ended_by_time"] is True
    assert summary["final"]["step"] == 1 and [s for s, _ in ckpt.list_checkpoints(tr.run_dir)][-1] == 1


class _Watching(RewardScorer):
    """The real scorer, noting how many engine searches had run when each scoring call began."""

    def score_batch(self, *args, **kwargs):
        self.searched_before_scoring.append(self.engine.stats["engine_calls"])
        return super().score_batch(*args, **kwargs)


def test_scoring_overlapped_with_generation_starts_the_searches_early_and_gives_the_same_rewards(tmp_path, small_data):
    """score_overlap: the Stockfish searches for legal best moves outside the top 5 run for the rows that
    finish while others decode; the rewards, and the searches made, equal scoring after generation."""
    from pathlib import Path

    from rookworld_rlvr.engine import EngineConfig, StockfishPool

    shipped = Path(__file__).resolve().parents[1] / "models" / "rookworld-board"  # writes legal moves off the top 5
    seen = {}
    for setting in ("never", "always"):
        with StockfishPool(EngineConfig(depth=4, workers=2)) as pool:
            scorer = _Watching(engine=pool)
            scorer.searched_before_scoring = []
            fields = make_fields(tmp_path, shipped, small_data)
            fields.update(score_overlap=setting, batch_positions=4, group_size=4, mix_env_ratio=0.5,
                          max_new_tokens=90, output_dir=str(tmp_path / setting), eval_data="", seed=2)
            cfg = load_config(None, fields)
            tr = Trainer(cfg, scorer, read_samples(cfg.data), None, log=lambda *_: None)
            assert tr.overlap == (setting == "always")
            groups = tr.collect(0, {})
            seen[setting] = ([(r.text, r.reward) for g in groups for r in g], scorer.searched_before_scoring[0],
                             pool.stats["engine_calls"])
    assert seen["always"][0] == seen["never"][0]
    assert seen["never"][1] == 0 and seen["always"][1] > 0, "no search started before scoring"
    assert seen["always"][2] == seen["never"][2]  # the same searches, none twice


def test_score_overlap_auto_is_off_on_a_cpu_and_always_needs_a_prefetching_reward(tmp_path, tiny_model_dir,
                                                                                  small_data, scorer):
    assert not make(tmp_path, tiny_model_dir, small_data, scorer, score_overlap="auto").overlap
    assert make(tmp_path, tiny_model_dir, small_data, scorer, reward_fn=scorer, score_overlap="always").overlap
    with pytest.raises(ValueError, match="score_overlap"):
        make(tmp_path, tiny_model_dir, small_data, scorer, score_overlap="always")  # a plain function: no prefetch
    with pytest.raises(ValueError, match="score_overlap"):
        make(tmp_path, tiny_model_dir, small_data, scorer, score_overlap="sometimes")


def test_the_policy_pass_reads_the_device_only_to_shape_each_minibatch(tmp_path, tiny_model_dir, small_data, scorer,
                                                                       monkeypatch):
    """On a GPU every value the host reads (.item(), float(t), bool(t), a selection by mask) waits for the
    device's queue to drain; the loss's ~20 metrics read one by one kept the host and the GPU taking turns.
    Now the loss and its metrics are one read a minibatch (a .tolist(), invisible on a CPU) and the sampler
    agreement and task entropies one after the pass, so the only scalar reads left are the two that shape a
    minibatch's forward (its unused left-pad columns, whether its groups share their prompts). Counted here
    on the CPU at the dispatcher, with the metrics still there."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import rookworld_rlvr.grpo.trainer as trainer_module

    reads = {"scalar": 0, "by mask": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                reads["scalar"] += 1
            elif func in (torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default):
                reads["by mask"] += 1
            return func(*args, **(kwargs or {}))

    real = trainer_module.policy_pass
    passes = []

    def counted(*args, **kw):
        with Count():
            out = real(*args, **kw)
        passes.append(out)
        return out

    monkeypatch.setattr(trainer_module, "policy_pass", counted)
    tr = make(tmp_path, tiny_model_dir, small_data, scorer, mix_env_ratio=0.5, batch_positions=4, minibatch_size=4,
              kl_coef=0.04, steps=1)
    tr.train_step()
    (agg, finite), = passes
    minibatches = 4 * 4 // 4
    assert finite and reads == {"scalar": 2 * minibatches, "by mask": 0}, reads
    assert {"entropy/P", "entropy/A", "logp_sampler_diff", "kl_mean", "clip_frac", "loss"} <= set(agg)
    assert all(math.isfinite(v) for v in agg.values())


def test_decode_graph_samples_the_same_groups_and_records_nothing(tmp_path, tiny_model_dir, small_data, scorer):
    """The shape-stable decode step (a CUDA graph on CUDA) changes no sample: the same texts, rewards
    and sampler log-probs as the default decoding; it turns record_rollout off and refuses always."""
    runs = {}
    for on in (False, True):
        tr = make(tmp_path, tiny_model_dir, small_data, scorer, decode_graph=on, output_dir=str(tmp_path / f"g{on}"),
                  mix_env_ratio=0.5, record_rollout="auto")
        assert tr.graph == on and (not on or (not tr.record and "decode_graph" in tr.record_note))
        runs[on] = [r for g in tr.collect(0, {}) for r in g]
    assert [(r.text, r.reward) for r in runs[True]] == [(r.text, r.reward) for r in runs[False]]
    assert_rounding_close(torch.tensor([x for r in runs[True] for x in r.sampler_logp]),
                          torch.tensor([x for r in runs[False] for x in r.sampler_logp]), logprob_terms(tr.policy),
                          "sampler log-probs")
    with pytest.raises(ValueError, match="decode_graph"):
        make(tmp_path, tiny_model_dir, small_data, scorer, decode_graph=True, record_rollout="always")
