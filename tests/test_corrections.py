"""The off-policy corrections registry: every per-token loss and its gradient against a float64 closed form
written from its source, each reducing to plain policy gradient at r = 1, parameters checked."""

from __future__ import annotations

import math

import pytest
import torch

import rgpo_trl
from rgpo_trl.core import CORRECTIONS, make_correction, register_correction
from rgpo_trl.core.corrections import Correction

N = 400


def _inputs(seed=0, spread=0.8):
    g = torch.Generator().manual_seed(seed)
    sampler = -torch.rand(N, generator=g, dtype=torch.float64) * 3
    logps = (sampler + spread * torch.randn(N, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    segments = torch.sort(torch.randint(0, 20, (N,), generator=g)).values
    return logps, sampler, adv, segments


def _grad(corr, logps, sampler, adv, segments, **kw):
    logps.grad = None
    t = corr.terms(logps, sampler, adv, segment_ids=segments, **kw)
    t.loss.sum().backward()
    return t, logps.grad.clone()


def _closed_form_weight(name, r, adv, segments):
    """Each method's weight on A grad log pi, from its source (module docstring), in float64."""
    one = torch.ones_like(r)
    if name == "ignore":
        return one
    if name == "ppo_clip":  # d/dlogpi of -min(rA, clip(r)A): -rA where the unclipped term is the minimum
        unclipped = r * adv <= r.clamp(0.8, 1.2) * adv
        return torch.where(unclipped, r, 0 * r)
    if name == "tis":
        return torch.minimum(r, 2 * one)
    if name == "icepop":
        return torch.where((r >= 0.5) & (r <= 5.0), r, 0 * r)
    if name == "seq_mask":
        out = torch.empty_like(r)
        for s in segments.unique():
            m = segments == s
            seq = torch.exp(torch.log(r[m]).sum())
            out[m] = 0.0 if seq > 3.0 else seq
        return out
    raise KeyError(name)


@pytest.mark.parametrize("name", ["ignore", "ppo_clip", "tis", "icepop", "seq_mask"])
def test_gradient_is_minus_weight_times_advantage_by_the_closed_form(name):
    logps, sampler, adv, segments = _inputs()
    corr = make_correction(name)
    t, grad = _grad(corr, logps, sampler, adv, segments)
    r = torch.exp(logps.detach() - sampler)
    weight = _closed_form_weight(name, r, adv, segments)
    torch.testing.assert_close(t.weight, weight, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, -weight * adv, rtol=1e-10, atol=1e-14)
    # the inputs reach every branch of the method
    if name in ("ppo_clip", "icepop", "seq_mask"):
        assert 0 < (weight == 0).double().mean() < 1, "the test data must hit masked and unmasked tokens"


def test_ppo_clip_loss_value_is_the_clipped_surrogate():
    logps, sampler, adv, segments = _inputs(1)
    t = make_correction("ppo_clip", eps_low=0.1, eps_high=0.3).terms(logps, sampler, adv)
    r = torch.exp(logps.detach() - sampler)
    ref = -torch.minimum(r * adv, r.clamp(0.9, 1.3) * adv)
    torch.testing.assert_close(t.loss.detach(), ref, rtol=1e-12, atol=0)


def test_rgpo_entry_is_the_papers_loss():
    """-g(r) A + beta (r - 1 - log r) with the sigmoid gate; gradient (-g'(r) r A + beta (r - 1))."""
    logps, sampler, adv, segments = _inputs(2, spread=0.3)
    gate = rgpo_trl.make_gate("sigmoid", k=5.0)
    t, grad = _grad(make_correction("rgpo"), logps, sampler, adv, segments, gate=gate, kl_coef=0.7)
    r = torch.exp(logps.detach() - sampler)
    g = torch.sigmoid(5 * (r - 1))
    ref = -g * adv + 0.7 * (r - 1 - torch.log(r))
    torch.testing.assert_close(t.loss.detach(), ref, rtol=1e-10, atol=1e-12)
    w = 5 * g * (1 - g) * r
    torch.testing.assert_close(t.weight, w, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(grad, -w * adv + 0.7 * (r - 1), rtol=1e-8, atol=1e-12)
    with pytest.raises(ValueError, match="needs the gate"):
        make_correction("rgpo").terms(logps, sampler, adv)


@pytest.mark.parametrize("name", sorted(CORRECTIONS))
def test_every_correction_is_policy_gradient_at_ratio_one(name):
    """Sampler == trainer: the gradient is -c A grad log pi with c = 1 (c = g'(1) = k / 4 for RGPO)."""
    logps, _, adv, segments = _inputs(3)
    kw = {"gate": rgpo_trl.make_gate("sigmoid", k=5.0), "kl_coef": 0.5} if name == "rgpo" else {}
    _, grad = _grad(make_correction(name), logps, logps.detach().clone(), adv, segments, **kw)
    c = 5 / 4 if name == "rgpo" else 1.0
    torch.testing.assert_close(grad, -c * adv, rtol=1e-12, atol=1e-14)


def test_extreme_log_ratios_stay_finite():
    logps, sampler, adv, segments = _inputs(4)
    far = sampler + torch.where(torch.arange(N) % 2 == 0, 100.0, -100.0).double()
    for name in CORRECTIONS:
        kw = {"gate": rgpo_trl.make_gate("sigmoid")} if name == "rgpo" else {}
        t, grad = _grad(make_correction(name), far.clone().requires_grad_(True), sampler, adv, segments, **kw)
        assert torch.isfinite(t.loss).all() and torch.isfinite(grad).all(), name


@pytest.mark.parametrize(
    "name,params,message",
    [
        ("tis", {"cap": 0.5}, r"cap must be a number in \[1.0, 1000000.0\]"),
        ("icepop", {"low": 2.0}, r"low must be a number in \[0.0, 1.0\]"),
        ("seq_mask", {"cap": math.nan}, "cap must be a number"),
        ("ppo_clip", {"eps": 0.2}, r"unknown parameter\(s\) \['eps'\]; it takes eps_low, eps_high"),
        ("ignore", {"cap": 2.0}, "it takes none"),
    ],
)
def test_bad_parameters_name_the_field_and_range(name, params, message):
    with pytest.raises(ValueError, match=message):
        make_correction(name, **params)
    with pytest.raises(ValueError, match="off_policy_correction must be one of"):
        make_correction("vtrace")


def test_seq_mask_needs_segments_and_registering_a_correction():
    logps, sampler, adv, _ = _inputs(5)
    with pytest.raises(ValueError, match="segment_ids"):
        make_correction("seq_mask").terms(logps, sampler, adv)

    @register_correction("_test_half")
    class Half(Correction):
        def weight(self, log_r, advantages, segment_ids):
            return 0.5 * torch.ones_like(log_r)

    try:
        _, grad = _grad(make_correction("_test_half"), logps, sampler, adv, None)
        torch.testing.assert_close(grad, -0.5 * adv)
        with pytest.raises(ValueError, match="already registered"):
            register_correction("tis")(Half)
    finally:
        CORRECTIONS.pop("_test_half")
