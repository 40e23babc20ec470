"""Loading and saving policies: Hub ids or local directories, strict about weights.

A silently half-initialised model (a key renamed between versions, a truncated
file) trains for hours before anyone notices, so loading fails loudly instead.

Owns loading and saving models. Knows torch and transformers, not chess: imports nothing of
tasks, data, engine or the trainer.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

import rookworld_rlvr.hub as hub
import rookworld_rlvr.paths as paths

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

# Buffers that some GPT-2 checkpoints carry (or lack) and that the model rebuilds itself.
_BENIGN_KEY_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".crossattention.bias", ".crossattention.masked_bias")
# Pickled weights that transformers or PEFT would read where the safetensors file beside them is missing.
_PICKLED = {"pytorch_model.bin": "model.safetensors", "pytorch_model.bin.index.json": "model.safetensors.index.json",
            "adapter_model.bin": "adapter_model.safetensors"}
_FLOATS = ("F", "BF")  # safetensors' names of floating-point dtypes begin so: F16, BF16, F32, F8_E4M3 ...

PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 6, "n_embd": 256, "n_head": 8},  # 4.9M with the board vocab: the shipped bases
    # the next sizes, measured against tiny per CPU minute in models/README.md
    "small": {"n_layer": 8, "n_embd": 384, "n_head": 6},  # 14M
    "wide": {"n_layer": 6, "n_embd": 512, "n_head": 8},  # 19M
    "gpt2-124m": {"n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024},
}


class ModelLoadError(RuntimeError):
    """The checkpoint does not match the model class (missing, unexpected or mis-shaped weights)."""


def resolve_device(device: str = "auto") -> torch.device:
    """"auto" picks cuda, then mps, then cpu; an explicit device must exist. On CUDA, float32 matrix
    products use TF32 tensor cores unless the caller chose their precision (`tf32_unless_chosen`)."""
    dev = _resolve(device)
    if dev.type == "cuda":
        tf32_unless_chosen()
    return dev


def tf32_unless_chosen() -> bool:
    """Let float32 matrix products run on TF32 tensor cores (torch's "high" precision: float32 is asked
    for speed, not for the last bits), unless the process chose already: `allow_tf32 = False` or
    `torch.set_float32_matmul_precision("highest")` (IEEE float32, as equivalence tests need) is kept.
    torch >= 2.9 tells a choice from its default ("none"); older torch cannot, and gets TF32.
    Returns whether TF32 was turned on here."""
    if _chosen_cuda_precision() != "none":
        return False
    torch.backends.cuda.matmul.allow_tf32 = True  # the old setter: old and new getters (inductor reads both) agree
    return True


def tf32_in_effect(device: torch.device) -> bool:
    """Whether float32 matrix products on `device` round their inputs to TF32 (11 significant bits):
    on CUDA, where the process's precision (its own, or the process-wide one it inherits) is "tf32"."""
    if device.type != "cuda":
        return False
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # torch < 2.9: only the old flag
        return bool(torch.backends.cuda.matmul.allow_tf32)
    return _chosen_cuda_precision() == "tf32"


def _chosen_cuda_precision() -> str:
    """CUDA float32 matmul precision as the process chose it: its own, else the process-wide one it inherits;
    "none" where nobody chose (and always on torch < 2.9, which has no such setting)."""
    own = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
    return own if own != "none" else getattr(torch.backends, "fp32_precision", "none")


def _resolve(device: str) -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"device {device!r} requested but MPS is not available")
    elif dev.type != "cpu":
        raise ValueError(f"unsupported device {device!r}; use auto, cpu, cuda, cuda:N or mps")
    return dev


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map "float32" / "bfloat16" / "float16" (or fp32/bf16/fp16) to a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of float32, bfloat16, float16") from None


