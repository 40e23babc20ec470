"""The path of a GPU user training RookWorld-LM (configs/rookworld-124m.yaml), end to end on a CPU
at toy size: a GPT-2 with a byte-level BPE tokenizer like RookWorld-LM's, trained briefly on
upstream padded-layout text (`P: {fen:90}M: ...`), then `rookworld train` with that preset (its
layout, bf16 autocast, KL threshold, minibatches; only the model, device, data and sizes
overridden), `rookworld eval` on the result, and the saved model reloaded with plain
`transformers`, generating the same tokens as our sampler.

A base this small writes no parseable answer yet, so every GRPO group's rewards are equal (the
malformed penalty) and GRPO alone would not move it; the run adds the anchor (a supervised loss on
both tasks' ground-truth answers, rendered in the padded layout) so the update, and the checkpoint
it saves, are real.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from conftest import REPO, build_bpe_tokenizer, held_out_fields, random_transitions  # noqa: E402
from rookworld_rlvr.cli import main
from rookworld_rlvr.data.io import Sample, write_samples
from rookworld_rlvr.model import generate, load_policy, save_pretrained_atomic, tiny_config
from rookworld_rlvr.sft import make_batch
from rookworld_rlvr.tasks import environment as env_task
from rookworld_rlvr.tasks import policy as pol_task

pytestmark = pytest.mark.usefixtures("one_thread", "stockfish_path")


@pytest.fixture(scope="module")
def upstream(reference_lines, tmp_path_factory):
    """Samples and their upstream text: P: in the padded layout, A: as upstream writes it."""
    pol = [Sample("P", pol_task.parse_line(line)) for line in reference_lines[:160]]
    env = [Sample("A", t) for t in random_transitions(160, seed=11)]
    root = tmp_path_factory.mktemp("upstream")
    write_samples(root / "train.jsonl", pol[:150] + env[:150])
    write_samples(root / "eval.jsonl", pol[150:] + env[150:])
    texts = [pol_task.render(s.truth, "padded") for s in pol[:150]] + [env_task.render(s.truth) for s in env[:150]]
    assert texts[0].startswith("P: ") and texts[0][3:93].rstrip() == pol[0].truth.fen and texts[0][93:].startswith("M: ")
    return root, texts


@pytest.fixture(scope="module")
def base(upstream, tmp_path_factory) -> Path:
    """A 2 x 64 GPT-2 with a 384-token byte-level BPE, 40 steps of language modelling on the text."""
    from transformers import GPT2LMHeadModel

    _, texts = upstream
    tok = build_bpe_tokenizer(texts, vocab_size=384)
    cfg = tiny_config(len(tok), "tiny", n_positions=320, eos_token_id=tok.eos_token_id)
    cfg.n_layer, cfg.n_embd, cfg.n_head = 2, 64, 4
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    rows = [(tok(t)["input_ids"] + [tok.eos_token_id], 1) for t in texts]
    assert max(len(ids) for ids, _ in rows) < 320 and sum(len(ids) for ids, _ in rows) < 0.8 * sum(map(len, texts))  # BPE merges
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng, losses = random.Random(0), []
    model.train()
    for _ in range(40):
        ids, mask, labels = make_batch(rng.sample(rows, 8), tok.pad_token_id, "full")
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5]), losses  # it learned something of the text
    out = tmp_path_factory.mktemp("base") / "model"
    save_pretrained_atomic(model.eval(), tok, out)
    return out


@pytest.mark.slow
def test_rookworld_lm_preset_trains_evaluates_and_saves_a_plain_transformers_model(upstream, base, small_data, tmp_path,
                                                                                  capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data, _ = upstream
    run = tmp_path / "run"
    code = main(["train", "--config", str(REPO / "configs" / "rookworld-124m.yaml"),
                 "--model", str(base), "--device", "cpu", "--threads", "1",
                 "--data", str(data / "train.jsonl"), "--eval-data", str(data / "eval.jsonl"), "--eval-limit", "4",
                 *(x for k, v in held_out_fields(small_data).items() for x in ("--" + k.replace("_", "-"), v)),
                 "--output-dir", str(run), "--steps", "2", "--batch-positions", "2", "--group-size", "4",
                 "--minibatch-size", "4", "--max-new-tokens", "96", "--engine-workers", "1", "--engine-cache", "null",
                 "--anchor-coef", "1.0", "--anchor-tasks", "PA", "--anchor-batch", "4",
                 "--save-every", "1", "--tensorboard", "false", "--report", "false", "--progress", "false"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    verdict = out.out.index("verdict: base -> final")  # the verdict ends the run's output, after every metric
    assert out.out.index("every held-out metric") < verdict and "| within noise" in out.out[verdict:]
    config = (run / "config.yaml").read_text()
    for line in ("layout: padded", "autocast: bf16", "decode_graph: true", "guard_kl_mean: 0.5", "lr: 1.0e-06"):
        assert line in config, line  # the preset's own settings ran
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all("reward/P" in r and "reward/A" in r and r["anchor_nll"] > 0 for r in records), records
    held_out = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in held_out] == [0, 2]  # base and final, each on every held-out set given
    assert all(e["puzzles"][kind]["n"] == 3 for e in held_out for kind in ("mate1", "tactic", "check"))
    assert all(e["strength"]["n"] == 6 and e["histories"]["n"] == 6 and e["policy"]["n"] == 4 for e in held_out)
    final = run / "final"
    base_model, _ = load_policy(str(base), device="cpu", verbose=False)
    trained, tok = load_policy(str(final), device="cpu", verbose=False)
    assert any(not torch.equal(p, q)
               for p, q in zip(base_model.parameters(), trained.parameters(), strict=True)), "no update"

    report = tmp_path / "eval.json"
    assert main(["eval", "--model", str(final), "--data", str(data / "eval.jsonl"), "--layout", "padded",
                 "--limit", "4", "--max-new-tokens", "96", "--device", "cpu", "--json", str(report), "--quiet"]) == 0
    result = json.loads(report.read_text())
    assert result["policy"]["n"] == 4 and result["environment"]["n"] == 4
    assert 0 <= result["policy"]["invalid"] <= 1 and 0 <= result["environment"]["invalid"] <= 1

    # plain transformers: the saved model and tokenizer generate our sampler's greedy tokens
    prompts = [pol_task.prompt(pol_task.parse_line(line).fen, "padded")
               for line in (REPO / "data" / "reference" / "rook_val_500.txt").read_text().split("\n")[170:172]]
    t = random_transitions(1, seed=5)[0]
    prompts.append(env_task.prompt(t.fen, t.move, t.history))
    ours = generate(trained, tok, prompts, max_new_tokens=48, greedy=True)
    hf_model = AutoModelForCausalLM.from_pretrained(final).eval()
    hf_tok = AutoTokenizer.from_pretrained(final)
    enc = hf_tok(prompts, padding=True, return_tensors="pt")
    assert torch.equal(enc["input_ids"], ours.prompt_ids)
    with torch.no_grad():
        theirs = hf_model.generate(**enc, max_new_tokens=48, do_sample=False, pad_token_id=hf_tok.pad_token_id,
                                   eos_token_id=hf_tok.eos_token_id)
    assert torch.equal(theirs[:, enc["input_ids"].shape[1]:], ours.completion_ids)
    assert hf_tok.batch_decode(theirs[:, enc["input_ids"].shape[1]:], skip_special_tokens=True) == ours.texts
