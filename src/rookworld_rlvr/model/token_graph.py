"""A decoded token as one shape-stable call, for `generate(decode_graph=True)`: pick every row's token from
the logits with a uniform drawn beforehand, write it into the rollout's buffers, and decode it with
`CascadeDecoder.step(t=)`. On CUDA the call is captured once as a CUDA graph and replayed at every token:
one launch from Python a token. With the model's step alone in the graph, the token's sampling and
bookkeeping around each replay were 24.6 launches more (`benchmarks/decode_launches.py`), and on an H200 the
host's launches, not the GPU, set the 124M preset's step time. Elsewhere the same code runs eagerly, which the
CPU tests hold to the default decoding's tokens.

Owns the token's in-place bookkeeping and the graph's capture. Imports torch and the package's sampling and
decode step; nothing of chess or the trainer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .gpt2_decode import CascadeDecoder
from .sampling import next_tokens


@dataclass
class Buffers:
    """The rollout's tensors that every token writes in place (N rows, T tokens at most)."""

    completion: torch.Tensor  # [N, T] long: the tokens, a pad where a row had stopped
    mask: torch.Tensor  # [N, T] long: 1 where the row was still decoding
    logprobs: torch.Tensor  # [N, T] float32: the sampled token's log-prob, 0 where masked
    hit_eos: torch.Tensor  # [N] bool: the row has drawn its EOS
    finished: torch.Tensor  # [N] bool: EOS drawn or the row's own limit reached
    row_limit: torch.Tensor  # [N] long: each row's max_new_tokens
    positions: torch.Tensor  # [N] long: the position of each row's first new token
    uniforms: torch.Tensor | None  # [T, N] float64: token t's uniform per row (None when greedy)


class TokenGraph:
    """Token t of every row (t counts on the device): drawn from `logits`, kept in `buffers`, and decoded
    into `logits` for token t + 1; on CUDA by one CUDA graph's replay. Under autocast the capture runs
    without autocast's weight cache (a cached cast made during capture would be freed under the graph):
    give the decoder `cast=` so that its weights are cast once, not at every replay."""

    def __init__(self, decoder: CascadeDecoder, logits: torch.Tensor, buffers: Buffers, sample: dict,
                 pad_id: int, eos_id: int) -> None:
        """`logits` [N, V] float32: the prefill's, for token 0 (written in place from then on). `sample`:
        `next_tokens`' temperature, top_k, top_p and greedy."""
        self.decoder, self.logits, self.buffers, self.sample = decoder, logits, buffers, sample
        self.pad_id, self.eos_id = pad_id, eos_id
        self.t = torch.zeros((), dtype=torch.long, device=logits.device)
        self.cuda = logits.device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self, decode: bool = True) -> None:
        """Draw and keep the next token, then decode it unless `decode` is False (the last token: nothing
        will read its logits). The token's uniforms must be drawn into `buffers.uniforms` before."""
        if not (decode and self.cuda):
            self._token(decode)
            return
        if self.graph is None:
            self._capture()
        self.graph.replay()

    def _token(self, decode: bool) -> None:
        """The token's work, the same kernels on the same buffers at every call (what the graph captures):
        nothing here reads the device on the host or allocates outside the graph's own pool."""
        b, t = self.buffers, self.t
        column = t.view(1)
        u = None if b.uniforms is None else b.uniforms.index_select(0, column).view(-1, 1)
        tokens, logp = next_tokens(self.logits, uniforms=u, **self.sample)
        alive = ~b.finished
        tokens = torch.where(alive, tokens, self.pad_id)  # a row that stopped feeds a masked pad
        b.completion.index_copy_(1, column, tokens.unsqueeze(1))
        b.mask.index_copy_(1, column, alive.long().unsqueeze(1))
        b.logprobs.index_copy_(1, column, torch.where(alive, logp, 0.0).unsqueeze(1))
        b.hit_eos.logical_or_(alive & (tokens == self.eos_id))
        torch.logical_or(b.hit_eos, t + 1 >= b.row_limit, out=b.finished)
        if decode:
            self.logits.copy_(self.decoder.step(tokens, b.positions + t, t=t))
        t.add_(1)

    def _capture(self) -> None:
        """Two eager runs on a side stream first (`warm_up`), then the capture, which runs nothing."""
        amp = torch.is_autocast_enabled("cuda")
        dtype = torch.get_autocast_dtype("cuda") if amp else None

        def run() -> None:
            with torch.autocast("cuda", dtype=dtype, cache_enabled=False) if amp else contextlib.nullcontext():
                self._token(decode=True)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.warm_up(run)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            run()

    def warm_up(self, run: Callable[[], None]) -> None:
        """Run the token twice (libraries set up, the allocator warmed before a capture) and put back what
        the runs wrote: the count, the logits and the buffers. The cache slots they wrote are written again
        before any step reads them."""
        b = self.buffers
        state = [self.t, self.logits, b.completion, b.mask, b.logprobs, b.hit_eos, b.finished]
        saved = [x.clone() for x in state]
        for _ in range(2):
            run()
        for x, before in zip(state, saved):
            x.copy_(before)
