"""The verdict's intervals for a change: paired over the same held-out items where both evaluations
kept their per-item outcomes, and calibrated (95% coverage) where they are."""

from __future__ import annotations

import copy
import random

import pytest

from rookworld_rlvr.metrics import position_slices, sliced
from rookworld_rlvr.tasks.strength import fingerprint
from rookworld_rlvr.verdict import (HEADLINES, change_interval, headline_table, interval, items_of, judge,
                                    paired_interval, rows, verdict_table, wilson)

CHECK = next(h for h in HEADLINES if h.key == "puzzles.check.solved")


def check_result(items: list[int] | None, solved: float | None = None, of: str = "held-out checks") -> dict:
    """An evaluation's puzzles.check as evaluate writes it, with or without the per-item outcomes (`of`: the
    fingerprint of the positions they are of)."""
    n = len(items) if items is not None else 600
    out = {"n": n, "solved": solved if solved is not None else sum(items) / n}
    if items is not None:
        out["solved_items"], out["items_of"] = items, fingerprint([of])
    return {"puzzles": {"check": out}}


def test_a_gain_on_the_same_positions_is_judged_paired_beyond_the_noise_the_unpaired_interval_misses():
    """27.2% -> 31.3% of 600 positions in check: 35 positions gained and 10 lost, the rest kept. Paired,
    the change is beyond the noise; the unpaired interval (what a result without items gets) is not."""
    before = [1] * 163 + [0] * 437
    after = before.copy()
    for i in range(10):  # lost
        after[i] = 0
    for i in range(200, 235):  # gained
        after[i] = 1
    base, final = check_result(before), check_result(after)
    low, high = change_interval(base, final, CHECK)
    assert 0.0 < low < (sum(after) - sum(before)) / 600 < high
    assert judge(base, final, CHECK) == "better"
    unpaired = check_result(None, sum(before) / 600), check_result(None, sum(after) / 600)
    u_low, u_high = change_interval(*unpaired, CHECK)
    assert u_low < 0.0 < u_high and judge(*unpaired, CHECK) == "within noise"
    assert u_high - u_low > 1.8 * (high - low)  # the pairing halves the width here
    assert judge(final, base, CHECK) == "worse"  # and the other way round
    # the same number of items, but of other positions (another held-out set): nothing is paired
    other = check_result(after, of="other checks")
    assert items_of(other, CHECK.key) != items_of(base, CHECK.key)
    assert change_interval(base, other, CHECK) == pytest.approx((u_low, u_high))


