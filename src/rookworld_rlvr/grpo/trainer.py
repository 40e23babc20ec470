"""The GRPO loop. The only place that knows the order of things:

    prompts -> G completions each -> verified rewards -> advantages
    -> μ passes (minibatches, gradient accumulation) -> optimizer step
    -> controllers (β, non-finite guard, collapse guard: roll back or stop) -> metrics, eval, checkpoint

The trainer receives a reward function (`reward_fn(prompts, completions, truths, weights)`),
not the chess modules; `build_trainer` wires in the chess rewards.
"""

from __future__ import annotations

import copy
import json
import math
import random
import subprocess
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from rookworld_rlvr import __version__
from rookworld_rlvr.config import TrainConfig
from rookworld_rlvr.grpo import checkpoint as ckpt
from rookworld_rlvr.grpo import distributed as dist
from rookworld_rlvr.grpo.control import (CollapseGuard, CurriculumSchedule, GuardEvent, KLController, NonFiniteGuard,
                                         RewardNormalizer, SymptomMonitor, adamw, cosine_lr)
from rookworld_rlvr.grpo.loss import exact_kl, group_advantages, grpo_loss, zero_variance_groups
from rookworld_rlvr.model import bf16_grad, generate, gpt2_segments, load_policy, resolve_device, token_logprobs
from rookworld_rlvr.model.generate import max_positions, positions_from_mask
from rookworld_rlvr.model.padding import pad, pad_pairs
from rookworld_rlvr.model.gpt2_decode import packed_projections


class TrainingStopped(RuntimeError):
    """A guard stopped the run; the message names the cause and the knob to turn."""


@dataclass
class Row:
    """One completion with everything the update needs."""

    task: str
    prompt: str
    truth: Any
    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logp: list[float]
    text: str
    finish: str
    reward: float = 0.0
    components: dict = field(default_factory=dict)
    valid: bool = False
    recorded: tuple | None = None  # the sampler's projections for this row (Generation.recorded_row)


@dataclass
class Batch:
    rows: list[Row]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_mask: torch.Tensor  # [N, C]
    sampler_logp: torch.Tensor  # [N, C]
    rewards: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N]
    n_completion: int


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


def _plain_gpt2(model) -> bool:
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
    if not _plain_gpt2(model):
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


RECORD_MIN_WIDTH = 512  # auto: measured no gain at n_embd 256 (tiny), a 40% shorter policy pass at 768 (124M)


def record_rollout(cfg: TrainConfig, model, amp: torch.dtype | None, device: torch.device) -> tuple[bool, str]:
    """(whether rollouts record their projections for the first update, a note for the banner).
    auto: where it was measured to pay, a CPU and a model from 512 wide; on a GPU the recording's
    memory (the whole batch at once, also under minibatch_size) competes with the activations."""
    setting = cfg.record_rollout
    if setting == "never":
        return False, "recomputed (record_rollout: never)"
    why = ("autocast" if amp is not None else "LoRA" if cfg.lora_r else "compile" if cfg.compile
           else None if _plain_gpt2(model) else "not a plain GPT-2")
    if why:
        if setting == "always":
            raise ValueError(f"config field 'record_rollout': always needs a plain GPT-2 policy without autocast, "
                             f"LoRA or compile ({why}); use auto")
        return False, f"recomputed (record_rollout needs a plain GPT-2 policy without autocast, LoRA or compile: {why})"
    width = model.config.n_embd
    if setting == "auto" and device.type != "cpu":
        return False, f"recomputed (record_rollout auto: measured on CPUs only; use always on {device.type})"
    if setting == "auto" and width < RECORD_MIN_WIDTH:
        return False, f"recomputed (record_rollout auto: n_embd {width} < {RECORD_MIN_WIDTH}, too narrow to gain)"
    return True, f"the rollout's recorded projection outputs in the first update on a batch ({setting})"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _peft():
    try:
        import peft
    except ImportError:
        raise ImportError("lora_r > 0 needs peft: pip install 'rookworld-rlvr[lora]'") from None
    return peft


def wrap_lora(model, cfg: TrainConfig):
    """LoRA adapters on `model` (peft). They start at zero, so the wrapped policy equals the base;
    the base weights are frozen and only the adapters train. Returned in eval mode (dropout off)."""
    from transformers.pytorch_utils import Conv1D

    peft = _peft()
    targets = [t.strip() for t in cfg.lora_targets.split(",") if t.strip()]
    conv1d = any(isinstance(m, Conv1D) for name, m in model.named_modules() if name.split(".")[-1] in targets)
    lora = peft.LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=targets, lora_dropout=0.0,
                           fan_in_fan_out=conv1d, task_type="CAUSAL_LM")  # GPT-2's Conv1D stores weights transposed
    return peft.get_peft_model(model, lora).eval()  # get_peft_model switches to train mode


def check_untied_lora(policy) -> None:
    """Adapters on a weight that two modules share (GPT-2 ties lm_head to wte) cannot be merged:
    the merged checkpoint (and the merged sampler) would change both ends. Refuse them."""
    names: dict[int, list[str]] = {}
    for name, p in policy.get_base_model().named_parameters(remove_duplicate=False):
        names.setdefault(p.data_ptr(), []).append(name.removesuffix(".base_layer.weight").removesuffix(".weight"))
    for name, m in policy.get_base_model().named_modules():
        if isinstance(m, _peft().tuners.lora.LoraLayer):
            shared = names[m.get_base_layer().weight.data_ptr()]
            if len(shared) > 1:
                raise ValueError(f"config field 'lora_targets': {name} shares its weight with "
                                 f"{', '.join(n for n in shared if n != name)}; adapters there cannot be merged "
                                 "into a plain checkpoint (use c_attn,c_proj,c_fc)")


def ends_game(sample) -> bool:
    """An A: sample whose transition ends the game (terminated or truncated)."""
    return sample.task == "A" and (sample.truth.terminated or sample.truth.truncated)


