"""Where the eager and the --compile paths of one seed part ways: one rollout of each, side by side.

    python -m rgpo_lab.benchmarks.check_mujoco_path_divergence --out results/benchmarks/mujoco_path_divergence

For each environment (seed 0, 2048 steps, the initial policy, no update), the eager rollout (torch's mean
action) and the compiled one (the same function in numpy, other float rounding) from the same seed: the first
step whose actions differ, the largest action difference, how far the observations drift apart by the
rollout's end, and the episode returns of both. Why main's eager runs and main_compiled's re-runs of the same
seeds are different runs, to be compared as distributions over seeds (the report's eager-vs-compiled section),
not seed by seed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rgpo_lab.benchmarks.common import RESULTS, run_info, write_outputs
from rgpo_lab.mujoco_grid import MUJOCO_ENVS as ENVS


def rollout(module, env_id: str, fast: bool):
    from rgpo_lab.mujoco_runner.common import Agent, MujocoEnv, Rollout, seed_everything

    args = module.Args(env_id=env_id, seed=0, num_steps=2048, tensorboard=False, verbose=False)
    seed_everything(args)
    env = MujocoEnv(args)
    ro = Rollout(args, env, Agent(env.obs_dim, env.act_dim, args), fast=fast)
    ro.collect()
    env.close()
    return ro.actions.clone(), ro.obs.clone(), list(ro.episode_returns)


def main() -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.check_mujoco_path_divergence",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default=os.path.join(RESULTS, "mujoco_path_divergence"))
    a = p.parse_args()
    module = importlib.import_module("rgpo_lab.mujoco_runner.ppo_continuous_action")
    rows = []
    for env_id in ENVS:
        (a0, o0, r0), (a1, o1, r1) = rollout(module, env_id, False), rollout(module, env_id, True)
        da = (a0 - a1).abs().amax(1)
        differ = (da > 0).nonzero()
        do = (o0 - o1).abs().amax(1)
        apart = (do > 1e-3).nonzero()
        rows.append(
            {
                "env": env_id,
                "first_differing_step": int(differ[0]) if len(differ) else None,
                "max_action_difference_first_10_steps": float(da[:10].max()),
                "first_step_observations_differ_by_1e-3": int(apart[0]) if len(apart) else None,
                "max_observation_difference": float(do.max()),
                "episode_returns_eager": r0,
                "episode_returns_compiled": r1,
            }
        )
    info = run_info("check_mujoco_path_divergence", True, rows=rows)
    lines = [
        "# Eager vs compiled: where one seed's rollouts part ways",
        "",
        f"Command: `{info['command']}`; {info['machine']}. Seed 0, 2048 steps of the initial policy.",
        "",
        "| env | first step whose actions differ | max action difference, steps 0-9 | first step whose "
        "observations differ by > 1e-3 | max observation difference | episodes eager / compiled | mean "
        "episode return eager / compiled |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e, c = r["episode_returns_eager"], r["episode_returns_compiled"]
        mean = lambda xs: f"{sum(xs) / len(xs):.1f}" if xs else "-"  # noqa: E731
        lines.append(
            f"| {r['env']} | {r['first_differing_step']} | {r['max_action_difference_first_10_steps']:.1e} | "
            f"{r['first_step_observations_differ_by_1e-3']} | {r['max_observation_difference']:.2g} | "
            f"{len(e)} / {len(c)} | {mean(e)} / {mean(c)} |"
        )
    write_outputs(a.out, info, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
