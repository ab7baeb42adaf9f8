"""The policy_lag_confirm suite as its report reads it: the arms, their labels and the comparisons of
RULES.md, and `load`, which reads every run the suite lists and classes the ones it cannot use."""

from __future__ import annotations

import json
import os
import re
from typing import NamedTuple

import numpy as np

from rgpo_lab.mujoco_grid import CONFIRM_ENVS, ROOT, SUITES, GridRun
from rgpo_lab.results_data import open_metrics

RESULTS = os.path.join(ROOT, "results", "mujoco")
OUT = os.path.join(RESULTS, "policy_lag_confirm", "report")
SUITE = "policy_lag_confirm"
ARMS = {  # arm -> (method, variant), in the order of the tables
    "ppo_dec": ("ppo", "lag8_decoupled"),
    "rgpo_dec": ("rgpo", "lag8_decoupled"),
    "ppo_dec_kl": ("ppo", "lag8_decoupled_klpenalty"),
    "rgpo_dec_nokl": ("rgpo", "lag8_decoupled_nokl"),
    "ppo_plain": ("ppo", "lag8"),
    "rgpo_plain": ("rgpo", "lag8"),
    "ppo_L0": ("ppo", "default"),
    "rgpo_L0": ("rgpo", "default"),
}
LABELS = {
    "ppo_dec": "decoupled PPO",
    "rgpo_dec": "decoupled RGPO",
    "ppo_dec_kl": "decoupled PPO + KL penalty",
    "rgpo_dec_nokl": "decoupled RGPO, no KL penalty",
    "ppo_plain": "plain PPO",
    "rgpo_plain": "plain RGPO",
    "ppo_L0": "PPO, L = 0",
    "rgpo_L0": "RGPO, L = 0",
}
# (family, name, arm a, arm b): a - b; Holm within each comparison's four tests (RULES.md)
COMPARISONS = (
    ("A", "more robust", "rgpo_dec", "ppo_dec"),
    ("B", "gate", "rgpo_dec", "ppo_dec_kl"),
    ("B", "controller (RGPO)", "rgpo_dec", "rgpo_dec_nokl"),
    ("B", "controller (PPO)", "ppo_dec_kl", "ppo_dec"),
    ("B", "decoupling (PPO)", "ppo_dec", "ppo_plain"),
    ("B", "decoupling (RGPO)", "rgpo_dec", "rgpo_plain"),
)
START_KEYS = ("start_ratio_beyond_1.2", "start_ratio_beyond_2", "start_ratio_max", "start_rejected_frac")
EPOCH_KEYS = ("rejected_frac", "ratio_max", "kl_coef", "epochs")
MISSING_CLASSES = ("not started", "incomplete", "failed")


def run_dir(results: str, r: GridRun) -> str:
    return os.path.join(results, r.suite, r.name)


class Suite(NamedTuple):
    data: dict  # {arm: {env: [(seed, eval return, metrics rows)]}} of the finished runs
    missing: dict  # {class in MISSING_CLASSES: [suite/run]}: the runs not read
    why_failed: dict  # {suite/run: what failed}
    commits: dict  # {suite/run: [every commit it ran at]} of the finished runs


# a grid session's first line in run.log: "# 2026-11-26 16:54:55 <command>"
LOG_SESSION = re.compile(r"^# \d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", re.MULTILINE)


def log_error(d: str) -> str | None:
    """The error run.log ends with, if its last session (after the grid's last start line) has a traceback
    or the scripts' one-line ``error: ...``; None otherwise (no log, or a run that is still going)."""
    path = os.path.join(d, "run.log")
    if not os.path.isfile(path):
        return None
    with open(path, errors="replace") as f:
        text = f.read()
    starts = [m.start() for m in LOG_SESSION.finditer(text)]
    last = text[starts[-1] :] if starts else text
    lines = [line.strip() for line in last.splitlines() if line.strip()]
    if any(line.startswith("Traceback (most recent call last)") for line in lines) or any(
        line.startswith("error: ") for line in lines
    ):
        return lines[-1][:200]
    return None


def run_commits(d: str) -> list[str]:
    """Every commit a run ran at: final.json's ``git_commits`` (one per session, resumes included), else
    config.json's ``git_commit`` (rewritten on each resume: the last session's only), else ["unknown"]."""
    for name, key in (("final.json", "git_commits"), ("config.json", "git_commit")):
        try:
            with open(os.path.join(d, name)) as f:
                value = json.load(f).get(key)
        except (OSError, ValueError):
            continue
        commits = [value] if isinstance(value, str) else [c for c in value or [] if c]
        if commits:
            return commits
    return ["unknown"]


def load(results: str = RESULTS) -> Suite:
    """Every run the suite lists: the finished ones read, the others classed. Failed: final.json without a
    finite ``eval_return_mean`` (read, never used), or no final.json and run.log ending with an error;
    incomplete: a run folder (metrics, config or log) without final.json; not started: no run folder."""
    import pandas as pd

    by_key = {v: k for k, v in ARMS.items()}
    data: dict = {arm: {env: [] for env in CONFIRM_ENVS} for arm in ARMS}
    missing: dict = {c: [] for c in MISSING_CLASSES}
    why_failed, commits = {}, {}
    for r in SUITES[SUITE]:
        d, name = run_dir(results, r), f"{r.suite}/{r.name}"
        final = os.path.join(d, "final.json")
        if not os.path.isfile(final):
            error = log_error(d)
            if error is not None:
                missing["failed"].append(name)
                why_failed[name] = f"run.log ends with an error: {error}"
            elif os.path.isdir(d) and os.listdir(d):
                missing["incomplete"].append(name)
            else:
                missing["not started"].append(name)
            continue
        with open(final) as f:
            ret = json.load(f).get("eval_return_mean")
        if not isinstance(ret, int | float) or not np.isfinite(ret):
            missing["failed"].append(name)
            why_failed[name] = f"final.json's eval_return_mean is {ret!r}"
            continue
        with open_metrics(d, required=True) as f:
            metrics = pd.read_csv(f)
        data[by_key[(r.method, r.variant)]][r.env_id].append((r.seed, float(ret), metrics))
        commits[name] = run_commits(d)
    return Suite(data, missing, why_failed, commits)


def returns(data, arm, env) -> np.ndarray:
    return np.array([ret for _, ret, _ in sorted(data[arm][env], key=lambda x: x[0])], float)
