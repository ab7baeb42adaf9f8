"""The mismatch study's runs read back: heldout.json, the window means and curves of metrics.csv, the
resumes of each finished run of v3/mismatch and v3/mismatch_lag."""

from __future__ import annotations

import csv
import json
import math
import os

import numpy as np

from rgpo_lab import rlhf_mismatch as mm
from rgpo_lab.results_data import open_metrics

RESULTS = os.path.join(mm.ROOT, "results", "rlhf")
OUT = os.path.join(mm.OUT, "report")
CONTROL = "fp32"
WINDOW_KEYS = {  # the window means read from each run's metrics.csv (steps WINDOW_START-STEPS)
    "outside_0.9_1.1": "mismatch/outside_0.9_1.1",
    "outside_0.5_2": "mismatch/outside_0.5_2",
    "below_rejection": "mismatch/below_gate_rejection",
    "abs_log_ratio": "mismatch/abs_log_ratio_mean",
    "rejected_frac": "rgpo/rejected_frac",
    "weight_mean": "correction/weight_mean",
    "weight_max": "correction/weight_max",
    "zero_weight_frac": "correction/zero_weight_frac",
    "kl_coef": "rgpo/kl_coef",
}
CURVE_KEYS = {  # the per-step curves read from metrics.csv
    "gold": "rewards/gold/mean",
    "rejected_frac": "rgpo/rejected_frac",
    "outside_0.5_2": "mismatch/outside_0.5_2",
    "outside_0.9_1.1": "mismatch/outside_0.9_1.1",
}

LAG_SUITE_CELLS = ("lag8", "lag32")  # v3/mismatch_lag's cells; the others are v3/mismatch's


def _number(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def read_run(
    d: str,
    window_keys: dict[str, str] = WINDOW_KEYS,
    curve_keys: dict[str, str] = CURVE_KEYS,
    span: tuple[int, int] = (mm.WINDOW_START, mm.STEPS),
    clock: str = "iteration",
) -> dict | None:
    """heldout.json (test gold, KL_ref) and the window means of metrics.csv (rows with span[0] < ``clock``
    <= span[1]), the curves as (``clock``, value); None while unfinished. The defaults are this study's;
    the synchronous study passes its own keys and counts optimizer steps."""
    path = os.path.join(d, "heldout.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        heldout = json.load(f)
    rows = []
    metrics = open_metrics(d)
    if metrics is not None:
        with metrics as f:
            rows = list(csv.DictReader(f))
    window = {}
    for name, key in window_keys.items():
        x = [
            v
            for r in rows
            if (it := _number(r.get(clock))) is not None and span[0] < it <= span[1]
            if (v := _number(r.get(key))) is not None
        ]
        window[name] = float(np.mean(x)) if x else None
    curves = {
        name: [
            (it, v)
            for r in rows
            if (it := _number(r.get(clock))) is not None
            if (v := _number(r.get(key))) is not None
        ]
        for name, key in curve_keys.items()
    }
    return {
        "gold": _number(heldout.get("gold")),
        "kl_ref": _number(heldout.get("kl_ref")),
        "window": window,
        "curves": curves,
        "resumed_from": resumed_from(d),
    }


def resumed_from(d: str) -> list[str]:
    """The checkpoints a run was resumed from: run_info.json has one entry per launch, and the suite runner
    resumes a launch with --resume_from_checkpoint (empty for a run launched once, or without run_info)."""
    path = os.path.join(d, "run_info.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        launches = json.load(f)
    out = []
    for launch in launches if isinstance(launches, list) else [launches]:
        command = launch.get("command", [])
        out += [
            os.path.basename(command[i + 1])
            for i, arg in enumerate(command[:-1])
            if arg == "--resume_from_checkpoint"
        ]
    return out


def failed_run(d: str) -> bool:
    """A run folder without heldout.json whose run.log ends in a Python error: it stopped, it is not running
    or waiting to resume."""
    log = os.path.join(d, "run.log")
    if not os.path.exists(log):
        return False
    with open(log, errors="replace") as f:
        tail = f.read()[-20000:]
    return "Traceback (most recent call last)" in tail


def load(results: str = RESULTS) -> tuple[dict, list[str], list[str]]:
    """{cell: {arm: [run per seed]}} of both suites, the runs not finished (suite/name) and, among them, those
    that failed (a Python error ends their run.log)."""
    from rgpo_lab.rlhf_suite import SUITE_BUILDERS

    data: dict = {}
    missing, failed = [], []
    for suite in ("v3/mismatch", "v3/mismatch_lag"):
        for r in SUITE_BUILDERS[suite](results):
            arm, cell = r.tag.split("__")
            d = os.path.join(results, suite, r.name)
            run = read_run(d)
            if run is None:
                missing.append(f"{suite}/{r.name}")
                if failed_run(d):
                    failed.append(f"{suite}/{r.name}")
                continue
            data.setdefault(cell, {}).setdefault(arm, []).append({"seed": r.seed, **run})
    return data, missing, failed


def values(data, cell, arm, key="gold") -> list[float]:
    return [r[key] for r in data.get(cell, {}).get(arm, []) if r[key] is not None]


def window_values(runs, key) -> list[float]:
    return [r["window"][key] for r in runs if r["window"].get(key) is not None]


def window_mean(runs, key) -> float | None:
    x = window_values(runs, key)
    return float(np.mean(x)) if x else None
