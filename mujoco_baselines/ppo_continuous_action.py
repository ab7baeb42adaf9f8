"""PPO (clipped surrogate) on a MuJoCo task, the baseline of the RGPO scripts: one file in CleanRL's
structure, with RGPO's stale-sample flags and, optionally, its KL-to-old penalty (--kl-penalty)."""

# docs: mujoco_baselines/README.md and docs/mujoco.md. The lab's grid runs this file as it is
# (rgpo_lab.mujoco_drive writes what it logs as the run's results; tests/test_mujoco_drive.py).
import copy
import functools
import math
import os
import random
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import mujoco
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter

import rgpo_trl


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    torch_threads: int = 1
    """torch intra-op threads (1 is fastest for these small networks; CPU only)"""
    save_model: bool = False
    """whether to save the model into the `runs/{run_name}` folder"""
    eval_episodes: int = 10
    """episodes of the deterministic evaluation at the end (the policy mean, observation statistics frozen,
    seed + 10000); 0 skips it"""

    # Algorithm specific arguments
    env_id: str = "HalfCheetah-v4"
    """the id of the environment (a MuJoCo task with Box actions; v4 and v5 ids)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_steps: int = 2048
    """the number of steps to run in the environment per policy rollout (one environment)"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    vclip_coef: float = 0.2
    """the value clipping coefficient (CleanRL's clip_coef clips the value too)"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping (<= 0 disables)"""
    hidden_size: int = 256
    """width of the two-layer tanh networks (the paper's 256; CleanRL's 64)"""
    compile: bool = False
    """the fast path: each mini-batch update as one torch.compile'd function and the rollout's policy mean in
    numpy (needs a C++ compiler; the same algorithm, other float rounding)"""

    # PPO specific
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    target_kl: float | None = None
    """leave the epoch loop after an epoch when the iteration's mean KL so far exceeds this (default: off)"""

    # RGPO's trust-region machinery on PPO's clip (off by default): with --decoupled, PPO that differs from
    # decoupled RGPO only in clipping where RGPO gates
    kl_penalty: bool = False
    """add RGPO's KL-to-old penalty beta * mean(r - 1 - log r) to the clipped surrogate (unweighted under
    --decoupled), beta set after every iteration by --kl-controller, and RGPO's backstop --kl-backstop"""
    kl_controller: str = "adaptive"
    """with --kl-penalty: beta after each iteration: adaptive (paper Eq. beta_update) or fixed"""
    kl_coef: float = rgpo_trl.PAPER_KL_DEFAULTS["kl_coef"]
    """with --kl-penalty: initial coefficient beta_0"""
    kl_target: float = rgpo_trl.PAPER_KL_DEFAULTS["kl_target"]
    """with --kl-penalty: target KL Delta"""
    kl_coef_min: float = rgpo_trl.PAPER_KL_DEFAULTS["kl_coef_min"]
    """with --kl-penalty: lower bound of beta"""
    kl_coef_max: float = rgpo_trl.PAPER_KL_DEFAULTS["kl_coef_max"]
    """with --kl-penalty: upper bound of beta"""
    kl_backstop: float = 0.1
    """with --kl-penalty: leave the epoch loop after an epoch when the iteration's mean KL so far exceeds this
    (<= 0 disables)"""

    # Stale samples
    policy_lag: int = 0
    """collect iteration t's rollout with the actor of iteration t - L, as asynchronous actors that run L
    updates behind the learner (the critic stays current); 0: on-policy"""
    decoupled: bool = False
    """the decoupled objective (Hilton et al., 2021): clip the ratio to the proximal policy pi_prox (the
    learner as the update starts), each sample weighted by min(pi_prox / pi_behaviour, max_is_weight)"""
    max_is_weight: float = 1.0
    """truncation of the decoupled objective's importance weight (V-trace's rho-bar); > 0"""

    # to be filled in runtime
    batch_size: tyro.conf.Suppress[int] = 0
    minibatch_size: tyro.conf.Suppress[int] = 0
    num_iterations: tyro.conf.Suppress[int] = 0


def mujoco_warning(message):
    """MuJoCo's warnings, less the one on every load of gymnasium's v4 HalfCheetah and Ant (settotalmass)"""
    if "settotalmass" not in message:
        print(f"WARNING: {message}", file=sys.stderr)


