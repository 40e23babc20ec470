"""Tests that need a GPU: the CUDA kernels under the invariants the CPU suite proves on a CPU.

Marked `gpu` and deselected from the CPU suite by pyproject's `-m "not gpu"` (never skipped);
`scripts/gpu_check.sh` runs them with `-m gpu` on the device in ROOKWORLD_TEST_DEVICE (default
cuda), and its `--smoke` mode runs the same code on the CPU, so a CPU test proves they run at all.
Where CUDA is asked for and missing, every test fails, naming the cause.
"""

from __future__ import annotations

import json
import os
import random

import pytest
import torch

from conftest import REPO
from rookworld_rlvr.config import load_config
from rookworld_rlvr.data.io import read_samples
from rookworld_rlvr.grpo import checkpoint as ckpt
from rookworld_rlvr.grpo.runlog import append_jsonl
from rookworld_rlvr.grpo.state import save
from rookworld_rlvr.grpo.trainer import Trainer
from rookworld_rlvr.model import generate, load_policy, token_logprobs

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("ROOKWORLD_TEST_DEVICE", "cuda")
SHIPPED = REPO / "models" / "rookworld-board"
BF16_LOGP_BOUND = 0.25  # nats, largest per-token gap: bf16 keeps 8 bits, logits of magnitude ~20 round by ~0.08
TF32_LOGP_BOUND = BF16_LOGP_BOUND / 8  # TF32 keeps 11 bits, and rounds only the products' inputs


@pytest.fixture(scope="module", autouse=True)
def device() -> torch.device:
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        pytest.fail(f"ROOKWORLD_TEST_DEVICE={DEVICE} but torch sees no CUDA device (torch {torch.__version__}); "
                    "these tests run on a GPU machine (scripts/gpu_check.sh), or with --smoke on the CPU")
    return torch.device(DEVICE)


@pytest.fixture(autouse=True)
def _small_fresh_models_on_the_cpu(device, request):
    """On the CPU (gpu_check.sh --smoke, which proves these tests run) a fresh SFT model's `tiny` preset at a
    small shape (conftest: small_tiny_preset); on a GPU the shipped one, whose head size the kernels see."""
    if device.type == "cpu":
        request.getfixturevalue("small_tiny_preset")


@pytest.fixture
def ieee_float32(float32_matmul):
    """float32 products in IEEE float32: the process's choice, which `resolve_device` keeps (on CUDA it would
    otherwise pick TF32, whose 11 bits the float32 comparisons here are not about)."""
    float32_matmul.allow_tf32 = False
    return float32_matmul


class _Result:
    def __init__(self, total):
        self.total, self.components, self.valid_format = total, {"chars": total}, True


def varied_reward(prompts, completions, truths, weights):
    return [_Result(sum(c.isdigit() for c in t) / max(len(t), 1) + 0.01 * (len(t) % 7)) for t in completions]


