"""Sampler invariants: batched == single greedy, sampler log-probs == trainer log-probs,
policy == reference before any update, early stop and argument checks.

Runs on a tiny random GPT-2 (2 layers x 64) under both the char-level chess
tokenizer and a locally trained byte-level BPE, so nothing assumes one token per char.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from rookworld_rlvr.chess_tokenizers import build_chess_tokenizer
from rookworld_rlvr.model import filter_logits, generate, positions_from_mask, token_logprobs

from rookworld_rlvr.model.logprobs import length_buckets

from conftest import REPO, make_tokenizer, packs_weights, tiny_gpt2 as shared_tiny_gpt2  # noqa: E402
from numerics import assert_bf16_rounding_close, assert_rounding_close, gradient_terms, logprob_terms  # noqa: E402



def build_batch(prompt_ids, prompt_mask, completion_ids, completion_mask):
    """A sampled batch as the scoring pass takes it: left-padded prompts beside right-padded
    completions, positions from the mask."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()
    return input_ids, attention_mask, positions_from_mask(attention_mask)


# P: and A: prompts of different lengths (compact and column-padded P: layouts).
PROMPTS = [
    "P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34 ",
    "A: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+e2e4+e2e4+",
    f"P: {'1b1k4/6p1/1P3pp1/2P1n3/4RP1r/8/2K5/4B3 b - - 1 60':90}",
    "P: 8/8/8/8/8/8/8/K6k w - - 0 1 ",
    "A: r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3+f1b5+e2e4 e7e5 g1f3 b8c6 f1b5+",
    "A: 8/8/8/8/8/8/8/K6k w - - 0 1+a1a2+a1a2+",
    "P: 1B2k3/1n3p2/1pr1p1p1/7p/1PPR3P/4K1P1/5P2/8 b - - 0 35 ",
]


def tiny_gpt2(vocab_size: int, *, eos_boost: float, n_positions: int = 512, seed: int = 0):
    """conftest's tiny GPT-2, 512 positions unless asked, each call naming its EOS boost."""
    return shared_tiny_gpt2(vocab_size, eos_boost, n_positions, seed)


# Chosen so greedy decoding of PROMPTS ends some rows at EOS and others at the length limit.
EOS_BOOST = {"char": 1.5, "square": 2.0, "bpe": 1.5}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=["char", "square", "bpe"])
def rig(request):
    tok = make_tokenizer(request.param)
    model = tiny_gpt2(len(tok), eos_boost=EOS_BOOST[request.param])
    return request.param, model, tok


def single_forward_logprobs(model, ids: list[int], n_prompt: int, temperature: float) -> torch.Tensor:
    """Reference: plain unpadded forward of one sequence, no mask, no positions, no cache."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float() / temperature
    logp = logits.log_softmax(-1)[n_prompt - 1 : len(ids) - 1]
    return logp.gather(-1, torch.tensor(ids[n_prompt:]).unsqueeze(-1)).squeeze(-1)


# 1. batched greedy == one-at-a-time greedy ------------------------------------------------------


def test_batched_greedy_equals_single(rig):
    kind, model, tok = rig
    batch = generate(model, tok, PROMPTS, max_new_tokens=48, greedy=True)
    reasons = set(batch.finish_reasons)
    assert reasons == {"eos", "length"}, f"{kind}: test lost its teeth, want rows of both kinds, got {reasons}"
    for i, prompt in enumerate(PROMPTS):
        one = generate(model, tok, [prompt], max_new_tokens=48, greedy=True)
        n = one.completion_ids.shape[1]
        assert torch.equal(batch.completion_ids[i, :n], one.completion_ids[0]), f"row {i} differs"
        assert torch.equal(batch.completion_mask[i, :n], one.completion_mask[0])
        assert not batch.completion_mask[i, n:].any()
        assert (batch.completion_ids[i, n:] == tok.pad_token_id).all()
        assert_rounding_close(batch.logprobs[i, :n], one.logprobs[0], logprob_terms(model), f"{kind} row {i}")
        assert batch.texts[i] == one.texts[0]
        assert batch.finish_reasons[i] == one.finish_reasons[0]
        # The prompt row is the unpadded prompt, left-padded.
        real = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
        assert real.tolist() == tok(prompt, add_special_tokens=False)["input_ids"]


# 2. sampler log-probs == recomputed log-probs -----------------------------------------------------


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (0.7, 10, 1.0), (1.0, 0, 0.9), (0.7, 20, 0.8)],
)
def test_sampler_logprobs_match_recomputed(rig, temperature, top_k, top_p):
    kind, model, tok = rig
    prompts = PROMPTS[:4]
    gen = generate(
        model, tok, prompts, max_new_tokens=40, temperature=temperature, top_k=top_k, top_p=top_p,
        num_return_sequences=4, generator=torch.Generator().manual_seed(1),
    )
    n_rows, n_completion = gen.completion_ids.shape
    assert n_rows == 16 and gen.logprobs.dtype == torch.float32
    mask = gen.completion_mask.bool()
    assert (gen.logprobs[~mask] == 0).all() and (gen.logprobs[mask] <= 0).all()

    batch = build_batch(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    with torch.no_grad():
        out = token_logprobs(
            model, *batch, n_completion=n_completion, temperature=temperature, return_entropy=True, return_logits=True
        )
    assert_rounding_close(out["logprobs"], gen.logprobs, logprob_terms(model), kind)
    logp_all = out["logits"].log_softmax(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
    assert_rounding_close(out["entropy"], entropy, logprob_terms(model), f"{kind} entropy")

    for row in range(n_rows):
        prompt = gen.prompt_ids[row][gen.prompt_mask[row].bool()].tolist()
        completion = gen.completion_ids[row][mask[row]].tolist()
        ref = single_forward_logprobs(model, prompt + completion, len(prompt), temperature)
        assert_rounding_close(gen.logprobs[row][mask[row]], ref, logprob_terms(model), f"{kind} row {row}")

    if top_k:  # every sampled token was inside the top-k of the scaled logits
        logits = out["logits"]
        chosen = logits.gather(-1, gen.completion_ids.unsqueeze(-1))
        rank = (logits > chosen).sum(-1)
        assert (rank[mask] < top_k).all()


# 3. policy vs untouched copy: ratio exactly 1 ----------------------------------------------------


def test_policy_equals_reference_before_update(rig):
    kind, model, tok = rig
    reference = copy.deepcopy(model)
    gen = generate(model, tok, PROMPTS, max_new_tokens=30, num_return_sequences=2,
                   generator=torch.Generator().manual_seed(3))
    assert gen.prompt_mask.sum(-1).unique().numel() > 1, "batch must be left-padded with mixed lengths"
    batch = build_batch(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    n = gen.completion_ids.shape[1]
    policy = token_logprobs(model, *batch, n_completion=n, return_entropy=True, return_logits=True)
    with torch.no_grad():
        ref = token_logprobs(reference, *batch, n_completion=n, return_logits=True)
    assert policy["logprobs"].requires_grad  # the trainer differentiates through this call
    diff = (policy["logprobs"].detach() - ref["logprobs"])[gen.completion_mask.bool()]
    assert (diff == 0).all()
    assert torch.equal(policy["logits"].detach(), ref["logits"])
    ratio = torch.exp(policy["logprobs"].detach() - ref["logprobs"])
    assert (ratio == 1).all()
    ent = policy["entropy"].detach()
    assert (ent[gen.completion_mask.bool()] > 0).all() and (ent[~gen.completion_mask.bool()] == 0).all()


def grouped_rollout(model, tok):
    """4 prompts x 4 sampled completions of different lengths as a scoring batch, and random
    per-token weights (0 off the completions) for a loss."""
    gen = generate(model, tok, PROMPTS[:4], max_new_tokens=[30, 6, 18, 30], num_return_sequences=4,
                   generator=torch.Generator().manual_seed(5))
    batch = build_batch(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    weights = torch.randn(gen.completion_ids.shape, generator=torch.Generator().manual_seed(0)) * gen.completion_mask
    return gen, batch, gen.completion_ids.shape[1], weights


def scored_with_gradients(model, batch, n, weights, group_size, grad_dtype=None):
    """(log-probs, entropies, every parameter's gradient) of the weighted sum of both at T 0.8."""
    model.zero_grad()
    out = token_logprobs(model, *batch, n_completion=n, temperature=0.8, return_entropy=True, group_size=group_size,
                         grad_dtype=grad_dtype)
    ((out["logprobs"] + out["entropy"]) * weights).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return out["logprobs"].detach(), out["entropy"].detach(), grads


@pytest.mark.parametrize("segments", [True, False])
def test_grouped_prompt_pass_equals_plain_pass_with_gradients(rig, monkeypatch, segments):
    """One prompt pass per group (expanded KV cache) gives the plain pass's log-probs and gradients,
    both as one forward over the prompt and bucket segments (plain GPT-2) and through the model's
    own forward with an expanded cache (every other model)."""
    from rookworld_rlvr.model import gpt2_segments

    kind, model, tok = rig
    calls = []
    real = gpt2_segments.hidden_states
    monkeypatch.setattr(gpt2_segments, "hidden_states", lambda m, segs, *a: calls.append(len(segs)) or real(m, segs, *a))
    if not segments:
        monkeypatch.setattr(gpt2_segments, "supports", lambda m: False)
    gen, batch, n, weights = grouped_rollout(model, tok)
    need = [max(int(k) - 1, 1) for k in gen.completion_mask.sum(1)]
    assert len(length_buckets(need)) > 1, f"{kind}: test lost its teeth, the completion pass ran as one bucket"
    results = []
    for group_size in (1, 4):
        results.append(scored_with_gradients(model, batch, n, weights, group_size))
    (lp1, ent1, g1), (lp4, ent4, g4) = results
    assert_rounding_close(lp4, lp1, logprob_terms(model), f"{kind} log-probs")
    assert_rounding_close(ent4, ent1, logprob_terms(model), f"{kind} entropy")
    assert_rounding_close(g4, g1, gradient_terms(model, batch[1]), f"{kind} gradient")
    assert (lp4[~gen.completion_mask.bool()] == 0).all()
    assert calls == ([1 + len(length_buckets(need))] if segments else [])  # one forward: prompts + buckets
    # rows of a "group" that do not share their prompt fall back to the plain pass
    shuffled = [x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))] for x in batch]
    with torch.no_grad():
        plain = token_logprobs(model, *shuffled, n_completion=n)["logprobs"]
        grouped = token_logprobs(model, *shuffled, n_completion=n, group_size=4)["logprobs"]
    assert torch.equal(plain, grouped)


