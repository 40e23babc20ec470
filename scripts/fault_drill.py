#!/usr/bin/env python
"""Fault drill: a GRPO run and an SFT run, each killed (SIGKILL) at random points and resumed with
`--resume`, must end bit for bit equal to the same run left alone, and no kill may leave a
checkpoint that does not load. `--tasks ddp` drills the GRPO run under `torchrun` on 2 processes
(gloo on CPU; Linux, it finds the ranks in /proc), `sft-ddp` the SFT run: in turn rank 1 stopped
(SIGSTOP: a rank that hangs), torchrun itself killed, rank 0 killed and rank 1 killed, and the run
must end by itself within a bound and leave no process behind: nothing hangs.

    python scripts/fault_drill.py                       # 20 kills each (about 15 minutes on 2 cores)
    python scripts/fault_drill.py --kills 2 --smoke     # what tests/test_fault_drill.py runs
    python scripts/fault_drill.py --tasks ddp           # a rank of a torchrun run, or torchrun, hit 20 times
    python scripts/fault_drill.py --tasks ddp --ddp-rollbacks   # the same while the guard rolls the run back
    python scripts/fault_drill.py --tasks sft-ddp       # the SFT run under torchrun, hit 20 times

How: the uninterrupted run goes first; its wall time W is measured and its saves and deletions
counted. Then the same command runs again and is killed either after a time drawn uniformly from
[0, W) (seeded), which lands in start-up, steps and evaluations alike, or (half the kills, also
drawn) the moment a save or a deletion of a checkpoint starts, which a random time rarely hits:
which one is drawn too, from the first to the last the run has still to make. After each kill every
checkpoint on disk is loaded (weights and state), then the command is started again with
`--resume`. When a resumed attempt finishes before its kill, its outputs are compared with the
uninterrupted run's: the final (and best) weights byte for byte, and every log record except
wall-clock times, and nothing a killed save wrote may be left in its folders; the next kills then
start a fresh copy of the run. It ends once `--kills` kills have landed and the last copy has
finished and compared.

Writes <out>/drill.json (one row per kill) and prints a summary. Exit status 1 when any resumed run
differs or any checkpoint does not load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMING_KEYS = ("seconds", "minutes")  # wall-clock fields: the only ones allowed to differ
TASKS = ("grpo", "sft", "ddp", "sft-ddp")
UNDER_TORCHRUN = ("ddp", "sft-ddp")
RANKS = 2  # processes of the ddp task
STEP_TIMEOUT_MINUTES = 0.25  # the ddp run's step_timeout_minutes: a stopped rank ends the run this long after
ENGINE_GRACE_S = 5.0  # an engine quits once its rank is gone: what still runs this long after the end is left running
TEARDOWN_S = 120.0  # after one rank is killed or stopped, torchrun must have ended the run within this (else: a hang)
AGENT = "torchrun"  # a fault's target: torchrun itself rather than one of its ranks
# the ddp task's faults in turn: (rank or torchrun, signal)
FAULTS = ((1, "SIGSTOP"), (AGENT, "SIGKILL"), (0, "SIGKILL"), (1, "SIGKILL"))
MARK = "ROOKWORLD_DRILL_RUN"  # set in every process a drill run starts, so that none is missed or left behind


def subset(src: Path, dst: Path, per_task: int) -> Path:
    """The first `per_task` P: and A: rows of a shipped data file: a run that starts in seconds."""
    keep, counts = [], {"P": 0, "A": 0}
    from rookworld_rlvr.data.io import open_text

    with open_text(src) as fh:
        for line in fh:
            task = json.loads(line)["task"]
            if counts[task] < per_task:
                keep.append(line)
                counts[task] += 1
            if min(counts.values()) >= per_task:
                break
    dst.write_text("".join(keep))
    return dst


def grpo_command(out: Path, data: Path, smoke: bool, model: str, rollbacks: bool = True) -> list[str]:
    """`make train`'s config on a small slice: anchor, puzzles, check positions, held-out evaluation
    with Stockfish and best/ all on; a checkpoint every 2 steps, so kills land in saves and between.
    At lr 1e-3 the held-out evaluation falls and the collapse guard rolls the run back to its best
    state (once in the smoke run, twice in the full one), so kills land in and after rollbacks too.
    Without `rollbacks`, `make train`'s lr (3e-5), at which these runs never roll back."""
    return [sys.executable, "-m", "rookworld_rlvr", "train", "--config", str(REPO / "configs" / "default.yaml"),
            "--model", model, "--data", str(data), *(["--lr", "1e-3"] if rollbacks else []),
            "--eval-limit", "4" if smoke else "8",
            "--history-eval-data", "", "--strength-data", "", "--puzzle-eval-data", "",
            "--steps", "4" if smoke else "12", "--batch-positions", "2", "--group-size", "4",
            "--anchor-batch", "4", "--eval-every", "2" if smoke else "4", "--save-every", "2", "--keep-last", "2",
            "--threads", "1", "--progress", "false", "--report", "false", "--output-dir", str(out),
            # the base's evaluation answers, kept by the first run: the later copies read them back
            "--eval-cache", str(out.parent / "eval-cache"),
            # float32, not auto: auto times a bf16 product at each start, and a busy CPU can read it slow, so two
            # runs compared bit for bit could differ in precision (a resume keeps its run's choice; a new run not)
            "--backward-dtype", "float32"]


