"""One MuJoCo run of the lab: the product's single-file script
``mujoco_baselines/<method>_continuous_action.py`` run as ``python <script> <flags>`` would run it (in this
process, by ``runpy``), and what the script logs written as the run's results. The script is the only
implementation; this module adds no algorithm.

    python -m rgpo_lab.mujoco_drive <run dir> <method> [the script's flags]
    python -m rgpo_lab.mujoco_drive /tmp/r1 rgpo --env-id Hopper-v4 --total-timesteps 4096 --num-steps 1024

The script's TensorBoard writer is replaced by `ResultsWriter`, which receives every scalar the script logs
(CleanRL's names) and writes ``<run dir>/``:

- config.json: the script's arguments, the run's name, machine, package versions and git commit
  (`run_info`), written once the script has checked its inputs (a bad input leaves nothing but the folder)
  and again, with the derived fields, when it ends;
- metrics.csv: one row per iteration (the row closes at the script's last scalar of an iteration,
  ``charts/SPS``): iteration, global_step, time, the training episodes (episodic_return: the mean of those
  finished in the iteration; return_last100; episodes), then every scalar of the iteration under the last
  part of its name (``losses/policy_loss`` -> policy_loss; `COLUMNS`: ``losses/approx_kl`` -> kl,
  ``losses/max_approx_kl`` -> kl_max, ``losses/final_approx_kl`` -> kl_final and ``trpo/kl`` -> trpo_kl,
  the names the reports read), ``spike`` (kl > `SPIKE_KL`) and ``spike_final`` (kl_final > `SPIKE_KL`);
- final.json: the training return (mean of the last 100 episodes), the deterministic evaluation's returns
  as the script logged them (``eval/episodic_return``, one per episode, CleanRL's way) with their mean and
  sample standard deviation, the git commit.

No resume: a run that did not finish starts again from its first step (metrics.csv rewritten); see
docs/mujoco.md ("The grid").
"""

from __future__ import annotations

import csv
import importlib
import json
import math
import os
import platform
import runpy
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from unittest import mock

from rgpo_trl.core.kl_control import PAPER_KL_DEFAULTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("ppo", "rgpo", "trpo", "awr")
# A 'KL spike' is an iteration whose mean KL to pi_old exceeds twice the KL controller's target (the paper's):
# metrics.csv's ``spike`` column and the reports' threshold.
SPIKE_KL = 2 * PAPER_KL_DEFAULTS["kl_target"]
EVAL_SEED_OFFSET = 10_000  # the scripts evaluate on seed + this
# metrics.csv's name of a scalar where it is not the last part of the scalar's name: the names the reports
# read (those of the committed runs, made by the lab's former copy of the algorithms)
COLUMNS = {
    "losses/approx_kl": "kl",
    "losses/max_approx_kl": "kl_max",
    "losses/final_approx_kl": "kl_final",
    "trpo/kl": "trpo_kl",
}
ROW_END = "charts/SPS"  # the last scalar every script logs per iteration


def script_path(method: str) -> str:
    return os.path.join(ROOT, "mujoco_baselines", f"{method}_continuous_action.py")


def run_info() -> dict:
    """Machine, package versions and the git commit, written next to every run's results."""
    import gymnasium as gym
    import mujoco
    import numpy as np
    import torch

    try:
        shown = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        commit = shown.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "git_commit": commit,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "gymnasium": gym.__version__,
        "mujoco": mujoco.__version__,
    }


def column(tag: str) -> str:
    """metrics.csv's name of the script's scalar ``tag``."""
    return COLUMNS.get(tag, tag.rpartition("/")[2])


