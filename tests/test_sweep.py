"""Sweeps: real Optuna studies (SQLite) over real tiny training runs."""

import json
import multiprocessing as mp
import time

import optuna
import pytest
import yaml
from conftest import held_out_fields
from test_trainer import varied_reward

from rookworld_rlvr.metrics import held_out_se
from rookworld_rlvr.sweep.cli import main as sweep_main
from rookworld_rlvr.sweep.space import load_space, resolve
from rookworld_rlvr.sweep.trials import run_sweep

QUIET = lambda *_: None  # noqa: E731


def tiny_base(tiny_model_dir, small_data, drop=(), **over):
    base = dict(model=str(tiny_model_dir), data=str(small_data / "train.jsonl"), eval_data=str(small_data / "eval.jsonl"),
                eval_limit=2, steps=1, batch_positions=2, group_size=2, max_new_tokens=8, warmup_steps=0,
                save_every=1, tensorboard=False, progress=False, report=False, engine_cache=None, device="cpu",
                threads=1, seed=1, **held_out_fields(small_data))
    base.update(over)
    return {k: v for k, v in base.items() if k not in drop}


def write_space(path, **space):
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def trials_of(out, name):
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{(out / 'study.db').resolve()}")
    return [t for t in study.get_trials() if not t.user_attrs.get("surplus")]


def test_every_swept_parameter_reaches_the_trainer_config(tmp_path, tiny_model_dir, small_data):
    """Ranges (float, log float, int), choices and tied points all land in <trial>/config.yaml as sampled."""
    points = [{"top_p": 0.9, "entropy_coef": 0.01}, {"top_p": 1.0, "entropy_coef": 0.0}]
    space = write_space(tmp_path / "space.yaml", sampler="tpe", base=tiny_base(tiny_model_dir, small_data, drop=("group_size",)),
                        params={"lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
                                "kl_coef": {"low": 0.0, "high": 0.2},
                                "clip_range": {"choices": [0.1, 0.3]},
                                "group_size": {"type": "int", "low": 2, "high": 3},
                                "temperature": {"low": 0.7, "high": 1.3}},
                        points=points)
    out = tmp_path / "out"
    summary = run_sweep(space, trials=2, out=out, seed=3, reward_fn=varied_reward, log=QUIET)
    assert summary["complete"] == 2, summary["failures"]
    trials = trials_of(out, "space")
    assert len(trials) == 2
    for t in trials:
        expected = {k: t.params[k] for k in ("lr", "kl_coef", "clip_range", "group_size", "temperature")}
        expected.update(points[t.params["points"]])
        saved = yaml.safe_load((out / f"trial_{t.number}" / "config.yaml").read_text())
        assert {k: saved[k] for k in expected} == expected
        assert t.user_attrs["overrides"] == expected
        assert saved["output_dir"] == str((out / f"trial_{t.number}").resolve()) and saved["resume"] is False
        assert saved["steps"] == 1 and saved["max_new_tokens"] == 8  # the base reaches it too
        assert isinstance(saved["group_size"], int) and 2 <= saved["group_size"] <= 3
        assert 1e-5 <= saved["lr"] <= 1e-3 and 0.7 <= saved["temperature"] <= 1.3
        for key in ("base_reward", "final_reward", "gain", "steps", "seconds", "status"):
            assert key in t.user_attrs, key
        assert t.value == t.user_attrs["final_reward"]
        assert t.user_attrs["gain"] == pytest.approx(t.user_attrs["final_reward"] - t.user_attrs["base_reward"])
        s = json.loads((out / f"trial_{t.number}" / "summary.json").read_text())  # paired over the same rows
        assert t.user_attrs["gain_se"] is not None and t.user_attrs["gain_se"] == pytest.approx(held_out_se(s["final"], s["base"]))
        assert t.user_attrs["steps"] == 1 and t.user_attrs["status"] == "complete"
    assert trials[0].params != trials[1].params
    assert (out / "summary.json").exists() and (out / "sweep.png").exists()


