# TRPO (natural gradient + KL-enforcing backtracking line search) on MuJoCo, CleanRL-style single file.
# One constrained policy step per rollout (10 conjugate-gradient iterations on the Fisher-vector
# product of the closed-form Gaussian KL), then value-only Adam epochs.
# Part of rgpo-trl's MuJoCo baselines: ppo / rgpo / trpo / awr share every line except the policy
# update (see mujoco_baselines/README.md). Structure follows CleanRL's ppo_continuous_action.py.
from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass

import torch
import tyro

import rgpo_trl
from mujoco_baselines.common import (
    SPIKE_KL,
    Agent,
    IterationTimes,
    MinibatchStats,
    MujocoEnv,
    NonFiniteLossError,
    Rollout,
    TrainingRun,
    UpdateStep,
    UpdateSummary,
    cli,
    gradient_variance,
    resolve_args,
    seed_everything,
)
from mujoco_baselines.compiled_update import gauss_newton_fvp

DESCRIPTION = (
    "TRPO (natural gradient with a KL line search) on a MuJoCo task, "
    "CleanRL-style single file (rgpo-trl's MuJoCo baselines)."
)


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
    """where checkpoint.pt goes (default: the run directory); mujoco_grid.py keeps checkpoints out of results/"""
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
    """the fast path: each value mini-batch update as one torch.compile'd function (compiled_update.py; needs
    a C++ compiler), the Fisher-vector products in closed form (gauss_newton_fvp) and the rollout's policy
    mean in numpy: the same algorithm, float rounding differs; see results/benchmarks/mujoco_compile.md for
    speed and equivalence"""

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

    # TRPO specific
    max_kl: float = 0.01
    """trust-region size delta: the accepted step satisfies KL(pi_old || pi_new) <= delta (closed form,
    mean over the rollout's states)"""
    cg_iters: int = 10
    """conjugate-gradient iterations"""
    cg_damping: float = 0.1
    """damping added to the Fisher-vector product"""
    backtrack_iters: int = 10
    """line-search halvings before the step is rejected (parameters left unchanged)"""
    backtrack_coef: float = 0.5
    """line-search shrink factor"""

    # derived from the above at start (not command-line options)
    batch_size: tyro.conf.Suppress[int] = 0
    num_iterations: tyro.conf.Suppress[int] = 0


# --------------------------------------------------------------------------------------------- #
# Method-specific part: the TRPO step.
# --------------------------------------------------------------------------------------------- #
def trpo_policy_loss(newlogprob, oldlogprob, advantages):
    """Importance-sampled surrogate loss -mean(r A) (minimised)."""
    return -(torch.exp(newlogprob - oldlogprob) * advantages).mean()


def gaussian_kl(old_mean, old_logstd, new_mean, new_logstd):
    """Closed-form KL(N_old || N_new) per state, summed over action dims."""
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


def fisher_vector_product(agent, obs, kl, params, damping):
    """v -> (H + damping I) v, H the Hessian of `kl` (the mean KL to pi_old at pi_old: the Fisher
    information).

    The KL gradient's graph is built once and each product differentiates through it again: the same products
    bit for bit as rebuilding it per product, with one backward per CG iteration instead of a forward and two
    backwards (speed: results/benchmarks/trpo_fvp.md)."""
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


