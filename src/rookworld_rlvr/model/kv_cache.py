"""The sampler's KV cache for models without the cascade path: one preallocated buffer per layer.

Owns the cache layers `generate` uses off the GPT-2 cascade path. Imports torch and transformers, not chess.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

try:  # transformers >= 5 cache layers; older versions use the model's default cache
    from transformers.cache_utils import DynamicCache, DynamicLayer
except ImportError:  # pragma: no cover
    DynamicCache = None
    DynamicLayer = object


class _PreallocatedLayer(DynamicLayer):
    """A DynamicLayer that writes into one buffer sized for the whole rollout.

    The stock layer concatenates on every step, copying the whole cache each time
    (about 40% of CPU generation time for the tiny model). Here `keys`/`values`
    are views of the filled part of a preallocated buffer.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            batch, heads, _, _ = key_states.shape
            self._keys = key_states.new_empty((batch, heads, self.capacity, key_states.shape[-1]))
            self._values = value_states.new_empty((batch, heads, self.capacity, value_states.shape[-1]))
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded ({end} tokens)")
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self._refresh_views()
        return self.keys, self.values

    def _refresh_views(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._keys = self._keys.index_select(0, indices)
            self._values = self._values.index_select(0, indices)
            self._refresh_views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._keys = self._keys.repeat_interleave(repeats, dim=0)
            self._values = self._values.repeat_interleave(repeats, dim=0)
            self._refresh_views()


def make_cache(model: PreTrainedModel, capacity: int):
    """A preallocated cache for plain full-attention models; None lets the model build its default."""
    if DynamicCache is None:
        return None
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # exotic configs: fall back to the model's own cache
        return None
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    cache.layers = [_PreallocatedLayer(capacity) for _ in cache.layers]
    return cache


def select_rows(cache, index: torch.Tensor):
    """Expand a prefill cache [U, ...] to the rollout rows [N, ...] (index maps row -> prompt)."""
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(index)
        return cache
    # Legacy tuple-of-tuples caches (remote-code models).
    return tuple(tuple(t.index_select(0, index) for t in layer) for layer in cache)
