"""Evaluation: metric code against perfect and corrupted completions, `evaluate` end to end on a
tiny random GPT-2, mate-in-one files, self-play refereeing, tables and the `rookworld eval` CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import chess
import pytest
import torch
from transformers import GPT2LMHeadModel

from conftest import REFERENCE, REPO, UNREACHABLE_HUB, as_options, held_out_fields, in_hub_cache, random_transitions
from rookworld_rlvr import evaluate as ev
from rookworld_rlvr import metrics as mt
from rookworld_rlvr import tables
from rookworld_rlvr.data.judged import load_mate_in_one
from rookworld_rlvr.model.completions import Completer
from rookworld_rlvr.play import selfplay_metrics
from rookworld_rlvr.cli import main
from rookworld_rlvr.data.io import DataError, Sample, read_samples
from rookworld_rlvr.tasks import environment as env_task
from rookworld_rlvr.tasks.rewards import RewardScorer

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
FOOLS_MATE = ["f2f3", "e7e5", "g2g4", "d8h4"]
MATES = [
    ("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", ["a1a8"]),  # back rank
    ("rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq g3 0 2", ["d8h4"]),  # fool's mate
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference() -> list[Sample]:
    return read_samples(REFERENCE)


@pytest.fixture(scope="module")
def env_samples() -> list[Sample]:
    return [Sample("A", t) for t in random_transitions(40, seed=5)]


@pytest.fixture(scope="module")
def mixed(reference, env_samples) -> list[Sample]:
    return reference[:8] + env_samples[:8]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    from rookworld_rlvr.engine import EngineConfig, StockfishPool

    cache = str(tmp_path_factory.mktemp("engine") / "cache.sqlite")
    with StockfishPool(EngineConfig(depth=6, workers=1, cache_path=cache)) as p:
        yield p


@pytest.fixture(scope="module")
def tiny():
    from rookworld_rlvr.model.load import tiny_config
    from rookworld_rlvr.chess_tokenizers import build_chess_tokenizer

    tokenizer = build_chess_tokenizer()
    cfg = tiny_config(len(tokenizer), n_positions=256)
    cfg.n_layer, cfg.n_embd, cfg.n_head = 2, 32, 2
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).eval(), tokenizer


def truth_completions(samples: list[Sample], layout: str = "compact") -> list[str]:
    return [s.render(layout)[1] for s in samples]


def test_task_metrics_refuse_answers_that_do_not_pair_up_with_their_items():
    """A figure over fewer items than were asked is refused, not reported as the share of the rest."""
    envs = [s for s in read_samples(REPO / "data" / "eval.jsonl.gz") if s.task == "A"][:3]
    texts = truth_completions(envs)
    results = RewardScorer().score_batch([s.render("compact")[0] for s in envs], texts, [s.truth for s in envs])
    assert mt.task_metrics("A", envs, texts, results)["next_state_acc"] == 1.0
    with pytest.raises(ValueError, match="A: 3 samples, 2 completions and 3 results"):
        mt.task_metrics("A", envs, texts[:2], results)


def with_best(completion: str, move: str) -> str:
    return completion.rsplit("B:", 1)[0] + f"B: {move}"


def illegal_move(fen: str) -> str:
    legal = {m.uci() for m in chess.Board(fen).legal_moves}
    return next(m for m in ("a1a2", "h8h1", "e2e5", "b1b4", "d1d8", "a8h1") if m not in legal)


def legal_outside(sample: Sample) -> str:
    return next(m.uci() for m in chess.Board(sample.fen).legal_moves if m.uci() not in sample.truth.moves)


# -- metric code -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["compact", "padded"])
def test_perfect_oracle_scores_the_maximum(reference, env_samples, layout):
    samples = reference[:60] + env_samples
    res = mt.score_completions(samples, truth_completions(samples, layout), RewardScorer(), layout=layout)
    p, a = res["policy"], res["environment"]
    assert p["n"] == 60 and a["n"] == len(env_samples)
    assert p["best_acc"] == 1 and p["legal_best"] == 1 and p["invalid"] == 0 and p["repeated_candidates"] == 0
    assert p["distinct_legal_candidates"] == pytest.approx(sum(len(s.truth.moves) for s in reference[:60]) / 60)
    assert p["top5_overlap"] == 1
    assert p["mean_reward"] == 1
    assert a["invalid"] == 0 and a["next_state_acc"] == 1 and a["nls"] == 1 and a["reward_acc"] == 1
    assert a["reward_mae"] == 0 and a["terminated_acc"] == 1 and a["truncated_acc"] == 1 and a["mean_reward"] == 1


def test_the_a_fields_are_read_against_one_answer_written_on_every_row():
    """Nine in ten held-out transitions are ordinary moves (reward 0.001, not terminated, not truncated):
    a model that writes those values on every row, with the true next FEN, scores `constant`'s figures
    exactly, and they are most of each share (a field right 97% of the time may be right by default)."""
    rows = [s for _, s in zip(range(1000), (s for s in read_samples(REPO / "data" / "eval.jsonl.gz") if s.task == "A"))]
    same = [f"{s.truth.new_fen}+0.001+0+0" for s in rows]
    a = mt.score_completions(rows, same, RewardScorer())["environment"]
    floor = a["constant"]
    assert floor == {k: pytest.approx(a[k]) for k in ("reward_acc", "reward_mae", "terminated_acc", "truncated_acc")}
    assert floor["reward_acc"] == pytest.approx(0.870) and floor["terminated_acc"] == pytest.approx(0.904)
    assert floor["truncated_acc"] == pytest.approx(0.966) and a["next_state_acc"] == 1
    truth = mt.score_completions(rows, truth_completions(rows), RewardScorer())["environment"]
    assert truth["constant"] == floor and truth["reward_acc"] == 1 and truth["reward_mae"] == 0


def test_the_policy_figures_come_with_a_random_legal_movers_exactly():
    """best_acc and top5_overlap beside what a random legal mover earns on the same positions: here every legal B:
    move with every 5 distinct legal candidates of a position is written once, and their mean is the floor."""
    import itertools

    from rookworld_rlvr.tasks import strength

    rows = [s for s in read_samples(REPO / "data" / "eval.jsonl.gz") if s.task == "P"]
    rows = [s for s in rows if 5 <= len(strength.legal_moves(s.fen)) <= 7][:12]
    every = []
    for s in rows:
        legal = sorted(strength.legal_moves(s.fen))
        answers = [f"M: {' '.join(five)} E: 0.1 0.1 0.1 0.1 0.1 B: {best}"
                   for five in itertools.combinations(legal, 5) for best in legal]
        every.append(mt.score_completions([s] * len(answers), answers, RewardScorer())["policy"])
    floor = mt.score_completions(rows, truth_completions(rows), RewardScorer())["policy"]["random"]
    for name in ("best_acc", "top5_overlap"):
        assert floor[name] == pytest.approx(sum(e[name] for e in every) / len(rows)), name
    assert len(rows) == 12 and 0 < floor["best_acc"] < floor["top5_overlap"] < 1


def test_raw_upstream_labels_against_corrected_truth(reference):
    """Our truth writes a true best move; the upstream label is not one on 223 of 500 rows."""
    ours = mt.score_completions(reference, truth_completions(reference), RewardScorer())["policy"]
    assert ours["n_labelled"] == 500 and ours["best_acc"] == 1
    assert ours["best_acc_raw_labels"] == pytest.approx(277 / 500)
    raw = [with_best(c, s.truth.label) for s, c in zip(reference, truth_completions(reference))]
    theirs = mt.score_completions(reference, raw, RewardScorer())["policy"]
    assert theirs["best_acc_raw_labels"] == 1 and theirs["best_acc"] == pytest.approx(277 / 500)
    assert theirs["legal_best"] == 1 and theirs["mean_reward"] < 1


def test_corrupted_completions_score_lower(reference, env_samples, pool):
    ps, envs = reference[:12], env_samples[:12]
    good = truth_completions(ps)
    illegal = [with_best(c, illegal_move(s.fen)) for s, c in zip(ps, good)]
    res = mt.score_completions(ps, illegal, RewardScorer())["policy"]
    assert res["legal_best"] == 0 and res["best_acc"] == 0 and res["best_acc_raw_labels"] == 0
    assert res["invalid"] == 0 and res["mean_reward"] < 1
    # A legal move outside Stockfish's top 5 needs the engine for its centipawn loss.
    weak = [with_best(c, legal_outside(s)) for s, c in zip(ps, good)]
    assert mt.needs_engine(ps, weak) and not mt.needs_engine(ps, good)
    res = mt.score_completions(ps, weak, RewardScorer(engine=pool))["policy"]
    assert res["legal_best"] == 1 and res["best_acc"] == 0 and 0 < res["mean_reward"] < 1
    garbage = mt.score_completions(ps, ["M: zz E: x"] * len(ps), RewardScorer())["policy"]
    assert garbage["invalid"] == 1 and garbage["top5_overlap"] == 0 and garbage["distinct_legal_candidates"] == 0
    repeated = [f"M: {' '.join([s.truth.best[0]] * 5)} E: 1.0 1.0 1.0 1.0 1.0 B: {s.truth.best[0]}" for s in ps]
    rep = mt.score_completions(ps, repeated, RewardScorer())["policy"]  # five copies of one move: one candidate
    assert rep["distinct_legal_candidates"] == 1 and rep["repeated_candidates"] == 1 and rep["invalid"] == 1
    assert rep["top5_overlap"] == pytest.approx(sum(1 / len(s.truth.moves) for s in ps) / len(ps))
    assert garbage["mean_reward"] < 0

    wrong_fen = [c.replace(" w ", " x ", 1) if " w " in c else c.replace(" b ", " x ", 1)
                 for c in truth_completions(envs)]
    wrong_reward = [c.replace("+0.001+", "+0.5+").replace("+-1.0+", "+0.001+").replace("+1.0+", "+0.5+")
                    for c in truth_completions(envs)]
    a = mt.score_completions(envs, wrong_fen, RewardScorer())["environment"]
    assert a["next_state_acc"] == 0 and 0.9 < a["nls"] < 1 and a["reward_acc"] == 1 and a["mean_reward"] < 1
    # a copy of the input board is similar to the answer in most characters: nls_copy, its similarity on the same
    # rows, is the floor nls is read against, and answers that copy it score exactly that
    copies = [c.replace(s.truth.new_fen, s.truth.fen, 1) for s, c in zip(envs, truth_completions(envs))]
    copied = mt.score_completions(envs, copies, RewardScorer())["environment"]
    moved = sum(s.truth.fen != s.truth.new_fen for s in envs) / len(envs)
    assert copied["nls"] == pytest.approx(a["nls_copy"]) and 0.8 < a["nls_copy"] < 1
    assert copied["next_state_acc"] == pytest.approx(1 - moved) and moved > 0
    # per transition and per slice, in order: what a paired verdict of two evaluations compares
    half = [c if i % 2 else w for i, (c, w) in enumerate(zip(truth_completions(envs), wrong_fen))]
    a = mt.score_completions(envs, half, RewardScorer())["environment"]
    assert a["next_state_acc_items"] == [i % 2 for i in range(len(envs))]
    assert a["items_of"] == mt.score_completions(envs, wrong_fen, RewardScorer())["environment"]["items_of"]
    assert a["items_of"] != mt.score_completions(envs[::-1], half[::-1], RewardScorer())["environment"]["items_of"]
    for name, idx in mt.transition_slices([s.truth for s in envs]).items():
        assert a["slices"][name]["next_state_acc_items"] == [i % 2 for i in idx]
        assert a["slices"][name]["next_state_acc"] == pytest.approx(sum(i % 2 for i in idx) / len(idx))
    a = mt.score_completions(envs, wrong_reward, RewardScorer())["environment"]
    assert a["next_state_acc"] == 1 and a["reward_acc"] < 1 and a["reward_mae"] > 0
    a = mt.score_completions(envs, ["nonsense"] * len(envs), RewardScorer())["environment"]
    expected_mae = sum(abs(s.truth.reward) for s in envs) / len(envs)
    assert a["invalid"] == 1 and a["reward_acc"] == 0 and a["reward_mae"] == pytest.approx(expected_mae)
    assert a["mean_reward"] < 0


def test_held_out_se_pairs_the_rows_of_two_evaluations(reference, env_samples):
    """Per-row rewards pair two evaluations of the same rows: the standard error of the held-out
    reward's change is that of the row differences, far below what unpaired means would give."""
    import statistics

    ps, envs = reference[:20], env_samples[:20]
    samples = ps + envs
    good = truth_completions(samples)
    half = [with_best(c, illegal_move(s.fen)) if i % 2 else c for i, (s, c) in enumerate(zip(ps, good[:20]))]
    bad = half + ["nonsense" if i % 4 == 0 else c for i, c in enumerate(good[20:])]
    a = mt.score_completions(samples, good, RewardScorer())
    b = mt.score_completions(samples, bad, RewardScorer())
    assert a["policy"]["rewards"] == [1.0] * 20 and len(b["environment"]["rewards"]) == 20
    assert mt.held_out_se(a, a) == 0
    dp = [x - y for x, y in zip(b["policy"]["rewards"], a["policy"]["rewards"], strict=True)]
    de = [x - y for x, y in zip(b["environment"]["rewards"], a["environment"]["rewards"], strict=True)]
    expected = (statistics.variance(dp) / 20 + statistics.variance(de) / 20) ** 0.5 / 2
    assert mt.held_out_se(b, a) == pytest.approx(expected) and expected > 0
    assert mt.held_out_reward(b) < mt.held_out_reward(a)
    other = mt.score_completions(samples[:-1], bad[:-1], RewardScorer())  # not the same rows: nothing to pair
    assert mt.held_out_se(other, a) is None and mt.held_out_se(b, None) is None
    policy_only = mt.score_completions(ps, good[:20], RewardScorer())
    assert mt.held_out_se(policy_only, a) is None
    json.dumps(b)