def test_the_segmented_scoring_pass_makes_each_attention_mask_once_not_at_every_layer(rig):
    """Attention turns a boolean mask into its additive form (0 or -inf) at every call: on a GPU three
    launches a layer and segment. The segmented scoring forward hands it the additive masks, made once per
    segment, and gives the same log-probs bit for bit as boolean masks do."""
    import collections

    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    kind, model, tok = rig
    gen, batch, n, _ = grouped_rollout(model, tok)

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Count() as count:
        ours = token_logprobs(model, *batch, n_completion=n, group_size=4)["logprobs"]
    attends = count.ops["_scaled_dot_product_flash_attention_for_cpu"]
    assert attends >= 2 * model.config.n_layer, "no segmented forward ran"
    assert count.ops["scalar_tensor"] == 0 and count.ops["where"] < attends, count.ops  # (was 2 and 1 a call)
    assert count.ops["masked_fill_"] == attends // model.config.n_layer  # one mask a segment
    sdpa = F.scaled_dot_product_attention

    def boolean(q, k, v, attn_mask=None, **kw):  # the mask as attention would have had it before
        return sdpa(q, k, v, attn_mask=attn_mask == 0, **kw)

    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(F, "scaled_dot_product_attention", boolean)
        assert torch.equal(token_logprobs(model, *batch, n_completion=n, group_size=4)["logprobs"], ours)


