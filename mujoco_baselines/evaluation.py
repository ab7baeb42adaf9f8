"""Deterministic evaluation of a MuJoCo policy: the mean action, on an environment instance of its own, with the
training run's observation normalisation frozen.

The training return (mean of the last 100 stochastic training episodes) mixes exploration noise and a policy that
changes during those episodes; this is the number CleanRL-style reports call evaluation. It reads the agent and the
normalisation statistics and changes neither, draws nothing from Python's, NumPy's or torch's global random
streams (the evaluation environment is seeded on its own), so a run's training metrics are the same with and
without it, and a resumed run evaluates like an uninterrupted one.
"""

from __future__ import annotations

import csv
import os
import statistics

import gymnasium as gym
import numpy as np
import torch

EVAL_SEED_OFFSET = 10_000  # the evaluation environment's seed is the run's seed + this: never a training seed


def evaluate(env, agent, args) -> list[float]:
    """Undiscounted returns of ``args.eval_episodes`` episodes of ``agent.mean_action`` on a new ``args.env_id``
    environment, observations normalised with ``env``'s statistics as they are now (not updated)."""
    eval_env = gym.make(args.env_id)
    mean, std = env.obs_rms.mean.copy(), np.sqrt(env.obs_rms.var + 1e-8)
    returns = []
    try:
        obs, _ = eval_env.reset(seed=args.seed + EVAL_SEED_OFFSET)
        for _ in range(args.eval_episodes):
            total, done = 0.0, False
            while not done:
                x = np.asarray(obs, np.float64).reshape(-1)
                if args.norm_obs:
                    x = np.clip((x - mean) / std, -args.obs_clip, args.obs_clip)
                with torch.inference_mode():
                    action = agent.mean_action(torch.as_tensor(x, dtype=torch.float32)).numpy()
                obs, reward, terminated, truncated, _ = eval_env.step(np.clip(action, env.low, env.high))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
            obs, _ = eval_env.reset()
    finally:
        eval_env.close()
    return returns


def eval_summary(returns: list[float]) -> dict:
    """The final.json fields of an evaluation: mean, sample standard deviation (ddof 1) and every episode."""
    return {
        "eval_return_mean": statistics.fmean(returns) if returns else float("nan"),
        "eval_return_std": statistics.stdev(returns) if len(returns) > 1 else float("nan"),
        "eval_episodes": returns,
    }


def write_eval_csv(run_dir: str, rows: list[dict]) -> None:
    """eval.csv, one row per periodic evaluation (iteration, global_step, mean, std), rewritten whole each time."""
    path = os.path.join(run_dir, "eval.csv")
    with open(path + ".tmp", "w", newline="") as f:
        writer = csv.DictWriter(
            f, fieldnames=["iteration", "global_step", "eval_return_mean", "eval_return_std"]
        )
        writer.writeheader()
        writer.writerows(rows)
    os.replace(path + ".tmp", path)