mujoco.set_mju_user_warning(mujoco_warning)


class RunningMeanStd:
    """gymnasium's running mean / variance, updated one sample at a time."""

    def __init__(self, shape=()):
        self.mean, self.var, self.count = np.zeros(shape), np.ones(shape), 1e-4

    def update(self, x):
        delta, total = x - self.mean, self.count + 1.0
        self.mean = self.mean + delta / total
        self.var = (self.var * self.count + delta * delta * (self.count / total)) / total
        self.count = total


class NormalizedEnv:
    """One environment with gymnasium's NormalizeObservation (clipped to +-10) and NormalizeReward (clipped to
    +-10) written out: explicit resets, so no autoreset transitions, and raw episode returns. Hand-written for
    speed: results/benchmarks/env_wrappers.md."""

    def __init__(self, env_id, gamma):
        self.env = gym.make(env_id)
        for what, space in (("action", self.env.action_space), ("observation", self.env.observation_space)):
            if not isinstance(space, gym.spaces.Box):
                raise ValueError(f"env_id {env_id!r} has a {type(space).__name__} {what} space; need Box")
        self.obs_dim, self.act_dim = self.env.observation_space.shape[0], self.env.action_space.shape[0]
        self.low, self.high, self.gamma = self.env.action_space.low, self.env.action_space.high, gamma
        self.obs_rms, self.ret_rms = RunningMeanStd((self.obs_dim,)), RunningMeanStd()
        self.discounted, self.ep_return, self.ep_length = 0.0, 0.0, 0

    def normalize(self, obs):
        obs = np.asarray(obs, np.float64)
        self.obs_rms.update(obs)
        return np.clip((obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8), -10.0, 10.0)

    def reset(self, seed):
        obs, _ = self.env.reset(seed=seed)
        self.env.action_space.seed(seed)
        return self.normalize(obs)

    def step(self, action):
        """-> (normalised next obs, scaled reward, done, the finished episode's (return, length) or None)"""
        obs, reward, terminated, truncated, _ = self.env.step(np.clip(action, self.low, self.high))
        self.ep_return, self.ep_length = self.ep_return + float(reward), self.ep_length + 1
        self.discounted = self.discounted * self.gamma * (1.0 - float(terminated)) + float(reward)
        self.ret_rms.update(self.discounted)
        reward = min(max(float(reward) / math.sqrt(self.ret_rms.var + 1e-8), -10.0), 10.0)
        episode = None
        if terminated or truncated:
            episode, self.ep_return, self.ep_length = (self.ep_return, self.ep_length), 0.0, 0
            obs, _ = self.env.reset()
        return self.normalize(obs), reward, terminated or truncated, episode

    def close(self):
        self.env.close()


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim, act_dim, hidden):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, act_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(act_dim))

    def policy_parameters(self):
        return [*self.actor_mean.parameters(), self.actor_logstd]

    def log_prob(self, mean, action):
        """the diagonal Gaussian's log-density of `action`, summed over action dimensions"""
        z = (action - mean) * torch.exp(-self.actor_logstd)
        return -0.5 * (z * z).sum(-1) - (
            self.actor_logstd.sum() + 0.5 * mean.shape[-1] * math.log(2 * math.pi)
        )

    def entropy(self):
        return self.actor_logstd.sum() + 0.5 * self.actor_logstd.numel() * (1.0 + math.log(2 * math.pi))


