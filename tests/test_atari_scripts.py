"""The Atari scripts (atari_baselines/{ppo,rgpo}_atari_envpool.py): single files in CleanRL's structure with
CleanRL's hyper-parameters and metric names, importing from the project only rgpo_trl's loss, gates and KL
controller; a short run of each; RGPO with PPO's clip as its gate and no KL penalty makes the PPO script's
update on the same batch; the KL controller is stepped once per iteration; bad input is one line."""

from __future__ import annotations

import ast
import dataclasses
import glob
import importlib
import os
import subprocess
import sys

import pytest

pytest.importorskip(
    "envpool", reason="envpool is not installed: pip install -e '.[atari]' (Linux x86_64 wheels only)"
)
pytest.importorskip("tyro")

import torch  # noqa: E402

import rgpo_trl  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("ppo", "rgpo")
LIBRARY = {"rgpo_loss", "rgpo_diagnostics", "make_gate", "make_kl_controller", "PAPER_KL_DEFAULTS"}
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": ROOT}
# one update of one mini-batch on 2 x 16 steps; one thread for envpool and torch
TINY = ["--num-envs", "2", "--num-steps", "16", "--total-timesteps", "32", "--env-threads", "1"]
TINY += ["--update-epochs", "1", "--num-minibatches", "1", "--save-model"]


def _path(method):
    return os.path.join(ROOT, "atari_baselines", f"{method}_atari_envpool.py")


def _source(method):
    with open(_path(method)) as f:
        return f.read()


def _run(method, flags, cwd):
    r = subprocess.run(
        [sys.executable, _path(method), *flags], cwd=cwd, capture_output=True, text=True, timeout=600, env=ENV
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (run_dir,) = glob.glob(str(cwd / "runs" / f"Breakout-v5__{method}_atari_envpool__1__*"))
    return r, run_dir


def _scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _model(run_dir, method):
    return torch.load(os.path.join(run_dir, f"{method}_atari_envpool.cleanrl_model"), weights_only=True)


@pytest.mark.parametrize("method", METHODS)
def test_script_is_one_file_importing_only_the_library_loss(method):
    tree = ast.parse(_source(method))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    stdlib = {"os", "random", "sys", "time", "collections", "dataclasses"}
    assert imported <= stdlib | {"envpool", "numpy", "torch", "tyro", "rgpo_trl"}, imported
    used = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "rgpo_trl"
    }
    assert used <= LIBRARY, used - LIBRARY
    assert ("rgpo_trl" in imported) == (method == "rgpo")


@pytest.mark.parametrize("method", METHODS)
def test_the_update_is_visible(method):
    """CleanRL's loop and metric names, in the file itself, and the Nature CNN."""
    src = _source(method)
    for needle in (
        'if __name__ == "__main__":',
        "for iteration in range(1, args.num_iterations + 1):",
        "for step in range(args.num_steps):",
        "lastgaelam",
        "range(args.update_epochs):",
        "np.random.shuffle(b_inds)",
        "loss.backward()",
        "nn.utils.clip_grad_norm_(",
        "optimizer.step()",
        "nn.Conv2d(4, 32, 8, stride=4)",
        "nn.Linear(64 * 7 * 7, 512)",
        "Categorical(logits=logits)",
        '"charts/episodic_return"',
        '"charts/learning_rate"',
        '"losses/value_loss"',
        '"losses/policy_loss"',
        '"losses/entropy"',
        '"losses/old_approx_kl"',
        '"losses/approx_kl"',
        '"losses/explained_variance"',
        '"charts/SPS"',
    ):
        assert needle in src, needle
    assert len(src.splitlines()) <= 400
    if method == "rgpo":
        assert "rgpo_trl.rgpo_loss(" in src and "rgpo_trl.make_gate(" in src and "kl_ctl.update(" in src
    else:
        assert '"losses/clipfrac"' in src


def test_defaults_are_cleanrls_and_rgpo_adds_only_its_own_flags():
    ppo = importlib.import_module("atari_baselines.ppo_atari_envpool").Args()
    rgpo = importlib.import_module("atari_baselines.rgpo_atari_envpool").Args()
    cleanrl = dict(env_id="Breakout-v5", total_timesteps=10_000_000, learning_rate=2.5e-4, num_envs=8)
    cleanrl |= dict(num_steps=128, gamma=0.99, gae_lambda=0.95, num_minibatches=4, update_epochs=4)
    cleanrl |= dict(clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, target_kl=None)
    for name, value in cleanrl.items():
        assert getattr(ppo, name) == value, name
    ppo_fields = {f.name for f in dataclasses.fields(ppo)}
    rgpo_fields = {f.name for f in dataclasses.fields(rgpo)}
    assert ppo_fields - rgpo_fields == {"clip_coef", "target_kl"}
    own = {"vclip_coef", "gate", "gate_params", "kl_controller", "kl_backstop"}
    assert rgpo_fields - ppo_fields == own | set(rgpo_trl.PAPER_KL_DEFAULTS)
    for name in (ppo_fields & rgpo_fields) - {"exp_name"}:
        assert getattr(ppo, name) == getattr(rgpo, name), name
    assert rgpo.vclip_coef == ppo.clip_coef and rgpo.gate == "sigmoid" and rgpo.kl_controller == "adaptive"
    assert all(getattr(rgpo, k) == v for k, v in rgpo_trl.PAPER_KL_DEFAULTS.items())