@pytest.mark.parametrize("own_paths", [True, False])
def test_the_kv_cache_goes_by_the_name_the_installed_transformers_takes(rig, monkeypatch, own_paths):
    """transformers 5.24 renamed a forward's `past_key_values` to `cache` and deprecated the old name (it goes in
    5.40): decoding and scoring (the prefill, the stock decode loop, a group's expanded prompt cache) pass it by the
    name the installed version takes, so none raises its FutureWarning; a peft adapter passes it on to its base."""
    import warnings

    from rookworld_rlvr.model import gpt2_decode, gpt2_segments
    from rookworld_rlvr.model.generate import cache_keyword

    kind, model, tok = rig
    if not own_paths:
        monkeypatch.setattr(gpt2_decode, "supports", lambda m: False)
        monkeypatch.setattr(gpt2_segments, "supports", lambda m: False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        gen, batch, n, _ = grouped_rollout(model, tok)
        token_logprobs(model, *batch, n_completion=n, group_size=4)
    assert gen.completion_mask.sum() > 0

    class Renamed(torch.nn.Module):  # a forward as transformers 5.24 on spells it
        def forward(self, input_ids=None, cache=None, use_cache=None):
            return None

    class Adapter(torch.nn.Module):  # peft's wrapper: **kwargs, handed on to the base model
        def __init__(self, base):
            super().__init__()
            self.base = base

        def get_base_model(self):
            return self.base

        def forward(self, *args, **kwargs):
            return self.base(*args, **kwargs)

    assert cache_keyword(Renamed()) == cache_keyword(Adapter(Renamed())) == "cache"
    assert cache_keyword(Adapter(model)) == cache_keyword(model)


@pytest.mark.parametrize("group_size,segments", [(1, True), (4, True), (4, False)], ids=["plain", "segments", "cache"])
def test_scoring_in_chunks_of_rows_gives_the_one_piece_results_and_gradients(rig, monkeypatch, group_size, segments):
    """At 124M a minibatch's full-vocabulary logits are 1.85 GB in float32; scored a few rows at a
    time (each chunk checkpointed under autograd) the log-probs, entropies and gradients are those
    of one piece, on every path. The chunk size is shrunk here so that the tiny model is chunked."""
    from rookworld_rlvr.model import gpt2_segments, logprobs as lp_module

    kind, model, tok = rig
    if not segments:
        monkeypatch.setattr(gpt2_segments, "supports", lambda m: False)
    gen, batch, n, weights = grouped_rollout(model, tok)
    vocab = model.lm_head.out_features
    chunks = []
    real = lp_module._score

    def counted(logits, *a):
        chunks.append((logits.shape[0], logits.numel()))
        return real(logits, *a)

    monkeypatch.setattr(lp_module, "_score", counted)
    results = []
    for elements in (2**40, 3 * n * vocab):  # one piece, then about 3 rows a chunk
        monkeypatch.setattr(lp_module, "SCORE_CHUNK_ELEMENTS", elements)
        chunks.clear()
        lp, ent, grads = scored_with_gradients(model, batch, n, weights, group_size)
        with torch.no_grad():
            frozen = token_logprobs(model, *batch, n_completion=n, temperature=0.8, group_size=group_size)
        results.append((lp, ent, grads, frozen["logprobs"], list(chunks)))
    (lp1, ent1, g1, f1, calls1), (lp2, ent2, g2, f2, calls2) = results
    assert len(calls2) > len(calls1) and max(rows for rows, _ in calls1) == len(weights)
    if group_size > 1:  # column 0 (one row per prompt, from the prompt pass) is scored whole
        calls2 = [(rows, size) for rows, size in calls2 if size != len(weights) * vocab]
    assert max(size for _, size in calls2) <= 3 * n * vocab, calls2
    assert_rounding_close(lp2, lp1, logprob_terms(model), f"{kind} log-probs")
    assert_rounding_close(ent2, ent1, logprob_terms(model), f"{kind} entropy")
    assert_rounding_close(f2, f1, logprob_terms(model), f"{kind} no-grad log-probs")
    assert_rounding_close(g2, g1, gradient_terms(model, batch[1]), f"{kind} gradient")
    assert (lp2[~gen.completion_mask.bool()] == 0).all()


@pytest.mark.parametrize("kind", ["linear", "conv1d"])
def test_bf16_grad_linear_has_the_float32_forward_and_bf16_gradients(kind):
    """bf16_grad.linear: the module's own float32 output, bit for bit; input, weight and bias
    gradients within bf16 rounding of float32's (bias exact: a sum, no product)."""
    from transformers.pytorch_utils import Conv1D

    from rookworld_rlvr.model.bf16_grad import linear

    torch.manual_seed(0)
    module = torch.nn.Linear(48, 80) if kind == "linear" else Conv1D(80, 48)
    torch.nn.init.normal_(module.bias)
    x = torch.randn(3, 7, 48, requires_grad=True)
    upstream = torch.randn(3, 7, 80)
    grads = {}
    for dtype in (None, torch.bfloat16):
        module.zero_grad()
        x.grad = None
        y = linear(module, x, dtype)
        assert torch.equal(y, module(x))
        (y * upstream).sum().backward()
        grads[dtype] = [x.grad.clone(), module.weight.grad.clone(), module.bias.grad.clone()]
    for name, g32, g16 in zip(("input", "weight"), grads[None][:2], grads[torch.bfloat16][:2], strict=True):
        assert g16.dtype == torch.float32 and not torch.equal(g16, g32)
        assert_bf16_rounding_close(g16, g32, f"{kind} {name} gradient")
    assert torch.equal(grads[None][2], grads[torch.bfloat16][2])
    with torch.no_grad():  # without autograd: the module itself (packed weights etc. still apply)
        assert torch.equal(linear(module, x, torch.bfloat16), module(x))
    with pytest.raises(TypeError, match="plain nn.Linear"):  # a wrapper (LoRA) would lose its own forward
        linear(torch.nn.Sequential(module), x, torch.bfloat16)


def test_grouped_pass_with_bf16_gradients_keeps_log_probs_exact(rig):
    """token_logprobs(grad_dtype=bf16) on the one-forward GPT-2 path: the same log-probs and
    entropy as float32 (the sampler's agreement is untouched), gradients within bf16 rounding."""
    kind, model, tok = rig
    gen, batch, n, weights = grouped_rollout(model, tok)
    results = {}
    for dtype in (None, torch.bfloat16):
        results[dtype] = scored_with_gradients(model, batch, n, weights, 4, grad_dtype=dtype)
    (lp32, ent32, g32), (lp16, ent16, g16) = results[None], results[torch.bfloat16]
    assert torch.equal(lp16, lp32) and torch.equal(ent16, ent32)
    assert not torch.equal(g16, g32)
    assert_bf16_rounding_close(g16, g32, f"{kind} gradient")


@pytest.mark.parametrize("packed", [True, False])
def test_recorded_projections_give_the_sampler_log_probs_and_the_recomputed_gradients(rig, monkeypatch, packed):
    """generate(record=True) keeps every layer's projection outputs; token_logprobs on them (the
    trainer's first pass on a batch) skips those products and returns the sampler's log-probs and
    the gradients of a pass that recomputes everything: rows of different lengths, groups that left
    the decode batch early, a wider left padding than the sampler's, packed and plain decode weights."""
    import torch.nn.functional as F

    from rookworld_rlvr.model import gpt2_decode

    kind, model, tok = rig
    if not packed:
        monkeypatch.setattr(gpt2_decode, "can_pack", lambda m: False)
    gen = generate(model, tok, PROMPTS[:4], max_new_tokens=[4, 40, 9, 40], temperature=0.8, num_return_sequences=3,
                   generator=torch.Generator().manual_seed(2), record=True)
    assert len(set(gen.completion_mask.sum(1).tolist())) > 2, "test lost its teeth: rows of one length"
    pad = tok.pad_token_id
    batch = build_batch(F.pad(gen.prompt_ids, (2, 0), value=pad), F.pad(gen.prompt_mask, (2, 0)),
                        gen.completion_ids, gen.completion_mask)
    n = gen.completion_ids.shape[1]
    recorded = [gen.recorded_row(i) for i in range(len(gen.texts))]
    weights = torch.randn(gen.completion_ids.shape, generator=torch.Generator().manual_seed(0)) * gen.completion_mask
    results = []
    for rec in (None, recorded):
        model.zero_grad()
        out = token_logprobs(model, *batch, n_completion=n, temperature=0.8, return_entropy=True, group_size=3,
                             recorded=rec)
        ((out["logprobs"] + out["entropy"]) * weights).sum().backward()
        results.append((out["logprobs"].detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (lp, grads), (lp_rec, grads_rec) = results
    assert_rounding_close(lp_rec, gen.logprobs, logprob_terms(model), f"{kind} recorded vs sampler")
    assert_rounding_close(lp_rec, lp, logprob_terms(model), f"{kind} recorded vs recomputed")
    assert_rounding_close(grads_rec, grads, gradient_terms(model, batch[1]), f"{kind} gradient")
    # the recordings really are what the pass computes with: the prompt's projections give its group's
    # first column (rows 3-5), a row's logits its later columns (row 7), the fed tokens' projections
    # the gradient (the backward's saved inputs; row 1)
    noise = torch.Generator().manual_seed(0)
    prompt, fed, logits = recorded[3]
    recorded[3] = (prompt + torch.randn(prompt.shape, generator=noise), fed, logits)
    prompt, fed, logits = recorded[7]
    fed_7 = logits.shape[0]
    assert fed_7 == gen.completion_mask[7].sum() - 1 and logits.shape[1] == model.config.vocab_size
    recorded[7] = (prompt, fed, logits + torch.randn(logits.shape, generator=noise))
    prompt, fed, logits = recorded[1]
    recorded[1] = (prompt, fed + torch.randn(fed.shape, generator=noise), logits)
    model.zero_grad()
    moved = token_logprobs(model, *batch, n_completion=n, temperature=0.8, return_entropy=True, group_size=3,
                           recorded=recorded)
    ((moved["logprobs"] + moved["entropy"]) * weights).sum().backward()
    changed = (moved["logprobs"].detach() - lp_rec).abs() > 1e-3
    assert changed[:, 0].tolist() == [i in (3, 4, 5) for i in range(len(gen.texts))]
    assert changed[:, 1:].any(1).tolist() == [i == 7 for i in range(len(gen.texts))]
    assert changed[7, 1:fed_7 + 1].all()
    moved_grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert (moved_grads - grads_rec).abs().amax() > 1e-3


def test_recorded_projections_are_checked(rig):
    """A recording that does not fit the batch or the model is a clear error, never used silently."""
    kind, model, tok = rig
    gen = generate(model, tok, PROMPTS[:2], max_new_tokens=8, num_return_sequences=2,
                   generator=torch.Generator().manual_seed(1), record=True)
    batch = build_batch(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    n = gen.completion_ids.shape[1]
    recorded = [gen.recorded_row(i) for i in range(4)]
    with pytest.raises(ValueError, match="one per row"):
        token_logprobs(model, *batch, n_completion=n, group_size=2, recorded=recorded[:3])
    with pytest.raises(ValueError, match="one per row"):  # rows that do not share prompts in groups
        token_logprobs(model, *batch, n_completion=n, group_size=1, recorded=recorded)
    swapped = [recorded[2], recorded[3], recorded[0], recorded[1]]  # the other prompt's tokens
    with pytest.raises(ValueError, match="row 0: .* recorded prompt tokens"):
        token_logprobs(model, *batch, n_completion=n, group_size=2, recorded=swapped)
    short = [(p, c[:, :1], logits) for p, c, logits in recorded]
    with pytest.raises(ValueError, match="recorded completion tokens"):
        token_logprobs(model, *batch, n_completion=n, group_size=2, recorded=short)
    short = [(p, c, logits[:1]) for p, c, logits in recorded]
    with pytest.raises(ValueError, match="recorded logits at 1 completion tokens"):
        token_logprobs(model, *batch, n_completion=n, group_size=2, recorded=short)
    with pytest.raises(ValueError, match="record=True"):
        generate(model, tok, PROMPTS[:1], max_new_tokens=4).recorded_row(0)
    with pytest.raises(ValueError, match="no autocast"):
        generate(model, tok, PROMPTS[:1], max_new_tokens=4, record=True, autocast_dtype=torch.bfloat16)
    # an MLP narrower than 4 x n_embd (GPT-2's n_inner) is laid out by its real widths
    narrow = GPT2LMHeadModel(GPT2Config(**{**model.config.to_dict(), "n_inner": 100})).eval()
    gen = generate(narrow, tok, PROMPTS[:2], max_new_tokens=8, num_return_sequences=2,
                   generator=torch.Generator().manual_seed(1), record=True)
    assert gen.recorded[1].shape[-1] == 3 * 64 + 64 + 100 + 64
    batch = build_batch(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    with torch.no_grad():
        out = token_logprobs(narrow, *batch, n_completion=gen.completion_ids.shape[1], group_size=2,
                             recorded=[gen.recorded_row(i) for i in range(4)])
    assert_rounding_close(out["logprobs"], gen.logprobs, logprob_terms(narrow), f"{kind} narrow MLP")


# 7. stop early, finish reasons, limits -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_stops_early_when_every_row_hits_eos(kind):
    tok = make_tokenizer(kind)
    model = tiny_gpt2(len(tok), eos_boost=6.0)
    gen = generate(model, tok, PROMPTS[:3], max_new_tokens=60, num_return_sequences=4,
                   generator=torch.Generator().manual_seed(0))
    n_completion = gen.completion_ids.shape[1]
    assert n_completion < 60
    assert gen.finish_reasons == ["eos"] * 12
    eos = tok.eos_token_id
    for row in range(12):
        length = int(gen.completion_mask[row].sum())
        assert gen.completion_mask[row, :length].all() and not gen.completion_mask[row, length:].any()
        assert gen.completion_ids[row, length - 1] == eos  # EOS is inside the mask
        assert eos not in gen.completion_ids[row, : length - 1].tolist()
        assert (gen.completion_ids[row, length:] == tok.pad_token_id).all()
        assert gen.texts[row] == tok.decode(gen.completion_ids[row, : length - 1].tolist())
    # The loop ran exactly as long as the longest row.
    assert int(gen.completion_mask.sum(-1).max()) == n_completion


def test_length_rows_and_greedy_group(rig):
    kind, model, tok = rig
    gen = generate(model, tok, PROMPTS, max_new_tokens=5, greedy=True, num_return_sequences=2)
    assert gen.completion_ids.shape == (len(PROMPTS) * 2, 5)
    for row, reason in enumerate(gen.finish_reasons):
        length = int(gen.completion_mask[row].sum())
        if reason == "length":
            assert length == 5 and tok.eos_token_id not in gen.completion_ids[row].tolist()
        else:
            assert gen.completion_ids[row, length - 1] == tok.eos_token_id
    # Rows of a group are adjacent and share the prompt; greedy makes them identical.
    assert torch.equal(gen.prompt_ids[0::2], gen.prompt_ids[1::2])
    assert torch.equal(gen.completion_ids[0::2], gen.completion_ids[1::2])


def test_prompt_too_long_raises():
    tok = build_chess_tokenizer()
    model = tiny_gpt2(len(tok), eos_boost=0.0, n_positions=128)
    with pytest.raises(ValueError, match=r"prompt length 93 \+ max_new_tokens 100 = 193 exceeds .* n_positions 128"):
        generate(model, tok, [PROMPTS[2], PROMPTS[0]], max_new_tokens=100)
    generate(model, tok, [PROMPTS[2]], max_new_tokens=35, greedy=True)  # 93 + 35 = 128 fits


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"num_return_sequences": 0}, "num_return_sequences"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"check_every": 0}, "check_every"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    tok = build_chess_tokenizer()
    model = tiny_gpt2(len(tok), eos_boost=0.0)
    with pytest.raises(ValueError, match=match):
        generate(model, tok, PROMPTS[:1], **kwargs)
    with pytest.raises(ValueError, match="prompts"):
        generate(model, tok, [])
    with pytest.raises(ValueError, match="prompts"):
        generate(model, tok, "P: 8/8/8/8/8/8/8/K6k w - - 0 1 ")


# Sharing, modes, reproducibility ----------------------------------------------------------------


def test_each_prompt_is_prefilled_once_and_decoded_on_the_shared_cache(rig):
    kind, model, tok = rig
    calls: list[tuple[int, int]] = []
    hook = model.register_forward_pre_hook(
        lambda mod, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0]]
        gen = generate(model, tok, prompts, max_new_tokens=6, num_return_sequences=3,
                       generator=torch.Generator().manual_seed(0))
    finally:
        hook.remove()
    assert len(calls) == 1 and calls[0][0] == 3  # one prefill row per prompt; decode steps run in gpt2_decode
    assert gen.completion_ids.shape[0] == 9
    assert torch.equal(gen.prompt_ids[0:3], gen.prompt_ids[6:9])


@pytest.mark.parametrize("greedy", [True, False])
def test_cascade_decoding_equals_the_stock_forward(rig, monkeypatch, greedy):
    """The shared-prompt decoder gives the stock HF decode loop's tokens and log-probs."""
    from rookworld_rlvr.model import gpt2_decode

    kind, model, tok = rig
    kwargs = dict(max_new_tokens=40, greedy=greedy, temperature=0.9, top_k=20, num_return_sequences=3)
    fast = generate(model, tok, PROMPTS, generator=torch.Generator().manual_seed(4), **kwargs)
    monkeypatch.setattr(gpt2_decode, "supports", lambda m: False)  # force the stock path
    stock = generate(model, tok, PROMPTS, generator=torch.Generator().manual_seed(4), **kwargs)
    assert fast.texts == stock.texts and fast.finish_reasons == stock.finish_reasons
    assert torch.equal(fast.completion_mask, stock.completion_mask)
    assert_rounding_close(fast.logprobs, stock.logprobs, logprob_terms(model), kind)
    assert len(set(fast.finish_reasons)) == 2 or greedy  # sampled rows both stop at EOS and run to the limit


@pytest.mark.parametrize("fuse_gelu", [False, True])
def test_packed_decode_weights_give_the_modules_results(rig, monkeypatch, fuse_gelu):
    """On a CPU in float32 the decode steps run oneDNN linears on weights packed once per rollout
    (with the tanh GELU fused when load_policy has swapped it in): the same tokens and log-probs
    as the model's own modules, up to rounding."""
    import copy

    from rookworld_rlvr.model import gpt2_decode
    from rookworld_rlvr.model.load import fuse_activations

    kind, model, tok = rig
    if fuse_gelu:
        model = copy.deepcopy(model)
        assert fuse_activations(model) == 2
    packs = packs_weights(model)
    used = []
    real_init = gpt2_decode.CascadeDecoder.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        used.append(self.packed)

    monkeypatch.setattr(gpt2_decode.CascadeDecoder, "__init__", spy)
    kwargs = dict(max_new_tokens=40, temperature=0.9, num_return_sequences=3)
    packed = generate(model, tok, PROMPTS, generator=torch.Generator().manual_seed(5), **kwargs)
    monkeypatch.setattr(gpt2_decode, "can_pack", lambda m: False)
    plain = generate(model, tok, PROMPTS, generator=torch.Generator().manual_seed(5), **kwargs)
    assert used == [packs, False]
    assert packed.texts == plain.texts and torch.equal(packed.completion_mask, plain.completion_mask)
    assert_rounding_close(packed.logprobs, plain.logprobs, logprob_terms(model), kind)
    assert set(packed.finish_reasons) == {"eos", "length"}


def test_length_buckets_cover_every_row_once_and_cut_padding():
    widths = [70, 12, 71, 13, 69, 12, 70, 14]
    buckets = length_buckets(widths)
    assert sorted(i for b in buckets for i in b) == list(range(len(widths)))
    assert [sorted(b) for b in buckets] == [[1, 3, 5, 7], [0, 2, 4, 6]]  # short rows apart from long ones
    assert length_buckets([5] * 6) == [list(range(6))]  # equal widths: one pass, never split
    assert len(length_buckets(list(range(1, 65)), max_buckets=4)) == 4
    assert length_buckets([3, 9], max_buckets=1) == [[0, 1]]
    # a split that saves less than the extra pass costs is not made
    assert len(length_buckets([10, 11], overhead=16)) == 1


@pytest.mark.parametrize("stock", [False, True])
def test_finished_groups_leave_the_decode_batch_without_changing_results(rig, monkeypatch, stock):
    """Dropping groups whose rows have all finished (so later steps run on fewer rows) changes no
    token and no log-prob: greedy and sampled output equal a loop that keeps every row, on both
    decode paths, and sampled log-probs equal the recomputed ones, per-row temperatures included."""
    import importlib

    from rookworld_rlvr.model import gpt2_decode

    gen_module = importlib.import_module("rookworld_rlvr.model.generate")
    kind, model, tok = rig
    if stock:
        monkeypatch.setattr(gpt2_decode, "supports", lambda m: False)
    compactions = []
    real = gen_module._worth_compacting
    monkeypatch.setattr(gen_module, "_worth_compacting",
                        lambda live, *a: compactions.append(int(live.numel())) or real(live, *a))
    prompts, limits, temps = PROMPTS[:4], [4, 40, 9, 40], [1.0, 0.6, 1.4, 0.9]
    kwargs = dict(max_new_tokens=limits, num_return_sequences=3)
    compacted = generate(model, tok, prompts, greedy=True, **kwargs)
    decoded_rows = compactions.copy()
    assert min(decoded_rows) < max(decoded_rows) == len(prompts), "test lost its teeth: no group was dropped"
    monkeypatch.setattr(gen_module, "_worth_compacting", lambda *a: False)
    full = generate(model, tok, prompts, greedy=True, **kwargs)
    assert compacted.texts == full.texts and compacted.finish_reasons == full.finish_reasons
    assert torch.equal(compacted.completion_mask, full.completion_mask)
    assert_rounding_close(compacted.logprobs, full.logprobs, logprob_terms(model), kind)  # other batch shapes
    monkeypatch.setattr(gen_module, "_worth_compacting", real)
    sampled = generate(model, tok, prompts, temperature=temps, generator=torch.Generator().manual_seed(3), **kwargs)
    monkeypatch.setattr(gen_module, "_worth_compacting", lambda *a: False)  # every row draws either way:
    kept = generate(model, tok, prompts, temperature=temps, generator=torch.Generator().manual_seed(3), **kwargs)
    assert sampled.texts == kept.texts  # the same samples
    assert_rounding_close(sampled.logprobs, kept.logprobs, logprob_terms(model), kind)
    batch = build_batch(sampled.prompt_ids, sampled.prompt_mask, sampled.completion_ids, sampled.completion_mask)
    n = sampled.completion_ids.shape[1]
    for p, temp in enumerate(temps):
        rows = slice(3 * p, 3 * p + 3)
        assert max(sampled.completion_mask[rows].sum(1)) <= limits[p]
        with torch.no_grad():
            out = token_logprobs(model, *(x[rows] for x in batch), n_completion=n, temperature=temp)
        assert_rounding_close(out["logprobs"], sampled.logprobs[rows], logprob_terms(model), f"{kind} prompt {p}")


def test_per_prompt_token_limits_and_temperatures(rig):
    """Prompts of different tasks share one decode loop with their own limit and temperature."""
    kind, model, tok = rig
    prompts, limits, temps = PROMPTS[:3], [5, 30, 12], [1.0, 0.5, 1.5]
    gen = generate(model, tok, prompts, max_new_tokens=limits, temperature=temps, num_return_sequences=2,
                   generator=torch.Generator().manual_seed(2))
    lengths = gen.completion_mask.sum(-1).tolist()
    for row, (length, reason) in enumerate(zip(lengths, gen.finish_reasons, strict=True)):
        limit = limits[row // 2]
        assert length <= limit
        assert reason == "eos" or length == limit
    assert max(lengths) > 5  # the long prompt ran past the short one's limit
    batch = build_batch(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    n = gen.completion_ids.shape[1]
    for p, temp in enumerate(temps):  # each row's log-probs are those of its own temperature
        rows = slice(2 * p, 2 * p + 2)
        with torch.no_grad():
            out = token_logprobs(model, *(x[rows] for x in batch), n_completion=n, temperature=temp)
        assert_rounding_close(out["logprobs"], gen.logprobs[rows], logprob_terms(model), f"{kind} prompt {p}")
    greedy = generate(model, tok, prompts, max_new_tokens=limits, greedy=True)
    for p, limit in enumerate(limits):  # greedy with a shared loop == greedy alone
        alone = generate(model, tok, [prompts[p]], max_new_tokens=limit, greedy=True)
        assert greedy.texts[p] == alone.texts[0] and greedy.finish_reasons[p] == alone.finish_reasons[0]
    with pytest.raises(ValueError, match="2 values for 3 prompts"):
        generate(model, tok, prompts, max_new_tokens=[5, 6])


def test_outputs_are_ordinary_tensors_usable_in_autograd(rig):
    """The sampler runs under inference mode; what it returns must still work in a training graph."""
    kind, model, tok = rig
    gen = generate(model, tok, PROMPTS[:2], max_new_tokens=8, num_return_sequences=2,
                   generator=torch.Generator().manual_seed(0))
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs"):
        assert not getattr(gen, name).is_inference(), name
    w = torch.ones((), requires_grad=True)
    (w * gen.logprobs * gen.completion_mask).sum().backward()  # saves gen's tensors for backward
    assert torch.isclose(w.grad, (gen.logprobs * gen.completion_mask).sum())


def test_dropout_off_and_mode_restored(rig):
    kind, model, tok = rig
    expected = generate(model, tok, PROMPTS[:3], max_new_tokens=20, greedy=True)
    model.train()  # config dropout is 0.1: generation must still be deterministic
    try:
        got = generate(model, tok, PROMPTS[:3], max_new_tokens=20, greedy=True)
        assert model.training
    finally:
        model.eval()
    assert torch.equal(expected.completion_ids, got.completion_ids)


def test_generator_makes_sampling_reproducible(rig):
    kind, model, tok = rig
    a = generate(model, tok, PROMPTS[:2], max_new_tokens=20, num_return_sequences=3,
                 generator=torch.Generator().manual_seed(7))
    b = generate(model, tok, PROMPTS[:2], max_new_tokens=20, num_return_sequences=3,
                 generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts


def test_bf16_autocast_runs():
    tok = build_chess_tokenizer()
    model = tiny_gpt2(len(tok), eos_boost=2.0)
    gen = generate(model, tok, PROMPTS[:2], max_new_tokens=10, num_return_sequences=2,
                   autocast_dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    assert gen.logprobs.dtype == torch.float32 and torch.isfinite(gen.logprobs).all()
    assert next(model.parameters()).dtype == torch.float32  # weights untouched


@pytest.mark.parametrize("stock", [False, True])
def test_checking_for_the_end_every_few_steps_changes_no_token_mask_or_log_prob(rig, monkeypatch, stock):
    """On a GPU the loop reads the stop flags every 8 steps (a host read waits for the device): rows
    that stopped in between feed masked pads, and the outputs equal checking at every step."""
    from rookworld_rlvr.model import gpt2_decode

    kind, model, tok = rig
    if stock:
        monkeypatch.setattr(gpt2_decode, "supports", lambda m: False)
    kwargs = dict(max_new_tokens=[4, 40, 9, 40], temperature=[1.0, 0.6, 1.4, 0.9], num_return_sequences=3)
    every = generate(model, tok, PROMPTS[:4], generator=torch.Generator().manual_seed(3), check_every=1, **kwargs)
    assert min(every.completion_mask.sum(1)) < every.completion_ids.shape[1], "no row stopped early"
    for n in (3, 8, 64):
        few = generate(model, tok, PROMPTS[:4], generator=torch.Generator().manual_seed(3), check_every=n, **kwargs)
        assert few.texts == every.texts and few.finish_reasons == every.finish_reasons
        assert torch.equal(few.completion_ids, every.completion_ids)
        assert torch.equal(few.completion_mask, every.completion_mask)
        assert_rounding_close(few.logprobs, every.logprobs, logprob_terms(model), kind)  # other batch shapes


@pytest.mark.parametrize("check_every", [1, 8])
def test_rows_that_finish_are_handed_over_with_their_final_texts_while_others_decode(rig, check_every):
    """on_finished (the trainer starts scoring there) gets each stopped row once, with the text that
    Generation.texts will hold, before the last decode step; the outputs are those of a run without it."""
    kind, model, tok = rig
    kwargs = dict(max_new_tokens=[4, 40, 9, 40], temperature=[1.0, 0.6, 1.4, 0.9], num_return_sequences=3,
                  check_every=check_every)
    plain = generate(model, tok, PROMPTS[:4], generator=torch.Generator().manual_seed(3), **kwargs)
    calls: list[tuple[list[int], list[str]]] = []
    gen = generate(model, tok, PROMPTS[:4], generator=torch.Generator().manual_seed(3),
                   on_finished=lambda rows, texts: calls.append((rows, texts)), **kwargs)
    assert gen.texts == plain.texts and torch.equal(gen.completion_ids, plain.completion_ids)
    assert torch.equal(gen.completion_mask, plain.completion_mask)
    handed = [row for rows, _ in calls for row in rows]
    assert len(handed) == len(set(handed)) > 0, "a row was handed over twice, or none was"
    for rows, texts in calls:
        assert texts == [gen.texts[i] for i in rows]
    lengths = gen.completion_mask.sum(1)
    assert all(lengths[i] < gen.completion_ids.shape[1] for i in handed), "a row still decoding at the end was handed"
    early = [i for i in range(len(gen.texts)) if lengths[i] + check_every <= gen.completion_ids.shape[1] - 1]
    assert set(early) <= set(handed), "a row that stopped a check before the end was not handed over"


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("check_every", [1, 8])
def test_the_shape_stable_decode_step_gives_the_same_tokens_and_log_probs(rig, greedy, check_every):
    """decode_graph (on CUDA one captured graph a token: its draw, its bookkeeping and the model's step; on a
    CPU the same shape-stable call run eagerly): keys written by index, attention over the whole masked cache,
    no group leaving the batch, uniforms drawn every check_every tokens. The tokens equal the default path's,
    the log-probs agree up to float reordering, and the generator is left where the default path leaves it."""
    kind, model, tok = rig
    kwargs = dict(max_new_tokens=[4, 40, 9, 40], temperature=[1.0, 0.6, 1.4, 0.9], num_return_sequences=3,
                  greedy=greedy, check_every=check_every)
    gens = {graph: torch.Generator().manual_seed(5) for graph in (False, True)}
    plain = generate(model, tok, PROMPTS[:4], generator=gens[False], **kwargs)
    static = generate(model, tok, PROMPTS[:4], generator=gens[True], decode_graph=True, **kwargs)
    assert min(plain.completion_mask.sum(1)) < plain.completion_ids.shape[1], "no row stopped early"
    assert static.texts == plain.texts and static.finish_reasons == plain.finish_reasons
    assert torch.equal(static.completion_ids, plain.completion_ids)
    assert torch.equal(static.completion_mask, plain.completion_mask)
    assert_rounding_close(static.logprobs, plain.logprobs, logprob_terms(model), kind)
    assert torch.equal(gens[True].get_state(), gens[False].get_state()), "the next rollout would draw otherwise"


def test_the_warm_up_before_a_decode_graphs_capture_leaves_no_trace(rig, monkeypatch):
    """On CUDA the token's call runs twice before its capture (TokenGraph.warm_up), drawing, writing and decoding
    tokens 0 and 1; what they wrote is put back. Here the warm-up runs eagerly before the first token: the
    rollout equals one without it, rows that drew EOS in the warm-up included."""
    from rookworld_rlvr.model.token_graph import TokenGraph

    kind, model, tok = rig
    kwargs = dict(max_new_tokens=[4, 40, 9, 40], temperature=[1.0, 0.6, 1.4, 0.9], num_return_sequences=3,
                  decode_graph=True, check_every=8)
    plain = generate(model, tok, PROMPTS[:4], generator=torch.Generator().manual_seed(5), **kwargs)
    call = TokenGraph.__call__

    def warmed_first(self, decode=True):
        if decode and not getattr(self, "warmed", False):
            self.warmed = True
            self.warm_up(lambda: self._token(decode=True))
        call(self, decode)

    monkeypatch.setattr(TokenGraph, "__call__", warmed_first)
    warmed = generate(model, tok, PROMPTS[:4], generator=torch.Generator().manual_seed(5), **kwargs)
    assert min(plain.completion_mask.sum(1)) < 9, "no row stopped within the first tokens"
    assert torch.equal(warmed.completion_ids, plain.completion_ids)
    assert torch.equal(warmed.completion_mask, plain.completion_mask)
    assert torch.equal(warmed.logprobs, plain.logprobs)


def test_the_shape_stable_decode_step_under_bf16_autocast_and_its_limits():
    tok = build_chess_tokenizer()
    model = tiny_gpt2(len(tok), eos_boost=2.0)
    kwargs = dict(max_new_tokens=12, num_return_sequences=2, greedy=True, autocast_dtype=torch.bfloat16)
    plain = generate(model, tok, PROMPTS[:3], **kwargs)
    static = generate(model, tok, PROMPTS[:3], decode_graph=True, **kwargs)
    assert torch.equal(static.completion_ids, plain.completion_ids)
    assert_bf16_rounding_close(static.logprobs, plain.logprobs, "bf16 shape-stable step")
    with pytest.raises(ValueError, match="decode_graph"):
        generate(model, tok, PROMPTS[:1], max_new_tokens=4, decode_graph=True, record=True)


def test_a_tokens_draw_and_bookkeeping_run_inside_the_decode_graph(tiny_model_dir):
    """With decode_graph a CUDA token is one graph replay: its draw, the buffers it writes and the model's step.
    Around the model's step alone the token's sampling and bookkeeping were 24.6 launches a token from Python;
    outside the token's graph what is left is the uniforms drawn and the stop check read every 8 tokens
    (benchmarks/decode_launches.py counts them, on a CPU, where the same call runs eagerly)."""
    import importlib.util

    from rookworld_rlvr.model import load_policy

    spec = importlib.util.spec_from_file_location("decode_launches", REPO / "benchmarks" / "decode_launches.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model, tok = load_policy(str(tiny_model_dir), device="cpu", verbose=False)
    around_step = bench.per_token(model, tok, PROMPTS[:2], 24, 0.8, step_only=True)
    assert around_step["searchsorted"] == around_step["log_softmax"] == 1  # one draw a token: counts are per token
    outside = bench.per_token(model, tok, PROMPTS[:2], 24, 0.8)
    kernels = {k: v for k, v in outside.items() if k not in bench.VIEWS}
    assert sum(kernels.values()) < 1 and not {"searchsorted", "log_softmax", "index_copy_"} & set(kernels), kernels
    assert outside["rand"] == 1 / 8  # the uniforms of 8 tokens at once


@pytest.mark.parametrize("sampled", [False, True])
def test_the_captured_token_call_holds_nothing_a_cuda_graph_capture_refuses(rig, monkeypatch, sampled):
    """A CUDA graph's capture fails (or records a wrong graph) on a host read of a device value, on an
    operation whose output size depends on the data, on a draw from a generator and on a tensor made from host
    data: the GPU recipes decode with that graph, and a failure there costs a GPU machine's call. Every aten
    operation of the token's call (TokenGraph._token with its decode, what the graph captures) is checked here,
    on the CPU, where the same Python code runs eagerly; under bf16 autocast as on a GPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from rookworld_rlvr.model.token_graph import TokenGraph

    refused = {"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "_unique2", "unique_dim",
               "unique_consecutive", "lift_fresh", "rand", "randn", "randint", "random_", "uniform_", "normal_",
               "bernoulli", "bernoulli_", "multinomial", "exponential_"}
    found: list[str] = []

    class Check(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            by_mask = name in ("index", "index_put_", "index_put") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)
            without_size = name == "repeat_interleave" and (kwargs or {}).get("output_size") is None
            if name in refused or by_mask or without_size:
                found.append(name)
            return func(*args, **(kwargs or {}))

    captured, calls = TokenGraph._token, []

    def checked(self, decode=True):
        if not decode:  # the last token: run eagerly, never captured
            return captured(self, decode)
        calls.append(1)
        with Check():
            return captured(self, decode)

    monkeypatch.setattr(TokenGraph, "_token", checked)
    kind, model, tok = rig
    generate(model, tok, PROMPTS[:4], max_new_tokens=[4, 12, 9, 12], temperature=[1.0, 0.6, 1.4, 0.9],
             num_return_sequences=3, greedy=not sampled, decode_graph=True, check_every=8,
             generator=torch.Generator().manual_seed(5), autocast_dtype=torch.bfloat16)
    assert len(calls) == 11 and found == [], found  # 12 tokens: all but the last captured
    """A CUDA graph's decode step runs under autocast without its weight cache (GraphedStep), which made
    every replay cast every weight again, the LM head included (on an H200 bf16 casts were the most
    launched kernel of a GRPO step). Given cast=bf16 the decoder casts them once, when it is made, and
    its steps give the same logits bit for bit; under autocast as the graph's capture runs it."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    from rookworld_rlvr.model.generate import cache_keyword
    from rookworld_rlvr.model.gpt2_decode import CascadeDecoder, CastLinear, _cast

    tok = build_chess_tokenizer()
    model = tiny_gpt2(len(tok), eos_boost=0.0).eval()
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    head = list(model.lm_head.weight.shape)
    logits = {}
    for cast in (None, torch.bfloat16):
        cache = DynamicCache(config=model.config)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), use_cache=True,
                  **{cache_keyword(model): cache})
        decoder = CascadeDecoder(model, cache, mask, 3, 6, static=True, cast=cast)
        tokens, positions = torch.tensor([5, 6, 7] * 2), mask.sum(-1).repeat_interleave(3)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False), \
                profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            logits[cast] = [decoder.step(tokens, positions + t, t=torch.tensor(t)) for t in range(4)]
        casts = [e for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes and e.input_shapes[0] == head]
        assert len(casts) == (4 if cast is None else 0), f"cast={cast}: the LM head was cast {len(casts)} times in 4 steps"
    assert all(torch.equal(a, b) for a, b in zip(logits[None], logits[torch.bfloat16], strict=True))
    with pytest.raises(ValueError, match="cast and pack"):
        CascadeDecoder(model, cache, mask, 3, 6, pack=True, cast=torch.bfloat16)
    wrapper = torch.nn.Sequential(model.lm_head)  # an adapter's layer adds to its weight's product: left as it is
    assert _cast(wrapper, torch.bfloat16) is wrapper and isinstance(_cast(model.lm_head, torch.bfloat16), CastLinear)


@pytest.mark.parametrize("stock", [False, True])
def test_bf16_autocast_is_entered_once_per_rollout_so_each_weight_is_cast_once(monkeypatch, stock):
    """Entered per token, autocast dropped its cache of bf16 weight copies at every step and cast
    every weight again (the LM head included); entered once, and outside inference mode (where
    autocast caches nothing), each weight is cast once."""
    from rookworld_rlvr.model import gpt2_decode

    if stock:
        monkeypatch.setattr(gpt2_decode, "supports", lambda m: False)
    from torch.profiler import ProfilerActivity, profile

    tok = build_chess_tokenizer()
    model = tiny_gpt2(len(tok), eos_boost=0.0)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        gen = generate(model, tok, PROMPTS[:2], max_new_tokens=12, num_return_sequences=2,
                       autocast_dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    assert gen.completion_ids.shape[1] == 12  # 12 decode steps ran
    head = list(model.lm_head.weight.shape)
    casts = [e for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes and e.input_shapes[0] == head]
    assert len(casts) == 1, f"the LM head was cast {len(casts)} times in 13 forward calls"


def test_filter_logits():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]))
    inf = float("-inf")
    assert filter_logits(logits, top_k=2)[0, 2] == inf and torch.isfinite(filter_logits(logits, top_k=2)[0, :2]).all()
    kept = torch.isfinite(filter_logits(logits, top_p=0.7))
    assert kept.tolist() == [[True, True, False], [False, True, True]]
    kept = torch.isfinite(filter_logits(logits, top_p=0.4))
    assert kept.tolist() == [[True, False, False], [False, False, True]]
    assert torch.equal(filter_logits(logits), logits)


def test_draw_samples_each_row_from_its_distribution_and_never_a_filtered_token():
    """The sampler's inverse-CDF draw: token frequencies within 5 standard errors of each row's
    probabilities (filtered tokens first, in the middle and last; a one-hot row; a row spread over
    every token); a token of probability 0 is never drawn, at GPT-2's 50k vocabulary too; a seed
    repeats the draw."""
    from rookworld_rlvr.model.sampling import fill_uniform, pick

    def draw(probs, generator):  # a uniform of its own for each row, as generate draws them
        return pick(probs, fill_uniform(torch.empty((probs.shape[0], 1), dtype=torch.float64), generator))

    v = 12
    rows = torch.zeros(4, v)
    rows[0, [1, 2, 5]] = torch.tensor([0.5, 0.3, 0.2])  # token 0 and tokens 3, 4, 6... filtered
    rows[1, [0, 7, v - 2]] = torch.tensor([0.1, 0.6, 0.3])  # the last token filtered
    rows[2, v - 1] = 1.0  # one-hot on the last token
    rows[3] = torch.randn(v, generator=torch.Generator().manual_seed(0)).softmax(-1)
    n = 50_000
    probs = rows.repeat_interleave(n, 0)
    tokens = draw(probs, torch.Generator().manual_seed(1)).view(4, n)
    assert torch.equal(tokens, draw(probs, torch.Generator().manual_seed(1)).view(4, n))
    assert not torch.equal(tokens, draw(probs, torch.Generator().manual_seed(2)).view(4, n))
    for r in range(4):
        counts = torch.bincount(tokens[r], minlength=v).double()
        assert counts[rows[r] == 0].sum() == 0, f"row {r}: a token of probability 0 was drawn"
        p = rows[r].double()
        assert ((counts / n - p).abs() <= 5 * (p * (1 - p) / n).sqrt()).all(), f"row {r}: {counts / n} vs {p}"
    big = torch.zeros(3, 50257)
    big[0, [0, 50256]] = 0.5  # the first and the last token only
    big[1, 50256] = 1.0
    big[2] = torch.randn(50257, generator=torch.Generator().manual_seed(0)).softmax(-1)
    big[2, ::2] = 0.0  # every even token filtered out of a spread row (not renormalised: the draw scales u)
    tokens = draw(big.repeat_interleave(500, 0), torch.Generator().manual_seed(3)).view(3, -1)
    assert set(tokens[0].tolist()) == {0, 50256} and (tokens[1] == 50256).all()
    assert (tokens[2] % 2 == 1).all() and len(set(tokens[2].tolist())) > 400  # ~25k odd tokens alike: few repeats


def test_packed_projections_score_like_the_modules_and_hand_them_back(rig):
    """No-grad scoring passes (reference, old policy) may run on packed weights: the same
    log-probs as the modules, the modules' own forward back on exit, and no packing while
    gradients are on (the packed kernels have no backward)."""
    from transformers.pytorch_utils import Conv1D

    from rookworld_rlvr.model.gpt2_decode import packed_projections

    kind, model, tok = rig
    packs = packs_weights(model)
    gen = generate(model, tok, PROMPTS[:3], max_new_tokens=24, num_return_sequences=2,
                   generator=torch.Generator().manual_seed(6))
    batch = build_batch(gen.prompt_ids, gen.prompt_mask, gen.completion_ids, gen.completion_mask)
    n = gen.completion_ids.shape[1]
    modules = [m for m in model.modules() if isinstance(m, Conv1D)] + [model.lm_head]
    with torch.no_grad():
        plain = token_logprobs(model, *batch, n_completion=n, group_size=2)["logprobs"]
        with packed_projections(model):
            assert all(("forward" in vars(m)) == packs for m in modules)
            packed = token_logprobs(model, *batch, n_completion=n, group_size=2)["logprobs"]
    assert not any("forward" in vars(m) for m in modules)
    assert_rounding_close(packed, plain, logprob_terms(model), kind)
    with packed_projections(model):
        assert not any("forward" in vars(m) for m in modules)
        out = token_logprobs(model, *batch, n_completion=n, group_size=2)["logprobs"]
    assert out.requires_grad
