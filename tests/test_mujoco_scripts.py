"""The product's MuJoCo scripts (mujoco_baselines/<method>_continuous_action.py): single files in CleanRL's
structure that import from the project only rgpo_trl's loss, gates and KL controller, and a run that writes
CleanRL's TensorBoard metrics. Their pieces against references: test_mujoco_script_math.py; the lab's driver
of them: test_mujoco_drive.py; their one-line errors: test_cli_errors.py."""

from __future__ import annotations

import ast
import glob
import importlib
import os
import subprocess
import sys

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")
pytest.importorskip("tyro")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("ppo", "rgpo", "trpo", "awr")
# what a script may take from the library: the loss and its pieces, the gates, the KL controller
LIBRARY = {
    "rgpo_loss",
    "rgpo_diagnostics",
    "make_gate",
    "make_kl_controller",
    "PAPER_KL_DEFAULTS",
    "kl_old_estimate",
    "clamp_log_ratio",
    "effective_sample_size",
    "acceptance_bce",
    "acceptance_diagnostics",
}


def _source(method):
    with open(os.path.join(ROOT, "mujoco_baselines", f"{method}_continuous_action.py")) as f:
        return f.read()


def _script(method):
    return importlib.import_module(f"mujoco_baselines.{method}_continuous_action")


@pytest.mark.parametrize("method", METHODS)
def test_script_is_one_file_importing_only_the_library_loss(method):
    tree = ast.parse(_source(method))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert "rgpo_lab" not in imported and "mujoco_baselines" not in imported
    stdlib = {
        "copy",
        "functools",
        "math",
        "os",
        "random",
        "sys",
        "time",
        "warnings",
        "collections",
        "dataclasses",
    }
    assert imported <= stdlib | {
        "gymnasium",
        "mujoco",
        "numpy",
        "torch",
        "tyro",
        "rgpo_trl",
    }, imported
    used = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "rgpo_trl"
    }
    assert used <= LIBRARY, used - LIBRARY


@pytest.mark.parametrize("method", METHODS)
def test_the_update_is_visible(method):
    """The loop a reader looks for, in the file itself: rollout, GAE, epochs of shuffled mini-batches,
    backward, gradient clipping, the optimiser step, and CleanRL's metric names."""
    src = _source(method)
    for needle in (
        'if __name__ == "__main__":',
        "for iteration in range(1, args.num_iterations + 1):",
        "for step in range(args.num_steps):",
        "lastgaelam",
        "for epoch in range(args.update_epochs):",
        "torch.randperm(args.batch_size).split(args.minibatch_size)",
        "loss.backward()",
        "nn.utils.clip_grad_norm_(",
        "optimizer.step()",
        '"charts/episodic_return"',
        '"charts/learning_rate"',
        '"losses/value_loss"',
        '"losses/policy_loss"',
        '"losses/entropy"',
        '"losses/old_approx_kl"',
        '"losses/approx_kl"',
        '"losses/explained_variance"',
        '"charts/SPS"',
        '"eval/episodic_return"',
    ):
        assert needle in src, needle
    assert len(src.splitlines()) <= 660  # about 480 eager, the --compile block, RGPO's acceptance classifier
    if method == "rgpo":
        assert "rgpo_trl.rgpo_loss(" in src and "rgpo_trl.make_gate(" in src and "make_kl_controller(" in src
    if method == "ppo":
        assert '"losses/clipfrac"' in src


def test_readme_command_runs_and_writes_cleanrl_metrics(tmp_path):
    """The README's command, short: TensorBoard events under runs/{run_name} with CleanRL's names and RGPO's
    own, and --save-model's file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    script = os.path.join(ROOT, "mujoco_baselines", "rgpo_continuous_action.py")
    argv = [sys.executable, script, "--env-id", "Hopper-v4", "--total-timesteps", "512", "--num-steps", "256"]
    argv += ["--num-minibatches", "4", "--save-model"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    (run_dir,) = glob.glob(str(tmp_path / "runs" / "Hopper-v4__rgpo_continuous_action__1__*"))
    assert os.path.isfile(os.path.join(run_dir, "rgpo_continuous_action.cleanrl_model"))
    events = EventAccumulator(run_dir)
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"charts/episodic_return", "losses/approx_kl", "losses/policy_loss", "rgpo/kl_coef"} <= tags
    assert [e.step for e in events.Scalars("losses/approx_kl")] == [256, 512]
    assert r.stdout.splitlines()[-1].startswith("model saved to runs/Hopper-v4__rgpo_continuous_action__1__")


def test_scripts_run_as_files_and_as_modules(tmp_path):
    """`python mujoco_baselines/<script>.py` from anywhere, and `python -m mujoco_baselines.<script>` (the
    directory is installed with the package)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    for how in (
        [os.path.join(ROOT, "mujoco_baselines", "awr_continuous_action.py")],
        ["-m", "mujoco_baselines.awr_continuous_action"],
    ):
        out = subprocess.run(
            [sys.executable, *how, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env=env,
        )
        assert out.returncode == 0 and "--awr-beta" in out.stdout, out.stderr[-2000:]
        assert "--compile" in out.stdout and "--checkpoint-dir" not in out.stdout  # no resume
