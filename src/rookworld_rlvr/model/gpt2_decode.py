"""Decode steps for GPT-2 with a shared-prompt ("cascade") KV cache.

In a GRPO rollout the G completions of a prompt attend to the same prompt keys and
values. The stock path copies the prompt cache G times and reads every copy at every
step; on CPU that memory traffic was ~45% of generation time. Here the prompt cache is
kept once per prompt ([U, H, P, D]) and each step's attention is computed in two parts
(G queries per prompt against the shared prompt keys, each row against its own
completion keys) joined in one softmax. The model's own modules (layer norms, Conv1D
projections, MLP) do the rest, so the numbers equal the stock forward up to float
reordering (tests compare tokens and log-probs). Used only for plain `GPT2LMHeadModel`
configurations; everything else takes the stock path.

On a CPU in float32 the projections run as oneDNN linears on weights packed once per rollout
(the weights do not change while decoding), with the MLP's tanh GELU fused into its first
projection. A decode step multiplies only 64-odd rows by each weight, where MKL's plain GEMM
reached 130-170 GFLOP/s on our 2-core EPYC and the packed oneDNN kernel 180-220: rollouts
took 11% less time on the tiny model and 24% less on the 124M architecture.
`packed_projections` does the same for no-grad scoring passes (the reference pass of a 124M
update: 18% less time; no change measurable on the tiny model).

`recording` and `CascadeDecoder(record=True)` keep every layer's projection outputs for the
trainer's first pass on the rollout (`gpt2_segments`), which then skips those products.

Owns the decode step of plain GPT-2s. Knows torch and transformers, not chess: imports nothing of
tasks, data, engine or the trainer.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch


def can_pack(model: torch.nn.Module) -> bool:
    """oneDNN weight packing applies: float32 weights on a CPU build with oneDNN and the two
    (internal, as used by inductor's CPU path) ops; the tests assert it does on x86-64."""
    w = model.lm_head.weight
    return (w.device.type == "cpu" and w.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and all(hasattr(torch.ops.mkldnn, op) for op in ("_reorder_linear_weight", "_linear_pointwise")))


class PackedLinear:
    """y = x @ W + b (GPT-2's Conv1D, weight [in, out]) or x @ W.T + b (nn.Linear, weight [out, in])
    with the weight reordered once into oneDNN's blocked layout; `gelu` fuses a tanh GELU. x is
    [rows, in] (the decode step's own calls) or has more leading dims (a module's forward)."""

    def __init__(self, module: torch.nn.Module, rows: int, gelu: bool = False) -> None:
        w = module.weight.detach()
        w = w if isinstance(module, torch.nn.Linear) else w.t()  # oneDNN wants [out, in]
        self.weight = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), rows)
        self.bias = None if module.bias is None else module.bias.detach()
        self.attr, self.algorithm = ("gelu", "tanh") if gelu else ("none", "")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, self.attr, [], self.algorithm)
        return self(x.reshape(-1, x.shape[-1])).unflatten(0, x.shape[:-1])


@contextlib.contextmanager
def packed_projections(model: torch.nn.Module, rows: int = 1024) -> Iterator[None]:
    """Within, a plain GPT-2's projections and LM head run on weights packed on entry, for passes
    without gradients (the reference pass): the weights cannot change inside, and the modules get
    their own forward back on exit. Does nothing where packing does not apply or gradients are on."""
    from transformers import GPT2LMHeadModel
    from transformers.pytorch_utils import Conv1D

    if torch.is_grad_enabled() or type(model) is not GPT2LMHeadModel or not can_pack(model):
        yield
        return
    modules = [m for m in model.modules() if isinstance(m, Conv1D)] + [model.lm_head]
    try:
        for m in modules:  # LoRA layers call their base Conv1D, so they get the packed base weights
            m.forward = PackedLinear(m, rows)  # an instance attribute: nn.Module calls it
        yield
    finally:
        for m in modules:
            vars(m).pop("forward", None)


