"""Completions for many prompts: length-sorted batches, a token budget that fits the context.

Owns the batching of plain-text generation for evaluation, games and the UCI engine (the
trainer's rollouts call `generate` directly: their batch is one step's prompts), and the memory
of greedy answers that lets an evaluation complete a prompt its sets share once (`remember`).
Knows torch and transformers, not chess: imports nothing of tasks, data, engine or the trainer.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .generate import generate, max_positions
from .journal import Journal

# (items, work) -> every item's result: `work` maps a list of items to their results, on some
# process (grpo.distributed.spread shares them out among torchrun's ranks)
Spread = Callable[[list, Callable[[list], list]], list]


def sampling(temperature: float, seed: int, top_k: int = 0) -> dict[str, Any]:
    """`generate` keyword arguments: greedy at temperature 0, else seeded sampling."""
    if temperature <= 0:
        return {"greedy": True}
    return {"greedy": False, "temperature": temperature, "top_k": top_k,
            "generator": torch.Generator().manual_seed(seed)}


class Completer:
    """Batched generation with the token budget capped to the model context."""

    def __init__(self, model, tokenizer, max_new_tokens: int, batch_size: int = 64,
                 constraint: Callable[[Sequence[str]], Callable] | None = None, spread: Spread | None = None,
                 remember: bool = False, journal: Journal | None = None) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.constraint = constraint  # prompts -> a `generate` logits_processor (e.g. legal_decoding)
        self.spread = spread  # shares greedy batches out among processes (grpo.distributed.spread)
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.context = max_positions(model)
        self.capped_batches = 0  # batches whose budget the context cut below max_new_tokens
        # remember: greedy answers by prompt (text, finish reason, budget), so that a prompt asked again (an
        # evaluation's judged positions are among its P: samples) is not completed again. Off by default: games and
        # the UCI engine would keep every position they meet.
        self.answers: dict[str, tuple[str, str, int]] | None = {} if remember else None
        self.reused = 0  # prompts answered from memory
        self.journal = journal  # greedy batches done before a stop (model.journal): not completed again

    def room(self, prompt_tokens: int) -> int:
        """max_new_tokens, or what the context leaves after a prompt of this length."""
        if self.context is None:
            return self.max_new_tokens
        room = self.context - prompt_tokens
        if room < 1:
            raise ValueError(f"a prompt of {prompt_tokens} tokens leaves no room in the model's context "
                             f"of {self.context} tokens")
        return min(self.max_new_tokens, room)

    def budget(self, longest_prompt: int) -> int:
        """A batch's budget: the room its longest prompt leaves (counted in capped_batches when cut)."""
        budget = self.room(longest_prompt)
        self.capped_batches += budget < self.max_new_tokens
        return budget

    def run(self, prompts: Sequence[str], *, bar=None, **sampling: Any) -> tuple[list[str], list[str]]:
        """Completions and finish reasons in prompt order; batches of similar length (less padding).
        With `spread`, greedy batches are shared out whole, so every prompt is completed in the same
        batch as in one process, with the same result; sampled runs draw from one generator in batch
        order, so every process runs them all. With `remember`, each distinct greedy prompt is completed
        once: one answered before with the budget it would get alone is taken from memory."""
        sampling = {"greedy": True, **sampling}
        prompts = list(prompts)
        if self.answers is None or not sampling["greedy"]:
            texts, reasons, _ = self._batched(prompts, bar, sampling)
            return texts, reasons
        memory = self.answers
        distinct = list(dict.fromkeys(prompts))
        lengths = dict(zip(distinct, self._lengths(distinct)))
        new = [p for p in distinct if p not in memory or memory[p][2] < self.room(lengths[p])]
        texts, reasons, budgets = self._batched(new, bar, sampling)
        memory.update(zip(new, zip(texts, reasons, budgets)))
        self.reused += len(prompts) - len(new)
        if bar is not None:
            bar.update(len(prompts) - len(new))
        return [memory[p][0] for p in prompts], [memory[p][1] for p in prompts]

    def _lengths(self, prompts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]

    def _batched(self, prompts: list[str], bar, sampling: dict) -> tuple[list[str], list[str], list[int]]:
        """Every prompt completed in length-sorted batches: texts, finish reasons and each one's budget."""
        if not prompts:
            return [], [], []
        lengths = self._lengths(prompts)
        order = sorted(range(len(prompts)), key=lambda i: lengths[i])
        batches = [order[start:start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        budgets = [self.budget(max(lengths[i] for i in idx)) for idx in batches]

        journal = self.journal if sampling["greedy"] else None
        done = {k: journal.get([prompts[i] for i in idx], budgets[k]) for k, idx in enumerate(batches)} \
            if journal is not None else {}
        todo = [k for k in range(len(batches)) if done.get(k) is None]

        def complete(ks: list[int]) -> list[tuple[list[str], list[str]]]:
            out = []
            for k in ks:
                batch = [prompts[i] for i in batches[k]]
                processor = self.constraint(batch) if self.constraint is not None else None
                gen = generate(self.model, self.tokenizer, batch, max_new_tokens=budgets[k],
                               logits_processor=processor, **sampling)
                out.append((gen.texts, gen.finish_reasons))
                if journal is not None:  # on disk at once (rank 0's own batches; the others' below)
                    journal.add(batch, budgets[k], *out[-1])
                if bar is not None:
                    bar.update(len(batch))
            return out

        share = self.spread if self.spread is not None and sampling["greedy"] else _here
        done.update(zip(todo, share(todo, complete)))
        texts: list[str] = [""] * len(prompts)
        reasons: list[str] = [""] * len(prompts)
        given = [0] * len(prompts)
        for k, idx in enumerate(batches):
            if journal is not None:  # the batches other ranks completed (those in it already are kept as they are)
                journal.add([prompts[i] for i in idx], budgets[k], *done[k])
            for i, text, reason in zip(idx, *done[k]):
                texts[i], reasons[i], given[i] = text, reason, budgets[k]
        if bar is not None:
            bar.update(len(prompts) - sum(len(batches[k]) for k in todo))  # those read back
        return texts, reasons, given


def _here(items: list, work: Callable[[list], list]) -> list:
    """No spreading: this process does all the work."""
    return work(items)
