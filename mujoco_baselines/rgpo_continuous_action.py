# RGPO (Rejection-Gated Policy Optimization) on MuJoCo, CleanRL-style single file.
# The policy loss is rgpo_trl.rgpo_loss (the same code the TRL trainer uses), with a gate from
# rgpo_trl.make_gate and the KL-to-old coefficient from rgpo_trl.make_kl_controller (adaptive by default).
# Part of rgpo-trl's MuJoCo baselines: ppo / rgpo / trpo / awr share every line except the policy
# update (see mujoco_baselines/README.md). Structure follows CleanRL's ppo_continuous_action.py.
from __future__ import annotations

import csv
import json
import math
import os
import platform
import random
import subprocess
import time
from dataclasses import asdict, dataclass, field

import gymnasium as gym
import mujoco
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from compiled_update import CompiledAdamStep, check_compiler
from evaluation import EVAL_SEED_OFFSET, eval_summary, evaluate, write_eval_csv

import rgpo_trl


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
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
    """where checkpoint.pt goes (default: the run directory); grid.py keeps checkpoints out of results/"""
    resume: bool = False
    """continue from the checkpoint if it exists (needs --run-name; refused if the configuration differs)"""
    keep_checkpoint: bool = False
    """keep checkpoint.pt after the run finished (default: deleted, the results stay)"""
    eval_episodes: int = 10
    """deterministic evaluation at the end of the run: this many episodes of the mean action on a separate
    environment with frozen observation normalisation (final.json: eval_return_mean / _std / episodes); 0 skips"""
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
    benchmarks/results/mujoco_compile.md for speed and equivalence"""

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
    spike_kl: float = 0.04
    """an iteration whose KL to pi_old exceeds this is a 'KL spike' (2 x target 0.02)"""

    # RGPO specific (paper Sec. 5 and App. Implementation Details; Ablation A for the gates)
    gate: str = "sigmoid"
    """acceptance gate: any name registered with rgpo_trl.register_gate (built in: sigmoid, clipped_linear,
    temperature; is and ppo_clip as reference correspondences)"""
    gate_params: dict[str, float] = field(default_factory=dict)
    """the gate's parameters as name value pairs, e.g. `--gate-params k 10` (sigmoid k, default 5;
    clipped_linear c, default 2; temperature temperature, default 1; ppo_clip eps, default 0.2)"""
    kl_controller: str = "adaptive"
    """rule for the KL-to-old coefficient after every iteration: adaptive (paper Eq. beta_update) | fixed"""
    kl_coef: float = 0.5
    """initial KL-to-old coefficient beta_0"""
    kl_target: float = 0.02
    """target KL Delta"""
    kl_coef_min: float = 0.01
    """lower bound of beta"""
    kl_coef_max: float = 5.0
    """upper bound of beta"""
    kl_backstop: float = 0.1
    """hard backstop: leave the epoch loop after an epoch when the iteration's mean KL so far exceeds this
    (<= 0 disables)"""

    # filled at runtime
    batch_size: int = 0
    num_iterations: int = 0


# --------------------------------------------------------------------------------------------- #
# Environment: one gymnasium env, no vector wrapper. Resets are explicit (no autoreset, so no fake
# transitions), normalisation is done here with the same update rules as gymnasium's wrappers,
# and episode returns are the raw, unnormalised rewards.
# --------------------------------------------------------------------------------------------- #
SQRT2 = math.sqrt(2.0)


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


class MujocoEnv:
    def __init__(self, args: Args):
        self.env = gym.make(args.env_id)
        assert isinstance(self.env.action_space, gym.spaces.Box), "only continuous action spaces"
        assert isinstance(self.env.observation_space, gym.spaces.Box), "only Box observations"
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
            "obs_rms": [torch.from_numpy(self.obs_rms.mean.copy()), torch.from_numpy(self.obs_rms.var.copy()),
                        self.obs_rms.count],
            "ret_rms": [float(self.ret_rms.mean), float(self.ret_rms.var), self.ret_rms.count],
            "discounted": self.discounted,
            "episode": [self.ep_return, self.ep_length, self._time_limit()._elapsed_steps],
            "sim": torch.from_numpy(sim),
            "np_random": u.np_random.bit_generator.state,
        }  # fmt: skip

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


def checkpoint_args(args: Args) -> dict:
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


def load_checkpoint(path: str, args: Args) -> dict:
    """The checkpoint at `path`, checked (readable, complete, same configuration) before anything is loaded."""
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
    diff = [f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in sorted(set(saved) | set(current))
            if saved.get(k) != current.get(k)]  # fmt: skip
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
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None  # fmt: skip
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
    def __init__(self, obs_dim, act_dim, args: Args):
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
        step; rollouts 1.5-1.7x faster than with mean_action at width 256 (benchmarks/results/mujoco_rollout.md)."""
        (w0, b0), (w1, b1), (w2, b2) = [(lin.weight.detach().numpy(), lin.bias.detach().numpy())
                                        for lin in self.actor_mean[::2]]  # fmt: skip
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


