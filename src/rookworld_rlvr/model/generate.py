"""Batched sampling with the model's KV cache, returning what the GRPO trainer needs.

Why not `model.generate`: we need the per-token log-probs of the sampling
distribution, masks that include EOS, one prefill per distinct prompt shared by
its group of completions, and positions computed exactly the way
`logprobs.token_logprobs` computes them (`positions_from_mask`) so that sampler and trainer
agree. Owns sampling. Knows torch and transformers, not chess: imports nothing of tasks, data, engine or the trainer.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass, fields, replace
from typing import Callable, Iterator

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from . import gpt2_decode
from .kv_cache import DynamicCache, make_cache, select_rows
from .padding import pad
from .sampling import fill_uniform, next_tokens
from .token_graph import Buffers, TokenGraph

@dataclass
class Generation:
    """One rollout batch. N = len(prompts) * num_return_sequences; a prompt's rows are adjacent.

    `logprobs` are log-probs of the sampled tokens under the temperature-scaled
    full-vocabulary distribution `log_softmax(logits / temperature)` (temperature 1
    for greedy). They are NOT renormalised after top-k / top-p filtering: that is
    the quantity `token_logprobs(..., temperature=T)` recomputes, so the trainer's
    old/new ratio is consistent. 0 where `completion_mask` is 0.
    """

    prompt_ids: torch.Tensor  # [N, P] left-padded prompt ids
    prompt_mask: torch.Tensor  # [N, P] 1 for real tokens
    completion_ids: torch.Tensor  # [N, C] right-padded with pad id after EOS / end
    completion_mask: torch.Tensor  # [N, C] 1 for generated tokens incl. EOS, 0 after
    logprobs: torch.Tensor  # [N, C] float32, see class docstring
    texts: list[str]  # decoded completions without EOS / pad
    finish_reasons: list[str]  # "eos" or "length"
    # generate(record=True): each layer's projection outputs (gpt2_decode.recording), prefill
    # [L, U, P, W] (U distinct prompts, as left-padded for it) and decode [L, N, C, W], and the
    # LM head's float32 logits at every fed token [N, C, V]
    recorded: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def recorded_row(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row i's recording (views): the projections at its prompt's real tokens [L, p, W] and at the
        completion tokens it fed back [L, c - 1, W] (the last one never runs through the model), and
        the logits at those fed tokens [c - 1, V] (each predicting the next completion token)."""
        if self.recorded is None:
            raise ValueError("this Generation has no recording: call generate(..., record=True)")
        prefill, decode, logits = self.recorded
        group = decode.shape[1] // prefill.shape[1]
        p, c = int(self.prompt_mask[i].sum()), int(self.completion_mask[i].sum())
        fed = max(c - 1, 0)
        return prefill[:, i // group, prefill.shape[2] - p:], decode[:, i, :fed], logits[i, :fed]


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left-padded rows: 0 at the first real token (pads clamp to 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def max_positions(model: PreTrainedModel) -> int | None:
    """The model's context length (n_positions for GPT-2), if the config states one."""
    cfg = model.config
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """HF causal LMs can skip the LM head on positions we do not need."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword a model's forward takes its KV cache by: `cache` from transformers 5.24 on, which
    deprecates `past_key_values` (gone in 5.40), `past_key_values` before it. A peft adapter's forward
    takes **kwargs and hands them to its base model, whose forward decides."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "past_key_values"


def returned_cache(out):
    """The KV cache a forward with `use_cache=True` returned, by the name its transformers gives it."""
    cache = getattr(out, "cache", None)
    return out.past_key_values if cache is None else cache


def attention_backends(device: torch.device) -> contextlib.AbstractContextManager:
    """On CUDA, PyTorch's scaled-dot-product attention without its cuDNN kernel. cuDNN's attention builds
    an execution graph for every new shape, and our passes change shape with every batch (prompt and
    completion lengths): on an H200 its calls took 3.9 ms of host time each (3.1 ms backward), 1.4 s of
    the 4.1 s two GRPO steps of the 124M preset spent on the host (benchmarks/gpu/grpo_profile.txt),
    where flash and memory-efficient attention launch in microseconds. Elsewhere: nothing to choose."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


@contextlib.contextmanager
def device_context(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    """What a forward runs under: autocast to `dtype` (none where None) and `attention_backends`."""
    amp = contextlib.nullcontext() if dtype is None else torch.autocast(device_type=device.type, dtype=dtype)
    with amp, attention_backends(device):
        yield


def _check_prompts(prompts) -> None:
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    if not all(isinstance(p, str) for p in prompts):
        raise ValueError("every prompt must be a string")


def _validate(
    prompts: list[str], max_new_tokens: int, temperature: float, top_k: int, top_p: float, num_return_sequences: int
) -> None:
    _check_prompts(prompts)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r} (use greedy=True for argmax)")
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(num_return_sequences, int) or num_return_sequences < 1:
        raise ValueError(f"num_return_sequences must be an int >= 1, got {num_return_sequences!r}")


def _inference(fn):
    """Run `fn` under torch.inference_mode (less per-op bookkeeping than no_grad: tiny-model
    rollouts 4.5% faster) and return its Generation with ordinary tensors (clones made outside
    inference mode), so that callers may use them in autograd. Under autocast it runs under no_grad:
    in inference mode autocast keeps no cached low-precision copy of a weight and casts every weight
    at every call (a bf16 LM head of GPT-2 124M took twice as long on a CPU)."""

    @functools.wraps(fn)
    def run(*args, **kwargs) -> Generation:
        with torch.no_grad() if kwargs.get("autocast_dtype") is not None else torch.inference_mode():
            g = fn(*args, **kwargs)
        # (a recording is written into tensors made outside inference mode: no 2 GB copies here)
        tensors = {f.name: getattr(g, f.name).clone() for f in fields(g) if isinstance(getattr(g, f.name), torch.Tensor)}
        return replace(g, **tensors)

    return run


@_inference
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    max_new_tokens: int | list[int] = 100,
    temperature: float | list[float] = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    num_return_sequences: int = 1,
    generator: torch.Generator | None = None,
    autocast_dtype: torch.dtype | None = None,
    record: bool = False,
    logits_processor: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    check_every: int | None = None,
    on_finished: Callable[[list[int], list[str]], None] | None = None,
    decode_graph: bool = False,
) -> Generation:
    """Sample `num_return_sequences` completions per prompt (or argmax with greedy=True).

    Prompts are tokenized as-is (no BOS is added). Each distinct prompt is prefilled
    once and its cache shared by its rows. A row stops at EOS; the loop stops when
    every row has stopped or after max_new_tokens. Once a quarter of the prompts have
    all their rows stopped, those prompts leave the decode batch (a step's time grows
    with its rows; a single long row otherwise keeps all of them running), which
    changes no token: every row still draws its random numbers each step. The model
    runs in eval mode and its previous train/eval mode is restored afterwards.

    `max_new_tokens` and `temperature` may be lists, one value per prompt: prompts of
    different tasks then share one decode loop (on CPU a decode step of 64 rows costs
    much less than two of 32) and each row stops at its own limit.

    `record`: keep every layer's projection outputs for each prompt and fed token, and the logits
    at each fed token (`Generation.recorded`), so that the trainer's first pass on these rows skips
    those products and the LM head's (`gpt2_segments`, `token_logprobs`). The logits take
    rows x max_new_tokens x vocabulary x 4 bytes (1.3 GB at 64 x 100 of GPT-2's 50k). A plain
    GPT-2 without autocast only (the cascade path).

    `logits_processor(prompt_index, completion_so_far, logits) -> logits` rewrites each step's
    logits of the decoding rows before a token is picked (e.g. `legal_decoding`); `logprobs` are
    then those of the rewritten distribution, so the trainer's rollouts never use one.

    `check_every`: steps between the checks whether every row has stopped (and whether to drop
    finished groups). Each check reads a device value on the host, which on a GPU waits for every
    queued kernel; default 1 on a CPU, 8 elsewhere. It changes no token, mask or log-prob: rows
    that stopped between checks feed masked pads, and only the generator draws a few steps more.

    `on_finished(rows, texts)`: called at those checks with the rows that stopped since the last one
    and their final texts (as `Generation.texts`), while the other rows decode on; e.g. to start
    scoring them. Rows still decoding at the last step are not reported.

    `decode_graph`: decode with the shape-stable step (`token_graph.TokenGraph`): every row stays
    in the decode batch and, on CUDA, each token (its draw, its bookkeeping and the model's step)
    replays one captured CUDA graph instead of launching every kernel from Python. The same tokens
    and log-probs up to float reordering. A plain GPT-2 only (the cascade path), without `record`
    or a `logits_processor`.

    Sampled rows take their uniforms `check_every` tokens at a time, one per row a token, from
    `generator` (on a CPU the same numbers as one draw a token).
    """
    _check_prompts(prompts)
    if record and not (gpt2_decode.supports(model) and DynamicCache is not None and autocast_dtype is None):
        raise ValueError("record=True needs a plain GPT-2 in eval mode and no autocast (the cascade decoding path)")
    if decode_graph and (record or logits_processor is not None or DynamicCache is None
                         or not gpt2_decode.supports(model, any_mode=True)):
        raise ValueError("decode_graph=True needs a plain GPT-2 (the cascade decoding path), record=False and no "
                         "logits_processor")
    per_prompt = {}
    for name, value in (("max_new_tokens", max_new_tokens), ("temperature", temperature)):
        values = list(value) if isinstance(value, (list, tuple)) else [value] * len(prompts)
        if len(values) != len(prompts):
            raise ValueError(f"{name} has {len(values)} values for {len(prompts)} prompts")
        per_prompt[name] = values
    for limit, temp in set(zip(per_prompt["max_new_tokens"], per_prompt["temperature"])):  # each distinct pair once
        _validate(prompts, limit, temp, top_k, top_p, num_return_sequences)
    max_new_tokens = max(per_prompt["max_new_tokens"])
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise ValueError("tokenizer has no eos_token_id; generation cannot stop")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    device = next(model.parameters()).device

    encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    for i, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"prompt {i} is empty after tokenization")
    u_ids, u_mask = (x.to(device) for x in pad(encoded, pad_id, "left"))  # each prompt is prefilled once for its rows

    prompt_len = u_ids.shape[1]
    limit = max_positions(model)
    if limit is not None and prompt_len + max_new_tokens > limit:
        raise ValueError(
            f"prompt length {prompt_len} + max_new_tokens {max_new_tokens} = {prompt_len + max_new_tokens} "
            f"exceeds the model's n_positions {limit}"
        )

    G = num_return_sequences
    index = torch.arange(len(encoded), device=device).repeat_interleave(G)
    row_limit = torch.tensor(per_prompt["max_new_tokens"], device=device).index_select(0, index)
    temps = per_prompt["temperature"]
    if len(set(temps)) > 1:  # [N, 1] so that logits / temperature scales each row
        temperature = torch.tensor(temps, dtype=torch.float32, device=device).index_select(0, index).unsqueeze(-1)
    else:
        temperature = temps[0]
    prompt_ids, prompt_mask = u_ids[index], u_mask[index]
    n_rows = index.shape[0]
    keep = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    cache_kw = cache_keyword(model)
    sample = dict(temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy)

    completion = torch.full((n_rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    completion_mask = torch.zeros((n_rows, max_new_tokens), dtype=torch.long, device=device)
    logprobs = torch.zeros((n_rows, max_new_tokens), dtype=torch.float32, device=device)
    finished = torch.zeros(n_rows, dtype=torch.bool, device=device)
    hit_eos = torch.zeros(n_rows, dtype=torch.bool, device=device)
    reported = torch.zeros(n_rows, dtype=torch.bool, device=device)  # rows handed to on_finished
    # each row's uniform for each token, drawn check_every tokens at a time (zeros until drawn)
    uniforms = None if greedy else torch.zeros((max_new_tokens, n_rows), dtype=torch.float64, device=device)

    recorded = None
    if record:
        width = sum(gpt2_decode.projection_widths(model))
        layers = model.config.n_layer
        with torch.inference_mode(False):  # ordinary tensors: the trainer's autograd may take them as they are
            recorded = (torch.empty((layers, *u_ids.shape, width), device=device),
                        torch.empty((layers, n_rows, max_new_tokens, width), device=device),
                        torch.empty((n_rows, max_new_tokens, model.lm_head.out_features), device=device))

    def forward(**inputs) -> torch.Tensor:
        """One model call; returns float32 last-position logits."""
        nonlocal cache
        with gpt2_decode.recording(model, recorded[0]) if recorded is not None else contextlib.nullcontext():
            out = model(**inputs, use_cache=True, **keep)
        cache = returned_cache(out)
        return out.logits[:, -1, :].float()

    was_training = model.training
    model.eval()
    cascade = gpt2_decode.supports(model) and DynamicCache is not None
    graphed = None
    cache = DynamicCache(config=model.config) if cascade else make_cache(model, prompt_len + max_new_tokens)
    if check_every is None:  # see the docstring: on a CPU a host read costs nothing
        check_every = 1 if device.type == "cpu" else 8
    elif not isinstance(check_every, int) or check_every < 1:
        raise ValueError(f"check_every must be an int >= 1, got {check_every!r}")
    # Autocast is entered once for the rollout: its cache keeps each weight's bf16 copy from the
    # prefill on (entered per token, it re-cast every weight, the LM head included, at every step).
    amp = contextlib.ExitStack()
    amp.enter_context(device_context(device, autocast_dtype))
    try:
        logits = forward(
            input_ids=u_ids, attention_mask=u_mask, position_ids=positions_from_mask(u_mask), **{cache_kw: cache}
        )
        if cascade:  # the prompt cache stays one copy per prompt; see gpt2_decode
            # the graph's step on weights cast once (autocast's cache cannot serve a graph: see TokenGraph)
            decoder = gpt2_decode.CascadeDecoder(model, cache, u_mask, G, max_new_tokens, pack=autocast_dtype is None,
                                                 record=record, static=decode_graph,
                                                 cast=autocast_dtype if decode_graph else None)
        else:
            cache = select_rows(cache, index)
        # The rows still decoding: all at first; a group whose G rows have all finished is dropped
        # from the decode batch (see _worth_compacting), so late steps run on fewer rows.
        rows = torch.arange(n_rows, device=device)
        logits = logits.index_select(0, index)
        next_position = u_mask.sum(-1).index_select(0, index)
        if decode_graph:  # the rows' buffers, written in place by each token's call
            graphed = TokenGraph(decoder, logits, Buffers(completion, completion_mask, logprobs, hit_eos, finished,
                                                          row_limit, next_position, uniforms), sample, pad_id, eos_id)
        attention_mask = prompt_mask
        for step in range(max_new_tokens):
            if uniforms is not None and step % check_every == 0:  # the uniforms of the next check_every tokens
                fill_uniform(uniforms[step:step + check_every], generator)
            if graphed is not None:  # the token drawn, kept and decoded by one call (on CUDA a graph's replay)
                graphed(decode=step + 1 < max_new_tokens)
            else:
                if logits_processor is not None:
                    logits = logits_processor(index[rows], completion[rows, :step], logits)
                compacted = rows.numel() < n_rows
                if compacted:  # every row draws, so no row's sample depends on which groups left
                    logits = logits.new_zeros((n_rows, logits.shape[-1])).index_copy_(0, rows, logits)
                u = None if uniforms is None else uniforms[step].unsqueeze(-1)
                tokens, token_logp = next_tokens(logits, uniforms=u, **sample)
                if compacted:
                    tokens, token_logp = tokens[rows], token_logp[rows]
                    alive = ~finished[rows]
                    tokens = torch.where(alive, tokens, pad_id)
                    completion[rows, step] = tokens
                    completion_mask[rows, step] = alive.long()
                    logprobs[rows, step] = torch.where(alive, token_logp, 0.0)
                    hit_eos[rows] = hit_eos[rows] | (alive & (tokens == eos_id))
                else:  # every row decodes: columns written in place, half the kernels
                    alive = ~finished
                    tokens = torch.where(alive, tokens, pad_id)
                    completion[:, step] = tokens
                    completion_mask[:, step] = alive
                    logprobs[:, step] = torch.where(alive, token_logp, 0.0)
                    hit_eos |= alive & (tokens == eos_id)
                finished = hit_eos | (step + 1 >= row_limit)
            if step + 1 == max_new_tokens or ((step + 1) % check_every == 0 and bool(finished.all())):
                break
            checked = (step + 1) % check_every == 0
            if checked and on_finished is not None:
                reported = _report_finished(finished & ~reported, reported, on_finished, tokenizer, completion,
                                            completion_mask, hit_eos, step + 1, eos_id)
            if graphed is not None:
                continue
            live = ~finished[rows].view(-1, G).all(1) if checked else None  # per decoding group
            if checked and _worth_compacting(live, cascade, cache):
                local = live.nonzero().squeeze(1)  # positions of the live groups among the decoding ones
                local_rows = (local.unsqueeze(1) * G + torch.arange(G, device=device)).flatten()
                rows, tokens, alive = rows[local_rows], tokens[local_rows], alive[local_rows]
                if cascade:
                    decoder.select_groups(local)
                else:
                    cache.batch_select_indices(local_rows)
                    attention_mask = attention_mask[local_rows]
            # Rows that already finished feed a masked pad token; their outputs are discarded.
            if cascade:
                out, every_row = None, rows.numel() == n_rows  # (groups may have left just above)
                if recorded is not None:  # written in place while every row decodes, else scattered after
                    fed = recorded[1]
                    out = fed[:, :, step] if every_row else fed.new_empty((fed.shape[0], rows.numel(), fed.shape[-1]))
                logits = decoder.step(tokens, next_position[rows] + step, out)
                if recorded is not None:  # the logits at this fed token, before any processor
                    if every_row:
                        recorded[2][:, step] = logits
                    else:
                        fed[:, rows, step] = out
                        recorded[2][rows, step] = logits
                continue
            attention_mask = torch.cat([attention_mask, alive.long().unsqueeze(-1)], dim=-1)
            logits = forward(
                input_ids=tokens.unsqueeze(-1),
                attention_mask=attention_mask,
                position_ids=positions_from_mask(attention_mask)[:, -1:],
                **{cache_kw: cache},
            )
    finally:
        amp.close()
        model.train(was_training)

    steps = int(completion_mask.any(0).nonzero().max()) + 1  # up to the last step any row decoded
    completion = completion[:, :steps]
    completion_mask = completion_mask[:, :steps]
    logprobs = logprobs[:, :steps]
    texts, reasons = _decode(tokenizer, completion, completion_mask, hit_eos, eos_id)
    return Generation(prompt_ids, prompt_mask, completion, completion_mask, logprobs, texts, reasons, recorded)


def _report_finished(new: torch.Tensor, reported: torch.Tensor, on_finished: Callable, tokenizer,
                     completion: torch.Tensor, mask: torch.Tensor, hit_eos: torch.Tensor, steps: int,
                     eos_id: int) -> torch.Tensor:
    """Hand the rows in `new` (finished, not yet reported) with their texts to `on_finished`."""
    if not bool(new.any()):
        return reported
    rows = new.nonzero().squeeze(1)
    texts, _ = _decode(tokenizer, completion[rows, :steps], mask[rows, :steps], hit_eos[rows], eos_id)
    on_finished(rows.tolist(), texts)
    return reported | new


def _worth_compacting(live: torch.Tensor, cascade: bool, cache) -> bool:
    """Drop finished groups once a quarter of the decoding groups are done: each later step then
    costs less (a decode step's time grows with its rows), and the copy of the caches that compaction
    costs is paid rarely. Caches that cannot select rows (legacy tuples) keep every group."""
    done = int((~live).sum())
    return done > 0 and 4 * done >= live.numel() and (cascade or hasattr(cache, "batch_select_indices"))


def _decode(
    tokenizer: PreTrainedTokenizerBase,
    completion: torch.Tensor,
    mask: torch.Tensor,
    finished: torch.Tensor,
    eos_id: int,
) -> tuple[list[str], list[str]]:
    """Text of each row without its EOS, and why the row stopped."""
    texts, reasons = [], []
    for ids, m, done in zip(completion.tolist(), mask.tolist(), finished.tolist()):
        n = sum(m)
        ids = ids[: n - 1] if done else ids[:n]
        texts.append(tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
        reasons.append("eos" if done else "length")
    return texts, reasons