class PromptSampler:
    """Per-pool shuffled cursors over the training samples; resumable from (epoch, cursor).

    With `terminal_share` s set, A: prompts come from two pools, ordinary and game-ending
    transitions (8.6% of the shipped A: data): the k-th A: prompt of the run is game-ending
    when floor(k * s) steps up, so exactly that share of A: prompts ends a game,
    deterministically on every rank and across resumes. `puzzle_share` does the same for P:
    prompts drawn from the `P_puzzle` pool.
    """

    def __init__(self, samples_by_task: dict[str, list], seed: int, terminal_share: float | None = None,
                 puzzle_share: float = 0.0) -> None:
        self.pools = dict(samples_by_task)
        self.seed = seed
        self.terminal_share = terminal_share
        self.puzzle_share = puzzle_share
        if puzzle_share > 0 and not self.pools.get("P_puzzle"):
            raise ValueError(f"mix_puzzle_ratio is {puzzle_share} but there are no training puzzles: set puzzle_data")
        if terminal_share is not None:
            env = self.pools.get("A", [])
            self.pools["A"] = [x for x in env if not ends_game(x)]
            self.pools["A_end"] = [x for x in env if ends_game(x)]
            if env and terminal_share > 0 and not self.pools["A_end"]:
                raise ValueError(f"env_terminal_share is {terminal_share} but the training data has no game-ending "
                                 "A: transitions (terminated or truncated): set it to null")
            if env and terminal_share < 1 and not self.pools["A"]:
                raise ValueError(f"env_terminal_share is {terminal_share} but every A: transition of the training "
                                 "data ends the game: set it to 1 or null")
        self.state = {name: {"epoch": 0, "cursor": 0} for name in self.pools}
        if terminal_share is not None:
            self.state["A"]["drawn"] = 0  # A: prompts drawn so far
        if puzzle_share > 0:
            self.state.setdefault("P", {"epoch": 0, "cursor": 0})["drawn"] = 0
        self._perm: dict[str, tuple[int, list[int]]] = {}

    def load_state(self, state: dict) -> None:
        for name, st in state.items():
            if name in self.state:
                self.state[name].update(copy.deepcopy(st))

    def _order(self, name: str) -> list[int]:
        epoch = self.state[name]["epoch"]
        if self._perm.get(name, (None,))[0] != epoch:
            idx = list(range(len(self.pools[name])))
            random.Random(f"{self.seed}:{name}:{epoch}").shuffle(idx)
            self._perm[name] = (epoch, idx)
        return self._perm[name][1]

    def _pool(self, task: str) -> str:
        share, other = {"A": (self.terminal_share, "A_end"), "P": (self.puzzle_share or None, "P_puzzle")}.get(
            task, (None, ""))
        if share is None:
            return task
        st = self.state[task]
        k, st["drawn"] = st["drawn"], st["drawn"] + 1
        return other if math.floor((k + 1) * share + 1e-9) > math.floor(k * share + 1e-9) else task

    def take(self, task: str, n: int) -> list:
        if n and not any(self.pools.get(name) for name in (task, f"{task}_end", f"{task}_puzzle")):
            raise ValueError(f"the training data has no {task}: samples but the configuration asks for them")
        out = []
        for _ in range(n):
            name = self._pool(task)
            st = self.state[name]
            if st["cursor"] >= len(self.pools[name]):
                st["epoch"], st["cursor"] = st["epoch"] + 1, 0
            out.append(self.pools[name][self._order(name)[st["cursor"]]])
            st["cursor"] += 1
        return out


RewardFn = Callable[[list[str], list[str], list[Any], dict], list[Any]]