def test_the_paired_interval_is_agresti_and_mins_and_few_changes_stay_within_the_noise():
    # 10 items, 3 gained, 1 lost: half a count added to each cell, m = 12, d = 2/12
    before = [1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    after = [1, 1, 0, 1, 1, 1, 0, 0, 0, 0]
    d, var = 2 / 12, (5 / 12 - (2 / 12) ** 2) / 12
    assert paired_interval(before, after) == pytest.approx((d - 1.959964 * var ** 0.5, d + 1.959964 * var ** 0.5))
    # 4 gained and none lost of 600 (McNemar's exact test: p = 0.125): not beyond the noise
    low, _ = paired_interval([0] * 600, [1] * 4 + [0] * 596)
    assert low < 0
    assert paired_interval([1, 0], [1]) is None and paired_interval([], []) is None
    assert paired_interval([1, 0.5], [1, 1]) is None  # not 0/1 outcomes


def test_items_of_other_lengths_fall_back_to_the_unpaired_interval():
    base, final = check_result([1] * 100 + [0] * 500), check_result([1] * 130 + [0] * 470)
    final["puzzles"]["check"]["solved_items"] = final["puzzles"]["check"]["solved_items"][:599]
    plain = check_result(None, 100 / 600), check_result(None, 130 / 600)
    assert change_interval(base, final, CHECK) == pytest.approx(change_interval(*plain, CHECK))


def test_the_paired_interval_covers_the_true_change_95_percent_of_the_time():
    """Calibrated: 2,000 draws of 600 matched items (5% gained, 2% lost, the rest kept, a third of them
    right), the true change +0.03 inside the interval about 95% of the time."""
    rng = random.Random(0)
    covered = 0
    for _ in range(2000):
        before, after = [], []
        for _ in range(600):
            u = rng.random()
            x, y = (0, 1) if u < 0.05 else (1, 0) if u < 0.07 else ((1, 1) if rng.random() < 1 / 3 else (0, 0))
            before.append(x)
            after.append(y)
        low, high = paired_interval(before, after)
        covered += low <= 0.03 <= high
    assert 0.935 <= covered / 2000 <= 0.965


LOSS = next(h for h in HEADLINES if h.key == "strength.loss_below_random")


def strength_result(losses: list, random_losses: list, of: str = "judged positions") -> dict:
    """strength as evaluate writes it: the ratio, its own bootstrap interval, and the per-position figures."""
    from rookworld_rlvr.tasks.strength import ratio_below_ci

    legal = [(x, r) for x, r in zip(losses, random_losses) if x is not None]
    ratio = 1 - sum(x for x, _ in legal) / sum(r for _, r in legal)
    return {"strength": {"n": len(losses), "loss_below_random": ratio,
                         "loss_below_random_ci": ratio_below_ci([x for x, _ in legal], [r for _, r in legal]),
                         "loss_items": losses, "random_loss_items": random_losses, "items_of": fingerprint([of])}}


def test_a_ratio_to_the_random_mover_changes_within_a_bootstrap_of_the_same_positions():
    """Expected-score loss below the random mover's, on 600 positions whose difficulty spreads widely: the final
    loses 0.005 less than the base on each position where it moves legally (two thirds of them). Resampling the
    same positions for both, the gain is beyond the noise; the unpaired interval, swamped by how the positions
    differ from one another, is not."""
    rng = random.Random(1)
    random_losses = [round(rng.uniform(0.05, 0.6), 4) for _ in range(600)]
    base_losses = [round(r * rng.uniform(0.2, 1.0), 4) if i % 3 else None for i, r in enumerate(random_losses)]
    final_losses = [None if x is None else round(max(0.0, x - 0.005), 4) for x in base_losses]
    base, final = strength_result(base_losses, random_losses), strength_result(final_losses, random_losses)
    low, high = change_interval(base, final, LOSS)
    change = final["strength"]["loss_below_random"] - base["strength"]["loss_below_random"]
    assert 0 < low < change < high and judge(base, final, LOSS) == "better"
    for r in (base, final):  # without the per-position figures: the two intervals in quadrature
        del r["strength"]["loss_items"]
    u_low, u_high = change_interval(base, final, LOSS)
    assert u_low < 0 < u_high and judge(base, final, LOSS) == "within noise"
    # other positions (another fingerprint): nothing is paired
    other = strength_result(final_losses, random_losses, of="other positions")
    base["strength"]["loss_items"] = base_losses
    assert change_interval(base, other, LOSS) == change_interval(
        {"strength": {k: v for k, v in base["strength"].items() if k != "loss_items"}}, other, LOSS)


OUT_OF_CHECK = next(h for h in HEADLINES if h.key == "strength.slices.not_in_check.legal")


def legal_before_after(n: int, legal: int, lost: int, gained: int) -> tuple[list[int], list[int]]:
    """Legal (1) or not (0) per position, before and after: `lost` of the first `legal` turn illegal, `gained`
    of the rest turn legal."""
    before = [1] * legal + [0] * (n - legal)
    after = [0] * lost + before[lost:legal] + [1] * gained + before[legal + gained:]
    return before, after


def strength_of(slice_name: str, items: list[int]) -> dict:
    """`strength` as evaluate writes it, with one slice holding every item."""
    return {"strength": {"n": 600, "legal": sum(items) / 600, "items_of": fingerprint(["judged positions"]),
                         "slices": sliced({slice_name: list(range(len(items)))}, "legal", items)}}


def test_legality_out_of_check_is_a_verdict_row_paired_over_the_same_positions():
    """A run that teaches legal moves in check can cost legality elsewhere: 86.1% -> 83.0% of 552 judged positions
    out of check (20 gained, 37 lost), as `make train` measured with its earlier anchor: its own row, paired over
    the same positions, shows it beyond the noise."""
    before, after = legal_before_after(552, legal=475, lost=37, gained=20)
    base, final = strength_of("not_in_check", before), strength_of("not_in_check", after)
    row = next(r for r in rows(base, final) if r["key"] == OUT_OF_CHECK.key)
    assert row["base"] == pytest.approx(475 / 552) and row["change"] == pytest.approx(-17 / 552)
    assert row["change_ci"] == pytest.approx(paired_interval(before, after))
    assert row["verdict"] == "worse" and row["random"] == 1.0
    assert "legal best move, judged positions out of check" in verdict_table(base, final)


KING_STEPS = next(h for h in HEADLINES if h.key == "strength.slices.king_can_step_into_check.legal")


def test_the_out_of_check_cost_has_a_row_of_its_own_where_a_king_move_would_step_into_check():
    """`make train` with its earlier anchor cost legality only where a king move would step into check (263 of the
    552 held-out positions out of check: 84.0% -> 77.9%, 8 gained, 24 lost; the other 289: 87.9% -> 87.5%). Its row
    slices the judged positions by the position itself and pairs base and final over that slice."""
    fens = ["4k3/R7/8/8/8/8/8/4K3 b - - 0 1",  # the rook holds the 7th rank: ...Kd7 would step into check
            "4k3/8/8/8/8/8/8/4K2R b - - 0 1",  # nothing guards the king's squares
            "4k3/8/8/8/8/8/8/4R1K1 b - - 0 1",  # in check: its own slice, not this one
            "4k3/8/8/7b/8/8/8/4K3 w - - 0 1",  # the bishop guards e2 and d1
            "7k/8/8/8/3b4/8/1N6/K7 w - - 0 1"]  # a pinned knight, but the king's own squares are safe
    slices = position_slices(fens)
    assert slices["king_can_step_into_check"] == [0, 3] and slices["in_check"] == [2]
    assert set(slices["king_can_step_into_check"]) <= set(slices["not_in_check"])

    before, after = legal_before_after(263, legal=221, lost=24, gained=8)
    base, final = strength_of("king_can_step_into_check", before), strength_of("king_can_step_into_check", after)
    row = next(r for r in rows(base, final) if r["key"] == KING_STEPS.key)
    assert row["base"] == pytest.approx(221 / 263) and row["change"] == pytest.approx(-16 / 263)
    assert row["change_ci"] == pytest.approx(paired_interval(before, after))
    assert row["verdict"] == "worse" and row["base_ci"] == pytest.approx(wilson(221 / 263, 263))


def judged(losses: list, random_losses: list, of: str = "judged positions") -> dict:
    """`strength` as evaluate writes it, with the per-position losses and blunders of the model and the random mover."""
    out = strength_result(losses, random_losses, of)
    blunders = [None if x is None else int(x >= 0.2) for x in losses]
    legal = [(b, r >= 0.2) for b, r in zip(blunders, random_losses) if b is not None]
    out["strength"].update(blunder_items=blunders, random_blunder_items=[float(r >= 0.2) for r in random_losses],
                           blunder_below_random=1 - sum(b for b, _ in legal) / sum(r for _, r in legal))
    return out


def both_legal(base: dict, final: dict) -> dict[str, dict]:
    return {r["key"].rsplit(".", 1)[1]: r for r in rows(base, final) if r["key"].startswith("strength.both_legal.")}


def test_move_quality_is_also_judged_where_both_moved_legally_so_legal_moves_in_hard_positions_cost_nothing():
    """The ratio rows count each model's own legal moves. A final that plays exactly the base's moves and also
    turns its 200 illegal moves into legal ones in hard positions (losing as much as a random mover there) blunders
    more by those rows; where both moved legally (the same 400 positions) nothing changed. A final that loses 0.05
    more on each of them is worse there, beyond the noise."""
    rng = random.Random(3)
    random_losses = [round(rng.uniform(0.05, 0.6), 4) for _ in range(600)]
    base_losses = [round(r * rng.uniform(0.2, 0.8), 4) if i % 3 else None for i, r in enumerate(random_losses)]
    fixed = [r if x is None else x for x, r in zip(base_losses, random_losses)]
    base, final = judged(base_losses, random_losses), judged(fixed, random_losses)
    assert final["strength"]["blunder_below_random"] < base["strength"]["blunder_below_random"] - 0.1
    same = both_legal(base, final)
    assert set(same) == {"loss", "blunder"} and all(r["change"] == 0 for r in same.values())
    assert all(r["verdict"] == "within noise" and r["label"].endswith("(400 judged positions)") for r in same.values())
    mean_random = sum(r for x, r in zip(base_losses, random_losses) if x is not None) / 400
    assert same["loss"]["random"] == pytest.approx(mean_random)
    assert "where both moved legally (400 judged positions)" in verdict_table(base, final)

    worse = judged([None if x is None else round(x + 0.05, 4) for x in base_losses], random_losses)
    rows_ = both_legal(base, worse)
    assert rows_["loss"]["change"] == pytest.approx(0.05) and rows_["loss"]["verdict"] == "worse"
    assert rows_["blunder"]["change"] > 0 and rows_["blunder"]["verdict"] == "worse"
    assert rows_["blunder"]["change_ci"] == pytest.approx(paired_interval(
        [int(x >= 0.2) for x in base_losses if x is not None], [int(x + 0.05 >= 0.2) for x in base_losses if x is not None]))
    # other positions (another fingerprint), or no per-position figures: no such rows
    assert both_legal(base, judged(fixed, random_losses, of="other positions")) == {}
    del final["strength"]["blunder_items"]
    assert both_legal(base, final) == {}
    # a position without the random mover's figure (a hand-edited file: evaluate writes one for each) is left out
    # of these rows, as a position without a model's move is, instead of stopping the verdict
    edited = copy.deepcopy(base)
    edited["strength"]["random_blunder_items"][1] = None
    assert both_legal(edited, judged(fixed, random_losses))["loss"]["label"].endswith("(399 judged positions)")
    h = next(h for h in HEADLINES if h.n_key == "environment.slices.game_ending.n")
    for n, expected in ((0.5, None), (0, None), (4, wilson(0.5, 4))):  # an n below one item has no interval
        assert interval({"environment": {"slices": {"game_ending": {"next_state_acc": 0.5, "n": n}}}}, h) == expected


def test_without_judged_positions_the_held_out_samples_legality_is_the_verdicts_move_row():
    """A run without judged positions (`strength_data: null`, or a data set of its own) still gets a verdict row on
    its moves: legal best moves on the held-out P: samples, paired over the same samples. With judged positions
    that row is theirs alone (the samples' legality would repeat it)."""
    from conftest import REPO
    from rookworld_rlvr.data.io import read_samples
    from rookworld_rlvr.metrics import score_completions
    from rookworld_rlvr.tasks.rewards import RewardScorer

    samples = [s for s in read_samples(REPO / "data" / "eval.jsonl.gz") if s.task == "P"][:60]
    right = [s.render("compact")[1] for s in samples]  # the true answer: its B: is legal
    before = score_completions(samples, right[:30] + ["B: z9z9"] * 30, RewardScorer())
    after = score_completions(samples, right[:40] + ["B: z9z9"] * 20, RewardScorer())
    (row,) = [r for r in rows(before, after) if r["key"] == "policy.legal_best"]
    assert row["base"] == pytest.approx(0.5) and row["final"] == pytest.approx(40 / 60) and row["random"] == 1.0
    assert row["change_ci"] == pytest.approx(paired_interval([1] * 30 + [0] * 30, [1] * 40 + [0] * 20))
    assert row["verdict"] == "better"
    assert "legal best move (held-out P: samples)" in verdict_table(before, after)
    other = score_completions(samples[::-1], (right[:40] + ["B: z9z9"] * 20)[::-1], RewardScorer())
    assert items_of(other, "policy.legal_best") != items_of(before, "policy.legal_best")  # other samples: unpaired
    judged = {"strength": {"n": 600, "legal": 0.8}}
    assert not [r for r in rows({**before, **judged}, {**after, **judged}) if r["key"] == "policy.legal_best"]


def test_one_evaluations_headline_table_shows_each_figure_with_its_interval_beside_the_random_movers():
    """`rookworld eval`'s closing table: the verdict's figures of one evaluation, Wilson's interval on its n, the
    random mover's figure on the same items (from the evaluation itself, or the fixed 100% legality); a figure
    the evaluation lacks has no row."""
    result = {"puzzles": {"mate1": {"n": 200, "solved": 0.3, "random": {"solved": 0.04}},
                          "check": {"n": 50, "solved": 0.5}}}
    lines = [" ".join(line.split()) for line in headline_table(result, "m").splitlines()]
    low, high = wilson(0.3, 200)
    assert lines[0] == "held-out figure (95% CI) | m | random mover"
    assert lines[2:] == ["legal best move, side to move in check | 0.5000 (0.366 .. 0.634) | 1.0000",
                         f"mate in one | 0.3000 ({low:.3f} .. {high:.3f}) | 0.0400"]
    assert headline_table({}, "m") == "(no held-out figures)"
