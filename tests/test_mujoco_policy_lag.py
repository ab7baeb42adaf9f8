"""--policy-lag and the decoupled objectives of the PPO and RGPO scripts (stale samples)."""

from __future__ import annotations

import pytest
import torch
from _mujoco_utils import TIME_KEYS, load, read_rows, small_args

import rgpo_trl

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

STALE_KEYS = [
    "behaviour_ratio_mean",
    "behaviour_ratio_max",
    "behaviour_ratio_beyond_1.2",
    "behaviour_ratio_beyond_2",
    "behaviour_kl",
    "is_weight_truncated_frac",
    "start_ratio_beyond_1.2",
    "start_ratio_beyond_2",
    "start_ratio_max",
    "start_rejected_frac",
    "start_gate_mean",
    "start_clipfrac",
]


def _training_columns(rows):
    return [{k: v for k, v in r.items() if k not in TIME_KEYS and k not in STALE_KEYS} for r in rows]


@pytest.mark.parametrize("method", ["ppo", "rgpo"])
def test_decoupled_objective_at_lag_zero_is_the_base_method_bit_for_bit(method, tmp_path):
    """At L = 0 the behaviour policy is the proximal one: the truncated weight is exactly 1 and the ratio's
    anchor the same log-probs, so decoupled PPO / RGPO train exactly as PPO / RGPO (every metric, as
    floats)."""
    module = load(method)
    kw = dict(total_timesteps=256 * 3, eval_episodes=1)
    base = module.main(small_args(module, tmp_path, "base", **kw))
    decoupled = module.main(small_args(module, tmp_path, "decoupled", decoupled=True, **kw))
    rows_base, rows_dec = read_rows(tmp_path / "base"), read_rows(tmp_path / "decoupled")
    assert _training_columns(rows_base) == _training_columns(rows_dec)
    assert base["eval_episodes"] == decoupled["eval_episodes"]
    # the staleness columns are logged, and say "fresh"
    assert "behaviour_ratio_mean" not in rows_base[0]
    for row in rows_dec:
        assert row["behaviour_ratio_mean"] == 1.0 and row["behaviour_ratio_max"] == 1.0
        assert row["behaviour_ratio_beyond_1.2"] == 0.0 and row["behaviour_kl"] == 0.0


def test_policy_lag_acts_with_the_actor_of_l_iterations_ago():
    """The ring: before iteration t's rollout the acting actor holds the weights the agent had when iteration
    max(1, t - L) began; the agent itself is never touched, and L = 0 acts with the agent itself."""
    from rgpo_lab.mujoco_runner.common import Agent, PolicyLag

    class A:
        hidden_size, ortho_init, init_logstd = 8, True, 0.0

    torch.manual_seed(0)
    agent = Agent(3, 2, A())
    assert PolicyLag(agent, 0).actor is agent
    lag = PolicyLag(agent, 2)
    assert lag.actor is not agent
    seen = []  # the agent's actor weights when each iteration began
    for _ in range(6):
        seen.append([p.detach().clone() for p in agent.policy_parameters()])
        lag.advance()
        t = len(seen)
        expected = seen[max(1, t - 2) - 1]
        for p, q in zip(lag.actor.policy_parameters(), expected, strict=True):
            assert torch.equal(p, q)
        with torch.no_grad():  # the learner's update of this iteration
            for p in agent.policy_parameters():
                p.add_(torch.randn_like(p))
    # the critic is not lagged: it is never read from the copy, and the agent's own is untouched by advance()
    with pytest.raises(ValueError, match="policy_lag must be >= 0"):
        PolicyLag(agent, -1)


