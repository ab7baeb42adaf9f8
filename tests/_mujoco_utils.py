"""Test-only helpers for the MuJoCo tests: a script of mujoco_baselines/ run in this process as
``python <script> <flags>`` would run it, with every scalar it logs recorded; its module; metrics.csv read
back."""

from __future__ import annotations

import csv
import importlib
import os
import runpy
import shutil
import sys
from collections import defaultdict

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("ppo", "rgpo", "trpo", "awr")
# 3 iterations of 256 steps on Hopper-v4 and a 2-episode deterministic evaluation
SHORT = ["--env-id", "Hopper-v4", "--total-timesteps", "768", "--num-steps", "256", "--eval-episodes", "2"]
needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="torch.compile's CPU backend (--compile) needs a C++ compiler",
)


def script(method):
    """The script ``mujoco_baselines/<method>_continuous_action.py`` as a module (nothing runs)."""
    return importlib.import_module(f"mujoco_baselines.{method}_continuous_action")


class Recorder:
    """Stands in for torch.utils.tensorboard.SummaryWriter: every scalar as (step, float), by tag."""

    last = None

    def __init__(self, *args, **kwargs):
        self.scalars = defaultdict(list)
        Recorder.last = self

    def add_scalar(self, tag, value, step):
        self.scalars[tag].append((step, float(value)))

    def add_text(self, *args, **kwargs):
        pass

    def close(self):
        pass


def run_script(method, flags, workdir, monkeypatch):
    """``python mujoco_baselines/<method>_continuous_action.py <flags>`` in ``workdir``: (the scalars it
    logged, by tag; its globals at the end: ``agent``, ``args``, ...)."""
    path = os.path.join(ROOT, "mujoco_baselines", f"{method}_continuous_action.py")
    os.makedirs(workdir, exist_ok=True)
    with monkeypatch.context() as m:
        m.setattr("torch.utils.tensorboard.SummaryWriter", Recorder)
        m.chdir(workdir)
        m.setattr(sys, "argv", [path, *flags])
        script_globals = runpy.run_path(path, run_name="__main__")
    return Recorder.last.scalars, script_globals


def read_rows(run_dir):
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
