"""Per-token log-probs of completions in one forward pass (policy, old policy, reference).

Positions are derived from the attention mask exactly as in `generate`, so a
left-padded batch (`padding.pad_pairs`) scores each completion as if it had been run alone.
Owns the scoring of completions and the entropy of the distributions. Knows torch and
transformers, not chess: imports nothing of tasks, data, engine or the trainer.
"""

from __future__ import annotations

from collections import Counter
from itertools import accumulate
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from . import gpt2_segments
from .generate import accepts_logits_to_keep, cache_keyword, returned_cache
from .bf16_grad import linear
from .gpt2_segments import Segment


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    n_completion: int,
    temperature: float = 1.0,
    return_entropy: bool = False,
    return_logits: bool = False,
    group_size: int = 1,
    entropy_grad: bool = True,
    grad_dtype: torch.dtype | None = None,
    recorded: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """Log-probs of the last `n_completion` tokens under log_softmax(logits / temperature).

    Returns "logprobs" [N, C] (0 where the attention mask is 0), optionally "entropy"
    [N, C] of the same distribution (0 where masked; without a gradient when `entropy_grad`
    is False, as for a logged-only entropy: autograd then keeps no softmax over the
    vocabulary, 1.3 GB for 64 x 100 tokens of GPT-2's 50k) and "logits" [N, C, V]
    (temperature-scaled float32, for exact KL). Only C + 1 positions go through the
    LM head. Gradients flow unless the caller wraps this in torch.no_grad(); the
    model's train/eval mode is the caller's choice (dropout should be off for GRPO).

    With `group_size` G > 1 and groups of G adjacent rows sharing the prompt columns
    (as GRPO batches do), each prompt runs once and its KV cache is expanded to its
    G rows; gradients from all G completions flow back into the one prompt pass.
    The result equals the plain pass; the prompt's share of the compute drops G-fold.

    `grad_dtype` (bf16): the backward's matrix products in that dtype, the forward unchanged
    (`bf16_grad`). It takes effect only where the one-forward GPT-2 path runs (`gpt2_segments`).

    `recorded`: per row, the projections and logits the sampler computed for it on the current
    weights (`Generation.recorded_row`): the forward then skips its matrix products and the LM
    head's, and returns the sampler's log-probs, with the same gradients (`gpt2_segments`). Needs
    that one-forward path.
    """
    length = input_ids.shape[1]
    if not 0 < n_completion < length:
        raise ValueError(f"n_completion must be in [1, {length - 1}] for sequences of length {length}, got {n_completion}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    targets = input_ids[:, -n_completion:]
    grouped = None
    shared = _shares_prompts(input_ids, attention_mask, n_completion, group_size)
    if recorded is not None and not (shared and gpt2_segments.supports(model) and len(recorded) == len(input_ids)):
        raise ValueError("recorded projections need one per row, groups of rows sharing their prompt and a plain "
                         "GPT-2 in eval mode (the one-forward path of gpt2_segments)")
    if shared:
        grouped = _grouped_logits(model, input_ids, attention_mask, position_ids, n_completion, group_size,
                                  grad_dtype, recorded)
    if grouped is None:
        keep = {"logits_to_keep": n_completion + 1} if accepts_logits_to_keep(model) else {}
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **keep,
        )
        # Logits at position t predict token t + 1: take the C positions before each completion token.
        logits = out.logits[:, -(n_completion + 1) : -1, :]
        result = _score_in_chunks(lambda rows: logits[rows], len(logits), logits.shape[1], logits.shape[-1], targets,
                                  temperature, return_entropy, return_logits, entropy_grad)
    else:  # scored piece by piece: no [N, C, V] copy is assembled unless the logits are asked for
        first, buckets, order = grouped
        vocab = first.shape[-1]
        parts = [_score(first, targets[:, :1], temperature, return_entropy, return_logits, entropy_grad)]
        parts += [_score_in_chunks(logits, len(rows), width, vocab, targets[rows, 1:1 + width], temperature,
                                   return_entropy, return_logits, entropy_grad) for rows, width, logits in buckets]
        result = {key: _assemble(parts[0][key], [part[key] for part in parts[1:]], order, n_completion)
                  for key in parts[0]}
    mask = attention_mask[:, -n_completion:].bool()
    for key in ("logprobs", "entropy"):
        if key in result:
            result[key] = torch.where(mask, result[key], torch.zeros_like(result[key]))
    return result


