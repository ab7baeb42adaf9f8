"""The paper's RLHF methods through one code path, and the metrics the paper reports.

`--method rgpo | grpo | ppo_clip_kl | sapo` picks a trainer class and the loss settings; everything
else (data, reward, generation, batch, learning rate, num_iterations) is shared, so only the policy
loss differs between runs:

- ``rgpo``: `RGPOTrainer`, sigmoid gate (k = 5) on the dual ratio max(r_old, r_ref), adaptive
  KL-to-old, fixed beta_ref = 0.05 (paper Eq. rgpo_rlhf).
- ``grpo``: TRL's GRPO clipped loss (``loss_type="grpo"``), no reference penalty (beta = 0), as in
  the paper's GRPO baseline ("no explicit reference anchor").
- ``ppo_clip_kl``: PPO's clipped surrogate with a k3 KL-to-reference penalty (beta = 0.05) and
  token-level aggregation, on GRPO's group-relative advantages. It is the *stand-in* for the paper's
  PPO-RLHF: TRL 1.16 has no PPOTrainer and this has no value model, so it is named for what it is.
- ``sapo``: TRL's SAPO soft gate (``loss_type="sapo"``) with the same beta_ref = 0.05.

KL to the reference is the paper's primary RLHF stability metric, also for GRPO, which does not
optimise it. `ReferenceKLMonitor` computes it the same way for every method, from log-probabilities
the trainer already has (pi_old's per-token log-probs and the reference model's), so that no method
pays an extra forward pass for a number that another method gets for free.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from .core import clamp_log_ratio, kl_ref_estimate
from .rgpo_config import RGPOConfig
from .rgpo_trainer import RGPOTrainer

METHODS = ("rgpo", "grpo", "ppo_clip_kl", "sapo")

# Loss settings per method; the recipe applies them on top of the shared preset.
METHOD_OVERRIDES: dict[str, dict[str, Any]] = {
    "rgpo": {"gate": "sigmoid", "gate_params": {"k": 5.0}, "ratio_mode": "dual", "beta": 0.05, "loss_type": "dapo"},
    "grpo": {"loss_type": "grpo", "beta": 0.0, "epsilon": 0.2},
    "ppo_clip_kl": {"loss_type": "dapo", "beta": 0.05, "epsilon": 0.2, "use_bias_correction_kl": False},
    "sapo": {"loss_type": "sapo", "beta": 0.05, "use_bias_correction_kl": False},
}


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    return method


class ReferenceKLMonitor:
    """Mixin: logs ``kl_ref/monitor`` = mean k3 KL(pi_old || pi_ref) over the completion tokens of each
    generation batch, for every method, with the reference log-probs TRL computes anyway.

    For a method trained with beta = 0 (GRPO) TRL would not create the reference model; the mixin
    builds the trainer with ``monitor_beta`` so that the reference exists and its log-probs are
    computed once per generation batch, then sets ``self.beta = 0`` for the loss: the loss is
    exactly GRPO's (the reference log-probs are dropped from the batch before the loss sees them).
    """

    monitor_beta = 1.0

    def __init__(self, *args: Any, **kwargs: Any):
        train_args = kwargs.get("args")
        self._loss_beta = None
        if train_args is not None and train_args.beta == 0.0:
            self._loss_beta = 0.0
            train_args.beta = self.monitor_beta  # makes GRPOTrainer build the reference model
        super().__init__(*args, **kwargs)
        if self._loss_beta is not None:
            self.beta = self._loss_beta
            self.args.beta = self._loss_beta
        self._warned_no_old = False

    def _generate_and_score_completions(self, inputs):
        if self._loss_beta is not None:
            self.beta = self.monitor_beta  # TRL computes ref log-probs only when beta != 0
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            if self._loss_beta is not None:
                self.beta = self._loss_beta
        ref = output.get("ref_per_token_logps")
        old = output.get("old_per_token_logps")
        mode = "train" if self.model.training else "eval"
        if ref is not None and old is not None:
            mask = output["completion_mask"].to(ref.dtype)
            kl = kl_ref_estimate(clamp_log_ratio(old - ref))
            totals = self.accelerator.reduce(torch.stack([(kl * mask).sum(), mask.sum()]), reduction="sum")
            self._metrics[mode]["kl_ref/monitor"].append((totals[0] / totals[1].clamp(min=1.0)).item())
        elif not self._warned_no_old:
            self._warned_no_old = True
            print("[rgpo-trl] kl_ref/monitor needs num_iterations > 1 (pi_old log-probs); not logged.")
        if self._loss_beta is not None:
            output.pop("ref_per_token_logps", None)
        return output


class RGPOMonitoredTrainer(ReferenceKLMonitor, RGPOTrainer):
    pass


class GRPOMonitoredTrainer(ReferenceKLMonitor, GRPOTrainer):
    pass


def trainer_and_config_class(method: str) -> tuple[type[GRPOTrainer], type[GRPOConfig]]:
    check_method(method)
    if method == "rgpo":
        return RGPOMonitoredTrainer, RGPOConfig
    return GRPOMonitoredTrainer, GRPOConfig


# Columns of the per-iteration metrics file, in the order of the paper's RLHF section.
METRIC_COLUMNS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "kl_ref": "kl_ref/monitor",
    "kl_old": "rgpo/kl_old_iteration",
    "kl_coef": "rgpo/kl_coef",
    "gate_mean": "rgpo/gate_mean",
    "rejected_frac": "rgpo/rejected_frac",
    "ess": "rgpo/ess",
    "gold": "rewards/gold/mean",
    "completion_length": "completions/mean_length",
}


class IterationMetricsWriter(TrainerCallback):
    """Writes one JSONL row per logged optimizer step (all of TRL's and RGPO's metrics, plus
    ``iteration`` = generation-batch index) and, at the end, ``summary.json`` with the averages
    over the evaluation window (the paper: iterations 300-400)."""

    def __init__(self, output_dir: str, steps_per_iteration: int, window: tuple[int, int], method: str):
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.csv_path = os.path.join(output_dir, "metrics.csv")
        self.summary_path = os.path.join(output_dir, "summary.json")
        self.steps_per_iteration = steps_per_iteration
        self.window = window
        self.method = method
        self.rows: list[dict[str, Any]] = []

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            if os.path.exists(self.path) and state.global_step == 0:
                os.remove(self.path)  # a fresh run; a resumed run (global_step > 0) appends

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        row = {"step": state.global_step,
               "iteration": (state.global_step - 1) // self.steps_per_iteration + 1}
        row.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        rows = read_metrics(self.path)
        write_csv(rows, self.csv_path)
        summary = window_summary(rows, self.window)
        summary["method"] = self.method
        with open(self.summary_path, "w") as f:
            json.dump(summary, f, indent=2)
        print(format_table(rows, summary, self.window))


def read_metrics(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_csv(rows: Sequence[dict[str, Any]], path: str) -> None:
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("step", "iteration"), k))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def window_summary(rows: Sequence[dict[str, Any]], window: tuple[int, int]) -> dict[str, Any]:
    """Averages of the paper's metrics over iterations ``window[0] < it <= window[1]``."""
    lo, hi = window
    in_window = [r for r in rows if lo < r["iteration"] <= hi]
    summary: dict[str, Any] = {"window": [lo, hi], "rows_in_window": len(in_window)}
    for name, key in METRIC_COLUMNS.items():
        summary[name] = _mean([r.get(key) for r in in_window])
    return summary


def format_table(rows: Sequence[dict[str, Any]], summary: dict[str, Any], window: tuple[int, int],
                 every: int | None = None) -> str:
    """A text table of reward / KL_ref / KL_old per iteration and the window averages."""
    by_iter: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_iter.setdefault(r["iteration"], []).append(r)
    iters = sorted(by_iter)
    every = every or max(1, len(iters) // 10)
    cols = ("reward", "kl_ref", "kl_old", "kl_coef", "gate_mean", "gold")
    lines = ["iteration " + "".join(f"{c:>11}" for c in cols)]
    for it in iters[::every] + ([iters[-1]] if iters and iters[-1] not in iters[::every] else []):
        vals = [_mean([r.get(METRIC_COLUMNS[c]) for r in by_iter[it]]) for c in cols]
        lines.append(f"{it:>9} " + "".join(f"{v:>11.4f}" for v in vals))
    lines.append(f"window {window[0]}-{window[1]}" .ljust(10)
                 + "".join(f"{summary.get(c, float('nan')):>11.4f}" for c in cols))
    return "\n".join(lines)
