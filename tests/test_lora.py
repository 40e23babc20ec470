"""LoRA GRPO (lora_r > 0, needs peft) on the tiny GPT-2: the reference is the base with adapters
disabled, only adapters train, checkpoints are merged plain transformers models."""

import json
import re
import shutil
import sys

import pytest
import torch

pytest.importorskip("peft")

from conftest import packs_weights  # noqa: E402
from numerics import assert_rounding_close, logprob_terms, rounding_atol  # noqa: E402
from test_trainer import make, make_fields, varied_reward  # noqa: E402

from rookworld_rlvr.config import TrainConfig, load_config  # noqa: E402
from rookworld_rlvr.grpo import checkpoint as ckpt  # noqa: E402
from rookworld_rlvr.grpo.state import rollback, save  # noqa: E402
from rookworld_rlvr.model import generate, load_policy  # noqa: E402

LORA = dict(lora_r=4, lora_alpha=8.0, steps=2, batch_positions=2, group_size=4, max_new_tokens=16, kl_coef=0.04)
PROMPT = "P: 8/8/8/8/8/8/8/k6K w - - 0 1 "


def lora_trainer(tmp_path, tiny_model_dir, small_data, **over):
    return make(tmp_path, tiny_model_dir, small_data, None, varied_reward, **{**LORA, **over})


def adapters(tr):
    return {n: p.detach().clone() for n, p in tr.policy.named_parameters() if "lora_" in n}


def base_weights(tr):
    return {n: p.detach().clone() for n, p in tr.policy.named_parameters() if "lora_" not in n}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir, small_data):
    """Two GRPO steps with a high LR; returns the trainer and the weights before training."""
    tmp = tmp_path_factory.mktemp("lora")
    tr = lora_trainer(tmp, tiny_model_dir, small_data, lr=0.05)
    before = base_weights(tr), adapters(tr)
    tr.train()
    return tr, tmp / "run", before


def test_step_zero_kl_is_zero_and_ratio_one_without_a_second_model(tmp_path, tiny_model_dir, small_data):
    tr = lora_trainer(tmp_path, tiny_model_dir, small_data)
    assert tr.ref is None and tr.use_ref
    assert not any(m.training for m in tr.policy.modules()), "dropout must stay off"
    assert all(p.requires_grad == ("lora_" in n) for n, p in tr.policy.named_parameters())
    assert sum(len(g["params"]) for g in tr.opt.param_groups) == len(adapters(tr))
    batch = tr.assemble(tr.collect(0, {}))
    m = tr.update(batch, 0, {})
    assert m["kl_mean"] == 0.0 and m["kl_max"] == 0.0
    assert m["ratio_mean"] == 1.0 and m["ratio_max"] == 1.0  # exp(logp - logp.detach()) is exactly 1
    assert m["logp_sampler_diff"] <= rounding_atol(batch.sampler_logp, logprob_terms(tr.sampler()))


def test_only_adapters_train_and_kl_grows(trained):
    tr, run, (base_before, lora_before) = trained
    assert all(torch.equal(v, base_weights(tr)[n]) for n, v in base_before.items()), "base weights moved"
    after = adapters(tr)
    assert any(not torch.equal(v, after[n]) for n, v in lora_before.items()), "adapters did not move"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert records[1]["kl_mean"] > 0  # step 2 compares the trained adapters with the base
    # step 2 sampled from the merged copy with adapters that had moved: the trainer's recompute agrees
    assert records[1]["logp_sampler_diff"] < 1e-4


def test_sampler_is_a_plain_gpt2_holding_base_plus_adapters(trained):
    from rookworld_rlvr.model import gpt2_decode

    tr, _, _ = trained
    sampler = tr.sampler()
    assert gpt2_decode.supports(sampler), "the sampler must take the cascade decoding path"
    assert not any(p.requires_grad for p in sampler.parameters())
    ids = tr.tokenizer([PROMPT + "M: e2e4"], return_tensors="pt").input_ids
    with torch.no_grad():
        want = tr.policy(input_ids=ids).logits
        got = sampler(input_ids=ids).logits
    assert_rounding_close(got, want, logprob_terms(sampler), "merged sampler logits")  # W + BA rounds once more
    with torch.no_grad(), tr.policy.disable_adapter():
        base = tr.policy(input_ids=ids).logits
    assert (want - base).abs().max() > 1e-3, "the adapters moved, so the merged model differs from the base"


