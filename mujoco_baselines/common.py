"""What the four MuJoCo scripts share and is not the algorithm, in the role of CleanRL's ``cleanrl_utils``:
the environment with its normalisation, the agent network, checkpoints, run information, TensorBoard keys and
the deterministic evaluation. The scripts import it like any library; each keeps its algorithm (Args, rollout,
advantages, update, metrics) readable top to bottom.

The deterministic evaluation: the training return (mean of the last 100 stochastic training episodes) mixes
exploration noise and a policy that changes during those episodes; `evaluate` runs the mean action on an
environment instance of its own with the training run's observation normalisation frozen. It reads the agent
and the normalisation statistics and changes neither, and draws nothing from Python's, NumPy's or torch's
global random streams (the evaluation environment is seeded on its own), so a run's training metrics are the
same with and without it, and a resumed run evaluates like an uninterrupted one.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

import gymnasium as gym
import mujoco
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from rgpo_trl.cli import UsageError
from rgpo_trl.core.kl_control import PAPER_KL_DEFAULTS

# --------------------------------------------------------------------------------------------- #
# Environment: one gymnasium env, no vector wrapper. Resets are explicit (no autoreset, so no fake
# transitions), normalisation is done here with the same update rules as gymnasium's wrappers,
# and episode returns are the raw, unnormalised rewards.
# --------------------------------------------------------------------------------------------- #
SQRT2 = math.sqrt(2.0)


def _mujoco_warning(message: str) -> None:
    """MuJoCo's warnings as it prints them, less one: gymnasium's v4 model files still set `settotalmass`,
    which MuJoCo 3 reports as deprecated on every load of HalfCheetah or Ant, with nothing for a user to act
    on."""
    if "settotalmass" not in message:
        print(f"WARNING: {message}", file=sys.stderr, flush=True)


mujoco.set_mju_user_warning(_mujoco_warning)


class RunningMeanStd:
    """Running mean/var, the parallel update of gymnasium.wrappers.utils.RunningMeanStd (count 1)."""

    def __init__(self, shape=(), epsilon=1e-4):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update_one(self, x):
        delta = x - self.mean
        tot = self.count + 1.0
        self.mean = self.mean + delta / tot
        self.var = (self.var * self.count + delta * delta * (self.count / tot)) / tot
        self.count = tot


def check_env(env_id: str) -> None:
    """A misspelt id (with gymnasium's suggestion) or an environment without continuous actions and Box
    observations: refused at start, before the run directory exists."""
    try:
        with warnings.catch_warnings():  # the v4 ids' deprecation notice: shown once, by the training env
            warnings.simplefilter("ignore", DeprecationWarning)
            env = gym.make(env_id)
    except gym.error.Error as err:
        raise UsageError(f"env_id: {err}") from err
    try:
        for what, space in (("action", env.action_space), ("observation", env.observation_space)):
            if not isinstance(space, gym.spaces.Box):
                raise UsageError(
                    f"env_id {env_id!r} has a {type(space).__name__} {what} space; these scripts need Box "
                    "(continuous) actions and observations, e.g. HalfCheetah-v4, Walker2d-v4, Hopper-v4, "
                    "Ant-v4"
                )
    finally:
        env.close()


class MujocoEnv:
    def __init__(self, args):
        self.env = gym.make(args.env_id)
        if not isinstance(self.env.action_space, gym.spaces.Box) or not isinstance(
            self.env.observation_space, gym.spaces.Box
        ):
            raise UsageError(f"env_id {args.env_id!r}: only Box actions and observations (see check_env)")
        self.obs_dim = int(np.prod(self.env.observation_space.shape))
        self.act_dim = int(np.prod(self.env.action_space.shape))
        self.low, self.high = self.env.action_space.low, self.env.action_space.high
        self.norm_obs, self.norm_reward = args.norm_obs, args.norm_reward
        self.obs_clip, self.reward_clip, self.gamma = args.obs_clip, args.reward_clip, args.gamma
        self.obs_rms = RunningMeanStd((self.obs_dim,))
        self.ret_rms = RunningMeanStd(())
        self.discounted = 0.0
        self.ep_return, self.ep_length = 0.0, 0

    def _obs(self, obs):
        obs = np.asarray(obs, np.float64).reshape(-1)
        if self.norm_obs:
            self.obs_rms.update_one(obs)
            obs = np.clip(
                (obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8), -self.obs_clip, self.obs_clip
            )
        return obs

    def reset(self, seed=None):
        obs, _ = self.env.reset(seed=seed)
        if seed is not None:
            self.env.action_space.seed(seed)
        self.ep_return, self.ep_length = 0.0, 0
        return self._obs(obs)

    def step(self, action):
        """-> (normalised next obs, scaled reward, done, finished episode (return, length) or None)."""
        obs, reward, terminated, truncated, _ = self.env.step(np.clip(action, self.low, self.high))
        reward = float(reward)
        self.ep_return += reward
        self.ep_length += 1
        if self.norm_reward:
            # gymnasium NormalizeReward: the discounted return is only reset on termination
            self.discounted = self.discounted * self.gamma * (1.0 - float(terminated)) + reward
            self.ret_rms.update_one(self.discounted)
            reward = reward / math.sqrt(self.ret_rms.var + 1e-8)
            reward = min(max(reward, -self.reward_clip), self.reward_clip)
        done = terminated or truncated
        episode = None
        if done:
            episode = (self.ep_return, self.ep_length)
            obs, _ = self.env.reset()
            self.ep_return, self.ep_length = 0.0, 0
        return self._obs(obs), reward, done, episode

    def close(self):
        self.env.close()

    def _time_limit(self):
        env = self.env
        while not isinstance(env, gym.wrappers.TimeLimit):
            env = env.env
        return env

    def state_dict(self) -> dict:
        """Normalisation statistics, the episode in progress and the simulator state (mj_getState with
        mjSTATE_INTEGRATION: positions, velocities, controls, solver warm-start), so a resumed run
        continues the same episode bit for bit."""
        u = self.env.unwrapped
        sim = np.empty(mujoco.mj_stateSize(u.model, mujoco.mjtState.mjSTATE_INTEGRATION))
        mujoco.mj_getState(u.model, u.data, sim, mujoco.mjtState.mjSTATE_INTEGRATION)
        return {
            "obs_rms": [
                torch.from_numpy(self.obs_rms.mean.copy()),
                torch.from_numpy(self.obs_rms.var.copy()),
                self.obs_rms.count,
            ],
            "ret_rms": [float(self.ret_rms.mean), float(self.ret_rms.var), self.ret_rms.count],
            "discounted": self.discounted,
            "episode": [self.ep_return, self.ep_length, self._time_limit()._elapsed_steps],
            "sim": torch.from_numpy(sim),
            "np_random": u.np_random.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        u = self.env.unwrapped
        mean, var, self.obs_rms.count = state["obs_rms"]
        self.obs_rms.mean, self.obs_rms.var = mean.numpy().copy(), var.numpy().copy()
        mean, var, self.ret_rms.count = state["ret_rms"]
        self.ret_rms.mean, self.ret_rms.var = np.float64(mean), np.float64(var)
        self.discounted = state["discounted"]
        self.ep_return, self.ep_length, self._time_limit()._elapsed_steps = state["episode"]
        mujoco.mj_setState(u.model, u.data, state["sim"].numpy(), mujoco.mjtState.mjSTATE_INTEGRATION)
        u.np_random.bit_generator.state = state["np_random"]


# --------------------------------------------------------------------------------------------- #
# Checkpoints: what a run needs to continue exactly where it stopped (networks, optimiser, the
# environment with its normalisation statistics and simulator state, RNG states, episode counters,
# method state). Saved atomically every `checkpoint_every` iterations, loaded with
# torch.load(weights_only=True); a checkpoint of another configuration or an unreadable one is refused.
# --------------------------------------------------------------------------------------------- #
RESUME_FREE_ARGS = {
    "output_dir",
    "run_name",
    "tensorboard",
    "verbose",
    "checkpoint_every",
    "checkpoint_dir",
    "resume",
    "keep_checkpoint",
    "eval_episodes",  # evaluation reads the run and changes nothing in it
    "eval_every",
    "compile",  # both modes keep the same state (compiled_update.py), so either may continue a run
}


class CheckpointError(RuntimeError):
    pass


def checkpoint_args(args) -> dict:
    return {k: v for k, v in asdict(args).items() if k not in RESUME_FREE_ARGS}


def rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict) -> None:
    random.setstate(tuple(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])


def save_checkpoint(path: str, checkpoint: dict) -> None:
    torch.save(checkpoint, path + ".tmp")
    os.replace(path + ".tmp", path)  # atomic: an interrupted save leaves the previous checkpoint intact


def load_checkpoint(path: str, args) -> dict:
    """The checkpoint at `path`, checked (readable, complete, same configuration) before anything is
    loaded."""
    try:
        checkpoint = torch.load(path, weights_only=True)
    except Exception as err:
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({err}); delete it to restart the run"
        ) from err
    missing = {"args", "progress", "rng", "next_obs"} - set(
        checkpoint if isinstance(checkpoint, dict) else {}
    )
    if missing:
        raise CheckpointError(
            f"checkpoint {path} is incomplete (missing {sorted(missing)}); delete it to restart"
        )
    saved, current = checkpoint["args"], checkpoint_args(args)
    defaults = {f.name: f.default for f in fields(args)}
    # a field added after the checkpoint was written is no difference while it keeps its default
    saved = {**{k: v for k, v in current.items() if k not in saved and v == defaults.get(k)}, **saved}
    diff = [
        f"{k}: {saved.get(k)!r} -> {current.get(k)!r}"
        for k in sorted(set(saved) | set(current))
        if saved.get(k) != current.get(k)
    ]
    if diff:
        raise CheckpointError(
            f"checkpoint {path} was written with another configuration ({'; '.join(diff)}); "
            "run with the same arguments, or delete the checkpoint to restart"
        )
    return checkpoint


def run_info() -> dict:
    """Machine, package versions and the git commit, written next to every run's results."""
    try:
        root = os.path.dirname(os.path.abspath(__file__))
        commit = (
            subprocess.run(
                ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "git_commit": commit,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "gymnasium": gym.__version__,
        "mujoco": mujoco.__version__,
    }


def layer_init(layer, std=SQRT2, bias_const=0.0, ortho=True):
    if ortho:
        torch.nn.init.orthogonal_(layer.weight, std)
        torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim, act_dim, args):
        super().__init__()
        h, o = args.hidden_size, args.ortho_init
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, h), ortho=o),
            nn.Tanh(),
            layer_init(nn.Linear(h, h), ortho=o),
            nn.Tanh(),
            layer_init(nn.Linear(h, 1), std=1.0, ortho=o),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, h), ortho=o),
            nn.Tanh(),
            layer_init(nn.Linear(h, h), ortho=o),
            nn.Tanh(),
            layer_init(nn.Linear(h, act_dim), std=0.01, ortho=o),
        )
        self.actor_logstd = nn.Parameter(torch.full((act_dim,), float(args.init_logstd)))

    def mean_action(self, x):
        """actor_mean(x) as F.linear / tanh on the same weights, without the nn.Module calls (the rollout's
        per-step path; bit-identical to actor_mean)."""
        l0, _, l2, _, l4 = self.actor_mean
        h = torch.tanh(F.linear(x, l0.weight, l0.bias))
        h = torch.tanh(F.linear(h, l2.weight, l2.bias))
        return F.linear(h, l4.weight, l4.bias)

    def numpy_mean_action(self):
        """actor_mean as a numpy function on views of the same weights (`W @ x + b`, tanh; they follow every
        in-place update): the same function with other kernels, so other float rounding. --compile's rollout
        step (speed: results/benchmarks/mujoco_rollout.md)."""
        (w0, b0), (w1, b1), (w2, b2) = [
            (lin.weight.detach().numpy(), lin.bias.detach().numpy()) for lin in self.actor_mean[::2]
        ]
        return lambda x: w2 @ np.tanh(w1 @ np.tanh(w0 @ x + b0) + b1) + b2

    def policy_parameters(self):
        return [*self.actor_mean.parameters(), self.actor_logstd]

    def log_prob(self, mean, action):
        """Diagonal-Gaussian log-density of `action`, summed over action dims."""
        z = (action - mean) * torch.exp(-self.actor_logstd)
        return -0.5 * (z * z).sum(-1) - (
            self.actor_logstd.sum() + 0.5 * mean.shape[-1] * math.log(2 * math.pi)
        )

    def entropy(self):
        return self.actor_logstd.sum() + 0.5 * self.actor_logstd.numel() * (1.0 + math.log(2 * math.pi))


