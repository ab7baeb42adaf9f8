"""The RGPO loss: policy gradients against the reweighted-gradient identity (paper Eq. gradient)."""

import pytest
import torch
from torch import nn

from rgpo_trl import (
    effective_sample_size,
    kl_old_estimate,
    kl_ref_estimate,
    log_ratios,
    make_gate,
    rgpo_diagnostics,
    rgpo_loss,
)


@pytest.fixture(autouse=True)
def _float64_default():
    """float64 references; restored afterwards so other test modules keep float32."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


GATE_SPECS = [
    ("sigmoid", {}),
    ("clipped_linear", {}),
    ("temperature", {"temperature": 2.0}),
    ("is", {}),
    ("ppo_clip", {}),
]


class GaussianPolicy(nn.Module):
    def __init__(self, obs_dim=3, act_dim=2, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.mu = nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh(), nn.Linear(8, act_dim))
        self.log_std = nn.Parameter(torch.full((act_dim,), -0.3))

    def log_prob(self, obs, act):
        dist = torch.distributions.Normal(self.mu(obs), self.log_std.exp())
        return dist.log_prob(act).sum(-1)


class CategoricalPolicy(nn.Module):
    def __init__(self, obs_dim=3, n_actions=4, seed=0, temperature=1.0):
        super().__init__()
        torch.manual_seed(seed)
        self.logits = nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh(), nn.Linear(8, n_actions))
        self.temperature = temperature

    def log_prob(self, obs, act):
        return torch.distributions.Categorical(logits=self.logits(obs) / self.temperature).log_prob(act)


def _batch(kind, n=32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 3, generator=gen)
    if kind == "gaussian":
        policy, old = GaussianPolicy(seed=0), GaussianPolicy(seed=7)
        act = torch.randn(n, 2, generator=gen)
    else:
        policy, old = CategoricalPolicy(seed=0), CategoricalPolicy(seed=7, temperature=0.3)
        act = torch.randint(0, 4, (n,), generator=gen)
    # pi_old is a *different* network, so ratios spread over ~[0.2, 5]
    with torch.no_grad():
        old_logps = old.log_prob(obs, act)
    adv = torch.randn(n, generator=gen)
    return policy, obs, act, old_logps, adv


def _flat_grad(scalar, params):
    grads = torch.autograd.grad(scalar, params, allow_unused=True, retain_graph=True)
    return torch.cat(
        [
            (g if g is not None else torch.zeros_like(p)).reshape(-1)
            for g, p in zip(grads, params, strict=True)
        ]
    )


def _per_sample_score(policy, obs, act):
    """grad log pi(a_i|s_i) for each sample, by a loop of autograd calls (the independent reference)."""
    params = list(policy.parameters())
    return torch.stack(
        [_flat_grad(policy.log_prob(obs[i : i + 1], act[i : i + 1]).sum(), params) for i in range(len(obs))]
    )


@pytest.mark.parametrize("kind", ["gaussian", "categorical"])
@pytest.mark.parametrize("name,params", GATE_SPECS)
def test_policy_gradient_equals_weighted_score_function(kind, name, params):
    """grad of -mean(g(r) A) == -mean(w(r) grad log pi A) with w from the closed form."""
    policy, obs, act, old_logps, adv = _batch(kind)
    gate = make_gate(name, **params)
    logps = policy.log_prob(obs, act)
    loss, diag = rgpo_loss(logps, old_logps, adv, gate, kl_coef=0.0)
    grad = _flat_grad(loss, list(policy.parameters()))

    with torch.no_grad():
        w = gate.w(logps - old_logps)
    expected = -(w[:, None] * adv[:, None] * _per_sample_score(policy, obs, act)).mean(0)
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-12)
    assert diag["weight_mean"].item() == pytest.approx(w.mean().item(), rel=1e-6)
    assert diag["weight_sq_mean"].item() == pytest.approx((w * w).mean().item(), rel=1e-6)
    # ESS = (sum w)^2 / (N sum w^2) = mean(w)^2 / mean(w^2): what the trainer reduces across processes
    assert diag["ess"].item() == pytest.approx(
        w.sum().item() ** 2 / (len(w) * (w * w).sum().item()), rel=1e-6
    )
    assert diag["ess"].item() == pytest.approx(w.mean().item() ** 2 / (w * w).mean().item(), rel=1e-6)
    ratios = torch.exp(logps - old_logps).detach()
    assert ratios.min() < 0.7 and ratios.max() > 1.4, "the test batch must exercise r far from 1"


@pytest.mark.parametrize("kind", ["gaussian", "categorical"])
@pytest.mark.parametrize(
    "name,params", [("sigmoid", {}), ("sigmoid", {"k": 2.0}), ("temperature", {}), ("clipped_linear", {})]
)
def test_on_policy_gradient_is_g_prime_one_times_reinforce(kind, name, params):
    policy, obs, act, _, adv = _batch(kind)
    gate = make_gate(name, **params)
    logps = policy.log_prob(obs, act)
    loss, diag = rgpo_loss(logps, logps.detach(), adv, gate)  # r == 1
    grad = _flat_grad(loss, list(policy.parameters()))
    reinforce = _flat_grad(-(policy.log_prob(obs, act) * adv).mean(), list(policy.parameters()))
    g_prime_one = {"sigmoid": params.get("k", 5.0) / 4, "temperature": 0.25, "clipped_linear": 1.0}[name]
    torch.testing.assert_close(grad, g_prime_one * reinforce, rtol=1e-10, atol=1e-13)
    # old_logps=None means on-policy too
    loss_none, _ = rgpo_loss(policy.log_prob(obs, act), None, adv, gate)
    torch.testing.assert_close(_flat_grad(loss_none, list(policy.parameters())), grad)
    assert diag["kl_old"].item() == 0.0 and diag["ess"].item() == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["gaussian", "categorical"])
def test_is_gate_gives_plain_importance_sampling_gradient(kind):
    policy, obs, act, old_logps, adv = _batch(kind)
    loss, _ = rgpo_loss(policy.log_prob(obs, act), old_logps, adv, make_gate("is"))
    grad = _flat_grad(loss, list(policy.parameters()))
    ratio = torch.exp(policy.log_prob(obs, act) - old_logps)
    expected = _flat_grad(-(ratio * adv).mean(), list(policy.parameters()))
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-13)


def test_kl_penalty_gradient_and_value():
    policy, obs, act, old_logps, adv = _batch("gaussian")
    gate, beta = make_gate("sigmoid"), 0.7
    logps = policy.log_prob(obs, act)
    loss, diag = rgpo_loss(logps, old_logps, adv, gate, kl_coef=beta)
    r = torch.exp(logps - old_logps)
    reference = -(1 / (1 + torch.exp(-5 * (r - 1))) * adv).mean() + beta * (r - 1 - torch.log(r)).mean()
    torch.testing.assert_close(loss, reference)
    assert diag["kl_old"].item() == pytest.approx((r - 1 - torch.log(r)).mean().item(), rel=1e-6)
    params = list(policy.parameters())
    expected_grad = _flat_grad(reference, params)
    torch.testing.assert_close(_flat_grad(loss, params), expected_grad, rtol=1e-10, atol=1e-13)


def test_dual_mode_gates_on_the_larger_ratio():
    logps = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.0, -0.5, -3.5]])  # log r_old = [0.2, -1.0, 0.0, 0.5]
    ref = torch.tensor([[-1.5, -2.1, -0.1, -3.2]])  # log r_ref = [0.5, 0.1, -0.4, 0.2]
    adv = torch.tensor([[1.0]])
    gate = make_gate("sigmoid", k=5.0)
    log_r = log_ratios(logps, old, ref, ratio_mode="dual").gated
    expected_log_r = torch.tensor([[0.5, 0.1, 0.0, 0.5]])
    torch.testing.assert_close(log_r.detach(), expected_log_r)
    torch.testing.assert_close(gate.g(log_r).detach(), torch.sigmoid(5 * (expected_log_r.exp() - 1)))
    _, diag = rgpo_loss(logps, old, adv, gate, ref_logps=ref, ratio_mode="dual")
    assert diag["ref_ratio_larger_frac"].item() == pytest.approx(0.5)  # tokens 0 and 1
    assert diag["ratio_ref_max"].item() == pytest.approx(float(torch.exp(torch.tensor(0.5))))
    # ref and old modes pick their own ratio
    torch.testing.assert_close(
        log_ratios(logps, old, ref, ratio_mode="ref").gated.detach(), (logps - ref).detach()
    )
    torch.testing.assert_close(
        log_ratios(logps, old, ratio_mode="old").gated.detach(), (logps - old).detach()
    )


def test_masked_per_token_loss_and_normalizer():
    gen = torch.Generator().manual_seed(3)
    logps = torch.randn(3, 5, generator=gen).requires_grad_(True)
    old = logps.detach() + 0.3 * torch.randn(3, 5, generator=gen)
    ref = logps.detach() + 0.3 * torch.randn(3, 5, generator=gen)
    adv = torch.randn(3, 1, generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float64)
    gate = make_gate("sigmoid")
    loss, diag = rgpo_loss(
        logps, old, adv, gate, kl_coef=0.3, ref_logps=ref, ref_kl_coef=0.05, ratio_mode="dual", mask=mask
    )
    # reference: flatten the valid tokens only
    sel = mask.bool()
    lp, o, rf = logps[sel], old[sel], ref[sel]
    a = adv.expand(3, 5)[sel]
    r_old, r_ref = torch.exp(lp - o), torch.exp(lp - rf)
    r = torch.maximum(r_old, r_ref)
    k3 = torch.exp(rf - lp) - (rf - lp) - 1
    ref_loss = (-(torch.sigmoid(5 * (r - 1)) * a) + 0.3 * (r_old - 1 - torch.log(r_old)) + 0.05 * k3).mean()
    torch.testing.assert_close(loss, ref_loss)
    loss_sum, _ = rgpo_loss(
        logps,
        old,
        adv,
        gate,
        kl_coef=0.3,
        ref_logps=ref,
        ref_kl_coef=0.05,
        ratio_mode="dual",
        mask=mask,
        normalizer=1.0,
    )
    torch.testing.assert_close(loss_sum, ref_loss * sel.sum())
    assert diag["kl_ref"].item() == pytest.approx(k3.mean().item(), rel=1e-6)
    assert diag["ratio_old_max"].item() == pytest.approx(r_old.max().item(), rel=1e-6)
    assert diag["rejected_frac"].item() == pytest.approx(
        (torch.sigmoid(5 * (r - 1)) < 0.1).double().mean().item()
    )


@pytest.mark.parametrize("name,params", GATE_SPECS)
@pytest.mark.parametrize("mode", ["old", "ref", "dual"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_loss_and_gradient_finite_for_log_ratios_of_100(name, params, mode, dtype):
    logps = torch.tensor([0.0, 0.0, 0.0, 0.0], dtype=dtype, requires_grad=True)
    old = torch.tensor([100.0, -100.0, 0.5, -0.5], dtype=dtype)
    ref = torch.tensor([-100.0, 100.0, -100.0, 100.0], dtype=dtype)
    adv = torch.tensor([1.0, -1.0, 2.0, -2.0], dtype=dtype)
    loss, diag = rgpo_loss(
        logps,
        old,
        adv,
        make_gate(name, **params),
        kl_coef=5.0,
        ref_logps=ref,
        ref_kl_coef=0.05,
        ratio_mode=mode,
    )
    (grad,) = torch.autograd.grad(loss, logps)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in diag.values())
    # the KL penalty still pulls a far-off sample back (straight-through clamp), it is not silently zero
    (kl_grad,) = torch.autograd.grad(kl_old_estimate(logps - old).sum(), logps)
    assert kl_grad[1] > 0 and kl_grad[0] < 0


def test_kl_estimators_match_float64_reference():
    log_r = torch.linspace(-5, 5, 101)
    torch.testing.assert_close(kl_old_estimate(log_r), torch.exp(log_r) - 1 - log_r)
    assert (kl_old_estimate(log_r) >= 0).all()
    lp, ref = torch.randn(50), torch.randn(50)
    torch.testing.assert_close(kl_ref_estimate(lp - ref), torch.exp(ref - lp) - (ref - lp) - 1)  # TRL's k3


def test_effective_sample_size_identities():
    assert effective_sample_size(torch.full((10,), 0.3)).item() == pytest.approx(1.0)
    one_hot = torch.zeros(10)
    one_hot[3] = 2.0
    assert effective_sample_size(one_hot).item() == pytest.approx(0.1)
    assert effective_sample_size(torch.zeros(4)).item() == 0.0
    w = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert effective_sample_size(w, mask).item() == pytest.approx(36 / (3 * 14))
    # per row: [1, 2] -> 9 / (2 * 5); [3] -> 1; a row of zeros -> 0
    rows = effective_sample_size(
        torch.cat([w, torch.zeros(1, 3)]), torch.cat([mask, torch.ones(1, 3)]), dim=-1
    )
    torch.testing.assert_close(rows.double(), torch.tensor([0.9, 1.0, 0.0]))
    torch.testing.assert_close(effective_sample_size(w, dim=1).double(), torch.tensor([144 / 258, 441 / 513]))


def test_invalid_loss_arguments_raise():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="ratio_mode"):
        rgpo_loss(x, x, x, make_gate("sigmoid"), ratio_mode="both")
    with pytest.raises(ValueError, match="ref_logps"):
        rgpo_loss(x, x, x, make_gate("sigmoid"), ratio_mode="dual")
    with pytest.raises(ValueError, match="ref_logps"):
        rgpo_loss(x, x, x, make_gate("sigmoid"), ref_kl_coef=0.05)


def test_per_sequence_log_ratios_with_a_token_mask_are_token_weighted():
    """(B, 1) inputs with a (B, T) mask: each sequence counts once per valid token (the trainer's
    sequence-level gate), and equals the loss on the inputs expanded to (B, T)."""
    gen = torch.Generator().manual_seed(5)
    logps = torch.randn(3, 1, generator=gen).requires_grad_(True)
    old, ref = logps.detach() + 0.2, logps.detach() - 0.3
    adv = torch.randn(3, 1, generator=gen)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float64)
    gate = make_gate("sigmoid")
    kw = dict(kl_coef=0.3, ratio_mode="dual", mask=mask, ref_kl_coef=0.05)
    loss, diag = rgpo_loss(logps, old, adv, gate, ref_logps=ref, **kw)
    expanded = lambda x: x.expand(3, 5)  # noqa: E731
    loss_e, diag_e = rgpo_loss(expanded(logps), expanded(old), adv, gate, ref_logps=expanded(ref), **kw)
    torch.testing.assert_close(loss, loss_e)
    for key in diag:
        torch.testing.assert_close(diag[key], diag_e[key])
    assert diag["ref_ratio_larger_frac"].item() == 1.0  # log r_ref = 0.3 > log r_old = -0.2


@pytest.mark.parametrize("name,params", GATE_SPECS)
@pytest.mark.parametrize("masked", [False, True])
def test_diagnostics_per_row_equal_the_losss_per_call(name, params, masked):
    """rgpo_diagnostics(dim=-1) on stacked mini-batches == rgpo_loss's diagnostics of each mini-batch
    (what the MuJoCo scripts rely on when they reduce once per epoch)."""
    gen = torch.Generator().manual_seed(11)
    gate = make_gate(name, **params)
    logps = torch.randn(4, 6, generator=gen)
    old = logps + 0.4 * torch.randn(4, 6, generator=gen)
    ref = logps + 0.4 * torch.randn(4, 6, generator=gen)
    mask = (torch.rand(4, 6, generator=gen) > 0.3).double() if masked else None
    if masked:
        mask[2] = 0.0  # a row with nothing valid: means 0, ESS 0, maxima -inf
    kw = dict(ref_logps=ref, ratio_mode="dual")
    rows = rgpo_diagnostics(logps, old, gate, mask=mask, dim=-1, **kw)
    for i in range(4):
        _, diag = rgpo_loss(
            logps[i],
            old[i],
            torch.ones(6),
            gate,
            mask=None if mask is None else mask[i],
            ref_logps=ref[i],
            ratio_mode="dual",
        )
        assert set(rows) == set(diag)
        for key in diag:
            torch.testing.assert_close(rows[key][i], diag[key], msg=key)
    if masked:
        assert rows["ess"][2].item() == 0.0 and rows["ratio_old_max"][2].item() == -float("inf")
    # dim=0 reduces columns; dim=None everything, equal to one call on all elements
    _, whole = rgpo_loss(logps, old, torch.ones(4, 6), gate, mask=mask, **kw)
    for key, value in rgpo_diagnostics(logps, old, gate, mask=mask, **kw).items():
        torch.testing.assert_close(value, whole[key], msg=key)
    cols = rgpo_diagnostics(logps, old, gate, mask=mask, dim=0, **kw)
    _, col1 = rgpo_loss(
        logps[:, 1],
        old[:, 1],
        torch.ones(4),
        gate,
        mask=None if mask is None else mask[:, 1],
        **{k: v[:, 1] if torch.is_tensor(v) else v for k, v in kw.items()},
    )
    torch.testing.assert_close(cols["ess"][1], col1["ess"])
    assert cols["kl_old"].shape == (6,)


@pytest.mark.parametrize("name,params", GATE_SPECS)
@pytest.mark.parametrize("setting", ["dual_masked", "old_plain", "on_policy"])
def test_loss_without_diagnostics_is_the_same_loss_and_gradient(name, params, setting):
    """diagnostics=False (and its shortcut for ratio_mode "old" without a reference) gives the same
    loss and gradient as the full path, including log-ratios beyond the clamp."""
    gen = torch.Generator().manual_seed(2)
    old, ref, adv = (
        torch.randn(3, 5, generator=gen),
        torch.randn(3, 5, generator=gen),
        torch.randn(3, 1, generator=gen),
    )
    delta = 0.3 * torch.randn(3, 5, generator=gen)
    delta[1, 2], delta[2, 4] = 30.0, -30.0  # outside +-LOG_RATIO_CLAMP: straight-through gradient
    mask = torch.ones(3, 5)
    mask[0, 3:] = 0
    kw = dict(kl_coef=0.7)
    if setting == "dual_masked":
        kw.update(ref_logps=ref, ref_kl_coef=0.05, ratio_mode="dual", mask=mask)
    results = []
    for diagnostics in (True, False):
        logps = (old + delta).requires_grad_(True)
        loss, diag = rgpo_loss(
            logps,
            None if setting == "on_policy" else old,
            adv,
            make_gate(name, **params),
            diagnostics=diagnostics,
            **kw,
        )
        loss.backward()
        results.append((loss.detach(), logps.grad))
        assert bool(diag) == diagnostics
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    assert torch.isfinite(results[0][1]).all()


def _closed_form_diagnostics(logps, old, ref, mask, k, ratio_mode, sequence_level):
    """The diagnostics written out for the sigmoid gate g(r) = 1 / (1 + exp(-k (r - 1))), w = k g (1 - g) r,
    from the log-probs, with plain torch (no library code): token-weighted means over ``mask``, maxima over
    the valid tokens; at sequence level the gated ratio is exp(masked mean of log r) per sequence."""

    def mean(x):
        x = x.expand_as(mask)
        return (x * mask).sum() / mask.sum()

    def seq(log_r):
        return ((log_r * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)).exp()

    r_old, r_ref = (logps - old).exp(), (logps - ref).exp()
    g_old, g_ref = (seq(logps - old), seq(logps - ref)) if sequence_level else (r_old, r_ref)
    r = {"old": g_old, "ref": g_ref, "dual": torch.maximum(g_old, g_ref)}[ratio_mode]
    g = 1.0 / (1.0 + torch.exp(-k * (r - 1.0)))
    w = k * g * (1.0 - g) * r
    out = {
        "gate_mean": mean(g),
        "weight_mean": mean(w),
        "weight_sq_mean": mean(w * w),
        "kl_old": mean(r_old - 1.0 - (logps - old)),
        "rejected_frac": mean((g < 0.1).double()),
        "ratio_old_mean": mean(r_old),
        "ratio_old_max": r_old[mask > 0].max(),
        "kl_ref": mean(1.0 / r_ref - 1.0 + (logps - ref)),
        "ratio_ref_mean": mean(r_ref),
        "ratio_ref_max": r_ref[mask > 0].max(),
    }
    out["ess"] = out["weight_mean"] ** 2 / out["weight_sq_mean"]
    if ratio_mode == "dual":
        out["ref_ratio_larger_frac"] = mean((g_ref > g_old).double())
        # the gate on the token-level r_old alone
        out["rejected_frac_old"] = mean((1.0 / (1.0 + torch.exp(-k * (r_old - 1.0))) < 0.1).double())
    return out


@pytest.mark.parametrize("ratio_mode", ["old", "ref", "dual"])
@pytest.mark.parametrize("sequence_level", [False, True])
def test_diagnostics_from_the_losss_log_ratios_equal_the_closed_form(ratio_mode, sequence_level):
    """`log_ratio_diagnostics` of the log-ratios the loss formed (`rgpo_terms(...).log_ratios`, what both
    trainers log) equal the diagnostics written out from the log-probs, on random float64 inputs with a ragged
    mask, token- and sequence-level; `rgpo_diagnostics` (from the log-probs) gives the same."""
    from rgpo_trl import log_ratio_diagnostics, rgpo_terms

    gen = torch.Generator().manual_seed(5)
    logps = (-2.0 + 0.5 * torch.randn(6, 9, generator=gen)).requires_grad_()
    far = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])[:, None]  # two rows with r ~ 1/e: the gate rejects
    old = logps.detach() + far + 0.4 * torch.randn(6, 9, generator=gen)
    ref = logps.detach() + far + 0.4 * torch.randn(6, 9, generator=gen)
    mask = (torch.arange(9) < torch.tensor([9, 7, 5, 9, 3, 8])[:, None]).double()
    gate = make_gate("sigmoid", k=5.0)
    sequence_mask = mask if sequence_level else None
    terms = rgpo_terms(
        logps, old, torch.ones(6, 1), gate, ref_logps=ref, ratio_mode=ratio_mode, sequence_mask=sequence_mask
    )
    diag = log_ratio_diagnostics(terms.log_ratios, gate, mask=mask)
    expected = _closed_form_diagnostics(logps.detach(), old, ref, mask, 5.0, ratio_mode, sequence_level)
    assert set(diag) == set(expected)
    assert 0.0 < expected["rejected_frac"] < 1.0  # the inputs exercise the rejection statistic
    for key, value in expected.items():
        torch.testing.assert_close(diag[key], value, rtol=1e-12, atol=1e-14, msg=key)
        assert not diag[key].requires_grad
    from_logps = rgpo_diagnostics(
        logps, old, gate, ref_logps=ref, ratio_mode=ratio_mode, mask=mask, sequence_mask=sequence_mask
    )
    assert set(from_logps) == set(diag)
    for key, value in diag.items():
        assert torch.equal(from_logps[key], value), key
