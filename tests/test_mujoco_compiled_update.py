"""`--compile` (rgpo_lab/mujoco_runner/compiled_update.py): the written-out step against torch's own eager
step."""

from __future__ import annotations

import copy
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

from _mujoco_utils import TIME_KEYS, load, needs_compiler, read_rows, small_args  # noqa: E402

from rgpo_lab.mujoco_runner.compiled_update import CompiledAdamStep  # noqa: E402

# PPO's and RGPO's mini-batch loss take the decoupled objective's weight last: None, the plain objective
NO_WEIGHT = {"ppo": (None,), "rgpo": (None,)}


def _setup(method="ppo", width=64, max_grad_norm=0.5, seed=0):
    """An agent of `method`'s script at Hopper-v4 shapes, a fixed rollout and its loss function."""
    module = load(method)
    torch.manual_seed(seed)
    args = module.Args(hidden_size=width, max_grad_norm=max_grad_norm)
    agent = module.Agent(11, 3, args)
    T = 512
    obs, actions = torch.randn(T, 11), torch.randn(T, 3)
    with torch.no_grad():
        logprobs = agent.log_prob(agent.actor_mean(obs), actions) + 0.05 * torch.randn(T)
        values = agent.critic(obs).squeeze(-1)
    data = dict(
        obs=obs, actions=actions, adv=torch.randn(T), logprobs=logprobs, returns=torch.randn(T), values=values
    )
    return module, args, agent, data


def _minibatch(method, d, idx):
    """The inputs of `method`'s minibatch_loss for the samples `idx` of `_setup`'s rollout."""
    tensors = (d["obs"], d["actions"], d["adv"], d["logprobs"], d["returns"], d["values"])
    return (*(t[idx] for t in tensors), *NO_WEIGHT.get(method, ()))


def _eager_step(agent, optimizer, loss, params, stat_params, max_grad_norm, g_sum):
    """The scripts' eager step (loss.backward, gradient statistics, clip_grad_norm_, torch.optim.Adam)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    g_sq = torch.zeros(())
    if stat_params:
        g = torch.cat([p.grad.reshape(-1) for p in stat_params])
        g_sum += g
        g_sq = g.dot(g)
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return g_sq


def _run_both(method, compile, steps, max_grad_norm=0.5, value_only=False, lr_schedule=False):
    """The eager step and CompiledAdamStep side by side on twin agents over `steps` mini-batches."""
    module, args, agent, d = _setup(method, max_grad_norm=max_grad_norm)
    twin = copy.deepcopy(agent)
    if value_only:  # TRPO's value epochs: critic parameters only, no gradient statistics
        params_of = lambda a: list(a.critic.parameters())  # noqa: E731
        stats_of = lambda a: []  # noqa: E731

        def loss_fn(a, o, ret, val):
            return module.value_minibatch_loss(a, o, ret, val, args)
    else:
        params_of = lambda a: list(a.parameters())  # noqa: E731
        stats_of = lambda a: a.policy_parameters()  # noqa: E731
        extra = {"gate": module.rgpo_trl.make_gate("sigmoid")} if method == "rgpo" else {}

        def loss_fn(a, *batch):
            return module.minibatch_loss(a, *batch, args=args, **extra)

    opt_eager = torch.optim.Adam(params_of(agent), lr=3e-4, eps=1e-5)
    opt_fast = torch.optim.Adam(params_of(twin), lr=3e-4, eps=1e-5)
    fast = CompiledAdamStep(
        twin, opt_fast, loss_fn, params_of(twin), max_grad_norm, stats_of(twin), compile=compile
    )
    g_sum = torch.zeros_like(fast.g_sum)
    gen = torch.Generator().manual_seed(1)
    outputs = []  # per step: (eager loss, compiled-step loss), (eager g.g, compiled-step g.g)
    for k in range(steps):
        lr = 3e-4 * (1 - k / steps) if lr_schedule else 3e-4  # the scripts anneal between iterations
        opt_eager.param_groups[0]["lr"] = opt_fast.param_groups[0]["lr"] = lr
        idx = torch.randperm(512, generator=gen)[:64]
        if value_only:
            batch = (d["obs"][idx], d["returns"][idx], d["values"][idx])
        else:
            batch = _minibatch(method, d, idx)
        eager_extra, fast_extra = (
            ((0.5,), (torch.tensor(0.5),)) if method == "rgpo" and not value_only else ((), ())
        )
        loss, _ = loss_fn(agent, *batch, *eager_extra)
        g_sq = _eager_step(agent, opt_eager, loss, params_of(agent), stats_of(agent), max_grad_norm, g_sum)
        loss_f, _, g_sq_f = fast(*batch, *fast_extra)
        outputs.append(((loss.detach(), loss_f), (g_sq, g_sq_f)))
    return outputs, (agent, opt_eager), (twin, opt_fast), (g_sum, fast.g_sum)


def _assert_close(a, b, exact, rtol=0.0, atol=0.0):
    if exact:
        assert torch.equal(a, b), float((a - b).abs().max())
    else:
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "method,max_grad_norm,value_only",
    [
        ("ppo", 0.5, False),
        ("rgpo", 0.5, False),
        ("awr", 0.5, False),
        ("ppo", 0.0, False),
        ("trpo", 0.5, True),
    ],
)
def test_uncompiled_functional_step_is_torchs_step_bit_for_bit(method, max_grad_norm, value_only):
    """Without compilation the written-out step (torch.func.grad, clip, Adam) is torch's eager step exactly:
    parameters, Adam moments and step counts, gradient statistics and the returned loss, over 30 steps with
    an annealed learning rate. So any difference under --compile comes from inductor's rounding alone."""
    outputs, (agent, opt), (twin, opt_f), g_sums = _run_both(
        method, False, 30, max_grad_norm, value_only, lr_schedule=True
    )
    for losses, grad_sqs in outputs:
        _assert_close(*losses, exact=True)
        _assert_close(*grad_sqs, exact=True)
    for p, q in zip(agent.parameters(), twin.parameters(), strict=True):
        _assert_close(p.detach(), q.detach(), exact=True)
        if p in opt.state:
            for key in ("step", "exp_avg", "exp_avg_sq"):
                _assert_close(opt.state[p][key], opt_f.state[q][key], exact=True)
    _assert_close(*g_sums, exact=True)
    assert float(opt_f.state[next(iter(opt_f.state))]["step"]) == 30


