"""`rookworld sft`'s command line: one flag per `SFTConfig` field, with the help a user needs. Under
`torchrun --nproc_per_node N -m rookworld_rlvr sft ...` the N processes train one run together.

Owns the flags and their help text; the training itself is `sft.train`. Imports `sft`, which
imports torch inside functions only, so `rookworld sft --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import asdict

from rookworld_rlvr.cli_args import DEVICE_HELP, warn_without_effect
from rookworld_rlvr.sft import SFTConfig, train

_HELP = {
    "data": "training samples, P: and A: (JSONL, .gz or .xz, as `rookworld data` writes them). Default "
            "data/train.jsonl.xz",
    "out": "where the trained model is saved (Hugging Face format); its checkpoint is OUT.checkpoint and its log "
           "OUT.sft_log.jsonl beside it. Default runs/sft/model",
    "loss_on": "the tokens the loss is taken on: full (prompt and answer) or completion (the answer alone). "
               "Default full",
    "steps": "optimizer steps of the run (the lr schedule's length). Default 3000",
    "batch_size": "rows per step, over all processes under torchrun. Default 64",
    "lr": "peak learning rate (AdamW), reached after --warmup-steps, then a cosine down to lr x --min-lr-ratio at "
          "--steps. Default 1e-3",
    "min_lr_ratio": "where the cosine ends, as a share of --lr (0 to 1). Default 0.1",
    "warmup_steps": "steps of linear lr warm-up from the start. Default 100",
    "dropout": "dropout of every layer while training (saved with the model; 0 for the tiny models: they under-fit, "
               "and CPU attention runs about 4x slower with dropout). Default 0",
    "eval_every": "held-out evaluation (--eval-data) every N steps, and at the end. Default 500",
    "eval_samples": "samples per task whose greedy answers each evaluation scores (0 = the held-out loss alone). "
                    "Default 200",
    "save_every": "checkpoint every N steps, and at the end. Default 500",
    "seed": "seed of the model's initial weights and the batches drawn. Default 0",
    "device": f"{DEVICE_HELP}; under torchrun each rank its own GPU. Default auto",
    "threads": "torch threads of this process (default: torch's own, one per core); give two jobs on one "
               "machine their share",
    "tokenizer": "char (one token per character), square (plus one token per square inside UCI moves) or board "
                 "(square, and FEN boards written square by square); fresh models only, default board",
    "distinct_coef": "weight of the unlikelihood of writing an M: move twice (0 = plain likelihood)",
    "own_repeats": "P: rows per step the model answers greedily; the moves it repeats there are pushed down "
                   "(with distinct_coef; 0 = off)",
    "own_targets": "weight of the correction where the model repeats a move: the best true candidate it has not "
                   "listed yet, learned in its own context (DAgger); 0 = the ban alone",
    "legal_coef": "weight of the legality loss: at each token of a P: move, -log p(a token that continues a legal "
                  "move not yet listed); 0 = off. On rookworld-board it raised legal moves and lowered their "
                  "quality (models/README.md)",
    "order": "P: candidates in the target: best-first (by eval; greedy decoding then writes distinct moves) "
             "or given (as stored; upstream shuffled them)",
    "autocast": "none, bf16 or auto (bf16 where the hardware does it well: CUDA, or a CPU with AMX; elsewhere "
                "bf16 on a CPU can be many times slower than float32)",
    "eval_data": "held-out samples, evaluated every eval_every steps (default: data/eval.jsonl.gz; '' = none)",
    "preset": "shape of a fresh model: tiny (6 x 256, 4.9M parameters), small (8 x 384, 14M), wide (6 x 512, 19M) "
              "or gpt2-124m",
    "init": "continue from this model directory (with its own tokenizer) instead of a fresh model",
    "cooldown_steps": "the last N steps of --steps take the lr linearly down to zero (0 = off); on a resume, "
                      "--steps S --cooldown-steps N with S - N at the checkpoint's step ends a run on a cooldown",
    "max_minutes": "the whole run's wall-clock budget in minutes, counted over resumes; the lr schedule follows "
                   "it (the run ends on its decay when the time is up)",
    "stop_after_minutes": "end this invocation after so many minutes, with the checkpoint saved; the lr schedule "
                          "still follows --steps, so --resume later continues the same run",
    "stop_when": "end this invocation, with the checkpoint saved, once this file exists (say, when another "
                 "process has prepared more data); --resume, with that data, continues the same run",
    "rows_cache": "a file that keeps the rows read and encoded from --data: a resume or a later run with the same "
                  "data and encoding reads them in seconds; other data or settings encode afresh and replace it",
    "encode_only": "read and encode --data into --rows-cache, then stop (prepare the rows on the CPU while another "
                   "run trains)",
    "env_share": "share of each batch drawn from the A: (environment) rows, the rest P: (policy) rows; the "
                 "step's log counts them (A_rows). Default 0.5",
    "step_timeout_minutes": "under torchrun: how long a rank waits for the others at a step or an evaluation; a "
                            "rank that hangs then ends the run (torchrun stops the rest) instead of holding every "
                            "device. Rank 0's saves are waited for 15 minutes. Default 10",
    "grad_clip": "clip the gradient's norm to this before each step (the log's grad_norm is before clipping); "
                 "0 = no clipping. Default 1",
    "weight_decay": "AdamW's decoupled weight decay of the weight matrices (not biases or layer norms). Default 0.1",
    "n_positions": "the context of a fresh model in tokens (its position embeddings); every training row must "
                   "fit it. Default 320",
    "layout": "how P: samples are written: compact (single spaces) or padded (upstream RookWorld's: the FEN, moves "
              "and evals padded with spaces to fixed widths). Default compact",
    "profile_steps": "profile so many steps with torch.profiler (after --profile-after steps of this invocation, "
                     "and one more that warms the profiler up) and write the operators by time and by calls to "
                     "OUT.profile.txt, with the seconds a step and, on a GPU, the share of them the device was busy; "
                     "0 = off. Default 0",
    "profile_after": "steps of each invocation (a resume too) before the profiled ones: CUDA's start and the "
                     "allocator's warm-up. Default 20",
    "tensorboard": "write each step's log record (loss, lr, grad norm; the held-out figures at each evaluation) as "
                   "TensorBoard events into OUT.tb beside the model (tensorboard --logdir OUT.tb); a resume hides "
                   "the steps it redoes. Needs the tensorboard package (the report extra)",
    "wandb": "log each step's record to a Weights & Biases run named as OUT (project rookworld-rlvr; a login, or "
             "WANDB_MODE=offline); its files and id in OUT.wandb beside the model, so that a resume goes on in the "
             "same run. Needs the wandb package (the wandb extra)",
    "grow_layers": "deepen the --init model to this many blocks first: each new block copies the one before it "
                   "with its output projections at zero, so training starts from the init model's exact outputs "
                   "(0 = keep its depth)",
}


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    defaults = SFTConfig()
    for field, value in asdict(defaults).items():
        flag = "--" + field.replace("_", "-")
        untyped = {"max_minutes": float, "stop_after_minutes": float, "threads": int}  # default None
        if isinstance(value, bool):
            p.add_argument(flag, action="store_true", help=_HELP[field])
            continue
        kind = type(value) if value is not None else untyped.get(field, str)
        p.add_argument(flag, type=kind, default=value, help=_HELP[field])
    p.add_argument("--resume", action="store_true", help="continue from OUT.checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace, name: str) -> int:
    fields = asdict(SFTConfig())
    cfg = SFTConfig(**{k: getattr(args, k) for k in fields})
    from rookworld_rlvr.hostmem import for_device
    from rookworld_rlvr.model import resolve_device

    from rookworld_rlvr.atomic import SaveError, refused_write
    from rookworld_rlvr.grpo import distributed as dist
    from rookworld_rlvr.interrupt import StopOnSignal
    from rookworld_rlvr.oom import OutOfMemory, is_out_of_memory
    from rookworld_rlvr.runlock import one_run_in

    cfg.validate()
    with dist.joined(cfg.device, cfg.step_timeout_minutes):  # under torchrun: the ranks train one run
        note = for_device(resolve_device(cfg.device))  # process-wide: the command applies it, not the library
        if note and dist.is_main():
            print(f"sft: {note}")
        if dist.is_main():
            warn_without_effect(cfg.inert_settings(), prefix="sft: ")
        # rank 0 writes, and holds --out for the run (--encode-only writes only the rows cache: it runs beside one)
        mine = dist.is_main() and not cfg.encode_only
        holding = one_run_in(cfg.out, "--out") if mine else contextlib.nullcontext()
        with holding, StopOnSignal(verbose=dist.is_main()) as stop:  # Ctrl-C, SIGTERM, SIGHUP: saved after the step
            try:
                with contextlib.ExitStack() as closing:  # a run that raises ends its sinks (a wandb run: failed)
                    train(cfg, resume=args.resume, progress=not args.quiet, interrupt=stop, closing=closing)
            except OSError as e:  # a full disk: the checkpoint saved before stands
                kept = cfg.checkpoint_dir()
                if not refused_write(e) or not kept.is_dir():
                    raise
                raise SaveError(f"{e}; once there is room, the same command with --resume continues from {kept}") from e
            except Exception as e:
                if not is_out_of_memory(e):
                    raise
                kept = cfg.checkpoint_dir()
                raise OutOfMemory(e, f"a smaller --batch-size needs less (rows a step, over all processes: now "
                                     f"{cfg.batch_size}; fewer rows a step also change what each step learns)",
                                  run=True, checkpoint=kept if kept.is_dir() else None) from e
    return 128 + stop.asked if stop.asked else 0
