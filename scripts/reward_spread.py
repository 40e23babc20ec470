"""Which reward components the GRPO advantage follows on real batches (no training: about a minute).

    python scripts/reward_spread.py                          # configs/default.yaml, 16 batches
    python scripts/reward_spread.py --batches 32 --config configs/stable.yaml

Samples batches as step 0 of `rookworld train` does (the preset's model, data, sampling and
rewards), keeps the P: position groups (puzzles have one component) and splits each group's
reward variance exactly among the weighted components: a component's share is
sum_groups cov(w_k * c_k, r) / sum_groups var(r), so the shares add up to 1. It does this over
whole groups and again over the legal samples of each group alone, and splits each group's
variance into legal-against-illegal and within each side. A large `best_legal`/legal-against-
illegal share means the advantage mostly says "be legal"; the `quality` share among legal
samples is what is left to say "play the better move". Last, the mean quality of the sampled legal
moves beside chance's figure for reward/P/quality_legal: what a uniformly random legal move earns on
the same prompts, scored by the run's reward (moves outside a truth's candidates judged by the run's
Stockfish), and on the judged held-out positions (--strength). They differ where a run's prompts are
of one kind: in check few moves are legal and most of them hold (make train's: about 0.9 against
0.67), so a run's quality_legal is read against the first.
"""

from __future__ import annotations

import argparse
import statistics

from step0_batches import sampled_groups

from rookworld_rlvr.data.judged import read_judged
from rookworld_rlvr.tasks import strength
from rookworld_rlvr.tasks.rewards import move_quality


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def shares(groups: list[list[tuple[float, dict[str, float]]]], weights: dict[str, float]) -> tuple[dict[str, float], float]:
    """Each weighted component's share of the summed within-group reward variance, and that variance."""
    cov = {k: 0.0 for k in weights}
    var = 0.0
    total_w = sum(weights.values())
    for g in groups:
        if len(g) < 2:
            continue
        r = [x for x, _ in g]
        mr = _mean(r)
        var += sum((x - mr) ** 2 for x in r)
        for k, w in weights.items():
            c = [w / total_w * comps.get(k, 0.0) for _, comps in g]
            mc = _mean(c)
            cov[k] += sum((ci - mc) * (ri - mr) for ci, ri in zip(c, r))
    return ({k: v / var for k, v in cov.items()} if var > 0 else {k: 0.0 for k in cov}), var


def legality_split(groups: list[list[tuple[float, dict[str, float]]]]) -> tuple[float, float, float]:
    """Shares of the within-group variance: legal against illegal, among legal, among illegal."""
    between = legal = illegal = 0.0
    for g in groups:
        r = [x for x, _ in g]
        mr = _mean(r)
        for side, acc in ((1.0, "legal"), (0.0, "illegal")):
            part = [x for x, c in g if c.get("best_legal", 0.0) == side]
            if not part:
                continue
            mp = _mean(part)
            between += len(part) * (mp - mr) ** 2
            within = sum((x - mp) ** 2 for x in part)
            if acc == "legal":
                legal += within
            else:
                illegal += within
    total = between + legal + illegal
    return (between / total, legal / total, illegal / total) if total > 0 else (0.0, 0.0, 0.0)


def random_mover_quality(path: str, quality_scale: float) -> float:
    """The mean `quality` a uniformly random legal move earns on judged positions (every legal move's
    eval: `rookworld data judge`), scored as the reward scores it: what chance gives reward/P/quality_legal."""
    per_position = []
    for pos in read_judged(path):
        per_position.append(statistics.fmean(
            1.0 if e == pos.best_eval or strength.mates(pos.fen, m) else move_quality(pos.best_eval, e, quality_scale)
            for m, e in pos.evals.items()))
    return statistics.fmean(per_position)


def random_mover_quality_on(cfg, prompts: dict) -> float:
    """Per position (`prompts`: prompt -> truth), the mean `quality` the run's reward gives each legal B: move,
    averaged over the positions: chance's reward/P/quality_legal on the run's own prompts."""
    from rookworld_rlvr.engine import EngineConfig, StockfishPool
    from rookworld_rlvr.tasks.rewards import RewardScorer

    per_position = []
    with StockfishPool(EngineConfig(depth=cfg.engine_depth, workers=cfg.engine_workers,
                                    cache_path=cfg.engine_cache)) as pool:
        scorer = RewardScorer(cfg.reward_config(), engine=pool)
        for prompt, truth in prompts.items():
            moves = sorted(strength.legal_moves(truth.fen))
            results = scorer.score_batch([prompt] * len(moves), [f"M: {m} E: 0.0 B: {m}" for m in moves],
                                         [truth] * len(moves))
            per_position.append(statistics.fmean(r.components["quality"] for r in results))
    return statistics.fmean(per_position)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strength", default="data/strength.jsonl.gz",
                    help="judged positions for the random mover's quality ('' = skip)")
    args = ap.parse_args()
    cfg, sampled = sampled_groups(args.config, args.batches, args.seed)
    policy_groups = [g for g in sampled if g[0].task == "P" and "quality" in g[0].components]
    groups = [[(x.reward, x.components) for x in g] for g in policy_groups]
    weights = dict(cfg.policy_weights)
    samples = [x for g in groups for x in g]
    n_legal = sum(c.get("best_legal", 0.0) == 1.0 for _, c in samples)
    print(f"{args.config}: {len(groups)} P: position groups of {cfg.group_size}, "
          f"{n_legal / len(samples):.1%} of the sampled B: moves legal")
    whole, var_all = shares(groups, weights)
    legal_groups = [[x for x in g if x[1].get("best_legal", 0.0) == 1.0] for g in groups]
    among, var_legal = shares(legal_groups, weights)
    between, within_legal, within_illegal = legality_split(groups)
    print(f"within-group reward variance: {between:.1%} legal against illegal, {within_legal:.1%} among legal "
          f"samples, {within_illegal:.1%} among illegal ones")
    print(f"{'component':>10} {'weight':>7} {'share (all samples)':>20} {'share (legal samples)':>22}")
    for k in weights:
        print(f"{k:>10} {weights[k]:>7g} {whole[k]:>20.1%} {among[k]:>22.1%}")
    print(f"summed squared deviations from the group means: all samples {var_all:.3f}, legal ones {var_legal:.3f}")
    q_sd = sorted(statistics.stdev(c["quality"] for _, c in g) for g in legal_groups if len(g) >= 2)
    if q_sd:  # what quality_advantage multiplies: pick it against the group-normalised advantage's std of 1
        print(f"quality among a group's legal samples: std median {statistics.median(q_sd):.3f}, "
              f"90th percentile {q_sd[len(q_sd) * 9 // 10]:.3f} ({len(q_sd)} groups with 2 or more legal samples)")

    q = statistics.fmean(c["quality"] for g in groups for _, c in g if c.get("best_legal") == 1.0)
    prompts = {g[0].prompt: g[0].truth for g in policy_groups}
    print(f"quality of the sampled legal moves {q:.3f}; of a uniformly random legal move on the same "
          f"{len(prompts)} positions {random_mover_quality_on(cfg, prompts):.3f}" + (
              f", on {args.strength} {random_mover_quality(args.strength, cfg.reward_config().quality_scale):.3f}"
              if args.strength else ""))


if __name__ == "__main__":
    main()