def ddp_command(out: Path, data: Path, smoke: bool, model: str, rollbacks: bool = False) -> list[str]:
    """`grpo_command` under torchrun on 2 processes: 4 prompts a step, one `P:` and one `A:` per rank;
    by default without rollbacks, which double its time (`tests/test_distributed.py` rolls two ranks back
    alike). A rank that waits STEP_TIMEOUT_MINUTES at a step's collective ends the run."""
    cmd = grpo_command(out, data, smoke, model, rollbacks=rollbacks)
    cmd[cmd.index("--batch-positions") + 1] = "4"
    return torchrun(cmd)


def torchrun(cmd: list[str]) -> list[str]:
    """`cmd` (`python -m rookworld_rlvr ...`) under torchrun on RANKS processes, a rank that waits
    STEP_TIMEOUT_MINUTES at a step's collective ending the run."""
    cmd = cmd + ["--step-timeout-minutes", str(STEP_TIMEOUT_MINUTES)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS), *cmd[1:]]


def sft_command(out: Path, data: Path, eval_data: Path, smoke: bool) -> list[str]:
    """A fresh tiny model on a small slice: checkpoints every 3 steps, evaluations with Stockfish."""
    return [sys.executable, "-m", "rookworld_rlvr", "sft", "--data", str(data), "--eval-data", str(eval_data),
            "--out", str(out / "model"), "--preset", "tiny", "--steps", "6" if smoke else "24",
            "--batch-size", "4" if smoke else "8", "--save-every", "3", "--eval-every", "6" if smoke else "12",
            "--eval-samples", "2", "--threads", "1", "--quiet"]


# -- what a run leaves, and whether it loads -----------------------------------------------------------


def tensor_bytes(path: Path) -> dict[str, bytes]:
    """Every tensor of a safetensors file as raw bytes (bit-for-bit comparison, NaN and -0.0 included)."""
    import torch
    from safetensors.torch import load_file

    return {k: v.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for k, v in load_file(path).items()}


