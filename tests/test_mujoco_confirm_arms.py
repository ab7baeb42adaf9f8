"""The component arms of the policy-lag confirmation (issue 46), in the scripts: PPO with RGPO's KL penalty
and backstop (--kl-penalty), RGPO without them, and the policy_lag_confirm suite that runs them. (The
statistics at an update's start, which the lab's former copy logged for the committed runs, are not the
scripts'; their tests ended with that copy at 6944b5d.)"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from _mujoco_utils import SHORT, run_script, script
from _references import paper_rule

import rgpo_trl

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

SMALL = [*SHORT, "--num-minibatches", "4", "--hidden-size", "32", "--eval-episodes", "1"]
LAG2 = ["--policy-lag", "2", "--decoupled"]


def _training(scalars, drop=()):
    return {tag: v for tag, v in scalars.items() if tag != "charts/SPS" and tag not in drop}


def test_ppo_kl_penalty_at_beta_zero_without_backstop_is_ppo_bit_for_bit(tmp_path, monkeypatch):
    """--kl-penalty adds beta * KLhat and RGPO's backstop and nothing else: with beta fixed at 0 and the
    backstop off, a lagged decoupled PPO run trains exactly as without the flag (every logged value, the
    final parameters)."""
    base, b = run_script("ppo", [*SMALL, *LAG2], tmp_path / "base", monkeypatch)
    pen_flags = ["--kl-penalty", "--kl-controller", "fixed", "--kl-coef", "0", "--kl-backstop", "0"]
    pen, p = run_script("ppo", [*SMALL, *LAG2, *pen_flags], tmp_path / "pen", monkeypatch)
    assert _training(base) == _training(pen, drop=("ppo/kl_coef",))
    assert [beta for _, beta in pen["ppo/kl_coef"]] == [0.0] * 3
    for name, tensor in b["agent"].state_dict().items():
        assert torch.equal(tensor, p["agent"].state_dict()[name]), name


def _float64_batch(seed, n=512):
    """A float64 agent of the scripts' shape and a batch whose ratio to the anchor is spread out."""
    module = script("ppo")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    agent = module.Agent(5, 2, 16).double()
    obs = torch.randn(n, 5, generator=g, dtype=torch.float64)
    actions = torch.randn(n, 2, generator=g, dtype=torch.float64)
    with torch.no_grad():
        anchor = agent.log_prob(agent.actor_mean(obs), actions) + 0.3 * torch.randn(n, generator=g).double()
    adv, returns = torch.randn(n, generator=g, dtype=torch.float64), torch.randn(n, generator=g).double()
    w = torch.rand(n, generator=g, dtype=torch.float64)
    return agent, (obs, actions, adv, anchor, returns, torch.zeros(n, dtype=torch.float64)), w


def test_ppo_kl_penalty_loss_and_gradient_against_a_float64_closed_form():
    """The script's policy loss -mean(w min(r A, clip(r) A)) + beta mean(r - 1 - log r), and its gradient
    d loss / d log pi_i = (-w_i A_i r_i [clip inactive] + beta (r_i - 1)) / N."""
    module = script("ppo")
    args = module.Args(norm_adv=False)
    agent, batch, w = _float64_batch(3)
    adv, anchor = batch[2], batch[3]
    beta, eps = 0.7, args.clip_coef
    _, (new, loss, _) = module.minibatch_loss(agent, *batch, w, beta, args)
    log_r = new.detach() - anchor
    r = log_r.exp()
    surrogate = torch.minimum(r * adv, r.clamp(1 - eps, 1 + eps) * adv)
    torch.testing.assert_close(
        loss.detach(), (-(w * surrogate) + beta * (r - 1 - log_r)).mean(), rtol=1e-12, atol=0
    )
    (grad,) = torch.autograd.grad(loss, new)
    unclipped = (r * adv <= r.clamp(1 - eps, 1 + eps) * adv).double()
    torch.testing.assert_close(
        grad, (-w * adv * r * unclipped + beta * (r - 1)) / len(r), rtol=1e-10, atol=1e-14
    )
    _, (_, plain, _) = module.minibatch_loss(
        agent, *batch, w, None, args
    )  # without beta: the surrogate alone
    torch.testing.assert_close(plain.detach(), (-(w * surrogate)).mean(), rtol=1e-12, atol=0)