def mixed_prompts(n: int = 64) -> list[str]:
    """n held-out prompts, P: and A: alternating, of different lengths (short and long histories)."""
    rows = read_samples(REPO / "data" / "eval.jsonl.gz")
    rng = random.Random(0)
    pol = [s for s in rows if s.task == "P"]
    env = [s for s in rows if s.task == "A"]
    picked = [x for pair in zip(rng.sample(pol, n // 2), rng.sample(env, n // 2)) for x in pair]
    return [s.render("compact")[0] for s in picked]


def trainer(tmp_path, tiny_model_dir, small_data, device: torch.device, **over) -> Trainer:
    fields = dict(model=str(tiny_model_dir), data=str(small_data / "train.jsonl"), eval_data="",
                  output_dir=str(tmp_path / "run"), steps=2, batch_positions=2, group_size=4, max_new_tokens=24,
                  lr=1e-3, warmup_steps=0, save_every=1, tensorboard=False, progress=False, report=False, seed=1,
                  engine_cache=None, device=str(device), backward_dtype="float32", mix_env_ratio=0.5)
    fields.update(over)
    cfg = load_config(None, fields)
    return Trainer(cfg, varied_reward, read_samples(cfg.data), None, log=lambda *_: None)


def test_greedy_generation_on_the_device_equals_the_cpus(device, ieee_float32, record_testsuite_property):
    """64 mixed P:/A: prompts of different lengths, float32 (IEEE, not TF32): the same tokens, or at most 2%
    of the completions differ (kernels sum in other orders; a near-tie can flip an argmax). In the CPU smoke
    run (scripts/gpu_check.sh --smoke, where both sides are the CPU) 8 prompts."""
    prompts = mixed_prompts(64 if device.type == "cuda" else 8)
    texts = {}
    for where in ("cpu", device):
        model, tok = load_policy(str(SHIPPED), device=str(where), verbose=False)
        texts[str(where)] = generate(model, tok, prompts, max_new_tokens=100, greedy=True).texts
    differ = sum(a != b for a, b in zip(texts["cpu"], texts[str(device)], strict=True))
    print(f"greedy: {differ} of {len(prompts)} completions differ between cpu and {device}")
    record_testsuite_property("greedy_differ_from_cpu", f"{differ} of {len(prompts)}")  # into gpu_tests.xml
    assert differ <= 0.02 * len(prompts)


def rows_that_differ(a, b, bound: float, greedy: bool) -> int:
    """Two decodings of one batch, row by row: up to a row's first different token both chose the same tokens
    with log-probs within `bound` (the same numbers up to rounding), and, greedy, its first different tokens
    are a near-tie (each the other's top choice within `bound`), which rounding may flip; after it each row
    decodes on from its own choice. Returns how many rows differ."""
    differ = 0
    for i in range(a.completion_ids.shape[0]):
        ta, tb = (g.completion_ids[i][g.completion_mask[i].bool()] for g in (a, b))
        la, lb = (g.logprobs[i][g.completion_mask[i].bool()] for g in (a, b))
        n = min(len(ta), len(tb))
        apart = (ta[:n] != tb[:n]).nonzero()
        first = int(apart[0]) if len(apart) else n
        gap = float((la[:first] - lb[:first]).abs().max()) if first else 0.0
        assert gap <= bound, f"row {i}: log-probs {gap:.2e} apart on the same tokens (bound {bound})"
        if first < n:
            differ += 1
            near = abs(float(la[first] - lb[first]))
            assert not greedy or near <= bound, f"row {i}: token {first} differs and is no near-tie ({near:.2e})"
    return differ


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_decode_graph_replays_sample_what_the_eager_steps_sample(device, autocast, record_testsuite_property):
    """decode_graph: one captured CUDA graph replayed per token (on a CPU the same shape-stable step
    runs eagerly). Greedy on 64 mixed prompts and sampled (16 x 4, one seed) against the default
    decoding: the same tokens and log-probs up to rounding (its attention sums over the whole masked cache,
    another order: TF32_LOGP_BOUND for float32, which CUDA runs in TF32, BF16_LOGP_BOUND under bf16),
    where a greedy row differs its first different token is a near-tie, at most a quarter of the rows
    differ, and every log-prob is finite."""
    cuda = device.type == "cuda"  # (the CPU smoke run of scripts/gpu_check.sh: fewer and shorter, and shorter
    # still in bf16, which a CPU without bf16 arithmetic emulates at 1/60 of float32's speed)
    prompts = mixed_prompts(64 if cuda else 4 if autocast is None else 2)
    tokens = 100 if cuda else 24 if autocast is None else 8
    bound = TF32_LOGP_BOUND if autocast is None else BF16_LOGP_BOUND
    model, tok = load_policy(str(SHIPPED), device=str(device), verbose=False)
    for kw in (dict(greedy=True), dict(num_return_sequences=4, temperature=1.0)):
        batch = prompts if kw.get("greedy") else prompts[:16]
        out = {graph: generate(model, tok, batch, max_new_tokens=tokens, autocast_dtype=autocast,
                               decode_graph=graph,
                               generator=torch.Generator(device=device).manual_seed(0), **kw) for graph in (False, True)}
        differ = rows_that_differ(out[False], out[True], bound, greedy=kw.get("greedy", False))
        print(f"decode_graph {autocast} {kw}: {differ} of {len(out[True].texts)} completions differ")
        record_testsuite_property(f"decode_graph_{'bf16' if autocast else 'float32'}_"
                                  f"{'greedy' if kw.get('greedy') else 'sampled'}_differ",
                                  f"{differ} of {len(out[True].texts)}")
        assert differ <= len(out[True].texts) / 4
        assert torch.isfinite(out[True].logprobs).all()


@pytest.mark.parametrize("autocast,float32,bound", [("none", "ieee", 1e-4), ("none", "default", TF32_LOGP_BOUND),
                                                    ("bf16", "default", BF16_LOGP_BOUND)])
def test_step_zero_kl_ratio_and_sampler_logprobs_on_the_device(tmp_path, tiny_model_dir, small_data, device,
                                                               float32_matmul, autocast, float32, bound,
                                                               record_testsuite_property):
    """Before any update: KL 0 and ratio 1, and the sampler's log-probs equal the trainer's: IEEE float32
    within 1e-4; float32 as a run gets it (on CUDA, TF32) within TF32_LOGP_BOUND; bf16 within
    BF16_LOGP_BOUND, their rounding."""
    if float32 == "ieee":
        float32_matmul.allow_tf32 = False
    tr = trainer(tmp_path, tiny_model_dir, small_data, device, autocast=autocast,
                 backward_dtype="auto" if autocast == "bf16" else "float32")
    expected = "ieee" if float32 == "ieee" else "tf32" if device.type == "cuda" else "none"
    assert float32_matmul.fp32_precision == expected
    batch = tr.assemble(tr.collect(0, {}))
    assert (batch.attention_mask[:, 0] == 0).any(), "the batch must be left-padded"
    m = tr.update(batch, 0, {})
    assert m["kl_mean"] == 0.0 and m["ratio_mean"] == 1.0 and m["ratio_max"] == 1.0
    record_testsuite_property(f"step0_logp_sampler_diff_{autocast}_{float32}", f"{m['logp_sampler_diff']:.3g} "
                              f"(bound {bound:.3g})")
    assert m["logp_sampler_diff"] <= bound, m["logp_sampler_diff"]


def test_check_batch_passes_a_healthy_float32_run_on_the_device(tmp_path, tiny_model_dir, small_data, device,
                                                                  float32_matmul, record_testsuite_property):
    """`rookworld check-batch` on a float32 run as the commands set it up (on CUDA: TF32 products) passes,
    its bound taken from TF32's rounding there."""
    from rookworld_rlvr.grpo.sanity import check_batch

    tr = trainer(tmp_path, tiny_model_dir, small_data, device)
    lines = []
    assert check_batch(tr, max_truncation=1.0, out=lines.append) == 0, "\n".join(lines)
    record_testsuite_property("check_batch_ratio", next(line for line in lines if line.startswith("before the update")))
    assert any("(TF32 rounding)" in line for line in lines) == (device.type == "cuda"), "\n".join(lines)


def test_left_padded_prompts_give_finite_logprobs_in_the_attention_kernels(tiny_model_dir, small_data, device):
    tr_model, tok = load_policy(str(SHIPPED), device=str(device), verbose=False)
    prompts = mixed_prompts(16 if device.type == "cuda" else 4)  # (the CPU smoke run: bf16 may be emulated there)
    enc = tok(prompts, add_special_tokens=False)["input_ids"]
    width = max(map(len, enc)) + 8
    ids = torch.full((len(enc), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(enc):  # left padding, then 8 completion tokens
        ids[i, width - len(row) - 8:width - 8] = torch.tensor(row)
        mask[i, width - len(row) - 8:] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    for dtype in (None, torch.bfloat16):
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = token_logprobs(tr_model, ids.to(device), mask.to(device), pos.to(device), 8, return_entropy=True)
        assert torch.isfinite(out["logprobs"]).all() and torch.isfinite(out["entropy"]).all()


def test_one_grpo_step_a_checkpoint_a_resume_and_the_same_next_step(tmp_path, tiny_model_dir, small_data, device):
    straight = trainer(tmp_path / "a", tiny_model_dir, small_data, device)
    straight.train()
    part = trainer(tmp_path / "b", tiny_model_dir, small_data, device)
    save(part)
    append_jsonl(tmp_path / "b" / "run" / "metrics.jsonl", part.train_step())
    save(part)
    resumed = trainer(tmp_path / "b", tiny_model_dir, small_data, device, resume=True)
    assert resumed.step == 1
    resumed.train()
    a = [json.loads(x) for x in (tmp_path / "a" / "run" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    keys = [k for k in a[1] if not k.startswith(("time/", "logp_sampler_diff"))]
    # CUDA's backward adds with atomics (the embedding's, for one), so the second step may differ in the last
    # bits there; on a CPU it is the same step up to float rounding
    rel = 1e-3 if device.type == "cuda" else 1e-5
    assert {k: b[1][k] for k in keys} == pytest.approx({k: a[1][k] for k in keys}, rel=rel, abs=1e-6)
    assert ckpt.load_state(ckpt.latest_checkpoint(tmp_path / "b" / "run"))["step"] == 2


def test_our_attention_takes_no_cudnn_kernel_on_the_device(tmp_path, tiny_model_dir, small_data, device,
                                                           record_testsuite_property):
    """cuDNN's attention builds an execution graph for every new shape: 3.9 ms of host time a call on an H200,
    where our passes change shape with every batch. A GRPO step (sampling, the policy pass forward and
    backward) and an SFT step attend without it (`attention_backends`: flash, memory-efficient or math), and
    leave the process's choice as it was."""
    from torch.profiler import ProfilerActivity, profile

    from rookworld_rlvr.sft import SFTConfig, train

    flags = torch.backends.cuda.cudnn_sdp_enabled()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer(tmp_path, tiny_model_dir, small_data, device, steps=1).train()
        train(SFTConfig(data=str(small_data / "train.jsonl"), eval_data="", out=str(tmp_path / "m"), steps=1,
                        batch_size=4, save_every=1, device=str(device), threads=None), progress=False)
    ops = {e.key: e.count for e in prof.key_averages()}
    attention = {k: n for k, n in ops.items() if "attention" in k}
    record_testsuite_property("attention_ops", json.dumps(attention))
    assert ops.get("aten::scaled_dot_product_attention", 0) > 0, attention
    assert not [k for k in attention if "cudnn" in k], attention
    assert torch.backends.cuda.cudnn_sdp_enabled() == flags


def test_sft_step_match_and_eval_run_on_the_device(tmp_path, small_data, device, capsys):
    from rookworld_rlvr.cli import main
    from rookworld_rlvr.sft import SFTConfig, train

    train(SFTConfig(data=str(small_data / "train.jsonl"), eval_data="", out=str(tmp_path / "m"), steps=3,
                    batch_size=4, save_every=1, device=str(device), threads=None, profile_steps=1, profile_after=1),
          progress=False)
    assert (tmp_path / "m" / "model.safetensors").exists()
    # the profile of step 3 (after a skipped step and the profiler's warm-up): on a GPU, the share the device was busy
    head = (tmp_path / "m.profile.txt").read_text().splitlines()[0]
    assert f": step 3 on {device}, " in head
    if device.type == "cuda":
        share = float(head.split("of the wall time")[0].rsplit("(", 1)[1].rstrip("% "))
        assert "the device busy" in head and 0 < share <= 100, head
    from rookworld_rlvr.data.io import write_samples

    env_rows = [s for s in read_samples(REPO / "data" / "eval.jsonl.gz") if s.task == "A"][:4]
    write_samples(tmp_path / "a.jsonl", env_rows)  # A: rows: python-chess judges them, no engine needed
    from rookworld_rlvr.data.judged import read_puzzles, write_rows

    checks = [p for p in read_puzzles(REPO / "data" / "puzzles_eval.jsonl.gz") if p.kind == "check"][:8]
    write_rows(tmp_path / "checks.jsonl", (p.to_dict() for p in checks))
    assert main(["eval", "--model", str(SHIPPED), "--data", str(tmp_path / "a.jsonl"), "--puzzles",
                 str(tmp_path / "checks.jsonl"), "--device", str(device), "--quiet",
                 "--json", str(tmp_path / "eval.json")]) == 0
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["environment"]["n"] == 4 and result["puzzles"]["check"]["n"] == 8
    assert main(["match", str(SHIPPED), "random", "--games", "2", "--max-plies", "20", "--device", str(device),
                 "--quiet", "--json", str(tmp_path / "match.json")]) == 0
    assert json.loads((tmp_path / "match.json").read_text())["games"] == 2


def test_sft_with_dropout_stopped_and_resumed_on_the_device_continues_the_same_run(tmp_path, small_data, device,
                                                                                  monkeypatch):
    """Dropout draws its masks from the device's generator: a checkpoint keeps its state, so the resumed
    steps drop what the straight run's drop (same losses; a GPU's embedding backward sums in any order)."""
    import rookworld_rlvr.sft as sft

    def run(name, resume=False, **kw):
        sft.train(sft.SFTConfig(data=str(small_data / "train.jsonl"), eval_data="", out=str(tmp_path / name), steps=4,
                                batch_size=8, own_repeats=0, dropout=0.2, lr=1e-3, warmup_steps=1, save_every=100,
                                device=str(device), **kw), resume=resume, progress=False)
        return [json.loads(x)["loss"] for x in (tmp_path / f"{name}.sft_log.jsonl").read_text().splitlines()]

    straight, real, calls = run("straight"), sft._accumulate, []

    def stop_after_two(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            (tmp_path / "stop").touch()
        return real(*a, **k)

    monkeypatch.setattr(sft, "_accumulate", stop_after_two)
    assert len(run("split", stop_when=str(tmp_path / "stop"))) == 2
    monkeypatch.setattr(sft, "_accumulate", real)
    assert run("split", resume=True) == pytest.approx(straight, rel=1e-4)


def test_an_sft_step_queues_its_work_without_waiting(device, ieee_float32):
    """SFT's step (micro-batches made on the host, forward and backward of both, clip, AdamW) waits for the
    device nowhere, so the host makes the next step's batches while the device runs this one: CUDA's sync debug
    mode raises at any wait (transformers' own mask preparation included: the step hands it a ready causal
    mask). Its losses equal those of a forward under the 2D padding mask, in (IEEE) float32."""
    from rookworld_rlvr.grpo.control import adamw
    from rookworld_rlvr.sft import _accumulate, set_dropout
    from rookworld_rlvr.sft_rows import encode, legality_loss, make_batch, micro_batches, unlikelihood

    model, tok = load_policy(str(SHIPPED), device=str(device), verbose=False)
    model.train()
    set_dropout(model, 0.0)  # the two forwards compared below see the same weights the same way
    cuda = device.type == "cuda"  # (the CPU smoke run of scripts/gpu_check.sh: a quarter of the rows)
    samples = read_samples(REPO / "data" / "eval.jsonl.gz")[:64 if cuda else 16]
    rows = encode(tok, samples, "compact", legal=True)
    assert any(r.legal for r in rows) and any(r.bans for r in rows) and len({len(r.ids) for r in rows}) > 5
    # more than 3,072 tokens a micro-batch: the embedding's backward on CUDA takes its sorting kernel, as in training
    assert not cuda or all(b.input_ids.numel() > 3072 for b in micro_batches(rows, tok.pad_token_id, "completion"))
    opt = adamw(list(model.parameters()), 1e-4, (0.9, 0.95), 0.0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        sums = _accumulate(model, rows, tok.pad_token_id, "completion", autocast, device, 1.0, 1.0,
                           micro_batches(rows, tok.pad_token_id, "completion"))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return sums

    step()  # the first step allocates (optimizer state, pinned buffers)
    if cuda:
        torch.cuda.set_sync_debug_mode("error")
    try:
        sums = step()
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
    assert sums.device.type == device.type and torch.isfinite(sums).all()
    got = _accumulate(model, rows, tok.pad_token_id, "completion", torch.autocast(device.type, enabled=False),
                      device, 1.0, 1.0).cpu()  # float32 (its backward fills grads nobody steps on)
    batches = micro_batches(rows, tok.pad_token_id, "completion")
    n_tokens = sum(int((b.labels[:, 1:] != -100).sum()) for b in batches)
    expected = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():  # the same losses from one masked forward per micro-batch, float32
        for b in batches:
            ids, mask, labels = (x.to(device) for x in make_batch(b.rows, tok.pad_token_id, "completion"))
            logits = model(input_ids=ids, attention_mask=mask).logits
            nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                                    ignore_index=-100, reduction="sum")
            expected += torch.tensor([float(nll), float(unlikelihood(logits, b.rows)),
                                      float(legality_loss(logits, b.rows))], dtype=torch.float64) / n_tokens
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)
