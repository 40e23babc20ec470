"""Model room: loading, padding, batched generation and per-token log-probs. Owns everything that
runs a transformer.

Knows torch and transformers, not chess: prompts and completions are plain text, and the chess
tokenizers live outside (`rookworld_rlvr.chess_tokenizers`). Imports nothing of tasks, data,
engine or the trainer.
"""

from .generate import Generation, generate, positions_from_mask
from .sampling import filter_logits
from .load import (
    ModelLoadError,
    fuse_activations,
    load_policy,
    resolve_device,
    resolve_dtype,
    save_pretrained_atomic,
    tf32_in_effect,
    tf32_unless_chosen,
    tiny_config,
)
from .logprobs import token_logprobs
from .padding import pad, pad_pairs

__all__ = [
    "Generation",
    "ModelLoadError",
    "filter_logits",
    "fuse_activations",
    "generate",
    "load_policy",
    "pad",
    "pad_pairs",
    "positions_from_mask",
    "resolve_device",
    "resolve_dtype",
    "save_pretrained_atomic",
    "tf32_in_effect",
    "tf32_unless_chosen",
    "tiny_config",
    "token_logprobs",
]
