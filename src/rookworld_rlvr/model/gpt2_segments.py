"""One GPT-2 forward over several segments of tokens: a group's prompts and buckets of completions.

A GRPO scoring pass runs each prompt once and then its completions in a few buckets of
similar length, each attending to its prompt's keys and values. Through the stock model
that is a prompt pass plus one forward per bucket: every layer's projections and MLP run
as several small matrix products. Here every segment's tokens are laid side by side in
one [tokens, E] stream, so the layer norms, projections and MLP run once per layer over
all of them; only attention is done segment by segment (each completion bucket against
its rows' prompt keys and values, expanded with a differentiable `index_select`, and its
own causal keys). Same numbers as the stock forward up to float reordering (tests compare
log-probs and gradients). Used only for a plain `GPT2LMHeadModel` in eval mode (`supports`).

Given the projection outputs the sampler recorded for these tokens (`recorded`), the forward
takes them instead of recomputing the products: the first update on a fresh batch then pays
only for attention and element-wise work forward (at 124M on CPU, 1.5 s instead of 7.5 s).

Owns the segmented scoring forward. Knows torch and transformers, not chess: imports nothing of
tasks, data, engine or the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .bf16_grad import linear
from .gpt2_decode import projection_widths
from .gpt2_decode import supports  # a plain GPT-2 in eval mode (no dropout): what this forward reproduces


@dataclass
class Segment:
    """Rows of `ids` [n, w] at `positions` [n, w]. A prompt segment (`prompt_rows` None) is
    left-padded, `key_mask` [n, w] marking its real tokens; a completion segment attends first
    to the keys of rows `prompt_rows` [n] of the segment before it that is a prompt (masked by
    `key_mask` [n, P], the prompt's real tokens), then causally to its own."""

    ids: torch.Tensor
    positions: torch.Tensor
    key_mask: torch.Tensor
    prompt_rows: torch.Tensor | None = None


def _masks(segments: list[Segment], dtype: torch.dtype) -> list[torch.Tensor]:
    """Attention masks [n, 1, w, keys] in the form attention adds them to its scores: 0 where a query may
    attend, -inf elsewhere (what it would make of a boolean mask at every layer's call). A left-pad query of
    a prompt sees itself, so that no row of the softmax is empty (its output is never read)."""
    out = []
    for s in segments:
        n, w = s.ids.shape
        causal = torch.ones(w, w, dtype=torch.bool, device=s.ids.device).tril()
        if s.prompt_rows is None:
            m = (causal & s.key_mask.bool()[:, None, :]) | torch.eye(w, dtype=torch.bool, device=s.ids.device)
        else:
            m = torch.cat([s.key_mask.bool()[:, None, :].expand(n, w, -1), causal.expand(n, w, w)], -1)
        out.append(torch.zeros(m[:, None].shape, dtype=dtype, device=m.device).masked_fill_(~m[:, None], float("-inf")))
    return out


def hidden_states(model, segments: list[Segment], grad_dtype: torch.dtype | None = None,
                  recorded: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The final hidden states (after `ln_f`) of each segment, [n, w, E]. With `grad_dtype` the
    backward's matrix products of the projections and MLP run in that dtype (`bf16_grad`).

    `recorded` [layers, tokens, W]: the outputs of each layer's four projections (qkv, attention
    output, MLP up before its activation, MLP down; W the sum of their widths) at every token of the
    segments laid end to end, as the sampler computed them on these very weights
    (`generate(record=True)`, `gpt2_decode.recording`). The forward then skips
    those products and takes the recorded outputs; the backward is unchanged. Attention, layer norms
    and the activation still run: the backward needs their inputs."""
    tr = model.transformer
    e = tr.embed_dim
    sizes = [s.ids.numel() for s in segments]
    widths = projection_widths(model)
    if recorded is not None and tuple(recorded.shape) != (len(tr.h), sum(sizes), sum(widths)):
        raise ValueError(f"recorded projections are {tuple(recorded.shape)}, "
                         f"expected {(len(tr.h), sum(sizes), sum(widths))}")
    masks = None  # made once, in the dtype of the first layer's queries
    x = torch.cat([(tr.wte(s.ids) + tr.wpe(s.positions)).reshape(-1, e) for s in segments])
    for layer, block in enumerate(tr.h):
        rec = [None] * 4 if recorded is None else recorded[layer].split(widths, -1)
        attn = block.attn
        heads, dim = attn.num_heads, attn.head_dim
        qkv = linear(attn.c_attn, block.ln_1(x), grad_dtype, rec[0])
        masks = _masks(segments, qkv.dtype) if masks is None else masks
        outs, prompt_kv = [], None
        for s, part, mask in zip(segments, qkv.split(sizes), masks):
            n, w = s.ids.shape
            q, k, v = (z.view(n, w, heads, dim).transpose(1, 2) for z in part.split(e, -1))
            if s.prompt_rows is None:
                prompt_kv = (k, v)
            elif prompt_kv is None:
                raise ValueError("a completion segment needs a prompt segment before it")
            else:
                k, v = (torch.cat([p.index_select(0, s.prompt_rows), z], 2) for p, z in zip(prompt_kv, (k, v)))
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling)
            outs.append(o.transpose(1, 2).reshape(n * w, e))
        x = x + linear(attn.c_proj, torch.cat(outs), grad_dtype, rec[1])
        mlp = block.mlp  # GPT2MLP.forward, with our linear (dropout is off: eval mode)
        up = linear(mlp.c_fc, block.ln_2(x), grad_dtype, rec[2])
        x = x + mlp.dropout(linear(mlp.c_proj, mlp.act(up), grad_dtype, rec[3]))
    return [h.view(*s.ids.shape, e) for s, h in zip(segments, tr.ln_f(x).split(sizes))]