def test_final_and_checkpoints_are_merged_plain_transformers_models(trained):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    tr, run, _ = trained
    for path in (run / "final", ckpt.latest_checkpoint(run)):
        assert not any("lora" in k for k in load_file(path / "model.safetensors"))
        load_policy(str(path), device="cpu", verbose=False)  # strict: no missing or unexpected weights
    plain = AutoModelForCausalLM.from_pretrained(run / "final").eval()
    ours = generate(tr.policy, tr.tokenizer, [PROMPT], max_new_tokens=16, greedy=True)  # peft: the stock path
    theirs = generate(plain, tr.tokenizer, [PROMPT], max_new_tokens=16, greedy=True)
    assert torch.equal(ours.completion_ids, theirs.completion_ids)
    assert_rounding_close(ours.logprobs, theirs.logprobs, logprob_terms(plain), "merged checkpoint log-probs")


def test_resume_rebuilds_base_plus_adapters_and_continues(trained, tmp_path, tiny_model_dir, small_data):
    tr, run, _ = trained
    shutil.copytree(run, tmp_path / "run")
    resumed = lora_trainer(tmp_path, tiny_model_dir, small_data, lr=0.05, steps=3, resume=True)
    assert resumed.step == 2
    want, got = adapters(tr), adapters(resumed)
    assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)
    assert all(torch.equal(v, base_weights(resumed)[n]) for n, v in base_weights(tr).items())
    for a, b in zip(tr.opt.state.values(), resumed.opt.state.values(), strict=True):
        assert torch.equal(a["exp_avg"], b["exp_avg"])
    resumed.train()
    assert resumed.step == 3
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]


def test_rollback_restores_adapters(tmp_path, tiny_model_dir, small_data):
    tr = lora_trainer(tmp_path, tiny_model_dir, small_data)
    save(tr)
    saved, base = adapters(tr), base_weights(tr)
    with torch.no_grad():
        for n, p in tr.policy.named_parameters():
            if "lora_" in n:
                p.add_(1.0)
    rollback(tr, "test")
    assert all(torch.equal(v, adapters(tr)[n]) for n, v in saved.items())
    assert all(torch.equal(v, base_weights(tr)[n]) for n, v in base.items())
    assert tr.lr_scale == 0.3  # the default rollback_lr_factor


def test_wrapping_the_policy_warns_of_nothing(tiny_model_dir):
    """peft reads transformers' deprecated `is_gradient_checkpointing`: a FutureWarning at every LoRA run that
    no user can act on (their code, not the user's) is not shown."""
    import warnings

    from rookworld_rlvr.grpo.lora import wrap_lora

    model, _ = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped = wrap_lora(model, TrainConfig(lora_r=4, lora_alpha=8.0))
    assert any("lora_" in n for n, _ in wrapped.named_parameters())


def test_config_rejects_lora_dropout_and_conflicts():
    with pytest.raises(ValueError, match="lora_dropout' was removed: dropout is off"):  # its one legal value was 0
        load_config(None, {"lora_r": 4, "lora_dropout": 0.1})
    with pytest.raises(ValueError, match="lora_r"):
        load_config(None, {"lora_r": -1})
    with pytest.raises(ValueError, match="ref_refresh_every"):
        load_config(None, {"lora_r": 4, "ref_refresh_every": 5})
    with pytest.raises(ValueError, match="lora_targets"):
        TrainConfig(lora_r=4, lora_targets=" , ").validate()
    cfg = load_config(None, {"lora_r": "8", "lora_alpha": "16", "lora_targets": "c_attn, c_fc"})
    assert cfg.lora_alpha == 16.0 and cfg.lora_targets == "c_attn, c_fc"


