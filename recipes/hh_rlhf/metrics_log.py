"""The recipe's per-iteration metrics: metrics.jsonl / metrics.csv / summary.json of a run
(`IterationMetricsWriter`), the evaluation-window averages and the console table, and the quiet progress bar.
Apart from the method registry so that what a method is and how a run is logged change separately."""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .json_io import dump, dumps
from .methods import BASE_METRICS, RGPO_METRICS, RLHFMethod

logger = logging.getLogger("rgpo_trl.recipe")

GOLD_KEY = BASE_METRICS["gold"]
GOLD_MISSING = "gold_missing_reason"  # the metrics.jsonl field saying why an iteration has no gold
NO_GOLD_LOGGED = (
    "no generation batch's reward metrics were logged in this iteration (with --trainer async a step logs "
    "the batches the rollout worker finished since the previous step: none here, so a later step averages "
    "two); the trained samples' proxy reward is still logged"
)
NO_GOLD_SCORED = "no sample of the iteration's generation batches could be scored by the gold function (NaN)"


class IterationMetricsWriter(TrainerCallback):
    """Writes one JSONL row per logged optimizer step (all of TRL's and RGPO's metrics, plus
    ``iteration`` = generation-batch index) and, at the end, ``summary.json`` with the averages
    over the evaluation window (the paper: iterations 300-400). Non-finite values are written as ``null``
    (valid JSON). With ``scores_gold`` (a world with a gold score), the last row of an iteration that logged
    no finite gold says why in ``gold_missing_reason``, and the console says it at the first one."""

    def __init__(
        self,
        output_dir: str,
        steps_per_iteration: int,
        window: tuple[int, int],
        method: RLHFMethod,
        world_size: int = 1,
        table_every: int = 0,
        scores_gold: bool = False,
    ):
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.csv_path = os.path.join(output_dir, "metrics.csv")
        self.summary_path = os.path.join(output_dir, "summary.json")
        self.steps_per_iteration = steps_per_iteration
        self.window = window
        self.method = method
        self.world_size = world_size
        self.table_every = table_every  # a compact table row every N iterations (0: none), for the console
        self.scores_gold = scores_gold
        self.rows: list[dict[str, Any]] = []
        self._printed_header = False
        self._gold_unscored: set[int] = set()  # iterations whose logs held a gold value that was not finite
        self._told_gold_missing = False

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            if os.path.exists(self.path):
                # a fresh run starts over; a resumed run keeps the rows up to its checkpoint's step and
                # appends (rows logged after the checkpoint by the interrupted run are logged again)
                kept = [r for r in read_metrics(self.path) if r["step"] <= state.global_step]
                with open(self.path, "w") as f:
                    f.writelines(dumps(r) + "\n" for r in kept)
                self.rows = kept

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        row = {
            "step": state.global_step,
            "iteration": (state.global_step - 1) // self.steps_per_iteration + 1,
        }
        row.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})
        if GOLD_KEY in logs and not _finite(logs[GOLD_KEY]):  # TRL logs None for a metric of NaNs only
            self._gold_unscored.add(row["iteration"])
        self.rows.append(row)
        iteration_done = state.global_step % self.steps_per_iteration == 0
        if iteration_done and self.scores_gold:
            reason = self.gold_missing(row["iteration"])
            if reason is not None:
                row[GOLD_MISSING] = reason
                if not self._told_gold_missing:
                    logger.info(
                        "iteration %d: gold not logged: %s. Such iterations show nan in the table and carry "
                        "%s in metrics.jsonl",
                        row["iteration"],
                        reason,
                        GOLD_MISSING,
                    )
                    self._told_gold_missing = True
        with open(self.path, "a") as f:
            f.write(dumps(row) + "\n")
        if self.table_every and iteration_done and row["iteration"] % self.table_every == 0:
            rows = [r for r in self.rows if r["iteration"] == row["iteration"]]
            header, line = format_table(rows, {}, self.window, self.method.metric_columns).split("\n")[:2]
            if not self._printed_header:
                logger.info(header)
                self._printed_header = True
            logger.info(line)

    def gold_missing(self, iteration: int) -> str | None:
        """Why ``iteration`` has no finite gold in its rows, or None when it has one."""
        if any(_finite(r.get(GOLD_KEY)) for r in self.rows if r["iteration"] == iteration):
            return None
        return NO_GOLD_SCORED if iteration in self._gold_unscored else NO_GOLD_LOGGED

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        rows = read_metrics(self.path)
        write_csv(rows, self.csv_path)
        summary = window_summary(rows, self.window, self.method.metric_columns)
        summary.update(method=self.method.name, world_size=self.world_size)
        with open(self.summary_path, "w") as f:
            dump(summary, f, indent=2)
        table = format_table(rows, summary, self.window, self.method.metric_columns)
        if self._printed_header:  # its rows are on the console already (table_every): the window's averages
            lines = table.split("\n")
            table = "\n".join([lines[0], lines[-1]])
        logger.info("\n%s", table)
        sentence = trust_region_sentence(rows, self.method.metric_columns, args)
        if sentence is not None:
            logger.info(sentence)