def trpo_step(agent, params, obs, actions, oldlogprob, advantages, args, make_fvp=fisher_vector_product):
    """One natural-gradient step with a backtracking line search that enforces KL <= max_kl.

    One forward of the policy per evaluation gives both the surrogate and the KL. Returns (surrogate loss
    before the step, closed-form KL of the accepted step, accepted step fraction (0 = rejected), line-search
    evaluations, log-probs of `actions` under the resulting policy)."""
    old_logstd = agent.actor_logstd.detach().clone()

    def surrogate_and_kl(mean):
        logp = agent.log_prob(mean, actions)
        loss = trpo_policy_loss(logp, oldlogprob, advantages) - args.ent_coef * agent.entropy()
        return logp, loss, gaussian_kl(old_mean, old_logstd, mean, agent.actor_logstd).mean()

    mean = agent.actor_mean(obs)
    old_mean = mean.detach()
    logp, loss, kl = surrogate_and_kl(mean)
    logp = logp.detach()
    if not torch.isfinite(loss):
        return loss, None, None, None, logp
    grad = flat(torch.autograd.grad(loss, params, retain_graph=True))  # the autograd products reuse the graph
    fvp = make_fvp(agent, obs, kl, params, args.cg_damping)
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
    """The value loss of one mini-batch (the value-only epochs after the policy step), for the eager step and
    the --compile step alike."""
    newvalue = agent.critic(mb_obs).squeeze(-1)
    if args.clip_vloss:
        v_clipped = mb_values + (newvalue - mb_values).clamp(-args.vclip_coef, args.vclip_coef)
        v_loss = 0.5 * torch.max((newvalue - mb_returns) ** 2, (v_clipped - mb_returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
    return args.vf_coef * v_loss, v_loss


def main(args: Args) -> dict:
    resolve_args(args)  # derived fields and input checks, before anything is created
    run = TrainingRun(args, TB_KEYS)  # run directory, config.json, TensorBoard, the checkpoint if resuming
    seed_everything(args)

    env = MujocoEnv(args)
    agent = Agent(env.obs_dim, env.act_dim, args)
    # value-only optimiser: the policy moves by the TRPO step
    optimizer = torch.optim.Adam(agent.critic.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    policy_params = agent.policy_parameters()
    n_policy_params = sum(p.numel() for p in policy_params)
    # chosen here, once: the Fisher-vector products (autograd, or --compile's closed form) and the value step
    # (eager, or --compile's compiled function)
    make_fvp = gauss_newton_fvp if args.compile else fisher_vector_product
    update = UpdateStep(
        agent,
        optimizer,
        functools.partial(value_minibatch_loss, args=args),
        agent.critic.parameters(),
        args.max_grad_norm,
        fast=args.compile,
    )
    rollout = Rollout(args, env, agent, fast=args.compile)
    run.restore({"agent": agent, "optimizer": optimizer, "env": env}, rollout)
    T, mb = args.num_steps, args.minibatch_size
    obs, actions = rollout.obs, rollout.actions
    try:
        for iteration in run.iterations():
            iter_start = time.perf_counter()
            lr_frac = 1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0
            optimizer.param_groups[0]["lr"] = lr_frac * args.learning_rate

            # ---- rollout
            b_values, next_value, b_logprobs = rollout.collect(run.writer)
            rollout_time = time.perf_counter() - iter_start

            # ---- advantages: GAE (numpy, float64)
            adv_np, values_np = rollout.advantages(b_values, next_value, args.gamma, args.gae_lambda)
            b_advantages = torch.as_tensor(adv_np, dtype=torch.float32)
            b_returns = torch.as_tensor(adv_np + values_np, dtype=torch.float32)
            b_values, b_logprobs = b_values.clone(), b_logprobs.clone()  # leave inference mode

            # ---- update: one TRPO policy step on the whole rollout, then value-only epochs
            update_start = time.perf_counter()
            adv = b_advantages
            if args.norm_adv:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            # gradient variance (same definition as ppo/rgpo/awr): the policy loss gradient on each
            # mini-batch (advantages normalised per mini-batch), here at pi_old before the step
            perm = torch.randperm(T)
            g_sum, g_sqsum, n_mb = torch.zeros(n_policy_params), 0.0, 0
            for start in range(0, T, mb):
                idx = perm[start : start + mb]
                mb_adv = b_advantages[idx]
                if args.norm_adv:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                newlogprob = agent.log_prob(agent.actor_mean(obs[idx]), actions[idx])
                mb_loss = (
                    trpo_policy_loss(newlogprob, b_logprobs[idx], mb_adv) - args.ent_coef * agent.entropy()
                )
                g = flat(torch.autograd.grad(mb_loss, policy_params))
                g_sum += g
                g_sqsum += float(g.dot(g))
                n_mb += 1
            pg_loss, trpo_kl, step_frac, ls_evals, new_logprob = trpo_step(
                agent, policy_params, obs, actions, b_logprobs, adv, args, make_fvp
            )
            if trpo_kl is None:
                raise NonFiniteLossError(
                    f"non-finite loss at iteration {iteration} (TRPO surrogate): "
                    f"policy_loss={pg_loss.item()}; stopping instead of training on garbage"
                )
            # KL to pi_old / ESS of the accepted step, per mini-batch (definitions in docs/mujoco.md, w = r)
            with torch.no_grad():
                logratio = new_logprob - b_logprobs
                stats = MinibatchStats()
                for start in range(0, T, mb):
                    lr_mb = logratio[perm[start : start + mb]]
                    stats.add(
                        kl=rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(lr_mb)).mean(),
                        ess=rgpo_trl.effective_sample_size(lr_mb.exp()),
                        trpo_kl=torch.tensor(trpo_kl),
                        step_frac=torch.tensor(step_frac),
                        linesearch_evals=torch.tensor(float(ls_evals)),
                    )
            losses = MinibatchStats()
            update.begin_iteration(policy_loss=pg_loss)  # for the non-finite-loss message of the value steps
            epochs_run = 0
            for epoch in range(args.update_epochs):
                batches = [(obs[idx], b_returns[idx], b_values[idx]) for idx in torch.randperm(T).split(mb)]
                for _loss, v_loss in update.steps(batches, iteration, epoch):
                    losses.add(policy_loss=pg_loss, value_loss=v_loss.detach())
                epochs_run += 1
            update_time = time.perf_counter() - update_start
            # KL of the iteration's final policy to pi_old over the whole batch (the value epochs leave the
            # policy)
            kl_final = float(rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(logratio)).mean())

            # ---- logging
            grad_var = gradient_variance(g_sum, g_sqsum, n_mb, n_policy_params)
            row = run.iteration_metrics(
                iteration,
                UpdateSummary(stats, losses, epochs_run, kl_final, grad_var),
                agent=agent,
                optimizer=optimizer,
                advantages=adv_np,
                values=values_np,
                times=IterationTimes(iter_start, rollout_time, update_time),
            )
            run.log(iteration, row, agent, env)
        return run.finish(agent, env)
    finally:
        run.close(env)


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


if __name__ == "__main__":
    cli(main, Args, DESCRIPTION)