def test_missing_peft_is_a_clear_error(tmp_path, tiny_model_dir, small_data, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft -> ImportError
    with pytest.raises(ImportError, match=r"lora_r > 0 needs peft: pip install 'rookworld-rlvr\[lora\]'"):
        lora_trainer(tmp_path, tiny_model_dir, small_data)


def test_adapters_on_a_tied_layer_are_refused(tmp_path, tiny_model_dir, small_data):
    """GPT-2's lm_head shares its weight with wte: merging an adapter there changes both ends. Refused before peft
    wraps the model, so that the error is all a user sees (peft warned twice of the tie first)."""
    import warnings

    with pytest.raises(ValueError, match="lora_targets.*lm_head shares its weight with transformer.wte"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            lora_trainer(tmp_path, tiny_model_dir, small_data, lora_targets="c_attn,lm_head")
    # and `--dry-run` says so, from the model's config alone, before a run would load it
    from rookworld_rlvr.grpo.dryrun import dry_run

    said: list[str] = []
    fields = {**make_fields(tmp_path, tiny_model_dir, small_data), **LORA}
    assert dry_run(load_config(None, {**fields, "lora_targets": "c_attn,lm_head"}), out=said.append) == 1
    assert "error: config field 'lora_targets': lm_head shares its weight with transformer.wte" in said[-1]
    assert dry_run(load_config(None, fields), out=said.append) == 0
    other = tmp_path / "t5"  # a model whose config makes no causal LM: a line, not a traceback
    shutil.copytree(tiny_model_dir, other)
    (other / "config.json").write_text(json.dumps({"model_type": "t5"}))
    assert dry_run(load_config(None, {**fields, "model": str(other)}), out=said.append) == 1
    assert f"error: model: {other}: its config.json makes no causal language model" in said[-1]


@pytest.mark.parametrize("targets,why", [
    ("c_attn,c_fcc", "'c_fcc' names no module of the model (those that take adapters: c_attn, c_fc, c_proj, lm_head, "
                     "wpe, wte)"),
    ("h.0.attn.c_attn", "'h.0.attn.c_attn' names no module of the model"),
    ("c_attn,ln_1", "'ln_1' names a LayerNorm, which takes no adapter (those that do: c_attn,"),
], ids=["misspelt", "dotted-path", "layer-norm"])
def test_a_target_that_names_no_module_taking_adapters_is_refused(tmp_path, tiny_model_dir, small_data, targets, why):
    """peft adapts what any name of the list matches and drops the others without a word: `c_attn,c_fcc` trained
    adapters on c_attn alone. Now each name must be the last part of modules that take adapters: the run and
    `--dry-run` stop with one line naming it and listing those that do."""
    with pytest.raises(ValueError, match="config field 'lora_targets': " + re.escape(why)):
        lora_trainer(tmp_path, tiny_model_dir, small_data, lora_targets=targets)
    from rookworld_rlvr.grpo.dryrun import dry_run

    said: list[str] = []
    fields = {**make_fields(tmp_path, tiny_model_dir, small_data), **LORA, "lora_targets": targets}
    assert dry_run(load_config(None, fields), out=said.append) == 1
    assert f"error: config field 'lora_targets': {why}" in said[-1]


def test_old_policy_pass_on_packed_base_weights_keeps_the_adapters(trained):
    """With updates_per_batch > 1 the old-policy pass runs on packed weights: under LoRA the packed
    base Conv1Ds sit inside the adapter layers, whose (trained, non-zero) deltas must still apply."""
    from transformers.pytorch_utils import Conv1D

    from rookworld_rlvr.model.gpt2_decode import packed_projections

    tr, _, _ = trained
    batch = tr.assemble(tr.collect(tr.step, {}))
    rows = slice(0, len(batch.rows))
    net = tr.forward_model
    with torch.no_grad():
        plain = tr.passes(tr.step).logprobs(net, batch, rows, tr.device, False, False)["logprobs"]
        base_only = tr.policy.disable_adapter()
        with base_only:
            base = tr.passes(tr.step).logprobs(net, batch, rows, tr.device, False, False)["logprobs"]
        with packed_projections(net):
            assert any("forward" in vars(m) for m in net.modules() if isinstance(m, Conv1D)) == packs_weights(net)
            packed = tr.passes(tr.step).logprobs(net, batch, rows, tr.device, False, False)["logprobs"]
    assert (plain - base).abs().max() > 1e-3, "test lost its teeth: the adapters change nothing"
    assert_rounding_close(packed, plain, logprob_terms(net), "packed projections")