def test_examples_per_task(mixed):
    res = mt.score_completions(mixed, truth_completions(mixed), RewardScorer(), examples=2)
    ex = res["examples"]
    assert [len(ex["policy"]), len(ex["environment"])] == [2, 2]
    first = ex["policy"][0]
    assert first["prompt"].startswith("P: ") and first["reward"] == 1 and first["truth"]["fen"] == mixed[0].fen
    assert set(first) >= {"prompt", "completion", "truth", "reward", "components"}
    json.dumps(res)


# -- evaluate on a tiny random model -----------------------------------------------------------------


def in_unit(v) -> bool:
    return v is None or 0 <= v <= 1


def test_evaluate_end_to_end_tiny_model(tiny, mixed, pool):
    from rookworld_rlvr.tasks.strength import JudgedPosition, Puzzle, random_expectation

    model, tokenizer = tiny
    fens = [s.fen for s in mixed if s.task == "P"][:3]
    judged = [JudgedPosition(f, t) for f, t in zip(fens, pool.move_tables(fens))]
    puzzles = [Puzzle(fen, tuple(moves), "mate1") for fen, moves in MATES]
    cfg = ev.EvalConfig(batch_size=5, max_new_tokens=24, selfplay_games=1, selfplay_max_plies=3)
    res = ev.evaluate(model, tokenizer, mixed, config=cfg, strength_set=judged, puzzles=puzzles, return_examples=1)
    json.dumps(res)
    p, a = res["policy"], res["environment"]
    assert p["n"] == 8 and a["n"] == 8
    for key in mt.POLICY_METRICS:
        assert key in p and (key == "mean_reward" or in_unit(p[key])), key
    for key in mt.ENV_METRICS:
        assert key in a and (key in ("mean_reward", "reward_mae") or in_unit(a[key])), key
    assert -1 <= p["mean_reward"] <= 1 and -1 <= a["mean_reward"] <= 1 and 0 <= a["reward_mae"] <= 2
    assert res["puzzles"]["mate1"]["n"] == 2 and in_unit(res["puzzles"]["mate1"]["solved"])
    n_legal = [chess.Board(fen).legal_moves.count() for fen, _ in MATES]
    assert res["puzzles"]["mate1"]["random"]["solved"] == pytest.approx(sum(1 / n for n in n_legal) / 2)
    st = res["strength"]
    assert st["n"] == 3 and in_unit(st["legal"]) and in_unit(st["candidates"]["repeated"])
    if st["legal"] == 0:  # a random model rarely writes a legal move; the baseline is then over no positions
        assert st["loss"] is None and st["random"]["loss"] is None
    rows = tables.flatten_metrics(res)
    assert "strength.random.loss" in rows and "puzzles.mate1.solved" in rows
    # the random mover's expectation is exact: the mean over every legal move
    r = random_expectation(judged[0])
    assert r["loss"] == pytest.approx(sum(judged[0].loss(m) for m in judged[0].evals) / len(judged[0].evals))
    assert res["selfplay"]["games"] == 1 and res["selfplay"]["mean_legal_half_moves"] >= 0
    assert len(res["examples"]["policy"]) == 1 and len(res["examples"]["environment"]) == 1
    assert "policy.best_acc" in tables.format_table(res)
    # the per-item outcomes and their fingerprints are kept for the verdict, not printed as figures
    assert res["strength"]["items_of"] and res["puzzles"]["mate1"]["solved_items"]
    assert not any(k.endswith(("items_of", "_items")) for k in rows)
    assert "items_of" not in tables.format_table(res) and "_items" not in tables.format_table(res)


