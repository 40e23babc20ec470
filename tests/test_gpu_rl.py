"""scripts/gpu_rl.sh --smoke (which runs scripts/gpu_base.sh --smoke first): the prepared GPU recipes, a base
and GRPO on top of it, run end to end on a CPU at tiny sizes; what they leave in OUT is what a GPU machine can
send back, loads as models again, and holds the verdict and the matches."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]


def unpack(folder: Path, into: Path) -> Path:
    """A model directory from a folder of shards and meta.tar, as it came back."""
    into.mkdir()
    with tarfile.open(folder / "meta.tar") as tar:
        tar.extractall(into, filter="data")
    for f in folder.glob("*.safetensors"):
        (into / f.name).write_bytes(f.read_bytes())
    return into


@pytest.mark.drill
@pytest.mark.slow(seconds=170)
def test_the_gpu_recipes_run_and_their_outputs_come_back_and_load(tmp_path, stockfish_path):
    from rookworld_rlvr.data.generate import GenerateConfig, generate, is_eval_fen
    from rookworld_rlvr.data.io import iter_samples, read_samples, write_samples
    from rookworld_rlvr.data.records import record
    from rookworld_rlvr.model import load_policy

    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "PYTHON": sys.executable, "WORK": str(work)}
    more = tmp_path / "more.jsonl.xz"  # more P: positions, as `rookworld data merge --truth-only` writes them
    rows = iter_samples(REPO / "data" / "train.jsonl.xz")
    extra = [s for _, s in zip(range(2000), rows) if s.task == "P"][-5:]  # beyond the smoke's 300-row slice
    write_samples(more, extra, truth_only=True)
    # two game records, as data/more_games.jsonl.xz but of 3 and 5 short games, the first 3 the same (a game
    # follows from the seed and its number): replayed there with no Stockfish
    records = []
    for n in (3, 5):
        games = GenerateConfig(out_dir=str(tmp_path / f"gen{n}"), games=n, max_plies=16, workers=1, depth=2, seed=9)
        generate(games, progress=False)
        records.append(tmp_path / str(n) / "games.jsonl.xz")  # one name twice: each its own folder
        records[-1].parent.mkdir()
        record(games.out_dir, records[-1], workers=1, progress=False)
    # a deadline 30 minutes away leaves SFT and GRPO less than the 40 minutes asked of each: SFT ends a reserve
    # (RESERVE, 60 s here) before it, less its start and the export; GRPO gets what is left after the reserve
    cmd = ["bash", str(REPO / "scripts" / "gpu_rl.sh"), str(out), "--smoke", "--more-games", str(records[0]),
           "--more-games", str(records[1]), "--more-data", str(more), "--sft-minutes", "40", "--deadline-minutes",
           "30", "--grpo-minutes", "40", "--game-positions", "3"]
    # PIN_MIN_CORES 2: SFT and the preparation pinned apart by taskset, as on a GPU machine's 8 cores or more
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**env, "RESERVE": "60", "PIN_MIN_CORES": "2"},
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in files)
    assert {p.relative_to(out).as_posix() for p in files} >= {"base/meta.tar", "trained/meta.tar", "record.tar",
                                                              "results.md"}
    # the base's training data has game starts: A: rows with a one-move history from the start position
    trained_on = read_samples(work / "sft" / "train.jsonl.gz")
    assert all(s in trained_on for s in extra)  # --more-data joined the base's data
    # and so did the records' training-side positions: every P: of their games (as far as no held-out file holds
    # them) and 10 A: rows of each (20 in all in the smoke; 200,000 on the GPU), none taken twice
    trained_keys = {s.render("compact") for s in trained_on}
    replayed = {n: read_samples(tmp_path / f"gen{n}" / "train.jsonl.gz") for n in (3, 5)}
    played = [s for s in replayed[5] if s.task == "P" and not is_eval_fen(s.fen, 40)]
    assert sum(s.render("compact") in trained_keys for s in played) > len(played) * 0.9
    taken = {}
    for i in (1, 2):
        taken[i] = [read_samples(work / "sft" / f"more-{i}-games.jsonl.xz" / f"more_{t}.jsonl") for t in "pa"]
        assert len(taken[i][1]) == 10 and all(s.render("compact") in trained_keys for s in sum(taken[i], []))
    # the second record's samples: none that the first gave; its P: positions from its last two games alone
    prompts = {i: [s.render("compact")[0] for s in sum(taken[i], [])] for i in (1, 2)}
    assert len(set(prompts[1] + prompts[2])) == len(prompts[1]) + len(prompts[2])
    assert taken[2][0] and not {s.render("compact")[0] for s in replayed[3]} & {s.render("compact")[0]
                                                                             for s in taken[2][0]}
    rows = [s for s in trained_on if s.task == "A"]
    assert any(s.truth.fen.startswith("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w") for s in rows)
    base = unpack(out / "base", tmp_path / "base")
    log = [json.loads(x) for x in (base / "sft_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]
    # where its steps went: torch.profiler's tables of its third step (the first skipped, the second the profiler's
    # warm-up; 5 steps after 20 on a GPU), in meta.tar and record.tar, its headline in results.md
    profile = (base / "sft_profile.txt").read_text()
    assert profile.startswith("# rookworld sft of base, batch 4, ") and ": step 3 on cpu, " in profile.splitlines()[0]
    model, _ = load_policy(str(base), device="cpu", verbose=False)
    trained, _ = load_policy(str(work / "sft" / "base"), device="cpu", verbose=False)
    for (name, a), b in zip(model.state_dict().items(), trained.state_dict().values(), strict=True):  # bf16 copies
        torch.testing.assert_close(a, b.to(torch.bfloat16).float(), rtol=0, atol=0, msg=name)
    # the GRPO run: trained from that base, judged, matched
    rl = unpack(out / "trained", tmp_path / "trained")
    summary = json.loads((rl / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["base"] and summary["final"]
    # base and final scored the same held-out rows, item by item: the verdict pairs them
    before, after = summary["base"]["environment"], summary["final"]["environment"]
    assert before["items_of"] == after["items_of"] and len(after["next_state_acc_items"]) == after["n"] > 0
    config = yaml.safe_load((rl / "config.yaml").read_text())
    assert config["model"] == str(work / "sft" / "base") and config["decode_graph"]  # (eager here, a graph on CUDA)
    # GRPO where the base's games end (--game-positions 3): the last positions of its greedy games from 3 training
    # openings, labelled by Stockfish, are its P: prompts, in configs/gpu-game-positions.yaml's recipe
    positions = read_samples(work / "positions" / "grpo.jsonl.gz")
    fens = (work / "positions" / "fens.txt").read_text().split("\n")[:-1]  # the last 4 of each game at most
    assert 3 <= len(fens) <= 12 and not any(is_eval_fen(f, 40) for f in fens)
    assert all(s.task == "P" for s in positions) and sorted(s.truth.fen for s in positions) == sorted(fens)
    assert config["data"] == str(work / "positions" / "grpo.jsonl.gz") and config["kl_coef"] == 0.4
    assert config["anchor_coef"] == 0 and config["check_share"] is None
    granted = [float(line.split()[3]) for line in proc.stdout.splitlines() if line.startswith("gpu_rl: grpo gets")]
    cut = [float(line.split()[3]) for line in proc.stdout.splitlines() if line.startswith("gpu_base: SFT gets")]
    # what is left less SFT's start, the handover and the export, printed to 2 decimals (so it can reach the bound)
    assert len(cut) == 1 and 24 < cut[0] <= (30 * 60 - 60 - 75 - 45 - 30) / 60 and f"SFT gets {cut[0]:.2f} minutes, not 40" \
        in proc.stdout
    base_minutes = int((work / "times.tsv").read_text().split()[1]) / 60
    assert len(granted) == 1 and 29 - base_minutes - 1 < granted[0] <= 29 and config["max_minutes"] == granted[0]
    load_policy(str(rl), device="cpu", verbose=False)
    record = tmp_path / "record"
    record.mkdir()
    with tarfile.open(out / "record.tar") as tar:
        tar.extractall(record, filter="data")
    times = {row[0]: (int(row[2]), int(row[2]) + int(row[1]))
             for row in (line.split("\t") for line in (record / "times.tsv").read_text().splitlines())}
    judging = ["match_trained", "selfplay_base", "selfplay_trained", "match_base"]
    assert list(times)[:3] == ["base", "positions", "grpo"] and sorted(list(times)[3:]) == sorted(judging)
    # the four judging stages ran at once (each takes seconds, from its imports alone; all start within one)
    assert max(times[name][0] for name in judging) < min(times[name][1] for name in judging)
    assert times["grpo"][1] <= min(times[name][0] for name in judging)
    for name in ("match_trained_vs_base", "match_base_vs_board"):
        assert json.loads((record / f"{name}.json").read_text())["games"] == 2
    assert (record / "sft" / "base.profile.txt").read_text() == profile
    assert (record / "positions" / "games.txt").read_text().startswith("3 games (")
    seconds = log[-1]["seconds"]  # the samples the base saw, and how fast: 3 steps of the smoke's 4 rows
    assert f"The base's SFT: 3 steps of 4 rows (0.00M samples) in {seconds / 60:.1f} minutes, " \
        f"{12 / seconds:,.0f} samples a second." in (out / "results.md").read_text()
    assert f"The base's SFT, profiled (sft/base.profile.txt): {profile.splitlines()[0][19:]}." in \
        (out / "results.md").read_text()
    prepared = (record / "sft" / "prepare.log").read_text()  # where the GPU machine's minutes before SFT went
    assert "replayed and merged at +" in prepared and "its rows encoded at +" in prepared
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:  # half the cores each (4 and the rest on 8 or more), the preparation on those it was given
        k = 4 if len(cpus) >= 8 else len(cpus) // 2
        assert (f"gpu_base: SFT on cores {','.join(map(str, cpus[:k]))} and the preparation on "
                f"{','.join(map(str, cpus[k:]))} until the handover") in proc.stdout
        ranges = re.search(r"gpu_base: preparing on cores (\S+)", prepared).group(1)  # taskset's list: 1,4-7
        given = [n for r in ranges.split(",") for a, _, b in [r.partition("-")] for n in range(int(a), int(b or a) + 1)]
        assert given == cpus[k:]
        # the shipped data's rows, encoded on every core before the pinning, are the ones pinned SFT reads
        assert re.search(rf"sft: \d+ rows from the rows cache {work}/sft/rows0.safetensors", proc.stdout)
    else:
        assert "gpu_base: SFT on cores" not in proc.stdout
    plies = {}
    for name in ("base", "trained"):  # one greedy game from the start each, at most 8 plies in the smoke
        sp = json.loads((record / f"selfplay_{name}.json").read_text())["selfplay"]
        assert sp["games"] == 1 and 0 <= sp["mean_legal_half_moves"] <= 8
        plies[name] = round(sp["mean_legal_half_moves"])
    text = (out / "results.md").read_text()
    assert "base -> the trained model" in text and "A: next state exact" in text and text.count("2 games") == 2
    # how many positions GRPO drew, and where its steps' time went (tens of thousands in minutes, on the GPU)
    assert re.search(r"\nGRPO: 2 steps[^\n]*\. 4 positions drawn \(2 a step\), [\d.]+ s a step: generate \d+%", text)
    assert f"({', '.join(list(times)[3:])} at once)." in text
    assert f"GRPO's P: prompts (puzzles aside; --game-positions 3, configs/gpu-game-positions.yaml): {len(fens)} " \
        "positions from the ends of the base's own greedy games (the last 4 of each; 3 games from training openings, " \
        "ended by: " in text
    assert f"its histories, {records[0]}'s games (" in text and f"A: rows), {records[1]}'s games (" in text
    assert f"A: rows), {more}. Its first 0 steps trained on the shipped data and its histories alone (" in text
    assert (work / "sft" / "train.used").read_text().strip() == str(work / "sft" / "train.jsonl.gz")
    assert all(f"- {name}: {n} legal half-moves (ended by: " in text for name, n in plies.items())
    assert f"| self-play from the start, legal half-moves | 60 | - | {plies['base']} | " in text.split("## Goals")[1]
    # a rerun (after a timeout, say, into the new empty OUT a GPU machine gives each call) runs no finished stage
    # again and fills its OUT all the same; --continue (the call after the base's, on the same machine) finds the base
    again = subprocess.run(cmd[:2] + [str(tmp_path / "out2"), *cmd[3:], "--continue"], capture_output=True,
                           text=True, env=env, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert all(f"{stage} done before" in again.stdout
               for stage in ("base", "grpo", "match_trained", "selfplay_base", "selfplay_trained", "match_base"))
    assert (work / "grpo" / "summary.json").read_text() == json.dumps(summary, indent=2)
    assert sorted(p.relative_to(tmp_path / "out2") for p in (tmp_path / "out2").rglob("*")) == \
        sorted(p.relative_to(out) for p in out.rglob("*"))
    assert "Not run" not in text and "Not run" not in (tmp_path / "out2" / "results.md").read_text()

    # a call whose deadline has passed when the base is done (here: a base done before, and a deadline of 0) runs
    # nothing more, and OUT holds the base and results.md naming what did not run (the same command runs it later)
    late = tmp_path / "late"
    late.mkdir()
    for name in ("sft", "base-out"):
        shutil.copytree(work / name, late / name)
    for name in ("base.done", "times.tsv"):
        shutil.copy(work / name, late / name)
    out3 = tmp_path / "out3"
    proc = subprocess.run(cmd[:2] + [str(out3), *cmd[3:-8], *cmd[-2:], "--deadline-minutes", "0"],
                          capture_output=True, text=True, env={**env, "WORK": str(late)}, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_rl: base done before" in proc.stdout and not (late / "grpo").exists()
    assert sorted(p.relative_to(out3).as_posix() for p in out3.rglob("*") if p.is_file()) == \
        sorted(["record.tar", "results.md"] + [p.relative_to(out).as_posix() for p in (out / "base").iterdir()])
    assert all((out3 / "base" / p.name).read_bytes() == p.read_bytes() for p in (out / "base").iterdir())
    text = (out3 / "results.md").read_text()
    assert "GRPO: not run." in text and "fewer than 0.5" in text and "match_trained_vs_base: not played" in text
    for name in ("match_trained: no trained model", "selfplay_base: past the deadline",
                 "selfplay_trained: no trained model", "match_base: past the deadline"):
        assert name in text


    # calls stopped in the base's SFT and in GRPO (by their timeouts: checkpoints, no base and no trained model yet)
    # are continued by the same command on that machine: each resumes from its checkpoint instead of starting
    # afresh, and the same models come back (here the checkpoints are the last steps', so each run only ends)
    for name in ("base.done", "base_model", "grpo.done"):
        (work / name).unlink()
    for name in ("sft/base", "base-out", "grpo/final", "export"):
        shutil.rmtree(work / name)
    assert (work / "sft" / "base.checkpoint" / "sft_state.json").exists() and (work / "grpo" / "checkpoints").is_dir()
    out7 = tmp_path / "out7"
    proc = subprocess.run(cmd[:2] + [str(out7), *cmd[3:]], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sft: resumed at step 3" in proc.stdout and re.search(r"resumed from \S+ at step 2", proc.stdout)
    shards = sorted((out / "base").glob("*.safetensors")) + sorted((out / "trained").glob("*.safetensors"))
    assert len(shards) >= 2 and all((out7 / p.relative_to(out)).read_bytes() == p.read_bytes() for p in shards)
    resumed = unpack(out7 / "base", tmp_path / "resumed")
    assert [json.loads(x)["step"] for x in (resumed / "sft_log.jsonl").read_text().splitlines()] == [1, 2, 3]

    # GRPO from a given base (one an earlier call trained and sent back), from a tree slimmed to travel beside it
    # (docs/gpu.md: no game records, no models/rookworld-board): the first stage makes only the training data (no
    # records asked for here), the base's match against the shipped base is skipped, named, and OUT holds the
    # trained model, the record and the verdict, no base/
    given, work4, out4, slim = tmp_path / "given", tmp_path / "work4", tmp_path / "out4", tmp_path / "slim"
    shutil.copytree(work / "sft" / "base", given)
    for name in tracked():
        if not name.startswith(("data/more_games", "models/rookworld-board/")):
            (slim / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, slim / name)
    env4 = {**env, "WORK": str(work4)}
    proc = subprocess.run(["bash", str(slim / "scripts" / "gpu_rl.sh"), str(out4), "--smoke", "--base", str(given),
                           "--control"], capture_output=True, text=True, env=env4, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_rl: match_base skipped: models/rookworld-board is not in this tree" in proc.stdout
    assert "match_base: models/rookworld-board is not in this tree" in (out4 / "results.md").read_text()
    assert (work4 / "match_trained.done").exists() and not (work4 / "match_base.done").exists()
    assert not (work4 / "sft" / "base").exists() and (work4 / "sft" / "train.jsonl.gz").exists()
    assert not (out4 / "base").exists() and {"record.tar", "results.md", "trained"} <= {p.name for p in out4.iterdir()}
    rl4 = unpack(out4 / "trained", tmp_path / "trained4")
    run4 = yaml.safe_load((rl4 / "config.yaml").read_text())
    assert run4["model"] == str(given) and run4["reward_signal"] is False  # --control: the anchor and KL alone
    assert f"Base: {given} (--base)." in (out4 / "results.md").read_text()
    assert "The base's SFT" not in (out4 / "results.md").read_text()  # trained elsewhere: its pace is not this call's
    assert "GRPO's control (--control: reward_signal false" in (out4 / "results.md").read_text()
    assert "## Verdict: the base -> the control model" in (out4 / "results.md").read_text()
    # a WORK holds one kind of run: the control's WORK refuses GRPO, before anything runs
    proc = subprocess.run(["bash", str(slim / "scripts" / "gpu_rl.sh"), str(tmp_path / "out5"), "--smoke", "--base",
                           str(given)], capture_output=True, text=True, env=env4, timeout=900)
    assert proc.returncode == 2 and f"{work4} holds a control run, not a grpo run" in proc.stderr
    # --game-positions' recipe has no anchor: its control would train nothing (the base is its control)
    proc = subprocess.run(cmd[:2] + [str(tmp_path / "out5"), *cmd[3:], "--control"], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 2 and "the base is its control (run it without --control)" in proc.stderr
    # ... and to its prompts: GRPO's WORK refuses a run without its game positions, before anything runs
    proc = subprocess.run(cmd[:2] + [str(tmp_path / "out5"), *cmd[3:-2]], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 2 and "holds a GRPO run with --game-positions 3, not 0" in proc.stderr
    # that WORK belongs to that base: another base is refused before anything runs
    proc = subprocess.run(cmd[:2] + [str(tmp_path / "out5"), "--smoke", "--base", str(work / "sft" / "base")],
                          capture_output=True, text=True, env=env4, timeout=900)
    assert proc.returncode == 2 and f"holds a run from the base {given}, not {work / 'sft' / 'base'}" in proc.stderr

    # a judging stage that fails stops none of the others: here the trained model's weights are damaged, so its
    # match and self-play fail, while the base's match runs to its end beside them and comes back
    (work / "grpo" / "final" / "model.safetensors").write_bytes(b"damaged")
    for name in ("match_trained", "selfplay_trained", "match_base"):
        (work / f"{name}.done").unlink()
    (work / "match_base_vs_board.json").unlink()
    out6 = tmp_path / "out6"
    proc = subprocess.run(cmd[:2] + [str(out6), *cmd[3:]], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 1 and "gpu_rl: failed: match_trained selfplay_trained (" in proc.stderr
    assert "[match_trained] " in proc.stdout and (work / "match_base.done").exists()
    assert not (work / "match_trained.done").exists() and not (work / "selfplay_trained.done").exists()
    with tarfile.open(out6 / "record.tar") as tar:
        assert "match_base_vs_board.json" in tar.getnames()
    assert "match_base_vs_board: not played" not in (out6 / "results.md").read_text()


@pytest.mark.slow(seconds=30)
def test_a_failed_data_preparation_still_sends_back_the_base(tmp_path):
    """SFT starts on the shipped data while the records are replayed beside it; a record that cannot be replayed
    (damaged here) is named, and the base trained on the shipped data and its game starts comes back all the same
    (what a GPU machine has trained is not lost), with GRPO pointed at the data the base trained on."""
    damaged = tmp_path / "games.jsonl.xz"
    damaged.write_bytes(b"\xfd7zXZ\x00 not a record")
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_base.sh"), str(out), "--smoke", "--more-games",
                           str(damaged)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHON": sys.executable, "WORK": str(work)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_base: warning: preparing the rest of the data failed, so the base trained on the shipped data" \
        in proc.stderr and f"error: {damaged}: cannot be read after line 0" in proc.stderr
    assert "warning: preparing the rest of the data failed" in (work / "train.summary").read_text()
    assert (work / "train.used").read_text().strip() == str(work / "train0.jsonl.gz")
    assert (out / "meta.tar").exists() and list(out.glob("*.safetensors"))
    log = [json.loads(x) for x in (work / "base.sft_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]


@pytest.mark.slow(seconds=12)
def test_a_base_sent_back_trains_on_from_its_weights_and_its_history_counts_every_call(tmp_path, tiny_model_dir):
    """A GPU machine's 15 minutes train a base for about 8; `--init B` lets the next machine train on the base the
    last one sent back instead of a fresh one: SFT starts from B's weights, shape and tokenizer, draws its data
    with the seed of the calls before it (so it does not walk the same order again), and the base that comes back
    carries every call's steps, samples and minutes, which results.md adds up."""
    from rookworld_rlvr.model import load_policy

    given = tmp_path / "B"
    shutil.copytree(tiny_model_dir, given)
    earlier = [{"init": None, "steps": 4000, "batch_size": 512, "samples": 2048000, "minutes": 8.5},
               {"init": "runs/b1", "steps": 3000, "batch_size": 512, "samples": 1536000, "minutes": 8.5}]
    (given / "sft_history.jsonl").write_text("".join(json.dumps(c) + "\n" for c in earlier))
    out, work = tmp_path / "out", tmp_path / "rl" / "sft"  # WORK as gpu_rl.sh gives it, for its report below
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_base.sh"), str(out), "--smoke", "--init", str(given)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHON": sys.executable, "WORK": str(work)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"gpu_base: SFT continues {given}, trained before in 2 calls: 7,000 steps, 3.58M samples, 17.0 minutes " \
        "(seed 2)" in proc.stdout
    config = json.loads((work / "base.checkpoint" / "sft_state.json").read_text())["config"]
    assert config["init"] == str(given) and config["seed"] == 2
    start, _ = load_policy(str(given), device="cpu", verbose=False)
    trained, _ = load_policy(str(work / "base"), device="cpu", verbose=False)
    assert trained.config.n_layer == 2 and trained.config.n_embd == 64  # B's shape, not the tiny preset's 6 x 256
    # three steps in the lr's warm-up move each weight by at most about 1e-4; a fresh model is another one entirely
    for (name, a), b in zip(start.state_dict().items(), trained.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-3, msg=name)
    assert any(not torch.equal(a, b)
               for a, b in zip(start.state_dict().values(), trained.state_dict().values(), strict=True))
    with tarfile.open(out / "meta.tar") as tar:
        history = [json.loads(x) for x in tar.extractfile("./sft_history.jsonl").read().decode().splitlines()]
    assert history[:2] == earlier and history[2]["init"] == str(given)
    assert [history[2][k] for k in ("steps", "batch_size", "samples")] == [3, 4, 12]
    pace = report_module().sft_pace(tmp_path / "rl")
    assert f"It continued {given}, trained before in 2 calls: 7,000 steps, 3.58M samples, 17.0 minutes; in all " \
        "3 calls: 7,003 steps, 3.58M samples, 17.0 minutes." in pace