def minibatch_loss(
    agent, mb_obs, mb_actions, mb_advantages, mb_oldlogprobs, mb_returns, mb_values, mb_weights, beta, args
):
    """one mini-batch's loss and what the statistics need: (loss, (new log-probs, policy loss, value loss));
    `mb_weights`: the decoupled objective's weights or None, `beta`: --kl-penalty's coefficient or None"""
    newlogprob = agent.log_prob(agent.actor_mean(mb_obs), mb_actions)
    newvalue = agent.critic(mb_obs).squeeze(-1)
    if args.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

    # Policy loss (with --decoupled each sample weighted, with --kl-penalty RGPO's penalty added)
    logratio = newlogprob - mb_oldlogprobs
    ratio = logratio.exp()
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2)
    pg_loss = (pg_loss if mb_weights is None else mb_weights * pg_loss).mean()
    if beta is not None:
        log_r = rgpo_trl.clamp_log_ratio(newlogprob - mb_oldlogprobs)
        pg_loss = pg_loss + beta * rgpo_trl.kl_old_estimate(log_r).mean()

    # Value loss
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb_returns) ** 2
        v_clipped = mb_values + torch.clamp(newvalue - mb_values, -args.vclip_coef, args.vclip_coef)
        v_loss_clipped = (v_clipped - mb_returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()

    loss = pg_loss - args.ent_coef * agent.entropy() + args.vf_coef * v_loss
    return loss, (newlogprob, pg_loss, v_loss)


# ------------------------------------------------------------------------------------------------------------
# --compile, the fast path (LeanRL's way, in this file). The eager mini-batch step (backward, clip_grad_norm_,
# Adam's step) is hundreds of small operator calls, each costing more than its arithmetic at this width; here
# the same step is one pure function, torch.func's gradient of the mini-batch loss above, then the clip and
# torch's Adam written out, that torch.compile turns into a few kernels updating the parameters and Adam's
# state in place. The rollout's policy mean runs in numpy on views of the same weights. The same algorithm;
# the floats round differently from the eager path. Equal bit for bit to the --compile of the lab's former
# copy that made the committed --compile runs (checked up to 6944b5d); results/benchmarks/script_compile.md.
# ------------------------------------------------------------------------------------------------------------
def require_cpp_compiler():
    """stop at start-up, in one line, when torch.compile's CPU backend has no C++ compiler"""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as err:  # a private helper: its location or errors may change between torch versions
        sys.exit(f"error: compile: torch.compile needs a C++ compiler ({err}); install g++ or run without it")


def numpy_policy_mean(actor):
    """actor.actor_mean as numpy on views of its weights (they follow every in-place update)"""
    (w0, b0), (w1, b1), (w2, b2) = [
        (m.weight.detach().numpy(), m.bias.detach().numpy()) for m in actor.actor_mean[::2]
    ]
    return lambda x: w2 @ np.tanh(w1 @ np.tanh(w0 @ x + b0) + b1) + b2


class LossModule(nn.Module):
    """loss_fn(agent, *batch) as a module, so torch.func.functional_call can substitute its parameters"""

    def __init__(self, agent, loss_fn):
        super().__init__()
        self.agent, self.loss_fn = agent, loss_fn

    def forward(self, *batch):
        return self.loss_fn(self.agent, *batch)


def compiled_update(agent, optimizer, loss_fn, max_grad_norm):
    """-> step(*batch) -> (loss, aux): loss, aux = loss_fn(agent, *batch); loss.backward();
    clip_grad_norm_(max_grad_norm); optimizer.step(), as one compiled function (Adam: one group, no weight
    decay); the learning rate is read from the optimizer at every call"""
    module = LossModule(agent, loss_fn)
    (group,) = optimizer.param_groups
    params = group["params"]
    by_id = {id(p): name for name, p in module.named_parameters()}
    names = [by_id[id(p)] for p in params]
    (beta1, beta2), eps = group["betas"], group["eps"]

    def pure_step(params, exp_avgs, exp_avg_sqs, steps, step_size, bc2_sqrt, *batch):
        def loss_of(p):
            loss, aux = torch.func.functional_call(module, p, batch, strict=False, tie_weights=False)
            return loss, (loss, aux)

        with torch.enable_grad():
            grads, (loss, aux) = torch.func.grad(loss_of, has_aux=True)(dict(zip(names, params, strict=True)))
        grads = [grads[n] for n in names]
        if max_grad_norm > 0:  # nn.utils.clip_grad_norm_
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]), 2.0
            )
            grads = [g * torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0) for g in grads]
        for p, g, m, v, s in zip(
            params, grads, exp_avgs, exp_avg_sqs, steps, strict=True
        ):  # torch.optim.Adam
            s.add_(1.0)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(step_size * m / ((v.sqrt() / bc2_sqrt) + eps))
        return loss.detach(), aux

    pure_step = torch.compile(pure_step, fullgraph=True)

    def step(*batch):
        for p in params:  # Adam's state, created as torch.optim.Adam creates it
            if not optimizer.state[p]:
                optimizer.state[p] = {
                    "step": torch.tensor(0.0),
                    "exp_avg": torch.zeros_like(p),
                    "exp_avg_sq": torch.zeros_like(p),
                }
        states = [optimizer.state[p] for p in params]
        k = float(states[0]["step"]) + 1.0  # the bias corrections in Python floats, as torch.optim.Adam
        with torch.no_grad():
            return pure_step(
                [p.detach() for p in params],
                [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states],
                [s["step"] for s in states],
                torch.tensor(group["lr"] / (1.0 - beta1**k)),
                torch.tensor((1.0 - beta2**k) ** 0.5),
                *batch,
            )

    return step