def test_batches_sorted_by_length_come_back_in_prompt_order(tiny, mixed):
    from rookworld_rlvr.model.generate import generate

    model, tokenizer = tiny
    prompts = [s.render()[0] for s in mixed[6:11]]  # P: and A: prompts of different lengths
    gen = Completer(model, tokenizer, max_new_tokens=8, batch_size=2)
    texts, reasons = gen.run(prompts)
    single = [generate(model, tokenizer, [p], max_new_tokens=8, greedy=True).texts[0] for p in prompts]
    assert texts == single and len(reasons) == len(prompts)


def test_a_greedy_prompt_asked_again_is_answered_from_memory_with_the_budget_it_would_get_alone(tiny, mixed):
    model, tokenizer = tiny
    size = {p: len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in (s.render()[0] for s in mixed)}
    short, long = min(size, key=size.get), max(size, key=size.get)
    n_short, n_long = size[short], size[long]
    assert n_short < n_long
    budget = 256 - n_short  # the tiny model's context: asked with the long prompt, the short one gets less room

    def alone(prompt: str) -> str:
        return Completer(model, tokenizer, max_new_tokens=budget, batch_size=1).run([prompt])[0][0]

    gen = Completer(model, tokenizer, max_new_tokens=budget, batch_size=2, remember=True)
    texts, _ = gen.run([short, long, short])  # each distinct prompt once, in one batch: both capped to the long's room
    assert gen.reused == 1 and texts[0] == texts[2] and gen.answers[short][2] == 256 - n_long
    assert gen.run([short])[0] == [alone(short)] and gen.reused == 1  # capped before: completed again, alone
    assert gen.run([short, long])[0] == [alone(short), texts[1]] and gen.reused == 3  # both from memory now
    sampled = gen.run([short], temperature=1.0, greedy=False, generator=torch.Generator().manual_seed(0))
    assert gen.reused == 3 and sampled[0] != [alone(short)]  # sampling never reads or fills the memory
    plain = Completer(model, tokenizer, max_new_tokens=budget)
    plain.run([short, short])
    assert plain.answers is None and plain.reused == 0  # games and the UCI engine keep nothing


