"""TRPO on a MuJoCo task, a baseline of the RGPO scripts: one natural-gradient policy step per rollout
(conjugate gradient on the Fisher-vector products of the closed-form Gaussian KL, then a backtracking line
search that enforces KL <= max_kl), then value-only Adam epochs. One file in CleanRL's structure."""

# docs: mujoco_baselines/README.md and docs/mujoco.md. The lab's grid runs this file as it is
# (rgpo_lab.mujoco_drive writes what it logs as the run's results; tests/test_mujoco_drive.py).
import functools
import math
import os
import random
import sys
import time
import warnings
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
    """the maximum norm for the gradient clipping of the value steps (<= 0 disables)"""
    hidden_size: int = 256
    """width of the two-layer tanh networks (the paper's 256; CleanRL's 64)"""
    compile: bool = False
    """the fast path: each value mini-batch update as one torch.compile'd function, the Fisher-vector products
    in closed form and the rollout's policy mean in numpy (needs a C++ compiler; the same algorithm, other
    float rounding)"""

    # TRPO specific
    max_kl: float = 0.01
    """trust-region size delta: the accepted step satisfies KL(pi_old || pi_new) <= delta (closed form, mean
    over the rollout's states)"""
    cg_iters: int = 10
    """conjugate-gradient iterations"""
    cg_damping: float = 0.1
    """damping added to the Fisher-vector product"""
    backtrack_iters: int = 10
    """line-search halvings before the step is rejected (parameters left unchanged)"""
    backtrack_coef: float = 0.5
    """line-search shrink factor"""

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


def gaussian_kl(old_mean, old_logstd, new_mean, new_logstd):
    """closed-form KL(N_old || N_new) per state, summed over action dimensions"""
    var_ratio = torch.exp(2 * (old_logstd - new_logstd))
    t = ((old_mean - new_mean) * torch.exp(-new_logstd)) ** 2
    return (new_logstd - old_logstd + 0.5 * (var_ratio + t) - 0.5).sum(-1)


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def set_flat_(params, vector):
    i = 0
    for p in params:
        p.copy_(vector[i : i + p.numel()].view_as(p))
        i += p.numel()


def fisher_vector_product(kl, params, damping):
    """v -> (F + damping I) v, F the Hessian of the mean KL `kl` at pi_old (the Fisher information): the KL
    gradient's graph is built once and differentiated again for each product"""
    kl_grad = flat(torch.autograd.grad(kl, params, create_graph=True))

    def fvp(v):
        return flat(torch.autograd.grad(kl_grad.dot(v), params, retain_graph=True)) + damping * v

    return fvp


def conjugate_gradient(fvp, b, iters, tol=1e-10):
    x = torch.zeros_like(b)
    r, p = b.clone(), b.clone()
    rr = r.dot(r)
    for _ in range(iters):
        fp = fvp(p)
        alpha = rr / p.dot(fp)
        x += alpha * p
        r -= alpha * fp
        rr_new = r.dot(r)
        if rr_new < tol:
            break
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def trpo_step(agent, obs, actions, oldlogprob, advantages, args):
    """One natural-gradient step with a backtracking line search that enforces KL <= max_kl. Returns (the
    surrogate loss before the step, the accepted step's KL, its fraction of the full step (0: rejected), the
    line-search evaluations, the log-probs of `actions` under the resulting policy); KL None: a non-finite
    loss."""
    params = agent.policy_parameters()
    old_logstd = agent.actor_logstd.detach().clone()

    def surrogate_and_kl(mean):  # one forward of the policy gives both
        logp = agent.log_prob(mean, actions)
        loss = -(torch.exp(logp - oldlogprob) * advantages).mean() - args.ent_coef * agent.entropy()
        return logp, loss, gaussian_kl(old_mean, old_logstd, mean, agent.actor_logstd).mean()

    mean = agent.actor_mean(obs)
    old_mean = mean.detach()
    logp, loss, kl = surrogate_and_kl(mean)
    logp = logp.detach()
    if not torch.isfinite(loss):
        return loss, None, None, None, logp
    grad = flat(torch.autograd.grad(loss, params, retain_graph=True))
    if args.compile:  # the same products in closed form
        fvp = gauss_newton_fvp(agent, obs, params, args.cg_damping)
    else:
        fvp = fisher_vector_product(kl, params, args.cg_damping)
    step_dir = conjugate_gradient(fvp, -grad, args.cg_iters)
    shs = 0.5 * step_dir.dot(fvp(step_dir))
    del fvp, kl, mean  # frees the KL graph before the line search
    full_step = (
        step_dir * torch.sqrt(2 * args.max_kl / shs.clamp_min(1e-12)) if shs > 0 else torch.zeros_like(grad)
    )
    old_params = flat([p.detach() for p in params]).clone()
    with torch.no_grad():
        frac = 1.0
        for n_eval in range(1, args.backtrack_iters + 1):
            set_flat_(params, old_params + frac * full_step)
            new_logp, new_loss, new_kl = surrogate_and_kl(agent.actor_mean(obs))
            new_kl = float(new_kl)
            if math.isfinite(new_kl) and new_kl <= args.max_kl and float(new_loss) < float(loss):
                return loss.detach(), new_kl, frac, n_eval, new_logp
            frac *= args.backtrack_coef
        set_flat_(params, old_params)
    return loss.detach(), 0.0, 0.0, args.backtrack_iters, logp


