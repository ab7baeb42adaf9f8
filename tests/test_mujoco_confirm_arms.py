"""The component arms of the policy-lag confirmation (issue 46) and the gate statistics taken before an
update's first epoch: PPO with RGPO's KL penalty and backstop (--kl-penalty), RGPO without them, and the
policy_lag_confirm suite that runs them."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from _mujoco_utils import TIME_KEYS, load, read_rows, small_args
from _references import paper_rule

import rgpo_trl

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

NEW_COLUMNS = {"kl_coef", "kl_coef_next", "backstop"}


def _training(rows, drop=()):
    return [{k: v for k, v in r.items() if k not in TIME_KEYS and k not in drop} for r in rows]


def test_ppo_kl_penalty_at_beta_zero_without_backstop_is_ppo_bit_for_bit(tmp_path):
    """--kl-penalty adds beta * KLhat and RGPO's backstop and nothing else: with beta fixed at 0 and the
    backstop off, a lagged decoupled PPO run trains exactly as without the flag (every metric, as floats)."""
    module = load("ppo")
    kw = dict(total_timesteps=256 * 3, policy_lag=2, decoupled=True, eval_episodes=1)
    module.main(small_args(module, tmp_path, "base", **kw))
    module.main(
        small_args(
            module,
            tmp_path,
            "pen",
            kl_penalty=True,
            kl_controller="fixed",
            kl_coef=0.0,
            kl_backstop=0.0,
            **kw,
        )
    )
    base, pen = read_rows(tmp_path / "base"), read_rows(tmp_path / "pen")
    assert _training(base) == _training(pen, drop=NEW_COLUMNS)
    assert all(r["kl_coef"] == 0.0 and r["backstop"] == 0 for r in pen)


def test_ppo_kl_penalty_loss_and_gradient_against_a_float64_closed_form():
    """loss = -mean(w min(r A, clip(r) A)) + beta mean(r - 1 - log r); d loss / d log pi_i =
    (-w_i A_i r_i [clip inactive] + beta (r_i - 1)) / N."""
    module = load("ppo")
    g = torch.Generator().manual_seed(3)
    prox = torch.randn(512, generator=g, dtype=torch.float64) * 0.3
    new = (prox + 0.3 * torch.randn(512, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(512, generator=g, dtype=torch.float64)
    w = torch.rand(512, generator=g, dtype=torch.float64)
    beta, eps = 0.7, 0.2
    loss = module.ppo_policy_loss(new, prox, adv, eps, w, beta)
    r = (new.detach() - prox).exp()
    surrogate = torch.minimum(r * adv, r.clamp(1 - eps, 1 + eps) * adv)
    ref = (-(w * surrogate) + beta * (r - 1 - (new.detach() - prox))).mean()
    torch.testing.assert_close(loss.detach(), ref, rtol=1e-12, atol=0)
    loss.backward()
    unclipped = (r * adv <= r.clamp(1 - eps, 1 + eps) * adv).double()
    expected = (-w * adv * r * unclipped + beta * (r - 1)) / len(r)
    torch.testing.assert_close(new.grad, expected, rtol=1e-10, atol=1e-14)
    # without kl_coef, exactly the clipped surrogate
    assert torch.equal(module.ppo_policy_loss(new, prox, adv, eps, w), (-(w * surrogate)).mean())


def test_ppo_kl_penalty_adapts_beta_by_the_papers_rule_and_the_backstop_stops_the_epochs(tmp_path):
    """Each row's kl_coef_next follows Eq. beta_update from its kl_coef and mean KL; an iteration stopped by
    the backstop ran fewer epochs."""
    module = load("ppo")
    args = small_args(
        module,
        tmp_path,
        "pen",
        total_timesteps=256 * 6,
        policy_lag=2,
        decoupled=True,
        kl_penalty=True,
        kl_backstop=0.004,
        learning_rate=3e-3,
        eval_episodes=1,
    )
    module.main(args)
    rows = read_rows(tmp_path / "pen")
    beta = 0.5
    for r in rows:
        assert r["kl_coef"] == beta
        beta = paper_rule(beta, r["kl"], target=0.02)
        assert r["kl_coef_next"] == pytest.approx(beta, rel=1e-12)
        assert (r["backstop"] == 1) == (r["epochs"] < args.update_epochs)
    assert any(r["backstop"] == 1 for r in rows), "the test needs an iteration the backstop stopped"


def test_ppo_kl_flags_without_kl_penalty_are_refused(tmp_path):
    module = load("ppo")
    with pytest.raises(ValueError, match="kl_coef only take effect with --kl-penalty"):
        module.main(small_args(module, tmp_path, "bad", kl_coef=0.3))
    assert not (tmp_path / "bad").exists()


def test_rgpo_without_kl_penalty_arm_keeps_beta_at_zero_and_runs_every_epoch(tmp_path):
    """The grid's flags for decoupled RGPO without its controller: beta 0 in every iteration, the backstop
    never acts, and the loss is the weighted gated term alone (float64)."""
    from rgpo_lab.mujoco_grid import CONFIRM_ARMS

    (flags,) = [f for m, v, f in CONFIRM_ARMS if v == "lag8_decoupled_nokl"]
    assert flags[flags.index("--kl-coef") + 1] == "0" and flags[flags.index("--kl-backstop") + 1] == "0"
    module = load("rgpo")
    module.main(
        small_args(
            module,
            tmp_path,
            "nokl",
            total_timesteps=256 * 4,
            policy_lag=2,
            decoupled=True,
            kl_controller="fixed",
            kl_coef=0.0,
            kl_backstop=0.0,
            learning_rate=3e-3,
            eval_episodes=1,
        )
    )
    rows = read_rows(tmp_path / "nokl")
    assert all(r["kl_coef"] == 0.0 and r["kl_coef_next"] == 0.0 and r["backstop"] == 0 for r in rows)
    assert all(r["epochs"] == 10 for r in rows)
    g = torch.Generator().manual_seed(5)
    old = torch.randn(256, generator=g, dtype=torch.float64)
    new = old + 0.5 * torch.randn(256, generator=g, dtype=torch.float64)
    adv, w = (
        torch.randn(256, generator=g, dtype=torch.float64),
        torch.rand(256, generator=g, dtype=torch.float64),
    )
    gate = rgpo_trl.make_gate("sigmoid")
    loss = module.rgpo_policy_loss(new, old, adv, gate, 0.0, w)
    ref = -(w * torch.sigmoid(5 * ((new - old).exp() - 1)) * adv).mean()
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=0)


def test_start_of_update_statistics_against_numpy():
    """start_of_update_stats: shares of max(r, 1/r) beyond 1.2 and 2 and the largest r of the learner's
    log-probs at the update's start against the anchor."""
    import numpy as np

    from rgpo_lab.mujoco_runner.common import RatioAnchor, start_of_update_stats

    rng = np.random.default_rng(0)
    anchor_lp, start_lp = rng.normal(size=1000), rng.normal(size=1000)
    anchor = RatioAnchor(torch.tensor(anchor_lp), None, {}, torch.tensor(start_lp))
    s = start_of_update_stats(anchor)
    r = np.exp(start_lp - anchor_lp)
    far = np.maximum(r, 1 / r)
    assert s["start_ratio_beyond_1.2"] == pytest.approx(np.mean(far > 1.2), abs=1e-12)
    assert s["start_ratio_beyond_2"] == pytest.approx(np.mean(far > 2.0), abs=1e-12)
    assert s["start_ratio_max"] == pytest.approx(r.max(), rel=1e-12)
    assert start_of_update_stats(RatioAnchor(torch.tensor(anchor_lp))) == {}