def tiny_config(vocab_size: int, preset: str = "tiny", n_positions: int = 256, *, eos_token_id: int = 0) -> GPT2Config:
    """GPT-2 config for a fresh model: `tiny` (~5M params with the char vocab) or `gpt2-124m`.

    bos/eos/pad ids are set to `eos_token_id` (0 for our tokenizers) so that HF's
    `model.generate` stops where our `generate` does. `gpt2-124m` fixes n_positions at 1024.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    params = {"n_positions": n_positions, **PRESETS[preset]}
    return GPT2Config(
        vocab_size=vocab_size,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        **params,
    )


def _is_benign(key: str, model: PreTrainedModel) -> bool:
    if key.endswith(_BENIGN_KEY_SUFFIXES):
        return True
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    if tied and key.endswith("lm_head.weight"):
        out, inp = model.get_output_embeddings(), model.get_input_embeddings()
        return out is not None and inp is not None and out.weight is inp.weight
    return False


def _check_loading_info(info: dict, model: PreTrainedModel, source: str) -> None:
    """Raise ModelLoadError listing every real key problem."""
    problems = []
    for kind in ("missing_keys", "unexpected_keys"):
        keys = sorted(k for k in info.get(kind, ()) if not _is_benign(k, model))
        if keys:
            problems.append(f"{kind}: {', '.join(keys)}")
    mismatched = [str(m) for m in info.get("mismatched_keys", ())]
    if mismatched:
        problems.append(f"mismatched_keys: {', '.join(sorted(mismatched))}")
    errors = [str(e) for e in info.get("error_msgs", ()) if e]
    if errors:
        problems.append(f"errors: {'; '.join(errors)}")
    if problems:
        raise ModelLoadError(f"checkpoint {source} does not match {type(model).__name__}: " + " | ".join(problems))


def fuse_activations(model: torch.nn.Module) -> int:
    """Swap GPT-2's `gelu_new` modules (six Python-level element-wise ops) for PyTorch's fused
    tanh GELU: the same formula (max difference ~2e-7), 2.8x faster forward+backward on CPU,
    about a tenth of a GRPO step on the tiny model. The config is untouched, so saved models
    are unchanged. Returns the number of modules swapped."""
    from transformers.activations import GELUTanh, NewGELUActivation

    swapped = 0
    for module in model.modules():
        for name, child in list(module.named_children()):
            if type(child) is NewGELUActivation:
                setattr(module, name, GELUTanh())
                swapped += 1
    return swapped


def name_causal_lm_loss(model) -> None:
    """GPT-2's class names no loss type: transformers warns at the first `model(..., labels=...)` and then takes
    the causal-LM loss. Named here, the same loss without the warning."""
    if getattr(model, "loss_type", "") is None:
        model.loss_type = "ForCausalLM"


def _models_in(directory: Path) -> str:
    """The model directories (with a config.json) one level below `directory`, then two, for a
    message: at most four named, then how many more."""
    found = [str(c.parent) for depth in ("*/config.json", "*/*/config.json")
             for c in sorted(directory.glob(depth)) if not any(p.startswith(".") for p in c.parent.parts[-2:])]
    return ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")


def local_model_problem(name_or_path: str) -> str | None:
    """Why `name_or_path` is neither a model directory nor a Hub id, or None. Hub ids are "name" or
    "owner/name"; a name whose first part is a directory here is a path (a typo'd local path must
    not wait on the Hub, offline for a minute of retries, to say so)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():  # a model, or a PEFT adapter
            return None
        inside = _models_in(path)
        return f"{name_or_path} is a directory without a model (no config.json)" + (
            f"; models in it: {inside}" if inside else "")
    if path.exists():
        return f"{name_or_path} is a file, not a model directory"
    parts = name_or_path.split("/")
    if name_or_path.startswith((".", "/", "~")) or len(parts) > 2:
        why = "not a Hub id like owner/name either"
    elif len(parts) == 2 and Path(parts[0]).is_dir():
        why = f"read as a path, not a Hub id: {parts[0]}/ is a directory here"
    else:
        return None
    listed = path.parent.is_dir() and str(path.parent) != "." and path.parent != path.parent.parent  # not "/"
    inside = _models_in(path.parent) if listed else ""
    return f"no such model directory: {name_or_path} ({why})" + (f"; models in {path.parent}: {inside}" if inside else "")


