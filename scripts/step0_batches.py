"""The scored groups that the first steps of `rookworld train` would sample, without training.

Shared by scripts/std_floor_effect.py and scripts/reward_spread.py: the preset's model, data,
sampling and rewards, a throwaway output directory and no evaluation. Imports the trainer's
`build`; owns nothing else.
"""

from __future__ import annotations

import tempfile

from rookworld_rlvr.config import TrainConfig, load_config
from rookworld_rlvr.grpo.cli import build


def sampled_groups(config: str, batches: int, seed: int) -> tuple[TrainConfig, list[list]]:
    """(the configuration, every group of `batches` steps' batches, scored; rollout.Row lists)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(config, {"output_dir": tmp, "eval_data": "", "seed": seed, "progress": False,
                                   "tensorboard": False, "report": False})
        trainer, pool = build(cfg, log=lambda *_: None)
        try:
            return cfg, [g for step in range(batches) for g in trainer.collect(step, {})]
        finally:
            pool.close()
