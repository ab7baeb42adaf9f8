"""--policy-lag and the decoupled objectives of the PPO and RGPO scripts (stale samples). (Resuming a lagged
run was the lab's former copy's, tested up to 6944b5d; the scripts do not resume.)"""

from __future__ import annotations

import pytest
import torch
from _mujoco_utils import SHORT, run_script, script

import rgpo_trl

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

SMALL = [*SHORT, "--num-minibatches", "4", "--hidden-size", "32", "--eval-episodes", "1"]


@pytest.mark.parametrize("method", ["ppo", "rgpo"])
def test_decoupled_objective_at_lag_zero_is_the_base_method_bit_for_bit(method, tmp_path, monkeypatch):
    """At L = 0 the behaviour policy is the proximal one: the truncated weight is exactly 1 and the ratio's
    anchor the same log-probs, so decoupled PPO / RGPO train exactly as PPO / RGPO (every logged value, the
    final parameters); the staleness logged says "fresh"."""
    base, b = run_script(method, SMALL, tmp_path / "base", monkeypatch)
    dec, d = run_script(method, [*SMALL, "--decoupled"], tmp_path / "dec", monkeypatch)
    assert "stale/behaviour_kl" not in base and [v for _, v in dec.pop("stale/behaviour_kl")] == [0.0] * 3
    base.pop("charts/SPS"), dec.pop("charts/SPS")
    assert base == dec
    for name, tensor in b["agent"].state_dict().items():
        assert torch.equal(tensor, d["agent"].state_dict()[name]), name


def test_policy_lag_acts_with_the_actor_of_l_iterations_ago(tmp_path, monkeypatch):
    """The ring: iteration t's rollout acts with the weights the learner had when iteration max(1, t - L)
    began. After 4 iterations at L = 2 the acting actor holds the learner's policy after iteration 1 (a run
    of 1 iteration, same seed, ends with it) and the critic is never lagged; L = 0 acts with the learner."""
    _, one = run_script("rgpo", [*SMALL, "--total-timesteps", "256"], tmp_path / "one", monkeypatch)
    flags = [*SMALL, "--total-timesteps", "1024", "--policy-lag", "2"]
    _, lagged = run_script("rgpo", flags, tmp_path / "lag", monkeypatch)
    actor, agent, after_1 = lagged["actor"], lagged["agent"], one["agent"]
    assert actor is not agent
    for p, q, r in zip(
        actor.policy_parameters(), after_1.policy_parameters(), agent.policy_parameters(), strict=True
    ):
        assert torch.equal(p, q) and not torch.equal(p, r)
    _, fresh = run_script("rgpo", [*SMALL, "--total-timesteps", "256"], tmp_path / "fresh", monkeypatch)
    assert fresh["actor"] is fresh["agent"]


def test_decoupled_ppo_loss_against_a_float64_formula():
    """The truncated weight min(pi_prox / pi_behaviour, max_is_weight) times PPO's clipped surrogate; a weight
    of 1 everywhere is PPO's loss exactly."""
    module = script("ppo")
    args = module.Args(norm_adv=False)
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    agent = module.Agent(5, 2, 16).double()
    obs, actions = torch.randn(256, 5, generator=g).double(), torch.randn(256, 2, generator=g).double()
    prox, beh = (torch.randn(256, generator=g, dtype=torch.float64) * 0.3 for _ in range(2))
    adv, zeros = torch.randn(256, generator=g, dtype=torch.float64), torch.zeros(256, dtype=torch.float64)
    w = (prox - beh).exp().clamp(max=args.max_is_weight)
    _, (new, loss, _) = module.minibatch_loss(agent, obs, actions, adv, prox, zeros, zeros, w, None, args)
    r = (new.detach() - prox).exp()
    ref = -(w * torch.minimum(r * adv, r.clamp(0.8, 1.2) * adv)).mean()
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=0)
    ones = torch.ones_like(prox)
    _, (_, weighted, _) = module.minibatch_loss(
        agent, obs, actions, adv, prox, zeros, zeros, ones, None, args
    )
    _, (_, plain, _) = module.minibatch_loss(agent, obs, actions, adv, prox, zeros, zeros, None, None, args)
    assert torch.equal(weighted, plain)


def test_rgpo_loss_weights_the_gated_term_only():
    """rgpo_loss(weights=w): -mean(w g(r) A) + beta mean(r - 1 - log r), checked against a float64 formula and
    autograd (the weight carries no gradient)."""
    g = torch.Generator().manual_seed(1)
    old = torch.randn(128, generator=g, dtype=torch.float64) * 0.3
    new = (old + 0.2 * torch.randn(128, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(128, generator=g, dtype=torch.float64)
    w = torch.rand(128, generator=g, dtype=torch.float64).requires_grad_(True)
    gate = rgpo_trl.make_gate("sigmoid", k=5.0)
    loss, _ = rgpo_trl.rgpo_loss(new, old, adv, gate, kl_coef=0.5, weights=w, diagnostics=False)
    log_r = new.detach() - old
    ref = (-(w.detach() * gate.g(log_r) * adv) + 0.5 * (log_r.exp() - 1 - log_r)).mean()
    torch.testing.assert_close(loss.detach(), ref, rtol=1e-10, atol=1e-12)
    loss.backward()
    assert w.grad is None  # the weight is a constant of the loss
    # d loss / d log pi_i = -(w_i g'(r_i) r_i A_i - beta (r_i - 1)) / N, by autograd through the library's
    # gate
    lr = log_r.clone().requires_grad_(True)
    (gate.g(lr) * w.detach() * adv).sum().backward()
    expected = (-lr.grad + 0.5 * (log_r.exp() - 1)) / len(new)
    torch.testing.assert_close(new.grad, expected, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--policy-lag", "-1"], "policy_lag must be an integer >= 0"),
        (["--max-is-weight", "0"], "max_is_weight must be > 0"),
    ],
)
@pytest.mark.parametrize("method", ["ppo", "rgpo"])
def test_bad_stale_sample_arguments_are_refused_before_the_run(method, flags, message, tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match=message):
        run_script(method, [*SMALL, *flags], tmp_path, monkeypatch)
    assert not (tmp_path / "runs").exists()
