"""The anchor: a supervised loss on ground-truth training answers next to the GRPO loss
(InstructGPT's PPO-ptx), holding tasks the rewards would erode (by default the A: task).

Its samples come in their own order (a prompt sampler seeded apart), so GRPO sees the same prompts
with or without it; `anchor_positions` out_of_check keeps its P: answers out of check, so that a
skill GRPO teaches in check is not also taught by supervision. Owns the anchor's batch and loss.
Imports torch, the model package and the prompt sampler (which tells a position in check); the
samples render their own text.
"""

from __future__ import annotations

import torch

from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.grpo import distributed as dist
from rookworld_rlvr.grpo.prompts import PromptSampler, out_of_check
from rookworld_rlvr.model import token_logprobs
from rookworld_rlvr.model.generate import device_context, max_positions, positions_from_mask
from rookworld_rlvr.model.padding import pad_pairs

AnchorBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]  # ids, attention mask, positions, answer width


class Anchor:
    def __init__(self, cfg: TrainConfig, by_task: dict[str, list], tokenizer, device: torch.device,
                 out_of_check_rows: list | None = None) -> None:
        """`out_of_check_rows`: `out_of_check(by_task["P"])` where the caller has it (the prompt sampler's
        split of the same rows), so that a million positions are not told apart twice."""
        self.cfg, self.tokenizer, self.device = cfg, tokenizer, device
        pools = {t: by_task[t] for t in cfg.anchor_tasks}
        if "P" in pools and cfg.anchor_positions == "out_of_check":
            pools["P"] = out_of_check(pools["P"]) if out_of_check_rows is None else out_of_check_rows
        for t in cfg.anchor_tasks:  # here, not at the first step after the base evaluation
            if not pools[t]:
                where = " out of check (anchor_positions)" if t == "P" and by_task[t] else ""
                raise ValueError(f"config field 'anchor_tasks' ({cfg.anchor_tasks}) needs {t}: samples{where}, and "
                                 f"the anchor's data {cfg.anchor_data or cfg.data} has none (add them, or set "
                                 "anchor_coef 0)")
        self.sampler = PromptSampler(pools, cfg.seed + 1)

    def pairs(self) -> list[tuple[str, str]]:
        """This step's (prompt, answer) texts, this rank's share, in the anchor's own order."""
        return [s.render(self.cfg.layout, self.cfg.anchor_order) for t in self.cfg.anchor_tasks
                for s in dist.shard(self.sampler.take(t, self.cfg.anchor_per_task))]

    def batch(self, model) -> AnchorBatch:
        """This step's ground-truth answers (this rank's share). Each answer ends with EOS, as the
        model must stop there; a sample longer than `model`'s context is an error."""
        pairs = self.pairs()
        encode = lambda texts: self.tokenizer(texts, add_special_tokens=False)["input_ids"]  # noqa: E731
        answers = [ids + [self.tokenizer.eos_token_id] for ids in encode([c for _, c in pairs])]
        ids, mask, P = pad_pairs(encode([p for p, _ in pairs]), answers, self.tokenizer.pad_token_id)
        limit = max_positions(model)
        if limit is not None and int(mask.sum(1).max()) > limit:
            raise ValueError(f"an anchor sample (prompt + answer) has {int(mask.sum(1).max())} tokens, more than the "
                             f"model's context of {limit}: use shorter data or set anchor_coef 0")
        d = self.device
        return ids.to(d), mask.to(d), positions_from_mask(mask).to(d), ids.shape[1] - P

    def backward(self, model, batch: AnchorBatch, amp: torch.dtype | None, grad_dtype: torch.dtype | None,
                 agg: dict[str, float]) -> bool:
        """Backward of anchor_coef x the answers' per-token NLL (token mean over every rank's answers:
        summed gradients equal one process's); logs this rank's NLL as anchor_nll. False (and no
        backward) when the loss is not finite."""
        ids, mask, pos, width = batch
        with device_context(self.device, amp):
            logp = token_logprobs(model, ids, mask, pos, width, grad_dtype=grad_dtype)["logprobs"]
        answer = mask[:, -width:].float()
        tokens = dist.all_gather_tensor(answer.sum().reshape(1)).sum()
        nll = -(logp * answer).sum()
        loss = self.cfg.anchor_coef * nll / tokens
        agg["anchor_nll"] = float(nll.detach() / answer.sum())
        if not torch.isfinite(loss):
            return False
        loss.backward()
        return True
