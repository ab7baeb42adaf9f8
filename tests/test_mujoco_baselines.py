"""Short in-process runs of the lab's MuJoCo runner (rgpo_lab/mujoco_runner/*_continuous_action.py, the
machinery the committed results were made with: metrics.csv, checkpoints and resume, --compile, evaluation,
the grid). The product's single-file scripts (mujoco_baselines/) are tested by test_mujoco_scripts.py and
against this runner by test_mujoco_script_vs_lab.py."""

from __future__ import annotations

import glob
import json
import math
import os
import sys

import numpy as np
import pytest
from _mujoco_utils import TIME_KEYS, load, needs_compiler, read_rows, small_args
from _references import paper_rule

import rgpo_trl
from rgpo_lab import mujoco_grid as grid

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")
pytest.importorskip("tyro")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = grid.MUJOCO_METHODS  # the runner's and the report's list of the four scripts


def test_the_method_list_names_every_script():
    for where in ("mujoco_baselines", os.path.join("rgpo_lab", "mujoco_runner")):  # the scripts, the runner
        scripts = [f for f in os.listdir(os.path.join(ROOT, where)) if f.endswith("_continuous_action.py")]
        assert sorted(METHODS) == sorted(f.removesuffix("_continuous_action.py") for f in scripts), where


COMMON_KEYS = [
    "iteration",
    "global_step",
    "episodic_return",
    "return_last100",
    "episodes",
    "kl",
    "kl_max",
    "spike",
    "ess",
    "grad_var",
    "policy_loss",
    "value_loss",
    "entropy",
    "explained_variance",
    "learning_rate",
    "epochs",
    "iter_time",
    "rollout_time",
    "update_time",
    "SPS",
]
EXTRA_KEYS = {
    "ppo": ["clipfrac"],
    "rgpo": ["kl_coef", "kl_coef_next", "gate_mean", "weight_mean", "rejected_frac", "ratio_max", "backstop"],
    "trpo": ["trpo_kl", "step_frac", "linesearch_evals"],
    "awr": ["weight_clipfrac", "weight_max"],
}


@pytest.mark.parametrize("method", METHODS)
def test_script_runs_and_is_deterministic(method, tmp_path):
    module = load(method)
    final = module.main(small_args(module, tmp_path, "a", tensorboard=method == "ppo"))
    module.main(small_args(module, tmp_path, "b"))
    rows_a, rows_b = read_rows(tmp_path / "a"), read_rows(tmp_path / "b")
    assert len(rows_a) == 2
    for key in COMMON_KEYS + EXTRA_KEYS[method]:
        for row in rows_a:
            assert key in row, key
            assert math.isfinite(row[key]), (key, row[key])
    # same seed -> identical metrics (timings aside)
    for ra, rb in zip(rows_a, rows_b, strict=True):
        assert {k: v for k, v in ra.items() if k not in TIME_KEYS} == {
            k: v for k, v in rb.items() if k not in TIME_KEYS
        }
    assert math.isfinite(final["final_return"]) and final["global_step"] == 512
    saved = json.load(open(tmp_path / "a" / "final.json"))
    assert saved["final_return"] == final["final_return"]
    config = json.load(open(tmp_path / "a" / "config.json"))
    assert config["hidden_size"] == 256 and config["learning_rate"] == 3e-4 and config["minibatch_size"] == 64
    if method == "ppo":
        assert glob.glob(str(tmp_path / "a" / "events.out.tfevents.*"))
    # another seed gives a different run
    module.main(small_args(module, tmp_path, "c", seed=2))
    assert read_rows(tmp_path / "c")[0]["policy_loss"] != rows_a[0]["policy_loss"]


def test_paper_defaults():
    for method in METHODS:
        a = load(method).Args()
        assert (a.hidden_size, a.learning_rate, a.adam_eps, a.gamma, a.gae_lambda) == (
            256,
            3e-4,
            1e-5,
            0.99,
            0.95,
        )
        assert (a.num_steps, a.minibatch_size, a.update_epochs, a.vclip_coef) == (2048, 64, 10, 0.2)
        assert a.norm_obs and a.norm_reward and a.clip_vloss and a.torch_threads == 1
    assert load("ppo").Args().clip_coef == 0.2
    r = load("rgpo").Args()
    ours = (r.gate, r.gate_params, r.kl_controller, r.kl_coef, r.kl_target, r.kl_coef_min, r.kl_coef_max)
    assert ours == ("sigmoid", {}, "adaptive", 0.5, 0.02, 0.01, 5.0)
    assert r.kl_backstop == 0.1 and rgpo_trl.make_gate(r.gate, **r.gate_params).k == 5.0  # the paper's k
    t = load("trpo").Args()
    assert (t.max_kl, t.cg_iters, t.cg_damping, t.update_epochs) == (0.01, 10, 0.1, 10)
    assert load("awr").Args().awr_beta == 1.0


