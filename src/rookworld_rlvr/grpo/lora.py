"""LoRA (peft): adapters on the policy, the checks that keep them mergeable, and the merged sampler.

The policy trains low-rank adapters on a frozen base; the reference is that base with the adapters
switched off (no second copy); sampling and evaluation run a plain copy of the base whose adapted
weights are set to base + delta before each use (`MergedSampler`): generation then takes the fast
decoding path, and the base is never merged into and unmerged (float drift). Checkpoints hold the
merged weights, and the trainer state the adapters.

Owns everything peft. Imports torch, transformers and peft (inside functions); nothing of chess.
"""

from __future__ import annotations

import copy
import warnings

import torch

from rookworld_rlvr.config import TrainConfig


def peft():
    try:
        import peft
    except ImportError:
        raise ImportError("lora_r > 0 needs peft: pip install 'rookworld-rlvr[lora]'") from None
    return peft


def wrap_lora(model, cfg: TrainConfig):
    """LoRA adapters on `model` (peft). They start at zero, so the wrapped policy equals the base;
    the base weights are frozen and only the adapters train. Returned in eval mode (dropout off)."""
    from transformers.pytorch_utils import Conv1D

    targets = lora_targets(cfg)
    check_lora_targets(model, targets)
    conv1d = any(isinstance(m, Conv1D) for name, m in model.named_modules() if name.split(".")[-1] in targets)
    lora = peft().LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=targets, lora_dropout=0.0,
                             fan_in_fan_out=conv1d, task_type="CAUSAL_LM")  # GPT-2's Conv1D stores weights transposed
    with warnings.catch_warnings():  # peft reads transformers' deprecated alias; a user can do nothing about it
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        wrapped = peft().get_peft_model(model, lora)
    return wrapped.eval()  # get_peft_model switches to train mode


def lora_targets(cfg: TrainConfig) -> list[str]:
    """The module names of `lora_targets` (comma-separated; peft matches each against a module name's last part)."""
    return [t.strip() for t in cfg.lora_targets.split(",") if t.strip()]


def check_lora_targets(model, targets: list[str]) -> None:
    """Each target must name (as a module name's last part) modules that take adapters: given a list, peft
    adapts what any name matches and drops the names that match nothing without a word (`c_attn,c_fcc` trained
    c_attn alone). Adapters on a weight that two modules share (GPT-2 ties lm_head to wte) cannot be merged:
    the merged checkpoint (and the merged sampler) would change both ends. Refused on the plain model, before
    peft wraps it (and warns of it twice). Tied weights are one Parameter object, so a skeleton on the meta
    device (no weights: `--dry-run`) is checked the same."""
    from transformers.pytorch_utils import Conv1D

    adaptable = (torch.nn.Linear, torch.nn.Embedding, Conv1D)  # peft's kinds that a GPT-2 holds
    kinds: dict[str, set[str]] = {}
    for name, m in model.named_modules():
        kinds.setdefault(name.split(".")[-1], set()).add("" if isinstance(m, adaptable) else type(m).__name__)
    takes = ", ".join(sorted(n for n, k in kinds.items() if "" in k))
    for target in targets:
        if target not in kinds:
            raise ValueError(f"config field 'lora_targets': {target!r} names no module of the model (those that take "
                             f"adapters: {takes})")
        if other := sorted(kinds[target] - {""}):
            raise ValueError(f"config field 'lora_targets': {target!r} names a {other[0]}, which takes no adapter "
                             f"(those that do: {takes})")
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name.removesuffix(".weight"))
    for name, m in model.named_modules():
        weight = getattr(m, "weight", None)
        if name.split(".")[-1] in targets and isinstance(weight, torch.nn.Parameter) and len(names[id(weight)]) > 1:
            raise ValueError(f"config field 'lora_targets': {name} shares its weight with "
                             f"{', '.join(n for n in names[id(weight)] if n != name)}; adapters there cannot "
                             "be merged into a plain checkpoint (use c_attn,c_proj,c_fc)")


def target_problem(model_dir: str, cfg: TrainConfig) -> str | None:
    """`check_lora_targets`' refusal for the model in `model_dir`, from its config.json alone (no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    except (ValueError, KeyError, OSError) as e:  # the run's load would stop on it too
        first = str(e).splitlines()[0] if str(e) else type(e).__name__  # (transformers lists every model type after)
        return f"model: {model_dir}: its config.json makes no causal language model ({first})"
    try:
        check_lora_targets(skeleton, lora_targets(cfg))
    except ValueError as e:
        return str(e)
    return None


class MergedSampler:
    """A plain copy of the base model whose adapted weights are base + adapter delta at each call."""

    def __init__(self, base, policy) -> None:
        self.model = base
        weights = base.state_dict()  # (adapted layer, its weight in the plain copy), found once
        self._pairs = [(m, weights[f"{name}.weight"]) for name, m in policy.get_base_model().named_modules()
                       if isinstance(m, peft().tuners.lora.LoraLayer)]

    def __call__(self):
        with torch.no_grad():
            for layer, weight in self._pairs:
                weight.copy_(layer.get_base_layer().weight + layer.get_delta_weight("default"))
        return self.model


def with_lora(model, cfg: TrainConfig):
    """(the policy with adapters, its merged sampler): the sampler copies the base before wrapping."""
    base = copy.deepcopy(model).requires_grad_(False)
    policy = wrap_lora(model, cfg)
    return policy, MergedSampler(base, policy)


def adapter_state(policy) -> dict[str, torch.Tensor]:
    """The adapters, the whole trained state of a LoRA run (the base never changes), on the CPU."""
    return {k: v.detach().cpu() for k, v in peft().get_peft_model_state_dict(policy).items()}


def load_adapter_state(policy, state: dict[str, torch.Tensor]) -> None:
    """Copy adapters into `policy` in place (the optimizer keeps its parameters)."""
    with torch.no_grad():
        peft().set_peft_model_state_dict(policy, state)