# Full-vocabulary elements per scoring chunk: 2^25 float32 logits are 128 MB. A 124M minibatch of 64 rows x
# 144 tokens has 463M (1.85 GB, and the scoring made four more of that size); in chunks of about 4 rows,
# each with its own LM-head product, the peak is a few chunk-sized tensors. Small models score in one piece.
SCORE_CHUNK_ELEMENTS = 2**25


def _score_in_chunks(logits_of: Callable[[slice], torch.Tensor], n: int, width: int, vocab: int,
                     targets: torch.Tensor, temperature: float, entropy: bool, keep_logits: bool,
                     entropy_grad: bool) -> dict[str, torch.Tensor]:
    """`_score` of n rows whose logits [rows, width, vocab] `logits_of(rows)` makes (the LM head on
    those rows' hidden states), a few rows at a time so that no [n, width, vocab] float32 tensor
    is made more than once (not at all from hidden states). With autograd each chunk is
    checkpointed: its logits are made again in the backward instead of being kept. Asked for the
    logits (exact KL), or where one chunk holds every row, it scores all rows at once."""
    rows = max(1, SCORE_CHUNK_ELEMENTS // max(1, width * vocab))
    if keep_logits or rows >= n:
        return _score(logits_of(slice(None)), targets, temperature, entropy, keep_logits, entropy_grad)

    def chunk(sl: slice) -> dict[str, torch.Tensor]:
        return _score(logits_of(sl), targets[sl], temperature, entropy, False, entropy_grad)

    parts = [checkpoint(chunk, sl, use_reentrant=False) if torch.is_grad_enabled() else chunk(sl)
             for sl in (slice(start, start + rows) for start in range(0, n, rows))]
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}


def _score(logits: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool, keep_logits: bool,
           entropy_grad: bool) -> dict[str, torch.Tensor]:
    """Log-probs of `targets` [n, w] (and entropy, scaled logits) from next-token logits [n, w, V]."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    # gather - logsumexp instead of a full log_softmax: no second [n, w, V] tensor (50k vocab at 124M).
    lse = torch.logsumexp(logits, dim=-1)
    out = {"logprobs": logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse}
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):  # else no [n, w, V] softmax kept
            out["entropy"] = entropy_of(logits, lse)
    if keep_logits:
        out["logits"] = logits
    return out


def entropy_of(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Per-position entropy -sum_v p log p of softmax(logits) [..., V] -> [...], from the logits and
    their logsumexp `lse` (already computed for the log-probs): log Z - E_p[logit]."""
    return lse - (logits.softmax(-1) * logits).sum(-1)


def _assemble(first: torch.Tensor, pieces: list[torch.Tensor], order: torch.Tensor, width: int) -> torch.Tensor:
    """[N, width, ...] from column 0 of every row and the later columns of each bucket's rows
    (bucket rows in `order`; columns a bucket did not compute are 0)."""
    if not pieces:  # one completion column
        return first
    pad = [(0, 0) * (p.dim() - 2) + (0, width - 1 - p.shape[1]) for p in pieces]
    rest = torch.cat([torch.nn.functional.pad(p, pd) for p, pd in zip(pieces, pad)]).index_select(0, order)
    return torch.cat([first, rest], 1)