def untimed(value):
    """`value` without wall-clock fields, at any depth (an evaluation's `meta.seconds` included)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not k.startswith("time/") and k not in TIMING_KEYS}
    return [untimed(v) for v in value] if isinstance(value, list) else value


def records(path: Path) -> list[dict]:
    return [untimed(json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []


def outputs(task: str, out: Path) -> dict:
    """What a finished run produced, in comparable form."""
    if not task.startswith("sft"):
        summary = untimed(json.loads((out / "summary.json").read_text()))
        return {"final": tensor_bytes(out / "final" / "model.safetensors"),
                "best": tensor_bytes(out / "best" / "model.safetensors") if (out / "best").exists() else None,
                "metrics.jsonl": records(out / "metrics.jsonl"), "eval.jsonl": records(out / "eval.jsonl"),
                "events.jsonl": records(out / "events.jsonl"), "summary.json": summary}
    return {"final": tensor_bytes(out / "model" / "model.safetensors"),
            "checkpoint": tensor_bytes(out / "model.checkpoint" / "model.safetensors"),
            "sft_log.jsonl": records(out / "model.sft_log.jsonl")}


def differences(a: dict, b: dict) -> list[str]:
    """Names of the outputs that differ (for tensors: the first differing tensor)."""
    diff = []
    for name in a:
        x, y = a[name], b.get(name)
        if isinstance(x, dict) and x and all(isinstance(v, bytes) for v in x.values()):
            bad = [k for k in x if y is None or x[k] != y.get(k)]
            if bad or set(x) != set(y or {}):
                diff.append(f"{name}: tensor {bad[0] if bad else '(names)'} differs")
        elif x != y:
            diff.append(f"{name} differs")
    return diff


def check_checkpoints(task: str, out: Path) -> tuple[list[str], int | None, bool]:
    """Load every checkpoint a kill left: (problems, latest step, whether the kill hit a save:
    a temporary or set-aside directory is left). Runs before `--resume` touches anything."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    problems: list[str] = []
    if not task.startswith("sft"):
        from rookworld_rlvr.grpo import checkpoint as ckpt

        root = out / "checkpoints"
        in_save = bool(hidden([out, root]))
        latest = None
        try:
            path = ckpt.latest_checkpoint(out)  # what --resume reads (it puts back a set-aside checkpoint)
            latest = ckpt.load_state(path)["step"] if path else None
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            problems.append(f"latest checkpoint: {e}")
        for step, path in ckpt.list_checkpoints(out):
            try:
                if ckpt.load_state(path)["step"] != step:
                    problems.append(f"{path}: state of another step")
                AutoModelForCausalLM.from_pretrained(path)
            except Exception as e:  # noqa: BLE001
                problems.append(f"{path}: {e}")
        for name in ("final", "best"):
            if (out / name).exists():
                try:
                    AutoModelForCausalLM.from_pretrained(out / name)
                except Exception as e:  # noqa: BLE001
                    problems.append(f"{out / name}: {e}")
        return problems, latest, in_save
    from rookworld_rlvr.atomic import restore_aside
    from rookworld_rlvr.statefile import load_state, state_exists

    ck = out / "model.checkpoint"
    in_save = bool(hidden([out]))
    restore_aside(ck)  # what --resume does first
    latest = None
    if ck.exists():
        try:
            if not state_exists(ck, "sft_state"):
                raise ValueError("weights without sft_state")
            latest = load_state(ck, "sft_state")["step"]
            AutoModelForCausalLM.from_pretrained(ck)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{ck}: {e}")
    if (out / "model").exists():
        try:
            AutoModelForCausalLM.from_pretrained(out / "model")
        except Exception as e:  # noqa: BLE001
            problems.append(f"{out / 'model'}: {e}")
    return problems, latest, in_save


# -- the drill ------------------------------------------------------------------------------------------


def hidden(folders: list[Path]) -> set[Path]:
    """The temporary and set-aside directories (`.NAME.tmp-*`, `.NAME.old-*`, `.NAME.del-*`) in
    `folders`: a checkpoint or model is being saved or deleted while one exists (a log's atomic
    rewrite uses a temporary file, not counted)."""
    return {p for f in folders if f.is_dir() for p in f.iterdir() if p.name.startswith(".") and p.is_dir()}


def folders(out: Path) -> list[Path]:
    """Where a run's saves and deletions show (`hidden`): its own folder and its checkpoints'."""
    return [out, out / "checkpoints"]


def left_behind(out: Path) -> list[str]:
    """A finished run's folders must hold no temporary or set-aside directory: one would be what a killed save
    left there for good (a model-sized copy each)."""
    left = sorted(p.name for p in hidden(folders(out)))
    return [f"left behind by killed saves: {', '.join(left)}"] if left else []


