"""Per-environment score normalisation for the MuJoCo studies: what doing nothing and acting at random earn,
measured once and committed, and the on-policy level the confirmatory suites scale to.

    python -m rgpo_lab.mujoco_normalisation            # measures, writes results/mujoco/normalisation/

A normalised score is (R - R_low) / (R_high - R_low): R_low the better of the random-policy and the
zero-action baseline (below 0 a policy is worse than one of them; on Ant, standing still earns the healthy
reward of about 1 per step), R_high the mean deterministic evaluation return of the on-policy (L = 0) PPO
and RGPO runs at seeds 0-4 (main_compiled + annealed5, fixed before policy_lag_confirm). Run from the
repository root (rgpo_lab is the checkout's lab, not part of the installed package).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "results", "mujoco", "normalisation")
ENVS = ["HalfCheetah-v4", "Walker2d-v4", "Hopper-v4", "Ant-v4"]
EPISODES = 100
SEED = 0
# the on-policy reference runs: (suite, seeds), run name {env}__{method}__default__s{seed}__1000k
REFERENCE_RUNS = (("main_compiled", (0, 1, 2)), ("annealed5", (3, 4)))
REFERENCE_METHODS = ("ppo", "rgpo")


def baseline_returns(env_id: str, policy: str, episodes: int = EPISODES, seed: int = SEED) -> list[float]:
    """Undiscounted returns of ``episodes`` episodes of ``policy`` on the raw environment (no normalisation,
    the same reward the scripts' evaluation sums): ``random`` samples the action space uniformly (seeded),
    ``zero`` always acts 0. Episode i starts from reset(seed=seed + i)."""
    import gymnasium as gym

    if policy not in ("random", "zero"):
        raise ValueError(f"policy must be 'random' or 'zero', got {policy!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        env = gym.make(env_id)
    env.action_space.seed(seed)
    zero = np.zeros(env.action_space.shape, dtype=env.action_space.dtype)
    returns = []
    try:
        for i in range(episodes):
            env.reset(seed=seed + i)
            total, done = 0.0, False
            while not done:
                action = env.action_space.sample() if policy == "random" else zero
                _, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns


def reference_return(results: str, env_id: str) -> tuple[float, list[str]]:
    """R_high: the mean evaluation return of the on-policy reference runs of ``env_id``, and their names."""
    values, names = [], []
    for suite, seeds in REFERENCE_RUNS:
        for seed in seeds:
            for method in REFERENCE_METHODS:
                name = f"{env_id}__{method}__default__s{seed}__1000k"
                with open(os.path.join(results, suite, name, "final.json")) as f:
                    values.append(float(json.load(f)["eval_return_mean"]))
                names.append(f"{suite}/{name}")
    return float(np.mean(values)), names


class Normaliser:
    """(R - low) / (high - low) per environment, from the committed baselines.json."""

    def __init__(self, table: dict):
        self.table = table

    @classmethod
    def load(cls, path: str = os.path.join(OUT, "baselines.json")) -> Normaliser:
        with open(path) as f:
            return cls(json.load(f)["environments"])

    def low(self, env_id: str) -> float:
        e = self.table[env_id]
        return max(e["random"]["mean"], e["zero"]["mean"])

    def high(self, env_id: str) -> float:
        return self.table[env_id]["reference"]["mean"]

    def __call__(self, env_id: str, returns) -> np.ndarray:
        if env_id not in self.table:
            raise KeyError(f"no normalisation baseline for {env_id}; have {sorted(self.table)}")
        low, high = self.low(env_id), self.high(env_id)
        return (np.asarray(returns, float) - low) / (high - low)


def measure(results: str, envs=ENVS, episodes: int = EPISODES) -> dict:
    """Every environment's baselines and reference, with what made them."""
    from rgpo_lab.mujoco_drive import run_info

    table = {}
    for env_id in envs:
        entry = {}
        for policy in ("random", "zero"):
            returns = baseline_returns(env_id, policy, episodes)
            entry[policy] = {
                "mean": float(np.mean(returns)),
                "std": float(np.std(returns, ddof=1)),
                "returns": returns,
            }
            print(
                f"{env_id:15s} {policy:6s} {entry[policy]['mean']:9.2f} +- {entry[policy]['std']:.2f}",
                flush=True,
            )
        mean, names = reference_return(results, env_id)
        entry["reference"] = {"mean": mean, "runs": names}
        table[env_id] = entry
    return {
        "command": "python -m rgpo_lab.mujoco_normalisation",
        "episodes": episodes,
        "seed": SEED,
        "rule": "score = (R - max(random mean, zero mean)) / (reference mean - max(random mean, zero mean))",
        "machine": run_info(),
        "environments": table,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.mujoco_normalisation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", default=os.path.join(ROOT, "results", "mujoco"))
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    out = measure(args.results)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "baselines.json"), "w") as f:
        json.dump(out, f, indent=1, allow_nan=False)
    print(f"wrote {os.path.join(args.out, 'baselines.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
