"""`rookworld sft`'s held-out evaluation: losses per task, and greedy task metrics on a subset.

Owns what an SFT run measures every eval_every steps. Under torchrun every rank calls `held_out`
with `spread` (grpo.distributed.spread): the greedy generation and its scoring are shared out, with
one process's result. Imports torch inside functions only.
"""

from __future__ import annotations

from typing import Callable

from rookworld_rlvr.sft_rows import legality_loss, make_batch

_SCORER = None


def held_out(model, tokenizer, eval_rows: dict, eval_samples: list, layout: str, limit: int, device,
             spread: Callable | None = None) -> dict:
    """Eval loss per task (on up to 128 rows each), and the greedy task metrics of `evaluate` on
    `limit` samples per task (0: none), with what chance scores on the same rows (`policy/random/*`: a random
    legal mover; `environment/constant/*`: each field's commonest answer)."""
    import torch

    from rookworld_rlvr.model.generate import attention_backends

    model.eval()
    out: dict = {}
    with torch.no_grad(), attention_backends(torch.device(device)):
        for t, rows in eval_rows.items():
            if rows:
                ids, mask, labels = (x.to(device) for x in make_batch(rows[:128], tokenizer.pad_token_id, "completion"))
                res = model(input_ids=ids, attention_mask=mask, labels=labels)
                loss = res.loss.item()
                out[f"eval_loss_{t}"] = loss
                n_sets = sum(len(r.legal) for r in rows[:128])
                if n_sets:  # nats per move token off the legal moves (legality_loss), whatever legal_coef is
                    out[f"eval_legality_{t}"] = float(legality_loss(res.logits, rows[:128])) / n_sets
                # per character (EOS counts as one), comparable across tokenizers
                n_tokens = int((labels[:, 1:] != -100).sum())
                n_chars = sum(len(tokenizer.decode(x[n:], skip_special_tokens=True)) + 1 for x, n, *_ in rows[:128])
                out[f"eval_nats_per_char_{t}"] = loss * n_tokens / n_chars
    if limit and eval_samples:
        from rookworld_rlvr.evaluate import EvalConfig, evaluate

        model.config.use_cache = True
        res = evaluate(model, tokenizer, eval_samples, config=EvalConfig(layout=layout, limit=limit),
                       scorer=_scorer(), spread=spread)
        model.config.use_cache = False
        for task in ("policy", "environment"):
            for k, v in res.get(task, {}).items():
                if isinstance(v, (int, float)) and k != "n":
                    out[f"{task}/{k}"] = v
                elif k in ("random", "constant") and isinstance(v, dict):  # chance on the same rows, beside them
                    out.update({f"{task}/{k}/{m}": x for m, x in v.items() if isinstance(x, (int, float))})
    return out


def _scorer():
    """One Stockfish for the process's evaluations (depth 8), started at the first."""
    global _SCORER
    if _SCORER is None:
        from rookworld_rlvr.engine import EngineConfig, StockfishPool
        from rookworld_rlvr.tasks.rewards import RewardScorer

        _SCORER = RewardScorer(engine=StockfishPool(EngineConfig(depth=8, workers=1)))
    return _SCORER
