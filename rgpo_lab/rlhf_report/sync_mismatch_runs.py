"""The synchronous mismatch study's runs read back (v3/sync_mismatch): the runs its rule plans from
precheck.json, each finished run's test gold, KL_ref and window means, the gate's rejected share at the
first optimizer step of each generation batch, and the per-seed means over the ranking cells."""

from __future__ import annotations

import os

import numpy as np

from rgpo_lab import rlhf_sync_mismatch as smm
from rgpo_lab.rlhf_report.mismatch_runs import failed_run, read_run

SUITE = "v3/sync_mismatch"
GATE_ARMS = ("rgpo", "rgpo_coupled", "rgpo_gate")
WINDOW = (smm.WINDOW_START, smm.STEPS)  # optimizer steps 305-400 at every k
WINDOW_KEYS = {  # window means of the per-step log (rows counted in optimizer steps)
    "rejected_frac": "rgpo/rejected_frac",
    "kl_coef": "rgpo/kl_coef",
    "is_min": "sampling/importance_sampling_ratio/min",
    "is_mean": "sampling/importance_sampling_ratio/mean",
    "is_max": "sampling/importance_sampling_ratio/max",
    "logp_diff": "sampling/sampling_logp_difference/mean",
}
# per step: the generation batch a step trains on (its "iteration") and the gate's rejected share
CURVE_KEYS = {"batch": "iteration", "rejected_frac": "rgpo/rejected_frac"}


def planned(precheck: dict) -> list[tuple[str, str, int, str]]:
    """(cell, arm, seed, run name) of every run the rule plans for the suite (the names rlhf_suite gives
    them: ``<method>__<arm>__<cell>__s<seed>``)."""
    ranking = precheck["ranking_cells"]
    return [
        (cell, arm, seed, f"{smm.ARMS[arm][0]}__{arm}__{cell}__s{seed}")
        for cell, seeds in smm.suite_cells(ranking).items()
        for arm in smm.suite_arms(ranking)
        for seed in seeds
    ]


def load(results: str, precheck: dict) -> tuple[dict, list[str], list[str]]:
    """{cell: {arm: [run per seed]}} of the finished runs, the planned runs not finished (suite/name) and,
    among them, those that failed (a Python error ends their run.log)."""
    data: dict = {}
    missing, failed = [], []
    for cell, arm, seed, name in planned(precheck):
        d = os.path.join(results, SUITE, name)
        run = read_run(d, WINDOW_KEYS, CURVE_KEYS, WINDOW, clock="step")
        if run is None:
            missing.append(f"{SUITE}/{name}")
            if failed_run(d):
                failed.append(f"{SUITE}/{name}")
            continue
        run["first_step_rejected"] = first_step_mean(run["curves"], "rejected_frac")
        data.setdefault(cell, {}).setdefault(arm, []).append({"seed": seed, **run})
    return data, missing, failed


def first_step_mean(curves: dict, key: str, window: tuple[int, int] = WINDOW) -> float | None:
    """Mean of ``key`` over the first optimizer step of each generation batch whose first step lies in the
    window (at k > 1 the decoupled gate's ratio is 1 there: pi_old is the policy itself)."""
    first: dict[float, float] = {}
    for step, batch in curves["batch"]:
        first[batch] = min(first.get(batch, step), step)
    starts = {s for s in first.values() if window[0] < s <= window[1]}
    x = [v for step, v in curves[key] if step in starts]
    return float(np.mean(x)) if x else None


def pooled(data: dict, cells: list[str]) -> dict:
    """The primary comparison's samples: per arm and seed the mean test gold and KL_ref over ``cells`` (the
    ranking cells), for the seeds finished in every one of them."""
    out: dict = {}
    arms = {a for c in cells for a in data.get(c, {})}
    for arm in sorted(arms, key=list(smm.ARMS).index):
        by_seed = [{r["seed"]: r for r in data.get(c, {}).get(arm, [])} for c in cells]
        for seed in sorted(set.intersection(*(set(s) for s in by_seed))):
            runs = [s[seed] for s in by_seed]
            if any(r["gold"] is None or r["kl_ref"] is None for r in runs):
                continue
            row = {k: float(np.mean([r[k] for r in runs])) for k in ("gold", "kl_ref")}
            out.setdefault(arm, []).append({"seed": seed, **row})
    return out


def k_of(cell: str) -> int:
    return int(cell.split("__k")[1])
