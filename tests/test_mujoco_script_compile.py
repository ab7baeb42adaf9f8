"""`--compile` in the single-file scripts (mujoco_baselines/<method>_continuous_action.py): the written-out
step (torch.func's gradient of the script's own mini-batch loss, the gradient clip, torch's Adam written
out) against torch's own eager step, bit for bit with torch.compile left out and to float tolerance with it;
a compiled run against the eager run; a missing C++ compiler in one line. (Up to 6944b5d the compiled path
was also checked bit for bit against the lab's former copy that made the committed --compile runs.)"""

from __future__ import annotations

import copy

import pytest
import torch
from _mujoco_utils import SHORT, Recorder, needs_compiler, run_script, script

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

FAST = ["--num-minibatches", "4", "--compile"]


def _setup(method, max_grad_norm, seed=0):
    """The script's module, Args, an agent at Hopper-v4 shapes (width 64), a fixed rollout, the loss function
    its --compile path differentiates and the parameters its optimiser steps."""
    module = script(method)
    torch.manual_seed(seed)
    args = module.Args(hidden_size=64, max_grad_norm=max_grad_norm)
    agent = module.Agent(11, 3, 64)
    T = 512
    obs, actions = torch.randn(T, 11), torch.randn(T, 3)
    with torch.no_grad():
        logprobs = agent.log_prob(agent.actor_mean(obs), actions) + 0.05 * torch.randn(T)
        values = agent.critic(obs).squeeze(-1)
    data = (obs, actions, torch.randn(T), logprobs, torch.randn(T), values)
    if method == "trpo":  # its Adam steps the value function only
        return module, agent, lambda a, o, ret, val: module.value_minibatch_loss(a, o, ret, val, args), data
    extra = {"gate": module.rgpo_trl.make_gate("sigmoid")} if method == "rgpo" else {}
    return module, agent, lambda a, *batch: module.minibatch_loss(a, *batch, args=args, **extra), data


def _batch(method, data, idx, beta):
    obs, actions, adv, logprobs, returns, values = (t[idx] for t in data)
    if method == "trpo":
        return (obs, returns, values)
    if method == "awr":
        return (obs, actions, adv, logprobs, returns, values)
    return (obs, actions, adv, logprobs, returns, values, None, beta)  # no decoupled weight


def _run_both(method, steps, max_grad_norm=0.5, compile=True, monkeypatch=None):
    """torch's eager step and the script's compiled_update on twin agents over `steps` mini-batches, the
    learning rate annealed between steps (as the scripts do between iterations)."""
    if not compile:
        monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    module, agent, loss_fn, data = _setup(method, max_grad_norm)
    twin = copy.deepcopy(agent)
    params_of = (
        (lambda a: list(a.critic.parameters())) if method == "trpo" else (lambda a: list(a.parameters()))
    )
    opt_eager = torch.optim.Adam(params_of(agent), lr=3e-4, eps=1e-5)
    opt_fast = torch.optim.Adam(params_of(twin), lr=3e-4, eps=1e-5)
    fast = module.compiled_update(twin, opt_fast, loss_fn, max_grad_norm)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for k in range(steps):
        opt_eager.param_groups[0]["lr"] = opt_fast.param_groups[0]["lr"] = 3e-4 * (1 - k / steps)
        idx = torch.randperm(512, generator=gen)[:64]
        beta = 0.5 if method in ("rgpo", "ppo") else None
        loss, _ = loss_fn(agent, *_batch(method, data, idx, beta))
        opt_eager.zero_grad()
        loss.backward()
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params_of(agent), max_grad_norm)
        opt_eager.step()
        loss_f, _ = fast(*_batch(method, data, idx, None if beta is None else torch.tensor(beta)))
        losses.append((loss.detach(), loss_f))
    return losses, (agent, opt_eager), (twin, opt_fast)


@pytest.mark.parametrize(
    "method,max_grad_norm", [("ppo", 0.5), ("rgpo", 0.5), ("awr", 0.5), ("ppo", 0.0), ("trpo", 0.5)]
)
def test_uncompiled_functional_step_is_torchs_step_bit_for_bit(method, max_grad_norm, monkeypatch):
    """Without torch.compile the written-out step is torch's eager step exactly: the loss, the parameters,
    Adam's moments and step counts over 30 steps with an annealed learning rate. So any difference under
    --compile comes from inductor's rounding alone."""
    losses, (agent, opt), (twin, opt_f) = _run_both(method, 30, max_grad_norm, False, monkeypatch)
    for loss, loss_f in losses:
        assert torch.equal(loss, loss_f)
    for p, q in zip(agent.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)
        if p in opt.state:
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(opt.state[p][key], opt_f.state[q][key]), key
    assert float(opt_f.state[next(iter(opt_f.state))]["step"]) == 30


@needs_compiler
@pytest.mark.slow  # a compilation, ~30 s on a loaded 2-core machine
def test_compiled_step_matches_eager_step_to_float_tolerance():
    """Under torch.compile the same 20 steps agree with the eager ones to float32 tolerance (inductor fuses
    and reorders float operations, so not bit for bit)."""
    losses, (agent, _), (twin, _) = _run_both("rgpo", 20)
    for loss, loss_f in losses:
        torch.testing.assert_close(loss_f, loss, rtol=1e-4, atol=1e-6)
    for p, q in zip(agent.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", ["ppo", "rgpo", "trpo", "awr"])
def test_numpy_policy_mean_is_actor_mean_and_follows_updates(method):
    """--compile's rollout computes the policy mean in numpy on views of the actor's weights: the module's
    output to float rounding, and still after an in-place update of the weights."""
    module = script(method)
    torch.manual_seed(0)
    actor = module.Agent(11, 3, 64)
    mean = module.numpy_policy_mean(actor)
    x = torch.randn(11)
    for _ in range(2):
        torch.testing.assert_close(torch.from_numpy(mean(x.numpy())), actor.actor_mean(x).detach())
        with torch.no_grad():
            for p in actor.actor_mean.parameters():
                p.add_(0.1 * torch.randn_like(p))


@needs_compiler
@pytest.mark.slow
def test_compiled_script_differs_from_eager_by_rounding(tmp_path, monkeypatch):
    """The check can fail: the eager script is not the compiled one bit for bit (so the compiled path ran),
    yet after 3 iterations its parameters are within float32 rounding's drift of it."""
    _, fast = run_script("ppo", [*SHORT, *FAST], tmp_path / "fast", monkeypatch)
    _, eager = run_script("ppo", [*SHORT, *FAST[:-1]], tmp_path / "eager", monkeypatch)
    a, b = fast["agent"].state_dict(), eager["agent"].state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("method", ["ppo", "rgpo", "trpo", "awr"])
def test_compile_without_a_cpp_compiler_stops_in_one_line(method, tmp_path, monkeypatch):
    """No C++ compiler for inductor: the script stops at setup with one line naming the flag, before its
    TensorBoard writer exists (nothing written)."""

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr("torch._inductor.cpp_builder.get_cpp_compiler", no_compiler)
    Recorder.last = None
    with pytest.raises(SystemExit) as stop:
        run_script(method, [*SHORT, *FAST], tmp_path, monkeypatch)
    assert str(stop.value).startswith("error: compile: torch.compile needs a C++ compiler (no working C++")
    assert Recorder.last is None