def test_an_evaluation_completes_a_position_its_sets_share_once(tiny, mixed, pool):
    from rookworld_rlvr.tasks.strength import JudgedPosition

    model, tokenizer = tiny
    fens = [s.fen for s in mixed if s.task == "P"][:3]
    judged = [JudgedPosition(f, t) for f, t in zip(fens, pool.move_tables(fens))]
    cfg = ev.EvalConfig(batch_size=1, max_new_tokens=24)
    res = ev.evaluate(model, tokenizer, mixed, config=cfg, strength_set=judged)
    assert res["meta"]["reused_answers"] == 3  # the judged positions' prompts are among the P: samples'
    on_its_own = ev.strength_metrics(Completer(model, tokenizer, 24, 1), judged, "compact", False)
    assert res["strength"] == on_its_own


def test_temperature_samples_task_completions_reproducibly(tiny, mixed):
    model, tokenizer = tiny

    def completions(**kw):
        return ev._generate_tasks(Completer(model, tokenizer, max_new_tokens=12), mixed[:8],
                                  ev.EvalConfig(max_new_tokens=12, **kw), False)[0]

    greedy, sampled = completions(), completions(temperature=1.0)
    assert sampled == completions(temperature=1.0)  # same seed, same samples
    assert sampled != greedy and sampled != completions(temperature=1.0, seed=1)
    with pytest.raises(ValueError, match="temperature"):
        ev.EvalConfig(temperature=-1).validate()


def test_evaluate_limit_and_context_cap(tiny, mixed):
    model, tokenizer = tiny
    res = ev.evaluate(model, tokenizer, mixed, config=ev.EvalConfig(limit=2, max_new_tokens=200))
    assert res["policy"]["n"] == 2 and res["environment"]["n"] == 2
    assert res["meta"]["capped_batches"] >= 1  # 200 new tokens do not fit the 256-token context


def test_evaluate_builds_and_closes_a_pool_when_needed(tiny, reference, monkeypatch):
    import rookworld_rlvr.engine as engine

    made = []

    class Recorded(engine.StockfishPool):
        def __init__(self, config):
            super().__init__(engine.EngineConfig(depth=6, workers=1))
            made.append(self)

    samples = reference[:2]
    weak = [with_best(c, legal_outside(s)) for s, c in zip(samples, truth_completions(samples))]
    monkeypatch.setattr(engine, "StockfishPool", Recorded)
    monkeypatch.setattr(ev, "_generate_tasks", lambda gen, s, config, progress: (weak, ["eos"] * len(s)))
    model, tokenizer = tiny
    res = ev.evaluate(model, tokenizer, samples, scorer=RewardScorer())
    assert len(made) == 1 and made[0]._closed
    assert res["policy"]["legal_best"] == 1 and 0 < res["policy"]["mean_reward"] < 1


# -- self-play, mate-in-one ----------------------------------------------------------------------------


class ScriptedGenerator(Completer):
    """Answers every prompt with the next move of a script (the referee is what is under test)."""

    def __init__(self, script):
        self.script, self.capped_batches = list(script), 0

    def run(self, prompts, *, bar=None, **sampling):
        move = self.script.pop(0) if self.script else "a1a1"
        return [f"M: {move} E: 0.0 B: {move}"] * len(prompts), ["eos"] * len(prompts)


def test_selfplay_referee_counts_legal_half_moves():
    res = selfplay_metrics(ScriptedGenerator(FOOLS_MATE), 2, max_plies=10)
    assert res == {"games": 2, "mean_legal_half_moves": 4, "max_legal_half_moves": 4,
                   "ended_illegal": 0, "ended_game_over": 2, "ended_max_plies": 0}
    res = selfplay_metrics(ScriptedGenerator(["e2e4", "e2e4"]), 1, max_plies=10)  # second e2e4 is illegal
    assert res["mean_legal_half_moves"] == 1 and res["ended_illegal"] == 1
    res = selfplay_metrics(ScriptedGenerator(FOOLS_MATE), 1, max_plies=2)
    assert res["mean_legal_half_moves"] == 2 and res["ended_max_plies"] == 1


def test_selfplay_sampling_on_the_tiny_model(tiny):
    model, tokenizer = tiny
    cfg = ev.EvalConfig(max_new_tokens=16, selfplay_games=2, selfplay_max_plies=2, selfplay_temperature=0.8)
    res = ev.evaluate(model, tokenizer, [], config=cfg)
    assert res["selfplay"]["games"] == 2 and res["selfplay"]["mean_legal_half_moves"] >= 0
    assert res["policy"]["n"] == 0 and res["environment"]["n"] == 0


def test_several_greedy_self_play_games_are_refused_before_the_model_loads(capsys):
    """Greedy games from the start are one game played again: `--selfplay 20` would report 20 games' mean where
    one was measured. Refused in `evaluate` and in `rookworld eval` (before its model loads: "m" is none)."""
    with pytest.raises(ValueError, match=r"EvalConfig.selfplay_games must be at most 1 at selfplay_temperature 0"):
        ev.evaluate(None, None, [], config=ev.EvalConfig(selfplay_games=2))
    ev.EvalConfig(selfplay_games=2, selfplay_temperature=0.5).validate()
    argv = ["eval", "--model", "m", "--data", str(REPO / "data" / "eval.jsonl.gz"), "--limit", "1", "--selfplay", "3"]
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith("error: EvalConfig.selfplay_games must be at most 1 at selfplay_temp")