def test_a_trial_stopped_by_a_guard_is_failed_with_its_reason_and_the_sweep_goes_on(tmp_path, tiny_model_dir, small_data):
    # a high LR with a tiny KL threshold and no recoveries: the real KL guard stops the run
    base = tiny_base(tiny_model_dir, small_data, steps=3, group_size=4, max_new_tokens=16, lr=0.05, kl_coef=0.01,
                     guard_max_recoveries=0, save_every=100)
    space = write_space(tmp_path / "guard.yaml", base=base,
                        params={"guard_kl_mean": {"choices": [1e-9, 1000.0]}})
    out = tmp_path / "out"
    summary = run_sweep(space, out=out, seed=1, reward_fn=varied_reward, log=QUIET)
    trials = trials_of(out, "guard")
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE], \
        "sampler seed 1 puts the failing point first, so the sweep must continue after it"
    failed, ok = trials
    assert failed.params["guard_kl_mean"] == 1e-9
    assert "kl_mean" in failed.user_attrs["failure"] and "guard_kl_mean" in failed.user_attrs["failure"]
    assert failed.user_attrs["status"] == "stopped" and failed.user_attrs["base_reward"] is not None
    assert ok.user_attrs["steps"] == 3
    assert summary["failed"] == 1 and summary["complete"] == 1 and summary["success_rate"] == 0.5
    assert summary["best"]["trial"] == ok.number
    assert "kl_mean" in summary["failures"][0]["reason"]
    # the stability report: the stopped run names its cause; the other (a random model's held-out reward
    # does not move in 3 steps) is intact
    assert (failed.user_attrs["outcome"], failed.user_attrs["guard_signals"]) == ("stopped", ["kl_mean"])
    assert ok.user_attrs["outcome"] == "intact" and ok.user_attrs["guard_events"] == 0
    o = summary["outcomes"]
    assert (o["intact"], o["stopped"], o["silent_collapse"], o["stop_causes"], o["counted"]) == (1, 1, 0, ["kl_mean"], 2)


def test_outcomes_count_intact_stopped_and_silent_collapses():
    from rookworld_rlvr.sweep.summary import _outcome_counts, format_summary, outcome

    assert outcome("COMPLETE", 0.50, 0.49, 0, False) == "intact"  # within 0.02 of the base
    assert outcome("COMPLETE", 0.50, 0.60, 2, False) == "intact"  # recovered and fine
    assert outcome("COMPLETE", 0.50, 0.44, 0, False) == "silent_collapse"  # 0.06 below, nobody noticed
    assert outcome("COMPLETE", 0.50, 0.44, 1, False) == "degraded"  # the guards saw it but did not undo it
    assert outcome("COMPLETE", 0.50, 0.47, 0, False) == "degraded"  # between the two bounds
    assert outcome("FAIL", 0.50, None, 2, True) == "stopped"
    assert outcome("FAIL", 0.50, None, 0, False) == "error"
    rows = [{"trial": i, "state": st, "outcome": oc, "guard_events": ev, "guard_signals": sig}
            for i, (st, oc, ev, sig) in enumerate([("COMPLETE", "intact", 0, []), ("COMPLETE", "intact", 1, ["valid/P"]),
                                                   ("FAIL", "stopped", 3, ["valid/P", "kl_mean"]),
                                                   ("COMPLETE", "silent_collapse", 0, []), ("RUNNING", None, 0, [])])]
    counts = _outcome_counts(rows)
    assert counts == {"intact": 2, "stopped": 1, "silent_collapse": 1, "degraded": 0, "error": 0,
                      "intact_after_recovery": 1, "stop_causes": ["kl_mean"], "counted": 4}
    text = format_summary({"study": "s", "finished": 4, "trials": 5, "complete": 3, "failed": 1, "running": 1,
                           "waiting": 0, "success_rate": 0.75, "best": None, "gain": None, "duplicates": [],
                           "outcomes": counts, "trial_table": []})
    assert "outcomes of 4 runs: 2 intact (1 after a guard recovery), 1 stopped with a named cause (kl_mean), " \
           "1 silent collapses" in text


