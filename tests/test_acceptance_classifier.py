"""The paper's learned acceptance classifier (Sec. 4.6): its BCE on the sign of A and the RGPO loss with
alpha = sigmoid(f_phi) multiplying g(r), detached, against float64 closed forms written out here; its
diagnostics on a hand-counted batch; the MuJoCo RGPO script's --acceptance-classifier (one short run and the
one-line refusals). docs/design.md, "The learned acceptance classifier", says what is implemented and why."""

from __future__ import annotations

import math
import os
import runpy
import subprocess
import sys

import pytest
import torch

from rgpo_trl import acceptance_bce, acceptance_diagnostics, make_gate, rgpo_loss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "mujoco_baselines", "rgpo_continuous_action.py")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _batch(n=12, seed=3):
    """float64 logits, advantages with exact zeros, and log-probs with ratios spread over ~[0.4, 2.5]."""
    gen = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(n, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    adv[[2, 7]] = 0.0
    old = torch.randn(n, generator=gen, dtype=torch.float64)
    logps = old + 0.9 * torch.randn(n, generator=gen, dtype=torch.float64)
    return logits, adv, logps, old


@pytest.mark.parametrize("masked", [False, True])
def test_bce_value_and_gradient_are_the_papers_objective(masked):
    """-mean(1(A>0) log alpha + 1(A<0) log(1 - alpha)) and its gradient (alpha - 1(A>0)) 1(A != 0) / N, the
    A = 0 samples counted in N; with a mask, N is the number of valid samples."""
    logits, adv, _, _ = _batch()
    mask = torch.ones_like(adv)
    if masked:
        mask[[0, 5, 9]] = 0.0
    logits.requires_grad_(True)
    loss = acceptance_bce(logits, adv, mask if masked else None)
    (grad,) = torch.autograd.grad(loss, logits)

    f, a, m = logits.tolist(), adv.tolist(), mask.tolist()
    n = sum(m)
    terms = [
        mi * ((math.log(_sigmoid(fi)) if ai > 0 else 0.0) + (math.log(1.0 - _sigmoid(fi)) if ai < 0 else 0.0))
        for fi, ai, mi in zip(f, a, m, strict=True)
    ]
    assert loss.item() == pytest.approx(-math.fsum(terms) / n, rel=1e-12)
    expected = [mi * (_sigmoid(fi) - (ai > 0)) * (ai != 0) / n for fi, ai, mi in zip(f, a, m, strict=True)]
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    assert sum(ai == 0 for ai in a) == 2 and grad[2].item() == 0.0 and grad[7].item() == 0.0


# g(r) and w(r) = g'(r) r of each acceptance gate, written out from the paper (Sec. 4.4, Ablation A)
def _sigmoid_gate(r, k=5.0):
    g = _sigmoid(k * (r - 1.0))
    return g, k * g * (1.0 - g) * r


def _clipped_linear_gate(r, c=2.0):
    return min(r, c), (r if r < c else 0.0)


def _temperature_gate(r, b=2.0):
    g = r**b / (1.0 + r**b)
    return g, b * g * (1.0 - g)


GATES = [
    ("sigmoid", {}, _sigmoid_gate),
    ("clipped_linear", {}, _clipped_linear_gate),
    ("temperature", {"temperature": 2.0}, _temperature_gate),
]


@pytest.mark.parametrize("name,params,closed_form", GATES, ids=[g[0] for g in GATES])
def test_loss_with_alpha_value_and_gradient(name, params, closed_form):
    """L = -mean(alpha g(r) A) + beta mean(r - 1 - log r), dL/dlog pi_i = (-alpha_i w(r_i) A_i + beta (r_i -
    1)) / N, and no gradient reaches the classifier's logits through L."""
    logits, adv, logps, old = _batch()
    logits.requires_grad_(True)
    logps.requires_grad_(True)
    alpha = torch.sigmoid(logits)
    beta = 0.3
    loss, _ = rgpo_loss(logps, old, adv, make_gate(name, **params), kl_coef=beta, acceptance=alpha)
    grad_logps, grad_logits = torch.autograd.grad(loss, [logps, logits], allow_unused=True)

    n, value, expected = len(adv), [], []
    for fi, ai, lp, lo in zip(logits.tolist(), adv.tolist(), logps.tolist(), old.tolist(), strict=True):
        r, al = math.exp(lp - lo), _sigmoid(fi)
        g, w = closed_form(r)
        value.append(-al * g * ai + beta * (r - 1.0 - math.log(r)))
        expected.append((-al * w * ai + beta * (r - 1.0)) / n)
    assert loss.item() == pytest.approx(math.fsum(value) / n, rel=1e-12)
    torch.testing.assert_close(
        grad_logps, torch.tensor(expected, dtype=torch.float64), rtol=1e-10, atol=1e-14
    )
    assert grad_logits is None  # detached: phi learns from its BCE only
    ratios = torch.exp(logps - old).detach()
    assert ratios.min() < 0.7 and ratios.max() > 2.0, "the batch must reach both sides of every gate's bend"


def test_no_alpha_and_alpha_one_are_the_loss_without_a_classifier():
    """acceptance=None is the default path; alpha = 1 multiplies by an exact 1: both bit-identical."""
    _, adv, logps, old = _batch()
    gate = make_gate("sigmoid")
    results = []
    for kwargs in ({}, {"acceptance": None}, {"acceptance": torch.ones_like(adv)}):
        x = logps.clone().requires_grad_(True)
        loss, _ = rgpo_loss(x, old, adv, gate, kl_coef=0.5, **kwargs)
        results.append((loss, torch.autograd.grad(loss, x)[0]))
    for loss, grad in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(grad, results[0][1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_logits_stay_finite(dtype):
    """Logits of +-1e4 (alpha exactly 0 or 1 in floating point): the BCE, its gradient and the loss stay
    finite; a confidently wrong logit costs about |f| and a confidently right one about 0."""
    logits = torch.tensor([-1e4, -100.0, 0.0, 100.0, 1e4, 1e4], dtype=dtype, requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 0.0, 1.0, -1.0, 1.0], dtype=dtype)
    bce = acceptance_bce(logits, adv)
    (grad,) = torch.autograd.grad(bce, logits)
    assert torch.isfinite(bce) and torch.isfinite(grad).all()
    assert bce.item() == pytest.approx(2e4 / 6, rel=1e-6)
    torch.testing.assert_close(grad, torch.tensor([-1, 0, 0, 0, 1, 0], dtype=dtype) / 6)
    logps = torch.zeros(6, dtype=dtype, requires_grad=True)
    loss, _ = rgpo_loss(
        logps, torch.zeros(6, dtype=dtype), adv, make_gate("sigmoid"), acceptance=torch.sigmoid(logits)
    )
    assert torch.isfinite(loss) and torch.isfinite(torch.autograd.grad(loss, logps)[0]).all()


def test_diagnostics_on_a_hand_counted_batch():
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, -0.2, 0.0])
    adv = torch.tensor([1.0, -2.0, -0.5, 0.0, 0.0, 3.0, 1.0])
    gate = torch.tensor([0.5, 0.05, 0.6, 0.02, 0.3, 0.9, 0.1])
    # accepts (logit > 0): yes no yes no yes no no; signed samples 0, 1, 2, 5, 6, right on 0 and 1 -> 2/5
    # gate accepts (g >= 0.1): yes no yes no yes yes yes -> the two agree on 0 to 4, 5 of 7
    d = acceptance_diagnostics(logits, adv, gate)
    assert d["accuracy"].item() == pytest.approx(2 / 5)
    assert d["agreement_with_gate"].item() == pytest.approx(5 / 7)
    assert d["alpha_mean"].item() == pytest.approx(math.fsum(map(_sigmoid, logits.tolist())) / 7, rel=1e-6)
    masked = acceptance_diagnostics(logits, adv, gate, mask=torch.tensor([1.0, 1, 1, 1, 1, 0, 0]))
    assert masked["accuracy"].item() == pytest.approx(2 / 3) and masked["agreement_with_gate"].item() == 1.0
    assert masked["alpha_mean"].item() == pytest.approx(math.fsum(map(_sigmoid, logits[:5].tolist())) / 5)
    assert math.isnan(acceptance_diagnostics(logits, torch.zeros(7), gate)["accuracy"].item())


