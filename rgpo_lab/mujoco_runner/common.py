"""Everything the lab runner's four methods share (rgpo_lab.mujoco_runner; until issue 48 this was
mujoco_baselines/common.py, unchanged since but for import paths and texts); each method's module
(``{ppo,rgpo,trpo,awr}_continuous_action.py``) keeps its own flags (its ``Args`` on `BaseArgs`), its loss and
its update loop: Args, setup, the loop (the batch from `collect_batch`: rollout and GAE, here; the method's
update, in the module; logging, here). The product's single-file scripts (mujoco_baselines/) inline the eager
path of all this, minus what only the studies need.

What is here, in the order a script uses it:
- the flags every script has (`BaseArgs`; `StaleSampleArgs` adds PPO's and RGPO's --policy-lag family), their
  checks (`resolve_args`) and the errors that end a run with one line (`SCRIPT_ERRORS`);
- the environment with its normalisation (`MujocoEnv`) and the agent network (`Agent`);
- an iteration's start (`collect_batch`: the learning rate, the rollout by `Rollout`, GAE) as a `Batch`, and
  under stale samples the ratio's anchor (`PolicyLag.anchor` -> `RatioAnchor`);
- the pieces of every update: mini-batches (`epoch_indices`, `Batch.minibatches`), advantage normalisation,
  the clipped value loss, Adam and its mini-batch step, eager or --compile's compiled function
  (`UpdateStep`), the KL of the final policy (`final_kl`);
- the run around it all (`TrainingRun`): run directory, config.json, seeding, the row of metrics.csv from
  the update's `UpdateSummary` (statistics by name, `MinibatchStats`), TensorBoard, checkpoints and resume,
  and the deterministic evaluation.

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
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import NamedTuple

import gymnasium as gym
import mujoco
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

import rgpo_trl
from rgpo_lab.mujoco_runner import SPIKE_KL
from rgpo_trl.cli import UsageError


# --------------------------------------------------------------------------------------------- #
# The flags every script has, each default and help text written once; a script's Args adds its own
# fields and re-declares only its exp_name (the file's name) and a help text that differs.
# --------------------------------------------------------------------------------------------- #
@dataclass
class BaseArgs:
    exp_name: str = ""
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True` and the run is bit-reproducible on CPU"""
    torch_threads: int = 1
    """torch intra-op threads (1 is fastest for these small MLPs; CleanRL benchmarks use OMP_NUM_THREADS=1)"""
    output_dir: str = "runs"
    """results go to {output_dir}/{run_name}/ (config.json, metrics.csv, final.json, TensorBoard events)"""
    run_name: str | None = None
    """default: {env_id}__{exp_name}__{seed}__{unix time}"""
    tensorboard: bool = True
    """write TensorBoard event files (metrics.csv is always written)"""
    verbose: bool = True
    """print one line per iteration"""
    checkpoint_every: int = 10
    """save a resumable checkpoint every this many iterations (0: never)"""
    checkpoint_dir: str | None = None
    """where checkpoint.pt goes (default: the run directory); mujoco_grid.py keeps checkpoints out of
    results/"""
    resume: bool = False
    """continue from the checkpoint if it exists (needs --run-name; refused if the configuration differs)"""
    keep_checkpoint: bool = False
    """keep checkpoint.pt after the run finished (default: deleted, the results stay)"""
    eval_episodes: int = 10
    """deterministic evaluation at the end of the run: this many episodes of the mean action on a separate
    environment with frozen observation normalisation (final.json: eval_return_mean / _std / episodes);
    0 skips"""
    eval_every: int = 0
    """also evaluate every N iterations (eval.csv); 0: at the end only"""

    # Environment
    env_id: str = "HalfCheetah-v4"
    """the id of the environment (the paper uses the v4 MuJoCo tasks; v5 ids work too)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiment"""
    norm_obs: bool = True
    """running mean/std observation normalisation (gymnasium NormalizeObservation semantics)"""
    obs_clip: float = 10.0
    """clip normalised observations to [-obs_clip, obs_clip]"""
    norm_reward: bool = True
    """reward scaling by the running std of the discounted return (gymnasium NormalizeReward semantics)"""
    reward_clip: float = 10.0
    """clip scaled rewards to [-reward_clip, reward_clip]"""

    # Networks and optimiser (identical in ppo / rgpo / trpo / awr)
    hidden_size: int = 256
    """width of the 2-layer tanh MLPs (policy mean and value); the paper uses 256, CleanRL 64"""
    ortho_init: bool = True
    """orthogonal init (gain sqrt(2); 0.01 for the policy head, 1 for the value head), zero biases"""
    init_logstd: float = 0.0
    """initial value of the state-independent log-std parameter"""
    learning_rate: float = 3e-4
    """Adam learning rate"""
    adam_eps: float = 1e-5
    """Adam epsilon"""
    anneal_lr: bool = True
    """linearly anneal the learning rate to 0"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip (<= 0 disables)"""
    compile: bool = False
    """the fast path: each mini-batch update as one torch.compile'd function (compiled_update.py; needs a C++
    compiler) and the rollout's policy mean in numpy: the same algorithm, float rounding differs; see
    results/benchmarks/mujoco_compile.md for speed and equivalence"""

    # Rollout / advantage estimation
    num_steps: int = 2048
    """environment steps per rollout (one environment)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    minibatch_size: int = 64
    """mini-batch size"""
    update_epochs: int = 10
    """epochs over each rollout"""
    norm_adv: bool = True
    """per-mini-batch advantage normalisation"""
    clip_vloss: bool = True
    """clipped value loss"""
    vclip_coef: float = 0.2
    """value clipping range"""
    vf_coef: float = 0.5
    """coefficient of the value loss"""
    ent_coef: float = 0.0
    """coefficient of the entropy bonus"""
    spike_kl: float = SPIKE_KL
    """an iteration whose KL to pi_old exceeds this is a 'KL spike' (default: twice RGPO's KL target)"""

    # derived from the above at start (not command-line options)
    batch_size: tyro.conf.Suppress[int] = 0
    num_iterations: tyro.conf.Suppress[int] = 0


@dataclass
class StaleSampleArgs(BaseArgs):
    """The flags of PPO and RGPO for stale samples (their scripts re-declare ``decoupled`` with the help text
    of their own objective)."""

    policy_lag: int = 0
    """collect iteration t's rollout with the actor of iteration t - L, as asynchronous actors that run L
    updates behind the learner (the critic stays current); 0: on-policy"""
    decoupled: bool = False
    """the decoupled objective for stale samples (Hilton et al., 2021): the ratio to the proximal policy
    pi_prox (the learner as the update starts), each sample weighted by min(pi_prox / pi_behaviour,
    max_is_weight)"""
    max_is_weight: float = 1.0
    """truncation of the decoupled objective's importance weight (V-trace's rho-bar); > 0"""


def resolve_args(args: BaseArgs) -> None:
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
    if isinstance(args, StaleSampleArgs):
        check_stale_sample_args(args)
    check_env(args.env_id)
    steps = args.num_iterations * args.batch_size
    if steps != args.total_timesteps:
        print(
            f"total_timesteps {args.total_timesteps} is not a multiple of num_steps {args.num_steps}: "
            f"running {args.num_iterations} iterations = {steps} steps",
            flush=True,
        )


def check_stale_sample_args(args: StaleSampleArgs) -> None:
    """--policy-lag / --max-is-weight out of range: refused at start, naming the field."""
    if args.policy_lag < 0:
        raise UsageError(f"policy_lag must be an integer >= 0 (0: on-policy), got {args.policy_lag}")
    if not args.max_is_weight > 0:
        raise UsageError(f"max_is_weight must be > 0, got {args.max_is_weight}")


def seed_everything(args: BaseArgs) -> None:
    """CleanRL's seeding block (Python, NumPy, torch) and the torch thread count."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)


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
# An iteration's start, the same in every script: the learning rate, the rollout, GAE.
# --------------------------------------------------------------------------------------------- #
SCRIPT_ERRORS = (UsageError, CheckpointError, NonFiniteLossError)
"""What ends a script with one line instead of a traceback (``--debug``: the traceback): a bad input, an
unusable checkpoint, a non-finite loss (the scripts' ``rgpo_trl.cli.run_main(..., errors=SCRIPT_ERRORS)``)."""


class Collected(NamedTuple):
    """What `Rollout.collect` computes besides the storage it fills (inference-mode tensors)."""

    values: torch.Tensor  # the current critic's values of the rollout's observations
    next_value: float  # its value of the observation after the last step
    logprobs: torch.Tensor  # log-probs of the actions under the actor that took them: the behaviour policy


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

    def collect(self, writer=None) -> Collected:
        """Fill the storage with the next ``num_steps`` steps (each finished episode's return and length to
        TensorBoard's ``writer``, if any)."""
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
        return Collected(b_values, next_value, b_logprobs)

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

    def advantages(self, collected: Collected, gamma: float, gae_lambda: float):
        """GAE in float64 numpy over the last `collect`: (advantages, values) as float64 arrays."""
        T, next_value = len(self.rewards), collected.next_value
        values_np = collected.values.numpy().astype(np.float64)
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


@dataclass
class Batch:
    """An iteration's rollout with its advantages, as the update reads it: float32 tensors over the rollout's
    steps (leaving inference mode), GAE's float64 arrays (the explained variance) and the rollout's timing."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    """log-probs of the actions under the behaviour policy (the actor that collected them)"""
    values: torch.Tensor
    """the critic's values as the rollout ended"""
    advantages: torch.Tensor
    returns: torch.Tensor
    """advantages + values"""
    advantages_np: np.ndarray
    values_np: np.ndarray
    started: float
    """time.perf_counter() as the iteration started"""
    rollout_time: float
    """seconds"""

    def minibatches(self, idxs, oldlogprobs: torch.Tensor, *more, shared: tuple = ()) -> list[tuple]:
        """The inputs of an actor-critic mini-batch loss for each index set of ``idxs``, in the order of the
        scripts' ``minibatch_loss``: obs, actions, advantages, ``oldlogprobs`` (the ratio's anchor), returns,
        values, ``more`` (e.g. the decoupled objective's weight), then the ``shared`` inputs."""
        tensors = (self.obs, self.actions, self.advantages, oldlogprobs, self.returns, self.values, *more)
        return minibatches(idxs, *tensors, shared=shared)


def collect_batch(iteration: int, rollout: Rollout, optimizer, args, writer=None, lag=None) -> Batch:
    """An iteration's start: the learning rate (with --anneal-lr linearly to 0 over the run, as CleanRL), the
    rollout (with a `PolicyLag` ``lag``, by the actor of iteration - policy_lag), GAE (float64) and the
    batch."""
    started = time.perf_counter()
    lr_frac = 1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0
    optimizer.param_groups[0]["lr"] = lr_frac * args.learning_rate
    if lag is not None:
        lag.advance()
    collected = rollout.collect(writer)
    rollout_time = time.perf_counter() - started
    adv_np, values_np = rollout.advantages(collected, args.gamma, args.gae_lambda)
    return Batch(
        obs=rollout.obs,
        actions=rollout.actions,
        logprobs=collected.logprobs.clone(),  # clones leave inference mode
        values=collected.values.clone(),
        advantages=torch.as_tensor(adv_np, dtype=torch.float32),
        returns=torch.as_tensor(adv_np + values_np, dtype=torch.float32),
        advantages_np=adv_np,
        values_np=values_np,
        started=started,
        rollout_time=rollout_time,
    )


# --------------------------------------------------------------------------------------------- #
# Stale samples (--policy-lag, --decoupled): the lagged actor and the ratio's anchor.
# --------------------------------------------------------------------------------------------- #
@dataclass
class RatioAnchor:
    """What an update's ratios are taken against: the behaviour policy's log-probs, or under the decoupled
    objective the proximal policy's (the learner as the update starts) with each sample's truncated weight
    min(pi_prox / pi_behaviour, max_is_weight)."""

    logprobs: torch.Tensor
    weight: torch.Tensor | None = None
    """the decoupled objective's weight; None: unweighted"""
    stats: dict[str, float] = field(default_factory=dict)
    """how stale the rollout is (`behaviour_ratio_stats`), for the row of metrics.csv; empty on-policy"""
    start_logprobs: torch.Tensor | None = None
    """the learner's log-probs of the rollout as the update starts (None on-policy, where they equal
    ``logprobs``): what the gate or the clip sees before the first epoch is exp(start_logprobs - logprobs)"""


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

    def anchor(self, batch: Batch, decoupled: bool, max_is_weight: float) -> RatioAnchor:
        """The ratio's anchor for ``batch``: its behaviour log-probs, or with ``decoupled`` the proximal
        policy's with the truncated weight; under stale samples (a lag, or ``decoupled``) with the
        staleness statistics."""
        if self.lag == 0 and not decoupled:
            return RatioAnchor(batch.logprobs)
        prox = self.proximal_log_prob(batch.obs, batch.actions)
        stats = behaviour_ratio_stats(prox, batch.logprobs)
        if not decoupled:
            return RatioAnchor(batch.logprobs, None, stats, prox)
        weight = truncated_weight(prox, batch.logprobs, max_is_weight)
        stats["is_weight_truncated_frac"] = float(
            (prox - batch.logprobs > math.log(max_is_weight)).double().mean()
        )
        return RatioAnchor(prox, weight, stats, prox)

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


def start_of_update_stats(anchor: RatioAnchor) -> dict[str, float]:
    """What the update's ratio r = pi / anchor is before its first epoch (under stale samples; {} on-policy):
    the share with max(r, 1 / r) beyond 1.2 and beyond 2 and the largest r. The epoch means of the same
    quantities are taken after the update has moved the learner, so they understate what the gate or the clip
    had to act on; plain objectives see r = pi / pi_behaviour here, decoupled ones r = 1."""
    if anchor.start_logprobs is None:
        return {}
    log_r = anchor.start_logprobs.double() - anchor.logprobs.double()
    far = log_r.abs()
    return {
        "start_ratio_beyond_1.2": float((far > math.log(1.2)).double().mean()),
        "start_ratio_beyond_2": float((far > math.log(2.0)).double().mean()),
        "start_ratio_max": float(log_r.exp().max()),
    }


# --------------------------------------------------------------------------------------------- #
# The pieces of every update: mini-batches, the loss terms every method shares, the optimiser step (eager or
# --compile, chosen once), the final policy's KL.
# --------------------------------------------------------------------------------------------- #
def epoch_indices(args) -> Iterator[tuple[torch.Tensor, ...]]:
    """``update_epochs`` shuffles of the rollout's steps, each split into mini-batch index sets: one
    ``torch.randperm`` per epoch, drawn as the epoch starts (an early stop draws no more)."""
    for _ in range(args.update_epochs):
        yield torch.randperm(args.num_steps).split(args.minibatch_size)


def minibatches(idxs, *tensors, shared: tuple = ()) -> list[tuple]:
    """One tuple per mini-batch index set: each tensor indexed, a None (an input the variant does not use)
    kept, then the ``shared`` inputs of every mini-batch (e.g. RGPO's beta)."""
    return [(*(None if t is None else t[idx] for t in tensors), *shared) for idx in idxs]


def normalize_advantages(advantages: torch.Tensor, args) -> torch.Tensor:
    """With --norm-adv, (A - mean) / (std + 1e-8) over the given (mini-)batch, as CleanRL; else A."""
    if not args.norm_adv:
        return advantages
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def value_loss(newvalue, mb_values, mb_returns, args) -> torch.Tensor:
    """CleanRL's value loss: 0.5 * mean squared error to the returns, with --clip-vloss the maximum of it and
    the error of the value clipped to within vclip_coef of the rollout's."""
    if args.clip_vloss:
        v_clipped = mb_values + (newvalue - mb_values).clamp(-args.vclip_coef, args.vclip_coef)
        return 0.5 * torch.max((newvalue - mb_returns) ** 2, (v_clipped - mb_returns) ** 2).mean()
    return 0.5 * ((newvalue - mb_returns) ** 2).mean()


def mean_kl_to_old(logratio: torch.Tensor) -> float:
    """mean(r - 1 - log r) over ``logratio`` = log(pi / pi_old), the log-ratios clamped as the loss clamps
    them (rgpo_trl.kl_old_estimate)."""
    return float(rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(logratio)).mean())


@torch.no_grad()
def final_kl(agent, batch: Batch, anchor_logprobs: torch.Tensor) -> float:
    """The KL of the iteration's final policy to pi_old (``anchor_logprobs``) over the whole batch."""
    return mean_kl_to_old(agent.log_prob(agent.actor_mean(batch.obs), batch.actions) - anchor_logprobs)


class UpdateStep:
    """The Adam optimiser over ``params`` (``args.learning_rate``, ``args.adam_eps``) and its mini-batch step,
    eager or with ``args.compile`` `CompiledAdamStep` (the same step as one compiled function, 4 mini-batches
    per call), chosen once at setup behind one call: ``steps(batches, iteration, epoch)`` yields each
    mini-batch's (loss, aux) after its step. ``loss_fn(agent, *batch)`` returns (loss, aux), aux (new
    log-probs, policy loss, value loss, ...); a value-only step's aux is its value loss, and
    ``begin_iteration`` gets the iteration's policy loss. A non-finite loss stops the run before its step,
    with both losses in the message. It accumulates the statistics of the gradient variance (the gradients of
    ``tracked`` parameters, before clipping): ``g_sum``, ``g_sqsum``."""

    def __init__(self, agent, params, loss_fn, args, tracked=None):
        self.agent, self.loss_fn = agent, loss_fn
        self.params, self.max_grad_norm, self.tracked = list(params), args.max_grad_norm, tracked
        self.optimizer = torch.optim.Adam(self.params, lr=args.learning_rate, eps=args.adam_eps)
        self.policy_loss = None  # the iteration's policy loss, for a value-only step (begin_iteration)
        self.n_tracked = sum(p.numel() for p in tracked) if tracked else 0
        self.compiled = None
        if args.compile:
            from rgpo_lab.mujoco_runner.compiled_update import CompiledAdamStep, check_compiler

            check_compiler()
            self.compiled = CompiledAdamStep(
                agent, self.optimizer, loss_fn, self.params, self.max_grad_norm, tracked or ()
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

    def epoch(self, batches, iteration: int, epoch: int, losses: MinibatchStats) -> torch.Tensor:
        """The steps of one epoch whose aux is (new log-probs, policy loss, value loss), as PPO's and RGPO's:
        each step's losses go to ``losses``; returns the new log-probs each mini-batch's loss saw, stacked as
        (mini-batches, samples), for the epoch's statistics."""
        newlogprobs = []
        for _loss, (newlogprob, pg_loss, v_loss) in self.steps(batches, iteration, epoch):
            newlogprobs.append(newlogprob.detach())
            losses.add(policy_loss=pg_loss.detach(), value_loss=v_loss.detach())
        return torch.stack(newlogprobs)

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
    update_time: float
    """seconds"""


TB_KEYS = {
    "learning_rate": "charts/learning_rate",
    "SPS": "charts/SPS",
    "iter_time": "charts/iter_time",
    "rollout_time": "charts/rollout_time",
    "update_time": "charts/update_time",
    "return_last100": "charts/return_last100",
    "policy_loss": "losses/policy_loss",
    "value_loss": "losses/value_loss",
    "entropy": "losses/entropy",
    "explained_variance": "losses/explained_variance",
    "kl": "losses/approx_kl",
}
"""TensorBoard's names of the metrics every script logs (CleanRL's where it has one); any other metric is
logged as stats/<name>."""


class TrainingRun:
    """A training run's directory and life: the input checks (`resolve_args`), config.json (every flag,
    machine, versions, commit), TensorBoard, the seeding, metrics.csv, the optional periodic evaluation,
    checkpoints (saved atomically every ``checkpoint_every`` iterations, loaded with
    ``torch.load(weights_only=True)``; another configuration or an unreadable file is refused before anything
    is loaded) and final.json (written whole, with the deterministic evaluation). ``tb_keys``: TensorBoard's
    names of the method's own metrics, beside `TB_KEYS`. Used as a context manager around the training loop:
    metrics.csv, TensorBoard and the environment are closed however the run ends."""

    def __init__(self, args, tb_keys: dict | None = None):
        resolve_args(args)  # derived fields and input checks, before anything is created
        self.args, self.tb_keys = args, {**TB_KEYS, **(tb_keys or {})}
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
        self.stateful, self.rollout = {}, None
        seed_everything(args)

    def restore(self, rollout: Rollout, *, agent, optimizer, env, **more_state) -> None:
        """The objects the run keeps in its checkpoints, by name (``agent``, ``optimizer``, ``env`` and the
        method's ``more_state``), and the rollout; when resuming, all of them continue from the checkpoint
        (with the RNG states and the metrics rows up to it). Then (re)writes metrics.csv up to there."""
        self.stateful = {"agent": agent, "optimizer": optimizer, "env": env, **more_state}
        self.rollout = rollout
        self.start_time = time.time()
        checkpoint = self.checkpoint
        if checkpoint is not None:
            missing = set(self.stateful) - set(checkpoint)
            if missing:  # checked before anything is loaded
                raise CheckpointError(
                    f"checkpoint {self.ckpt_path} has no {sorted(missing)}; delete it to restart the run"
                )
            for name, obj in self.stateful.items():
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

    def iterations(self) -> range:
        return range(self.start_iteration, self.args.num_iterations + 1)

    def iteration_metrics(self, iteration: int, batch: Batch, update: UpdateSummary) -> dict:
        """The per-iteration row every script writes (same keys and order), then the method's own statistics
        (``update.stats`` after kl and ess); ``batch`` gives the explained variance and the rollout's
        timing."""
        rollout, agent, optimizer = self.rollout, self.stateful["agent"], self.stateful["optimizer"]
        episode_returns, global_step, new_eps = (
            rollout.episode_returns,
            rollout.global_step,
            rollout.episode_returns[rollout.first_new_episode :],
        )
        stats, losses = update.stats.arrays(), update.losses.arrays()
        advantages, values = batch.advantages_np, batch.values_np
        var_y = float(np.var(advantages + values))
        iter_time = time.perf_counter() - batch.started
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
            "rollout_time": batch.rollout_time,
            "update_time": update.update_time,
            "SPS": global_step / (time.time() - self.start_time),
        }
        for name, column in stats.items():
            if name not in ("kl", "ess"):
                row[name] = float(column.max() if name.endswith("_max") else column.mean())
        return row

    def log(self, iteration: int, row: dict) -> None:
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
            summary = eval_summary(evaluate(self.stateful["env"], self.stateful["agent"], args))
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

    def finish(self) -> dict:
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
            returns = evaluate(self.stateful["env"], self.stateful["agent"], args)
            final.update(eval_summary(returns), eval_seed=args.seed + EVAL_SEED_OFFSET)
        # says what each return is: the two differ by the exploration noise and, lagged, by the actor
        closing = (
            f"done: {rollout.global_step} steps; training return (with exploration noise, last "
            f"{final['final_return_episodes']} episodes) {final['final_return']:.1f}"
        )
        if args.eval_episodes > 0:
            closing += (
                f"; evaluation return (mean action, {args.eval_episodes} episodes) "
                f"{final['eval_return_mean']:.1f} ± {final['eval_return_std']:.1f}"
            )
        lag = getattr(args, "policy_lag", 0)  # PPO's and RGPO's flag; TRPO and AWR have none
        if lag > 0:
            closing += (
                f"; policy lag {lag} (training episodes from the actor of {lag} "
                "iterations before, the evaluation from the final one)"
            )
        with open(os.path.join(self.dir, "final.json.tmp"), "w") as f:
            json.dump(final, f, indent=2)
        os.replace(os.path.join(self.dir, "final.json.tmp"), os.path.join(self.dir, "final.json"))
        if not args.keep_checkpoint and os.path.exists(self.ckpt_path):
            os.remove(self.ckpt_path)
        print(f"{closing}; results in {self.dir}", flush=True)
        return final

    def close(self) -> None:
        """metrics.csv, the environment and TensorBoard, closed."""
        if self.csv_file is not None:
            self.csv_file.close()
        if "env" in self.stateful:
            self.stateful["env"].close()
        if self.writer is not None:
            self.writer.close()

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