@pytest.mark.slow(seconds=12)
def test_two_workers_share_one_sqlite_study_without_running_a_grid_point_twice(tmp_path, tiny_model_dir, small_data,
                                                                               capsys):
    space = write_space(tmp_path / "grid4.yaml", base=tiny_base(tiny_model_dir, small_data),
                        params={"lr": {"choices": [1e-4, 3e-4]}, "temperature": {"choices": [0.8, 1.2]}})
    out = tmp_path / "out"
    argv = ["--space", str(space), "--out", str(out)]  # default storage: sqlite:///<out>/study.db, real chess reward
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=sweep_main, args=(argv,)) for _ in range(2)]
    for w in workers:
        w.start()
    deadline = time.time() + 150
    for w in workers:
        w.join(max(1.0, deadline - time.time()))
    for w in workers:
        if w.is_alive():
            w.kill()
    assert all(w.exitcode == 0 for w in workers), [w.exitcode for w in workers]
    trials = trials_of(out, "grid4")
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials), [(t.state, t.user_attrs) for t in trials]
    points = [(t.params["lr"], t.params["temperature"]) for t in trials]
    assert len(points) == 4 and len(set(points)) == 4, points
    assert sorted(points) == [(1e-4, 0.8), (1e-4, 1.2), (3e-4, 0.8), (3e-4, 1.2)]
    for t in trials:  # every trial ran in its own directory with its own values
        saved = yaml.safe_load((out / f"trial_{t.number}" / "config.yaml").read_text())
        assert (saved["lr"], saved["temperature"]) == (t.params["lr"], t.params["temperature"])
    # the summary can be read back later from the storage alone; a trial's settings given with it run nothing, and
    # each is named as such
    (out / "summary.json").unlink()
    capsys.readouterr()
    assert sweep_main(["--summary", "--out", str(out), "--trials", "9", "--lr", "1e-3"]) == 0
    err = capsys.readouterr().err
    assert "warning: setting without effect: --trials: --summary runs no trial" in err
    assert "warning: setting without effect: --lr: --summary runs no trial" in err
    assert len(trials_of(out, "grid4")) == 4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] == 4 and summary["success_rate"] == 1.0 and not summary["duplicates"]
    assert summary["gain"]["n"] == 4 and summary["gain"]["min"] <= summary["gain"]["median"] <= summary["gain"]["max"]
    for r in summary["trial_table"]:  # best/ beside final/: its step and reward, so the table says which is better
        assert r["best_step"] is not None and r["best_reward"] >= r["final_reward"] - 1e-12
        assert (out / f"trial_{r['trial']}" / "best" / "model.safetensors").exists()


def test_an_interrupted_trial_is_queued_again_and_rerun(tmp_path, tiny_model_dir, small_data):
    space = write_space(tmp_path / "resume.yaml", base=tiny_base(tiny_model_dir, small_data),
                        params={"temperature": {"choices": [0.8, 1.2]}})
    out = tmp_path / "out"
    calls = {"n": 0}

    def interrupted_once(*a):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt  # Ctrl-C (or SIGTERM) in the middle of the first trial
        return varied_reward(*a)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(space, out=out, reward_fn=interrupted_once, log=QUIET)
    summary = run_sweep(space, out=out, reward_fn=varied_reward, log=QUIET)  # the restarted worker
    trials = trials_of(out, "resume")
    first, retry = trials[0], next(t for t in trials if t.user_attrs.get("retry_of") == 0)
    assert first.state == optuna.trial.TrialState.FAIL and first.user_attrs["requeued"]
    assert retry.state == optuna.trial.TrialState.COMPLETE and retry.params == first.params
    assert summary["complete"] == 2 and summary["failed"] == 0 and summary["interrupted_and_requeued"] == 1
    assert sorted(r["overrides"]["temperature"] for r in summary["trial_table"]) == [0.8, 1.2]