class ResultsWriter:
    """Stands in for ``SummaryWriter`` in a driven script: the scalars as the script logs them, by tag
    (``scalars``), and the run's metrics.csv, one row per iteration, written as the run goes."""

    def __init__(self, run_dir: str, config: dict, save_model: bool = False):
        self.run_dir, self.config, self.save_model, self.start = run_dir, config, save_model, time.time()
        self.scalars: dict[str, list[tuple[int, float]]] = {}
        self.episodes: list[float] = []  # training returns, in order
        self.row: dict[str, float] = {}
        self.iteration, self.first_new, self.csv_file, self.csv_writer = 0, 0, None, None

    def __call__(self, log_dir: str = "", *args, **kwargs) -> ResultsWriter:
        """``SummaryWriter(log_dir)`` as the script calls it once its inputs are checked: config.json written,
        metrics.csv opened; the folder made only for ``--save-model``'s file (no event files)."""
        write_json(os.path.join(self.run_dir, "config.json"), self.config)
        if self.save_model:
            os.makedirs(log_dir, exist_ok=True)
        self.start = time.time()
        self.csv_file = open(os.path.join(self.run_dir, "metrics.csv"), "w", newline="")
        return self

    def add_text(self, *args, **kwargs) -> None:
        pass  # the hyperparameters: config.json

    def add_scalar(self, tag: str, value, step: int) -> None:
        value = float(value)
        self.scalars.setdefault(tag, []).append((int(step), value))
        if tag == "charts/episodic_return":
            self.episodes.append(value)
        elif not tag.startswith(("charts/episodic_", "eval/")):
            self.row[column(tag)] = value
            if tag == ROW_END:
                self.write_row(int(step))

    def write_row(self, global_step: int) -> None:
        self.iteration += 1
        new, last = self.episodes[self.first_new :], self.episodes[-100:]
        self.first_new = len(self.episodes)
        row = {
            "iteration": self.iteration,
            "global_step": global_step,
            "time": time.time() - self.start,
            "episodic_return": math.fsum(new) / len(new) if new else math.nan,
            "return_last100": math.fsum(last) / len(last) if last else math.nan,
            "episodes": len(self.episodes),
            **self.row,
        }
        for kl, spike in (("kl", "spike"), ("kl_final", "spike_final")):
            if kl in self.row:
                row[spike] = int(self.row[kl] > SPIKE_KL)
        if self.csv_writer is None:
            self.csv_writer = csv.DictWriter(self.csv_file, fieldnames=list(row))
            self.csv_writer.writeheader()
        self.csv_writer.writerow(row)
        self.csv_file.flush()
        self.row = {}

    def close(self) -> None:
        if self.csv_file is not None:
            self.csv_file.close()

    def final(self, args) -> dict:
        """final.json's fields from what the script logged (``args``: the script's resolved arguments)."""
        steps = [step for step, _ in self.scalars.get(ROW_END, [])]
        last = self.episodes[-100:]
        wall = time.time() - self.start
        final = {
            "run_name": os.path.basename(os.path.normpath(self.run_dir)),
            "env_id": args.env_id,
            "method": args.exp_name,
            "seed": args.seed,
            "global_step": steps[-1] if steps else 0,
            "final_return": math.fsum(last) / len(last) if last else math.nan,
            "final_return_episodes": len(last),
            "episodes": len(self.episodes),
            "wall_time": wall,
            "SPS": (steps[-1] if steps else 0) / wall,
            "resumed_at_iterations": [],
        }
        returns = [value for _, value in self.scalars.get("eval/episodic_return", [])]
        if returns:
            final.update(
                eval_return_mean=statistics.fmean(returns),
                eval_return_std=statistics.stdev(returns) if len(returns) > 1 else math.nan,
                eval_episodes=returns,
                eval_seed=args.seed + EVAL_SEED_OFFSET,
            )
        return final


def write_json(path: str, data: dict) -> None:
    """``data`` to ``path``, never half-written."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=2)
    os.replace(path + ".tmp", path)


def drive(run_dir: str, method: str, flags: list[str]) -> tuple[dict, dict]:
    """Runs the script of ``method`` with ``flags`` in ``run_dir`` (its working directory); returns
    (final.json's dict, the script's globals at the end)."""
    import tyro

    path = script_path(method)
    os.makedirs(run_dir, exist_ok=True)
    run_dir = os.path.abspath(run_dir)
    info = run_info()
    module = importlib.import_module(f"mujoco_baselines.{method}_continuous_action")  # its Args; nothing runs
    args = tyro.cli(module.Args, args=flags, description=module.__doc__)
    config = {"run_name": os.path.basename(run_dir), "driven_by": "rgpo_lab.mujoco_drive", **info}
    writer = ResultsWriter(run_dir, {**asdict(args), **config}, args.save_model)
    cwd, argv = os.getcwd(), sys.argv
    try:
        os.chdir(run_dir)
        sys.argv = [path, *flags]
        with mock.patch("torch.utils.tensorboard.SummaryWriter", writer):
            script_globals = runpy.run_path(path, run_name="__main__")
    finally:
        os.chdir(cwd)
        sys.argv = argv
        writer.close()
    args = script_globals["args"]
    write_json(os.path.join(run_dir, "config.json"), {**vars(args), **config})
    final = {**writer.final(args), "git_commits": [info["git_commit"]]}
    write_json(os.path.join(run_dir, "final.json"), final)
    return final, script_globals


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[1] not in METHODS:
        print(
            f"usage: python -m rgpo_lab.mujoco_drive <run dir> {{{','.join(METHODS)}}} [the script's flags]",
            file=sys.stderr,
        )
        return 2
    final, _ = drive(argv[0], argv[1], argv[2:])
    print(f"results in {argv[0]}: final return {final['final_return']:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
