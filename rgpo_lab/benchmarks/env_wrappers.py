"""Environment-step cost: the MuJoCo scripts' hand-written env vs gymnasium's own wrappers (as CleanRL uses
them).

    OMP_NUM_THREADS=1 python -m rgpo_lab.benchmarks.env_wrappers [--steps 20000] [--rounds 5]

Three variants step the same environment with the same random actions, interleaved round by round:

- ``raw``: ``gym.make(env_id)`` stepped directly, reset on episode end (the physical limit of the scripts);
- ``ours``: the scripts' ``MujocoEnv`` (observation normalisation and clipping, reward scaling and clipping,
  explicit resets, raw episode returns), the lab runner's (``rgpo_lab.mujoco_runner.common``; each script in
  ``mujoco_baselines/`` inlines the same class, less its checkpoint state);
- ``gymnasium``: CleanRL's stack, ``SyncVectorEnv`` of one env with ``RecordEpisodeStatistics``,
  ``ClipAction``, ``NormalizeObservation``, ``TransformObservation`` (clip), ``NormalizeReward``,
  ``TransformReward`` (clip).

Reported: steps per second of each (median over rounds) and the ratios to ``raw``. The decision recorded in
``mujoco_baselines/README.md`` (keep the hand-written env or switch to the wrappers) quotes this output.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import time

import gymnasium as gym
import numpy as np

from rgpo_lab.benchmarks.common import RESULTS, invocation


def cleanrl_env(env_id: str, gamma: float = 0.99):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = gym.wrappers.ClipAction(env)
        env = gym.wrappers.NormalizeObservation(env)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)
        env = gym.wrappers.NormalizeReward(env, gamma=gamma)
        env = gym.wrappers.TransformReward(env, lambda reward: np.clip(reward, -10, 10))
        return env

    return gym.vector.SyncVectorEnv([thunk])


def time_raw(env_id, actions, seed):
    env = gym.make(env_id)
    env.reset(seed=seed)
    start = time.perf_counter()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset()
    return len(actions) / (time.perf_counter() - start)


def time_ours(module, env_id, actions, seed):
    env = module.MujocoEnv(module.Args(env_id=env_id))
    env.reset(seed=seed)
    start = time.perf_counter()
    for a in actions:
        env.step(a)
    return len(actions) / (time.perf_counter() - start)


def time_gymnasium(env_id, actions, seed):
    envs = cleanrl_env(env_id)
    envs.reset(seed=seed)
    start = time.perf_counter()
    for a in actions:
        envs.step(a[None])
    return len(actions) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.env_wrappers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--envs", nargs="+", default=["HalfCheetah-v4", "Walker2d-v4", "Hopper-v4", "Ant-v4"])
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=os.path.join(RESULTS, "env_wrappers"))
    args = p.parse_args()
    module = importlib.import_module("rgpo_lab.mujoco_runner.ppo_continuous_action")
    results = {}
    for env_id in args.envs:
        act_space = gym.make(env_id).action_space
        rng = np.random.default_rng(0)
        actions = rng.uniform(act_space.low, act_space.high, size=(args.steps, *act_space.shape)).astype(
            np.float32
        )
        sps = {"raw": [], "ours": [], "gymnasium": []}
        for r in range(args.rounds):
            order = ["raw", "ours", "gymnasium"]
            order = order[r % 3 :] + order[: r % 3]  # rotate the order between rounds
            for name in order:
                if name == "raw":
                    sps[name].append(time_raw(env_id, actions, r))
                elif name == "ours":
                    sps[name].append(time_ours(module, env_id, actions, r))
                else:
                    sps[name].append(time_gymnasium(env_id, actions, r))
        med = {k: statistics.median(v) for k, v in sps.items()}
        results[env_id] = {
            "sps": sps,
            "median_sps": med,
            "ours_over_raw": med["ours"] / med["raw"],
            "gymnasium_over_raw": med["gymnasium"] / med["raw"],
            "ours_over_gymnasium": med["ours"] / med["gymnasium"],
        }
        print(env_id, json.dumps(results[env_id]["median_sps"]), flush=True)
    command = invocation("env_wrappers")
    machine = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "gymnasium": gym.__version__,
        "loadavg_at_end": os.getloadavg(),
    }
    with open(args.out + ".json", "w") as f:
        json.dump(
            {
                "command": command,
                "machine": machine,
                "steps": args.steps,
                "rounds": args.rounds,
                "results": results,
            },
            f,
            indent=2,
        )
    lines = [
        "# Environment-step cost: hand-written env vs gymnasium wrappers",
        "",
        f"Command: `OMP_NUM_THREADS=1 {command}`  ",
        f"{args.steps} random-action steps per variant and round, {args.rounds} interleaved rounds; "
        f"gymnasium {gym.__version__}, {machine['platform']}, {os.cpu_count()} CPUs (load average at end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}).",
        "",
        "| env | raw env.step SPS | ours SPS | gymnasium wrappers SPS | ours / raw | wrappers / raw | "
        "ours / wrappers |",
        "|---|---|---|---|---|---|---|",
    ]
    for env_id, r in results.items():
        m = r["median_sps"]
        lines.append(
            f"| {env_id} | {m['raw']:.0f} | {m['ours']:.0f} | {m['gymnasium']:.0f} | "
            f"{r['ours_over_raw']:.2f} | {r['gymnasium_over_raw']:.2f} | {r['ours_over_gymnasium']:.2f}x |"
        )
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