def test_load_mate_in_one(tmp_path):
    good = tmp_path / "m1.tsv"
    good.write_text(f"# comment\nP: {MATES[0][0]}\t{MATES[0][1][0]}\n\n{MATES[1][0]}\td8h4\n")
    assert load_mate_in_one(good) == MATES
    for bad_line in (f"{MATES[0][0]} a1a8", f"{MATES[0][0]}\ta1a7", "not a fen\ta1a8", f"{MATES[0][0]}\t", "\udcff"):
        bad = tmp_path / "bad.tsv"
        bad.write_bytes(f"{MATES[1][0]}\td8h4\n{bad_line}\n".encode("utf-8", "surrogateescape"))  # \udcff: byte 0xff
        with pytest.raises(DataError, match="^" + re.escape(f"{bad}:2: ")):
            load_mate_in_one(bad)


# -- tables -------------------------------------------------------------------------------------------


def test_tables():
    base = {"policy": {"n": 4, "best_acc": 0.25, "best_acc_raw_labels": None, "components": {"format": 0.5}},
            "selfplay": {"games": 1, "mean_legal_half_moves": 2.0}, "examples": {"policy": []}, "meta": {"x": 1}}
    final = {"policy": {"n": 4, "best_acc": 0.5, "best_acc_raw_labels": 0.75, "components": {"format": 1.0}},
             "environment": {"n": 2, "nls": 0.9}}
    table = tables.compare_table(base, final)
    lines = table.splitlines()
    assert [c.strip() for c in lines[0].split("|")] == ["metric", "base", "final", "delta"]
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")[1:]] for line in lines[2:]}
    assert rows["policy.best_acc"] == ["0.2500", "0.5000", "+0.2500"]
    assert rows["policy.best_acc_raw_labels"] == ["-", "0.7500", "-"]
    assert rows["policy.components.format"] == ["0.5000", "1.0000", "+0.5000"]
    assert rows["selfplay.mean_legal_half_moves"] == ["2.0000", "-", "-"]
    assert rows["environment.nls"] == ["-", "0.9000", "-"]
    assert not any(k.startswith(("meta", "examples")) for k in rows)
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule aligned
    assert "policy.best_acc" in tables.format_table(base) and "meta" not in tables.format_table(base)


# -- command line -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_model(tiny, tmp_path_factory) -> Path:
    from rookworld_rlvr.model.load import save_pretrained_atomic

    model, tokenizer = tiny
    return save_pretrained_atomic(model, tokenizer, tmp_path_factory.mktemp("m") / "tiny")


@pytest.fixture(scope="module")
def data_file(env_samples, tmp_path_factory) -> Path:
    """Upstream text lines, P: and A: mixed (the A: lines without prefix, as upstream wrote them)."""
    lines = REFERENCE.read_text().split("\n")[:6]
    lines += [env_task.render(s.truth, prefix=i % 2 == 0) for i, s in enumerate(env_samples[:6])]
    path = tmp_path_factory.mktemp("d") / "mixed.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_eval_writes_json(saved_model, data_file, tmp_path, capsys, torch_threads):
    out = tmp_path / "res.json"
    rc = main(["eval", "--model", str(saved_model), "--data", str(data_file), "--json", str(out), "--limit", "4",
               "--device", "cpu", "--max-new-tokens", "16", "--quiet", "--threads", str(torch_threads + 1)])
    assert rc == 0 and torch.get_num_threads() == torch_threads + 1  # --threads: the model ran on that many
    res = json.loads(out.read_text())
    assert {"policy", "environment", "meta"} <= set(res)
    assert res["policy"]["n"] == 4 and res["environment"]["n"] == 4
    assert set(mt.POLICY_METRICS) <= set(res["policy"]) and set(mt.ENV_METRICS) <= set(res["environment"])
    out_text = capsys.readouterr().out
    assert "policy.best_acc" in out_text
    # it ends with the headline figures, each with its interval, beside the random mover's
    from rookworld_rlvr.verdict import headline_table, wilson

    table = headline_table(res, str(saved_model))
    assert out_text.endswith(f"\n{table}\nwrote {out}\n")
    low, high = wilson(res["environment"]["next_state_acc"], 4)
    assert f"A: next state exact | {res['environment']['next_state_acc']:.4f} ({low:.3f} .. {high:.3f}) |" in \
        " ".join(table.split())


def test_an_eval_stopped_part_way_keeps_its_answers_and_the_same_command_completes_only_the_rest(
        saved_model, data_file, tiny, tmp_path, batch_fault, capsys):
    """Ctrl-C as `rookworld eval --json OUT`'s third batch starts: the two completed are in OUT.answers.jsonl.
    The same command again completes only the others and writes the straight run's results; the journal goes.
    A journal of other weights (one changed a float32 step) is not read."""
    import copy

    from rookworld_rlvr.model.load import save_pretrained_atomic

    def run(out, model=saved_model, stop_at=None):
        batch_fault.calls, batch_fault.stop_at = 0, stop_at
        rc = main(["eval", "--model", str(model), "--data", str(data_file), "--json", str(out), "--limit", "4",
                   "--device", "cpu", "--max-new-tokens", "16", "--batch-size", "2", "--quiet"])
        return rc, batch_fault.calls

    def results(out):
        res = json.loads(out.read_text())
        res["meta"].pop("seconds")
        return res

    assert run(tmp_path / "a.json") == (0, 4)  # 4 P: + 4 A:, 2 a batch
    journal = tmp_path / "b.json.answers.jsonl"
    assert run(tmp_path / "b.json", stop_at=3) == (130, 3) and not (tmp_path / "b.json").exists()
    assert len(journal.read_text().splitlines()) == 1 + 2
    assert f"2 batches of answers are kept in {journal}: the same command completes only the rest" in \
        capsys.readouterr().err
    assert run(tmp_path / "b.json") == (0, 2) and not journal.exists()
    assert "2 batches completed by an earlier run of this evaluation" in capsys.readouterr().err
    assert results(tmp_path / "b.json") == results(tmp_path / "a.json")

    model, tokenizer = tiny
    other = copy.deepcopy(model)
    with torch.no_grad():
        w = next(other.parameters()).view(-1)
        w[0] = torch.nextafter(w[0], w[0] + 1)
    other_dir = save_pretrained_atomic(other, tokenizer, tmp_path / "other")
    assert run(tmp_path / "c.json", stop_at=3)[0] == 130
    assert run(tmp_path / "c.json", other_dir) == (0, 4)  # nothing kept: other weights


