"""Per-token log-probs of completions in one forward pass (policy, old policy, reference).

Positions are derived from the attention mask exactly as in `generate`, so a
left-padded batch scores each completion as if it had been run alone.
"""

from __future__ import annotations

import torch

from .generate import accepts_logits_to_keep, positions_from_mask


def build_batch(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Concatenate left-padded prompts and right-padded completions; positions from the mask."""
    if prompt_ids.shape[0] != completion_ids.shape[0]:
        raise ValueError(f"batch sizes differ: prompts {prompt_ids.shape[0]}, completions {completion_ids.shape[0]}")
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()
    return input_ids, attention_mask, positions_from_mask(attention_mask)


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
) -> dict[str, torch.Tensor]:
    """Log-probs of the last `n_completion` tokens under log_softmax(logits / temperature).

    Returns "logprobs" [N, C] (0 where the attention mask is 0), optionally "entropy"
    [N, C] of the same distribution (0 where masked) and "logits" [N, C, V]
    (temperature-scaled float32, for exact KL). Only C + 1 positions go through the
    LM head. Gradients flow unless the caller wraps this in torch.no_grad(); the
    model's train/eval mode is the caller's choice (dropout should be off for GRPO).

    With `group_size` G > 1 and groups of G adjacent rows sharing the prompt columns
    (as GRPO batches do), each prompt runs once and its KV cache is expanded to its
    G rows; gradients from all G completions flow back into the one prompt pass.
    The result equals the plain pass; the prompt's share of the compute drops G-fold.
    """
    length = input_ids.shape[1]
    if not 0 < n_completion < length:
        raise ValueError(f"n_completion must be in [1, {length - 1}] for sequences of length {length}, got {n_completion}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    logits = None
    if _shares_prompts(input_ids, attention_mask, n_completion, group_size):
        logits = _grouped_logits(model, input_ids, attention_mask, position_ids, n_completion, group_size)
    if logits is None:
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
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    # gather - logsumexp instead of a full log_softmax: no second [N, C, V] tensor (50k vocab at 124M).
    lse = torch.logsumexp(logits, dim=-1)
    targets = input_ids[:, -n_completion:]
    mask = attention_mask[:, -n_completion:].bool()
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    result = {"logprobs": torch.where(mask, logp, torch.zeros_like(logp))}
    if return_entropy:
        entropy = lse - (logits.softmax(-1) * logits).sum(-1)
        result["entropy"] = torch.where(mask, entropy, torch.zeros_like(entropy))
    if return_logits:
        result["logits"] = logits
    return result


def _shares_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int, group_size: int) -> bool:
    """True when every block of `group_size` adjacent rows has identical prompt columns."""
    n, length = input_ids.shape
    if group_size <= 1 or n % group_size or length - n_completion < 1:
        return False
    prompt = torch.stack([input_ids[:, :-n_completion], attention_mask[:, :-n_completion]], 1)
    blocks = prompt.view(n // group_size, group_size, *prompt.shape[1:])
    return bool((blocks == blocks[:, :1]).all())


def length_buckets(widths: list[int], max_buckets: int = 4, overhead: int = 16) -> list[list[int]]:
    """Rows grouped by how many columns they need, so that each group runs only to its own longest
    row: row indices per group, fewest padded columns first (sum of rows x width per group, plus
    `overhead` column-rows per extra group for the extra pass). Exact DP over the sorted widths."""
    order = sorted(range(len(widths)), key=widths.__getitem__)
    w = [widths[i] for i in order]
    n = len(w)
    # best[k][j]: cost of the first j sorted rows in k groups; cut[k][j]: where the last group starts
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(max_buckets + 1)]
    cut = [[0] * (n + 1) for _ in range(max_buckets + 1)]
    best[0][0] = 0
    for k in range(1, max_buckets + 1):
        for j in range(1, n + 1):
            for i in range(k - 1, j):
                if i and w[i - 1] == w[i]:
                    continue  # never split rows of equal width
                c = best[k - 1][i] + (j - i) * w[j - 1] + overhead
                if c < best[k][j]:
                    best[k][j], cut[k][j] = c, i
    k = min(range(1, max_buckets + 1), key=lambda k: best[k][n])
    groups, j = [], n
    while k:
        i = cut[k][j]
        groups.append(order[i:j])
        j, k = i, k - 1
    return groups[::-1]


def _grouped_logits(model, input_ids, attention_mask, position_ids, n_completion: int, group_size: int):
    """[N, C, V] logits predicting the completion tokens, with one prompt pass per group;
    None when the model's cache cannot be expanded (the caller then runs the plain pass).

    The completion pass runs in a few buckets of rows of similar length, each only as wide as its
    longest completion: right padding is a fifth of a GRPO batch's completion columns, and the
    bucket passes skip most of it. Logits at padded positions are 0 (they are masked anyway)."""
    n, p = input_ids.shape[0], input_ids.shape[1] - n_completion
    head = slice(None, None, group_size)  # the first row of each group
    keep = accepts_logits_to_keep(model)
    first = model(input_ids=input_ids[head, :p], attention_mask=attention_mask[head, :p],
                  position_ids=position_ids[head, :p], use_cache=True, **({"logits_to_keep": 1} if keep else {}))
    last_prompt = first.logits[:, -1:].repeat_interleave(group_size, dim=0)
    if n_completion == 1:
        return last_prompt
    cache = first.past_key_values
    layers = getattr(cache, "layers", None)
    if not layers or not all(isinstance(getattr(layer, "keys", None), torch.Tensor) for layer in layers):
        if not hasattr(cache, "batch_repeat_interleave"):
            return None
        cache.batch_repeat_interleave(group_size)  # differentiable: the G rows' gradients sum into the prompt
        rest = model(input_ids=input_ids[:, p:-1], attention_mask=attention_mask[:, :-1],
                     position_ids=position_ids[:, p:-1], past_key_values=cache, use_cache=True,
                     **({"logits_to_keep": n_completion - 1} if keep else {}))
        return torch.cat([last_prompt, rest.logits[:, -(n_completion - 1):]], 1)
    # columns of the completion pass a row needs: up to its last real token but one
    cols = torch.arange(1, n_completion + 1, device=attention_mask.device)
    need = ((attention_mask[:, p:] > 0) * cols).amax(1).sub(1).clamp(min=1).tolist()
    prompt_kv = [(layer.keys, layer.values) for layer in layers]
    pieces, rows = [], []
    for bucket in length_buckets(need):
        idx = torch.tensor(bucket, device=input_ids.device)
        w = max(need[i] for i in bucket)
        for layer, (k, v) in zip(layers, prompt_kv):  # differentiable: the rows' gradients sum into the prompt
            layer.keys, layer.values = k.index_select(0, idx // group_size), v.index_select(0, idx // group_size)
        out = model(input_ids=input_ids[idx, p:p + w], attention_mask=attention_mask[idx, :p + w],
                    position_ids=position_ids[idx, p:p + w], past_key_values=cache, use_cache=True,
                    **({"logits_to_keep": w} if keep else {}))
        pieces.append(torch.nn.functional.pad(out.logits[:, -w:], (0, 0, 0, n_completion - 1 - w)))
        rows += bucket
    inverse = torch.empty(n, dtype=torch.long, device=input_ids.device)
    inverse[torch.tensor(rows, device=input_ids.device)] = torch.arange(n, device=input_ids.device)
    return torch.cat([last_prompt, torch.cat(pieces).index_select(0, inverse)], 1)