def test_rgpo_with_ppo_clip_makes_ppos_update(tmp_path):
    """Same seed, same batch (the rollout of the same initial network), one optimiser step: RGPO with the
    ppo_clip gate (eps = clip_coef) and beta fixed at 0 leaves the parameters PPO's script leaves. At the
    step's ratio 1, PPO's clipped surrogate and g(r) = clip(r) have one value and one gradient. RGPO's default
    sigmoid gate from the same start ends elsewhere: the comparison can fail."""
    runs = {}
    for name, method, flags in (
        ("ppo", "ppo", []),
        ("clip", "rgpo", ["--gate", "ppo_clip", "--gate-params", "eps", "0.1"]),
        ("sigmoid", "rgpo", []),
    ):
        (tmp_path / name).mkdir()
        beta = ["--kl-controller", "fixed", "--kl-coef", "0"] if method == "rgpo" else []
        _, run_dir = _run(method, TINY + flags + beta, tmp_path / name)
        runs[name] = _model(run_dir, method)
    assert runs["ppo"].keys() == runs["clip"].keys()
    gap = max((runs["ppo"][k] - runs["clip"][k]).abs().max().item() for k in runs["ppo"])
    sigmoid_gap = max((runs["ppo"][k] - runs["sigmoid"][k]).abs().max().item() for k in runs["ppo"])
    assert gap <= 1e-6, gap
    assert sigmoid_gap > 1e-4, sigmoid_gap


def test_short_runs_write_cleanrls_metrics_and_step_the_kl_controller_once_per_iteration(tmp_path):
    """Two iterations of each script (one environment, 128 steps each, two epochs of two mini-batches), with
    a finished game logged; RGPO's beta at iteration 2 is the adaptive controller's step from beta_0 on
    iteration 1's mean KL to pi_old, replayed here."""
    flags = ["--num-envs", "1", "--num-steps", "128", "--total-timesteps", "256", "--env-threads", "1"]
    flags += ["--update-epochs", "2", "--num-minibatches", "2", "--save-model"]
    common = {"charts/episodic_return", "charts/episodic_length", "charts/learning_rate", "charts/SPS"}
    common |= {f"losses/{k}" for k in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl")}
    common.add("losses/explained_variance")
    rgpo_own = {f"rgpo/{k}" for k in ("kl_coef", "gate_mean", "rejected_frac", "ess", "epochs")}
    for method in METHODS:
        (tmp_path / method).mkdir()
        r, run_dir = _run(method, flags, tmp_path / method)
        scalars = _scalars(run_dir)
        expected = common | (rgpo_own if method == "rgpo" else {"losses/clipfrac"})
        assert expected <= set(scalars), expected - set(scalars)
        assert [step for step, _ in scalars["losses/approx_kl"]] == [128, 256]
        assert r.stdout.splitlines()[-1].startswith(
            f"model saved to runs/Breakout-v5__{method}_atari_envpool"
        )
        if method == "rgpo":
            (_, beta_1), (_, beta_2) = scalars["rgpo/kl_coef"]
            kl_ctl = rgpo_trl.make_kl_controller("adaptive", **rgpo_trl.PAPER_KL_DEFAULTS)
            assert beta_1 == pytest.approx(kl_ctl.kl_coef)
            kl_ctl.update(scalars["losses/approx_kl"][0][1])
            assert beta_2 == pytest.approx(kl_ctl.kl_coef, rel=1e-6)
            assert beta_2 != pytest.approx(beta_1)


@pytest.mark.parametrize(
    "method,flags,needle",
    [
        ("rgpo", ["--env-id", "HalfCheetah-v4"], "env_id must be an envpool Atari id"),
        ("rgpo", ["--gate", "nope"], "gate must be one of the registered gates"),
        (
            "ppo",
            ["--total-timesteps", "100"],
            "total_timesteps must be >= num_envs * num_steps = 1024, got 100",
        ),
        ("ppo", ["--num-minibatches", "3"], "num_minibatches must divide num_envs * num_steps = 1024, got 3"),
        ("ppo", ["--env-threads", "-1"], "env_threads >= 0 (0: envpool's default), got 1 and -1"),
    ],
)
def test_bad_input_is_one_line_and_leaves_no_run_folder(method, flags, needle, tmp_path):
    r = subprocess.run(
        [sys.executable, _path(method), *flags], cwd=tmp_path, capture_output=True, text=True, env=ENV
    )
    assert r.returncode == 1, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert not (tmp_path / "runs").exists()


def test_scripts_run_as_modules(tmp_path):
    """`python -m atari_baselines.<script>` (the directory is packaged with the library)."""
    out = subprocess.run(
        [sys.executable, "-m", "atari_baselines.rgpo_atari_envpool", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=ENV,
    )
    assert out.returncode == 0 and "--kl-backstop" in out.stdout, out.stderr[-2000:]