def test_ppo_kl_penalty_adapts_beta_by_the_papers_rule_and_the_backstop_stops_the_epochs(
    tmp_path, monkeypatch
):
    """Each iteration's beta follows Eq. beta_update from the one before and its mean KL; an iteration that
    ran fewer epochs was stopped by the backstop (its mean KL above it)."""
    flags = [*SMALL, *LAG2, "--total-timesteps", "1536", "--kl-penalty", "--kl-backstop", "0.004"]
    logged, _ = run_script("ppo", [*flags, "--learning-rate", "3e-3"], tmp_path, monkeypatch)
    betas, kls = [v for _, v in logged["ppo/kl_coef"]], [v for _, v in logged["losses/approx_kl"]]
    assert betas[0] == 0.5 and len(betas) == 6
    for beta, kl, beta_next in zip(betas, kls, betas[1:], strict=False):
        assert beta_next == pytest.approx(paper_rule(beta, kl, target=0.02), rel=1e-12)
    epochs = [int(v) for _, v in logged["ppo/epochs"]]
    assert any(e < 10 for e in epochs), "the test needs an iteration the backstop stopped"
    assert all(kl > 0.004 for kl, e in zip(kls, epochs, strict=True) if e < 10)


def test_ppo_kl_flags_without_kl_penalty_are_refused(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="kl_coef only take effect with --kl-penalty"):
        run_script("ppo", [*SMALL, "--kl-coef", "0.3"], tmp_path, monkeypatch)
    assert not (tmp_path / "runs").exists()


def test_rgpo_without_kl_penalty_arm_keeps_beta_at_zero_and_runs_every_epoch(tmp_path, monkeypatch):
    """The grid's flags for decoupled RGPO without its controller: beta 0 in every iteration, the backstop
    never acts, and the loss is the weighted gated term alone (float64)."""
    from rgpo_lab.mujoco_grid import CONFIRM_ARMS

    (flags,) = [f for m, v, f in CONFIRM_ARMS if v == "lag8_decoupled_nokl"]
    assert flags[flags.index("--kl-coef") + 1] == "0" and flags[flags.index("--kl-backstop") + 1] == "0"
    flags = [*SMALL, *LAG2, *flags[3:], "--learning-rate", "3e-3"]  # L = 2 for L = 8
    logged, _ = run_script("rgpo", flags, tmp_path, monkeypatch)
    assert [v for _, v in logged["rgpo/kl_coef"]] == [0.0] * 3
    assert [v for _, v in logged["rgpo/epochs"]] == [10.0] * 3
    module = script("rgpo")
    agent, batch, w = _float64_batch(5)
    _, (new, loss, _) = module.minibatch_loss(
        agent, *batch, w, 0.0, rgpo_trl.make_gate("sigmoid"), module.Args(norm_adv=False)
    )
    r = (new.detach() - batch[3]).exp()
    torch.testing.assert_close(loss, -(w * torch.sigmoid(5 * (r - 1)) * batch[2]).mean(), rtol=1e-12, atol=0)


def test_policy_lag_confirm_suite_is_the_design_and_reuses_only_finished_runs_of_the_same_path():
    """140 new runs, every cell at seeds 0-9; a reused run is finished in its suite's folder with the same
    script, policy lag, decoupling and --compile as the arm it stands for."""
    from rgpo_lab.mujoco_grid import CONFIRM_ARMS, CONFIRM_ENVS, ROOT, SUITES

    runs = SUITES["policy_lag_confirm"]
    new = [r for r in runs if r.suite == "policy_lag_confirm"]
    assert len(new) == 140 and len({r.name for r in new}) == 140
    cells = {}
    for r in runs:
        cells.setdefault((r.env_id, r.method, r.variant), set()).add(r.seed)
    for env in CONFIRM_ENVS:
        for method, variant, _ in CONFIRM_ARMS:
            assert cells[(env, method, variant)] == set(range(10))
        for method in ("ppo", "rgpo"):
            assert cells[(env, method, "default")] == set(range(10))
            assert cells[(env, method, "lag8")] == set(range(5))
    for r in runs:
        if r.suite == "policy_lag_confirm":
            continue
        d = os.path.join(ROOT, "results", "mujoco", r.suite, r.name)
        assert os.path.exists(os.path.join(d, "final.json")), d
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        assert cfg["exp_name"] == f"{r.method}_continuous_action" and cfg["compile"] is True
        assert (
            cfg["policy_lag"] == (8 if "lag8" in r.variant else 0)
            if "policy_lag" in cfg
            else r.variant == "default"
        )
        assert cfg.get("decoupled", False) == ("decoupled" in r.variant)
        assert cfg["eval_episodes"] == 10 and cfg["seed"] == r.seed and cfg["env_id"] == r.env_id
    assert math.isclose(sum(r.suite != "policy_lag_confirm" for r in runs), 70)
