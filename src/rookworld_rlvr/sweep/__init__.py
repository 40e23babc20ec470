"""`rookworld sweep`: hyperparameter sweeps over GRPO runs with Optuna.

    rookworld sweep --space configs/sweeps/stability.yaml                  # run (or join) the sweep
    rookworld sweep --space configs/sweeps/stability.yaml --dry-run        # list and validate the trials
    rookworld sweep --summary --out sweeps/stability                       # summary of a study so far

Search space file (YAML)::

    config: configs/default.yaml        # optional base preset (--config overrides it)
    base: {steps: 30, eval_limit: 100}  # optional field overrides for every trial
    params:                             # swept fields (each must be a TrainConfig field)
      kl_coef: {choices: [0, 0.005, 0.05, 0.2]}
      lr: {low: 1.0e-6, high: 1.0e-4, log: true}    # a range (type: float|int, optional step), TPE only
    points:                             # optional tied axis: each entry sets several fields at once
      - {clip_range: 0.1, group_size: 4}
      - {clip_range: 0.3, group_size: 8}
    sampler: grid                       # grid (every entry has choices) | tpe
    trials: 40                          # optional; the grid defaults to its size

The grid is the product of every `choices` list and the `points` list (one axis). Precedence,
lowest first: preset, `base`, `--key value` on the command line, the trial's values; the sweep
sets `output_dir` (`<out>/trial_<n>`) and `resume: false` itself. Every trial's configuration
goes through `load_config` (the same validation as `rookworld train`), and after the run the
sweep checks that every swept value is in the trainer's saved `config.yaml`.

Each trial is an isolated training run. Objective (maximised): the held-out greedy reward at the
end, the mean of `policy` and `environment` `mean_reward` of the final evaluation. User attrs:
`base_reward`, `final_reward`, `gain`, `steps`, `seconds`, `status`, `overrides`,
`output_dir`, `worker`, `failure` (the reason) for failed trials, `guard_events` and `guard_signals`
(from the run's events.jsonl) and `outcome`. A run that a guard stops (non-finite loss, a collapse
signal, see `TrainingStopped`) or that raises is a FAILED trial; the sweep goes on.

The stability report counts outcomes: intact (every step ran, held-out reward >= base - 0.02),
stopped (a guard stopped it and named the cause), silent collapse (finished, held-out reward
< base - 0.05, no guard event), degraded (finished, neither) and error (any other failure).

Storage and several workers. The study lives in an Optuna RDB storage: by default SQLite at
`sqlite:///<out>/study.db`. Every worker started with the same `--storage URL --study NAME`
(and the same space file) joins the same study; each keeps asking for trials until the study
holds the target number (`--trials`, or the grid size), so start as many as you like::

    rookworld sweep --space S.yaml --out sweeps/s &     # worker 1
    rookworld sweep --space S.yaml --out sweeps/s &     # worker 2, same SQLite file

For several machines use a server database reachable from all of them (install its driver)::

    --storage postgresql://user:pass@host:5432/optuna    (pip install psycopg2-binary)
    --storage mysql+pymysql://user:pass@host/optuna      (pip install pymysql)

Grid points are handed out by Optuna's GridSampler from the shared study (trial n gets point n
of the grid shuffled with `--sampler-seed`, which therefore must be the same on every worker; it
is 0 by default): two workers never run the same point. TPE workers use the constant liar; give
each TPE worker a different `--sampler-seed` (or none). A worker stopped with Ctrl-C or SIGTERM marks
its trial FAILED ("interrupted", excluded from the statistics) and queues the same
configuration again, so a restarted worker redoes it. A worker killed hard leaves its trial
RUNNING: when no worker is alive, `--requeue-running` does the same for those trials.

The package:

    space.py    the search space file: parse, check, the grid, the base configuration
    study.py    Optuna storage and study: create or join, requeue interrupted trials
    trials.py   one trial (an isolated training run) and the worker loop
    summary.py  outcomes, the summary, summary.json and the gains plot (`report.plots`)
    cli.py      `rookworld sweep` and SIGTERM handling

Owns sweeps. Imports optuna and the trainer inside functions only (a trial is a `grpo.cli.build`
run), so `rookworld --help` stays fast.
"""
