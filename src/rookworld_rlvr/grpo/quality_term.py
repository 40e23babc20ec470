"""The legal-conditional quality advantage: "play the better legal move", apart from "be legal".

On the P: task an illegal B: move scores far below any legal one, so most of a group's reward
spread is legal against illegal (scripts/reward_spread.py: 79.5% of the within-group variance on
configs/default.yaml) and the group-normalised advantage mostly says "be legal". This term adds,
for each legal sample, its `quality` component minus the mean quality of the legal samples of
its group (0 for illegal samples and for groups with fewer than two legal ones):

    A_i += quality_advantage * (q_i - mean_{j legal in group} q_j)      (i legal)

Its expected policy gradient is E[max(n_legal - 1, 0)] * grad E[quality | legal] exactly (n_legal:
the legal samples in a group; tests/test_quality_term.py enumerates it): it follows the move
quality among legal moves, whatever share of the group is illegal. Centred, not divided by a std,
so groups whose legal moves are nearly equal add nearly nothing rather than amplified noise.

Owns that term. Imports torch only: nothing of the model, the trainer or chess.
"""

from __future__ import annotations

import torch
from torch import Tensor


def legal_position_move(components: dict[str, float]) -> bool:
    """A P: position's sample (it has a quality; puzzles and A: rows do not) whose B: move is legal."""
    return "quality" in components and components.get("best_legal") == 1.0


def legal_quality_advantages(quality: Tensor, legal: Tensor, group_size: int) -> Tensor:
    """[N] quality centred on the mean of the legal rows of its group; 0 where not legal, and in
    groups with fewer than two legal rows. `quality` [N] float, `legal` [N] bool, groups contiguous."""
    if quality.numel() % group_size:
        raise ValueError(f"{quality.numel()} rows do not split into groups of {group_size}")
    q = quality.double().reshape(-1, group_size)
    m = legal.reshape(-1, group_size)
    n = m.sum(dim=1, keepdim=True)
    mean = torch.where(m, q, torch.zeros_like(q)).sum(dim=1, keepdim=True) / n.clamp(min=1)
    term = torch.where(m & (n >= 2), q - mean, torch.zeros_like(q))
    return term.reshape(-1).float()