class Recorder:
    """Stands in for SummaryWriter: every scalar by tag."""

    last = None

    def __init__(self, *args, **kwargs):
        self.scalars = {}
        Recorder.last = self

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, []).append((step, float(value)))

    def add_text(self, *args, **kwargs):
        pass

    def close(self):
        pass


def test_script_runs_one_iteration_with_the_classifier(tmp_path, monkeypatch):
    """One iteration of Hopper with --acceptance-classifier: the classifier's metrics logged once, in range,
    its parameters moved by its own optimiser, and the policy's update not the one without the classifier."""
    pytest.importorskip("mujoco")
    pytest.importorskip("tyro")
    flags = ["--env-id", "Hopper-v4", "--total-timesteps", "256", "--num-steps", "256"]
    flags += ["--num-minibatches", "4", "--update-epochs", "2", "--eval-episodes", "0"]
    runs = {}
    for name, extra in (
        ("plain", []),
        ("classifier", ["--acceptance-classifier", "--classifier-lr", "1e-3"]),
    ):
        with monkeypatch.context() as m:
            m.setattr("torch.utils.tensorboard.SummaryWriter", Recorder)
            m.chdir(tmp_path)
            m.setattr(sys, "argv", [SCRIPT, *flags, *extra])
            runs[name] = (runpy.run_path(SCRIPT, run_name="__main__"), Recorder.last.scalars)
    g, scalars = runs["classifier"]
    for tag in ("classifier/accuracy", "classifier/alpha_mean", "classifier/agreement_with_gate"):
        ((step, value),) = scalars[tag]
        assert step == 256 and 0.0 < value < 1.0, (tag, value)
    assert "classifier/accuracy" not in runs["plain"][1] and runs["plain"][0]["classifier"] is None
    ((_, bce),) = scalars["losses/classifier_loss"]
    assert 0.0 < bce < 5.0
    assert g["classifier_optimizer"].param_groups[0]["lr"] == 1e-3
    assert all(s["step"] == 8 for s in g["classifier_optimizer"].state.values())  # 2 epochs x 4 mini-batches
    # the same rollout and mini-batches as the plain run (the classifier's initial draws are forked off), so
    # the policies differ by alpha in the loss alone
    plain = runs["plain"][0]
    for name in ("obs", "actions", "b_advantages", "b_oldlogprobs"):
        assert torch.equal(g[name], plain[name]), name
    assert not torch.equal(g["agent"].actor_logstd, plain["agent"].actor_logstd)


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--acceptance-classifier", "--classifier-lr", "0"], "error: classifier_lr must be > 0, got 0.0"),
        (
            ["--acceptance-classifier", "--classifier-lr", "-1e-3"],
            "error: classifier_lr must be > 0, got -0.001",
        ),
        (["--classifier-lr", "1e-3"], "error: classifier_lr only takes effect with --acceptance-classifier"),
        (
            ["--acceptance-classifier", "--compile"],
            "error: acceptance_classifier runs eager only: drop --compile",
        ),
    ],
)
def test_script_refuses_bad_classifier_flags_in_one_line(flags, needle, tmp_path):
    pytest.importorskip("mujoco")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": ROOT}
    r = subprocess.run(
        [sys.executable, SCRIPT, *flags], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and lines == [needle], r.stderr[-2000:]
    assert not (tmp_path / "runs").exists()
