"""A suite folder read back: each run's summary, held-out numbers and per-iteration rows, and what the
tables and figures take from the rows (bins, window means, the summary window), so they all read a run
alike."""

from __future__ import annotations

import csv
import json
import os

import numpy as np

from rgpo_lab.results_data import open_metrics
from rgpo_lab.rlhf_suite import read_run_json

BIN = 25  # iterations per bin of the per-iteration curves (25 x 16 samples per bin and seed)
PROXY, GOLD, KL = "rewards/reward_model/mean", "rewards/gold/mean", "kl_ref/monitor"


def load(results: str) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for name in sorted(os.listdir(results)):
        d = os.path.join(results, name)
        if "__s" not in name or not all(
            os.path.exists(os.path.join(d, f)) for f in ("summary.json", "heldout.json")
        ):
            continue
        method, seed = name.rsplit("__s", 1)
        run = {"seed": int(seed), "dir": d}
        for f in ("summary", "heldout"):
            run[f] = read_run_json(os.path.join(d, f"{f}.json"))
        run["rows"] = read_rows(d)
        runs.setdefault(method, []).append(run)
    return runs


def _csv_value(key: str, value: str) -> int | float | str:
    if key in ("iteration", "step"):
        return int(float(value))
    try:
        return float(value)
    except ValueError:  # a text field, e.g. gold_missing_reason
        return value


def read_rows(run_dir: str) -> list[dict]:
    """The per-step metric rows of a run: metrics.csv (empty cells: not logged at that step) or
    metrics.jsonl (null: a NaN the run logged, read as not logged). Text fields (``gold_missing_reason``) stay
    text."""
    metrics = open_metrics(run_dir)
    if metrics is not None:
        with metrics as f:
            return [{k: _csv_value(k, v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    path = os.path.join(run_dir, "metrics.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def binned(run: dict, key: str, width: int = BIN) -> dict[int, float]:
    """Mean of ``key`` per bin of ``width`` iterations (bin b holds iterations b*width+1 .. (b+1)*width)."""
    by_bin: dict[int, list[float]] = {}
    for row in run["rows"]:
        if row.get(key) is not None and np.isfinite(row[key]):
            by_bin.setdefault((row["iteration"] - 1) // width, []).append(row[key])
    return {b: float(np.mean(v)) for b, v in sorted(by_bin.items())}


def common_bins(curves: list[dict[int, float]]) -> list[int]:
    """The bins every curve has (seeds of a run may stop at different iterations), in order."""
    return sorted(set.intersection(*(set(c) for c in curves))) if curves else []


def window_mean(run: dict, key: str) -> float | None:
    """Mean of a per-iteration metric over the run's summary window (iterations start < i <= end)."""
    start, end = run["summary"].get("window", (300, 400))
    x = [row[key] for row in run["rows"] if start < row["iteration"] <= end and row.get(key) is not None]
    return float(np.mean(x)) if x else None


def load_suite(root: str, suite: str) -> dict[str, list[dict]]:
    """``load`` of ``<root>/<suite>``; empty when the suite has not started."""
    path = os.path.join(root, suite)
    return load(path) if os.path.isdir(path) else {}


def window_of(runs: dict[str, list[dict]]) -> tuple[int, int]:
    """The summary window the runs used (their summary.json), else the last quarter of the longest run."""
    for rs in runs.values():
        for r in rs:
            if r["summary"].get("window"):
                return tuple(r["summary"]["window"])
    n = max((row["iteration"] for rs in runs.values() for r in rs for row in r["rows"]), default=0)
    return (3 * n) // 4, n
