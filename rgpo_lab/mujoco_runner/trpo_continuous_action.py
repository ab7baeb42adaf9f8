"""TRPO (natural gradient with a KL line search) on a MuJoCo task, the lab runner's (rgpo_lab.mujoco_runner:
each module holds its method's flags and update; the shared flags, rollout, GAE, logging, checkpoints and
evaluation are in its common.py)."""

# One constrained policy step per rollout (natural gradient: 10 conjugate-gradient iterations on the
# Fisher-vector product of the closed-form Gaussian KL, then a KL-enforcing backtracking line search), then
# value-only Adam epochs.
# ppo / rgpo / trpo / awr differ in their own flags, their loss and their update; what they share (the
# other flags, the environment, rollout, GAE, metrics, checkpoints) is common.py's, imported as `common`
# (see rgpo_lab/mujoco_runner/__init__.py). The product's single-file version of this method is
# mujoco_baselines/trpo_continuous_action.py, the same algorithm (tests/test_mujoco_script_vs_lab.py).
from __future__ import annotations

import functools
import math
import os
import sys
import time
from dataclasses import dataclass

import torch
import tyro

import rgpo_trl
from rgpo_lab.mujoco_runner import common
from rgpo_lab.mujoco_runner.common import Agent, MujocoEnv
from rgpo_lab.mujoco_runner.compiled_update import gauss_newton_fvp
from rgpo_trl.cli import run_main


# the flags every script has: common.BaseArgs
@dataclass
class Args(common.BaseArgs):
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    compile: bool = False
    """the fast path: each value mini-batch update as one torch.compile'd function (compiled_update.py; needs
    a C++ compiler), the Fisher-vector products in closed form (gauss_newton_fvp) and the rollout's policy
    mean in numpy: the same algorithm, float rounding differs; see results/benchmarks/mujoco_compile.md for
    speed and equivalence"""

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


def gradient_variance_at_old(agent, params, batch, idxs, args) -> float:
    """The gradient variance (same definition as ppo/rgpo/awr): the policy loss gradient on each mini-batch of
    ``idxs`` (advantages normalised per mini-batch), here at pi_old before the step."""
    g_sum, g_sqsum = torch.zeros(sum(p.numel() for p in params)), 0.0
    for idx in idxs:
        mb_adv = common.normalize_advantages(batch.advantages[idx], args)
        newlogprob = agent.log_prob(agent.actor_mean(batch.obs[idx]), batch.actions[idx])
        mb_loss = trpo_policy_loss(newlogprob, batch.logprobs[idx], mb_adv) - args.ent_coef * agent.entropy()
        g = flat(torch.autograd.grad(mb_loss, params))
        g_sum += g
        g_sqsum += float(g.dot(g))
    return common.gradient_variance(g_sum, g_sqsum, len(idxs), len(g_sum))


def value_minibatch_loss(agent, mb_obs, mb_returns, mb_values, args):
    """The value loss of one mini-batch (the value-only epochs after the policy step), for the eager step and
    the --compile step alike."""
    v_loss = common.value_loss(agent.critic(mb_obs).squeeze(-1), mb_values, mb_returns, args)
    return args.vf_coef * v_loss, v_loss


def main(args: Args) -> dict:
    # input checks, run directory, config.json, TensorBoard, the checkpoint if resuming, then the seeding
    run = common.TrainingRun(args)
    env = MujocoEnv(args)
    agent = Agent(env.obs_dim, env.act_dim, args)
    policy_params = agent.policy_parameters()
    # chosen here, once: the Fisher-vector products (autograd, or --compile's closed form) and the value step
    # (eager, or --compile's compiled function) with its Adam, value-only: the policy moves by the TRPO step
    make_fvp = gauss_newton_fvp if args.compile else fisher_vector_product
    value_loss_fn = functools.partial(value_minibatch_loss, args=args)
    update = common.UpdateStep(agent, agent.critic.parameters(), value_loss_fn, args)
    rollout = common.Rollout(args, env, agent, fast=args.compile)
    run.restore(rollout, agent=agent, optimizer=update.optimizer, env=env)
    T, mb = args.num_steps, args.minibatch_size
    with run:
        for iteration in run.iterations():
            # ---- rollout and advantages: GAE (numpy, float64)
            batch = common.collect_batch(iteration, rollout, update.optimizer, args, run.writer)

            # ---- update: one TRPO policy step on the whole rollout, then value-only epochs
            update_start = time.perf_counter()
            adv = common.normalize_advantages(batch.advantages, args)
            perm_idxs = torch.randperm(T).split(mb)  # the mini-batches of the gradient variance and the stats
            grad_var = gradient_variance_at_old(agent, policy_params, batch, perm_idxs, args)
            pg_loss, trpo_kl, step_frac, ls_evals, new_logprob = trpo_step(
                agent, policy_params, batch.obs, batch.actions, batch.logprobs, adv, args, make_fvp
            )
            if trpo_kl is None:
                raise common.NonFiniteLossError(
                    f"non-finite loss at iteration {iteration} (TRPO surrogate): "
                    f"policy_loss={pg_loss.item()}; stopping instead of training on garbage"
                )
            # KL to pi_old / ESS of the accepted step, per mini-batch (definitions in docs/mujoco.md, w = r)
            with torch.no_grad():
                logratio = new_logprob - batch.logprobs
                stats = common.MinibatchStats()
                for idx in perm_idxs:
                    lr_mb = logratio[idx]
                    stats.add(
                        kl=rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(lr_mb)).mean(),
                        ess=rgpo_trl.effective_sample_size(lr_mb.exp()),
                        trpo_kl=torch.tensor(trpo_kl),
                        step_frac=torch.tensor(step_frac),
                        linesearch_evals=torch.tensor(float(ls_evals)),
                    )
            losses = common.MinibatchStats()
            update.begin_iteration(policy_loss=pg_loss)  # for the non-finite-loss message of the value steps
            for epoch, idxs in enumerate(common.epoch_indices(args)):
                value_batches = common.minibatches(idxs, batch.obs, batch.returns, batch.values)
                for _loss, v_loss in update.steps(value_batches, iteration, epoch):
                    losses.add(policy_loss=pg_loss, value_loss=v_loss.detach())
            update_time = time.perf_counter() - update_start
            # the final policy's KL to pi_old over the whole batch (the value epochs leave the policy)
            kl_final = common.mean_kl_to_old(logratio)

            # ---- logging
            summary = common.UpdateSummary(stats, losses, args.update_epochs, kl_final, grad_var, update_time)
            run.log(iteration, run.iteration_metrics(iteration, batch, summary))
        return run.finish()


if __name__ == "__main__":
    sys.exit(run_main(lambda: main(tyro.cli(Args, description=__doc__)), errors=common.SCRIPT_ERRORS))