def test_a_history_says_what_it_knows_of_a_base_and_names_a_damaged_line(tmp_path):
    """A base sent back before histories were kept has its SFT log: one call of its steps and minutes; a model with
    neither is one call of unknown cost; a damaged history stops gpu_base.sh with its file and line, before any
    minute of SFT is spent."""
    spec = importlib.util.spec_from_file_location("sft_history", REPO / "scripts" / "sft_history.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    logged = tmp_path / "logged"
    logged.mkdir()
    (logged / "sft_log.jsonl").write_text('{"step": 500, "minutes": 1.2}\n{"step": 1348, "minutes": 1.81}\n')
    assert module.describe(module.earlier(logged)) == "1 call: 1,348 steps, samples not recorded, 1.8 minutes"
    assert module.describe(module.earlier(REPO / "models" / "rookworld-board")) == \
        "1 call: steps not recorded, samples not recorded, minutes not recorded"
    damaged = tmp_path / "damaged"
    shutil.copytree(REPO / "models" / "rookworld-board", damaged, ignore=shutil.ignore_patterns("*.safetensors"))
    (damaged / "sft_history.jsonl").write_text('{"steps": 3}\n{"steps": \n')
    with pytest.raises(SystemExit, match=f"sft_history: {damaged}/sft_history.jsonl:2: not a JSON line"):
        module.earlier(damaged)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_base.sh"), str(tmp_path / "out"), "--smoke", "--init",
                           str(damaged)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "work")})
    assert proc.returncode == 1 and f"{damaged}/sft_history.jsonl:2: not a JSON line" in proc.stderr
    assert not (tmp_path / "work" / "base.sft_log.jsonl").exists()


