"""Model room: loading, tokenizers, batched generation and per-token log-probs.

Knows torch and transformers, not chess: prompts and completions are plain text.
"""

from .generate import Generation, filter_logits, generate, positions_from_mask
from .load import (
    ModelLoadError,
    fuse_activations,
    load_policy,
    resolve_device,
    resolve_dtype,
    save_pretrained_atomic,
    tiny_config,
)
from .logprobs import build_batch, token_logprobs
from .tokenizer import TOKENIZERS, build_board_tokenizer, build_bpe_tokenizer, build_chess_tokenizer, build_square_tokenizer

__all__ = [
    "Generation",
    "ModelLoadError",
    "build_batch",
    "build_board_tokenizer",
    "build_bpe_tokenizer",
    "build_chess_tokenizer",
    "build_square_tokenizer",
    "TOKENIZERS",
    "filter_logits",
    "fuse_activations",
    "generate",
    "load_policy",
    "positions_from_mask",
    "resolve_device",
    "resolve_dtype",
    "save_pretrained_atomic",
    "tiny_config",
    "token_logprobs",
]
