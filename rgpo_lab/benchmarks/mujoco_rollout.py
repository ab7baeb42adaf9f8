"""What a lighter per-step rollout path buys (a direction for faster rollouts; the scripts use
`lean_no_modules`).

    python -m rgpo_lab.benchmarks.mujoco_rollout --out results/benchmarks/mujoco_rollout

It measures the lab runner (`rgpo_lab.mujoco_runner`, the scripts before issue 48): "the script(s)" below
mean its RGPO, not the single-file scripts in mujoco_baselines/.

`base` is the scripts' rollout step before it: `agent.actor_mean(obs[step]) + std * noise[step]` through
`nn.Module` calls, the action written into a tensor, then `MujocoEnv.step`. Variants, in rotating order over
`--rounds` rounds of one 2048-step rollout each, in one process (median of the per-round time ratios to
`base`):

- `base2`: the script's step again (A/A: the noise floor of the ratios);
- `lean_modules`: `std * noise` once per rollout, the action written through a numpy view (modules kept);
- `lean_no_modules`: that, plus the policy mean as `F.linear`/`tanh` on the same weights without module calls;
- `numpy_mean`: the scripts' `--compile` rollout step: the policy mean computed by numpy on the same weights
  (`Agent.numpy_mean_action`, `np.tanh(W @ x + b)` in float32), the noise added in numpy: the same function
  with other kernels, so not the same rounding.

Every variant's actions are compared with `base`'s over all rounds: a variant that is not bit-identical is
flagged (the two `lean_*` paths are the same float operations in the same order; `numpy_mean` is not).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from rgpo_lab.benchmarks.common import RESULTS, run_info, write_outputs

VARIANTS = ["base", "base2", "lean_modules", "lean_no_modules", "numpy_mean"]


def make_rollout(script, args, variant: str, T: int):
    import torch

    torch.manual_seed(0)
    env = script.MujocoEnv(args)
    agent = script.Agent(env.obs_dim, env.act_dim, args)
    obs, actions = torch.zeros((T, env.obs_dim)), torch.zeros((T, env.act_dim))
    obs_np, actions_np = obs.numpy(), actions.numpy()
    state = {"next_obs": env.reset(seed=0)}
    gen = torch.Generator().manual_seed(1)
    # the scripts' module-free path (F.linear / tanh on the same weights) or the module calls
    mean = agent.mean_action if variant == "lean_no_modules" else agent.actor_mean

    def script_step():
        noise = torch.randn((T, env.act_dim), generator=gen)
        with torch.inference_mode():
            std = torch.exp(agent.actor_logstd)
            for step in range(T):
                obs_np[step] = state["next_obs"]
                action = agent.actor_mean(obs[step]) + std * noise[step]
                actions[step] = action
                state["next_obs"], _, _, _ = env.step(action.numpy())
        return actions.clone()

    def lean_step():
        noise = torch.randn((T, env.act_dim), generator=gen)
        with torch.inference_mode():
            scaled = torch.exp(agent.actor_logstd) * noise
            for step in range(T):
                obs_np[step] = state["next_obs"]
                action = mean(obs[step]).add_(scaled[step]).numpy()
                actions_np[step] = action
                state["next_obs"], _, _, _ = env.step(action)
        return actions.clone()

    def numpy_step():  # the scripts' --compile rollout step
        noise = torch.randn((T, env.act_dim), generator=gen)
        with torch.inference_mode():
            numpy_mean, noise_np = agent.numpy_mean_action(), (torch.exp(agent.actor_logstd) * noise).numpy()
            for step in range(T):
                obs_np[step] = state["next_obs"]
                action = numpy_mean(obs_np[step]) + noise_np[step]
                actions_np[step] = action
                state["next_obs"], _, _, _ = env.step(action)
        return actions.clone()

    return {"base": script_step, "base2": script_step, "numpy_mean": numpy_step}.get(variant, lean_step)


def measure(env_id: str, width: int, rounds: int, T: int = 2048) -> dict:
    import torch

    from rgpo_lab.mujoco_runner import rgpo_continuous_action as script

    torch.set_num_threads(1)
    args = script.Args(env_id=env_id, hidden_size=width)
    fns = {v: make_rollout(script, args, v, T) for v in VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    identical = dict.fromkeys(VARIANTS, True)
    for rnd in range(rounds):
        order = VARIANTS[rnd % len(VARIANTS) :] + VARIANTS[: rnd % len(VARIANTS)]
        out = {}
        for v in order:
            t0 = time.perf_counter()
            out[v] = fns[v]()
            times[v].append(time.perf_counter() - t0)
        for v in VARIANTS:
            identical[v] &= torch.equal(out["base"], out[v])
    return {
        v: {
            "us_per_step": statistics.median(times[v]) / T * 1e6,
            "speedup": statistics.median(a / b for a, b in zip(times["base"], times[v], strict=True)),
            "speedup_vs_eager": statistics.median(
                a / b for a, b in zip(times["lean_no_modules"], times[v], strict=True)
            ),
            "bit_identical": identical[v],
        }
        for v in VARIANTS
    }


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.mujoco_rollout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--envs", nargs="+", default=["Hopper-v4", "HalfCheetah-v4"])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", default=os.path.join(RESULTS, "mujoco_rollout"))
    a = p.parse_args()
    results = {e: measure(e, a.width, a.rounds) for e in a.envs}
    info = run_info("mujoco_rollout", with_torch=False, width=a.width, rounds=a.rounds, results=results)
    lines = [
        "# Rollout step: the script's path vs lighter paths",
        "",
        f"Command: `{info['command']}`  ",
        f"Machine: {info['machine']}; one torch thread; load average at end "
        f"{', '.join(f'{x:.1f}' for x in info['load_average_at_end'])} (two grid runs shared the cores: read "
        f"the interleaved ratios, not the absolute times). Width {a.width}, {a.rounds} rounds of one "
        "2048-step rollout per variant; speed-up = median of per-round time ratios to `base`.",
        "",
        "| env | variant | us/step | speed-up vs base | vs lean_no_modules (the scripts' eager step) | "
        "actions bit-identical to base |",
        "|---|---|---|---|---|---|",
    ]
    for env_id, r in results.items():
        for v, x in r.items():
            lines.append(
                f"| {env_id} | {v} | {x['us_per_step']:.0f} | {x['speedup']:.3f}x | "
                f"{x['speedup_vs_eager']:.3f}x | {x['bit_identical']} |"
            )
    write_outputs(a.out, info, lines)


if __name__ == "__main__":
    main()