class Trainer:
    def __init__(self, cfg: TrainConfig, reward_fn: RewardFn, train_samples: list, eval_fn: Callable | None = None,
                 log: Callable[[str], None] = print, puzzles: list = ()) -> None:
        """`train_samples` give the P: and A: prompts (and the anchor's answers); `puzzles` are P:
        prompts without a written answer, drawn at `mix_puzzle_ratio` of the P: prompts."""
        cfg.validate()
        self.cfg = cfg
        self.reward_fn = reward_fn
        self.eval_fn = eval_fn
        self.main = dist.is_main()  # under torchrun only rank 0 logs and writes files
        self.log = log if self.main else (lambda *_: None)
        for note in cfg.inert_settings():
            self.log(f"warning: setting without effect: {note}")
        self.run_dir = Path(cfg.output_dir)
        self._check_shardable()
        if self.main and not cfg.resume and ((self.run_dir / "metrics.jsonl").exists() or (self.run_dir / "checkpoints").exists()):
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime((self.run_dir / "config.yaml").stat().st_mtime
                                                                  if (self.run_dir / "config.yaml").exists() else time.time()))
            aside = self.run_dir.with_name(f"{self.run_dir.name}-{stamp}")
            self.run_dir.rename(aside)  # a fresh run never mixes with an old one, and nothing is deleted
            log(f"moved the previous run in {self.run_dir} to {aside} (use resume: true to continue it)")
        dist.barrier()  # the other ranks look into the run directory only once rank 0 has set it up
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)  # the same on every rank: LoRA adapters start identical everywhere
        self.device = dist.local_device(resolve_device(cfg.device))
        self.ref_device = dist.local_device(resolve_device(cfg.ref_device)) if cfg.ref_device else self.device
        self.amp = autocast_dtype(cfg.autocast, self.device)
        resume_from = ckpt.latest_checkpoint(self.run_dir) if cfg.resume else None
        if cfg.resume and resume_from is None:
            self.log(f"resume: no checkpoint in {self.run_dir}/checkpoints, starting fresh")
        # LoRA checkpoints hold merged weights; a LoRA resume rebuilds base + adapters (from trainer_state.pt)
        source = str(resume_from) if resume_from and not cfg.lora_r else cfg.model
        self.policy, self.tokenizer = load_policy(source, device=str(self.device), verbose=False)
        self.policy.eval()  # dropout off in every forward pass, training included
        self.policy.requires_grad_(True)
        self.use_ref = cfg.uses_reference  # the KL penalty, or the collapse guard's KL signals
        self.ref = None
        self._sampler = None
        if cfg.lora_r:  # the reference is this model with its adapters disabled: no second copy
            # sampling and eval run a plain copy holding base + adapters merged (see `sampler`)
            self._sampler = copy.deepcopy(self.policy).requires_grad_(False)
            self.policy = wrap_lora(self.policy, cfg)
            check_untied_lora(self.policy)
            weights = self._sampler.state_dict()  # (adapted layer, its weight in the plain copy), found once
            self._merge_into = [(m, weights[f"{name}.weight"]) for name, m in self.policy.get_base_model().named_modules()
                                if isinstance(m, _peft().tuners.lora.LoraLayer)]
        elif self.use_ref:
            if resume_from is not None:  # the reference is the base model, not the resumed policy
                self.ref, _ = load_policy(cfg.model, device=str(self.ref_device), verbose=False)
            else:
                self.ref = copy.deepcopy(self.policy).to(self.ref_device)
            self.ref.eval().requires_grad_(False)
        # the peft wrapper's forward hides HF's logits_to_keep; its inner model runs the same adapters
        net = self.policy.get_base_model() if cfg.lora_r else self.policy
        self.forward_model = torch.compile(net) if cfg.compile else net
        self.grad_dtype, self.grad_note = backward_dtype(cfg.backward_dtype, self.forward_model, self.amp, self.device)
        self.record, self.record_note = record_rollout(cfg, self.forward_model, self.amp, self.device)
        self.n_params = sum(p.numel() for p in self.policy.parameters())
        trainable = [p for p in self.policy.parameters() if p.requires_grad]  # all of them without LoRA
        self.n_trainable = sum(p.numel() for p in trainable)
        self.opt = adamw(trainable, cfg.lr, (0.9, 0.99), cfg.weight_decay)
        self.kl_ctl = KLController(cfg.kl_coef, cfg.kl_mode, cfg.kl_target, cfg.kl_horizon, cfg.kl_coef_min,
                                   max(cfg.kl_coef_max, cfg.kl_coef_min), cfg.kl_warmup_steps, cfg.kl_warmup_factor)
        self.guard = CollapseGuard(cfg.guard_valid_drop, cfg.guard_reward_drop, cfg.guard_kl_mean, cfg.guard_kl_max,
                                   cfg.guard_entropy_factor, cfg.guard_truncation_rise, cfg.guard_eval_drop,
                                   cfg.guard_window, cfg.guard_patience, cfg.guard_max_recoveries)
        self.nan_guard = NonFiniteGuard(cfg.nan_max_consecutive, cfg.nan_max_rollbacks, cfg.rollback_lr_factor)
        self.snapshots: dict[int, dict] = {}  # in-memory rollback targets since the last checkpoint (see snapshot)
        self.beta_scale = 1.0  # rollback_kl_factor ** recoveries
        self.phase_key: str | None = None  # sampling settings and reward weights in force (guard histories reset)
        self.normalizer = RewardNormalizer(cfg.reward_norm_momentum, cfg.reward_norm)
        self.curriculum = CurriculumSchedule(cfg.curriculum)
        self.monitor = SymptomMonitor(every=20, flat_steps=max(20, cfg.steps // 3))
        by_task = {"P": [s for s in train_samples if s.task == "P"], "A": [s for s in train_samples if s.task == "A"]}
        self.prompts = PromptSampler({**by_task, "P_puzzle": list(puzzles)}, cfg.seed, cfg.env_terminal_share,
                                     cfg.mix_puzzle_ratio)
        # the anchor's ground-truth answers come in their own order, so GRPO sees the same prompts with or without it
        self.anchor = PromptSampler({t: by_task[t] for t in cfg.anchor_tasks}, cfg.seed + 1) if cfg.anchor_coef else None
        self.gen = torch.Generator(device=self.device).manual_seed(cfg.seed + dist.rank())  # own samples per rank
        self.step = 0
        self.events: list[dict] = []  # guard events of this process's run (events.jsonl has every one)
        self.collect_stats: dict[str, float] = {}
        self.lr_scale = 1.0
        self.base_eval: dict | None = None
        self.best: tuple[float, int] | None = None
        self.history_eval: list[dict] = []
        if resume_from is not None:  # every rank loads the same checkpoint
            self._load_state(ckpt.load_state(resume_from))
            self._truncate_logs()
            self.log(f"resumed from {resume_from} at step {self.step}")

    def _task_counts(self, step: int) -> dict[str, int]:
        """Global prompts per task at `step`. Each rank takes 1/world of every task, so ranks hold
        equal rows per task (equal-size collectives, exact means of per-rank means)."""
        n_env = round(self.cfg.batch_positions * self.cfg.sampling_for("A", step)["mix_env_ratio"])
        counts = {"P": self.cfg.batch_positions - n_env, "A": n_env}
        w = dist.world()
        if any(n % w for n in counts.values()):
            raise ValueError(f"batch_positions {self.cfg.batch_positions} at step {step} gives {counts['P']} P: and "
                             f"{counts['A']} A: prompts; with {w} processes both must divide by {w} (prompts are "
                             "sharded per task): change batch_positions or mix_env_ratio")
        return counts

    def _check_shardable(self) -> None:
        """Fail at start, not at a later phase, when the batch cannot be split over the processes."""
        if self.cfg.batch_positions % dist.world():
            raise ValueError(f"config field 'batch_positions' ({self.cfg.batch_positions}) is the global number of "
                             f"prompts per step and must divide by the number of processes ({dist.world()})")
        for step in [0] + [ph["start"] for ph in self.cfg.phases]:
            self._task_counts(step)
        per_task = self.cfg.anchor_per_task
        if self.cfg.anchor_coef and per_task % dist.world():
            raise ValueError(f"config field 'anchor_batch' ({self.cfg.anchor_batch}) gives {per_task} samples per anchor "
                             f"task, which must divide by the number of processes ({dist.world()})")

    # -- state ---------------------------------------------------------------------------------
    def _state(self) -> dict:
        st = {
            "step": self.step, "optimizer": self.opt.state_dict(), "lr_scale": self.lr_scale,
            "kl_ctl": self.kl_ctl.state_dict(), "guard": self.guard.state_dict(), "beta_scale": self.beta_scale,
            "phase_key": self.phase_key,
            "nan_guard": self.nan_guard.state_dict(), "normalizer": self.normalizer.state_dict(),
            "monitor": self.monitor.state_dict(), "prompts": copy.deepcopy(self.prompts.state),
            "anchor": copy.deepcopy(self.anchor.state) if self.anchor else None,
            "generator": self.gen.get_state(), "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
            "base_eval": self.base_eval, "best": self.best, "history_eval": self.history_eval,
            "config": self.cfg.to_dict(), "version": __version__,
            "backward_dtype": "bf16" if self.grad_dtype is not None else "float32",
        }
        if self.ref is not None and self.cfg.ref_refresh_every:
            st["ref"] = {k: v.detach().cpu() for k, v in self.ref.state_dict().items()}
        if self.cfg.lora_r:  # the base never changes: the adapters are the whole trained state
            st["lora"] = {k: v.detach().cpu() for k, v in _peft().get_peft_model_state_dict(self.policy).items()}
        return st

    def _load_state(self, st: dict, weights_from: Path | None = None) -> None:
        if self.cfg.lora_r:
            if "lora" not in st:
                raise ValueError("this checkpoint has no LoRA adapters (saved with lora_r 0): resume it with lora_r 0")
            with torch.no_grad():
                _peft().set_peft_model_state_dict(self.policy, st["lora"])  # copies in place: the optimizer keeps its params
        elif "weights" in st:  # an in-memory snapshot
            with torch.no_grad():
                self.policy.load_state_dict(st["weights"])  # copies in place: the optimizer keeps its params
        elif weights_from is not None:
            loaded, _ = load_policy(str(weights_from), device=str(self.device), verbose=False)
            with torch.no_grad():
                for p, q in zip(self.policy.parameters(), loaded.parameters()):
                    p.copy_(q)
        self.step = st["step"]
        chosen = st.get("backward_dtype")
        was = torch.bfloat16 if chosen == "bf16" else None
        if self.cfg.backward_dtype == "auto" and self.amp is None and chosen and was != self.grad_dtype:
            # a resumed run goes on as it started, whatever this machine's measurement says today
            self.grad_dtype, self.grad_note = was, f"{chosen} (auto: as the run was started)"
        self.opt.load_state_dict(st["optimizer"])
        self.lr_scale = st["lr_scale"]
        self.kl_ctl.load_state_dict(st["kl_ctl"])
        if "guard" in st:  # checkpoints written before the collapse guard start it afresh
            self.guard.load_state_dict(st["guard"])
        self.beta_scale, self.phase_key = st.get("beta_scale", 1.0), st.get("phase_key")
        self.nan_guard.load_state_dict(st["nan_guard"])
        self.normalizer.load_state_dict(st["normalizer"])
        self.monitor.load_state_dict(st["monitor"])
        self.prompts.load_state(st["prompts"])
        if self.anchor and st.get("anchor"):
            self.anchor.load_state(st["anchor"])
        gens = st.get("generators")  # one sampling stream per rank (the same world size continues each)
        self.gen.set_state(gens[dist.rank()] if gens and len(gens) == dist.world() else st["generator"])
        torch.set_rng_state(st["torch_rng"])
        random.setstate(st["python_rng"])
        self.base_eval, self.best, self.history_eval = st["base_eval"], st["best"], st["history_eval"]
        if "ref" in st and self.ref is not None:
            self.ref.load_state_dict(st["ref"])

    def _truncate_logs(self) -> None:
        """Drop log records of steps after the restored checkpoint: they will be redone."""
        from rookworld_rlvr.data.io import atomic_write_text

        if not self.main:  # rank 0 owns the logs
            return

        for name in ("metrics.jsonl", "eval.jsonl"):
            path = self.run_dir / name
            if path.exists():
                keep = [line for line in path.read_text().splitlines() if json.loads(line).get("step", 0) <= self.step]
                atomic_write_text(path, [line + "\n" for line in keep])

    def sampler(self):
        """The policy as a plain transformers model: itself, or (LoRA) a separate copy whose weights
        are set to base + adapter delta now. Generation then takes the fast cascade decoding path
        (peft's wrapper does not), and the base inside `policy` is never touched: merging in place
        and unmerging would drift it by float rounding, and it is also the frozen reference."""
        if self._sampler is None:
            return self.policy
        with torch.no_grad():
            for layer, weight in self._merge_into:
                weight.copy_(layer.get_base_layer().weight + layer.get_delta_weight("default"))
        return self._sampler

    def save(self) -> Path:
        """Checkpoint; collective under torchrun: rank 0 writes (with every rank's sampling stream),
        the others wait until it is complete, so a rollback or resume finds it. In-memory snapshots
        older than it are dropped: a run resumed from it has none, and both must roll back alike."""
        gens = dist.all_gather_object(self.gen.get_state())
        path = ckpt.checkpoint_dir(self.run_dir, self.step)
        if self.main:
            path = ckpt.save_checkpoint(self.run_dir, self.step, self.sampler(), self.tokenizer,
                                        {**self._state(), "generators": gens})
            keep = {self.best[1]} if self.best else set()
            ckpt.prune(self.run_dir, self.cfg.keep_last, keep)
        self.snapshots = {s: v for s, v in self.snapshots.items() if s >= self.step}
        dist.barrier()
        return path

    def snapshot(self) -> None:
        """Keep the state at this step in memory (every guard_snapshot_every steps): a rollback
        target between checkpoints, restored without touching the disk. Only the newest snapshot
        old enough for any future recovery (a collapse guard's goes back guard_patience + 1 steps
        before the record that acts, the NaN guard's nan_max_consecutive) and newer ones are kept."""
        if self.step % self.cfg.guard_snapshot_every or self.step in self.snapshots:
            return
        state = copy.deepcopy(self._state())  # tensors cloned: later steps must not write into it
        state["generator"] = self.gen.get_state()  # this rank's own sampling stream
        if not self.cfg.lora_r:
            state["weights"] = {k: v.detach().to("cpu", copy=True) for k, v in self.policy.state_dict().items()}
        self.snapshots[self.step] = state
        reach = max(self.cfg.guard_patience, self.cfg.nan_max_consecutive)
        old = [s for s in self.snapshots if s <= self.step - reach]
        if old:
            self.snapshots = {s: v for s, v in self.snapshots.items() if s >= max(old)}

    def rollback(self, reason: str, to_step: int | None = None, kl_factor: float = 1.0) -> int:
        """Restore the newest good state at or before `to_step` (default: now), from memory or a
        checkpoint: weights, optimizer, controllers, data and sampling streams; the guards keep their
        counts. LR x rollback_lr_factor and beta x `kl_factor` from then on. Returns the step."""
        dist.barrier()  # every rank decided the same; no checkpoint is half-written while they read it
        to_step = self.step if to_step is None else to_step
        disk = {s: p for s, p in ckpt.list_checkpoints(self.run_dir) if s <= to_step}
        memory = [s for s in self.snapshots if s <= to_step]
        if not disk and not memory:
            raise TrainingStopped(f"{reason}; no saved state at or before step {to_step} to roll back to")
        target = max(memory + list(disk))
        nan_state, recoveries = self.nan_guard.state_dict(), self.guard.recoveries
        lr_scale, beta_scale = self.lr_scale * self.cfg.rollback_lr_factor, self.beta_scale * kl_factor
        now = self.step
        if target in memory:
            self._load_state(copy.deepcopy(self.snapshots[target]))
            where = f"step_{target:06d} (in memory)"
        else:
            self._load_state(ckpt.load_state(disk[target]), weights_from=disk[target])
            where = disk[target].name
        self.nan_guard.load_state_dict(nan_state)  # the guards remember how often they fired
        self.guard.recoveries = recoveries
        self.lr_scale, self.beta_scale = lr_scale, beta_scale
        self.snapshots = {s: v for s, v in self.snapshots.items() if s <= target}
        self._truncate_logs()
        self.log(f"step {now}: {reason}: rolled back to {where}, LR x{self.lr_scale:.3g}"
                 + (f", beta x{self.beta_scale:.3g}" if self.beta_scale != 1 else ""))
        return target

    def _event(self, event: GuardEvent, **more) -> None:
        """Every guard event goes to events.jsonl (never truncated), the log and the summary."""
        self.events.append({**event.record(), **more})
        if self.main:
            _append(self.run_dir / "events.jsonl", {**event.record(), **more})
        self.log(event.message)

    def _act(self, event: GuardEvent) -> None:
        """Recover from a collapse event (or stop with its message). A step's samples come from the
        weights before it, so the first bad record r0 shows the state after r0 - 1 updates: the last
        good state is at step r0 - 2 or before (an evaluation event: the best evaluation's step)."""
        if event.action == "stop":
            self._event(event)
            raise TrainingStopped(event.message)
        to = self.best[1] if event.signal == "eval" and self.best else max(event.first_step - 2, 0)
        target = self.rollback(f"{event.signal} out of bounds", to, self.cfg.rollback_kl_factor)
        self._event(event, to_step=target, lr_scale=self.lr_scale, beta_scale=self.beta_scale)

    def _phase(self, step: int) -> str:
        """What the run samples and rewards at `step`: a change restarts the guard's medians."""
        return json.dumps([self.cfg.sampling_for(t, step) for t in ("P", "A")]
                          + [self.curriculum.weights(t, step, w) for t, w in (("P", self.cfg.policy_weights),
                                                                              ("A", self.cfg.env_weights))],
                          sort_keys=True)

    # -- rollout ---------------------------------------------------------------------------------
    def collect(self, step: int, timings: dict) -> list[list[Row]]:
        """B prompts (mixed by the phase's ratio) x G completions, scored. Returns groups.

        Under torchrun every rank draws the same global prompts (so the sampler, and its resume
        state, is the same everywhere) and rolls out only its contiguous share of each task.

        Dynamic sampling (DAPO): up to `dynamic_sampling` rounds replace groups whose rewards are all
        equal (no learning signal) with groups of fresh prompts of the same task: each round draws
        ceil(missing x dynamic_sampling_oversample) prompts (a multiple of the world size), every rank
        rolls out its share and fills its own flat places with its groups that differ, in order;
        groups left over are discarded. What it cost goes in `self.collect_stats`."""
        cfg = self.cfg
        G, w = cfg.group_size, dist.world()
        counts = self._task_counts(step)
        groups = self._rollout({task: dist.shard(self.prompts.take(task, counts[task])) for task in ("P", "A")},
                               step, timings)
        n, lo = len(groups), dist.rank() * len(groups)  # this rank's groups in the global, rank-major order

        def global_flat(gs: list[list[Row]]) -> list[int]:
            return dist.all_gather_tensor(torch.tensor([_flat(g) for g in gs], dtype=torch.float32)).nonzero().flatten().tolist()

        flat = global_flat(groups)
        sampled, sampled_flat, rounds = n * w, len(flat), 0
        for _ in range(cfg.dynamic_sampling):
            if not flat:
                break
            rounds += 1
            for task in ("P", "A"):
                idx = [i for i in flat if groups[i % n][0].task == task]  # every rank has the same task layout
                if not idx:
                    continue
                k = -(-math.ceil(len(idx) * cfg.dynamic_sampling_oversample) // w) * w
                fresh = self._rollout({task: dist.shard(self.prompts.take(task, k))}, step, timings)
                sampled += k
                sampled_flat += len(global_flat(fresh))
                kept = iter(g for g in fresh if not _flat(g))
                for i in idx:
                    if lo <= i < lo + n:
                        g = next(kept, None)
                        if g is None:
                            break
                        groups[i - lo] = g
            flat = global_flat(groups)
        kept = n * w - len(flat)
        self.collect_stats = {"zero_var_share_sampled": sampled_flat / sampled}
        if cfg.dynamic_sampling:
            extra = (sampled - n * w) * G
            self.collect_stats.update({"dynamic/rounds": rounds, "dynamic/extra_samples": extra,
                                       "dynamic/extra_per_kept": extra / max(kept, 1), "dynamic/unfilled": len(flat)})
        return groups

    def _rollout(self, by_task: dict[str, list], step: int, timings: dict) -> list[list[Row]]:
        """G completions for each sample, scored; groups in task order (P: first).

        Tasks whose top-k and top-p agree share one decode loop, each prompt with its own task's
        temperature and token limit: one decode step of 64 rows costs much less than two of 32."""
        cfg = self.cfg
        items = [(task, x) for task in ("P", "A") for x in by_task.get(task, [])]
        if not items:
            return []
        settings = {task: cfg.sampling_for(task, step) for task, _ in items}
        if len({(s["top_k"], s["top_p"]) for s in settings.values()}) == 1:
            calls = [items]
        else:
            calls = [[it for it in items if it[0] == task] for task in settings]
        rows: list[Row] = []
        for call in calls:
            rows += self._generate_and_score(call, settings, step, timings)
        return [rows[j: j + cfg.group_size] for j in range(0, len(rows), cfg.group_size)]

    def _generate_and_score(self, items: list, settings: dict, step: int, timings: dict) -> list[Row]:
        cfg = self.cfg
        G = cfg.group_size
        prompts = [x.render(cfg.layout)[0] for _, x in items]
        first = settings[items[0][0]]
        t0 = time.time()
        g = generate(self.sampler(), self.tokenizer, prompts,
                     max_new_tokens=[settings[t]["max_new_tokens"] for t, _ in items],
                     temperature=[settings[t]["temperature"] for t, _ in items], top_k=first["top_k"],
                     top_p=first["top_p"], num_return_sequences=G, generator=self.gen, autocast_dtype=self.amp,
                     record=self.record)
        timings["generate"] = timings.get("generate", 0.0) + time.time() - t0
        t0 = time.time()
        n = len(g.texts)
        truths = [items[i // G][1].truth for i in range(n)]
        row_prompts = [prompts[i // G] for i in range(n)]
        weights = {"P": self.curriculum.weights("P", step, cfg.policy_weights),
                   "A": self.curriculum.weights("A", step, cfg.env_weights)}
        results = self.reward_fn(row_prompts, g.texts, truths, weights)
        timings["score"] = timings.get("score", 0.0) + time.time() - t0
        rows = []
        for i in range(n):
            pm, cm = g.prompt_mask[i].bool(), g.completion_mask[i].bool()
            r = results[i]
            row = Row(items[i // G][0], row_prompts[i], truths[i], g.prompt_ids[i][pm].tolist(),
                      g.completion_ids[i][cm].tolist(), g.logprobs[i][cm].tolist(), g.texts[i],
                      g.finish_reasons[i], float(r.total), dict(r.components), bool(r.valid_format),
                      g.recorded_row(i) if self.record else None)
            if row.finish == "length" and cfg.truncated_completions == "malformed":
                row.reward, row.valid = cfg.malformed_penalty, False  # an answer cut off is not an answer
            rows.append(row)
        return rows

    def assemble(self, groups: list[list[Row]]) -> Batch:
        """Left-pad prompts, right-pad completions, compute advantages."""
        rows = [r for g in groups for r in g]
        ids, mask, P = pad_pairs([r.prompt_ids for r in rows], [r.completion_ids for r in rows],
                                 self.tokenizer.pad_token_id)
        C = ids.shape[1] - P
        slogp, _ = pad([r.sampler_logp for r in rows], 0.0, "right", width=C, dtype=torch.float32)
        rewards = torch.tensor([r.reward for r in rows], dtype=torch.float32)
        # on the global reward vector (ranks hold equal rows, rank-major): group statistics, batch
        # scaling and the normaliser are those of one process; then this rank's slice
        everyone = dist.all_gather_tensor(rewards)
        shaped = self.normalizer.normalize(everyone) if self.cfg.reward_norm else everyone
        adv = dist.shard(group_advantages(shaped, self.cfg.group_size, self.cfg.scale_rewards, self.cfg.std_floor,
                                          self.cfg.std_floor_mode).float())
        completion = mask[:, P:].float()
        if self.cfg.truncated_completions == "mask":  # still in their groups' advantages, out of the loss
            completion[[i for i, r in enumerate(rows) if r.finish == "length"]] = 0.0
        d = self.device
        return Batch(rows, ids.to(d), mask.to(d), positions_from_mask(mask).to(d), completion.to(d),
                     slogp.to(d), rewards, adv.to(d), C)

    def anchor_batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """This step's ground-truth answers for the anchor loss (this rank's share): ids, attention
        mask, positions, completion width. Each answer ends with EOS, as the model must stop there."""
        pairs = [s.render(self.cfg.layout) for t in self.cfg.anchor_tasks
                 for s in dist.shard(self.anchor.take(t, self.cfg.anchor_per_task))]
        encode = lambda texts: self.tokenizer(texts, add_special_tokens=False)["input_ids"]  # noqa: E731
        answers = [ids + [self.tokenizer.eos_token_id] for ids in encode([c for _, c in pairs])]
        ids, mask, P = pad_pairs(encode([p for p, _ in pairs]), answers, self.tokenizer.pad_token_id)
        limit = max_positions(self.policy)
        if limit is not None and int(mask.sum(1).max()) > limit:
            raise ValueError(f"an anchor sample (prompt + answer) has {int(mask.sum(1).max())} tokens, more than the "
                             f"model's context of {limit}: use shorter data or set anchor_coef 0")
        d = self.device
        return ids.to(d), mask.to(d), positions_from_mask(mask).to(d), ids.shape[1] - P

    def anchor_loss(self, anchor: tuple) -> tuple[torch.Tensor, float]:
        """anchor_coef x the answers' per-token NLL (token mean over every rank's answers: summed
        gradients equal one process's), and this rank's NLL for the log."""
        ids, mask, pos, width = anchor
        with self._amp(self.device):
            logp = token_logprobs(self.forward_model, ids, mask, pos, width, grad_dtype=self.grad_dtype)["logprobs"]
        answer = mask[:, -width:].float()
        tokens = dist.all_gather_tensor(answer.sum().reshape(1)).sum()
        nll = -(logp * answer).sum()
        return self.cfg.anchor_coef * nll / tokens, float(nll.detach() / answer.sum())

    # -- update ----------------------------------------------------------------------------------
    def _amp(self, device: torch.device):
        return torch.autocast(device.type, dtype=self.amp) if self.amp is not None else nullcontext()

    def _logprobs(self, model, batch: Batch, rows: slice, device: torch.device, want_logits: bool, entropy: bool,
                  recorded: bool = False):
        """Log-probs (and entropy, logits) of `rows`; `recorded`: on the rows' recorded projections
        where every row has them (the policy's first pass on a fresh batch: the weights are still the
        sampler's; rows built elsewhere, or already used once, have none and are recomputed)."""
        saved = [r.recorded for r in batch.rows[rows]]
        saved = saved if recorded and all(x is not None for x in saved) else None
        ids, am, pos = (x[rows].to(device) for x in (batch.input_ids, batch.attention_mask, batch.position_ids))
        first = int(am.any(0).long().argmax())  # left-pad columns no row of this minibatch uses (shorter prompts)
        ids, am, pos = ids[:, first:], am[:, first:], pos[:, first:]
        temp = self.cfg.sampling_for(batch.rows[rows.start].task, self.step)["temperature"]
        with self._amp(device):  # one prompt pass per group (the G rows share it): same numbers, less compute
            return token_logprobs(model, ids, am, pos, batch.n_completion, temperature=temp,
                                  return_entropy=entropy, return_logits=want_logits, group_size=self.cfg.group_size,
                                  entropy_grad=self.cfg.entropy_coef != 0,  # otherwise it is only logged
                                  grad_dtype=self.grad_dtype,  # no effect without autograd
                                  recorded=saved)

    def _packed(self, model):
        """No-grad passes run on packed weights (see gpt2_decode), except under autocast: it keeps its bf16."""
        return packed_projections(model) if self.amp is None else nullcontext()

    def _task_slices(self, batch: Batch) -> list[slice]:
        """Minibatches never mix tasks (the temperature may differ per task) and never split a group."""
        G = self.cfg.group_size
        mb = self.cfg.minibatch_size or len(batch.rows)
        mb = max(G, (mb // G) * G)
        out, start = [], 0
        while start < len(batch.rows):
            end = start
            while end < len(batch.rows) and end - start < mb and batch.rows[end].task == batch.rows[start].task:
                end += G
            out.append(slice(start, end))
            start = end
        return out

    def reference(self):
        """(model, context) of the frozen reference; with LoRA the policy with adapters switched off."""
        if self.ref is not None:
            return self.ref, nullcontext()
        return self.policy.get_base_model(), self.policy.disable_adapter()

    def update(self, batch: Batch, step: int, timings: dict) -> dict:
        cfg = self.cfg
        beta = self.kl_ctl.value(step) * self.beta_scale
        exact = cfg.kl_estimator == "exact"
        slices = self._task_slices(batch)
        t0 = time.time()
        ref_out: dict[int, dict] = {}
        if self.use_ref:
            ref, ref_ctx = self.reference()
            with torch.no_grad(), ref_ctx, self._packed(ref):
                for k, sl in enumerate(slices):
                    o = self._logprobs(ref, batch, sl, self.ref_device, exact, False)
                    ref_out[k] = {key: v.to(self.device) for key, v in o.items()}
        timings["reference"] = time.time() - t0
        t0 = time.time()
        old: dict[int, torch.Tensor] = {}
        if cfg.updates_per_batch > 1:
            with torch.no_grad(), self._packed(self.forward_model):
                for k, sl in enumerate(slices):
                    old[k] = self._logprobs(self.forward_model, batch, sl, self.device, False, False)["logprobs"]
        timings["old"] = time.time() - t0
        # Normalisers of the GLOBAL batch (all ranks): each rank's loss is then its exact share of the
        # one-process loss, and summing the gradients over ranks gives the one-process gradient.
        total_rows = len(batch.rows) * dist.world()  # ranks hold equal numbers of rows
        total_tokens = dist.all_gather_tensor(batch.completion_mask.sum().reshape(1)).sum()  # dapo
        # dr_grpo divides by the generation budget, a constant: each row's task's token limit at this step
        budget = torch.tensor([float(cfg.sampling_for(r.task, step)["max_new_tokens"]) for r in batch.rows],
                              device=self.device)
        metrics: dict[str, float] = {}
        timings["policy"] = timings["optimizer"] = 0.0
        anchor = self.anchor_batch() if self.anchor else None
        status = "ok"
        for epoch in range(cfg.updates_per_batch):
            t0 = time.time()
            self.opt.zero_grad(set_to_none=True)
            agg: dict[str, float] = {}
            finite = True
            for k, sl in enumerate(slices):
                o = self._logprobs(self.forward_model, batch, sl, self.device, exact, True,
                                   recorded=epoch == 0 and self.record)
                mask = batch.completion_mask[sl]
                kl = None
                if exact and self.use_ref:
                    kl = exact_kl(o["logits"], ref_out[k]["logits"]).clamp(max=cfg.kl_clamp)
                out = grpo_loss(o["logprobs"], old.get(k), ref_out.get(k, {}).get("logprobs"), batch.advantages[sl], mask,
                                beta=beta, kl_kind=cfg.kl_estimator if not exact else "k3", kl_clamp=cfg.kl_clamp,
                                eps_low=cfg.eps_low, eps_high=cfg.eps_high, loss_type=cfg.loss_type,
                                max_completion_length=budget[sl], entropy=o.get("entropy"),
                                entropy_coef=cfg.entropy_coef, num_items_in_batch=total_tokens, kl=kl,
                                level=cfg.importance_sampling_level, delta=cfg.clip_delta,
                                sampler_logp=batch.sampler_logp[sl], tis_cap=cfg.tis_cap)
                share = (sl.stop - sl.start) / total_rows
                loss = out.loss if cfg.loss_type == "dapo" else out.loss * share
                if not torch.isfinite(loss):
                    finite = False
                    break  # this rank still joins the gradient all-reduce below
                loss.backward()
                local_share = (sl.stop - sl.start) / len(batch.rows)  # metrics: means over this rank's rows,
                for key, v in out.metrics().items():                  # then over ranks (reduce_metrics)
                    if key.endswith("_max"):
                        agg[key] = max(agg.get(key, -math.inf), v)
                    elif key == "kl_min":
                        agg[key] = min(agg.get(key, math.inf), v)
                    elif cfg.loss_type == "dapo" and key in ("loss", "policy_loss", "kl_loss"):
                        # already divided by the global token count: the parts add up (x world: the
                        # reduction over ranks is a mean)
                        agg[key] = agg.get(key, 0.0) + v * dist.world()
                    else:
                        agg[key] = agg.get(key, 0.0) + v * local_share
                if epoch == 0:  # the sampler and the trainer must agree on log-probs
                    diff = (o["logprobs"].detach() - batch.sampler_logp[sl]).abs() * mask
                    agg["logp_sampler_diff"] = max(agg.get("logp_sampler_diff", 0.0), float(diff.max()))
                    agg["logp_sampler_diff_mean"] = (agg.get("logp_sampler_diff_mean", 0.0)
                                                     + float(diff.sum() / mask.sum().clamp(min=1)) * local_share)
            for r in batch.rows:  # (2 GB at 124M) only the first pass may use them: free them now
                r.recorded = None
            if anchor is not None and finite:
                loss, agg["anchor_nll"] = self.anchor_loss(anchor)
                finite = bool(torch.isfinite(loss))
                if finite:
                    loss.backward()
            dist.all_reduce_grads(list(self.policy.parameters()))  # sum over ranks; every rank, finite or not
            if not finite:
                agg["loss"] = float("nan")
            agg = dist.reduce_metrics(agg)  # a NaN on any rank is a NaN on all: the guards agree
            timings["policy"] += time.time() - t0
            t0 = time.time()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            status = self.nan_guard.check(agg.get("loss", float("nan")), grad_norm)
            if status != "ok":
                self.opt.zero_grad(set_to_none=True)
                agg["grad_norm"] = float("nan")
                metrics = {**agg, "nonfinite": 1.0}
                break
            lr = cfg.lr * self.lr_scale * cosine_lr(step, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)
            for g in self.opt.param_groups:
                g["lr"] = lr
            self.opt.step()
            timings["optimizer"] += time.time() - t0
            agg["grad_norm"] = float(grad_norm)
            agg["lr"] = lr
            metrics = agg if epoch == 0 else {**metrics, **{f"last_{k}": v for k, v in agg.items() if k in ("loss", "kl_mean", "clip_frac")}}
        metrics["beta"] = beta
        metrics["guard"] = status
        return metrics

    # -- loop --------------------------------------------------------------------------------------
    def evaluate(self) -> dict | None:
        """Greedy held-out evaluation. Under torchrun rank 0 evaluates (the weights are the same on
        every rank) while the others wait; every rank gets the result, so their states agree."""
        if self.eval_fn is None:
            return None
        res = None
        if self.main:
            t0 = time.time()
            res = self.eval_fn(self.sampler(), self.tokenizer)
            res["seconds"] = round(time.time() - t0, 1)
            res["step"] = self.step
        return dist.broadcast_object(res)

    def banner(self) -> str:
        lora = f"; LoRA r={self.cfg.lora_r} ({self.n_trainable / 1e6:.3f}M trainable)" if self.cfg.lora_r else ""
        lines = [f"rookworld-rlvr {__version__} (git {git_commit()}) GRPO",
                 f"policy {self.cfg.model}: {self.n_params / 1e6:.2f}M parameters on {self.device}{lora}"
                 f"{', bf16 autocast' if self.amp else ''}; reference {'off (beta 0, no KL guard)' if not self.use_ref else 'on ' + str(self.ref_device)}"
                 f"{' (beta 0: for the KL guard only)' if self.use_ref and self.cfg.kl_coef == 0 else ''}"
                 f"{' (the base with adapters disabled)' if self.cfg.lora_r and self.use_ref else ''}",
                 f"policy pass: forward {'bf16 autocast' if self.amp else 'float32'}, backward products {self.grad_note}; "
                 f"forward projections {self.record_note}",
                 "config:"]
        lines += [f"  {k}: {json.dumps(v)}" for k, v in self.cfg.to_dict().items()]
        return "\n".join(lines)

    def train_step(self) -> dict | None:
        """One GRPO step: collect, score, update, controllers, guards. Returns the step's metrics
        record, or None when a guard rolled back (the caller just continues from the restored step)."""
        cfg = self.cfg
        self.snapshot()
        phase = self._phase(self.step)
        if phase != self.phase_key:
            if self.phase_key is not None:
                self.guard.reset_history()
            self.phase_key = phase
        step = self.step
        t_step = time.time()
        timings: dict[str, float] = {}
        batch = self.assemble(self.collect(step, timings))
        m = self.update(batch, step, timings)
        status = m.pop("guard")
        if status == "stop":
            self._event(GuardEvent("stop", "nonfinite", math.nan, None, math.nan, step + 1, step + 1,
                                   self.nan_guard.rollbacks, self.nan_guard.message))
            raise TrainingStopped(self.nan_guard.message)
        if status == "rollback":  # skipped steps left the weights alone: go back to before the streak's first step
            target = self.rollback("non-finite loss or gradient", max(step + 1 - cfg.nan_max_consecutive - 1, 0))
            self._event(GuardEvent("recover", "nonfinite", math.nan, None, math.nan, step + 1, step + 1,
                                   self.nan_guard.rollbacks, f"non-finite loss or gradient at step {step + 1}: "
                                   f"rollback {self.nan_guard.rollbacks}/{self.nan_guard.max_rollbacks}"),
                        to_step=target, lr_scale=self.lr_scale, beta_scale=self.beta_scale)
            return None
        if self.use_ref:
            self.kl_ctl.update(m.get("kl_mean", 0.0))
        self.step += 1
        if cfg.ref_refresh_every and self.ref is not None and self.step % cfg.ref_refresh_every == 0:
            self._refresh_reference()
        record = self._record(step, batch, m, timings, time.time() - t_step)
        if "nonfinite" not in record:  # a skipped step says nothing about collapse
            event = self.guard.observe(record["step"], record)
            if event is not None:
                self._act(event)
                return None
        record["guard/recoveries"] = self.guard.recoveries
        return record

    def train(self, writer=None) -> dict:
        cfg = self.cfg
        self.log(self.banner())
        if self.main:  # under torchrun rank 0 writes every file of the run directory
            cfg.save(self.run_dir / "config.yaml")
        if self.base_eval is None:
            self.base_eval = self.evaluate()
            if self.base_eval:
                self.history_eval.append(self.base_eval)
                if self.main:
                    _append(self.run_dir / "eval.jsonl", self.base_eval)
                self.best = (_eval_score(self.base_eval), 0)
        if dist.broadcast_object(ckpt.latest_checkpoint(self.run_dir) is None):  # rank 0's view: it writes them
            self.save()  # the first good state: rollbacks need one
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=self.step, disable=not cfg.progress or not self.main, desc="grpo",
                   dynamic_ncols=True)
        while self.step < cfg.steps:
            record = self.train_step()
            if record is None:  # a guard rolled back: the steps since the restored state are redone
                bar.n = self.step
                bar.set_postfix(recovered=self.guard.recoveries, lr_scale=f"{self.lr_scale:.3g}")
                continue
            for w in self.monitor.observe(record["step"] - 1, record):  # the same record on every rank
                if self.main:
                    bar.write(f"warning: {w}")
            if self.main:
                _append(self.run_dir / "metrics.jsonl", record)
                if writer is not None:
                    writer(record)
            bar.update()
            bar.set_postfix(reward=f"{record['reward/mean']:.3f}", kl=f"{record.get('kl_mean', 0):.4f}",
                            s=f"{record['time/step']:.1f}", **({"recovered": self.guard.recoveries}
                                                              if self.guard.recoveries else {}))
            last = self.step >= cfg.steps
            new_best = False
            if (cfg.eval_every and self.step % cfg.eval_every == 0) or last:
                res = self.evaluate()
                if res:
                    score = _eval_score(res)
                    event = self.guard.observe_eval(self.step, score, self.best[0]) if self.best else None
                    if event is not None:  # back to the best evaluation's state (saved when it was the best)
                        self._act(event)
                        bar.n = self.step
                        bar.refresh()
                        continue
                    self.history_eval.append(res)
                    if self.main:
                        _append(self.run_dir / "eval.jsonl", res)
                    if self.best is None or score > self.best[0]:
                        self.best, new_best = (score, self.step), True
            if self.step % cfg.save_every == 0 or last or (new_best and cfg.guard_eval_drop is not None):
                self.save()
        bar.close()
        events = self.run_dir / "events.jsonl"
        summary = {"base": self.base_eval, "final": self.history_eval[-1] if self.history_eval else None,
                   "best_step": self.best[1] if self.best else None, "steps": self.step,
                   "guard": {"recoveries": self.guard.recoveries, "nan_rollbacks": self.nan_guard.rollbacks,
                             "events": len(events.read_text().splitlines()) if self.main and events.exists() else 0}}
        if self.main:
            from rookworld_rlvr.data.io import atomic_write_text
            from rookworld_rlvr.model import save_pretrained_atomic

            save_pretrained_atomic(self.sampler(), self.tokenizer, self.run_dir / "final")
            atomic_write_text(self.run_dir / "summary.json", [json.dumps(summary, indent=2)])
        dist.barrier()  # nobody reports "done" before the final model is written
        return summary

    def _refresh_reference(self) -> None:
        a = self.cfg.ref_mix_alpha
        with torch.no_grad():
            for r, p in zip(self.ref.parameters(), self.policy.parameters()):
                r.copy_(p.to(r.device) if a == 0 else a * p.to(r.device) + (1 - a) * r)

    def _record(self, step: int, batch: Batch, m: dict, timings: dict, seconds: float) -> dict:
        rows = batch.rows
        rec: dict[str, Any] = {"step": step + 1}
        rec.update({k: v for k, v in m.items() if isinstance(v, (int, float))})
        if not self.use_ref:  # beta 0 and no threshold: no reference pass, so KL is not measured (not 0)
            for k in ("kl_mean", "kl_max", "kl_min", "kl_loss"):
                rec.pop(k, None)
        rec["reward/mean"] = float(batch.rewards.mean())
        G = self.cfg.group_size
        flat = zero_variance_groups(batch.rewards, G)
        rec["zero_var_share"] = float(flat.float().mean())
        rec.update(self.collect_stats)  # what the sampler drew: all of it, and dynamic sampling's cost
        rec["adv/mean"], rec["adv/std"] = float(batch.advantages.mean()), float(batch.advantages.std())
        rec["adv/min"], rec["adv/max"] = float(batch.advantages.min()), float(batch.advantages.max())
        lengths = [len(r.completion_ids) for r in rows]  # what was sampled (truncated_completions mask hides some)
        rec["completion_len/mean"], rec["completion_len/max"] = sum(lengths) / len(lengths), float(max(lengths))
        rec["truncation_rate"] = sum(r.finish == "length" for r in rows) / len(rows)
        for task in ("P", "A"):
            tr = [r for r in rows if r.task == task]
            if not tr:
                continue
            rec[f"reward/{task}"] = sum(r.reward for r in tr) / len(tr)
            rec[f"valid/{task}"] = sum(r.valid for r in tr) / len(tr)
            for comp in tr[0].components:
                rec[f"reward/{task}/{comp}"] = sum(r.components.get(comp, 0.0) for r in tr) / len(tr)
        rec["beta"] = m.get("beta", 0.0)
        rec["kl_share"] = m.get("kl_share", 0.0)
        rec["reward_mean"] = rec["reward/mean"]
        rec["truncation"] = rec["truncation_rate"]
        for k, v in timings.items():
            rec[f"time/{k}"] = round(v, 4)
        rec["time/step"] = round(seconds, 3)
        rec["time/other"] = round(seconds - sum(timings.values()), 4)
        return dist.reduce_metrics(rec)  # one record for the whole global batch, the same on every rank


def _flat(group: list[Row]) -> bool:
    return max(r.reward for r in group) - min(r.reward for r in group) < 1e-8


def _eval_score(res: dict) -> float:
    vals = [res[t]["mean_reward"] for t in ("policy", "environment") if res.get(t, {}).get("n")]
    return sum(vals) / len(vals) if vals else 0.0


def _append(path: Path, record: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record, default=float) + "\n")