@pytest.mark.parametrize("decoupled", [False, True])
def test_start_statistics_of_a_lagged_run(decoupled, tmp_path):
    """Plain RGPO sees r = pi / pi_behaviour at the start (the same numbers as the behaviour-ratio columns,
    the rejected share that of sigmoid(5 (r - 1)) < 0.1); decoupled RGPO sees r = 1 (nothing beyond, nothing
    rejected, gate 0.5) and reports how many weights were truncated."""
    module = load("rgpo")
    module.main(
        small_args(
            module,
            tmp_path,
            "run",
            total_timesteps=256 * 4,
            policy_lag=2,
            decoupled=decoupled,
            learning_rate=3e-3,
            eval_episodes=1,
        )
    )
    rows = read_rows(tmp_path / "run")
    for r in rows:
        if decoupled:
            assert r["start_ratio_max"] == 1.0 and r["start_ratio_beyond_1.2"] == 0.0
            assert r["start_rejected_frac"] == 0.0 and r["start_gate_mean"] == 0.5
            assert 0.0 <= r["is_weight_truncated_frac"] <= 1.0
        else:
            assert r["start_ratio_beyond_2"] == r["behaviour_ratio_beyond_2"]
            assert r["start_ratio_beyond_1.2"] == r["behaviour_ratio_beyond_1.2"]
            assert r["start_ratio_max"] == pytest.approx(r["behaviour_ratio_max"], rel=1e-6)
            # g(r) < 0.1 <=> r < 1 + logit(0.1) / 5 = 0.5606: at most the share below 1/1.2 of the far ones
            assert r["start_rejected_frac"] <= r["start_ratio_beyond_1.2"]
    assert max(r["start_ratio_beyond_1.2"] for r in rows) > (0 if not decoupled else -1)
    if decoupled:
        assert max(r["is_weight_truncated_frac"] for r in rows) > 0


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
