"""`--compile`'s update with 1, 2, 4 or 8 mini-batch steps per compiled call
(CompiledAdamStep.steps_per_call).

    python -m rgpo_lab.benchmarks.compiled_steps_per_call --out results/benchmarks/compiled_steps_per_call

It measures the lab runner (`rgpo_lab.mujoco_runner`, the scripts before issue 48; the single-file scripts in
mujoco_baselines/ have no --compile): "the scripts" below mean it.

One epoch of the scripts' update (32 mini-batches of 64 from a 2048-step batch, Hopper-v4 shapes) through
`CompiledAdamStep.run`, consumed as the scripts consume it (the loss checked, `float(grad_sq)`), for PPO's
step (actor and critic, gradient statistics) and TRPO's value step (critic only). Every variant starts from
the same agent and sees the same mini-batches in the same order, one epoch per variant per round in rotating
order; speed-up = median over rounds of the per-round time ratio to 1 step per call. After the last round the
parameters and Adam moments of every variant are compared with 1 step per call bit for bit. Compile time: the
first epoch's time minus the median epoch.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import statistics
import time

from rgpo_lab.benchmarks.common import RESULTS, run_info, write_outputs

STEPS_PER_CALL = [1, 2, 4, 8]


def measure(step: str, width: int, rounds: int, T: int = 2048, mb: int = 64) -> dict:
    import torch

    from rgpo_lab.mujoco_runner.compiled_update import CompiledAdamStep

    torch.set_num_threads(1)
    # dynamo counts the graphs of _pure_steps over all CompiledAdamStep objects of a process (a script has
    # one)
    torch._dynamo.config.recompile_limit = 64
    torch.manual_seed(0)
    script = "trpo" if step == "trpo_value" else "ppo"
    module = importlib.import_module(f"rgpo_lab.mujoco_runner.{script}_continuous_action")
    args = module.Args(hidden_size=width)
    agent = module.Agent(11, 3, args)
    obs, actions, adv, returns = torch.randn(T, 11), torch.randn(T, 3), torch.randn(T), torch.randn(T)
    with torch.no_grad():
        logprobs = agent.log_prob(agent.actor_mean(obs), actions) + 0.05 * torch.randn(T)
        values = agent.critic(obs).squeeze(-1)

    def make(k):
        a = copy.deepcopy(agent)
        if step == "trpo_value":
            params, stats = list(a.critic.parameters()), []

            def loss_fn(ag, o, ret, val):
                return module.value_minibatch_loss(ag, o, ret, val, args)
        else:
            params, stats = list(a.parameters()), a.policy_parameters()

            def loss_fn(ag, *batch):
                return module.minibatch_loss(ag, *batch, args=args)

        opt = torch.optim.Adam(params, lr=args.learning_rate, eps=args.adam_eps)
        return a, opt, CompiledAdamStep(a, opt, loss_fn, params, args.max_grad_norm, stats, steps_per_call=k)

    variants = {k: make(k) for k in STEPS_PER_CALL}

    def epoch(k, perm):
        if step == "trpo_value":
            batches = [(obs[i], returns[i], values[i]) for i in perm.split(mb)]
        else:
            batches = [
                (obs[i], actions[i], adv[i], logprobs[i], returns[i], values[i]) for i in perm.split(mb)
            ]
        for loss, _, g_sq in variants[k][2].run(batches):
            assert torch.isfinite(loss)
            float(g_sq)

    times: dict[int, list[float]] = {k: [] for k in STEPS_PER_CALL}
    first: dict[int, float] = {}
    for rnd in range(rounds + 1):
        perm = torch.randperm(T)
        order = STEPS_PER_CALL[rnd % len(STEPS_PER_CALL) :] + STEPS_PER_CALL[: rnd % len(STEPS_PER_CALL)]
        for k in order:
            t0 = time.perf_counter()
            epoch(k, perm)
            if rnd == 0:  # compiles
                first[k] = time.perf_counter() - t0
            else:
                times[k].append(time.perf_counter() - t0)
    ref_agent, ref_opt, _ = variants[1]
    identical = {}
    for k, (a, opt, _) in variants.items():
        same = all(torch.equal(p, q) for p, q in zip(ref_agent.parameters(), a.parameters(), strict=True))
        for p, q in zip(ref_opt.param_groups[0]["params"], opt.param_groups[0]["params"], strict=True):
            same &= all(torch.equal(ref_opt.state[p][s], opt.state[q][s]) for s in ("exp_avg", "exp_avg_sq"))
        identical[k] = same
    return {
        str(k): {
            "epoch_ms": statistics.median(times[k]) * 1e3,
            "ms_per_step": statistics.median(times[k]) * 1e3 / (T // mb),
            "speedup": statistics.median(a / b for a, b in zip(times[1], times[k], strict=True)),
            "compile_s": first[k] - statistics.median(times[k]),
            "bit_identical_to_1": identical[k],
        }
        for k in STEPS_PER_CALL
    }


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.compiled_steps_per_call",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default=os.path.join(RESULTS, "compiled_steps_per_call"))
    a = p.parse_args()
    results = {f"{s} w{w}": measure(s, w, a.rounds) for s in ("ppo", "trpo_value") for w in a.widths}
    info = run_info("compiled_steps_per_call", with_torch=True, rounds=a.rounds, results=results)
    lines = [
        "# `--compile`: mini-batch steps per compiled call",
        "",
        f"Command: `{info['command']}`  ",
        f"Machine: {info['machine']}; one torch thread, one process; load average at end "
        f"{', '.join(f'{x:.1f}' for x in info['load_average_at_end'])}. One epoch = 32 mini-batches of 64 "
        f"(Hopper-v4 shapes); {a.rounds} rounds, variants in rotating order; speed-up = median of per-round "
        "time ratios to 1 step per call; bit-identical = parameters and Adam moments after all epochs equal "
        "to 1 step per call's.",
        "",
        "| step | steps per call | ms per step | speed-up | compile s | bit-identical |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        for k, x in r.items():
            lines.append(
                f"| {name} | {k} | {x['ms_per_step']:.3f} | {x['speedup']:.2f}x | {x['compile_s']:.1f} | "
                f"{x['bit_identical_to_1']} |"
            )
    write_outputs(a.out, info, lines)


if __name__ == "__main__":
    main()