def test_cli_parses_flags():
    import tyro

    module = load("rgpo")
    args = tyro.cli(
        module.Args,
        args=["--env-id", "Walker2d-v5", "--gate", "temperature", "--gate-params", "temperature", "2"],
    )
    assert (
        args.env_id == "Walker2d-v5"
        and args.gate == "temperature"
        and args.gate_params == {"temperature": 2.0}
    )


def test_rgpo_calls_library_loss_and_adapts_beta(tmp_path, monkeypatch):
    import torch

    module = load("rgpo")
    calls = []
    real = rgpo_trl.rgpo_loss

    def spy(*a, **kw):
        calls.append(kw["kl_coef"])
        return real(*a, **kw)

    diag_calls = []
    real_diag = rgpo_trl.rgpo_diagnostics

    def diag_spy(logps, old_logps, gate, **kw):
        out = real_diag(logps, old_logps, gate, **kw)
        diag_calls.append((logps.shape, gate, out["kl_old"]))
        return out

    monkeypatch.setattr(rgpo_trl, "rgpo_loss", spy)
    monkeypatch.setattr(rgpo_trl, "rgpo_diagnostics", diag_spy)
    # a small target makes beta move (doubling), checking the rule on real KLs
    module.main(small_args(module, tmp_path, "r", total_timesteps=256 * 4, kl_target=0.002))
    rows = read_rows(tmp_path / "r")
    n_epochs = sum(int(r["epochs"]) for r in rows)
    assert len(calls) == n_epochs * 256 // 64 > 0
    # the logged stats come from the library's diagnostics: one call per epoch, a row per mini-batch,
    # and the logged KL is the mean of those rows
    assert len(diag_calls) == n_epochs and all(shape == (4, 64) for shape, _, _ in diag_calls)
    assert all(gate.name == "sigmoid" and gate.k == 5.0 for _, gate, _ in diag_calls)
    first_iteration = torch.cat([kl for _, _, kl in diag_calls[: int(rows[0]["epochs"])]])
    assert rows[0]["kl"] == pytest.approx(first_iteration.double().mean().item(), rel=1e-6)
    assert rows[0]["kl_max"] == pytest.approx(first_iteration.max().item(), rel=1e-6)
    assert rows[0]["kl_coef"] == 0.5
    beta = 0.5
    for row in rows:
        assert row["kl_coef"] == beta
        beta = paper_rule(beta, row["kl"], target=0.002)
        assert row["kl_coef_next"] == beta
    assert any(r["kl_coef_next"] != r["kl_coef"] for r in rows)
    # the value used for every mini-batch is the controller's value of that iteration
    assert calls[0] == 0.5 and set(calls) <= {r["kl_coef"] for r in rows}


def test_ppo_epoch_stats_match_per_minibatch_float64_formulas():
    import torch

    module = load("ppo")
    gen = torch.Generator().manual_seed(0)
    new, old = torch.randn(3, 16, generator=gen), torch.randn(3, 16, generator=gen)
    stats = module.ppo_epoch_stats(new, old, 0.2)
    assert list(stats) == ["kl", "ess", "clipfrac"]
    st = torch.stack(list(stats.values()), dim=1).double()
    for i in range(3):
        lr = (new[i] - old[i]).double()
        r = lr.exp()
        w = r.clamp(0.8, 1.2)
        expected = [
            (r - 1 - lr).mean(),
            w.sum() ** 2 / (16 * (w * w).sum()),
            ((r - 1).abs() > 0.2).double().mean(),
        ]
        torch.testing.assert_close(st[i], torch.stack(expected), rtol=1e-5, atol=1e-6)


def test_rgpo_backstop_leaves_epoch_loop(tmp_path):
    module = load("rgpo")
    module.main(small_args(module, tmp_path, "s", total_timesteps=256, kl_backstop=1e-9))
    row = read_rows(tmp_path / "s")[0]
    assert row["backstop"] == 1 and row["epochs"] == 1


@pytest.mark.parametrize("gate", ["clipped_linear", "temperature"])
def test_rgpo_gate_ablations(gate, tmp_path):
    module = load("rgpo")
    # v5 ids work as well as the paper's v4
    env_id = "Hopper-v5" if gate == "temperature" else "Hopper-v4"
    module.main(
        small_args(module, tmp_path, gate, total_timesteps=128, num_steps=128, gate=gate, env_id=env_id)
    )
    row = read_rows(tmp_path / gate)[0]
    assert math.isfinite(row["ess"]) and 0 < row["ess"] <= 1
    assert json.load(open(tmp_path / gate / "config.json"))["gate"] == gate


