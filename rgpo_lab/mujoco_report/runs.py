"""The results folder read back: one `RunRecord` per run folder, and what every table and figure takes
from a run (finished runs, evaluation returns, KL means), so they all read a run alike."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rgpo_lab.results_data import open_metrics


@dataclass
class RunRecord:
    """A run read back from its directory: config.json, metrics.csv and, once it has finished, final.json
    (``final`` None while it runs). What `mujoco_grid` launches is a `GridRun`."""

    suite: str
    name: str
    cfg: dict
    metrics: pd.DataFrame
    final: dict | None

    @property
    def method(self) -> str:
        return self.cfg["exp_name"].replace("_continuous_action", "")

    @property
    def env(self) -> str:
        return self.cfg["env_id"]

    @property
    def variant(self) -> str:  # mujoco_grid.py names runs {env}__{method}__{variant}__s{seed}__{steps}k
        parts = self.name.split("__")
        return parts[2] if len(parts) == 5 else "default"

    @property
    def final_return(self) -> float:
        return float(self.final["final_return"]) if self.final else float("nan")


def load_runs(root: str) -> list[RunRecord]:
    runs = []
    for suite in sorted(os.listdir(root)):
        suite_dir = os.path.join(root, suite)
        if not os.path.isdir(suite_dir):
            continue
        for name in sorted(os.listdir(suite_dir)):
            d = os.path.join(suite_dir, name)
            if not os.path.isfile(os.path.join(d, "config.json")):
                continue
            metrics = open_metrics(d)
            if metrics is None:
                continue
            with metrics:
                if not metrics.read(1):  # a run that has just started: no header yet
                    continue
                metrics.seek(0)
                table = pd.read_csv(metrics)
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            final = None
            if os.path.isfile(os.path.join(d, "final.json")):
                with open(os.path.join(d, "final.json")) as f:
                    final = json.load(f)
            runs.append(RunRecord(suite, name, cfg, table, final))
    return runs


def finished(runs, **where) -> list[RunRecord]:
    return [r for r in runs if r.final and all(getattr(r, k) == v for k, v in where.items())]


def eval_return(r) -> float:
    return float(r.final.get("eval_return_mean", float("nan")))


def eval_values(rs) -> list[float]:
    """The deterministic-evaluation returns of the runs that have one."""
    return [v for v in map(eval_return, rs) if np.isfinite(v)]


def mean_kl(rs) -> float:
    """Mean KL to pi_old over every iteration of the runs (nan without runs)."""
    return float(pd.concat([r.metrics["kl"] for r in rs]).mean()) if rs else float("nan")


def metric_mean(rs, key, how="mean") -> float:
    """Over every iteration of the runs: the mean (or max) of a metrics column; nan where no run has it."""
    cols = [r.metrics[key] for r in rs if key in r.metrics]
    if not cols:
        return float("nan")
    pooled = pd.concat(cols)
    return float(pooled.max() if how == "max" else pooled.mean())