class NonFiniteLossError(FloatingPointError):
    pass


def check_finite(loss, pg_loss, v_loss, iteration, epoch, minibatch):
    if not torch.isfinite(loss):
        raise NonFiniteLossError(
            f"non-finite loss at iteration {iteration} (epoch {epoch}, mini-batch {minibatch}): "
            f"policy_loss={pg_loss.item()}, value_loss={v_loss.item()}; stopping instead of training on "
            "garbage"
        )


def write_tensorboard(writer, row, global_step, tb_keys):
    for key, value in row.items():
        if key in ("iteration", "global_step", "time", "episodic_return", "episodes"):
            continue
        writer.add_scalar(tb_keys.get(key, f"stats/{key}"), value, global_step)


# --------------------------------------------------------------------------------------------- #
# Deterministic evaluation (see the module docstring).
# --------------------------------------------------------------------------------------------- #
EVAL_SEED_OFFSET = 10_000  # the evaluation environment's seed is the run's seed + this: never a training seed


def evaluate(env, agent, args) -> list[float]:
    """Undiscounted returns of ``args.eval_episodes`` episodes of ``agent.mean_action`` on a new
    ``args.env_id`` environment, observations normalised with ``env``'s statistics as they are now (not
    updated)."""
    with warnings.catch_warnings():  # the v4 ids' deprecation notice was shown by the training env
        warnings.simplefilter("ignore", DeprecationWarning)
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
    """eval.csv, one row per periodic evaluation (iteration, global_step, mean, std), rewritten whole each
    time."""
    path = os.path.join(run_dir, "eval.csv")
    with open(path + ".tmp", "w", newline="") as f:
        writer = csv.DictWriter(
            f, fieldnames=["iteration", "global_step", "eval_return_mean", "eval_return_std"]
        )
        writer.writeheader()
        writer.writerows(rows)
    os.replace(path + ".tmp", path)


