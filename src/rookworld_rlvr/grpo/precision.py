"""Numeric precision of a run: where bf16 autocast is on, which dtype the policy pass's backward
products use, and whether rollouts record their projections for the first update.

Each is decided once at start from the setting, the device and the model, with a line for the
banner saying what was chosen and why. Owns these decisions. Imports torch and the model
package's GPT-2 checks; nothing of chess.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.grpo import distributed as dist
from rookworld_rlvr.model import bf16_grad, gpt2_segments

RECORD_MIN_WIDTH = 512  # auto: measured no gain at n_embd 256 (tiny), a 40% shorter policy pass at 768 (124M)


def autocast_dtype(setting: str, device: torch.device) -> torch.dtype | None:
    """bf16 only where the hardware does it well (CUDA with bf16, CPUs with AMX)."""
    if setting == "none":
        return None
    if setting == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if device.type == "cpu":
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
        # AMX makes bf16 matmuls ~5x faster. AVX512-BF16 alone: slower than fp32 on one VM, 1.35x
        # faster per step on another, but with sampler/trainer log-prob gaps of ~0.005 nats per token
        return torch.bfloat16 if "amx_bf16" in flags else None
    return None


def plain_gpt2(model) -> bool:
    """A GPT-2 in eval mode whose projections are plain modules: the one-forward scoring path with
    our own linear layers (bf16 backward products, recorded projections) runs on it."""
    return gpt2_segments.supports(model) and bf16_grad.supports(model)


def backward_dtype(setting: str, model, amp: torch.dtype | None, device: torch.device) -> tuple[torch.dtype | None, str]:
    """(dtype of the policy pass's backward products, None = as the forward; a line for the banner).
    bf16 where asked or, with auto, where a bf16 product measures >= 1.5x as fast as float32 (on
    one AVX-512-BF16 VM bf16 was slower, on another 2.3x faster: flags alone do not tell)."""
    if amp is not None:
        if setting == "float32":
            raise ValueError("config field 'backward_dtype': float32 contradicts bf16 autocast (its backward is bf16)")
        return None, "bf16 (autocast)"
    if not plain_gpt2(model):
        if setting == "bf16":
            raise ValueError("config field 'backward_dtype': bf16 needs a plain GPT-2 policy "
                             f"(got {type(model).__name__}); use auto or float32")
        return None, "float32 (bf16 backward products need a plain GPT-2 policy)" if setting == "auto" else "float32"
    if setting != "auto":
        return (torch.bfloat16 if setting == "bf16" else None), setting
    if device.type not in ("cpu", "cuda"):
        return None, f"float32 (auto: no bf16 measurement on {device.type})"
    speed = dist.broadcast_object(bf16_grad.bf16_speedup(device) if dist.is_main() else None)  # every rank decides alike
    chosen = "bf16" if speed >= 1.5 else "float32"
    return (torch.bfloat16 if chosen == "bf16" else None), f"{chosen} (auto: a bf16 product ran at {speed:.2f}x float32's speed)"


def record_rollout(cfg: TrainConfig, model, amp: torch.dtype | None, device: torch.device) -> tuple[bool, str]:
    """(whether rollouts record their projections for the first update, a note for the banner).
    auto: where it was measured to pay, a CPU and a model from 512 wide; on a GPU the recording's
    memory (the whole batch at once, also under minibatch_size) competes with the activations."""
    setting = cfg.record_rollout
    if setting == "never":
        return False, "recomputed (record_rollout: never)"
    if cfg.decode_graph:
        return False, "recomputed (decode_graph: its step records nothing)"
    why = ("autocast" if amp is not None else "LoRA" if cfg.lora_r else None if plain_gpt2(model)
           else "not a plain GPT-2")
    if why:
        if setting == "always":
            raise ValueError(f"config field 'record_rollout': always needs a plain GPT-2 policy without autocast "
                             f"or LoRA ({why}); use auto")
        return False, f"recomputed (record_rollout needs a plain GPT-2 policy without autocast or LoRA: {why})"
    width = model.config.n_embd
    if setting == "auto" and device.type != "cpu":
        return False, f"recomputed (record_rollout auto: measured on CPUs only; use always on {device.type})"
    if setting == "auto" and width < RECORD_MIN_WIDTH:
        return False, f"recomputed (record_rollout auto: n_embd {width} < {RECORD_MIN_WIDTH}, too narrow to gain)"
    return True, f"the rollout's recorded projection outputs in the first update on a batch ({setting})"