@pytest.mark.parametrize("method", ["ppo", "rgpo"])
def test_nan_loss_stops_with_iteration(method, tmp_path, monkeypatch):
    import torch

    module = load(method)
    name = "ppo_policy_loss" if method == "ppo" else "rgpo_policy_loss"
    real = getattr(module, name)
    count = [0]

    def poisoned(*a, **kw):
        loss = real(*a, **kw)
        count[0] += 1
        return loss * torch.nan if count[0] == 7 else loss

    monkeypatch.setattr(module, name, poisoned)
    from rgpo_lab.mujoco_runner import common

    with pytest.raises(common.NonFiniteLossError, match="iteration 1 "):
        module.main(small_args(module, tmp_path, "nan"))


def test_nan_value_loss_stops_trpo_with_both_losses(tmp_path, monkeypatch):
    """TRPO's value-only steps stop on a non-finite loss, naming the iteration's (finite) TRPO surrogate as
    the policy loss beside the value loss."""
    import torch

    module = load("trpo")
    real, count = module.value_minibatch_loss, [0]

    def poisoned(*a, **kw):
        loss, v_loss = real(*a, **kw)
        count[0] += 1
        return (loss * torch.nan, v_loss * torch.nan) if count[0] == 7 else (loss, v_loss)

    monkeypatch.setattr(module, "value_minibatch_loss", poisoned)
    from rgpo_lab.mujoco_runner import common

    with pytest.raises(common.NonFiniteLossError, match=r"iteration 1 .*policy_loss=-?\d.*value_loss=nan"):
        module.main(small_args(module, tmp_path, "nan"))


def test_trpo_step_respects_kl_bound(tmp_path):
    module = load("trpo")
    module.main(small_args(module, tmp_path, "t", total_timesteps=256 * 3))
    rows = read_rows(tmp_path / "t")
    assert all(r["trpo_kl"] <= 0.01 for r in rows)
    assert any(r["step_frac"] > 0 for r in rows)

    # directly: a large advantage signal, the accepted step's closed-form KL is <= delta
    import torch

    torch.manual_seed(0)
    args = module.Args(hidden_size=32, max_kl=0.005)
    agent = module.Agent(5, 2, args)
    obs, actions = torch.randn(512, 5), torch.randn(512, 2)
    with torch.no_grad():
        old_mean = agent.actor_mean(obs)
        old_logstd = agent.actor_logstd.clone()
        oldlogprob = agent.log_prob(old_mean, actions)
    adv = torch.randn(512) * 10
    params = agent.policy_parameters()
    start = {k: v.clone() for k, v in agent.state_dict().items()}
    for make_fvp in (
        module.fisher_vector_product,
        module.gauss_newton_fvp,
    ):  # default and --compile's products
        agent.load_state_dict(start)
        _, kl, frac, _, logp = module.trpo_step(agent, params, obs, actions, oldlogprob, adv, args, make_fvp)
        with torch.no_grad():
            mean = agent.actor_mean(obs)
            kl_now = float(module.gaussian_kl(old_mean, old_logstd, mean, agent.actor_logstd).mean())
            assert torch.equal(logp, agent.log_prob(mean, actions))  # log-probs of the resulting policy
        assert frac > 0 and kl_now <= 0.005 and abs(kl_now - kl) < 1e-6