# --------------------------------------------------------------------------------------------- #
# Method-specific part: the RGPO loss, from the library (never a copy).
# --------------------------------------------------------------------------------------------- #
def rgpo_policy_loss(newlogprob, oldlogprob, advantages, gate, kl_coef):
    """-mean(g(r) A) + beta * mean(r - 1 - log r) via rgpo_trl.rgpo_loss; its diagnostics are reduced
    once per epoch by `rgpo_epoch_stats` instead of per mini-batch step."""
    loss, _ = rgpo_trl.rgpo_loss(newlogprob, oldlogprob, advantages, gate, kl_coef=kl_coef, diagnostics=False)
    return loss


def rgpo_epoch_stats(newlogprobs, oldlogprobs, gate):
    """Per-mini-batch stats [kl_old, ess (w = g'(r) r), gate_mean, weight_mean, rejected_frac, ratio_max]
    of one epoch, from log-probs stacked as (mini-batches, samples): rgpo_trl.rgpo_diagnostics, the
    values rgpo_loss reports for each mini-batch, in one vectorised reduction per epoch."""
    d = rgpo_trl.rgpo_diagnostics(newlogprobs, oldlogprobs, gate, dim=-1)
    keys = ["kl_old", "ess", "gate_mean", "weight_mean", "rejected_frac", "ratio_old_max"]
    return torch.stack([d[k] for k in keys], dim=1)