if __name__ == "__main__":
    args = tyro.cli(Args, description=__doc__)
    args.batch_size = args.num_steps
    args.minibatch_size = args.batch_size // max(args.num_minibatches, 1)
    args.num_iterations = args.total_timesteps // args.batch_size
    try:  # a bad input stops here, in one line naming the field, before anything is written
        gym.spec(args.env_id)  # the environment first: a wrong name is the error to fix
        if args.num_iterations < 1:
            raise ValueError(
                f"total_timesteps must be >= num_steps ({args.num_steps}), got {args.total_timesteps}"
            )
        if args.num_minibatches < 1 or args.batch_size % args.num_minibatches:
            raise ValueError(
                f"num_minibatches must divide num_steps ({args.num_steps}), got {args.num_minibatches}"
            )
        if args.policy_lag < 0:
            raise ValueError(f"policy_lag must be an integer >= 0 (0: on-policy), got {args.policy_lag}")
        if not args.max_is_weight > 0:
            raise ValueError(f"max_is_weight must be > 0, got {args.max_is_weight}")
        kl_fields = ("kl_controller", "kl_coef", "kl_target", "kl_coef_min", "kl_coef_max", "kl_backstop")
        unused = [f for f in kl_fields if getattr(args, f) != getattr(Args, f)]
        if unused and not args.kl_penalty:
            raise ValueError(f"{', '.join(unused)} only take effect with --kl-penalty")
        kl_ctl = None
        if args.kl_penalty:
            kl_ctl = rgpo_trl.make_kl_controller(
                args.kl_controller,
                kl_coef=args.kl_coef,
                kl_target=args.kl_target,
                kl_coef_min=args.kl_coef_min,
                kl_coef_max=args.kl_coef_max,
            )
        if args.eval_episodes < 0:
            raise ValueError(
                f"eval_episodes must be an integer >= 0 (0: no evaluation), got {args.eval_episodes}"
            )
        env = NormalizedEnv(args.env_id, args.gamma)
    except gym.error.Error as err:
        sys.exit(f"error: env_id: {err}")
    except ValueError as err:
        sys.exit(f"error: {err}")
    if args.total_timesteps % args.num_steps:  # iterations are whole rollouts
        print(
            f"total_timesteps {args.total_timesteps} is not a multiple of num_steps {args.num_steps}: "
            f"running {args.num_iterations} iterations = {args.num_iterations * args.num_steps} steps"
        )
    if args.compile:  # before anything is written
        require_cpp_compiler()
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()),
    )

    # seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(args.torch_threads)

    agent = Agent(env.obs_dim, env.act_dim, args.hidden_size)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    # --policy-lag L: the actor that collects holds the policy weights of L iterations before (a ring of them)
    actor = copy.deepcopy(agent) if args.policy_lag > 0 else agent
    past_policies = deque(maxlen=args.policy_lag + 1)
    if args.compile:  # --compile: the update step compiled once, the rollout's policy mean in numpy
        update_step = compiled_update(
            agent, optimizer, functools.partial(minibatch_loss, args=args), args.max_grad_norm
        )
        policy_mean = numpy_policy_mean(actor)

    # storage: one environment; rewards, dones and GAE in float64
    obs = torch.zeros((args.num_steps, env.obs_dim))
    actions = torch.zeros((args.num_steps, env.act_dim))
    rewards = np.zeros(args.num_steps)
    dones = np.zeros(args.num_steps)

    # start the game
    global_step = 0
    start_time = time.time()
    next_obs, next_done = env.reset(seed=args.seed), False

    for iteration in range(1, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate
        if args.policy_lag > 0:  # remember the learner's policy, act with the one of L iterations before
            past_policies.append([p.detach().clone() for p in agent.policy_parameters()])
            with torch.no_grad():
                for p, past in zip(actor.policy_parameters(), past_policies[0], strict=True):
                    p.copy_(past)

        # rollout: the exploration noise is drawn for the whole rollout at once, the policy mean step by step
        noise = torch.randn((args.num_steps, env.act_dim))
        with torch.no_grad():
            scaled_noise = torch.exp(actor.actor_logstd) * noise
            for step in range(args.num_steps):
                global_step += 1
                obs[step] = torch.as_tensor(next_obs)
                dones[step] = next_done
                if args.compile:
                    action = torch.from_numpy(policy_mean(obs[step].numpy()) + scaled_noise[step].numpy())
                else:
                    action = actor.actor_mean(obs[step]) + scaled_noise[step]
                actions[step] = action
                next_obs, rewards[step], next_done, episode = env.step(action.numpy())
                if episode is not None:
                    writer.add_scalar("charts/episodic_return", episode[0], global_step)
                    writer.add_scalar("charts/episodic_length", episode[1], global_step)
            # values (the current critic) and the behaviour policy's log-probs, for the whole rollout
            b_values = agent.critic(obs).squeeze(-1)
            next_value = float(agent.critic(torch.as_tensor(next_obs, dtype=torch.float32)))
            b_logprobs = actor.log_prob(actor.actor_mean(obs), actions)

        # bootstrap value if not done; GAE in float64
        values = b_values.numpy().astype(np.float64)
        advantages = np.zeros(args.num_steps)
        lastgaelam = 0.0
        for t in reversed(range(args.num_steps)):
            if t == args.num_steps - 1:
                nextnonterminal, nextvalues = 1.0 - next_done, next_value
            else:
                nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
            delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
        b_advantages = torch.as_tensor(advantages, dtype=torch.float32)
        b_returns = torch.as_tensor(advantages + values, dtype=torch.float32)

        # the ratio's anchor: the behaviour policy, or with --decoupled the proximal one with the truncated
        # weight min(pi_prox / pi_behaviour, max_is_weight)
        b_oldlogprobs, b_weights = b_logprobs, None
        if args.policy_lag > 0 or args.decoupled:
            with torch.no_grad():
                prox_logprobs = agent.log_prob(agent.actor_mean(obs), actions)
            log_r = prox_logprobs.double() - b_logprobs.double()
            writer.add_scalar("stale/behaviour_kl", float((torch.expm1(log_r) - log_r).mean()), global_step)
            if args.decoupled:
                b_oldlogprobs = prox_logprobs
                b_weights = (prox_logprobs - b_logprobs).exp().clamp(max=args.max_is_weight)

        # Optimizing the policy and value network
        beta = None if kl_ctl is None else float(kl_ctl.kl_coef)  # --kl-penalty: this iteration's beta
        # the compiled step takes beta as a tensor (a new Python float would compile it again)
        mb_beta = torch.tensor(beta) if args.compile and beta is not None else beta
        pg_losses, v_losses, old_approx_kls, approx_kls, clipfracs, esss = ([] for _ in range(6))
        for epoch in range(args.update_epochs):
            epoch_inds = torch.randperm(args.batch_size).split(args.minibatch_size)
            newlogprobs = []
            for mb_inds in epoch_inds:
                mb_weights = None if b_weights is None else b_weights[mb_inds]
                mb = (obs, actions, b_advantages, b_oldlogprobs, b_returns, b_values)
                mb = (*(t[mb_inds] for t in mb), mb_weights, mb_beta)
                if args.compile:  # the loss, its gradient, the clip and Adam's step in one compiled call
                    loss, (newlogprob, pg_loss, v_loss) = update_step(*mb)
                else:
                    loss, (newlogprob, pg_loss, v_loss) = minibatch_loss(agent, *mb, args=args)
                    optimizer.zero_grad()
                    loss.backward()
                    if args.max_grad_norm > 0:
                        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
                if not torch.isfinite(loss):
                    sys.exit(f"error: non-finite loss at iteration {iteration}, epoch {epoch}: stopping")

                newlogprobs.append(newlogprob.detach())
                pg_losses.append(pg_loss.item())
                v_losses.append(v_loss.item())
                old_approx_kls.append((b_oldlogprobs[mb_inds] - newlogprob).mean().item())

            # the epoch's statistics per mini-batch, from the log-probs each mini-batch's loss saw
            logratios = torch.stack(newlogprobs) - b_oldlogprobs[torch.stack(epoch_inds)]
            ratios = logratios.exp()
            approx_kls += rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(logratios)).mean(-1).tolist()
            clipfracs += ((ratios - 1.0).abs() > args.clip_coef).float().mean(-1).tolist()
            clipped = ratios.clamp(1 - args.clip_coef, 1 + args.clip_coef)
            esss += rgpo_trl.effective_sample_size(clipped, dim=-1).tolist()
            if args.target_kl is not None and np.mean(approx_kls) > args.target_kl:
                break
            if beta is not None and args.kl_backstop > 0 and np.mean(approx_kls) > args.kl_backstop:
                break

        # the final policy's KL to pi_old over the whole batch, after the update (the lab's kl_final)
        with torch.no_grad():
            final_logratio = agent.log_prob(agent.actor_mean(obs), actions) - b_oldlogprobs
            final_kl = rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(final_logratio)).mean().item()
        approx_kl = float(np.mean(approx_kls))
        if (
            kl_ctl is not None
        ):  # the next iteration's beta, from this iteration's mean KL (paper Eq. beta_update)
            kl_ctl.update(approx_kl)

        var_y = np.var(advantages + values)  # returns = advantages + values
        explained_var = np.nan if var_y == 0 else 1 - np.var(advantages) / var_y

        # record rewards for plotting purposes
        sps = int(global_step / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("losses/value_loss", np.mean(v_losses), global_step)
        writer.add_scalar("losses/policy_loss", np.mean(pg_losses), global_step)
        writer.add_scalar("losses/entropy", agent.entropy().item(), global_step)
        writer.add_scalar("losses/old_approx_kl", np.mean(old_approx_kls), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl, global_step)
        writer.add_scalar("losses/max_approx_kl", max(approx_kls), global_step)  # the largest mini-batch's
        writer.add_scalar("losses/final_approx_kl", final_kl, global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("losses/clipfrac", np.mean(clipfracs), global_step)
        writer.add_scalar("ppo/ess", np.mean(esss), global_step)
        writer.add_scalar("ppo/epochs", epoch + 1, global_step)
        if beta is not None:
            writer.add_scalar("ppo/kl_coef", beta, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        print(f"iteration={iteration} global_step={global_step} approx_kl={approx_kl:.4f} SPS={sps}")

    # deterministic evaluation, as the committed runs': the policy mean on a new environment (seed + 10000),
    # observations normalised with the training statistics frozen at the end, undiscounted returns
    if args.eval_episodes > 0:
        with warnings.catch_warnings():  # the v4 ids' deprecation notice was shown by the training env
            warnings.simplefilter("ignore", DeprecationWarning)
            eval_env = gym.make(args.env_id)
        obs_mean, obs_std = env.obs_rms.mean.copy(), np.sqrt(env.obs_rms.var + 1e-8)
        eval_returns = []
        eval_obs, _ = eval_env.reset(seed=args.seed + 10000)
        for _ in range(args.eval_episodes):
            total, done = 0.0, False
            while not done:
                x = np.clip((np.asarray(eval_obs, np.float64) - obs_mean) / obs_std, -10.0, 10.0)
                with torch.no_grad():
                    action = agent.actor_mean(torch.as_tensor(x, dtype=torch.float32)).numpy()
                eval_obs, reward, terminated, truncated, _ = eval_env.step(np.clip(action, env.low, env.high))
                total, done = total + float(reward), terminated or truncated
            eval_returns.append(total)
            eval_obs, _ = eval_env.reset()
        eval_env.close()
        eval_mean = math.fsum(eval_returns) / len(eval_returns)
        eval_std = float(np.std(eval_returns, ddof=1)) if len(eval_returns) > 1 else math.nan
        for idx, episodic_return in enumerate(eval_returns):  # one per episode, as CleanRL's evals
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(
            f"eval: {eval_mean:.1f} ± {eval_std:.1f} over {args.eval_episodes} episodes "
            f"(deterministic policy): {', '.join(f'{r:.1f}' for r in eval_returns)}"
        )

    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        torch.save(agent.state_dict(), model_path)
        print(f"model saved to {model_path}")
    env.close()
    writer.close()