@pytest.fixture
def cut_off_hub(tmp_path, monkeypatch) -> Path:
    """A Hub out of reach (its endpoint refused, as a machine without network refuses) and an empty local cache,
    which this returns."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE_HUB)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("hub", ["offline-mode", "out-of-reach"])
def test_a_hub_model_out_of_reach_is_one_clear_line(data_file, cut_off_hub, hub, capsys, caplog, monkeypatch):
    """A Hub id that cannot be fetched stops with one line naming the model, the Hub and what to do, not
    transformers' traceback: offline mode said (HF_HUB_OFFLINE=1), or a Hub out of reach (a GPU machine without
    network): then at once, not after transformers' five retries of each file (a minute, twenty lines)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", hub == "offline-mode")
    assert main(["eval", "--model", "nobody/no-such-model", "--data", str(data_file), "--device", "cpu"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: cannot load the model: model nobody/no-such-model could not be loaded") and \
        "pass a local model directory" in line, line
    if hub == "out-of-reach":
        assert f"the Hugging Face Hub {UNREACHABLE_HUB} is out of reach (" in line and \
            f"the local cache ({cut_off_hub}) does not hold it" in line, line
    assert "Retrying" not in caplog.text  # huggingface_hub's retries, each a line


def test_a_hub_whose_connections_hang_is_asked_once_for_the_loads_of_a_run(monkeypatch):
    """Where a firewall drops the connections, each ask waits its whole timeout: a run loading its policy and its
    reference, or a match its two models, asks once, and the answer is kept a minute (`hub.REMEMBER_S`), then the
    Hub is asked again. The Hub here is a local socket that takes each connection and never answers."""
    import socket
    import threading

    from huggingface_hub import constants

    from rookworld_rlvr import hub

    held: list[socket.socket] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        def hold() -> None:
            while True:
                try:
                    held.append(server.accept()[0])  # taken, never answered
                except OSError:  # the server closed: the test is over
                    return

        threading.Thread(target=hold, daemon=True).start()
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        first = hub.out_of_reach(timeout=0.5)
        assert first is not None and "is out of reach (" in first and "Timeout" in first, first
        assert hub.out_of_reach(timeout=0.5) == first and len(held) == 1  # the second load: no second wait
        monkeypatch.setattr(hub, "REMEMBER_S", 0.0)  # the minute has passed: asked again
        assert hub.out_of_reach(timeout=0.5) is not None and len(held) == 2
    for conn in held:
        conn.close()


def test_a_hub_model_in_the_local_cache_loads_at_once_with_the_hub_out_of_reach(saved_model, data_file, cut_off_hub,
                                                                                 capsys, caplog):
    """Out of reach, a Hub id that was loaded once (the local cache holds it) is read from the cache at once, with
    a line saying so (the Hub may hold a newer copy), rather than after a minute of retries for each of its files
    (three minutes and 138 lines before)."""
    in_hub_cache(saved_model, cut_off_hub, "someone/tiny")
    assert main(["eval", "--model", "someone/tiny", "--data", str(data_file), "--device", "cpu", "--limit", "2",
                 "--quiet"]) == 0
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert line.startswith(f"warning: the Hugging Face Hub {UNREACHABLE_HUB} is out of reach (") and \
        line.endswith(f"); someone/tiny was loaded from the local cache ({cut_off_hub})"), line
    assert "loaded GPT2LMHeadModel (hub: someone/tiny)" in out and "policy.n " in out
    assert "Retrying" not in caplog.text


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft, in the test
def test_a_peft_adapter_whose_base_is_a_hub_id_loads_its_base_from_the_cache_with_the_hub_out_of_reach(
        saved_model, cut_off_hub, tmp_path, capsys, caplog):
    """A LoRA adapter saved elsewhere (adapter_config.json naming a Hub base) loads with its base: out of reach, the
    base from the local cache at once, and the model answers as the adapted one did."""
    import json

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rookworld_rlvr.model.load import load_policy

    in_hub_cache(saved_model, cut_off_hub, "someone/tiny")
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    base = AutoModelForCausalLM.from_pretrained(saved_model).eval()
    plain = base(ids).logits
    adapted = get_peft_model(base, LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True))
    torch.manual_seed(0)
    for name, p in adapted.named_parameters():
        if "lora_B" in name:  # 0 as initialised: the adapter would change nothing
            p.data.normal_()
    adapted.save_pretrained(tmp_path / "adapter")
    AutoTokenizer.from_pretrained(saved_model).save_pretrained(tmp_path / "adapter")
    config = tmp_path / "adapter" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": "someone/tiny"}))
    capsys.readouterr()  # transformers' bars of the loads above
    model, _ = load_policy(str(tmp_path / "adapter"), device="cpu", verbose=False)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: the Hugging Face Hub {UNREACHABLE_HUB} is out of reach (") and \
        line.endswith(f"); someone/tiny was loaded from the local cache ({cut_off_hub})"), line
    assert "Retrying" not in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, adapted.eval()(ids).logits)
        assert not torch.allclose(model(ids).logits, plain, atol=1e-3)