def minibatch_loss(
    agent, mb_obs, mb_actions, mb_adv, mb_oldlogprob, mb_returns, mb_values, kl_coef, gate, args
):
    """The mini-batch loss (policy - entropy + value) and what the statistics need, for the eager step and the
    --compile step alike."""
    newlogprob = agent.log_prob(agent.actor_mean(mb_obs), mb_actions)
    newvalue = agent.critic(mb_obs).squeeze(-1)
    if args.norm_adv:
        mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)

    # policy loss
    pg_loss = rgpo_policy_loss(newlogprob, mb_oldlogprob, mb_adv, gate, kl_coef)

    # value loss
    if args.clip_vloss:
        v_clipped = mb_values + (newvalue - mb_values).clamp(-args.vclip_coef, args.vclip_coef)
        v_loss = 0.5 * torch.max((newvalue - mb_returns) ** 2, (v_clipped - mb_returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
    loss = pg_loss - args.ent_coef * agent.entropy() + args.vf_coef * v_loss
    return loss, (newlogprob, pg_loss, v_loss)


STAT_NAMES = ["kl", "ess", "gate_mean", "weight_mean", "rejected_frac", "ratio_max"]


class NonFiniteLossError(FloatingPointError):
    pass


def check_finite(loss, pg_loss, v_loss, iteration, epoch, minibatch):
    if not torch.isfinite(loss):
        raise NonFiniteLossError(
            f"non-finite loss at iteration {iteration} (epoch {epoch}, mini-batch {minibatch}): "
            f"policy_loss={pg_loss.item()}, value_loss={v_loss.item()}; stopping instead of training on garbage"
        )


def main(args: Args) -> dict:
    args.batch_size = args.num_steps
    args.num_iterations = args.total_timesteps // args.batch_size
    assert args.num_iterations >= 1, "total_timesteps must be >= num_steps"
    assert args.batch_size % args.minibatch_size == 0, "num_steps must be a multiple of minibatch_size"
    run_name = args.run_name or f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = os.path.join(args.output_dir, run_name)
    os.makedirs(run_dir, exist_ok=True)
    os.makedirs(args.checkpoint_dir or run_dir, exist_ok=True)
    ckpt_path = os.path.join(args.checkpoint_dir or run_dir, "checkpoint.pt")
    checkpoint = load_checkpoint(ckpt_path, args) if args.resume and os.path.exists(ckpt_path) else None
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        info = run_info()
        json.dump({**asdict(args), "run_name": run_name, **info}, f, indent=2)
    writer = None
    if args.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        # on resume, events logged after the checkpoint are discarded (they are recomputed)
        writer = SummaryWriter(
            run_dir, purge_step=None if checkpoint is None else checkpoint["progress"]["global_step"] + 1
        )
        writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in asdict(args).items()),
        )

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)

    env = MujocoEnv(args)
    agent = Agent(env.obs_dim, env.act_dim, args)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    policy_params = agent.policy_parameters()
    gate = rgpo_trl.make_gate(args.gate, **args.gate_params)
    kl_ctl = rgpo_trl.make_kl_controller(
        args.kl_controller,
        kl_coef=args.kl_coef,
        kl_target=args.kl_target,
        kl_coef_min=args.kl_coef_min,
        kl_coef_max=args.kl_coef_max,
    )
    n_policy_params = sum(p.numel() for p in policy_params)

    # the mini-batch loss of the eager and the --compile step (batch ends with beta)
    def loss_fn(agent, *batch):
        return minibatch_loss(agent, *batch, gate=gate, args=args)

    compiled_step = None
    if args.compile:
        check_compiler()
        compiled_step = CompiledAdamStep(
            agent, optimizer, loss_fn, list(agent.parameters()), args.max_grad_norm, policy_params
        )

    # storage (torch tensors sharing memory with numpy views for the per-step writes)
    T, mb = args.num_steps, args.minibatch_size
    obs = torch.zeros((T, env.obs_dim))
    actions = torch.zeros((T, env.act_dim))
    rewards = np.zeros(T, np.float64)
    dones = np.zeros(T, np.float64)  # dones[t]: obs[t] is the first observation of a new episode
    obs_np, actions_np = obs.numpy(), actions.numpy()

    episode_returns, episode_lengths = [], []
    global_step, start_iteration, resumed_at, commits = 0, 1, [], [info["git_commit"]]
    start_time = time.time()
    next_obs = env.reset(seed=args.seed)
    next_done = 0.0
    stateful = {"agent": agent, "optimizer": optimizer, "env": env, "kl_controller": kl_ctl}
    rows, eval_rows = [], []
    if checkpoint is not None:
        missing = set(stateful) - set(checkpoint)
        if missing:  # checked before anything is loaded
            raise CheckpointError(
                f"checkpoint {ckpt_path} has no {sorted(missing)}; delete it to restart the run"
            )
        for name, obj in stateful.items():
            obj.load_state_dict(checkpoint[name])
        set_rng_state(checkpoint["rng"])
        progress = checkpoint["progress"]
        start_iteration, global_step = progress["iteration"] + 1, progress["global_step"]
        start_time = time.time() - progress["elapsed"]
        episode_returns, episode_lengths = progress["episode_returns"], progress["episode_lengths"]
        next_obs, next_done = checkpoint["next_obs"].numpy().copy(), progress["next_done"]
        resumed_at = [*progress["resumed_at"], progress["iteration"]]
        commits = list(
            dict.fromkeys([*progress["commits"], info["git_commit"]])
        )  # every commit that ran a part
        eval_rows = progress.get("eval_rows", [])  # checkpoints written before evaluation existed have none
        rows = progress["rows"]  # the metrics up to the checkpoint, from the checkpoint itself
        print(f"resumed {run_name} from {ckpt_path} after iteration {progress['iteration']}", flush=True)
    csv_file, csv_writer, final = open(os.path.join(run_dir, "metrics.csv"), "w", newline=""), None, {}
    if rows:  # rewrite the rows up to the checkpoint; later ones are recomputed
        csv_writer = csv.DictWriter(csv_file, fieldnames=list(rows[0]))
        csv_writer.writeheader()
        csv_writer.writerows(rows)
    rows = list(rows)
    try:
        for iteration in range(start_iteration, args.num_iterations + 1):
            iter_start = time.perf_counter()
            lr_frac = 1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0
            optimizer.param_groups[0]["lr"] = lr_frac * args.learning_rate
            n_episodes_before = len(episode_returns)

            # ---- rollout: only the policy mean is evaluated per step; log-probs and values are
            # computed for the whole batch afterwards (same network, same parameters)
            noise = torch.randn((T, env.act_dim))
            with torch.inference_mode():
                # the noise scaled once per rollout, the mean without module calls, the action written through a
                # numpy view: the same operations as actor_mean(obs) + std * noise, bit for bit, and a rollout
                # 1.10x faster at width 256 (benchmarks/results/mujoco_rollout.md)
                scaled_noise = torch.exp(agent.actor_logstd) * noise
                numpy_mean = agent.numpy_mean_action() if args.compile else None
                noise_np = scaled_noise.numpy()
                for step in range(T):
                    obs_np[step] = next_obs
                    dones[step] = next_done
                    if numpy_mean is None:
                        action = agent.mean_action(obs[step]).add_(scaled_noise[step]).numpy()
                    else:  # --compile: the mean in numpy (same function, other rounding)
                        action = numpy_mean(obs_np[step]) + noise_np[step]
                    actions_np[step] = action
                    next_obs, rewards[step], next_done, episode = env.step(action)
                    if episode is not None:
                        episode_returns.append(episode[0])
                        episode_lengths.append(episode[1])
                        if writer is not None:
                            writer.add_scalar("charts/episodic_return", episode[0], global_step + step + 1)
                            writer.add_scalar("charts/episodic_length", episode[1], global_step + step + 1)
                global_step += T
                b_values = agent.critic(obs).squeeze(-1)
                next_value = float(agent.critic(torch.as_tensor(next_obs, dtype=torch.float32)))
                b_logprobs = agent.log_prob(agent.actor_mean(obs), actions)
            rollout_time = time.perf_counter() - iter_start

            # ---- GAE (numpy, float64)
            values_np = b_values.numpy().astype(np.float64)
            adv_np = np.zeros(T, np.float64)
            lastgaelam = 0.0
            for t in reversed(range(T)):
                if t == T - 1:
                    nextnonterminal, nextvalues = 1.0 - next_done, next_value
                else:
                    nextnonterminal, nextvalues = 1.0 - dones[t + 1], values_np[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values_np[t]
                adv_np[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            b_advantages = torch.as_tensor(adv_np, dtype=torch.float32)
            b_returns = torch.as_tensor(adv_np + values_np, dtype=torch.float32)
            b_values, b_logprobs = b_values.clone(), b_logprobs.clone()  # leave inference mode

            # ---- update (PPO / RGPO / AWR differ only in the policy loss of `minibatch_loss`)
            update_start = time.perf_counter()
            stats, losses = [], []
            g_sum = torch.zeros(n_policy_params) if compiled_step is None else compiled_step.g_sum.zero_()
            g_sqsum = 0.0
            epochs_run, backstop = 0, False
            # beta of this iteration: a tensor for the compiled step (a new float would recompile it)
            beta = kl_ctl.kl_coef if compiled_step is None else torch.tensor(kl_ctl.kl_coef)
            for epoch in range(args.update_epochs):
                perm = torch.randperm(T)
                epoch_logprobs, epoch_idx = [], []  # for the stats, reduced once per epoch
                idxs = perm.split(mb)
                batches = [
                    (
                        obs[idx],
                        actions[idx],
                        b_advantages[idx],
                        b_logprobs[idx],
                        b_returns[idx],
                        b_values[idx],
                        beta,
                    )
                    for idx in idxs
                ]
                fast = None if compiled_step is None else compiled_step.run(batches)  # lazy, 4 steps per call
                for j, (idx, batch) in enumerate(zip(idxs, batches, strict=True)):
                    if compiled_step is None:  # the eager step
                        loss, (newlogprob, pg_loss, v_loss) = loss_fn(agent, *batch)
                        check_finite(loss, pg_loss, v_loss, iteration, epoch, j)
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                        # gradient variance: policy-parameter gradients before clipping (see README)
                        g = torch.cat([p.grad.reshape(-1) for p in policy_params])
                        g_sum += g
                        g_sqsum += float(g.dot(g))
                        if args.max_grad_norm > 0:
                            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                        optimizer.step()
                    else:  # --compile: the same step, made by the compiled function; g_sum is accumulated inside
                        loss, (newlogprob, pg_loss, v_loss), g_sq = next(fast)
                        check_finite(loss, pg_loss, v_loss, iteration, epoch, j)  # the run stops
                        g_sqsum += float(g_sq)
                    epoch_logprobs.append(newlogprob.detach())
                    epoch_idx.append(idx)
                    losses.append(torch.stack([pg_loss.detach(), v_loss.detach()]))
                # per-mini-batch stats of this epoch (the log-probs each mini-batch's loss saw)
                stats.append(
                    rgpo_epoch_stats(torch.stack(epoch_logprobs), b_logprobs[torch.stack(epoch_idx)], gate)
                )
                epochs_run += 1
                backstop = args.kl_backstop > 0 and float(torch.cat(stats)[:, 0].mean()) > args.kl_backstop
                if backstop:
                    break
            update_time = time.perf_counter() - update_start
            with torch.no_grad():  # KL of the iteration's final policy to pi_old over the whole batch
                final_logprob = agent.log_prob(agent.actor_mean(obs), actions)
                kl_final = float(
                    rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(final_logprob - b_logprobs)).mean()
                )

            # ---- per-iteration metrics (same keys for every method)
            st = torch.cat(stats).double().numpy()
            ls = torch.stack(losses).double().numpy()
            n_mb = st.shape[0]
            g_mean = g_sum.double() / n_mb
            grad_var = max(g_sqsum / n_mb - float(g_mean.dot(g_mean)), 0.0) / n_policy_params
            var_y = float(np.var(adv_np + values_np))
            new_eps = episode_returns[n_episodes_before:]
            iter_time = time.perf_counter() - iter_start
            kl_mean = float(st[:, 0].mean())
            kl_coef_used = kl_ctl.kl_coef
            kl_ctl.update(kl_mean)  # paper Eq. beta_update (adaptive), from this iteration's mean KL
            row = {
                "iteration": iteration,
                "global_step": global_step,
                "time": time.time() - start_time,
                "episodic_return": float(np.mean(new_eps)) if new_eps else float("nan"),
                "return_last100": float(np.mean(episode_returns[-100:])) if episode_returns else float("nan"),
                "episodes": len(episode_returns),
                "kl": kl_mean,
                "kl_max": float(st[:, 0].max()),
                "spike": int(kl_mean > args.spike_kl),
                "kl_final": kl_final,
                "spike_final": int(kl_final > args.spike_kl),
                "ess": float(st[:, 1].mean()),
                "grad_var": grad_var,
                "policy_loss": float(ls[:, 0].mean()),
                "value_loss": float(ls[:, 1].mean()),
                "entropy": agent.entropy().item(),
                "explained_variance": float("nan") if var_y == 0 else 1 - float(np.var(adv_np)) / var_y,
                "learning_rate": optimizer.param_groups[0]["lr"],
                "epochs": epochs_run,
                "iter_time": iter_time,
                "rollout_time": rollout_time,
                "update_time": update_time,
                "SPS": global_step / (time.time() - start_time),
            }
            for j, name in enumerate(STAT_NAMES[2:], start=2):
                row[name] = float(st[:, j].max() if name.endswith("_max") else st[:, j].mean())
            row["kl_coef"] = kl_coef_used
            row["kl_coef_next"] = kl_ctl.kl_coef
            row["backstop"] = int(backstop)
            if csv_writer is None:
                csv_writer = csv.DictWriter(csv_file, fieldnames=list(row))
                csv_writer.writeheader()
            csv_writer.writerow(row)
            csv_file.flush()
            rows.append(row)
            if writer is not None:
                _write_tensorboard(writer, row, global_step)
            if args.verbose:
                print(
                    f"iter={iteration} step={global_step} return(last100)={row['return_last100']:.1f} "
                    f"kl={kl_mean:.4f} ess={row['ess']:.3f} SPS={int(row['SPS'])}",
                    flush=True,
                )
            if args.eval_every > 0 and args.eval_episodes > 0 and iteration % args.eval_every == 0:
                summary = eval_summary(evaluate(env, agent, args))
                eval_rows.append({"iteration": iteration, "global_step": global_step,
                                  **{k: summary[k] for k in ("eval_return_mean", "eval_return_std")}})  # fmt: skip
                write_eval_csv(run_dir, eval_rows)
            if (
                args.checkpoint_every > 0
                and iteration % args.checkpoint_every == 0
                and iteration < args.num_iterations
            ):
                progress = {
                    "iteration": iteration,
                    "global_step": global_step,
                    "elapsed": time.time() - start_time,
                    "episode_returns": episode_returns,
                    "episode_lengths": episode_lengths,
                    "next_done": next_done,
                    "resumed_at": resumed_at,
                    "commits": commits,
                    "rows": rows,
                    "eval_rows": eval_rows,
                }
                save_checkpoint(ckpt_path, {
                    "args": checkpoint_args(args), "progress": progress, "rng": rng_state(),
                    "next_obs": torch.from_numpy(np.array(next_obs)),
                    **{name: obj.state_dict() for name, obj in stateful.items()},
                })  # fmt: skip
        last = episode_returns[-100:]
        final = {
            "run_name": run_name,
            "env_id": args.env_id,
            "method": args.exp_name,
            "seed": args.seed,
            "global_step": global_step,
            "final_return": float(np.mean(last)) if last else float("nan"),
            "final_return_episodes": len(last),
            "episodes": len(episode_returns),
            "wall_time": time.time() - start_time,
            "SPS": global_step / (time.time() - start_time),
            "resumed_at_iterations": resumed_at,
            "git_commits": commits,
        }
        if args.eval_episodes > 0:
            final.update(eval_summary(evaluate(env, agent, args)), eval_seed=args.seed + EVAL_SEED_OFFSET)
        with open(os.path.join(run_dir, "final.json.tmp"), "w") as f:
            json.dump(final, f, indent=2)
        os.replace(
            os.path.join(run_dir, "final.json.tmp"), os.path.join(run_dir, "final.json")
        )  # never half-written
        if not args.keep_checkpoint and os.path.exists(ckpt_path):
            os.remove(ckpt_path)
    finally:
        csv_file.close()
        env.close()
        if writer is not None:
            writer.close()
    return final


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
    "kl_coef": "rgpo/kl_coef",
    "gate_mean": "rgpo/gate_mean",
    "weight_mean": "rgpo/weight_mean",
    "rejected_frac": "rgpo/rejected_frac",
    "ratio_max": "rgpo/ratio_max",
}


def _write_tensorboard(writer, row, global_step):
    for key, value in row.items():
        if key in ("iteration", "global_step", "time", "episodic_return", "episodes"):
            continue
        writer.add_scalar(TB_KEYS.get(key, f"stats/{key}"), value, global_step)


if __name__ == "__main__":
    try:
        main(tyro.cli(Args))
    except (NonFiniteLossError, CheckpointError) as e:
        raise SystemExit(f"ERROR: {e}") from e