class CastLinear:
    """A Conv1D's or nn.Linear's forward on its weight and bias cast once to `dtype`: under autocast to
    that dtype the same products as the module's own (autocast would make the same copies), without
    casting the weights again at every call. For a CUDA graph's decode step, which autocast's weight
    cache cannot serve (a copy cached during capture would be freed under the graph)."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype) -> None:
        self.linear = isinstance(module, torch.nn.Linear)
        self.weight = module.weight.detach().to(dtype)
        self.bias = None if module.bias is None else module.bias.detach().to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.linear:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        y = torch.addmm(self.bias, x.view(-1, x.shape[-1]), self.weight)  # as transformers' Conv1D.forward
        return y.view(*x.shape[:-1], self.weight.shape[1])


def _cast(module: torch.nn.Module, dtype: torch.dtype):
    """`CastLinear` of a plain Conv1D or nn.Linear; any other module (an adapter's layer, whose own
    forward adds more than its weight) as it is."""
    from transformers.pytorch_utils import Conv1D

    return CastLinear(module, dtype) if type(module) in (Conv1D, torch.nn.Linear) else module


def _projections(block, rows: int, pack: bool, fuse: bool = True, cast: torch.dtype | None = None) -> tuple:
    """A block's (qkv, attention output, MLP up, activation, MLP down) as callables on [N, E] rows.
    Packed, the tanh GELU runs fused into the up projection (the activation is then the identity)
    unless `fuse` is False: recording needs the product before the activation. `cast`: on weights
    cast once to that dtype (`CastLinear`)."""
    attn, mlp = block.attn, block.mlp
    if cast is not None:
        qkv, out, up, down = (_cast(m, cast) for m in (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj))
        return qkv, out, up, mlp.act, down
    if not pack:
        return attn.c_attn, attn.c_proj, mlp.c_fc, mlp.act, mlp.c_proj
    from transformers.activations import GELUTanh

    fused = fuse and type(mlp.act) is GELUTanh  # what load_policy puts in; anything else runs as its own op
    return (PackedLinear(attn.c_attn, rows), PackedLinear(attn.c_proj, rows), PackedLinear(mlp.c_fc, rows, gelu=fused),
            (lambda x: x) if fused else mlp.act, PackedLinear(mlp.c_proj, rows))


def _recorded_modules(block) -> tuple:
    """A GPT-2 layer's four projections (qkv, attention output, MLP up, MLP down), in the order a
    recording lays their outputs side by side."""
    return block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj


def projection_widths(model: torch.nn.Module) -> list[int]:
    """Output widths of a layer's recorded projections (see `recording`)."""
    return [m.nf if hasattr(m, "nf") else m.out_features for m in _recorded_modules(model.transformer.h[0])]


def _cuts(model: torch.nn.Module) -> list[int]:
    """Column offsets of each projection in a recording: 0, then the running sum of the widths."""
    return [0, *itertools.accumulate(projection_widths(model))]