def marked(run: str) -> list[int]:
    """The live processes a drill run started, found by the mark in their environment: torchrun's
    workers start sessions of their own, so no process group holds them all."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"{MARK}={run}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return pids


def rank_pids(run: str) -> dict[int, int]:
    """The training processes of a torchrun run by rank (its Stockfish engines share their rank's
    environment but not its command line; torchrun itself has no RANK)."""
    pids = {}
    for pid in marked(run):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = next((v[5:] for v in env if v.startswith(b"RANK=")), None)
        if rank is not None and rank.isdigit() and b"rookworld_rlvr" in cmd:
            pids[int(rank)] = pid
    return pids


def kill_rank(proc: subprocess.Popen, run: str, rank: int | str, pid: int, sig: str = "SIGKILL") -> dict:
    """Send one rank (`pid`) SIGKILL (it dies) or SIGSTOP (it hangs) and wait for torchrun to end the run
    by itself; or SIGKILL torchrun itself (rank AGENT) and wait for its ranks to end by themselves.
    Whatever still runs `TEARDOWN_S` later (a hang) or after torchrun ended (an orphan) is a finding,
    then killed (SIGKILL ends a stopped process too)."""
    os.kill(proc.pid if rank == AGENT else pid, getattr(signal, sig))
    t0 = time.time()
    try:
        proc.wait(timeout=TEARDOWN_S)
        hung = False
    except subprocess.TimeoutExpired:
        hung = True
    while rank == AGENT and rank_pids(run) and time.time() - t0 < TEARDOWN_S:  # the ranks, on their own
        time.sleep(0.05)
    hung = hung or bool(rank == AGENT and rank_pids(run))
    teardown = time.time() - t0
    grace = time.time() + ENGINE_GRACE_S  # an engine whose rank died quits when it reads the end of its input
    while (left := [pid for pid in marked(run) if pid != proc.pid]) and time.time() < grace:
        time.sleep(0.1)
    for pid in left + [proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    for _ in range(1000):  # a killed process shows in /proc until the kernel has torn it down
        if not marked(run):
            break
        time.sleep(0.01)
    return {"rank": rank, "signal": sig, "teardown_s": round(teardown, 2), "hung": hung, "left_running": len(left)}


def launch(cmd: list[str], log: Path, kill_after: float | None, saves: list[Path] | None = None,
           at_save: int | None = None, rank: int | str | None = None,
           sig: str = "SIGKILL") -> tuple[bool, float, dict, int]:
    """Run `cmd`; SIGKILL its whole process group (Stockfish included) after `kill_after` seconds or,
    with `at_save`, the moment the `at_save`-th save or deletion started in this run shows in one of the
    `saves` folders (whichever comes first); with `rank` (torchrun), send that rank's process alone `sig`
    (`kill_rank`). Returns (finished, seconds, what the rank fault found, the saves and deletions seen).
    A run that exits with an error stops the drill."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           MARK: str(log)}
    before, seen = hidden(saves or []), set()
    t0 = time.time()
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        while (rc := proc.poll()) is None:
            seen |= hidden(saves or []) - before  # each save or deletion is a directory of a name of its own
            due = (kill_after is not None and time.time() - t0 >= kill_after) or (at_save and len(seen) >= at_save)
            if due and rank is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return False, time.time() - t0, {}, len(seen)
            # a fault due in start-up waits for its rank (for every rank, when torchrun is its target)
            if due and ((pids := rank_pids(str(log))).get(rank) or (rank == AGENT and len(pids) == RANKS)):
                seconds = time.time() - t0
                return False, seconds, kill_rank(proc, str(log), rank, pids.get(rank, proc.pid), sig), len(seen)
            time.sleep(0.001 if saves else 0.05)
    if rc != 0:
        raise SystemExit(f"fault drill: {' '.join(cmd)} exited with {rc}; see {log}")
    return True, time.time() - t0, {}, len(seen)


