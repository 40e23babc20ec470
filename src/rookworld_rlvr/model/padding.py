"""Padding token sequences into batches: prompts on the left, completions on the right.

Owns the one padding rule of the package: the sampler, the trainer's batches, the anchor and SFT
all pad here, and positions come from the mask (`generate.positions_from_mask`), so a left-padded
row scores as if it had run alone. Knows torch, not chess: imports nothing of tasks, data,
engine or the trainer.
"""

from __future__ import annotations

from typing import Sequence

import torch


def pad(seqs: Sequence[Sequence[int | float]], value: int | float, side: str, width: int = 0,
        dtype: torch.dtype = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, W] values and their 0/1 mask [N, W] (long): each row flush right ("left" padding) or
    flush left ("right" padding), `value` elsewhere; W is the longest row, at least `width`."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be left or right, got {side!r}")
    w = max([width, *(len(s) for s in seqs)])
    out = torch.full((len(seqs), w), value, dtype=dtype)
    mask = torch.zeros((len(seqs), w), dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            cols = slice(w - len(s), w) if side == "left" else slice(0, len(s))
            out[i, cols] = torch.tensor(s, dtype=dtype)
            mask[i, cols] = 1
    return out, mask


def pad_pairs(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
              pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Prompt-completion pairs as one batch: [N, P + C] ids and attention mask, prompts left-padded
    to P, completions right-padded to C (at least 1 column). Returns (ids, mask, P)."""
    prompt_ids, prompt_mask = pad(prompts, pad_id, "left")
    completion_ids, completion_mask = pad(completions, pad_id, "right", width=1)
    return (torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1),
            prompt_ids.shape[1])