def test_trpo_fisher_vector_product_is_the_closed_form_fisher():
    """At pi = pi_old the Hessian of the mean Gaussian KL is the Fisher information: J^T diag(exp(-2 logstd))
    J / N for the mean network's parameters (J its Jacobian over the N states), 2 I for log-std, no cross
    terms. Both products (the KL's Hessian by autograd, and --compile's hand-written J v / J^T u) in float64
    against that closed form built from autograd's full Jacobian, bit for bit against rebuilding the KL graph
    per product, and conjugate gradient against a direct solve."""
    import torch

    module = load("trpo")
    torch.manual_seed(0)
    agent = module.Agent(4, 2, module.Args(hidden_size=8)).double()
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([-0.3, 0.4], dtype=torch.float64))
        agent.actor_mean[-1].weight.mul_(50)  # away from the near-zero initial output layer
    obs = torch.randn(16, 4, dtype=torch.float64)
    params = agent.policy_parameters()
    with torch.no_grad():
        old_mean, old_logstd = agent.actor_mean(obs), agent.actor_logstd.clone()

    def kl_fn():
        return module.gaussian_kl(old_mean, old_logstd, agent.actor_mean(obs), agent.actor_logstd).mean()

    damping = 0.1
    fvp = module.fisher_vector_product(agent, obs, kl_fn(), params, damping)
    closed_form = module.gauss_newton_fvp(agent, obs, None, params, damping)  # --compile's products
    mean_params = params[:-1]
    n_mean = sum(p.numel() for p in mean_params)
    jac = torch.autograd.functional.jacobian(
        lambda *ps: torch.func.functional_call(
            agent.actor_mean,
            dict(zip([n for n, _ in agent.actor_mean.named_parameters()], ps, strict=True)),
            (obs,),
        ),
        tuple(p.detach() for p in mean_params),
    )
    J = torch.cat([j.reshape(obs.shape[0] * 2, -1) for j in jac], dim=1)  # (N * act_dim, n_mean)
    m = torch.exp(-2 * agent.actor_logstd.detach()).repeat(obs.shape[0]) / obs.shape[0]
    fisher = torch.block_diag(J.T @ (m[:, None] * J), 2 * torch.eye(2, dtype=torch.float64))
    for seed in range(3):
        v = torch.randn(n_mean + 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        torch.testing.assert_close(fvp(v), fisher @ v + damping * v, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(closed_form(v), fisher @ v + damping * v, rtol=1e-10, atol=1e-12)

        kl_grad = module.flat(torch.autograd.grad(kl_fn(), params, create_graph=True))  # rebuilt per product
        assert torch.equal(fvp(v), module.flat(torch.autograd.grad(kl_grad.dot(v), params)) + damping * v)

    b = torch.randn(n_mean + 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    A = fisher + damping * torch.eye(n_mean + 2, dtype=torch.float64)
    x = module.conjugate_gradient(lambda v: A @ v, b, iters=4 * (n_mean + 2), tol=1e-30)
    torch.testing.assert_close(x, torch.linalg.solve(A, b), rtol=1e-6, atol=1e-8)


def test_env_resets_explicitly_without_fake_transitions():
    """Single env with explicit resets: every step is a real transition, episode returns are raw."""
    module = load("ppo")
    args = module.Args(env_id="InvertedPendulum-v4", norm_obs=False)
    env = module.MujocoEnv(args)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    steps_since_done, episodes, scaled = 0, [], []
    for _ in range(400):
        obs, reward, done, episode = env.step(rng.uniform(-3, 3, size=env.act_dim))
        steps_since_done += 1
        scaled.append(reward)
        assert done == (episode is not None)
        if done:
            # InvertedPendulum pays a raw reward of 1 per step: raw return == length, every step counted
            assert episode[0] == episode[1] == steps_since_done
            assert np.abs(obs).max() <= 0.011  # the next observation is a fresh reset (+-0.01 noise)
            episodes.append(episode)
            steps_since_done = 0
    env.close()
    assert len(episodes) >= 5
    assert not np.allclose(scaled, 1.0)  # the learner sees scaled rewards


def test_rgpo_script_imports_library_loss():
    for where in ("mujoco_baselines", os.path.join("rgpo_lab", "mujoco_runner")):  # the script, the runner
        src = open(os.path.join(ROOT, where, "rgpo_continuous_action.py")).read()
        assert "rgpo_trl.rgpo_loss(" in src and "def rgpo_loss" not in src
        assert "rgpo_trl.rgpo_diagnostics(" in src and "def rgpo_diagnostics" not in src


@pytest.mark.skipif(
    not os.environ.get("CLEANRL_PATH"), reason="set CLEANRL_PATH to a vwxyzjn/cleanrl checkout"
)
def test_cleanrl_gymnasium1_patches_apply():
    from rgpo_lab.benchmarks import mujoco_speed as bench

    src = open(bench.find_cleanrl_file(os.environ["CLEANRL_PATH"])).read()
    patched = bench.patch_cleanrl(src)
    assert "AutoresetMode.SAME_STEP" in patched and "env.observation_space)" in patched
    compile(patched, "ppo_continuous_action.py", "exec")


TIMING_COLUMNS = {"time", "iter_time", "rollout_time", "update_time", "SPS"}


@pytest.mark.parametrize(
    "method,compile", [(m, False) for m in METHODS] + [pytest.param("rgpo", True, marks=needs_compiler)]
)
def test_interrupted_run_resumes_to_the_same_metrics(method, compile, tmp_path, monkeypatch):
    """A run stopped after iteration 4 (checkpoint at 2, every 2) and resumed gives the metrics of an
    uninterrupted run exactly, timing columns aside: the checkpoint restores the networks, optimiser,
    normalisation statistics, MuJoCo simulator state, RNG states and episode counters. Under --compile too
    (the same compiled kernels on the same state; the learning rate is read from the reloaded optimiser)."""
    module = load(method)
    kw = dict(total_timesteps=256 * 5, checkpoint_every=2, compile=compile, eval_every=1, eval_episodes=1)
    reference = module.main(small_args(module, tmp_path / "a", "run", **kw))
    assert not os.path.exists(tmp_path / "a" / "run" / "checkpoint.pt")  # removed once the run is done

    from rgpo_lab.mujoco_runner import common

    real_save, calls = common.save_checkpoint, []

    def interrupt_on_second_save(path, checkpoint):
        calls.append(checkpoint["progress"]["iteration"])
        if len(calls) == 2:
            raise KeyboardInterrupt  # after iteration 4's metrics row, before its checkpoint
        real_save(path, checkpoint)

    monkeypatch.setattr(common, "save_checkpoint", interrupt_on_second_save)
    with pytest.raises(KeyboardInterrupt):
        module.main(small_args(module, tmp_path / "b", "run", **kw))
    monkeypatch.setattr(common, "save_checkpoint", real_save)
    assert calls == [2, 4] and len(read_rows(tmp_path / "b" / "run")) == 4
    resumed = module.main(small_args(module, tmp_path / "b", "run", resume=True, **kw))

    rows_a, rows_b = read_rows(tmp_path / "a" / "run"), read_rows(tmp_path / "b" / "run")
    assert [r["iteration"] for r in rows_b] == [1, 2, 3, 4, 5]
    for ra, rb in zip(rows_a, rows_b, strict=True):
        for key in ra.keys() - TIMING_COLUMNS:
            assert ra[key] == rb[key] or (math.isnan(ra[key]) and math.isnan(rb[key])), (
                key,
                ra[key],
                rb[key],
            )
    assert resumed["final_return"] == reference["final_return"] and resumed["resumed_at_iterations"] == [2]
    # the periodic evaluations survive the interruption: rows up to the checkpoint from it, later ones
    # recomputed
    eval_a, eval_b = (open(tmp_path / d / "run" / "eval.csv").read() for d in ("a", "b"))
    assert eval_a == eval_b and len(eval_a.splitlines()) == 6
    assert resumed["eval_episodes"] == reference["eval_episodes"]


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_evaluation_leaves_training_unchanged(method, tmp_path):
    """Evaluating every iteration and at the end changes no training metric (timings aside): it draws from no
    global random stream and does not touch the training environment or its normalisation."""
    module = load(method)
    plain = module.main(small_args(module, tmp_path, "a", total_timesteps=256 * 3, eval_episodes=0))
    evaluated = module.main(
        small_args(module, tmp_path, "b", total_timesteps=256 * 3, eval_every=1, eval_episodes=2)
    )
    for ra, rb in zip(read_rows(tmp_path / "a"), read_rows(tmp_path / "b"), strict=True):
        assert {k: v for k, v in ra.items() if k not in TIME_KEYS} == {
            k: v for k, v in rb.items() if k not in TIME_KEYS
        }
    assert "eval_return_mean" not in plain and plain["final_return"] == evaluated["final_return"]
    episodes = evaluated["eval_episodes"]
    assert len(episodes) == 2 and evaluated["eval_return_mean"] == pytest.approx(sum(episodes) / 2)
    assert evaluated["eval_return_std"] == pytest.approx(float(np.std(episodes, ddof=1)))
    assert len(open(tmp_path / "b" / "eval.csv").read().splitlines()) == 4  # header + 3 iterations


def test_evaluation_is_the_mean_action_on_its_own_seeded_env():
    """Against a plain gymnasium loop: a policy whose mean action is a fixed function of the normalised
    observation, the env seeded with seed + EVAL_SEED_OFFSET, observations normalised with frozen
    statistics."""
    import gymnasium as gym
    import torch

    from rgpo_lab.mujoco_runner import common as evaluation  # the runner's shared module

    rng = np.random.default_rng(0)
    mean, var = rng.normal(size=11), rng.uniform(0.5, 2.0, size=11)
    w = rng.normal(size=(3, 11)) * 0.3

    class Agent:
        def mean_action(self, x):
            return torch.as_tensor(w, dtype=torch.float32) @ x

    class TrainEnv:
        obs_rms = type("RMS", (), {"mean": mean, "var": var})()
        low, high = -np.ones(3, np.float32), np.ones(3, np.float32)

    class Args:
        env_id, seed, eval_episodes, norm_obs, obs_clip = "Hopper-v4", 3, 2, True, 10.0

    got = evaluation.evaluate(TrainEnv(), Agent(), Args())
    env, expected = gym.make("Hopper-v4"), []
    obs, _ = env.reset(seed=3 + evaluation.EVAL_SEED_OFFSET)
    for _ in range(2):
        total, done = 0.0, False
        while not done:
            x = np.clip((obs - mean) / np.sqrt(var + 1e-8), -10, 10)
            a = (torch.as_tensor(w, dtype=torch.float32) @ torch.as_tensor(x, dtype=torch.float32)).numpy()
            obs, r, term, trunc, _ = env.step(np.clip(a, -1, 1))
            total, done = total + float(r), term or trunc
        expected.append(total)
        obs, _ = env.reset()
    assert got == expected and got[0] != got[1]
    assert (TrainEnv.obs_rms.mean == mean).all()  # read, not updated


def test_resume_refuses_another_configuration_and_a_corrupt_checkpoint(tmp_path):
    from rgpo_lab.mujoco_runner import common

    module = load("rgpo")
    module.main(
        small_args(module, tmp_path, "run", total_timesteps=256 * 3, checkpoint_every=1, keep_checkpoint=True)
    )
    ckpt = tmp_path / "run" / "checkpoint.pt"
    assert ckpt.exists()
    with pytest.raises(common.CheckpointError, match=r"another configuration \(kl_target: 0.02 -> 0.05\)"):
        module.main(small_args(module, tmp_path, "run", total_timesteps=256 * 3, resume=True, kl_target=0.05))
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    with pytest.raises(common.CheckpointError, match="cannot be read"):
        module.main(small_args(module, tmp_path, "run", total_timesteps=256 * 3, resume=True))


def test_scripts_share_the_common_module_and_their_defaults():
    """What is not the algorithm lives once, in the runner's common.py: every method uses the same objects
    (not copies); every flag the scripts share is declared once, in common.BaseArgs (StaleSampleArgs for PPO's
    and RGPO's stale-sample flags), and a script re-declares a shared field only for its exp_name or its own
    help text, never with another default."""
    import dataclasses

    from rgpo_lab.mujoco_runner import common

    base = {f.name: f for f in dataclasses.fields(common.BaseArgs)}
    assert {"env_id", "hidden_size", "learning_rate", "num_steps", "checkpoint_every", "spike_kl"} <= set(
        base
    )
    redeclared = {"ppo": {"decoupled"}, "rgpo": {"decoupled"}, "trpo": {"compile"}, "awr": set()}
    for method in METHODS:
        module = load(method)
        assert (
            module.common is common and module.Agent is common.Agent and module.MujocoEnv is common.MujocoEnv
        )
        assert issubclass(
            module.Args, common.StaleSampleArgs if method in ("ppo", "rgpo") else common.BaseArgs
        )
        source = open(
            os.path.join(ROOT, "rgpo_lab", "mujoco_runner", f"{method}_continuous_action.py")
        ).read()
        assert "class Agent" not in source and "class MujocoEnv" not in source and "sys.path" not in source
        inherited = {f.name for f in dataclasses.fields(common.StaleSampleArgs)} | set(base)
        assert set(module.Args.__annotations__) & inherited == {"exp_name"} | redeclared[method], method
        args = module.Args()
        assert args.exp_name == f"{method}_continuous_action"
        for name in redeclared[method]:
            assert getattr(args, name) == getattr(common.StaleSampleArgs(), name), (method, name)
    # the KL controller's defaults are written once, in rgpo_trl's AdaptiveKLController; a spike is 2 x target
    rgpo_args, adaptive = load("rgpo").Args(), rgpo_trl.AdaptiveKLController()
    assert rgpo_args.kl_target == adaptive.kl_target == 0.02
    assert (rgpo_args.kl_coef, rgpo_args.kl_coef_min, rgpo_args.kl_coef_max) == (
        adaptive.kl_coef,
        adaptive.kl_coef_min,
        adaptive.kl_coef_max,
    )
    assert base["spike_kl"].default == common.SPIKE_KL == 2 * adaptive.kl_target == 0.04


def test_minibatch_stats_by_name():
    """MinibatchStats: rows of named statistics, added per mini-batch (0-d) or per epoch (1-d), read by name
    in the order they were added; the early stops' float32 mean is that of the joined column."""
    import torch

    from rgpo_lab.mujoco_runner.common import MinibatchStats

    stats = MinibatchStats()
    stats.add(kl=torch.tensor([0.01, 0.03]), ess=torch.tensor([0.9, 0.8]), ratio_max=torch.tensor([1.5, 2.5]))
    stats.add(kl=torch.tensor(0.02), ess=torch.tensor(0.7), ratio_max=torch.tensor(1.0))
    assert len(stats) == 3 and stats.names == ("kl", "ess", "ratio_max")
    arrays = stats.arrays()
    assert list(arrays) == ["kl", "ess", "ratio_max"]
    np.testing.assert_array_equal(arrays["ratio_max"], torch.tensor([1.5, 2.5, 1.0]).double().numpy())
    assert stats.mean("kl") == float(torch.tensor([0.01, 0.03, 0.02]).mean())
    with pytest.raises(ValueError, match="added where"):
        stats.add(ess=torch.tensor(0.5), kl=torch.tensor(0.1), ratio_max=torch.tensor(1.0))


def test_runner_runs_by_method_and_by_module(tmp_path):
    """`python -m rgpo_lab.mujoco_runner <method>` (the grid's command) and `python -m
    rgpo_lab.mujoco_runner.<method>_continuous_action` both work from the repository root; an unknown method
    is refused with the list."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": ROOT}
    for how in (["rgpo_lab.mujoco_runner", "awr"], ["rgpo_lab.mujoco_runner.awr_continuous_action"]):
        out = subprocess.run(
            [sys.executable, "-m", *how, "--help"], capture_output=True, text=True, timeout=120, env=env
        )
        assert out.returncode == 0 and "--eval-episodes" in out.stdout, out.stderr[-2000:]
    assert "AWR (advantage-weighted regression)" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "rgpo_lab.mujoco_runner", "sac"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2 and "{ppo,rgpo,trpo,awr}" in out.stderr


def test_grid_runner_resumes_interrupted_runs_and_skips_finished_ones(tmp_path, monkeypatch):
    """A run interrupted after its first checkpoint is resumed by mujoco_grid.py and ends with the metrics of
    an uninterrupted mujoco_grid.py run; a second mujoco_grid.py call skips every finished run."""
    import tyro

    flags = ("--num-steps", "256", "--checkpoint-every", "2")
    runs = [grid.GridRun("t", m, "Hopper-v4", 0, 256 * 5, "default", flags) for m in ("ppo", "rgpo")]
    assert (
        grid.run_suites(runs, str(tmp_path / "a"), jobs=2, checkpoints=str(tmp_path / "ca"), poll=0.2) == []
    )

    # interrupt the RGPO run in-process after its first checkpoint, with the runner's own command line
    module = load("rgpo")
    results, ckpts = tmp_path / "b", tmp_path / "cb"
    cmd = runs[1].command(str(results / "t"), str(ckpts / "t" / runs[1].name))
    from rgpo_lab.mujoco_runner import common

    real_save = common.save_checkpoint

    def save_then_stop(path, checkpoint):
        real_save(path, checkpoint)
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "save_checkpoint", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        assert cmd[1:4] == ["-m", "rgpo_lab.mujoco_runner", "rgpo"]
        module.main(tyro.cli(module.Args, args=cmd[4:]))
    assert (ckpts / "t" / runs[1].name / "checkpoint.pt").exists()
    assert len(read_rows(results / "t" / runs[1].name)) == 2

    assert grid.run_suites(runs, str(results), jobs=2, checkpoints=str(ckpts), poll=0.2) == []
    for run in runs:
        rows_a, rows_b = read_rows(tmp_path / "a" / "t" / run.name), read_rows(results / "t" / run.name)
        assert len(rows_a) == len(rows_b) == 5
        for ra, rb in zip(rows_a, rows_b, strict=True):
            assert all(
                ra[k] == rb[k] or (math.isnan(ra[k]) and math.isnan(rb[k]))
                for k in ra.keys() - TIMING_COLUMNS
            )
    final = json.load(open(results / "t" / runs[1].name / "final.json"))
    assert (
        final["resumed_at_iterations"] == [2] and not (ckpts / "t" / runs[1].name / "checkpoint.pt").exists()
    )

    mtimes = {r.name: os.path.getmtime(results / "t" / r.name / "final.json") for r in runs}
    assert grid.run_suites(runs, str(results), jobs=2, checkpoints=str(ckpts), poll=0.2) == []
    assert mtimes == {r.name: os.path.getmtime(results / "t" / r.name / "final.json") for r in runs}


def test_grid_compile_flag_adds_compile_to_every_run_but_not_to_compile_equiv(capsys):
    """`mujoco_grid.py --compile` passes --compile to every script of the named suites (run names unchanged,
    so a run resumes in either mode) and refuses compile_equiv, whose eager side must stay eager."""
    assert grid.main(["smoke", "gates", "--compile", "--list"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert len(lines) == len(grid.SUITES["smoke"]) + len(grid.SUITES["gates"])
    assert all(ln.endswith("--compile") for ln in lines)
    assert any("HalfCheetah-v4__rgpo__clipped_linear__s0__1000k" in ln for ln in lines)
    assert grid.main(["smoke", "--list"]) == 0
    assert "--compile" not in capsys.readouterr().out
    for argv in (["compile_equiv", "--compile"], ["--list", "--compile"]):  # named, or every suite listed
        with pytest.raises(SystemExit):
            grid.main(argv)
        assert "cannot be combined with compile_equiv" in capsys.readouterr().err


@pytest.mark.slow  # a Ray instance takes minutes to start on a loaded 2-core machine
def test_grid_runner_ray_backend_matches_local_runs(tmp_path):
    """The same runs as Ray tasks on a local Ray instance give the metrics of local subprocess runs."""
    ray = pytest.importorskip("ray")
    flags = ("--num-steps", "256")
    runs = [grid.GridRun("t", m, "Hopper-v4", 0, 256 * 3, "default", flags) for m in ("ppo", "rgpo")]
    assert (
        grid.run_suites(runs, str(tmp_path / "local"), jobs=2, checkpoints=str(tmp_path / "c1"), poll=0.2)
        == []
    )
    try:
        assert (
            grid.run_suites(
                runs, str(tmp_path / "ray"), jobs=2, checkpoints=str(tmp_path / "c2"), poll=0.2, backend="ray"
            )
            == []
        )
    finally:
        ray.shutdown()
    for run in runs:
        a, b = read_rows(tmp_path / "local" / "t" / run.name), read_rows(tmp_path / "ray" / "t" / run.name)
        assert len(a) == len(b) == 3
        for ra, rb in zip(a, b, strict=True):
            assert all(
                ra[k] == rb[k] or (math.isnan(ra[k]) and math.isnan(rb[k]))
                for k in ra.keys() - TIMING_COLUMNS
            )


def test_rollout_mean_action_is_actor_mean_bit_for_bit():
    """The rollout's module-free policy path is the same function as the module path, to the last bit, for a
    single observation (the rollout) and a batch, at both widths."""
    import torch

    module = load("ppo")
    for width in (64, 256):
        torch.manual_seed(width)
        agent = module.Agent(11, 3, module.Args(hidden_size=width))
        with torch.no_grad():
            for p in agent.parameters():
                p.normal_()  # away from the orthogonal init's structure
            for x in (torch.randn(11), torch.randn(32, 11)):
                assert torch.equal(agent.mean_action(x), agent.actor_mean(x))


@pytest.mark.parametrize("method", METHODS)
def test_numpy_mean_action_is_actor_mean_and_follows_updates(method):
    """--compile's rollout policy mean (numpy on views of the weights) is actor_mean up to float32 rounding
    against a float64 reference, and sees the weights after an in-place optimiser step and a checkpoint
    reload."""
    import torch

    module = load(method)
    torch.manual_seed(0)
    agent = module.Agent(11, 3, module.Args(hidden_size=64))
    numpy_mean = agent.numpy_mean_action()
    x = torch.randn(11)
    opt = torch.optim.Adam(agent.parameters(), lr=0.1)
    for _ in range(2):
        with torch.no_grad():  # float64 reference on copies of the weights
            h = x.double()
            for i, lin in enumerate(agent.actor_mean[::2]):
                h = torch.nn.functional.linear(h, lin.weight.double(), lin.bias.double())
                h = torch.tanh(h) if i < 2 else h
        got = numpy_mean(x.numpy())
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, h.numpy(), rtol=1e-5, atol=1e-6)
        # an Adam step changes the weights in place: the same numpy function must see them
        opt.zero_grad()
        agent.actor_mean(x).sum().backward()
        opt.step()
    state = {k: v.clone() + 1 for k, v in agent.state_dict().items()}
    agent.load_state_dict(state)  # copies in place: still the same storage
    with torch.no_grad():
        np.testing.assert_allclose(numpy_mean(x.numpy()), agent.actor_mean(x).numpy(), rtol=1e-5, atol=1e-6)


def test_readme_script_commands_parse():
    """Every `python mujoco_baselines/<method>_continuous_action.py ...` (the scripts) and `python -m
    rgpo_lab.mujoco_runner <method> ...` (the runner) line in the READMEs and docs names real flags (tyro
    parses it; a renamed or invented flag fails here, not in a user's terminal)."""
    import importlib
    import shlex

    import tyro

    scripts, runner = [], []
    pages = [
        os.path.relpath(os.path.join(d, f), ROOT)
        for d, _, fs in os.walk(os.path.join(ROOT, "docs"))
        for f in fs
        if f.endswith(".md")
    ]
    for readme in ("README.md", os.path.join("mujoco_baselines", "README.md"), *pages):
        with open(os.path.join(ROOT, readme)) as f:
            for line in f:
                line = line.strip().split(" # ")[0].split("  #")[0]
                if line.startswith("python mujoco_baselines/") and "_continuous_action.py" in line:
                    parts = shlex.split(line)
                    scripts.append((os.path.basename(parts[1]).split("_")[0], parts[2:]))
                elif line.startswith("python -m rgpo_lab.mujoco_runner "):
                    parts = shlex.split(line)
                    runner.append((parts[3], parts[4:]))
    assert len(scripts) >= 10 and len(runner) >= 2
    for method, argv in scripts:
        script = importlib.import_module(f"mujoco_baselines.{method}_continuous_action")
        tyro.cli(script.Args, args=[a for a in argv if a != "--help"])  # SystemExit on an unknown flag
    for method, argv in runner:
        tyro.cli(load(method).Args, args=[a for a in argv if a != "--help"])