# --------------------------------------------------------------------------------------------- #
# The run around the algorithm: setup, rollout, advantages, the update step (eager or --compile, chosen once),
# per-iteration metrics, logging, checkpoints, the end of the run.
# --------------------------------------------------------------------------------------------- #
def resolve_args(args) -> None:
    """The derived fields (batch_size, num_iterations) and every check that needs no environment step, before
    anything is created: a bad input exits with one line and leaves no run directory. Says up front when
    total_timesteps is not a whole number of iterations."""
    args.batch_size = args.num_steps
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations < 1:
        raise UsageError(
            f"total_timesteps must be >= num_steps ({args.num_steps}), got {args.total_timesteps}"
        )
    if args.batch_size % args.minibatch_size:
        raise UsageError(
            f"num_steps ({args.num_steps}) must be a multiple of minibatch_size ({args.minibatch_size})"
        )
    if hasattr(args, "policy_lag"):
        check_stale_sample_args(args)
    check_env(args.env_id)
    steps = args.num_iterations * args.batch_size
    if steps != args.total_timesteps:
        print(
            f"total_timesteps {args.total_timesteps} is not a multiple of num_steps {args.num_steps}: "
            f"running {args.num_iterations} iterations = {steps} steps",
            flush=True,
        )


def cli(main, args_class, description: str) -> None:
    """A script's entry point: tyro parses ``args_class`` (``--help`` starts with ``description``), ``main``
    runs; a bad input, an unusable checkpoint or a non-finite loss exits with one line (``--debug``: the
    traceback)."""
    import tyro

    from rgpo_trl.cli import run_main

    errors = (UsageError, CheckpointError, NonFiniteLossError)
    # parsed inside run_main, once it has taken --debug out of sys.argv
    sys.exit(run_main(lambda: main(tyro.cli(args_class, description=description)), errors=errors))