def test_sft_init_belongs_to_a_call_that_trains_its_base_and_its_work_remembers_it(tmp_path):
    """--sft-init trains a given base on: not with --base (a base taken as it is), --continue (the base in WORK)
    or --preset (a fresh model's size); and a WORK whose base started from one model is not reused for another,
    which would skip the SFT asked for as done before. Each stops at once (exit 2), nothing run."""
    env = {**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "work")}
    script = str(REPO / "scripts" / "gpu_rl.sh")
    board = str(REPO / "models" / "rookworld-board")
    for extra, said in ((["--base", board], "--base takes"), (["--continue"], "--continue goes on with the base"),
                        (["--preset", "wide"], "--preset sizes a fresh model")):
        proc = subprocess.run(["bash", script, str(tmp_path / "out"), "--smoke", "--sft-init", board, *extra],
                              capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr and not (tmp_path / "work").exists(), proc.stderr
    proc = subprocess.run(["bash", script, str(tmp_path / "out"), "--smoke", "--sft-init", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and f"--sft-init {tmp_path}: no model there (no config.json)" in proc.stderr
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "sft_init").write_text("fresh\n")  # a base's call without --sft-init ran here
    proc = subprocess.run(["bash", script, str(tmp_path / "out"), "--smoke", "--sft-init", board], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 2 and f"holds a base whose SFT started from fresh, not {board}" in proc.stderr
    assert not (tmp_path / "work" / "sft").exists()
    base = str(REPO / "scripts" / "gpu_base.sh")
    for extra, said in ((["--preset", "wide"], "--preset sizes a fresh model"), (["--data-only"], "trains nothing")):
        proc = subprocess.run(["bash", base, str(tmp_path / "out"), "--smoke", "--init", board, *extra],
                              capture_output=True, text=True, env={**env, "WORK": str(tmp_path / "w")}, timeout=60)
        assert proc.returncode == 2 and said in proc.stderr and not (tmp_path / "w").exists(), proc.stderr


def test_game_positions_past_the_shipped_openings_stop_the_call_before_anything_runs(tmp_path):
    """The game positions' stage runs after the base; asked for more games than data/train_openings.txt has
    openings, it would stop the call there with GRPO's minutes unspent. The count is checked first (exit 2)."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_rl.sh"), str(tmp_path / "out"), "--smoke",
                           "--game-positions", "2001"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "work")})
    assert proc.returncode == 2 and "--game-positions 2001: data/train_openings.txt holds 2000 openings" in proc.stderr
    assert not (tmp_path / "work").exists() and not (tmp_path / "out").exists()


def test_a_continuing_call_on_a_machine_without_the_base_stops_before_spending_its_minutes(tmp_path):
    """The call after the base's continues in WORK on the same machine; on one started afresh (WORK empty) it would
    train a new base in the minutes meant for GRPO. --continue stops it at once, saying what to run instead."""
    env = {**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "work")}
    script = str(REPO / "scripts" / "gpu_rl.sh")
    proc = subprocess.run(["bash", script, str(tmp_path / "out"), "--smoke", "--grpo-minutes", "1", "--continue"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and f"--continue: {tmp_path / 'work'} holds no finished base" in proc.stderr
    assert "with --base MODEL_DIR" in proc.stderr and not (tmp_path / "work").exists()
    checkpoint = tmp_path / "work" / "sft" / "base.checkpoint"  # the base's call stopped by its timeout
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    proc = subprocess.run(["bash", script, str(tmp_path / "out"), "--smoke", "--continue"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "the base's SFT in" in proc.stderr and "rerun the base's command" in proc.stderr
    proc = subprocess.run(["bash", script, str(tmp_path / "out"), "--smoke", "--continue", "--base",
                           str(REPO / "models" / "rookworld-board")], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 2 and "--continue and --base" in proc.stderr


def test_a_pin_min_cores_that_is_not_a_number_stops_gpu_base_before_anything_runs(tmp_path):
    """PIN_MIN_CORES (the fewest cores on which SFT and the data's preparation are pinned apart) is checked first:
    misspelt, it would otherwise leave nothing pinned without a word."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_base.sh"), str(tmp_path / "out"), "--smoke"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHON": sys.executable, "WORK": str(tmp_path / "work"),
                               "PIN_MIN_CORES": "eight"})
    assert proc.returncode == 2 and "PIN_MIN_CORES needs a number of cores, got 'eight'" in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_the_documented_gpu_rl_commands_use_only_its_options():
    """The prepared commands a GPU session copies from the README and docs/gpu.md: an option the script does not
    know would end a GPU call at its first second (exit 2), with its machine's start already spent."""
    usage = next(line for line in (REPO / "scripts" / "gpu_rl.sh").read_text().splitlines() if line.startswith("usage="))
    known = set(re.findall(r"--[a-z-]+", usage))
    commands = []
    for doc in ("README.md", "docs/gpu.md"):
        text = (REPO / doc).read_text().replace("\\\n", " ")
        commands += [line.split("scripts/gpu_rl.sh OUT", 1)[1].split("#")[0] for line in text.splitlines()
                     if "scripts/gpu_rl.sh OUT " in line]
    assert len(commands) >= 8 and any("--continue" in c for c in commands)
    assert all(set(re.findall(r"(?<![\w-])--[a-z-]+", c)) <= known for c in commands), (known, commands)


def export_module():
    spec = importlib.util.spec_from_file_location("export_bf16", REPO / "scripts" / "export_bf16.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_export_is_the_model_in_bf16_shards_beside_its_config_and_tokenizer(tmp_path, capsys):
    from rookworld_rlvr.model import load_policy

    source, out = REPO / "models" / "rookworld-board", tmp_path / "export"
    assert export_module().main([str(source), str(out), "--shard-mb", "4"]) == 0
    assert f"export_bf16: 8 files, 9.3 MiB in {out}" in capsys.readouterr().out
    shards = sorted(out.glob("*.safetensors"))
    assert [p.name for p in shards] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert all(p.stat().st_size <= 4_000_000 for p in shards) and (out / "model.safetensors.index.json").exists()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    config, before = (json.loads((d / "config.json").read_text()) for d in (out, source))
    assert config == {**before, "dtype": "bfloat16"}
    exported, _ = load_policy(str(out), device="cpu", verbose=False)
    model, _ = load_policy(str(source), device="cpu", verbose=False)
    # float32 from bf16
    for (name, a), b in zip(exported.state_dict().items(), model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b.to(torch.bfloat16).float(), rtol=0, atol=0, msg=name)
    for missing in ("model.safetensors", "config.json"):
        shutil.copytree(source, tmp_path / "partial", dirs_exist_ok=True)
        (tmp_path / "partial" / missing).unlink()
        with pytest.raises(SystemExit, match=f"export_bf16: {tmp_path / 'partial'} is no model directory"):
            export_module().export(tmp_path / "partial", tmp_path / "nothing")


def test_an_export_that_would_not_come_back_is_named(tmp_path):
    module = export_module()
    (tmp_path / "big.safetensors").write_bytes(b"\0" * (17 * 2**20))
    for i in range(8):
        (tmp_path / f"f{i}.json").write_text("{}")
    problems = module.check(sorted(tmp_path.iterdir()))
    assert problems == ["big.safetensors: 17.0 MiB > 16", "9 files > 8"]


def test_a_carried_stockfish_is_unpacked_without_an_xz_binary(tmp_path):
    """What travels to the GPU machine: .gpu/stockfish.xz (scripts/gpu_pack.sh --stockfish) is unpacked by Python's
    lzma, made executable and named by STOCKFISH_PATH; with none carried, nothing changes."""
    import lzma
    import shutil

    repo = tmp_path / "repo"
    (repo / ".gpu").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "gpu_wheels.sh", repo / "gpu_wheels.sh")
    engine = b"#!/bin/sh\necho 'id name carried engine'\n"
    (repo / ".gpu" / "stockfish.xz").write_bytes(lzma.compress(engine))
    script = ('set -e; . ./gpu_wheels.sh; unset STOCKFISH_PATH; use_carried_stockfish "$PY" work/stockfish; '
              'echo "path=$STOCKFISH_PATH"; "$STOCKFISH_PATH"')
    (repo / "work").mkdir()
    tools = tmp_path / "bin"  # a PATH with the few tools the function uses, and no xz
    tools.mkdir()
    for tool in ("chmod", "mv", "dirname", "basename", "sh"):
        (tools / tool).symlink_to(shutil.which(tool))
    env = {**os.environ, "PY": sys.executable, "PATH": str(tools)}
    proc = subprocess.run([shutil.which("bash"), "-c", script], cwd=repo, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"path={repo / 'work' / 'stockfish'}", "id name carried engine"]
    assert (repo / "work" / "stockfish").read_bytes() == engine and not (repo / "work" / "stockfish.tmp").exists()
    (repo / ".gpu" / "stockfish.xz").unlink()
    proc = subprocess.run([shutil.which("bash"), "-c", script.replace('; "$STOCKFISH_PATH"', "")], cwd=repo, capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0 and proc.stdout == "path=\n"


# What a GPU call carries is the tree plus .gpu/stockfish.xz (Debian's Stockfish 15.1: 20.8 MiB) and the
# python-chess wheel (0.14 MiB), 64 MiB at most (scripts/gpu_pack.sh --stockfish adds it up before a call).
TREE_BUDGET_MIB = 64 - 21 - 0.5


def tracked() -> list[str]:
    """The repository's tracked files that are here: what a GPU call carries, besides its carry."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    return [n.decode() for n in names if n and (REPO / n.decode()).is_file()]


def test_the_tree_leaves_room_on_the_gpu_machine_for_the_carried_stockfish():
    """scripts/gpu_rl.sh travels with the whole tree and a 21 MiB Stockfish: a commit that grows the tracked files
    past the budget would leave the GPU recipe unable to travel (a model shipped in the tree included)."""
    sizes = {name: (REPO / name).stat().st_size for name in tracked()}
    total = sum(sizes.values()) / 2**20
    largest = sorted(sizes, key=sizes.get)[-3:]
    assert total <= TREE_BUDGET_MIB, (f"the tracked files come to {total:.1f} MiB, over the {TREE_BUDGET_MIB} MiB "
                                      f"that leave room for Stockfish on a GPU machine; the largest: {largest}")


def report_module():
    spec = importlib.util.spec_from_file_location("gpu_rl_report", REPO / "scripts" / "gpu_rl_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_record_tar_takes_a_match_whose_pgn_is_still_growing(tmp_path):
    """The judging stages run at once, and each one that ends writes OUT/record.tar while the matches still
    append their games to their PGN files: every record written meanwhile opens, holds each file, and holds the
    PGN as far as it had got (GNU tar failed on such a file, which failed the stage that had just ended)."""
    module = report_module()
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "sft").mkdir(parents=True)
    out.mkdir()
    (work / "times.tsv").write_text("base\t16\t1796483332\n")
    (work / "selfplay_base.json").write_text('{"selfplay": {}}\n')
    (work / "sft" / "prepare.log").write_text("gpu_base: preparing\n")
    (work / "match_trained_vs_base.json.a-answers.jsonl").write_text("{}\n")  # a journal: not sent back
    pgn = work / "match_base_vs_board.pgn"
    pgn.write_text("")
    game = '[Event "rookworld match"]\n\n1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 1-0\n\n'
    stop = threading.Event()

    def play() -> None:  # a match writing its games as they end, as fast as it can
        while not stop.is_set():
            with pgn.open("a") as fh:
                fh.write(game)

    player = threading.Thread(target=play)
    player.start()
    try:
        for _ in range(40):
            module.write_record(work, out)
            with tarfile.open(out / "record.tar") as tar:
                assert tar.getnames() == ["times.tsv", "match_base_vs_board.pgn", "selfplay_base.json",
                                          "sft/prepare.log"]
                got = tar.extractfile("match_base_vs_board.pgn").read().decode()
            assert pgn.read_text().startswith(got)
    finally:
        stop.set()
        player.join()
    assert len(got) > 0 and not list(out.glob(".*"))  # games were archived; no temporary file left in OUT


def test_results_md_judges_each_goal_of_the_gpu_base_and_of_grpo():
    """results.md ends with the goals: each of the base's held-out figures against its bar (97% legal, 32% mate
    in one, ...), its self-play game and its match, then GRPO's against its base: a match won, expected-score loss
    and blunders better beyond the noise, mate in one, tactics and A: not worse. What has not run is said."""
    module = report_module()

    def share(solved: list[int]) -> dict:
        return {"n": len(solved), "solved": sum(solved) / len(solved), "solved_items": solved, "items_of": "x",
                "random": {"solved": 0.04}}

    def evaluation(mate1: list[int], tactic: list[int], loss_below: float) -> dict:
        return {"strength": {"n": 600, "legal": 0.975, "best": 0.19, "loss_below_random": loss_below,
                             "random": {"best": 0.103},
                             "loss_below_random_ci": {"low": loss_below - 0.01, "high": loss_below + 0.01}},
                "puzzles": {"mate1": share(mate1), "tactic": share(tactic)},
                "environment": {"n": 1000, "next_state_acc": 0.99, "slices": {
                    "ordinary": {"n": 800, "next_state_acc": 0.985}, "game_ending": {"n": 96, "next_state_acc": 0.96}}}}

    base = evaluation([1] * 33 + [0] * 67, [1] * 50 + [0] * 50, 0.55)
    final = evaluation([1] * 33 + [0] * 67, [0] * 20 + [1] * 30 + [0] * 50, 0.60)  # tactics: 20 of 100 lost
    match = {"games": 200, "wins": 120, "draws": 4, "losses": 76, "score": 0.61, "elo": 77.0, "elo_low": 28.0,
             "elo_high": 128.0}
    drawn = {**match, "wins": 100, "losses": 96, "elo": 7.0, "elo_low": -41.0, "elo_high": 55.0}
    text = "\n".join(module.goals({"base": base, "final": final}, {"match_base_vs_board": match,
                                                                   "match_trained_vs_base": drawn}, 61.0))
    assert "| legal best move (judged positions) | 97% | 100.0% | 97.5% | yes |" in text
    assert "| mate in one (RookWorld-LM-124M: 32.1%) | 32% | 4.0% | 33.0% | yes |" in text
    assert "| Stockfish's best move | 20% | 10.3% | 19.0% | no |" in text
    assert "| expected-score loss below the random mover's | 50% | 0.0% | 55.0% | yes |" in text
    assert "| A: next state, ordinary moves | 97% | - | 98.5% | yes |" in text
    assert "| A: next state, game-ending moves | 97% | - | 96.0% | no |" in text
    assert "| A: next state, game starts (1-move history) | 97% | - | not measured | - |" in text
    assert "| self-play from the start, legal half-moves | 60 | - | 61 | yes |" in text
    assert "| match against models/rookworld-board | won | - | +120 =4 -76, Elo +77 (+28 .. +128) | yes |" in text
    assert "| 200-game match | won | +100 =4 -96, Elo +7 (-41 .. +55) | no |" in text
    assert "| expected-score loss below the random mover's | better beyond the noise | +0.050, better | yes |" in text
    assert "| mate in one | not worse | +0.000, within noise | yes |" in text
    assert "| tactics | not worse | -0.200, worse | no |" in text
    assert "| strength.both_legal.blunder | better beyond the noise | not measured | - |" in text
    # a match lost in every game (a weak base's 2-game match): the interval's finite end, not the clamped estimate
    lost = {"games": 2, "wins": 0, "draws": 0, "losses": 2, "score": 0.0, "elo": -191.0, "elo_low": -191.0,
            "elo_high": 43.0}
    text = "\n".join(module.goals(None, {"match_base_vs_board": lost, "match_trained_vs_base": None}, None))
    assert "| +0 =0 -2, Elo +43 or lower (95% CI; every game lost) | no |" in text and "-191" not in text
    nothing = "\n".join(module.goals(None, {"match_base_vs_board": None, "match_trained_vs_base": None}, None))
    assert nothing.count("not measured | - |") == len(module.BASE_GOALS) + len(module.GRPO_GOALS)
    assert nothing.count("not played | - |") == 3