@needs_compiler
@pytest.mark.parametrize("method", ["rgpo", "trpo"])
def test_compiled_step_matches_eager_step_to_float_tolerance(method):
    """Under torch.compile the same 20 steps agree with the eager ones to float32 tolerance (inductor fuses
    and reorders float operations, so not bit for bit); the optimiser state stays torch.optim.Adam's, so an
    eager optimiser continues from it (checkpoints and resume work in both modes)."""
    value_only = method == "trpo"
    outputs, (agent, _), (twin, opt_f), g_sums = _run_both(method, True, 20, value_only=value_only)
    for (loss, loss_f), _ in outputs:
        torch.testing.assert_close(loss_f, loss, rtol=1e-4, atol=1e-6)
    for p, q in zip(agent.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(g_sums[1], g_sums[0], rtol=1e-4, atol=1e-6)
    fresh = torch.optim.Adam(opt_f.param_groups[0]["params"], lr=3e-4, eps=1e-5)
    fresh.load_state_dict(opt_f.state_dict())
    assert float(fresh.state_dict()["state"][0]["step"]) == 20


def _run_in_calls(method, compile, n_batches, steps_per_call):
    """`n_batches` eager torch steps, and the same batches through `CompiledAdamStep.run` on a twin agent."""
    module, args, agent, d = _setup(method)
    twin = copy.deepcopy(agent)
    extra = {"gate": module.rgpo_trl.make_gate("sigmoid")} if method == "rgpo" else {}

    def loss_fn(a, *batch):
        return module.minibatch_loss(a, *batch, args=args, **extra)

    opt_eager = torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5)
    opt_fast = torch.optim.Adam(twin.parameters(), lr=3e-4, eps=1e-5)
    fast = CompiledAdamStep(
        twin,
        opt_fast,
        loss_fn,
        list(twin.parameters()),
        0.5,
        twin.policy_parameters(),
        compile,
        steps_per_call,
    )
    gen = torch.Generator().manual_seed(1)
    keys = ("obs", "actions", "adv", "logprobs", "returns", "values")
    batches = [
        (*(d[k][torch.randperm(512, generator=gen)[:64]] for k in keys), *NO_WEIGHT.get(method, ()))
        for _ in range(n_batches)
    ]
    g_sum, eager = torch.zeros_like(fast.g_sum), []
    beta = (
        (0.5,) if method == "rgpo" else ()
    )  # RGPO's KL coefficient: a float eagerly, a tensor when compiled
    for batch in batches:
        loss, _ = loss_fn(agent, *batch, *beta)
        g_sq = _eager_step(
            agent, opt_eager, loss, list(agent.parameters()), agent.policy_parameters(), 0.5, g_sum
        )
        eager.append((loss.detach(), g_sq))
    fast_out = [(loss, g_sq) for loss, _, g_sq in fast.run([(*b, *map(torch.tensor, beta)) for b in batches])]
    return eager, fast_out, (agent, opt_eager), (twin, opt_fast), (g_sum, fast.g_sum)


@pytest.mark.parametrize("method", ["ppo", "awr"])
def test_run_makes_torchs_steps_in_calls_of_several(method):
    """`run` over 7 batches, 3 steps per call (calls of 3, 3 and 1): without compilation each step is torch's
    eager step bit for bit, so the Adam step counts and bias corrections carry across calls."""
    eager, fast, (agent, opt), (twin, opt_f), g_sums = _run_in_calls(method, False, 7, steps_per_call=3)
    for (loss, g_sq), (loss_f, g_sq_f) in zip(eager, fast, strict=True):
        _assert_close(loss, loss_f, exact=True)
        _assert_close(g_sq, g_sq_f, exact=True)
    for p, q in zip(agent.parameters(), twin.parameters(), strict=True):
        _assert_close(p.detach(), q.detach(), exact=True)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            _assert_close(opt.state[p][key], opt_f.state[q][key], exact=True)
    _assert_close(*g_sums, exact=True)