def _shares_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int, group_size: int) -> bool:
    """True when every block of `group_size` adjacent rows has identical prompt columns."""
    n, length = input_ids.shape
    if group_size <= 1 or n % group_size or length - n_completion < 1:
        return False
    prompt = torch.stack([input_ids[:, :-n_completion], attention_mask[:, :-n_completion]], 1)
    blocks = prompt.view(n // group_size, group_size, *prompt.shape[1:])
    return bool((blocks == blocks[:, :1]).all())


def length_buckets(widths: list[int], max_buckets: int = 4, overhead: int = 16) -> list[list[int]]:
    """Rows grouped by how many columns they need, so that each group's pass runs only to its own
    widest row: row indices per group, narrowest group first. Minimises the padded row-columns
    (rows x widest width, summed over groups) plus `overhead` row-columns per pass; rows of equal
    width stay together. Exact DP over the distinct widths (at most the completion length)."""
    order = sorted(range(len(widths)), key=widths.__getitem__)
    counts = Counter(widths)
    values = sorted(counts)
    ends = [0, *accumulate(counts[v] for v in values)]  # ends[d]: number of rows of the d narrowest widths
    m = len(values)
    inf = float("inf")
    # best[k][j]: cost of the rows of the j narrowest widths in k groups; cut[k][j]: where the last group starts
    best = [[0.0] + [inf] * m] + [[inf] * (m + 1) for _ in range(max_buckets)]
    cut = [[0] * (m + 1) for _ in range(max_buckets + 1)]
    for k in range(1, max_buckets + 1):
        for j in range(1, m + 1):
            for i in range(k - 1, j):
                c = best[k - 1][i] + (ends[j] - ends[i]) * values[j - 1] + overhead
                if c < best[k][j]:
                    best[k][j], cut[k][j] = c, i
    k = min(range(1, max_buckets + 1), key=lambda k: best[k][m])
    groups, j = [], m
    while k:
        i = cut[k][j]
        groups.append(order[ends[i]:ends[j]])
        j, k = i, k - 1
    return groups[::-1]


def _completion_buckets(attention_mask: torch.Tensor, p: int, n_completion: int) -> list[tuple[torch.Tensor, int]]:
    """(rows, width) of each completion bucket: rows of similar length, each bucket only as wide as
    the columns its longest row needs (up to its last real token but one)."""
    cols = torch.arange(1, n_completion + 1, device=attention_mask.device)
    need = ((attention_mask[:, p:] > 0) * cols).amax(1).sub(1).clamp(min=1).tolist()
    return [(torch.tensor(b, device=attention_mask.device), max(need[i] for i in b)) for b in length_buckets(need)]


def _grouped_logits(model, input_ids, attention_mask, position_ids, n_completion: int, group_size: int,
                    grad_dtype: torch.dtype | None = None, recorded: list | None = None):
    """Logits predicting the completion tokens, with one prompt pass per group: (column 0 [N, 1, V],
    [(rows, w_b, logits_of)] per bucket, where logits_of(r) gives rows r's logits [r, w_b, V] of
    columns 1..w_b (a plain GPT-2 makes them from hidden states only then: `_score_in_chunks`),
    each row's place in the buckets' rows); None when the model's cache cannot be expanded (the
    caller then runs the plain pass).

    The completion pass runs in a few buckets of rows of similar length, each only as wide as its
    longest completion: right padding was 5-22% of a benchmark batch's completion columns, and the
    bucket passes skip most of it. Columns past a bucket's width come out 0 (they are masked).
    A plain GPT-2 runs the prompts and all buckets in one forward (`gpt2_segments`)."""
    n, p = input_ids.shape[0], input_ids.shape[1] - n_completion
    head = slice(None, None, group_size)  # the first row of each group
    every_row = torch.arange(n, device=input_ids.device)
    buckets = _completion_buckets(attention_mask, p, n_completion) if n_completion > 1 else []
    if gpt2_segments.supports(model):
        segments = [Segment(input_ids[head, :p], position_ids[head, :p], attention_mask[head, :p])]
        segments += [Segment(input_ids[idx, p:p + w], position_ids[idx, p:p + w], attention_mask[idx, :p],
                             prompt_rows=idx // group_size) for idx, w in buckets]
        stream = None if recorded is None else _recorded_stream(recorded, attention_mask, group_size, p, buckets)
        hidden = gpt2_segments.hidden_states(model, segments, grad_dtype, stream)
        last_prompt = linear(model.lm_head, hidden[0][:, -1:], grad_dtype).repeat_interleave(group_size, dim=0)

        def logits_of(rows: slice, idx: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            """The LM head on rows `rows` of a bucket: the sampler's logits where recorded."""
            rec = None if recorded is None else _recorded_logits([recorded[r][2] for r in idx[rows].tolist()],
                                                                  h.shape[1])
            return linear(model.lm_head, h[rows], grad_dtype, rec)

        scored = [(idx, h.shape[1], lambda rows, idx=idx, h=h: logits_of(rows, idx, h))
                  for (idx, _), h in zip(buckets, hidden[1:])]
        return last_prompt, scored, _order(buckets, every_row)
    keep = accepts_logits_to_keep(model)
    first = model(input_ids=input_ids[head, :p], attention_mask=attention_mask[head, :p],
                  position_ids=position_ids[head, :p], use_cache=True, **({"logits_to_keep": 1} if keep else {}))
    last_prompt = first.logits[:, -1:].repeat_interleave(group_size, dim=0)
    if n_completion == 1:
        return last_prompt, [], every_row
    cache, cache_kw = returned_cache(first), cache_keyword(model)
    layers = getattr(cache, "layers", None)
    if not layers or not all(isinstance(getattr(layer, "keys", None), torch.Tensor) for layer in layers):
        if not hasattr(cache, "batch_repeat_interleave"):
            return None
        cache.batch_repeat_interleave(group_size)  # differentiable: the G rows' gradients sum into the prompt
        rest = model(input_ids=input_ids[:, p:-1], attention_mask=attention_mask[:, :-1],
                     position_ids=position_ids[:, p:-1], use_cache=True, **{cache_kw: cache},
                     **({"logits_to_keep": n_completion - 1} if keep else {}))
        rest = rest.logits[:, -(n_completion - 1):]
        return last_prompt, [(every_row, rest.shape[1], lambda rows: rest[rows])], every_row
    prompt_kv = [(layer.keys, layer.values) for layer in layers]
    scored = []
    for idx, w in buckets:
        for layer, (k, v) in zip(layers, prompt_kv):  # differentiable: the rows' gradients sum into the prompt
            layer.keys, layer.values = k.index_select(0, idx // group_size), v.index_select(0, idx // group_size)
        out = model(input_ids=input_ids[idx, p:p + w], attention_mask=attention_mask[idx, :p + w],
                    position_ids=position_ids[idx, p:p + w], use_cache=True, **{cache_kw: cache},
                    **({"logits_to_keep": w} if keep else {}))
        scored.append((idx, w, lambda rows, logits=out.logits[:, -w:]: logits[rows]))
    return last_prompt, scored, _order(buckets, every_row)


def _recorded_stream(recorded: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], attention_mask: torch.Tensor,
                     group_size: int, p: int, buckets: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """The rows' recorded projections [L, tokens, W] in the order `_grouped_logits` lays out its
    segments: each group's prompt left-padded to p columns, then each bucket's rows, w columns
    each. Padding gets zeros (finite: its outputs are never read, its gradients are 0). Checks
    that every row's recorded logits cover the columns its bucket scores."""
    real_prompt = attention_mask[:, :p].sum(1).tolist()
    real_completion = attention_mask[:, p:].sum(1).tolist()
    heads = range(0, len(recorded), group_size)
    layers, _, width = recorded[0][0].shape
    tokens = len(heads) * p + sum(len(idx) * w for idx, w in buckets)
    out = recorded[0][0].new_empty((layers, tokens, width))  # zeroing all of it took as long as the copies
    at = 0
    for r in heads:
        prompt = recorded[r][0]
        if prompt.shape[1] != real_prompt[r]:
            raise ValueError(f"row {r}: {prompt.shape[1]} recorded prompt tokens, the batch has {real_prompt[r]}")
        out[:, at: at + p - prompt.shape[1]].zero_()
        out[:, at + p - prompt.shape[1]: at + p] = prompt
        at += p
    for idx, w in buckets:
        for r in idx.tolist():
            fed, logits = recorded[r][1], recorded[r][2]
            need = min(w, max(real_completion[r] - 1, 0))
            if fed.shape[1] < need:
                raise ValueError(f"row {r}: {fed.shape[1]} recorded completion tokens, the pass needs {need}")
            if logits.shape[0] < need:
                raise ValueError(f"row {r}: recorded logits at {logits.shape[0]} completion tokens, the pass needs {need}")
            out[:, at: at + need] = fed[:, :need]
            out[:, at + need: at + w].zero_()
            at += w
    return out


def _recorded_logits(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Recorded logits [c_r, V] of some rows as one [rows, width, V] block: each row's first
    min(c_r, width) columns, zeros after (masked columns: finite, their gradients are 0)."""
    out = rows[0].new_empty((len(rows), width, rows[0].shape[-1]))
    for j, logits in enumerate(rows):
        need = min(width, logits.shape[0])
        out[j, :need] = logits[:need]
        out[j, need:].zero_()
    return out


def _order(buckets: list[tuple[torch.Tensor, int]], every_row: torch.Tensor) -> torch.Tensor:
    """Each row's place in the buckets' rows laid end to end."""
    if not buckets:
        return every_row
    order = torch.empty_like(every_row)
    order[torch.cat([idx for idx, _ in buckets])] = every_row
    return order
