"""Which training prompts come next: per-pool shuffled cursors, resumable and the same on every rank.

Owns the order of the training data (P:, P: positions in check, A:, game-ending A: transitions,
puzzles) and its resume state. Imports no torch; its samples are `data.io.Sample`s, read only for
their task and truth (`tasks.strength.in_check` tells a position in check).
"""

from __future__ import annotations

import copy
import math
import random

from rookworld_rlvr.data.io import can_fork, forked_map
from rookworld_rlvr.interrupt import pool_size
from rookworld_rlvr.tasks.strength import in_check


def split_tasks(samples) -> dict[str, list]:
    """The samples' P: and A: rows apart, each in file order."""
    return {t: [s for s in samples if s.task == t] for t in ("P", "A")}


def check_given(cfg, puzzles: list | None, anchor_samples: list | None) -> None:
    """The rows of a file the config names that a caller of `Trainer` must pass (`grpo.cli.build` reads them):
    not given, an error that says so, never the training data in their place nor a draw from nothing."""
    if cfg.anchor_coef and cfg.anchor_data and anchor_samples is None:
        raise ValueError(f"config field 'anchor_data' is {cfg.anchor_data}: pass its samples as anchor_samples "
                         "(grpo.cli.build reads them)")
    if cfg.mix_puzzle_ratio > 0 and cfg.puzzle_data and puzzles is None:
        raise ValueError(f"config field 'puzzle_data' is {cfg.puzzle_data}: pass its puzzles as puzzles, e.g. "
                         "[Sample('P', p) for p in data.judged.read_puzzles(path)] (grpo.cli.build reads them), or "
                         "set mix_puzzle_ratio 0")


def in_check_flags(samples, workers: int | None = None) -> list[bool]:
    """Whether each P: sample's position is in check, in order. python-chess parses each FEN (about 35 us),
    so a GPU base's million positions (`check_share` and the anchor's `out_of_check` each ask) are spread
    over `workers` forked processes (default: `interrupt.pool_size()`, the cores it may use, at most 16), as
    `read_samples` spreads its rows."""
    fens = [s.truth.fen for s in samples]
    workers = workers or pool_size()
    return forked_map(in_check, fens, workers) if can_fork(workers, len(fens)) else [in_check(f) for f in fens]


def out_of_check(samples) -> list:
    """The P: samples whose position is not in check, in order."""
    return [s for s, check in zip(samples, in_check_flags(samples)) if not check]


def ends_game(sample) -> bool:
    """An A: sample whose transition ends the game (terminated or truncated)."""
    return sample.task == "A" and (sample.truth.terminated or sample.truth.truncated)


class PromptSampler:
    """Per-pool shuffled cursors over the training samples; resumable from (epoch, cursor).

    With `terminal_share` s set, A: prompts come from two pools, ordinary and game-ending
    transitions (8.6% of the shipped A: data): the k-th A: prompt of the run is game-ending
    when floor(k * s) steps up, so exactly that share of A: prompts ends a game,
    deterministically on every rank and across resumes. `puzzle_share` does the same for P:
    prompts drawn from the `P_puzzle` pool, and `check_share` for the other P: prompts drawn from
    the training positions in check (`P_check`), where a base plays most of its illegal moves.
    """

    def __init__(self, samples_by_task: dict[str, list], seed: int, terminal_share: float | None = None,
                 puzzle_share: float = 0.0, check_share: float | None = None) -> None:
        self.pools = dict(samples_by_task)
        self.seed = seed
        self.terminal_share = terminal_share
        self.puzzle_share = puzzle_share
        self.check_share = check_share
        if check_share is not None:
            self._split("P", "P_check", check_share, in_check_flags,
                        f"check_share is {check_share} but no P: position of the training data is in check: set it "
                        "to null", f"check_share is {check_share} but every P: position of the training data is in "
                        "check: set it to 1 or null")
        if puzzle_share > 0 and not self.pools.get("P_puzzle"):
            raise ValueError(f"mix_puzzle_ratio is {puzzle_share} but there are no training puzzles: set puzzle_data")
        if terminal_share is not None:
            self._split("A", "A_end", terminal_share, lambda rows: [ends_game(x) for x in rows],
                        f"env_terminal_share is {terminal_share} but the training data has no game-ending A: "
                        "transitions (terminated or truncated): set it to null",
                        f"env_terminal_share is {terminal_share} but every A: transition of the training data ends "
                        "the game: set it to 1 or null")
        self.state = {name: {"epoch": 0, "cursor": 0} for name in self.pools}
        if terminal_share is not None:
            self.state["A"]["drawn"] = 0  # A: prompts drawn so far
        if puzzle_share > 0:
            self.state.setdefault("P", {"epoch": 0, "cursor": 0})["drawn"] = 0
        if check_share is not None:
            self.state.setdefault("P", {"epoch": 0, "cursor": 0})["drawn_positions"] = 0  # P: draws past puzzles
        self._perm: dict[str, tuple[int, list[int]]] = {}

    def _split(self, task: str, other: str, share: float, belongs, if_none: str, if_all: str) -> None:
        """Move the samples of `task` for which `belongs` (rows -> a flag each) holds into pool `other`;
        a share that needs a pool left empty is a ValueError (`if_none`: none belongs; `if_all`: all do)."""
        rows = self.pools.get(task, [])
        flags = belongs(rows)
        self.pools[task] = [x for x, f in zip(rows, flags) if not f]
        self.pools[other] = [x for x, f in zip(rows, flags) if f]
        if rows and share > 0 and not self.pools[other]:
            raise ValueError(if_none)
        if rows and share < 1 and not self.pools[task]:
            raise ValueError(if_all)

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

    @staticmethod
    def _steps_up(k: int, share: float) -> bool:
        """Whether the k-th draw (0-based) is one of the `share` taken from the other pool."""
        return math.floor((k + 1) * share + 1e-9) > math.floor(k * share + 1e-9)

    def _pool(self, task: str) -> str:
        share, other = {"A": (self.terminal_share, "A_end"), "P": (self.puzzle_share or None, "P_puzzle")}.get(
            task, (None, ""))
        st = self.state.get(task, {})
        if share is not None:
            k, st["drawn"] = st["drawn"], st["drawn"] + 1
            if self._steps_up(k, share):
                return other
        if task == "P" and self.check_share is not None:
            k, st["drawn_positions"] = st["drawn_positions"], st["drawn_positions"] + 1
            return "P_check" if self._steps_up(k, self.check_share) else "P"
        return task

    def take(self, task: str, n: int) -> list:
        if n and not any(self.pools.get(name) for name in (task, f"{task}_end", f"{task}_puzzle", f"{task}_check")):
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
