"""Test-only helpers for the MuJoCo tests: the lab runner's methods loaded as the modules they are, a short
run's arguments and its metrics.csv."""

from __future__ import annotations

import csv
import importlib
import os
import shutil

import pytest

TIME_KEYS = {"time", "iter_time", "rollout_time", "update_time", "SPS"}
needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="torch.compile's CPU backend (--compile) needs a C++ compiler",
)


def load(method):
    """The lab runner's ``<method>`` (``rgpo_lab.mujoco_runner.<method>_continuous_action``): every test of
    the machinery (metrics.csv, resume, --compile, evaluation, the grid) loads the runner through this; the
    product's single-file scripts (mujoco_baselines/) are tested by test_mujoco_scripts.py and
    test_mujoco_script_vs_lab.py."""
    return importlib.import_module(f"rgpo_lab.mujoco_runner.{method}_continuous_action")


def small_args(module, tmp_path, run_name="run", **overrides):
    """The script's ``Args`` for a short Hopper run (2 iterations of 256 steps) writing under ``tmp_path``."""
    kw = dict(
        env_id="Hopper-v4",
        seed=1,
        total_timesteps=512,
        num_steps=256,
        minibatch_size=64,
        output_dir=str(tmp_path),
        run_name=run_name,
        tensorboard=False,
        verbose=False,
    )
    kw.update(overrides)
    return module.Args(**kw)


def read_rows(run_dir):
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