def read_metrics(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_csv(rows: Sequence[dict[str, Any]], path: str) -> None:
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("step", "iteration"), k))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def window_summary(
    rows: Sequence[dict[str, Any]], window: tuple[int, int], columns: dict[str, str] | None = None
) -> dict[str, Any]:
    """Averages of the paper's metrics over iterations ``window[0] < it <= window[1]``."""
    lo, hi = window
    in_window = [r for r in rows if lo < r["iteration"] <= hi]
    summary: dict[str, Any] = {"window": [lo, hi], "rows_in_window": len(in_window)}
    for name, key in (columns or {**BASE_METRICS, **RGPO_METRICS}).items():
        summary[name] = _mean([r.get(key) for r in in_window])
    return summary


def format_table(
    rows: Sequence[dict[str, Any]],
    summary: dict[str, Any],
    window: tuple[int, int],
    columns: dict[str, str] | None = None,
    every: int | None = None,
) -> str:
    """A text table of reward / KL_ref / KL_old per iteration and the window averages."""
    by_iter: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_iter.setdefault(r["iteration"], []).append(r)
    iters = sorted(by_iter)
    every = every or max(1, len(iters) // 10)
    columns = columns or {**BASE_METRICS, **RGPO_METRICS}
    cols = [c for c in ("reward", "kl_ref", "kl_old", "kl_coef", "gate_mean", "gold") if c in columns]
    lines = ["iteration " + "".join(f"{c:>11}" for c in cols)]
    for it in iters[::every] + ([iters[-1]] if iters and iters[-1] not in iters[::every] else []):
        vals = [_mean([r.get(columns[c]) for r in by_iter[it]]) for c in cols]
        lines.append(f"{it:>9} " + "".join(f"{v:>11.4f}" for v in vals))
    lines.append(
        f"window {window[0]}-{window[1]}".ljust(10)
        + "".join(f"{summary.get(c, float('nan')):>11.4f}" for c in cols)
    )
    return "\n".join(lines)


def _finite_values(rows: Sequence[dict[str, Any]], key: str | None) -> list[float]:
    return [r[key] for r in rows if key is not None and _finite(r.get(key))]


def trust_region_sentence(rows: Sequence[dict[str, Any]], columns: dict[str, str], args: Any) -> str | None:
    """What RGPO's trust region around pi_old (the KL-to-old controller, the gate's rejections) did in a run
    and why, from its metric rows and settings: the table's kl_old and kl_coef columns alone (0.0000 and the
    floor in every row of the demo) do not say. None for a method without those columns (GRPO, PPO, the
    other off-policy corrections) or a run that logged none."""
    kl_key, coef_key = columns.get("kl_old"), columns.get("kl_coef")
    kl, coefs = _finite_values(rows, kl_key), _finite_values(rows, coef_key)
    if not kl or not coefs:
        return None
    rejected = _finite_values(rows, columns.get("rejected_frac"))
    target, floor = getattr(args, "kl_target", 0.02), getattr(args, "kl_coef_min", 0.01)
    initial = getattr(args, "kl_coef", coefs[0])
    kl_max = max(kl)
    kl_mean = sum(kl) / len(kl)
    kl_fact = f"KLhat_old at most {kl_max:.2g} and on average {kl_mean:.2g}, against its target {target:g}"
    rose = coefs[0] > initial or any(b > a for a, b in zip(coefs, coefs[1:], strict=False))
    if getattr(args, "kl_controller", "adaptive") == "fixed":
        coef_fact = f"kl_coef stayed at its fixed {initial:g}"
    elif not rose and coefs[-1] <= floor:
        at = next(
            r.get("iteration", r["step"]) for r in rows if _finite(r.get(coef_key)) and r[coef_key] <= floor
        )
        coef_fact = f"kl_coef fell from {initial:g} to its floor {floor:g} by iteration {at} and stayed there"
    else:
        coef_fact = f"kl_coef went from {initial:g} to {coefs[-1]:g} (range {min(coefs):g}-{max(coefs):g})"
    gate_fact = ""
    if rejected and max(rejected) > 0:
        mean = sum(rejected) / len(rejected)
        gate_fact = f"the gate rejected {mean:.2%} of tokens (g < 0.1; at most {max(rejected):.2%} in a step)"
    elif rejected:
        gate_fact = "the gate rejected no token (g < 0.1)"
    old = "the sampling policy" if hasattr(args, "max_staleness") else "pi_old"  # asynchronous: the sampler's
    head = f"RGPO's trust region around {old}"
    # the adaptive rule halves kl_coef while KLhat_old is at or below target / 1.5; above, it holds or doubles
    if rose or kl_max > target / 1.5:
        return f"{head} acted: {', '.join(f for f in (kl_fact, coef_fact, gate_fact) if f)}."
    gate = f"; {gate_fact}" if gate_fact else ""
    return (
        f"{head}: its KL controller did not act ({kl_fact}; {coef_fact}){gate}: "
        f"{_why_inactive(args, rows, target)}."
    )


def _why_inactive(args: Any, rows: Sequence[dict[str, Any]], target: float) -> str:
    """Why the policy never left the trust region, from the run's settings: no batch is reused, or the policy
    moved too little between a batch's passes (asynchronously: over the samples' lag)."""
    below = (
        f"KLhat_old stayed below kl_target / 1.5 = {target / 1.5:.3g}, at or below which the controller "
        "halves kl_coef"
    )
    if hasattr(args, "max_staleness"):
        staleness = _finite_values(rows, "staleness/max")
        lag = f", at most {max(staleness):.0f} in this run" if staleness else ""
        return (
            f"samples up to {args.max_staleness} weight versions old{lag} came from a policy so close to the "
            f"trained one that {below}"
        )
    iterations = getattr(args, "num_iterations", 1)
    if args.gradient_accumulation_steps % (getattr(args, "steps_per_generation", 1) * iterations) == 0:
        return (  # RGPOTrainer warns of this setting at construction
            f"each generation batch is used for one optimizer step (num_iterations {iterations}), so pi_old "
            "== pi and every r_old is 1; --num_iterations 2 (the paper's preset) trains on each batch twice, "
            "so that pi can move away from pi_old"
        )
    return (
        f"each generation batch is trained on in {iterations} passes (num_iterations {iterations}), but at "
        f"learning rate {args.learning_rate:g} the policy moved so little between them that {below}"
    )


class QuietProgressCallback(ProgressCallback):
    """transformers' progress bar without its per-step metric dicts (35 keys every step): the recipe's console
    shows the bar and `IterationMetricsWriter`'s compact table; every metric still goes to metrics.jsonl and
    the ``report_to`` loggers."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def quiet_console(trainer) -> None:
    """Swap the trainer's console callback (the progress bar, or the printer under ``disable_tqdm``) for
    `QuietProgressCallback` (or nothing)."""
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if not trainer.args.disable_tqdm:
        trainer.add_callback(QuietProgressCallback)