def test_unknown_or_invalid_params_are_clear_errors_naming_the_file(tmp_path, capsys):
    bad = write_space(tmp_path / "typo.yaml", params={"kl_coeff": {"choices": [0.0, 0.1]}})
    with pytest.raises(ValueError, match=r"typo\.yaml: params: 'kl_coeff' is not a config field; did you mean kl_coef"):
        load_space(bad)
    assert sweep_main(["--space", str(bad), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "kl_coeff" in err
    assert not (tmp_path / "o").exists(), "nothing may run (or be created) for a bad space"
    with pytest.raises(ValueError, match=r"b\.yaml: base: 'lrate'"):
        load_space(write_space(tmp_path / "b.yaml", base={"lrate": 1}, params={"lr": {"choices": [1e-5]}}))
    with pytest.raises(ValueError, match=r"p\.yaml: points\[1\]: 'gruop_size'"):
        load_space(write_space(tmp_path / "p.yaml", points=[{"group_size": 4}, {"gruop_size": 8}]))
    with pytest.raises(ValueError, match=r"r\.yaml: params: 'lr' is a range; the grid sampler needs 'choices'"):
        load_space(write_space(tmp_path / "r.yaml", sampler="grid", params={"lr": {"low": 1e-6, "high": 1e-4}})).grid()
    with pytest.raises(ValueError, match=r"v\.yaml: params\.group_size value 1: .*must be >= 2"):
        run_sweep(write_space(tmp_path / "v.yaml", params={"group_size": {"choices": [1, 4]}}), out=tmp_path / "v",
                  log=QUIET)
    assert not (tmp_path / "v").exists()
    # an entry of another type than its place wants: named, not a TypeError from inside the loader
    with pytest.raises(ValueError, match=r"n\.yaml: params\.seed: low must be a number, got \[1\]"):
        load_space(write_space(tmp_path / "n.yaml", params={"seed": {"low": [1], "high": 3}}))
    with pytest.raises(ValueError, match=r"c\.yaml: config must be the path of a preset \(a YAML file\), got True"):
        resolve(write_space(tmp_path / "c.yaml", config=True, params={"seed": {"choices": [0, 1]}}), None, None, None,
                None)
    typo = write_space(tmp_path / "m.yaml", base={"model": str(tmp_path / "no-model")}, params={"lr": {"choices": [1e-5]}})
    assert sweep_main(["--space", str(typo), "--out", str(tmp_path / "m"), "--dry-run"]) == 1
    assert f"problem: model: no such model directory: {tmp_path / 'no-model'}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, idle", [
    (["--summary", "--out", "o"], []),
    (["--summary", "--space", "s.yaml"], []),  # --space names the study
    (["--summary", "--space", "s.yaml", "--study", "x", "--config", "c.yaml", "--sampler-seed", "0", "--dry-run"],
     ["--space: --summary", "--config: --summary", "--sampler-seed: --summary", "--dry-run: --summary"]),
    (["--requeue-running", "--out", "o", "--sampler", "tpe", "--kl-coef", "0", "--resume", "false"],
     ["--sampler: --requeue-running", "--kl-coef: --requeue-running", "--resume: --requeue-running"]),
    (["--space", "s.yaml", "--dry-run", "--storage", "sqlite:///x.db", "--sampler-seed", "3", "--lr", "1e-5"],
     ["--storage: --dry-run", "--sampler-seed: --dry-run"]),
    (["--space", "s.yaml", "--storage", "sqlite:///x.db", "--sampler-seed", "3", "--trials", "2", "--lr", "1e-5"],
     []),
])
def test_a_sweeps_options_that_nothing_of_the_call_reads_are_named(argv, idle):
    """`--summary` and `--requeue-running` run no trial and `--dry-run` opens no study: what only they would read
    was taken without a word."""
    from rookworld_rlvr.sweep.cli import _parser, inert_options

    notes = inert_options(_parser().parse_args(argv))
    assert [n.split(" runs ")[0].split(" lists ")[0] for n in notes] == idle


def test_a_storage_that_is_no_optuna_study_database_is_one_error_line(tmp_path, capsys):
    """A SQLite file another program made (its own `studies` table), or no database at all, given as --storage:
    optuna's StorageInternalError ended `--summary` and a sweep's start in a traceback, and SQLAlchemy's words
    came with its SQL and a link on lines of their own."""
    import sqlite3

    from rookworld_rlvr.sweep.study import open_study

    foreign, garbage = tmp_path / "other.db", tmp_path / "garbage.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE studies (x INTEGER)")
    garbage.write_text("not a database")
    space = write_space(tmp_path / "s.yaml", params={"seed": {"choices": [0, 1]}})
    for db, said in ((foreign, "no such column: studies.study_id"), (garbage, "file is not a database")):
        assert sweep_main(["--space", str(space), "--storage", f"sqlite:///{db}", "--summary"]) == 1
        err = capsys.readouterr().err
        assert f"error: storage sqlite:///{db}: (sqlite3." in err and said in err and len(err.splitlines()) == 1, err
    with pytest.raises(ValueError, match=rf"^storage sqlite:///{foreign}: \(sqlite3\.OperationalError\) .*study_name "
                                         r"\(not an Optuna study database, or a damaged one\?\)$"):
        open_study(f"sqlite:///{foreign}", "x", None)


def test_the_stability_preset_covers_every_value_in_at_least_24_valid_configurations(monkeypatch):
    from conftest import REPO

    from rookworld_rlvr.config import load_config

    monkeypatch.chdir(REPO)
    space = load_space("configs/sweeps/stability.yaml")
    configs = space.grid_overrides()
    assert len(configs) >= 24 and len({json.dumps(c, sort_keys=True) for c in configs}) == len(configs)
    assert {c["lr"] for c in configs} == {1e-6, 1e-5, 1e-4}
    assert {c["kl_coef"] for c in configs} == {0.0, 0.005, 0.05, 0.2}
    assert {c["clip_range"] for c in configs} == {0.1, 0.2, 0.3}
    assert {c["group_size"] for c in configs} == {4, 8}
    for c in configs:
        cfg = load_config(space.config, {**space.base, **c})
        assert cfg.steps == 30 and cfg.eval_limit == 100 and not (cfg.report or cfg.tensorboard or cfg.progress)
        assert cfg.updates_per_batch > 1, "with one update per batch clip_range has no effect"