def drill(task: str, kills: int, work: Path, rng: random.Random, smoke: bool, model: str,
          ddp_rollbacks: bool = False) -> dict:
    data = subset(REPO / "data" / "train.jsonl.xz", work / "train.jsonl", 100 if smoke else 200)
    eval_data = subset(REPO / "data" / "eval.jsonl.gz", work / "eval.jsonl", 8)

    def command(out: Path) -> list[str]:
        if task.startswith("sft"):
            cmd = sft_command(out, data, eval_data, smoke)
            return torchrun(cmd) if task == "sft-ddp" else cmd
        if task == "ddp":
            return ddp_command(out, data, smoke, model, ddp_rollbacks)
        return grpo_command(out, data, smoke, model)

    straight = work / "straight"
    # the saves and deletions of the uninterrupted run, counted: a kill aimed at a save picks one of them
    _, wall, _, saves_in_run = launch(command(straight), work / "straight.log", None, folders(straight))
    reference = outputs(task, straight)
    recoveries = None if task.startswith("sft") else recovered(straight)
    if (task == "grpo" or (task == "ddp" and ddp_rollbacks)) and not recoveries:
        raise SystemExit(f"fault drill: the {task} run's guard never fired (see {straight / 'events.jsonl'}): "
                         "no kill could land in a rollback")
    rows: list[dict] = []
    rounds: list[dict] = []
    copy_no, attempt, copy_saves = 0, 0, 0
    while len(rows) < kills or attempt:  # go on until the kills have landed and the last copy has finished
        out = work / f"copy{copy_no}"
        cmd = command(out) + (["--resume"] if attempt else [])
        after = rng.uniform(0, wall) if len(rows) < kills else None
        # half the kills wait for a save instead: one drawn from those this copy has still to make (a resumed
        # attempt makes at least the run's saves less those its earlier attempts saw), the first to the last;
        # every attempt's saves are watched, so that they are counted
        in_a_save = after is not None and rng.random() < 0.5 and copy_saves < saves_in_run
        at_save = rng.randint(1, saves_in_run - copy_saves) if in_a_save else None
        aimed = f"save {at_save} of {saves_in_run - copy_saves}" if in_a_save else "a random time"
        rank, sig = (FAULTS[len(rows) % len(FAULTS)] if task in UNDER_TORCHRUN and after is not None
                     else (None, "SIGKILL"))
        finished, seconds, ranks, saved = launch(cmd, work / f"copy{copy_no}.log", wall * 2 if in_a_save else after,
                                                 folders(out), at_save, rank, sig)
        attempt, copy_saves = attempt + 1, copy_saves + saved
        if finished:
            diff = differences(reference, outputs(task, out)) + left_behind(out)
            rounds.append({"copy": copy_no, "attempts": attempt, "equal": not diff, "differences": diff})
            print(f"{task} copy {copy_no}: finished after {attempt - 1} kills: "
                  f"{'bit for bit equal' if not diff else 'DIFFERS: ' + '; '.join(diff)}", flush=True)
            copy_no, attempt, copy_saves = copy_no + 1, 0, 0
            continue
        problems, latest, in_save = check_checkpoints(task, out)
        if ranks.get("hung"):
            problems.append(f"the ranks still ran {TEARDOWN_S:.0f} s after torchrun was killed" if rank == AGENT else
                            f"torchrun still ran {TEARDOWN_S:.0f} s after rank {rank} was "
                            f"{'stopped' if sig == 'SIGSTOP' else 'killed'}")
        elif ranks.get("left_running"):
            problems.append(f"{ranks['left_running']} of its processes still ran after torchrun ended")
        rows.append({"task": task, "copy": copy_no, "kill": len(rows) + 1, "after_s": round(seconds, 2),
                     "aimed_at": aimed, **ranks,
                     "after_a_rollback": None if task.startswith("sft") else recovered(out) > 0,
                     "latest_checkpoint_step": latest, "in_save": in_save, "problems": problems})
        killed = "" if not ranks else (
            f"torchrun killed, its ranks ended in {ranks['teardown_s']:.1f} s; " if rank == AGENT else
            f"rank {rank} {'stopped (a hang)' if sig == 'SIGSTOP' else 'killed'}, torchrun ended the run in "
            f"{ranks['teardown_s']:.1f} s; ")
        print(f"{task} kill {len(rows)}/{kills} after {seconds:.1f}s (aimed at {rows[-1]['aimed_at']}): {killed}"
              f"latest checkpoint step {latest}"
              f"{', during a save' if in_save else ''}{'; ' + '; '.join(problems) if problems else ''}", flush=True)
    return {"task": task, "straight_seconds": round(wall, 1), "straight_rollbacks": recoveries, "kills": rows,
            "copies": rounds}


