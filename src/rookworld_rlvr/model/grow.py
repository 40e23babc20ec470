"""Deepen a trained GPT-2 without changing what it computes (depth up-scaling).

A base that has stopped learning at its size still holds hundreds of CPU minutes of knowledge; a
fresh, larger model would have to pay them again. Growing keeps them: each new block is a copy of
the block before it with its two output projections (attention and MLP) set to zero, so it adds
nothing to the residual stream and the grown model's logits equal the old model's exactly. Training
then moves those projections off zero and the new blocks start to contribute.

Owns depth up-scaling. Imports torch and transformers, nothing outside the model room.
"""

from __future__ import annotations

import torch


def insert_after(old: int, new: int) -> list[int]:
    """For each of `new - old` added blocks, the old block it follows: spread evenly over the depth,
    so 6 -> 12 puts one after every block and 6 -> 9 one after blocks 0, 2 and 4."""
    if not 0 < old < new:
        raise ValueError(f"growing to {new} layers needs more than the model's {old}")
    added = new - old
    return [(k * old) // added for k in range(added)]


def grow_depth(model: torch.nn.Module, n_layer: int) -> torch.nn.Module:
    """A GPT-2 (transformers `GPT2LMHeadModel`) with `n_layer` blocks that computes exactly what
    `model` computes, in `model`'s dtype and on its device."""
    from transformers import GPT2LMHeadModel

    if model.config.model_type != "gpt2":
        raise ValueError(f"growing works on GPT-2 models, not {model.config.model_type!r}")
    old = model.config.n_layer
    after = insert_after(old, n_layer)
    config = model.config.__class__.from_dict({**model.config.to_dict(), "n_layer": n_layer})
    source = []  # for each new block: (old block it copies, whether it is an added one)
    for i in range(old):
        source.append((i, False))
        source.extend((i, True) for _ in range(after.count(i)))
    state = model.state_dict()
    grown = {key: value.clone() for key, value in state.items() if not key.startswith("transformer.h.")}
    for j, (i, added) in enumerate(source):
        prefix = f"transformer.h.{i}."
        for key, value in state.items():
            if key.startswith(prefix):
                rest = key[len(prefix):]
                zero = added and rest.split(".")[-2:-1] == ["c_proj"]
                grown[f"transformer.h.{j}.{rest}"] = torch.zeros_like(value) if zero else value.clone()
    param = next(model.parameters())
    new = GPT2LMHeadModel(config).to(device=param.device, dtype=param.dtype)
    new.load_state_dict(grown, strict=True)
    # keep the module swaps of the source model (fused GELU) and its train/eval mode
    from rookworld_rlvr.model.load import fuse_activations

    fuse_activations(new)
    new.train(model.training)
    return new