def test_editing_the_config_file_mid_sweep_does_not_change_later_trials(tmp_path, tiny_model_dir, small_data):
    """The configuration file is read once when the sweep starts."""
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump({"temperature": 0.9}))
    space = write_space(tmp_path / "edit.yaml", config=str(config), base=tiny_base(tiny_model_dir, small_data),
                        params={"clip_range": {"choices": [0.1, 0.3]}})

    def editing_reward(prompts, completions, truths, weights):  # a user edits the file during trial 0
        config.write_text(yaml.safe_dump({"temperature": 0.5}))
        return varied_reward(prompts, completions, truths, weights)

    out = tmp_path / "out"
    summary = run_sweep(space, out=out, seed=1, reward_fn=editing_reward, log=QUIET)
    assert summary["complete"] == 2
    assert yaml.safe_load(config.read_text())["temperature"] == 0.5
    for t in trials_of(out, "edit"):
        assert yaml.safe_load((out / f"trial_{t.number}" / "config.yaml").read_text())["temperature"] == 0.9


def test_the_std_floor_comparison_runs_each_mode_at_three_seeds_on_the_shipped_task(monkeypatch):
    from conftest import REPO

    from rookworld_rlvr.config import load_config

    monkeypatch.chdir(REPO)
    space = load_space("configs/sweeps/std_floor.yaml")
    configs = [load_config(space.config, {**space.base, **c}) for c in space.grid_overrides()]
    assert sorted((c.std_floor_mode, c.std_floor, c.seed) for c in configs) == \
        [("add", 1e-4, s) for s in range(3)] + [("max", 0.05, s) for s in range(3)]
    assert all(c.steps == 150 and c.model == "models/rookworld-board" for c in configs)  # make train's run


def test_the_collapse_preset_reaches_the_settings_that_break_runs_with_the_guards_on(monkeypatch):
    from conftest import REPO

    from rookworld_rlvr.config import TrainConfig, load_config

    monkeypatch.chdir(REPO)
    space = load_space("configs/sweeps/collapse.yaml")
    configs = [load_config(space.config, {**space.base, **c}) for c in space.grid_overrides()]
    assert len(configs) == 24  # 30 steps x 4 prompts each: about an hour with two one-thread workers
    assert {c.lr for c in configs} == {1e-5, 1e-4, 1e-3} and {c.kl_coef for c in configs} == {0.0, 0.04, 0.2}
    assert {c.clip_range for c in configs} == {0.2, 0.3} and {c.group_size for c in configs} == {4, 8}
    assert {c.loss_type for c in configs} == {"grpo", "bnpo", "dr_grpo", "dapo"}
    for lr in (1e-5, 1e-4, 1e-3):  # every learning rate meets both clip ranges and both group sizes
        at = [c for c in configs if c.lr == lr]
        assert {c.clip_range for c in at} == {0.2, 0.3} and {c.group_size for c in at} == {4, 8}
    default = TrainConfig()
    guards = [f for f in vars(default) if f.startswith("guard_")]
    for c in configs:
        assert (c.steps, c.batch_positions, c.eval_every) == (30, 4, 10) and c.updates_per_batch == 2
        assert all(getattr(c, f) == getattr(default, f) for f in guards), "the guards run as shipped"
        assert c.inert_settings() == []
    six = load_space("configs/sweeps/collapse-six.yaml")  # a subset of the grid, each run as the grid runs it
    subset = [load_config(six.config, {**six.base, **c}) for c in six.grid_overrides()]
    assert len(subset) == 6 and all(c in configs for c in subset)
    trust = [load_config(space.config, {**load_space("configs/sweeps/trust_region.yaml").base, **c})
             for c in load_space("configs/sweeps/trust_region.yaml").grid_overrides()]
    assert {(c.importance_sampling_level, c.clip_delta) for c in trust} == {
        ("token", None), ("token", 1.5), ("sequence", None), ("sequence", 1.5)}


def test_a_trials_report_that_fails_is_logged_and_the_trial_counts(tmp_path, tiny_model_dir, small_data, monkeypatch,
                                                                   capsys):
    """The trial's run is done and saved when its report is drawn: a report that fails (here: no font) is logged,
    and the trial is complete with its result, not failed."""
    from rookworld_rlvr.report import page

    def broken(_runs):
        raise RuntimeError("no font")

    monkeypatch.setattr(page, "write_report", broken)
    space = write_space(tmp_path / "space.yaml", base=tiny_base(tiny_model_dir, small_data, report=True),
                        params={"lr": {"choices": [1e-4]}})
    summary = run_sweep(space, out=tmp_path / "out", seed=1, reward_fn=varied_reward, log=QUIET)
    assert summary["complete"] == 1 and summary["failed"] == 0, summary["failures"]
    assert "report: not written: RuntimeError: no font" in capsys.readouterr().out  # the trial's log

