"""Gates: values and closed-form weights against independent float64 references and autograd."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy.optimize import brentq

from rgpo_trl import LOG_RATIO_CLAMP, clamp_log_ratio, make_gate

ALL_GATES = [
    ("sigmoid", {}),
    ("sigmoid", {"k": 1.5}),
    ("sigmoid", {"k": 20.0}),
    ("clipped_linear", {}),
    ("clipped_linear", {"c": 0.8}),
    ("temperature", {}),
    ("temperature", {"temperature": 3.0}),
    ("is", {}),
    ("ppo_clip", {}),
    ("ppo_clip", {"eps": 0.5}),
]


def _log_uniform_ratios(n=4000, lo=1e-3, hi=1e3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))


def _reference_g(name, params, r: np.ndarray) -> np.ndarray:
    """Independent numpy float64 formulas of each gate, written from the paper."""
    if name == "sigmoid":
        k = params.get("k", 5.0)
        return 1.0 / (1.0 + np.exp(-k * (r - 1.0)))
    if name == "clipped_linear":
        return np.clip(r, 0.0, params.get("c", 2.0))
    if name == "temperature":
        b = params.get("temperature", 1.0)
        return r**b / (1.0 + r**b)
    if name == "is":
        return r
    if name == "ppo_clip":
        eps = params.get("eps", 0.2)
        return np.clip(r, 1 - eps, 1 + eps)
    raise AssertionError(name)


@pytest.mark.parametrize("name,params", ALL_GATES)
def test_gate_value_matches_reference_formula(name, params):
    gate = make_gate(name, **params)
    r = _log_uniform_ratios()
    np.testing.assert_allclose(
        gate.g(torch.log(r)).numpy(), _reference_g(name, params, r.numpy()), rtol=1e-12, atol=1e-15
    )


@pytest.mark.parametrize("name,params", ALL_GATES)
def test_closed_form_weight_equals_autograd_derivative_times_r(name, params):
    """w(r) = g'(r) r, with g'(r) from autograd on g(r) (float64, r log-uniform in [1e-3, 1e3])."""
    gate = make_gate(name, **params)
    r = _log_uniform_ratios().requires_grad_(True)
    (dg_dr,) = torch.autograd.grad(gate.g(torch.log(r)).sum(), r)
    expected = (dg_dr * r).detach()
    np.testing.assert_allclose(
        gate.w(torch.log(r.detach())).numpy(), expected.numpy(), rtol=1e-10, atol=1e-14
    )


@pytest.mark.parametrize("name,params", ALL_GATES)
def test_weight_is_derivative_with_respect_to_log_ratio(name, params):
    """d g(exp(l)) / d l = g'(r) r = w: the identity the policy gradient relies on."""
    gate = make_gate(name, **params)
    log_r = torch.log(_log_uniform_ratios(seed=1)).requires_grad_(True)
    (dg_dl,) = torch.autograd.grad(gate.g(log_r).sum(), log_r)
    torch.testing.assert_close(gate.w(log_r.detach()), dg_dl, rtol=1e-10, atol=1e-14)


def test_known_weights_of_the_correspondences():
    r = _log_uniform_ratios(seed=2)
    torch.testing.assert_close(make_gate("is").w(torch.log(r)), r)
    eps = 0.2
    inside = (r > 1 - eps) & (r < 1 + eps)
    torch.testing.assert_close(make_gate("ppo_clip", eps=eps).w(torch.log(r)), torch.where(inside, r, 0 * r))
    c = 2.0
    torch.testing.assert_close(make_gate("clipped_linear", c=c).w(torch.log(r)), torch.where(r < c, r, 0 * r))
    # temperature: w = b g (1 - g) (paper, Ablation A)
    b = 1.7
    g = make_gate("temperature", temperature=b).g(torch.log(r))
    torch.testing.assert_close(make_gate("temperature", temperature=b).w(torch.log(r)), b * g * (1 - g))


@pytest.mark.parametrize("k", [1.0, 5.0, 20.0])
def test_sigmoid_gate_at_one_and_its_weight_bound(k):
    gate = make_gate("sigmoid", k=k)
    one = torch.ones(1, dtype=torch.float64)
    assert gate.g(torch.log(one)).item() == pytest.approx(0.5)
    assert gate.w(torch.log(one)).item() == pytest.approx(k / 4)  # g'(1) = k/4
    # max of w(r) = k s (1-s) r: stationary point solves 1 + k r (1 - 2 s) = 0 (s = sigmoid(k(r-1))).
    stationarity = lambda r: 1.0 + k * r * (1.0 - 2.0 / (1.0 + math.exp(-k * (r - 1.0))))  # noqa: E731
    r_star = brentq(stationarity, 1.0, 1.0 + 50.0 / k)
    s = 1.0 / (1.0 + math.exp(-k * (r_star - 1.0)))
    analytic_max = k * s * (1 - s) * r_star
    grid = torch.linspace(1e-6, 50.0, 2_000_001, dtype=torch.float64)
    grid_max = gate.w(torch.log(grid)).max().item()
    assert grid_max == pytest.approx(analytic_max, rel=1e-8)
    assert grid_max <= analytic_max * (1 + 1e-12)