def _adapter_base_on_hub(path: Path) -> str | None:
    """The Hub id of the base model a PEFT adapter directory loads with, or None (a full model, a local base)."""
    file = path / "adapter_config.json"
    if (path / "config.json").is_file() or not file.is_file():
        return None
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as e:  # transformers' own words name neither the file nor the line
        raise ModelLoadError(f"{file}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from e
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    return base if isinstance(base, str) and base and not Path(base).expanduser().is_dir() else None


def load_policy(
    name_or_path: str,
    *,
    device: str = "auto",
    dtype: str = "float32",
    trust_remote_code: bool = False,
    verbose: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a Hub id or a local directory.

    The model comes back in eval mode (dropout off) with requires_grad untouched;
    the tokenizer pads on the left with eos as pad. Raises ModelLoadError when any
    weight is missing, unexpected or mis-shaped. A Hub id whose Hub is out of reach
    (`rookworld_rlvr.hub`) is read from the local cache alone, with a warning.
    """
    if problem := local_model_problem(name_or_path):
        raise ModelLoadError(problem)
    path = Path(name_or_path).expanduser()
    is_local = path.is_dir()
    if is_local and (problem := _weight_files_problem(path)):
        raise ModelLoadError(f"model {name_or_path}: {problem}")
    source = str(path.resolve()) if is_local else name_or_path
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)

    hub_id = _adapter_base_on_hub(path) if is_local else name_or_path  # what the load asks the Hub for
    unreachable = hub.out_of_reach() if hub_id else None  # then the cache alone, not a minute of retries a file
    reading = "config.json"  # which of its files transformers reads when it fails
    try:
        with _no_bars():
            model, info = AutoModelForCausalLM.from_pretrained(
                source,
                dtype=torch_dtype,
                trust_remote_code=trust_remote_code,
                output_loading_info=True,
                # Let mis-shaped weights through to the loading info so they raise ModelLoadError below.
                ignore_mismatched_sizes=True,
                local_files_only=bool(unreachable),
                # transformers' look for a PEFT adapter does not take local_files_only from the call
                **({"adapter_kwargs": {"local_files_only": True}} if unreachable else {}),
            )
        reading = "tokenizer files (tokenizer.json, tokenizer_config.json)"
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code,
                                                  local_files_only=bool(unreachable))
    except SafetensorError as e:  # its words alone do not say which file, nor that it is damaged
        raise ModelLoadError(f"model {name_or_path}: its safetensors weights could not be read, a file cut short or "
                             f"damaged ({', '.join(p.name for p in path.glob('*.safetensors')) or 'downloaded'}): "
                             f"{e}") from e
    except OSError as e:  # transformers' word for no network, no such repo, a gated one, an unreadable file
        # a Hub id is also a relative path: say where it was looked for (a command run outside the checkout)
        not_here = "" if is_local else f", nor is it a directory{paths.here(name_or_path)}"
        if unreachable:
            held = "it" if hub_id == name_or_path else hub_id
            raise ModelLoadError(f"model {name_or_path} could not be loaded: {unreachable}, and the local cache "
                                 f"({hub.cache_dir()}) does not hold {held}{not_here} (load it once with network, "
                                 f"which caches it, or pass a local model directory)") from e
        said = str(e).splitlines()[0]
        if is_local:
            raise ModelLoadError(f"model {name_or_path} could not be loaded: {said}") from e
        raise ModelLoadError(f"model {name_or_path} could not be loaded from the Hugging Face Hub{not_here}: {said} "
                             f"(offline? Load it once with network, which caches it, or pass a local model "
                             f"directory)") from e
    except MemoryError:
        raise
    except Exception as e:  # a value of the wrong kind in one of its files: transformers', tokenizers' own words
        raise _unusable(name_or_path, reading, e) from e
    if unreachable:  # a copy the Hub may have replaced since: say so
        print(f"warning: {unreachable}; {hub_id} was loaded from the local cache ({hub.cache_dir()})",
              file=sys.stderr, flush=True)
    _check_loading_info(info, model, source)
    if bad := _non_finite(model):
        raise ModelLoadError(f"model {name_or_path}: its weights hold NaN or infinite values ({bad}): a damaged file "
                             "or a run that diverged?")
    fuse_activations(model)
    model.to(dev)
    model.eval()

    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    try:  # a value its files set that loading passes and the first batch would trip on (a model_max_length of text);
        # on a copy: a call leaves its padding and truncation settings on the tokenizer's backend
        copy.deepcopy(tokenizer)(["a", "a b c"], padding=True, return_tensors="pt")
    except Exception as e:  # noqa: BLE001 - whatever it is, the files are the cause
        raise _unusable(name_or_path, reading, e) from e

    if verbose:
        n_params = model.num_parameters()
        kind = "local" if is_local else "hub"
        msg = (
            f"loaded {type(model).__name__} ({kind}: {source}): {n_params / 1e6:.2f}M parameters, "
            f"device {dev}, dtype {torch_dtype}, vocab {len(tokenizer)}"
        )
        print(msg, flush=True)
    return model, tokenizer


def _weight_files_problem(path: Path) -> str | None:
    """What in a model directory's weight files loading would take without a word, or None: pickled weights
    without their safetensors (unpickling a file can run code, so they are never read), or a tensor whose dtype is
    not floating point (transformers casts it to the model's dtype: integers in place of weights)."""
    for pickled, safe in _PICKLED.items():
        if (path / pickled).is_file() and not (path / safe).is_file():
            return (f"its weights are {pickled}, a pickle, with no {safe} beside it: models are read from "
                    "safetensors alone, since unpickling a file can run code (where the file is trusted, "
                    "save_pretrained writes safetensors)")
    weights = [*path.glob("model*.safetensors"), *path.glob("adapter_model*.safetensors")]  # not a trainer state
    for file in sorted(f for f in weights if f.is_file()):
        try:
            with safe_open(str(file), "pt") as fh:
                dtypes = {key: fh.get_slice(key).get_dtype() for key in fh.keys()}
        except (SafetensorError, OSError):
            return None  # cut short, damaged or unreadable: the load says so
        wrong = sorted(k for k, d in dtypes.items() if not (d.startswith(_FLOATS) or k.endswith(_BENIGN_KEY_SUFFIXES)))
        if wrong:
            return (f"{file.name} holds {', '.join(wrong[:3])}{' ...' if len(wrong) > 3 else ''} as "
                    f"{dtypes[wrong[0]]}, not floating point: a damaged or edited file?")
    return None


def _non_finite(model: torch.nn.Module) -> str:
    """The parameters holding NaN or infinite values (at most three named), or "". Screened by their sums, 30 times
    faster than `isfinite` at 124M and one wait on a GPU: a NaN or an infinity makes its sum so (an overflowing sum
    too, which the exact check then clears)."""
    params = [(name, p.detach()) for name, p in model.named_parameters() if p.is_floating_point()]
    if not params or bool(torch.isfinite(torch.stack([p.sum(dtype=torch.float32) for _, p in params])).all()):
        return ""
    bad = [name for name, p in params if not bool(torch.isfinite(p).all())]
    return ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")


def _unusable(name: str, files: str, e: Exception) -> ModelLoadError:
    """One line for a model whose `files` hold what transformers or tokenizers cannot use, in their words."""
    return ModelLoadError(f"model {name}: its {files} could not be used ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:300]}): a damaged or edited file?")


@contextmanager
def _no_bars():
    """transformers' progress bars off ("Loading weights", "Writing model shards": one per load or
    checkpoint would bury the command's own output), as they were after."""
    bars_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars_on:
            hf_logging.enable_progress_bar()


def write_pretrained(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """Model (safetensors) and tokenizer into an existing directory, quietly (`_no_bars`)."""
    with _no_bars():
        model.save_pretrained(directory)  # safetensors is the default serialization
    tokenizer.save_pretrained(directory)
    _portable_tokenizer_class(directory)
    if not list(directory.glob("*.safetensors")):
        raise RuntimeError(f"save_pretrained wrote no safetensors file into {directory}")


def save_pretrained_atomic(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | os.PathLike) -> Path:
    """Save model (safetensors) and tokenizer so `out_dir` is either complete or untouched.

    Writes into a temporary directory beside `out_dir` and renames it into place;
    an existing `out_dir` is moved aside first and deleted only after the swap.
    """
    from rookworld_rlvr.atomic import write_dir

    return write_dir(Path(out_dir).expanduser().resolve(), lambda tmp: write_pretrained(model, tokenizer, tmp))


def _portable_tokenizer_class(directory: Path) -> None:
    """transformers 5 writes "TokenizersBackend", which 4.x cannot load; the 4.x name loads in both."""
    cfg_path = directory / "tokenizer_config.json"
    if not cfg_path.exists():
        return
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
