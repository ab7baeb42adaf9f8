"""AWR (advantage-weighted regression) on a MuJoCo task, the lab runner's (rgpo_lab.mujoco_runner: each
module holds its method's flags and update; the shared flags, rollout, GAE, logging, checkpoints and
evaluation are in its common.py)."""

# On-policy variant of the paper's AWR baseline. Policy loss: -mean(min(exp(A / beta), max_weight) *
# log pi(a|s)).
# ppo / rgpo / trpo / awr differ in their own flags, their loss and their update; what they share (the
# other flags, the environment, rollout, GAE, metrics, checkpoints) is common.py's, imported as `common`
# (see rgpo_lab/mujoco_runner/__init__.py). The product's single-file version of this method is
# mujoco_baselines/awr_continuous_action.py, the same algorithm (tests/test_mujoco_script_vs_lab.py).
from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass

import torch
import tyro

import rgpo_trl
from rgpo_lab.mujoco_runner import common
from rgpo_lab.mujoco_runner.common import Agent, MujocoEnv
from rgpo_trl.cli import run_main


# the flags every script has: common.BaseArgs
@dataclass
class Args(common.BaseArgs):
    exp_name: str = os.path.basename(__file__)[: -len(".py")]

    # AWR specific
    awr_beta: float = 1.0
    """temperature beta of the advantage weights exp(A / beta) (paper: 1.0)"""
    awr_max_weight: float = 20.0
    """weights are clipped to <= this (Peng et al. 2019 use 20); with normalised advantages and beta 1
    the clip binds only for A > 3 std"""


# --------------------------------------------------------------------------------------------- #
# Method-specific part: the AWR weighted log-likelihood.
# --------------------------------------------------------------------------------------------- #
def awr_policy_loss(newlogprob, oldlogprob, advantages, beta, max_weight):
    """AWR loss and the mini-batch's stats (kl to pi_old, ess, weight_clipfrac, weight_max); ESS uses the AWR
    weights (scale-free, so equal to the ESS of the normalised weights w / sum w, Ablation D)."""
    with torch.no_grad():
        raw = torch.exp((advantages / beta).clamp(max=50.0))
        weights = raw.clamp(max=max_weight)
    pg_loss = -(weights * newlogprob).mean()
    with torch.no_grad():
        kl = rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(newlogprob - oldlogprob)).mean()
        ess = rgpo_trl.effective_sample_size(weights)
        clipfrac = (raw > max_weight).float().mean()
    return pg_loss, {"kl": kl, "ess": ess, "weight_clipfrac": clipfrac, "weight_max": weights.max()}


def minibatch_loss(agent, mb_obs, mb_actions, mb_adv, mb_oldlogprob, mb_returns, mb_values, args):
    """AWR's mini-batch loss (policy - entropy + value) and what the statistics need, for the eager step and
    the --compile step alike."""
    newlogprob = agent.log_prob(agent.actor_mean(mb_obs), mb_actions)
    newvalue = agent.critic(mb_obs).squeeze(-1)
    mb_adv = common.normalize_advantages(mb_adv, args)
    pg_loss, mb_stats = awr_policy_loss(newlogprob, mb_oldlogprob, mb_adv, args.awr_beta, args.awr_max_weight)
    v_loss = common.value_loss(newvalue, mb_values, mb_returns, args)
    loss = pg_loss - args.ent_coef * agent.entropy() + args.vf_coef * v_loss
    return loss, (newlogprob, pg_loss, v_loss, mb_stats)


def main(args: Args) -> dict:
    # input checks, run directory, config.json, TensorBoard, the checkpoint if resuming, then the seeding
    run = common.TrainingRun(args)
    env = MujocoEnv(args)
    agent = Agent(env.obs_dim, env.act_dim, args)
    # Adam and the mini-batch step: eager, or with --compile the same step as one compiled function (chosen
    # here, once)
    loss_fn = functools.partial(minibatch_loss, args=args)
    update = common.UpdateStep(agent, agent.parameters(), loss_fn, args, tracked=agent.policy_parameters())
    rollout = common.Rollout(args, env, agent, fast=args.compile)
    run.restore(rollout, agent=agent, optimizer=update.optimizer, env=env)
    with run:
        for iteration in run.iterations():
            # ---- rollout and advantages: GAE (numpy, float64)
            batch = common.collect_batch(iteration, rollout, update.optimizer, args, run.writer)

            # ---- update: advantage-weighted log-likelihood, `update_epochs` epochs of mini-batches
            update_start = time.perf_counter()
            update.begin_iteration()
            stats, losses = common.MinibatchStats(), common.MinibatchStats()
            for epoch, idxs in enumerate(common.epoch_indices(args)):
                batches = batch.minibatches(idxs, batch.logprobs)
                for _loss, (_, pg_loss, v_loss, mb_stats) in update.steps(batches, iteration, epoch):
                    stats.add(**mb_stats)
                    losses.add(policy_loss=pg_loss.detach(), value_loss=v_loss.detach())
            update_time = time.perf_counter() - update_start
            kl_final = common.final_kl(agent, batch, batch.logprobs)

            # ---- logging
            grad_var = update.grad_var(len(stats))
            summary = common.UpdateSummary(stats, losses, args.update_epochs, kl_final, grad_var, update_time)
            run.log(iteration, run.iteration_metrics(iteration, batch, summary))
        return run.finish()


if __name__ == "__main__":
    sys.exit(run_main(lambda: main(tyro.cli(Args, description=__doc__)), errors=common.SCRIPT_ERRORS))