def test_rollout_behaviour_log_probs_are_the_lagged_actors(tmp_path):
    """With L > 0 the rollout's actions and log-probs come from the lagged actor, its values from the current
    critic: the log-probs equal a float64 Gaussian density under the lagged weights."""
    module = load("ppo")
    from rgpo_lab.mujoco_runner.common import Agent, MujocoEnv, PolicyLag, Rollout, seed_everything

    args = small_args(module, tmp_path, num_steps=64)
    seed_everything(args)
    env = MujocoEnv(args)
    agent = Agent(env.obs_dim, env.act_dim, args)
    lag = PolicyLag(agent, 1)
    rollout = Rollout(args, env, agent, actor=lag.actor)
    lag.advance()
    with torch.no_grad():  # the learner moves on; the actor stays at the weights of before
        for p in agent.parameters():
            p.add_(0.1 * torch.randn_like(p))
        agent.actor_logstd.fill_(-0.5)
    values, _, logprobs = rollout.collect()
    actor = lag.actor.double()
    mean = actor.actor_mean(rollout.obs.double())
    std = actor.actor_logstd.exp()
    ref = torch.distributions.Normal(mean, std).log_prob(rollout.actions.double()).sum(-1)
    torch.testing.assert_close(logprobs.double(), ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(values, agent.critic(rollout.obs).squeeze(-1).detach())
    assert not torch.allclose(agent.log_prob(agent.actor_mean(rollout.obs), rollout.actions), logprobs)
    env.close()


def test_decoupled_ppo_loss_against_a_float64_formula():
    module = load("ppo")
    g = torch.Generator().manual_seed(0)
    new, prox, beh = (torch.randn(256, generator=g, dtype=torch.float64) * 0.3 for _ in range(3))
    adv = torch.randn(256, generator=g, dtype=torch.float64)
    from rgpo_lab.mujoco_runner.common import truncated_weight

    w = truncated_weight(prox, beh, 1.0)
    assert torch.equal(w, torch.minimum((prox - beh).exp(), torch.tensor(1.0, dtype=torch.float64)))
    r = (new - prox).exp()
    ref = -(w * torch.minimum(r * adv, r.clamp(0.8, 1.2) * adv)).mean()
    torch.testing.assert_close(module.ppo_policy_loss(new, prox, adv, 0.2, w), ref, rtol=1e-12, atol=0)
    # weight 1 everywhere is PPO's loss exactly
    ones = torch.ones_like(new)
    assert torch.equal(
        module.ppo_policy_loss(new, prox, adv, 0.2, ones), module.ppo_policy_loss(new, prox, adv, 0.2)
    )


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


@pytest.mark.parametrize("method", ["ppo", "rgpo"])
def test_lagged_run_resumes_to_the_same_metrics(method, tmp_path, monkeypatch):
    """The ring of actors is in the checkpoint: an interrupted lagged, decoupled run resumes exactly."""
    module = load(method)
    kw = dict(total_timesteps=256 * 5, checkpoint_every=2, policy_lag=2, decoupled=True, eval_episodes=1)
    reference = module.main(small_args(module, tmp_path / "a", "run", **kw))
    from rgpo_lab.mujoco_runner import common

    real_save, calls = common.save_checkpoint, []

    def interrupt_on_second_save(path, checkpoint):
        calls.append(checkpoint["progress"]["iteration"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_save(path, checkpoint)

    monkeypatch.setattr(common, "save_checkpoint", interrupt_on_second_save)
    with pytest.raises(KeyboardInterrupt):
        module.main(small_args(module, tmp_path / "b", "run", **kw))
    monkeypatch.setattr(common, "save_checkpoint", real_save)
    resumed = module.main(small_args(module, tmp_path / "b", "run", resume=True, **kw))
    rows_a, rows_b = read_rows(tmp_path / "a" / "run"), read_rows(tmp_path / "b" / "run")
    assert [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows_a] == [
        {k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows_b
    ]
    assert resumed["eval_episodes"] == reference["eval_episodes"]
    # the behaviour ratio left 1 once the actor fell behind
    assert rows_a[0]["behaviour_ratio_max"] == 1.0 and max(r["behaviour_ratio_max"] for r in rows_a) > 1.0


@pytest.mark.parametrize(
    "field,value,message",
    [("policy_lag", -1, "policy_lag must be"), ("max_is_weight", 0.0, "max_is_weight must be")],
)
def test_bad_stale_sample_arguments_are_refused_before_the_run(field, value, message, tmp_path):
    module = load("rgpo")
    with pytest.raises(ValueError, match=message):
        module.main(small_args(module, tmp_path, "bad", **{field: value}))
    assert not (tmp_path / "bad").exists()


def test_checkpoint_of_before_a_new_field_resumes_while_the_field_keeps_its_default(tmp_path):
    """A checkpoint written before --policy-lag existed continues at L = 0 and is refused at L = 2."""
    module = load("ppo")
    from rgpo_lab.mujoco_runner import common

    args = small_args(module, tmp_path, "run")
    path = str(tmp_path / "ck.pt")
    saved = common.checkpoint_args(args)
    for new_field in ("policy_lag", "decoupled", "max_is_weight"):
        del saved[new_field]
    torch.save({"args": saved, "progress": {}, "rng": {}, "next_obs": torch.zeros(1)}, path)
    common.load_checkpoint(path, args)
    with pytest.raises(common.CheckpointError, match="policy_lag: None -> 2"):
        common.load_checkpoint(path, small_args(module, tmp_path, "run", policy_lag=2))
