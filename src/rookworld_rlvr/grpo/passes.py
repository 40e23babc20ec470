"""Log-prob passes over a batch, minibatch by minibatch: the frozen reference, the policy that
sampled (old), and the policy being trained.

Every pass of a step scores each row under its task's sampling temperature, runs each prompt
once for its group of G rows, and crops the left padding no row of the minibatch uses; the
no-grad passes run on packed weights. Owns how a batch is cut into minibatches and scored.
Imports torch and the model package; nothing of chess.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.grpo.rollout import Batch, Row
from rookworld_rlvr.model import token_logprobs
from rookworld_rlvr.model.generate import device_context
from rookworld_rlvr.model.gpt2_decode import packed_projections


def task_slices(rows: list[Row], group_size: int, minibatch_size: int) -> list[slice]:
    """Minibatches of at most `minibatch_size` rows (0: all) that never mix tasks (the temperature
    may differ per task) and never split a group."""
    mb = minibatch_size or len(rows)
    mb = max(group_size, (mb // group_size) * group_size)
    out, start = [], 0
    while start < len(rows):
        end = start
        while end < len(rows) and end - start < mb and rows[end].task == rows[start].task:
            end += group_size
        out.append(slice(start, end))
        start = end
    return out


@dataclass(frozen=True)
class Passes:
    """What every log-prob pass of one step shares: the settings at `step` and the precision."""

    cfg: TrainConfig
    step: int
    amp: torch.dtype | None  # bf16 autocast, or None
    grad_dtype: torch.dtype | None  # the policy pass's backward products (grpo.precision.backward_dtype)

    def logprobs(self, model, batch: Batch, rows: slice, device: torch.device, want_logits: bool = False,
                  entropy: bool = False, recorded: bool = False) -> dict[str, torch.Tensor]:
        """Log-probs (and entropy, logits) of `rows`; `recorded`: on the rows' recorded projections
        where every row has them (the policy's first pass on a fresh batch: the weights are still the
        sampler's; rows built elsewhere, or already used once, have none and are recomputed)."""
        saved = [r.recorded for r in batch.rows[rows]]
        saved = saved if recorded and all(x is not None for x in saved) else None
        ids, am, pos = (x[rows].to(device) for x in (batch.input_ids, batch.attention_mask, batch.position_ids))
        first = int(am.any(0).long().argmax())  # left-pad columns no row of this minibatch uses (shorter prompts)
        ids, am, pos = ids[:, first:], am[:, first:], pos[:, first:]
        temp = self.cfg.sampling_for(batch.rows[rows.start].task, self.step)["temperature"]
        with device_context(device, self.amp):  # one prompt pass per group (the G rows share it): same numbers
            return token_logprobs(model, ids, am, pos, batch.n_completion, temperature=temp,
                                  return_entropy=entropy, return_logits=want_logits, group_size=self.cfg.group_size,
                                  entropy_grad=self.cfg.entropy_coef != 0,  # otherwise it is only logged
                                  grad_dtype=self.grad_dtype,  # no effect without autograd
                                  recorded=saved)

    def frozen(self, model, context: AbstractContextManager, batch: Batch, slices: list[slice],
               device: torch.device, want_logits: bool = False) -> list[dict[str, torch.Tensor]]:
        """No-grad log-probs (and logits) of every minibatch under `context` (LoRA: adapters off), on
        packed weights except under autocast (it keeps its bf16); moved to the batch's device."""
        packed = packed_projections(model) if self.amp is None else nullcontext()
        with torch.no_grad(), context, packed:
            return [{key: v.to(batch.input_ids.device) for key, v in
                     self.logprobs(model, batch, sl, device, want_logits).items()} for sl in slices]