def test_run_is_lazy_and_steps_per_call_is_checked():
    """A consumer that stops after the first step leaves the batches after that call's steps untouched."""
    _, args, agent, d = _setup()
    opt = torch.optim.Adam(agent.critic.parameters(), lr=3e-4)
    module = load("trpo")

    def loss_fn(a, o, ret, val):
        return module.value_minibatch_loss(a, o, ret, val, args)

    step = CompiledAdamStep(agent, opt, loss_fn, list(agent.critic.parameters()), 0.5, compile=False)
    batches = [
        (d["obs"][i : i + 64], d["returns"][i : i + 64], d["values"][i : i + 64]) for i in range(0, 512, 64)
    ]
    next(step.run(batches))
    assert float(opt.state[next(agent.critic.parameters())]["step"]) == 4  # one call of 4 steps, not 8
    with pytest.raises(ValueError, match="steps_per_call must be >= 1, got 0"):
        CompiledAdamStep(
            agent, opt, loss_fn, list(agent.critic.parameters()), 0.5, compile=False, steps_per_call=0
        )


@needs_compiler
def test_compiled_run_in_calls_of_several_matches_eager_steps():
    """Compiled, 4 steps per call (calls of 4 and 2): the 6 steps agree with torch's eager ones to float32
    tolerance, as one step per call does."""
    eager, fast, (agent, _), (twin, _), g_sums = _run_in_calls("rgpo", True, 6, steps_per_call=4)
    for (loss, g_sq), (loss_f, g_sq_f) in zip(eager, fast, strict=True):
        torch.testing.assert_close(loss_f, loss, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(g_sq_f, g_sq, rtol=1e-3, atol=1e-6)
    for p, q in zip(agent.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(g_sums[1], g_sums[0], rtol=1e-4, atol=1e-6)


def test_compiled_step_refuses_an_optimiser_it_does_not_implement():
    _, _, agent, _ = _setup()
    opt = torch.optim.Adam(agent.parameters(), lr=3e-4, weight_decay=0.01)
    with pytest.raises(ValueError, match="weight_decay"):
        CompiledAdamStep(agent, opt, lambda a: None, list(agent.parameters()), 0.5, compile=False)


@needs_compiler
@pytest.mark.slow  # four compilations, ~30 s each on a loaded 2-core machine
@pytest.mark.parametrize("method", ["ppo", "rgpo", "trpo", "awr"])
def test_script_with_compile_follows_the_eager_run(method, tmp_path):
    """A 2-iteration run with --compile stays within float tolerance of the eager run (same seed): the rollout
    of iteration 2 already acts with the compiled update's parameters."""
    module = load(method)
    module.main(small_args(module, tmp_path, "eager", hidden_size=64))
    module.main(small_args(module, tmp_path, "compiled", hidden_size=64, compile=True))
    for ra, rb in zip(read_rows(tmp_path / "eager"), read_rows(tmp_path / "compiled"), strict=True):
        for key in ra.keys() - TIME_KEYS:
            assert rb[key] == pytest.approx(ra[key], rel=1e-3, abs=1e-5, nan_ok=True), key


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


def test_compile_without_a_cxx_compiler_fails_at_start_with_a_clear_error(tmp_path):
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [sys.executable, "-m", "rgpo_lab.mujoco_runner", "rgpo", "--compile", "--env-id", "Hopper-v4"]
    argv += ["--total-timesteps", "256"]
    argv += ["--num-steps", "256", "--output-dir", str(tmp_path), "--run-name", "nocxx", "--no-tensorboard"]
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "PYTHONPATH": root}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "--compile needs a C++ compiler" in proc.stderr and "run without --compile" in proc.stderr
    assert not (tmp_path / "nocxx" / "metrics.csv").exists()  # refused before the first rollout


def test_step_reads_the_learning_rate_of_a_reloaded_optimiser():
    """optimizer.load_state_dict replaces the param-group dicts; the step must follow the optimiser's current
    group (the scripts anneal the learning rate through it), not a group it saw at construction: with lr 0 set
    after a reload, a step leaves every parameter exactly as it was."""
    module, args, agent, d = _setup("ppo")
    opt = torch.optim.Adam(agent.parameters(), lr=3e-4, eps=1e-5)

    def loss_fn(a, *batch):
        return module.minibatch_loss(a, *batch, args=args)

    step = CompiledAdamStep(
        agent, opt, loss_fn, list(agent.parameters()), 0.5, agent.policy_parameters(), compile=False
    )
    batch = _minibatch("ppo", d, torch.arange(64))  # no decoupled weight
    step(*batch)
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    opt.param_groups[0]["lr"] = 0.0
    before = [p.detach().clone() for p in agent.parameters()]
    step(*batch)
    assert all(torch.equal(p, q) for p, q in zip(before, agent.parameters(), strict=True))
    assert float(opt.state[next(agent.parameters())]["step"]) == 2  # the reloaded state was the one advanced
