"""The four scripts' pieces against independent references (float64 closed forms, a plain gymnasium loop,
the paper's rule): defaults, the RGPO loss and KL controller, the backstop and gates, TRPO's step and
Fisher-vector products, the environment and the deterministic evaluation; and the eager-vs-compiled report
(rgpo_lab.benchmarks.compile_equivalence) on known runs. Ported in issue 59 from the tests of the lab's
former copy of the algorithms (tests/test_mujoco_baselines.py and test_mujoco_compiled_update.py up to
6944b5d); what only that copy had (checkpoints, resume, metrics.csv of its own, the periodic evaluation) left
with it."""

from __future__ import annotations

import json
import os
import shlex

import numpy as np
import pytest
import torch
from _mujoco_utils import METHODS, ROOT, SHORT, run_script, script
from _references import paper_rule

import rgpo_trl

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")
tyro = pytest.importorskip("tyro")

SMALL = [*SHORT, "--num-minibatches", "4", "--hidden-size", "32"]


def _values(logged, tag):
    return [v for _, v in logged[tag]]


def test_paper_defaults():
    for method in METHODS:
        a = script(method).Args()
        assert (a.hidden_size, a.learning_rate, a.gamma, a.gae_lambda) == (256, 3e-4, 0.99, 0.95)
        assert (a.num_steps, a.num_steps // a.num_minibatches, a.vclip_coef) == (2048, 64, 0.2)
        assert a.clip_vloss and a.torch_threads == 1 and a.eval_episodes == 10
        assert a.update_epochs == 10
    assert script("ppo").Args().clip_coef == 0.2
    r = script("rgpo").Args()
    ours = (r.gate, r.gate_params, r.kl_controller, r.kl_coef, r.kl_target, r.kl_coef_min, r.kl_coef_max)
    assert ours == ("sigmoid", {}, "adaptive", 0.5, 0.02, 0.01, 5.0)
    assert r.kl_backstop == 0.1 and rgpo_trl.make_gate(r.gate, **r.gate_params).k == 5.0  # the paper's k
    t = script("trpo").Args()
    assert (t.max_kl, t.cg_iters, t.cg_damping) == (0.01, 10, 0.1)
    assert script("awr").Args().awr_beta == 1.0


def test_cli_parses_flags():
    args = tyro.cli(
        script("rgpo").Args,
        args=["--env-id", "Walker2d-v5", "--gate", "temperature", "--gate-params", "temperature", "2"],
    )
    assert (args.env_id, args.gate, args.gate_params) == ("Walker2d-v5", "temperature", {"temperature": 2.0})


def test_rgpo_calls_library_loss_and_adapts_beta(tmp_path, monkeypatch):
    """Every mini-batch's loss is the library's, with the iteration's beta; beta moves by the paper's rule on
    the logged mean KL (a small target makes it move)."""
    calls, real = [], rgpo_trl.rgpo_loss

    def spy(*a, **kw):
        calls.append(kw["kl_coef"])
        return real(*a, **kw)

    monkeypatch.setattr(rgpo_trl, "rgpo_loss", spy)
    logged, _ = run_script(
        "rgpo", [*SMALL, "--total-timesteps", "1024", "--kl-target", "0.002"], tmp_path, monkeypatch
    )
    epochs, betas, kls = (_values(logged, t) for t in ("rgpo/epochs", "rgpo/kl_coef", "losses/approx_kl"))
    assert len(calls) == sum(epochs) * 4 > 0
    assert betas[0] == 0.5 and len(set(betas)) > 1
    for beta, kl, beta_next in zip(betas, kls, betas[1:], strict=False):
        assert beta_next == paper_rule(beta, kl, target=0.002)
    assert calls[0] == 0.5 and set(calls) == set(betas)


def test_rgpo_backstop_leaves_epoch_loop(tmp_path, monkeypatch):
    logged, _ = run_script("rgpo", [*SMALL, "--kl-backstop", "1e-9"], tmp_path, monkeypatch)
    assert _values(logged, "rgpo/epochs") == [1.0] * 3


@pytest.mark.parametrize("gate,env_id", [("clipped_linear", "Hopper-v4"), ("temperature", "Hopper-v5")])
def test_rgpo_gate_ablations(gate, env_id, tmp_path, monkeypatch):
    """The other gates run, and v5 ids as well as the paper's v4."""
    flags = [*SMALL, "--total-timesteps", "256", "--gate", gate, "--env-id", env_id]
    logged, out = run_script("rgpo", flags, tmp_path, monkeypatch)
    (ess,) = _values(logged, "rgpo/ess")
    assert 0 < ess <= 1 and out["args"].gate == gate


def test_nan_loss_stops_with_the_iteration(tmp_path, monkeypatch):
    real, count = rgpo_trl.rgpo_loss, [0]

    def poisoned(*a, **kw):
        loss, stats = real(*a, **kw)
        count[0] += 1
        return (loss * torch.nan if count[0] == 7 else loss), stats

    monkeypatch.setattr(rgpo_trl, "rgpo_loss", poisoned)
    with pytest.raises(SystemExit, match="error: non-finite loss at iteration 1, epoch 1: stopping"):
        run_script("rgpo", SMALL, tmp_path, monkeypatch)


def test_trpo_step_respects_kl_bound(tmp_path, monkeypatch):
    logged, _ = run_script("trpo", SMALL, tmp_path, monkeypatch)
    assert all(kl <= 0.01 for kl in _values(logged, "trpo/kl"))
    assert any(frac > 0 for frac in _values(logged, "trpo/step_frac"))
    # directly: a large advantage signal, the accepted step's closed-form KL is <= delta, with the default
    # Fisher-vector products and --compile's
    module = script("trpo")
    torch.manual_seed(0)
    agent = module.Agent(5, 2, 32)
    obs, actions = torch.randn(512, 5), torch.randn(512, 2)
    with torch.no_grad():
        old_mean, old_logstd = agent.actor_mean(obs), agent.actor_logstd.clone()
        oldlogprob = agent.log_prob(old_mean, actions)
    adv = torch.randn(512) * 10
    start = {k: v.clone() for k, v in agent.state_dict().items()}
    for compile in (False, True):
        agent.load_state_dict(start)
        args = module.Args(max_kl=0.005, compile=compile)
        _, kl, frac, _, logp = module.trpo_step(agent, obs, actions, oldlogprob, adv, args)
        with torch.no_grad():
            mean = agent.actor_mean(obs)
            kl_now = float(module.gaussian_kl(old_mean, old_logstd, mean, agent.actor_logstd).mean())
            assert torch.equal(logp, agent.log_prob(mean, actions))  # log-probs of the resulting policy
        assert frac > 0 and kl_now <= 0.005 and abs(kl_now - kl) < 1e-6


def test_trpo_fisher_vector_product_is_the_closed_form_fisher():
    """At pi = pi_old the Hessian of the mean Gaussian KL is the Fisher information: J^T diag(exp(-2 logstd))
    J / N for the mean network's parameters (J its Jacobian over the N states), 2 I for log-std, no cross
    terms. Both products (the KL's Hessian by autograd, and --compile's hand-written J v / J^T u) in float64
    against that closed form built from autograd's full Jacobian, and conjugate gradient against a direct
    solve."""
    module = script("trpo")
    torch.manual_seed(0)
    agent = module.Agent(4, 2, 8).double()
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([-0.3, 0.4], dtype=torch.float64))
        agent.actor_mean[-1].weight.mul_(50)  # away from the near-zero initial output layer
    obs = torch.randn(16, 4, dtype=torch.float64)
    params = agent.policy_parameters()
    with torch.no_grad():
        old_mean, old_logstd = agent.actor_mean(obs), agent.actor_logstd.clone()
    kl = module.gaussian_kl(old_mean, old_logstd, agent.actor_mean(obs), agent.actor_logstd).mean()
    damping = 0.1
    fvp = module.fisher_vector_product(kl, params, damping)
    closed_form = module.gauss_newton_fvp(agent, obs, params, damping)  # --compile's products
    mean_params = params[:-1]
    n_mean = sum(p.numel() for p in mean_params)
    names = [n for n, _ in agent.actor_mean.named_parameters()]
    jac = torch.autograd.functional.jacobian(
        lambda *ps: torch.func.functional_call(agent.actor_mean, dict(zip(names, ps, strict=True)), (obs,)),
        tuple(p.detach() for p in mean_params),
    )
    J = torch.cat([j.reshape(obs.shape[0] * 2, -1) for j in jac], dim=1)  # (N * act_dim, n_mean)
    m = torch.exp(-2 * agent.actor_logstd.detach()).repeat(obs.shape[0]) / obs.shape[0]
    fisher = torch.block_diag(J.T @ (m[:, None] * J), 2 * torch.eye(2, dtype=torch.float64))
    for seed in range(3):
        v = torch.randn(n_mean + 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        torch.testing.assert_close(fvp(v), fisher @ v + damping * v, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(closed_form(v), fisher @ v + damping * v, rtol=1e-10, atol=1e-12)
    b = torch.randn(n_mean + 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    A = fisher + damping * torch.eye(n_mean + 2, dtype=torch.float64)
    x = module.conjugate_gradient(lambda v: A @ v, b, iters=4 * (n_mean + 2), tol=1e-30)
    torch.testing.assert_close(x, torch.linalg.solve(A, b), rtol=1e-6, atol=1e-8)


def test_env_resets_explicitly_without_fake_transitions():
    """Single env with explicit resets: every step is a real transition, episode returns are raw, the
    learner sees scaled rewards, and after an episode ends the simulator is at a fresh reset."""
    env = script("ppo").NormalizedEnv("InvertedPendulum-v4", 0.99)
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    steps_since_done, episodes, scaled = 0, [], []
    for _ in range(400):
        _, reward, done, episode = env.step(rng.uniform(-3, 3, size=env.act_dim))
        steps_since_done += 1
        scaled.append(reward)
        assert done == (episode is not None)
        if done:
            # InvertedPendulum pays a raw reward of 1 per step: raw return == length, every step counted
            assert episode[0] == episode[1] == steps_since_done
            data = env.env.unwrapped.data  # reset noise is +-0.01
            assert np.abs(data.qpos).max() <= 0.011 and np.abs(data.qvel).max() <= 0.011
            episodes.append(episode)
            steps_since_done = 0
    env.close()
    assert len(episodes) >= 5
    assert not np.allclose(scaled, 1.0)


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_evaluation_is_the_mean_action_and_leaves_training_unchanged(
    method, tmp_path, monkeypatch
):
    """The logged evaluation returns are a plain gymnasium loop's: the final policy mean on an environment
    seeded with seed + 10000, observations normalised with the training statistics frozen; evaluating changes
    no training value (it draws from no global random stream)."""
    import gymnasium as gym

    plain, _ = run_script(method, [*SMALL, "--eval-episodes", "0"], tmp_path / "a", monkeypatch)
    evaluated, out = run_script(method, SMALL, tmp_path / "b", monkeypatch)
    returns = [ret for _, ret in evaluated.pop("eval/episodic_return")]
    plain.pop("charts/SPS"), evaluated.pop("charts/SPS")
    assert plain == evaluated
    env, agent = out["env"], out["agent"]
    mean, std = env.obs_rms.mean, np.sqrt(env.obs_rms.var + 1e-8)
    eval_env, expected = gym.make("Hopper-v4"), []
    obs, _ = eval_env.reset(seed=1 + 10000)
    for _ in range(2):
        total, done = 0.0, False
        while not done:
            x = torch.as_tensor(np.clip((obs - mean) / std, -10, 10), dtype=torch.float32)
            action = agent.actor_mean(x).detach().numpy()
            obs, r, term, trunc, _ = eval_env.step(np.clip(action, env.low, env.high))
            total, done = total + float(r), term or trunc
        expected.append(total)
        obs, _ = eval_env.reset()
    assert returns == expected and returns[0] != returns[1]


def test_readme_script_commands_parse():
    """Every `python mujoco_baselines/<method>_continuous_action.py ...` line in the READMEs and docs names
    real flags (tyro parses it; a renamed or invented flag fails here, not in a user's terminal)."""
    commands = []
    pages = [
        os.path.relpath(os.path.join(d, f), ROOT)
        for d, _, fs in os.walk(os.path.join(ROOT, "docs"))
        for f in fs
        if f.endswith(".md")
    ]
    for readme in ("README.md", os.path.join("mujoco_baselines", "README.md"), *pages):
        with open(os.path.join(ROOT, readme)) as f:
            text = f.read().replace("\\\n", " ")  # a command continued with a backslash is one line
        for line in text.splitlines():
            line = line.strip().split(" # ")[0].split("  #")[0]
            if line.startswith("python mujoco_baselines/") and "_continuous_action.py" in line:
                parts = shlex.split(line)
                commands.append((os.path.basename(parts[1]).split("_")[0], parts[2:]))
    assert len(commands) >= 10
    for method, argv in commands:
        tyro.cli(
            script(method).Args, args=[a for a in argv if a != "--help"]
        )  # SystemExit on an unknown flag


def _fake_run(root, name, final_return, kls, sps=1000.0):
    d = root / "compile_equiv" / name
    d.mkdir(parents=True)
    (d / "final.json").write_text(json.dumps({"final_return": final_return, "SPS": sps}))
    (d / "config.json").write_text(
        json.dumps({"git_commit": ("c0mp11e" if "compile" in name else "eag3r00") + "x" * 33})
    )
    with open(d / "metrics.csv", "w") as f:
        f.write("iteration,kl,kl_final,spike\n")
        for i, kl in enumerate(kls):
            f.write(f"{i + 1},{kl},{kl / 2},{int(kl > 0.04)}\n")


def test_compile_equivalence_report_on_known_runs(tmp_path):
    """Known runs in, known verdicts out: a compiled side equal to the eager side agrees (p = 1); one shifted
    by many seed stds does not; the means, Welch p (against scipy) and unfinished runs are as constructed."""
    from scipy import stats

    from rgpo_lab.benchmarks import compile_equivalence as ce

    eager = [100.0, 110.0, 120.0]
    for s, ret in enumerate(eager):
        for variant in ("eager", "compile"):
            _fake_run(tmp_path, f"Hopper-v4__ppo__{variant}__s{s}__300k", ret, [0.01, 0.03])
        _fake_run(tmp_path, f"Hopper-v4__rgpo__eager__s{s}__300k", ret, [0.02, 0.02])
        _fake_run(tmp_path, f"Hopper-v4__rgpo__compile__s{s}__300k", ret + 500.0, [0.02, 0.02])
    r = ce.analyse(str(tmp_path))
    rows = {(x["method"], x["env"]): x for x in r["rows"]}
    same, shifted = rows[("ppo", "Hopper-v4")], rows[("rgpo", "Hopper-v4")]
    assert same["agrees"] is True and same["final_return"]["p"] == pytest.approx(1.0)
    assert same["kl"]["eager"] == [pytest.approx(0.02)] * 3 and same["spike"]["eager"] == [0.0] * 3
    assert shifted["agrees"] is False
    assert shifted["final_return"]["std_diff"] == pytest.approx(50.0)  # 500 / stdev(100, 110, 120) = 500 / 10
    expected_p = stats.ttest_ind(eager, [x + 500.0 for x in eager], equal_var=False).pvalue
    assert shifted["final_return"]["p"] == pytest.approx(expected_p)
    assert "agrees" not in rows[("trpo", "Hopper-v4")]  # nothing ran
    assert "HalfCheetah-v4__awr__compile__s2__300k" in r["missing"] and len(r["missing"]) == 48 - 12
    assert r["commits"] == {"eager": ["eag3r00"], "compile": ["c0mp11e"]}  # which code made each side
    md = ce.markdown(r, "cmd")
    assert (
        "| rgpo | Hopper-v4 | 3 / 3 | **no** |" in md
        and "| trpo | Hopper-v4 | 0 / 0 | not enough runs |" in md
    )