def recovered(out: Path) -> int:
    """How many times a GRPO run's collapse guard rolled it back so far (events.jsonl is never cut;
    a last line torn by a kill is not counted)."""
    from rookworld_rlvr.data.io import read_log

    path = out / "events.jsonl"
    return sum(r["action"] == "recover" for r in read_log(path, warn=lambda m: None)) if path.exists() else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="kills per run type (default 20)")
    ap.add_argument("--tasks", default="grpo,sft", help="grpo, sft, ddp and/or sft-ddp (GRPO or SFT under torchrun on "
                                                       "2 processes, one rank stopped or killed, or torchrun killed, "
                                                       "at a time); default grpo,sft")
    ap.add_argument("--seed", type=int, default=0, help="seeds the kill times")
    ap.add_argument("--model", default=str(REPO / "models" / "rookworld-board"), help="GRPO's policy")
    ap.add_argument("--out", default="runs/fault_drill", help="work folder; drill.json is written here")
    ap.add_argument("--smoke", action="store_true", help="tiny runs (seconds each): for the test")
    ap.add_argument("--ddp-rollbacks", action="store_true", help="the ddp task at the grpo task's lr 1e-3, where its "
                                                                 "guard rolls it back, so faults land in and after "
                                                                 "rollbacks under torchrun too (about twice as long)")
    args = ap.parse_args(argv)
    if args.kills < 1:
        ap.error("--kills must be at least 1")
    tasks = [t for t in args.tasks.split(",") if t]
    if not tasks or set(tasks) - set(TASKS):
        ap.error(f"--tasks: grpo, sft, ddp and/or sft-ddp, not {args.tasks!r}")
    root = Path(args.out)
    shutil.rmtree(root, ignore_errors=True)
    results = []
    for task in tasks:
        work = root / task
        work.mkdir(parents=True)
        results.append(drill(task, args.kills, work, random.Random(f"{args.seed}-{task}"), args.smoke, args.model,
                             args.ddp_rollbacks))
    (root / "drill.json").write_text(json.dumps(results, indent=1) + "\n")
    ok = True
    for r in results:
        bad = [k for k in r["kills"] if k["problems"]]
        unequal = [c for c in r["copies"] if not c["equal"]]
        ok &= not bad and not unequal
        for sig, what in (("SIGKILL", "rank kill"), ("SIGSTOP", "rank stop (a hang)")):
            teardown = [k["teardown_s"] for k in r["kills"] if k.get("signal") == sig and k["rank"] != AGENT]
            if teardown:
                print(f"{r['task']}: after each {what} torchrun ended the run within {max(teardown):.1f} s "
                      f"({len(teardown)} times)")
        if teardown := [k["teardown_s"] for k in r["kills"] if k.get("rank") == AGENT]:
            print(f"{r['task']}: after each kill of torchrun itself its ranks ended within {max(teardown):.1f} s "
                  f"({len(teardown)} times)")
        if r["straight_rollbacks"] is not None:
            print(f"{r['task']}: the uninterrupted run rolled back {r['straight_rollbacks']} times; "
                  f"{sum(bool(k['after_a_rollback']) for k in r['kills'])} kills came after a rollback")
        print(f"{r['task']}: {len(r['kills'])} kills ({sum(k['in_save'] for k in r['kills'])} during a save), "
              f"{len(r['copies'])} resumed copies: {len(r['copies']) - len(unequal)} bit for bit equal to the "
              f"uninterrupted run ({r['straight_seconds']} s); {len(bad)} kills left a checkpoint that does not load")
    print(f"wrote {root / 'drill.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