@contextlib.contextmanager
def recording(model: torch.nn.Module, out: torch.Tensor) -> Iterator[None]:
    """Within, each forward of a plain GPT-2 writes every layer's projection outputs into `out`
    [layers, rows, tokens, sum(projection_widths)] (the sampler's prefill: see `gpt2_segments`)."""
    cuts = _cuts(model)
    handles = []
    for i, block in enumerate(model.transformer.h):
        for j, m in enumerate(_recorded_modules(block)):
            def hook(module, args, y, i=i, lo=cuts[j], hi=cuts[j + 1]):
                out[i, ..., lo:hi].copy_(y)
            handles.append(m.register_forward_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def supports(model: torch.nn.Module, any_mode: bool = False) -> bool:
    """Plain self-attention GPT-2 whose forward we reproduce exactly (in eval mode, unless `any_mode`:
    whether it will be once put in eval mode)."""
    from transformers import GPT2LMHeadModel

    cfg = getattr(model, "config", None)
    return (type(model) is GPT2LMHeadModel and not cfg.add_cross_attention and not cfg.reorder_and_upcast_attn
            and (any_mode or not model.training))


class CascadeDecoder:
    """Holds the shared prompt cache and a per-row completion cache; `step` runs one token per row."""

    def __init__(self, model, prompt_cache, prompt_mask: torch.Tensor, group: int, capacity: int,
                 pack: bool = False, record: bool = False, static: bool = False,
                 cast: torch.dtype | None = None) -> None:
        """`pack`: run the projections on oneDNN-packed weights (only where `can_pack(model)`).
        `record`: `step` can write the projections' outputs (the GELU then runs unfused).
        `static`: the caches start zeroed, for `step(..., t=)` (see there).
        `cast`: the projections and LM head run on their weights cast once to this dtype (the
        autocast dtype, for a CUDA graph's step: `CastLinear`); not with `pack`."""
        if cast is not None and pack:
            raise ValueError("CascadeDecoder: cast and pack exclude each other (packing keeps float32 weights)")
        self.model = model
        self.blocks = model.transformer.h
        self.group = group
        self.packed = pack and can_pack(model)
        rows = prompt_mask.shape[0] * group
        self.proj = [_projections(block, rows, self.packed, fuse=not record, cast=cast) for block in self.blocks]
        self.cuts = _cuts(model)
        self.head = (PackedLinear(model.lm_head, rows) if self.packed
                     else _cast(model.lm_head, cast) if cast is not None else model.lm_head)
        layers = prompt_cache.layers
        # prompt keys/values once per prompt: [U, H, P, D]
        self.pk = [layer.keys for layer in layers]
        self.pv = [layer.values for layer in layers]
        u, h, _, d = self.pk[0].shape
        # -inf on prompt padding, as the stock attention mask does; shaped for [U, H, G, P] scores
        self.prompt_bias = torch.zeros(prompt_mask.shape, dtype=self.pk[0].dtype, device=prompt_mask.device)
        self.prompt_bias.masked_fill_(prompt_mask == 0, float("-inf"))
        self.prompt_bias = self.prompt_bias[:, None, None, :]
        # each row's own keys/values, laid out by prompt like the queries: [U, H, G, capacity, D]
        alloc = self.pk[0].new_zeros if static else self.pk[0].new_empty  # (masked garbage could be NaN)
        self.ck = [alloc((u, h, group, capacity, d)) for _ in layers]
        self.cv = [alloc((u, h, group, capacity, d)) for _ in layers]
        self.length = 0
        self.slots = torch.arange(capacity, device=prompt_mask.device)

    def select_groups(self, keep: torch.Tensor) -> None:
        """Go on with only the groups `keep` (indices among the current ones) and their rows."""
        self.pk = [k.index_select(0, keep) for k in self.pk]
        self.pv = [v.index_select(0, keep) for v in self.pv]
        self.prompt_bias = self.prompt_bias.index_select(0, keep)
        t = self.length
        for cache in (self.ck, self.cv):
            for i, old in enumerate(cache):
                cache[i] = old.new_empty((keep.numel(), *old.shape[1:]))
                cache[i][:, :, :, :t] = old[:, :, :, :t].index_select(0, keep)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, record: torch.Tensor | None = None,
             t: torch.Tensor | None = None) -> torch.Tensor:
        """tokens, positions [N] -> float32 logits [N, V] for the next token. `record` [layers, N,
        sum(projection_widths)]: receives every layer's projection outputs (needs `record=True`).

        `t` (a 0-dim long tensor on the device, the step's index; needs `static=True`): the
        shape-stable form, which a CUDA graph can capture (`token_graph`): keys and values are written
        at t by index, every row attends over the whole completion cache with the slots after t
        masked, and no Python value changes between steps. The same numbers, up to float reordering."""
        tr = self.model.transformer
        x = tr.wte(tokens) + tr.wpe(positions)  # [N, E]
        n, e = x.shape
        if t is None:
            t = self.length
            self.length = t + 1
        u, g = n // self.group, self.group

        def keep(i: int, j: int, y: torch.Tensor) -> torch.Tensor:  # layer i's projection j: recorded, passed on
            if record is not None:
                record[i, :, self.cuts[j]:self.cuts[j + 1]].copy_(y)
            return y

        for i, block in enumerate(self.blocks):
            attn = block.attn
            h = attn.num_heads
            qkv, out, up, act, down = self.proj[i]
            q, k, v = keep(i, 0, qkv(block.ln_1(x))).split(attn.split_size, dim=-1)
            # [N, E] = [U, G, H, D] -> [U, H, G, D]: a prompt's G queries side by side
            q, k, v = (z.view(u, g, h, attn.head_dim).transpose(1, 2) for z in (q, k, v))
            if isinstance(t, int):
                self.ck[i][:, :, :, t] = k
                self.cv[i][:, :, :, t] = v
            else:  # by index: the same kernels at every step
                self.ck[i].index_copy_(3, t.view(1), k.unsqueeze(3))
                self.cv[i].index_copy_(3, t.view(1), v.unsqueeze(3))
            a = self._attend(q, i, t, attn.scaling)  # [U, H, G, D]
            x = x + keep(i, 1, out(a.transpose(1, 2).reshape(n, e)))
            x = x + keep(i, 3, down(act(keep(i, 2, up(block.ln_2(x))))))
        return self.head(tr.ln_f(x)).float()

    def _attend(self, q: torch.Tensor, i: int, t: int | torch.Tensor, scaling: float) -> torch.Tensor:
        """Softmax over [shared prompt keys | own completion keys up to step t]; q [U, H, G, D] ->
        [U, H, G, D]. A tensor t attends over the whole (zeroed) cache with the later slots masked."""
        sp = (q @ self.pk[i].transpose(-1, -2)) * scaling + self.prompt_bias  # [U, H, G, P]
        if isinstance(t, int):
            kc, vc = self.ck[i][:, :, :, :t + 1], self.cv[i][:, :, :, :t + 1]  # [U, H, G, T, D]
            sc = (q.unsqueeze(3) @ kc.transpose(-1, -2)).squeeze(3) * scaling  # [U, H, G, T]
        else:
            kc, vc = self.ck[i], self.cv[i]  # [U, H, G, capacity, D]
            sc = ((q.unsqueeze(3) @ kc.transpose(-1, -2)).squeeze(3) * scaling).masked_fill(self.slots > t,
                                                                                             float("-inf"))
        probs = torch.cat([sp, sc], -1).float().softmax(-1).to(q.dtype)
        p = sp.shape[-1]
        out_p = probs[..., :p] @ self.pv[i]  # [U, H, G, D]
        out_c = (probs[..., p:].unsqueeze(3) @ vc).squeeze(3)  # [U, H, G, D]
        return out_p + out_c