def value_minibatch_loss(agent, mb_obs, mb_returns, mb_values, args):
    """one value mini-batch's loss: (vf_coef * value loss, value loss)"""
    newvalue = agent.critic(mb_obs).squeeze(-1)
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb_returns) ** 2
        v_clipped = mb_values + torch.clamp(newvalue - mb_values, -args.vclip_coef, args.vclip_coef)
        v_loss_clipped = (v_clipped - mb_returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
    return args.vf_coef * v_loss, v_loss


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


def gauss_newton_fvp(agent, obs, params, damping):
    """v -> (F + damping I) v in closed form, F the Fisher information of pi_old on `obs`: at pi_old the
    Hessian of the mean KL is J^T diag(exp(-2 logstd)) J / N on actor_mean's parameters (J: the Jacobian of
    the mean over the batch) and 2 I on actor_logstd; J v is pushed forward and J^T u pulled back through
    actor_mean's activations at pi_old, computed once (the same products as fisher_vector_product, other float
    rounding)"""
    l0, _, l1, _, l2 = agent.actor_mean
    w1, w2 = l1.weight.detach(), l2.weight.detach()
    with torch.no_grad():
        h1 = torch.tanh(l0(obs))
        h2 = torch.tanh(l1(h1))
        dtanh1, dtanh2 = 1 - h1 * h1, 1 - h2 * h2
        precision = torch.exp(-2 * agent.actor_logstd) / obs.shape[0]

    def fvp(v):
        dw0, db0, dw1, db1, dw2, db2, dlogstd = (
            t.view_as(p) for t, p in zip(v.split([p.numel() for p in params]), params, strict=True)
        )
        dh1 = dtanh1 * torch.addmm(db0, obs, dw0.T)  # J v, layer by layer
        dh2 = dtanh2 * torch.addmm(db1, h1, dw1.T).addmm_(dh1, w1.T)
        u = torch.addmm(db2, h2, dw2.T).addmm_(dh2, w2.T) * precision
        g2 = (u @ w2) * dtanh2  # J^T u, layer by layer
        g1 = (g2 @ w1) * dtanh1
        products = (g1.T @ obs, g1.sum(0), g2.T @ h1, g2.sum(0), u.T @ h2, u.sum(0), 2 * dlogstd)
        return torch.cat([t.reshape(-1) for t in products]) + damping * v

    return fvp


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
    optimizer = torch.optim.Adam(agent.critic.parameters(), lr=args.learning_rate, eps=1e-5)  # the value's
    if args.compile:  # --compile: the value step compiled once, the rollout's policy mean in numpy
        loss_fn = functools.partial(value_minibatch_loss, args=args)
        update_step = compiled_update(agent, optimizer, loss_fn, args.max_grad_norm)
        policy_mean = numpy_policy_mean(agent)

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

        # rollout: the exploration noise is drawn for the whole rollout at once, the policy mean step by step
        noise = torch.randn((args.num_steps, env.act_dim))
        with torch.no_grad():
            scaled_noise = torch.exp(agent.actor_logstd) * noise
            for step in range(args.num_steps):
                global_step += 1
                obs[step] = torch.as_tensor(next_obs)
                dones[step] = next_done
                if args.compile:
                    action = torch.from_numpy(policy_mean(obs[step].numpy()) + scaled_noise[step].numpy())
                else:
                    action = agent.actor_mean(obs[step]) + scaled_noise[step]
                actions[step] = action
                next_obs, rewards[step], next_done, episode = env.step(action.numpy())
                if episode is not None:
                    writer.add_scalar("charts/episodic_return", episode[0], global_step)
                    writer.add_scalar("charts/episodic_length", episode[1], global_step)
            # values and log-probs, for the whole rollout
            b_values = agent.critic(obs).squeeze(-1)
            next_value = float(agent.critic(torch.as_tensor(next_obs, dtype=torch.float32)))
            b_logprobs = agent.log_prob(agent.actor_mean(obs), actions)

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

        # Optimizing the policy: one TRPO step on the whole rollout
        b_adv = b_advantages
        if args.norm_adv:
            b_adv = (b_advantages - b_advantages.mean()) / (b_advantages.std() + 1e-8)
        stat_inds = torch.randperm(args.batch_size).split(args.minibatch_size)  # the statistics' mini-batches
        pg_loss, trpo_kl, step_frac, ls_evals, newlogprob = trpo_step(
            agent, obs, actions, b_logprobs, b_adv, args
        )
        if trpo_kl is None:
            sys.exit(f"error: non-finite loss at iteration {iteration} (TRPO surrogate): stopping")
        with torch.no_grad():  # KL to pi_old and ESS of the accepted step, per mini-batch
            logratio = newlogprob - b_logprobs
            approx_kls = [
                rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(logratio[inds])).mean().item()
                for inds in stat_inds
            ]
            esss = [rgpo_trl.effective_sample_size(logratio[inds].exp()).item() for inds in stat_inds]
            # the final policy's KL over the whole batch (kl_final; the value epochs leave the policy as is)
            final_kl = rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(logratio)).mean().item()
        approx_kl = float(np.mean(approx_kls))

        # Optimizing the value network: update_epochs epochs of mini-batches
        v_losses = []
        for epoch in range(args.update_epochs):
            for mb_inds in torch.randperm(args.batch_size).split(args.minibatch_size):
                mb = (obs[mb_inds], b_returns[mb_inds], b_values[mb_inds])
                if args.compile:  # the loss, its gradient, the clip and Adam's step in one compiled call
                    loss, v_loss = update_step(*mb)
                else:
                    loss, v_loss = value_minibatch_loss(agent, *mb, args)
                    optimizer.zero_grad()
                    loss.backward()
                    if args.max_grad_norm > 0:
                        nn.utils.clip_grad_norm_(agent.critic.parameters(), args.max_grad_norm)
                    optimizer.step()
                if not torch.isfinite(loss):
                    sys.exit(
                        f"error: non-finite value loss at iteration {iteration}, epoch {epoch}: stopping"
                    )
                v_losses.append(v_loss.item())

        var_y = np.var(advantages + values)  # returns = advantages + values
        explained_var = np.nan if var_y == 0 else 1 - np.var(advantages) / var_y

        # record rewards for plotting purposes
        sps = int(global_step / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("losses/value_loss", np.mean(v_losses), global_step)
        writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
        writer.add_scalar("losses/entropy", agent.entropy().item(), global_step)
        writer.add_scalar("losses/old_approx_kl", (-logratio).mean().item(), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl, global_step)
        writer.add_scalar("losses/max_approx_kl", max(approx_kls), global_step)  # the largest mini-batch's
        writer.add_scalar("losses/final_approx_kl", final_kl, global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("trpo/kl", trpo_kl, global_step)
        writer.add_scalar("trpo/step_frac", step_frac, global_step)
        writer.add_scalar("trpo/linesearch_evals", ls_evals, global_step)
        writer.add_scalar("trpo/ess", np.mean(esss), global_step)
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
