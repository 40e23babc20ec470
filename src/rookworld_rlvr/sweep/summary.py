"""A sweep's outcome: each trial's outcome, the summary, summary.json and the gains plot.

Owns the stability report's definitions (intact, stopped, silent collapse, degraded, error).
Imports no torch; optuna inside functions only.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable

from rookworld_rlvr.report.plots import sweep_plot
from rookworld_rlvr.sweep.space import fmt_overrides
from rookworld_rlvr.sweep.study import real
from rookworld_rlvr.tables import fmt_delta, fmt_number

# A run is intact when every step ran and its held-out reward did not fall more than INTACT_MARGIN
# below the base; a silent collapse finished more than COLLAPSE_MARGIN below it without a guard event.
INTACT_MARGIN, COLLAPSE_MARGIN = 0.02, 0.05
OUTCOMES = ("intact", "stopped", "silent_collapse", "degraded", "error")


def outcome(state: str, base: float | None, final: float | None, guard_events: int, stopped: bool) -> str:
    """intact | stopped (a guard stopped it, naming the cause) | silent_collapse (finished, held-out
    reward below base - COLLAPSE_MARGIN, no guard event) | degraded (finished, neither: a smaller loss,
    or a larger one the guards saw but did not undo) | error (any other failure)."""
    if stopped:
        return "stopped"
    if state != "COMPLETE" or base is None or final is None:
        return "error"
    if final >= base - INTACT_MARGIN:
        return "intact"
    if final < base - COLLAPSE_MARGIN and not guard_events:
        return "silent_collapse"
    return "degraded"


def summarize(study, out: str | Path | None = None, log: Callable[[str], None] | None = print) -> dict:
    """Success rate, best configuration, distribution of gains; writes summary.json and sweep.png."""
    from optuna.trial import TrialState

    all_trials = study.get_trials(deepcopy=False)
    trials = [t for t in all_trials if real(t)]
    requeued = [t for t in all_trials if t.user_attrs.get("requeued")]
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    failed = [t for t in trials if t.state == TrialState.FAIL]

    def row(t) -> dict:
        a = t.user_attrs
        return {"trial": t.number, "state": t.state.name, "value": t.value, "base_reward": a.get("base_reward"),
                "final_reward": a.get("final_reward"), "gain": a.get("gain"), "gain_se": a.get("gain_se"),
                "steps": a.get("steps"),
                "seconds": a.get("seconds"), "overrides": a.get("overrides", dict(t.params)),
                "failure": a.get("failure"), "output_dir": a.get("output_dir"), "worker": a.get("worker"),
                "outcome": a.get("outcome"), "guard_events": a.get("guard_events"),
                "guard_signals": a.get("guard_signals"), "best_step": a.get("best_step"),
                "best_reward": a.get("best_reward")}

    rows = [row(t) for t in trials]
    gains = [r["gain"] for r in rows if r["state"] == "COMPLETE" and r["gain"] is not None]
    best = max(complete, key=lambda t: t.value) if complete else None
    seen: dict[str, list[int]] = {}
    for r in rows:
        if r["state"] == "COMPLETE":
            seen.setdefault(json.dumps(r["overrides"], sort_keys=True), []).append(r["trial"])
    summary = {
        "study": study.study_name,
        "trials": len(trials),
        "finished": len(finished),
        "complete": len(complete),
        "failed": len(failed),
        "running": sum(t.state == TrialState.RUNNING for t in trials),
        "waiting": sum(t.state == TrialState.WAITING for t in trials),
        "interrupted_and_requeued": len(requeued),
        "success_rate": len(complete) / len(finished) if finished else None,
        "best": row(best) if best else None,
        "gain": {"n": len(gains), "min": min(gains), "median": statistics.median(gains), "max": max(gains),
                 "mean": statistics.fmean(gains), "improved": sum(g > 0 for g in gains),
                 "share_improved": sum(g > 0 for g in gains) / len(gains)} if gains else None,
        "duplicates": [v for v in seen.values() if len(v) > 1],
        "outcomes": _outcome_counts(rows),
        "failures": [{"trial": r["trial"], "overrides": r["overrides"], "reason": r["failure"]}
                     for r in rows if r["state"] == "FAIL"],
        "trial_table": rows,
    }
    if out is not None:
        from rookworld_rlvr.data.io import atomic_write_text

        out = Path(out)
        atomic_write_text(out / "summary.json", [json.dumps(summary, indent=2, default=str)])
        summary["plot"] = sweep_plot(rows, out / "sweep.png", study.study_name, best.number if best else None,
                                     (INTACT_MARGIN, COLLAPSE_MARGIN))
    if log:
        log(format_summary(summary))
        if out is not None:
            log(f"summary: {out / 'summary.json'}" + (f"; plot: {summary['plot']}" if summary.get("plot") else ""))
    return summary


def _outcome_counts(rows: list[dict]) -> dict:
    """The stability report: how many finished trials ended each way (and intact after a recovery)."""
    done = [r for r in rows if r["state"] in ("COMPLETE", "FAIL") and r.get("outcome")]
    counts = {o: sum(r["outcome"] == o for r in done) for o in OUTCOMES}
    counts["intact_after_recovery"] = sum(r["outcome"] == "intact" and bool(r.get("guard_events")) for r in done)
    counts["stop_causes"] = sorted({(r.get("guard_signals") or ["?"])[-1] for r in done if r["outcome"] == "stopped"})
    counts["counted"] = len(done)
    return counts


def format_summary(s: dict) -> str:
    lines = [f"sweep '{s['study']}': {s['finished']} finished of {s['trials']} trials "
             f"({s['complete']} complete, {s['failed']} failed, {s['running']} running, {s['waiting']} queued)"]
    if s["success_rate"] is not None:
        lines.append(f"success rate: {s['success_rate']:.0%} ({s['complete']}/{s['finished']})")
    if s["best"]:
        b = s["best"]
        lines.append(f"best: trial {b['trial']}, held-out reward {b['value']:.4f}"
                     + (f" (gain {b['gain']:+.4f})" if b["gain"] is not None else "") + f": {fmt_overrides(b['overrides'])}")
    if s["gain"]:
        g = s["gain"]
        lines.append(f"gain (final - base held-out reward): min {g['min']:+.4f}  median {g['median']:+.4f}  "
                     f"max {g['max']:+.4f}; improved {g['improved']}/{g['n']} ({g['share_improved']:.0%})")
    o = s.get("outcomes")
    if o and o["counted"]:
        lines.append(f"outcomes of {o['counted']} runs: {o['intact']} intact"
                     + (f" ({o['intact_after_recovery']} after a guard recovery)" if o["intact_after_recovery"] else "")
                     + f", {o['stopped']} stopped with a named cause"
                     + (f" ({', '.join(o['stop_causes'])})" if o["stop_causes"] else "")
                     + f", {o['silent_collapse']} silent collapses, {o['degraded']} degraded, {o['error']} errors "
                     f"(intact: held-out >= base - {INTACT_MARGIN}; silent collapse: < base - {COLLAPSE_MARGIN} "
                     "without a guard event)")
    if s["duplicates"]:
        lines.append(f"warning: configurations completed more than once: {s['duplicates']}")
    if s["trial_table"]:
        lines.append(f"{'trial':>5}  {'state':<8} {'outcome':<15} {'base':>7} {'final':>7} {'gain':>8} {'z':>5} "
                     f"{'best/ (step, - final)':>22} {'mins':>5}  configuration / guard events / failure")
        for r in s["trial_table"]:
            tail = fmt_overrides(r["overrides"]) + (f"  guard: {', '.join(r['guard_signals'])}" if r.get("guard_signals") else "") \
                + (f"  [{r['failure']}]" if r["failure"] else "")
            minutes = f"{r['seconds'] / 60:.1f}" if r["seconds"] is not None else "-"
            best = "-"
            if r.get("best_reward") is not None and r.get("final_reward") is not None:  # best/ beside final/
                best = f"{r['best_step']}, {fmt_delta(r['best_reward'] - r['final_reward'])}"
            se = r.get("gain_se")  # the gain in paired standard errors: beyond +-1.96, beyond the noise
            z = f"{r['gain'] / se:+.1f}" if se and r.get("gain") is not None else "-"
            lines.append(f"{r['trial']:>5}  {r['state']:<8} {r.get('outcome') or '-':<15} "
                         f"{fmt_number(r['base_reward']):>7} {fmt_number(r['final_reward']):>7} "
                         f"{fmt_delta(r['gain']):>8} {z:>5} {best:>22} {minutes:>5}  {tail}")
    return "\n".join(lines)
