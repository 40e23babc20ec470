"""Reward scoring throughput: cold engine, warm cache, and an engine started per call (as upstream did).

    python benchmarks/rewards.py [--n 64] [--depth 8] [--workers 2]

Scores N P: completions whose best moves are legal but outside the sample's top 5, so every
score needs a Stockfish search (the expensive case); prints completions per second.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import chess
import chess.engine

from rookworld_rlvr.data.io import read_samples
from rookworld_rlvr.engine import EngineConfig, StockfishPool, find_stockfish, score_to_pawns
from rookworld_rlvr.tasks import policy as P
from rookworld_rlvr.tasks.rewards import RewardScorer


def workload(n: int, seed: int = 0) -> tuple[list[str], list[str], list]:
    rng = random.Random(seed)
    samples = [s for s in read_samples("data/eval.jsonl.gz") if s.task == "P"]
    prompts, completions, truths = [], [], []
    for s in samples:
        outside = [m.uci() for m in chess.Board(s.fen).legal_moves if m.uci() not in s.truth.moves]
        if not outside:
            continue
        best = rng.choice(outside)
        prompts.append(P.prompt(s.fen))
        completions.append(P.completion(s.truth).rsplit("B:", 1)[0] + f"B: {best}")
        truths.append(s.truth)
        if len(prompts) == n:
            break
    return prompts, completions, truths


def per_call_engine(prompts, completions, truths, depth: int) -> float:
    """Upstream style: a new Stockfish process for every evaluation."""
    path = find_stockfish()
    t0 = time.perf_counter()
    for c, t in zip(completions, truths):
        move = P.parse_completion(c).best
        board = chess.Board(t.fen)
        board.push_uci(move)
        with chess.engine.SimpleEngine.popen_uci(path) as eng:
            info = eng.analyse(board, chess.engine.Limit(depth=depth))
            score_to_pawns(info["score"].relative)
    return len(completions) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    prompts, completions, truths = workload(args.n)
    with tempfile.TemporaryDirectory() as tmp:
        with StockfishPool(EngineConfig(depth=args.depth, workers=args.workers, cache_path=f"{tmp}/c.sqlite")) as pool:
            scorer = RewardScorer(engine=pool)
            t0 = time.perf_counter()
            scorer.score_batch(prompts, completions, truths)
            cold = len(prompts) / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            scorer.score_batch(prompts, completions, truths)
            warm = len(prompts) / (time.perf_counter() - t0)
        with StockfishPool(EngineConfig(depth=args.depth, workers=args.workers, cache_path=f"{tmp}/c.sqlite")) as pool:
            t0 = time.perf_counter()
            RewardScorer(engine=pool).score_batch(prompts, completions, truths)
            disk = len(prompts) / (time.perf_counter() - t0)
    per_call = per_call_engine(prompts, completions, truths, args.depth)
    truthful = [P.completion(t) for t in truths]
    t0 = time.perf_counter()
    RewardScorer().score_batch(prompts, truthful, truths)
    carried = len(prompts) / (time.perf_counter() - t0)
    print(f"{len(prompts)} P: completions needing a search, depth {args.depth}, {args.workers} engines")
    print(f"engine per call (upstream): {per_call:9.1f} completions/s")
    print(f"pool, cold cache:           {cold:9.1f} completions/s  ({cold / per_call:.1f}x)")
    print(f"pool, warm memory cache:    {warm:9.1f} completions/s  ({warm / per_call:.0f}x)")
    print(f"new pool, SQLite cache:     {disk:9.1f} completions/s  ({disk / per_call:.0f}x)")
    print(f"answer in the sample truth: {carried:9.1f} completions/s  (no engine needed)")


if __name__ == "__main__":
    main()