def seed_everything(args) -> None:
    """CleanRL's seeding block (Python, NumPy, torch) and the torch thread count."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)


class Rollout:
    """One environment's rollout storage and episode bookkeeping. Per step only the policy mean is evaluated
    (the noise is drawn and scaled once per rollout); log-probs and values are computed for the whole batch
    afterwards. The per-step mean is chosen once: torch on the module's weights (bit-identical to
    ``actor_mean``), or with ``fast`` (--compile) the numpy form on views of the same weights (the same
    function, other rounding)."""

    def __init__(
        self, args, env: MujocoEnv, agent: nn.Module, fast: bool = False, actor: nn.Module | None = None
    ):
        T = args.num_steps
        # `actor` acts and gives the behaviour log-probs (an older copy under --policy-lag); `agent`'s critic
        # values
        self.env, self.agent, self.actor = env, agent, agent if actor is None else actor
        self.obs, self.actions = torch.zeros((T, env.obs_dim)), torch.zeros((T, env.act_dim))
        self.rewards = np.zeros(T, np.float64)
        self.dones = np.zeros(T, np.float64)  # dones[t]: obs[t] is the first observation of a new episode
        self.obs_np, self.actions_np = self.obs.numpy(), self.actions.numpy()
        self.episode_returns, self.episode_lengths = [], []
        self.first_new_episode = 0  # episode_returns[first_new_episode:]: the episodes the last collect ended
        self.global_step = 0
        self.next_obs, self.next_done = env.reset(seed=args.seed), 0.0
        self._numpy_mean = self.actor.numpy_mean_action() if fast else None
        self._action = self._numpy_action if fast else self._torch_action

    def _torch_action(self, step, scaled_noise, noise_np):
        return self.actor.mean_action(self.obs[step]).add_(scaled_noise[step]).numpy()

    def _numpy_action(self, step, scaled_noise, noise_np):
        return self._numpy_mean(self.obs_np[step]) + noise_np[step]

    def collect(self, writer=None):
        """Fill the storage with the next ``num_steps`` steps; returns (values and value of the next
        observation under the current critic, log-probs of the actions under the acting actor: the behaviour
        policy)."""
        agent, actor, T = self.agent, self.actor, len(self.rewards)
        self.first_new_episode = len(self.episode_returns)
        noise = torch.randn((T, self.env.act_dim))
        with torch.inference_mode():
            scaled_noise = torch.exp(actor.actor_logstd) * noise
            noise_np = scaled_noise.numpy()
            for step in range(T):
                self.obs_np[step] = self.next_obs
                self.dones[step] = self.next_done
                action = self._action(step, scaled_noise, noise_np)
                self.actions_np[step] = action
                self.next_obs, self.rewards[step], self.next_done, episode = self.env.step(action)
                if episode is not None:
                    self.episode_returns.append(episode[0])
                    self.episode_lengths.append(episode[1])
                    if writer is not None:
                        writer.add_scalar("charts/episodic_return", episode[0], self.global_step + step + 1)
                        writer.add_scalar("charts/episodic_length", episode[1], self.global_step + step + 1)
            self.global_step += T
            b_values = agent.critic(self.obs).squeeze(-1)
            next_value = float(agent.critic(torch.as_tensor(self.next_obs, dtype=torch.float32)))
            b_logprobs = actor.log_prob(actor.actor_mean(self.obs), self.actions)
        return b_values, next_value, b_logprobs

    def state(self) -> tuple[dict, torch.Tensor]:
        """What a checkpoint keeps of the rollout: its step counter, finished episodes and the episode in
        progress (entries of the checkpoint's ``progress``) and the next observation (its ``next_obs``)."""
        progress = {
            "global_step": self.global_step,
            "episode_returns": self.episode_returns,
            "episode_lengths": self.episode_lengths,
            "next_done": self.next_done,
        }
        return progress, torch.from_numpy(np.array(self.next_obs))

    def restore(self, progress: dict, next_obs: torch.Tensor) -> None:
        """Continue from a checkpoint's `state`: the next rollout starts where the saved run's would have."""
        self.global_step = progress["global_step"]
        self.episode_returns, self.episode_lengths = progress["episode_returns"], progress["episode_lengths"]
        self.next_obs, self.next_done = next_obs.numpy().copy(), progress["next_done"]

    def advantages(self, b_values, next_value, gamma: float, gae_lambda: float):
        """GAE in float64 numpy: (advantages, values) as float64 arrays."""
        T = len(self.rewards)
        values_np = b_values.numpy().astype(np.float64)
        adv_np = np.zeros(T, np.float64)
        lastgaelam = 0.0
        for t in reversed(range(T)):
            if t == T - 1:
                nextnonterminal, nextvalues = 1.0 - self.next_done, next_value
            else:
                nextnonterminal, nextvalues = 1.0 - self.dones[t + 1], values_np[t + 1]
            delta = self.rewards[t] + gamma * nextvalues * nextnonterminal - values_np[t]
            adv_np[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        return adv_np, values_np


def check_stale_sample_args(args) -> None:
    """--policy-lag / --max-is-weight out of range: refused at start, naming the field."""
    if args.policy_lag < 0:
        raise UsageError(f"policy_lag must be an integer >= 0 (0: on-policy), got {args.policy_lag}")
    if not args.max_is_weight > 0:
        raise UsageError(f"max_is_weight must be > 0, got {args.max_is_weight}")


class PolicyLag:
    """``--policy-lag L``: iteration t's rollout is collected by the actor of iteration t - L (the actor as it
    was when iteration max(1, t - L) began), as in asynchronous actor-learner systems whose actors run behind
    the learner. A ring of the last L + 1 actors' weights; ``actor`` is a copy of the agent loaded from the
    oldest entry before each rollout, so the rollout's actions and behaviour log-probs are that actor's. The
    critic is never lagged. L = 0: ``actor`` is the agent itself and nothing is copied (the runs of before,
    bit for bit)."""

    def __init__(self, agent: nn.Module, lag: int):
        if lag < 0:
            raise ValueError(f"policy_lag must be >= 0, got {lag}")
        self.agent, self.lag = agent, lag
        self.actor = agent if lag == 0 else copy.deepcopy(agent)
        self.ring: deque[list[torch.Tensor]] = deque(maxlen=lag + 1)

    def advance(self) -> None:
        """Before iteration t's rollout: remember the agent's actor, act with the one of iteration t - L."""
        if self.lag == 0:
            return
        self.ring.append([p.detach().clone() for p in self.agent.policy_parameters()])
        with torch.no_grad():
            for p, saved in zip(self.actor.policy_parameters(), self.ring[0], strict=True):
                p.copy_(saved)

    @torch.no_grad()
    def proximal_log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi_prox of the rollout: the learner as the update starts (the decoupled objectives' anchor)."""
        return self.agent.log_prob(self.agent.actor_mean(obs), actions)

    def state_dict(self) -> dict:
        return {"lag": self.lag, "ring": [list(entry) for entry in self.ring]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("lag") != self.lag:
            raise CheckpointError(f"checkpoint's policy lag {state.get('lag')} is not this run's {self.lag}")
        self.ring = deque([list(entry) for entry in state["ring"]], maxlen=self.lag + 1)


def truncated_weight(
    prox_logprob: torch.Tensor, behaviour_logprob: torch.Tensor, max_weight: float
) -> torch.Tensor:
    """The decoupled objectives' importance weight min(pi_prox / pi_behaviour, max_weight) (Hilton et al.,
    2021, truncated as V-trace truncates its rho); exactly 1 where the two log-probs are equal."""
    return (prox_logprob - behaviour_logprob).exp().clamp(max=max_weight)


def behaviour_ratio_stats(prox_logprob: torch.Tensor, behaviour_logprob: torch.Tensor) -> dict[str, float]:
    """How stale the rollout is as the update starts: r_b = pi_prox / pi_behaviour over the batch (mean, max,
    the share with max(r_b, 1 / r_b) beyond 1.2 and beyond 2) and KLhat(pi_prox, pi_behaviour)."""
    log_r = prox_logprob.double() - behaviour_logprob.double()
    far = log_r.abs()
    return {
        "behaviour_ratio_mean": float(log_r.exp().mean()),
        "behaviour_ratio_max": float(log_r.exp().max()),
        "behaviour_ratio_beyond_1.2": float((far > math.log(1.2)).double().mean()),
        "behaviour_ratio_beyond_2": float((far > math.log(2.0)).double().mean()),
        "behaviour_kl": float((torch.expm1(log_r) - log_r).mean()),
    }


def minibatches(idxs, *tensors, shared: tuple = ()) -> list[tuple]:
    """One tuple per mini-batch index set: each tensor indexed, a None (an input the variant does not use)
    kept, then the ``shared`` inputs of every mini-batch (e.g. RGPO's beta)."""
    return [(*(None if t is None else t[idx] for t in tensors), *shared) for idx in idxs]


class UpdateStep:
    """The mini-batch optimiser step, eager or --compile (`CompiledAdamStep`: the same step as one compiled
    function, 4 mini-batches per call), chosen once at setup behind one call:
    ``steps(batches, iteration, epoch)`` yields each mini-batch's (loss, aux) after its step. ``loss_fn(agent,
    *batch)`` returns (loss, aux), aux (new log-probs, policy loss, value loss, ...); a value-only step's aux
    is its value loss, and ``begin_iteration`` gets the iteration's policy loss. A non-finite loss stops the
    run before its step, with both losses in the message. It accumulates the statistics of the gradient
    variance (the gradients of ``tracked`` parameters, before clipping): ``g_sum``, ``g_sqsum``."""

    def __init__(
        self,
        agent,
        optimizer,
        loss_fn,
        params,
        max_grad_norm: float,
        tracked=None,
        fast: bool = False,
    ):
        self.agent, self.optimizer, self.loss_fn = agent, optimizer, loss_fn
        self.policy_loss = None  # the iteration's policy loss, for a value-only step (begin_iteration)
        self.params, self.max_grad_norm, self.tracked = list(params), max_grad_norm, tracked
        self.n_tracked = sum(p.numel() for p in tracked) if tracked else 0
        self.compiled = None
        if fast:
            from mujoco_baselines.compiled_update import CompiledAdamStep, check_compiler

            check_compiler()
            self.compiled = CompiledAdamStep(
                agent, optimizer, loss_fn, self.params, max_grad_norm, tracked or ()
            )
        self.steps = self._compiled_steps if self.compiled is not None else self._eager_steps
        # a per-iteration scalar input of the loss (e.g. RGPO's beta): a float for the eager step, a tensor
        # for the compiled one (a new Python float would make torch.compile recompile)
        self.scalar = torch.tensor if self.compiled is not None else float
        self.g_sum, self.g_sqsum = None, 0.0

    def begin_iteration(self, policy_loss=None) -> None:
        """Before an iteration's steps; ``policy_loss``: the iteration's, where the steps train the value
        only."""
        self.g_sum = torch.zeros(self.n_tracked) if self.compiled is None else self.compiled.g_sum.zero_()
        self.g_sqsum = 0.0
        self.policy_loss = policy_loss

    def check(self, loss, aux, iteration: int, epoch: int, minibatch: int) -> None:
        """Stops the run on a non-finite loss, before its step."""
        if self.policy_loss is None:
            check_finite(loss, aux[1], aux[2], iteration, epoch, minibatch)
        else:
            check_finite(loss, self.policy_loss, aux, iteration, epoch, minibatch)

    def _eager_steps(self, batches, iteration, epoch):
        for j, batch in enumerate(batches):
            loss, aux = self.loss_fn(self.agent, *batch)
            self.check(loss, aux, iteration, epoch, j)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.tracked:  # gradient variance: policy-parameter gradients before clipping
                g = torch.cat([p.grad.reshape(-1) for p in self.tracked])
                self.g_sum += g
                self.g_sqsum += float(g.dot(g))
            if self.max_grad_norm > 0:
                nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            self.optimizer.step()
            yield loss, aux

    def _compiled_steps(self, batches, iteration, epoch):
        fast = self.compiled.run(batches)  # lazy: 4 steps per compiled call; g_sum is accumulated inside
        for j in range(len(batches)):
            loss, aux, g_sq = next(fast)
            self.check(loss, aux, iteration, epoch, j)  # the run stops
            if self.tracked:
                self.g_sqsum += float(g_sq)
            yield loss, aux

    def grad_var(self, n_mb: int) -> float:
        return gradient_variance(self.g_sum, self.g_sqsum, n_mb, self.n_tracked)


def gradient_variance(g_sum, g_sqsum: float, n_mb: int, n_params: int) -> float:
    """Per-parameter variance of the policy gradient over an iteration's ``n_mb`` mini-batches, from the sum
    of the gradients and of their squared norms (before clipping)."""
    g_mean = g_sum.double() / n_mb
    return max(g_sqsum / n_mb - float(g_mean.dot(g_mean)), 0.0) / n_params


# --------------------------------------------------------------------------------------------- #
# An iteration's metrics: the statistics of its update by name, its timings, and the row of metrics.csv.
# --------------------------------------------------------------------------------------------- #
# The adaptive KL controller's defaults (the paper's beta_0, target and bounds of beta) are written once, in
# rgpo_trl.core.PAPER_KL_DEFAULTS, which RGPO's flags read; a 'KL spike' is an iteration whose
# KL to pi_old exceeds twice the target (every script's --spike-kl default).
SPIKE_KL = 2 * PAPER_KL_DEFAULTS["kl_target"]


class MinibatchStats:
    """Named statistics of an iteration's mini-batches, one value per mini-batch: ``add(kl=..., ess=...)``
    appends the values of one mini-batch (0-d tensors) or of several (1-d tensors, e.g. an epoch's), always
    under the same names. Kept as the tensors they come in and joined once, so adding costs one stack."""

    def __init__(self):
        self.names: tuple[str, ...] = ()
        self._blocks: list[torch.Tensor] = []  # (mini-batches, len(names)) each

    def add(self, **values: torch.Tensor) -> None:
        names = tuple(values)
        if not self._blocks:
            self.names = names
        elif names != self.names:
            raise ValueError(f"statistics {names} added where {self.names} were")
        self._blocks.append(torch.stack(list(values.values()), dim=-1).reshape(-1, len(names)))

    def __len__(self) -> int:
        """The number of mini-batches."""
        return sum(block.shape[0] for block in self._blocks)

    def mean(self, name: str) -> float:
        """The mean of ``name`` over the mini-batches so far, in float32 (the early stops' test)."""
        return float(torch.cat(self._blocks)[:, self.names.index(name)].mean())

    def arrays(self) -> dict[str, np.ndarray]:
        """Every statistic as a float64 array over the mini-batches, in the order of ``names``."""
        table = torch.cat(self._blocks).double().numpy()
        return {name: table[:, j] for j, name in enumerate(self.names)}


@dataclass
class UpdateSummary:
    """What an iteration's update gives its row of metrics.csv."""

    stats: MinibatchStats
    """per mini-batch: ``kl`` (to pi_old) and ``ess``, then the method's own statistics (``*_max`` reported
    as the maximum over the mini-batches, the others as the mean)"""
    losses: MinibatchStats
    """per mini-batch step: ``policy_loss`` and ``value_loss``"""
    epochs: int
    """epochs run (fewer than update_epochs after an early stop)"""
    kl_final: float
    """KL of the iteration's final policy to pi_old over the whole batch"""
    grad_var: float
    """per-parameter variance of the policy gradient over the mini-batches (`gradient_variance`)"""


class IterationTimes(NamedTuple):
    start: float  # time.perf_counter() as the iteration started
    rollout: float  # seconds
    update: float  # seconds


class TrainingRun:
    """A training run's directory and life: config.json (every flag, machine, versions, commit), TensorBoard,
    metrics.csv, the optional periodic evaluation, checkpoints (saved atomically every ``checkpoint_every``
    iterations, loaded with ``torch.load(weights_only=True)``; another configuration or an unreadable file is
    refused before anything is loaded) and final.json (written whole, with the deterministic evaluation)."""

    def __init__(self, args, tb_keys: dict):
        self.args, self.tb_keys = args, tb_keys
        self.name = args.run_name or f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        self.dir = os.path.join(args.output_dir, self.name)
        os.makedirs(self.dir, exist_ok=True)
        os.makedirs(args.checkpoint_dir or self.dir, exist_ok=True)
        self.ckpt_path = os.path.join(args.checkpoint_dir or self.dir, "checkpoint.pt")
        resume = args.resume and os.path.exists(self.ckpt_path)
        self.checkpoint = load_checkpoint(self.ckpt_path, args) if resume else None
        with open(os.path.join(self.dir, "config.json"), "w") as f:
            self.info = run_info()
            json.dump({**asdict(args), "run_name": self.name, **self.info}, f, indent=2)
        self.writer = None
        if args.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # on resume, events logged after the checkpoint are discarded (they are recomputed)
            purge = None if self.checkpoint is None else self.checkpoint["progress"]["global_step"] + 1
            self.writer = SummaryWriter(self.dir, purge_step=purge)
            self.writer.add_text(
                "hyperparameters",
                "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()),
            )
        self.start_iteration, self.resumed_at, self.commits = 1, [], [self.info["git_commit"]]
        self.rows, self.eval_rows, self.csv_file, self.csv_writer = [], [], None, None

    def restore(self, stateful: dict, rollout: Rollout) -> None:
        """Continue from the checkpoint (if resuming): the ``stateful`` objects, RNG states, the rollout (its
        counters and episode in progress), the metrics rows up to it; then (re)write metrics.csv up to
        there."""
        self.stateful, self.rollout = stateful, rollout
        self.start_time = time.time()
        checkpoint = self.checkpoint
        if checkpoint is not None:
            missing = set(stateful) - set(checkpoint)
            if missing:  # checked before anything is loaded
                raise CheckpointError(
                    f"checkpoint {self.ckpt_path} has no {sorted(missing)}; delete it to restart the run"
                )
            for name, obj in stateful.items():
                obj.load_state_dict(checkpoint[name])
            set_rng_state(checkpoint["rng"])
            progress = checkpoint["progress"]
            rollout.restore(progress, checkpoint["next_obs"])
            self.start_iteration = progress["iteration"] + 1
            self.start_time = time.time() - progress["elapsed"]
            self.resumed_at = [*progress["resumed_at"], progress["iteration"]]
            self.commits = list(
                dict.fromkeys([*progress["commits"], self.info["git_commit"]])
            )  # every part's
            self.eval_rows = progress.get("eval_rows", [])  # checkpoints from before the evaluation have none
            self.rows = progress["rows"]  # the metrics up to the checkpoint, from the checkpoint itself
            print(
                f"resumed {self.name} from {self.ckpt_path} after iteration {progress['iteration']}",
                flush=True,
            )
        self.csv_file = open(os.path.join(self.dir, "metrics.csv"), "w", newline="")
        if self.rows:  # rewrite the rows up to the checkpoint; later ones are recomputed
            self.csv_writer = csv.DictWriter(self.csv_file, fieldnames=list(self.rows[0]))
            self.csv_writer.writeheader()
            self.csv_writer.writerows(self.rows)
        self.rows = list(self.rows)

    def iteration_metrics(
        self, iteration: int, update: UpdateSummary, *, agent, optimizer, advantages, values, times
    ) -> dict:
        """The per-iteration row every script writes (same keys and order), then the method's own statistics
        (``update.stats`` after kl and ess); ``advantages`` and ``values`` (GAE's float64 arrays) give the
        explained variance, ``times`` (`IterationTimes`) the timings."""
        rollout = self.rollout
        episode_returns, global_step, new_eps = (
            rollout.episode_returns,
            rollout.global_step,
            rollout.episode_returns[rollout.first_new_episode :],
        )
        stats, losses = update.stats.arrays(), update.losses.arrays()
        var_y = float(np.var(advantages + values))
        iter_time = time.perf_counter() - times.start
        kl_mean = float(stats["kl"].mean())
        row = {
            "iteration": iteration,
            "global_step": global_step,
            "time": time.time() - self.start_time,
            "episodic_return": float(np.mean(new_eps)) if new_eps else float("nan"),
            "return_last100": float(np.mean(episode_returns[-100:])) if episode_returns else float("nan"),
            "episodes": len(episode_returns),
            "kl": kl_mean,
            "kl_max": float(stats["kl"].max()),
            "spike": int(kl_mean > self.args.spike_kl),
            "kl_final": update.kl_final,
            "spike_final": int(update.kl_final > self.args.spike_kl),
            "ess": float(stats["ess"].mean()),
            "grad_var": update.grad_var,
            "policy_loss": float(losses["policy_loss"].mean()),
            "value_loss": float(losses["value_loss"].mean()),
            "entropy": agent.entropy().item(),
            "explained_variance": float("nan") if var_y == 0 else 1 - float(np.var(advantages)) / var_y,
            "learning_rate": optimizer.param_groups[0]["lr"],
            "epochs": update.epochs,
            "iter_time": iter_time,
            "rollout_time": times.rollout,
            "update_time": times.update,
            "SPS": global_step / (time.time() - self.start_time),
        }
        for name, column in stats.items():
            if name not in ("kl", "ess"):
                row[name] = float(column.max() if name.endswith("_max") else column.mean())
        return row

    def iterations(self) -> range:
        return range(self.start_iteration, self.args.num_iterations + 1)

    def log(self, iteration: int, row: dict, agent, env) -> None:
        """metrics.csv, TensorBoard, the console line, the periodic evaluation and the checkpoint of an
        iteration."""
        args, rollout = self.args, self.rollout
        if self.csv_writer is None:
            self.csv_writer = csv.DictWriter(self.csv_file, fieldnames=list(row))
            self.csv_writer.writeheader()
        self.csv_writer.writerow(row)
        self.csv_file.flush()
        self.rows.append(row)
        if self.writer is not None:
            write_tensorboard(self.writer, row, rollout.global_step, self.tb_keys)
        if args.verbose:
            print(
                f"iter={iteration} step={rollout.global_step} return(last100)={row['return_last100']:.1f} "
                f"kl={row['kl']:.4f} ess={row['ess']:.3f} SPS={int(row['SPS'])}",
                flush=True,
            )
        if args.eval_every > 0 and args.eval_episodes > 0 and iteration % args.eval_every == 0:
            summary = eval_summary(evaluate(env, agent, args))
            self.eval_rows.append(
                {
                    "iteration": iteration,
                    "global_step": rollout.global_step,
                    **{k: summary[k] for k in ("eval_return_mean", "eval_return_std")},
                }
            )
            write_eval_csv(self.dir, self.eval_rows)
        if (
            args.checkpoint_every > 0
            and iteration % args.checkpoint_every == 0
            and iteration < args.num_iterations
        ):
            rollout_progress, next_obs = rollout.state()
            progress = {
                "iteration": iteration,
                **rollout_progress,
                "elapsed": time.time() - self.start_time,
                "resumed_at": self.resumed_at,
                "commits": self.commits,
                "rows": self.rows,
                "eval_rows": self.eval_rows,
            }
            save_checkpoint(
                self.ckpt_path,
                {
                    "args": checkpoint_args(args),
                    "progress": progress,
                    "rng": rng_state(),
                    "next_obs": next_obs,
                    **{name: obj.state_dict() for name, obj in self.stateful.items()},
                },
            )

    def finish(self, agent, env) -> dict:
        """final.json (never half-written), with the deterministic evaluation; the checkpoint is removed."""
        args, rollout = self.args, self.rollout
        last = rollout.episode_returns[-100:]
        final = {
            "run_name": self.name,
            "env_id": args.env_id,
            "method": args.exp_name,
            "seed": args.seed,
            "global_step": rollout.global_step,
            "final_return": float(np.mean(last)) if last else float("nan"),
            "final_return_episodes": len(last),
            "episodes": len(rollout.episode_returns),
            "wall_time": time.time() - self.start_time,
            "SPS": rollout.global_step / (time.time() - self.start_time),
            "resumed_at_iterations": self.resumed_at,
            "git_commits": self.commits,
        }
        if args.eval_episodes > 0:
            final.update(eval_summary(evaluate(env, agent, args)), eval_seed=args.seed + EVAL_SEED_OFFSET)
        closing = (
            f"done: {rollout.global_step} steps; training return (last {final['final_return_episodes']} "
            f"episodes) {final['final_return']:.1f}"
        )
        if args.eval_episodes > 0:
            closing += (
                f"; evaluation return ({args.eval_episodes} mean-action episodes) "
                f"{final['eval_return_mean']:.1f} ± {final['eval_return_std']:.1f}"
            )
        with open(os.path.join(self.dir, "final.json.tmp"), "w") as f:
            json.dump(final, f, indent=2)
        os.replace(os.path.join(self.dir, "final.json.tmp"), os.path.join(self.dir, "final.json"))
        if not args.keep_checkpoint and os.path.exists(self.ckpt_path):
            os.remove(self.ckpt_path)
        print(f"{closing}; results in {self.dir}", flush=True)
        return final

    def close(self, env) -> None:
        if self.csv_file is not None:
            self.csv_file.close()
        env.close()
        if self.writer is not None:
            self.writer.close()