def test_cli_eval_clear_errors(saved_model, data_file, tmp_path, capsys, monkeypatch):
    rc = main(["eval", "--model", str(tmp_path / "nope"), "--data", str(data_file), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 1 and "cannot load the model: no such model directory" in err and str(tmp_path / "nope") in err
    bad = tmp_path / "bad.txt"
    bad.write_text("P: not a sample\n")
    rc = main(["eval", "--model", str(saved_model), "--data", str(bad), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 1 and "cannot read data" in err and f"{bad}:1:" in err
    rc = main(["eval", "--model", str(saved_model), "--data", str(tmp_path / "missing.jsonl")])
    assert rc == 1 and "no such file" in capsys.readouterr().err
    rc = main(["eval", "--model", str(saved_model), "--data", str(data_file), "--device", "tpu"])
    err = capsys.readouterr().err
    assert rc == 1 and "cannot load the model" in err and "unknown device 'tpu'" in err
    rc = main(["eval", "--model", str(saved_model), "--data", str(data_file), "--limit", "0"])
    err = capsys.readouterr().err
    assert rc == 1 and f"--limit 0 takes no sample of {data_file}, and no other set was asked for" in err
    # the held-out short histories alone are a set of their own
    out = tmp_path / "histories.json"
    rc = main(["eval", "--model", str(saved_model), "--data", str(data_file), "--limit", "0", "--histories",
               str(REPO / "data" / "eval_histories.jsonl.gz"), "--json", str(out), "--device", "cpu", "--quiet"])
    result = json.loads(out.read_text())
    assert rc == 0 and result["histories"]["n"] == 505 and result["policy"]["n"] == result["environment"]["n"] == 0

    def short_of_memory(*a, **k):  # the device out of memory while decoding (injected as CUDA raises it)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
                                     "7.60 GiB of which 100.00 MiB is free. Of the allocated memory ...")

    monkeypatch.setattr(ev, "_generate_tasks", short_of_memory)
    rc = main(["eval", "--model", str(saved_model), "--data", str(data_file), "--device", "cpu", "--quiet"])
    assert rc == 1 and capsys.readouterr().err.strip() == (
        "error: out of memory (CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 7.60 "
        "GiB of which 100.00 MiB is free): a smaller --batch-size needs less, where the command has one")


@pytest.mark.parametrize("progress", [True, False])
def test_a_runs_held_out_evaluations_show_their_progress_as_its_steps_do(tmp_path, tiny_model_dir, small_data,
                                                                         capsys, progress):
    """`rookworld train`'s held-out evaluations (minutes at the start and the end of `make train` on a CPU) showed
    nothing while they ran, as if the run hung; with `progress` they show a bar per task, as the steps do. Into a
    log (stderr here is not a terminal) the bars inside the `grpo` bar move no cursor: no ESC [A in the file."""
    run = tmp_path / "run"
    fields = dict(model=tiny_model_dir, data=small_data / "train.jsonl", eval_data=small_data / "eval.jsonl",
                  output_dir=run, steps=1, batch_positions=2, group_size=2, max_new_tokens=8, tensorboard="false",
                  progress=str(progress).lower(), report="false", engine_cache="null", device="cpu", threads=1,
                  **held_out_fields(small_data))
    assert main(["train"] + as_options(fields)) == 0
    err = capsys.readouterr().err
    for bar in ("eval P", "eval A", "histories A", "strength", "puzzles"):  # each one's first display, at the base
        rows = {"histories A": 6, "strength": 6, "puzzles": 9}.get(bar, 20)  # and at the end
        assert len(re.findall(rf"{bar}:\s+0%\|[^|]*\| 0/{rows} ", err)) == (2 if progress else 0), err[-3000:]
    assert ("grpo: 100%" in err) is progress
    assert "\x1b[" not in err, err[-3000:]


@pytest.mark.parametrize("terminal", [True, False])
def test_a_bar_inside_another_stacks_below_it_on_a_terminal_only(terminal):
    """On a terminal the evaluation's bar goes on the line below the run's (the cursor moves down and back up);
    into a pipe neither bar moves the cursor, and both still show their counts."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    code = ("from rookworld_rlvr.progress import bar\n"
            "with bar(total=2, desc='outer', mininterval=0) as a:\n"
            "    with bar(total=3, desc='inner', leave=False, mininterval=0) as b:\n"
            "        b.update(3)\n"
            "    a.update(2)\n")
    reader, writer = pty.openpty() if terminal else os.pipe()
    if terminal:  # a terminal of 24 rows and 80 columns (a new one has none: tqdm would draw nothing)
        fcntl.ioctl(writer, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with subprocess.Popen([sys.executable, "-c", code], stderr=writer, stdout=subprocess.DEVNULL) as child:
        os.close(writer)
        out = b""
        while chunk := _read_or_eof(reader):
            out += chunk
    os.close(reader)
    assert child.returncode == 0, out
    text = out.decode()
    assert "outer: 100%" in text and "inner: 100%" in text and "3/3" in text, text
    assert ("\x1b[A" in text) is terminal, text


def _read_or_eof(fd: int) -> bytes:
    """The next bytes of a pipe or a terminal's reader; b"" at its end (a terminal says so with EIO on Linux)."""
    import os

    try:
        return os.read(fd, 4096)
    except OSError:
        return b""


def test_eval_held_out_judges_a_model_as_its_run_judged_it(tmp_path, tiny_model_dir, small_data, capsys):
    """`rookworld eval --held-out RUN` reads the run's config: its held-out sets, its eval_limit, batch size,
    answer length and rewards. The run's final model judged that way gets the figures the run's own final
    evaluation wrote (here a malformed answer's reward is not the default's, so the rewards came along too).
    Options the config gives are refused beside it, and an evaluation the config does not have is named."""
    run = tmp_path / "run"
    fields = dict(model=tiny_model_dir, data=small_data / "train.jsonl", eval_data=small_data / "eval.jsonl",
                  output_dir=run, steps=1, batch_positions=2, group_size=2, max_new_tokens=8, tensorboard="false",
                  progress="false", report="false", engine_cache="null", device="cpu", threads=1, eval_limit=5,
                  eval_batch_size=3, malformed_penalty=-0.7, **held_out_fields(small_data))
    assert main(["train"] + as_options(fields)) == 0
    final = json.loads((run / "summary.json").read_text())["final"]
    out = tmp_path / "final.json"
    capsys.readouterr()
    assert main(["eval", "--model", str(run / "final"), "--held-out", str(run), "--json", str(out), "--device", "cpu",
                 "--threads", "1", "--quiet"]) == 0
    judged = json.loads(out.read_text())
    assert judged["meta"]["held_out"] == str(run) and judged["meta"]["data"] == str(small_data / "eval.jsonl")
    assert judged["meta"]["config"] == final["meta"]["config"]  # eval_limit 5, batch 3, 8 tokens, ...
    assert judged["policy"]["n"] == judged["environment"]["n"] == 5
    for section in ("policy", "environment", "histories", "strength", "puzzles"):
        ours = {k: v for k, v in judged[section].items() if k != "examples"}
        assert ours == {k: v for k, v in final[section].items() if k != "examples"}, section
    default = main(["eval", "--model", str(run / "final"), "--data", str(small_data / "eval.jsonl"), "--limit", "5",
                    "--max-new-tokens", "8", "--device", "cpu", "--threads", "1", "--quiet", "--json",
                    str(tmp_path / "default.json")])
    assert default == 0 and json.loads((tmp_path / "default.json").read_text())["policy"]["mean_reward"] != \
        final["policy"]["mean_reward"]
    capsys.readouterr()
    assert main(["eval", "--model", str(run / "final"), "--held-out", str(run / "config.yaml"), "--limit", "2",
                 "--batch-size", "4"]) == 1
    assert capsys.readouterr().err == ("error: --held-out takes --limit, --batch-size from its config: leave them "
                                       "out, or give --data instead of --held-out\n")
    (tmp_path / "none.yaml").write_text("eval_data: ''\n")
    assert main(["eval", "--model", str(run / "final"), "--held-out", str(tmp_path / "none.yaml")]) == 1
    assert capsys.readouterr().err == (f"error: {tmp_path / 'none.yaml'}: its eval_data '' holds no samples, so its "
                                       "run judges nothing\n")


def test_eval_against_another_models_evaluation_prints_the_paired_verdict(saved_model, data_file, tiny, tmp_path,
                                                                          capsys, monkeypatch):
    """`rookworld eval --against OTHER.json`: this model judged against another's evaluation on the same sets, as
    `rookworld train` judges its final model against its base: paired over the items both answered. On other
    items (another --limit) the verdict says its intervals there are unpaired; a file that is no evaluation, or
    one with a figure that is not a number, is named before any model loads; the evaluation's --json is written
    before the verdict, so a verdict that fails loses nothing."""
    import copy

    from rookworld_rlvr import verdict
    from rookworld_rlvr.model.load import save_pretrained_atomic

    model, tokenizer = tiny
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5)
    other_dir = save_pretrained_atomic(other, tokenizer, tmp_path / "other")
    common = ["--data", str(data_file), "--max-new-tokens", "16", "--device", "cpu", "--quiet"]

    def evaluate(model_dir, out, *more):
        assert main(["eval", "--model", str(model_dir), *common, "--json", str(out), *more]) == 0
        return capsys.readouterr().out, json.loads(out.read_text())

    _, base = evaluate(saved_model, tmp_path / "base.json", "--limit", "4")
    text, final = evaluate(other_dir, tmp_path / "final.json", "--limit", "4", "--against", str(tmp_path / "base.json"))
    table = verdict.verdict_table(base, final, (str(saved_model), str(other_dir)))
    assert text.endswith(f"\nwrote {tmp_path / 'final.json'}\n\n{table}\n") and "note:" not in text
    h = next(h for h in verdict.HEADLINES if h.key == "environment.next_state_acc")
    assert verdict.change_interval(base, final, h) == verdict._paired(base, final, h) is not None
    text, _ = evaluate(other_dir, tmp_path / "two.json", "--limit", "2", "--against", str(tmp_path / "base.json"))
    assert (f"note: {tmp_path / 'base.json'} judged other items in policy, environment (another --data, --limit or "
            "set): the changes there have unpaired, wider intervals") in text
    assert "note: the two evaluations ran with other settings (limit 2 here, 4 there): a change may be theirs" in text
    text, _ = evaluate(other_dir, tmp_path / "legal.json", "--limit", "4", "--batch-size", "3", "--legal-moves",
                       "--against", str(tmp_path / "base.json"))
    assert "judged other items" not in text and "(legal_moves True here, False there)" in text  # batch: no note
    (tmp_path / "metrics.json").write_text('{"policy": {}}')
    assert main(["eval", "--model", str(tmp_path / "no-model"), *common, "--against",
                 str(tmp_path / "metrics.json")]) == 1
    assert capsys.readouterr().err == (f"error: cannot read --against {tmp_path / 'metrics.json'}: not the JSON of "
                                       "an evaluation (`rookworld eval --json` writes one): it has no 'meta'\n")
    edited = copy.deepcopy(base)
    edited["policy"]["mean_reward"] = "high"
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    assert main(["eval", "--model", str(tmp_path / "no-model"), *common, "--against",
                 str(tmp_path / "edited.json")]) == 1
    assert capsys.readouterr().err == (f"error: cannot read --against {tmp_path / 'edited.json'}: 'policy.mean_reward' "
                                       "must be a number or null, got 'high'\n")

    def fails(*_):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(verdict, "verdict_table", fails)  # a fault in the verdict, after the evaluation's minutes
    assert main(["eval", "--model", str(other_dir), *common, "--json", str(tmp_path / "kept.json"), "--limit", "4",
                 "--against", str(tmp_path / "base.json")]) == 1
    assert capsys.readouterr().err == f"error: cannot judge against {tmp_path / 'base.json'}: float division by zero\n"
    assert json.loads((tmp_path / "kept.json").read_text())["policy"] == final["policy"]


@pytest.mark.parametrize("options,notes", [
    ("--selfplay-max-plies 50 --selfplay-temperature 0.7",
     ["--selfplay-max-plies: no self-play games (--selfplay 0)", "--selfplay-temperature: no self-play games"]),
    ("--examples 3", ["--examples: examples are kept in the JSON, and no --json is given"]),
    ("--seed 5", ["--seed: nothing is drawn (greedy answers: --temperature 0, and no sampled self-play)"]),
    ("--seed 5 --temperature 0.5", []),
    ("--seed 5 --selfplay 2 --selfplay-temperature 0.5 --selfplay-max-plies 9", []),
    ("--examples 3 --json {tmp}/e.json", []),
], ids=["selfplay-without-games", "examples-without-json", "seed-without-draws", "seed-sampling",
        "seed-selfplay", "examples-json"])
def test_an_eval_option_that_nothing_reads_is_named_before_the_evaluation(options, notes, tmp_path, capsys):
    """`rookworld eval` options that only tune something not asked for (self-play settings without games, examples
    without the JSON they go into, a seed where every answer is greedy) were taken without a word; now each is a
    warning of a setting without effect, printed before the evaluation (here, before the missing data stops it)."""
    argv = ["eval", "--model", str(REPO / "models" / "rookworld-board"), "--data", str(tmp_path / "none.jsonl"),
            *options.format(tmp=tmp_path).split()]
    assert main(argv) == 1
    said = [line.removeprefix("warning: setting without effect: ") for line in capsys.readouterr().err.splitlines()
            if line.startswith("warning: setting without effect: ")]
    assert len(said) == len(notes) and all(s.startswith(n) for s, n in zip(said, notes)), said