@pytest.mark.parametrize(
    "name,params,g_max,w_max",
    [
        ("sigmoid", {"k": 5.0}, 1.0, None),
        ("temperature", {"temperature": 1.0}, 1.0, 0.25),
        ("temperature", {"temperature": 4.0}, 1.0, 1.0),
        ("clipped_linear", {"c": 1.0}, 1.0, 1.0),
        ("clipped_linear", {"c": 2.0}, 2.0, 2.0),  # the paper's default c = 2 caps g at c, not at 1
    ],
)
def test_acceptance_gates_bounded(name, params, g_max, w_max):
    gate = make_gate(name, **params)
    log_r = clamp_log_ratio(torch.linspace(-100, 100, 200_001, dtype=torch.float64))
    g = gate.g(log_r)
    w = gate.w(log_r)
    assert torch.isfinite(g).all() and torch.isfinite(w).all()
    assert g.min() >= 0 and g.max() <= g_max
    assert w.min() >= 0
    if w_max is not None:
        assert w.max() <= w_max + 1e-12
    else:  # sigmoid: bounded by a small multiple of k
        assert w.max() < params["k"]
    assert gate.is_acceptance_gate == (g_max <= 1.0)


@pytest.mark.parametrize("name,params", ALL_GATES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_log_ratios_stay_finite(name, params, dtype):
    gate = make_gate(name, **params)
    log_r = torch.tensor([-100.0, -50.0, -LOG_RATIO_CLAMP, 0.0, LOG_RATIO_CLAMP, 50.0, 100.0], dtype=dtype)
    log_r.requires_grad_(True)
    g = gate.g(clamp_log_ratio(log_r))  # log-ratios are clamped where they are formed (rgpo_loss does)
    (grad,) = torch.autograd.grad(g.sum(), log_r)
    assert torch.isfinite(g).all() and torch.isfinite(grad).all()
    assert torch.isfinite(gate.w(clamp_log_ratio(log_r.detach()))).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_clamp_log_ratio_is_a_straight_through_clamp(dtype):
    """Value: exactly the input inside +-LOG_RATIO_CLAMP, the bound (to 1 ulp) outside; gradient 1
    everywhere."""
    log_r = (
        torch.cat(
            [
                torch.randn(1900, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.05,
                torch.linspace(-40, 40, 100, dtype=torch.float64),
            ]
        )
        .to(dtype)
        .requires_grad_(True)
    )
    out = clamp_log_ratio(log_r)
    inside = log_r.detach().abs() <= LOG_RATIO_CLAMP
    assert (out.detach()[inside] == log_r.detach()[inside]).all()
    bound = log_r.detach()[~inside].sign() * LOG_RATIO_CLAMP
    assert ((out.detach()[~inside] - bound).abs() <= torch.finfo(dtype).eps * LOG_RATIO_CLAMP).all()
    (grad,) = torch.autograd.grad(out.sum(), log_r)
    assert (grad == 1).all()


@pytest.mark.parametrize(
    "name,params,field",
    [
        ("sigmoid", {"k": 0.0}, "k"),
        ("sigmoid", {"k": -1.0}, "k"),
        ("sigmoid", {"k": float("nan")}, "k"),
        ("clipped_linear", {"c": 0.0}, "c"),
        ("clipped_linear", {"c": -2.0}, "c"),
        ("temperature", {"temperature": 0.0}, "temperature"),
        ("ppo_clip", {"eps": 0.0}, "eps"),
        ("ppo_clip", {"eps": 1.0}, "eps"),
        ("ppo_clip", {"eps": -0.1}, "eps"),
        ("sigmoid", {"c": 2.0}, "accepts parameters"),
        ("softmax", {}, "registered gates"),
    ],
)
def test_invalid_gate_parameters_raise(name, params, field):
    with pytest.raises(ValueError, match=field):
        make_gate(name, **params)


def test_core_import_does_not_pull_trainer_stack():
    code = (
        "import sys, rgpo_trl; from rgpo_trl import make_gate, rgpo_loss, AdaptiveKLController; "
        "bad = [m for m in ('trl', 'transformers', 'gymnasium', 'datasets', 'peft', 'accelerate') "
        "if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
