"""PPO (clipped surrogate) on a MuJoCo task, the lab runner's (rgpo_lab.mujoco_runner: each module holds its
method's flags and update; the shared flags, rollout, GAE, logging, checkpoints and evaluation are in its
common.py)."""

# ppo / rgpo / trpo / awr differ in their own flags, their loss and their update; what they share (the
# other flags, the environment, rollout, GAE, metrics, checkpoints) is common.py's, imported as `common`
# (see rgpo_lab/mujoco_runner/__init__.py). The product's single-file version of this method is
# mujoco_baselines/ppo_continuous_action.py, the same algorithm (tests/test_mujoco_script_vs_lab.py).
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
from rgpo_trl.cli import UsageError, run_main
from rgpo_trl.core import PAPER_KL_DEFAULTS


# the flags every script has: common.BaseArgs; --policy-lag & co: common.StaleSampleArgs
@dataclass
class Args(common.StaleSampleArgs):
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    decoupled: bool = False
    """the decoupled objective for stale samples (Hilton et al., 2021): clip the ratio to the proximal policy
    pi_prox (the learner as the update starts), each sample weighted by min(pi_prox / pi_behaviour,
    max_is_weight); the same as PPO without it at --policy-lag 0 (with max_is_weight >= 1)"""

    # PPO specific
    clip_coef: float = 0.2
    """the surrogate clipping coefficient epsilon"""
    target_kl: float | None = None
    """optional KL early stopping after an epoch (off by default, as in CleanRL)"""

    # RGPO's trust-region machinery on PPO's clip (off by default): with --decoupled, PPO that differs from
    # decoupled RGPO only in clipping where RGPO gates, so the two arms tell the gate's effect apart
    kl_penalty: bool = False
    """add RGPO's KL-to-old penalty beta * mean(r - 1 - log r) to the clipped surrogate (r: the clipped ratio;
    unweighted under --decoupled, as RGPO's), beta set after every iteration by --kl-controller, and RGPO's
    hard backstop --kl-backstop"""
    kl_controller: str = "adaptive"
    """with --kl-penalty: rule for beta after every iteration: adaptive (paper Eq. beta_update) | fixed"""
    kl_coef: float = PAPER_KL_DEFAULTS["kl_coef"]
    """with --kl-penalty: initial coefficient beta_0"""
    kl_target: float = PAPER_KL_DEFAULTS["kl_target"]
    """with --kl-penalty: target KL Delta"""
    kl_coef_min: float = PAPER_KL_DEFAULTS["kl_coef_min"]
    """with --kl-penalty: lower bound of beta"""
    kl_coef_max: float = PAPER_KL_DEFAULTS["kl_coef_max"]
    """with --kl-penalty: upper bound of beta"""
    kl_backstop: float = 0.1
    """with --kl-penalty: leave the epoch loop after an epoch when the iteration's mean KL so far exceeds this
    (<= 0 disables)"""


KL_PENALTY_FIELDS = ("kl_controller", "kl_coef", "kl_target", "kl_coef_min", "kl_coef_max", "kl_backstop")


# --------------------------------------------------------------------------------------------- #
# Method-specific part: the PPO clipped surrogate.
# --------------------------------------------------------------------------------------------- #
def ppo_policy_loss(newlogprob, oldlogprob, advantages, clip_coef, weight=None, kl_coef=None):
    """PPO clipped surrogate, to minimise: -mean(min(r A, clip(r, 1 - eps, 1 + eps) A)). With a `weight` (the
    decoupled objective: r = pi / pi_prox, weight = min(pi_prox / pi_behaviour, c)) -mean(weight min(...)).
    With a `kl_coef` beta (--kl-penalty) + beta * mean(r - 1 - log r), RGPO's penalty from the library."""
    ratio = (newlogprob - oldlogprob).exp()
    surrogate = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    loss = (surrogate if weight is None else weight * surrogate).mean()
    if kl_coef is None:
        return loss
    log_r = rgpo_trl.clamp_log_ratio(newlogprob - oldlogprob)
    return loss + kl_coef * rgpo_trl.kl_old_estimate(log_r).mean()


def ppo_epoch_stats(newlogprobs, oldlogprobs, clip_coef):
    """Per-mini-batch stats of one epoch (kl to pi_old, ess, clipfrac), from log-probs stacked as
    (mini-batches, samples): one vectorised reduction per epoch instead of a dozen small ops per
    mini-batch step. ESS uses w = clip(r) (Ablation D)."""
    logratio = newlogprobs - oldlogprobs
    ratio = logratio.exp()
    kl = rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(logratio)).mean(-1)
    ess = rgpo_trl.effective_sample_size(ratio.clamp(1 - clip_coef, 1 + clip_coef), dim=-1)
    clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean(-1)
    return {"kl": kl, "ess": ess, "clipfrac": clipfrac}


def minibatch_loss(
    agent, mb_obs, mb_actions, mb_adv, mb_oldlogprob, mb_returns, mb_values, mb_weight, kl_coef=None, *, args
):
    """PPO's mini-batch loss (policy - entropy + value) and what the statistics need, for the eager step and
    the --compile step alike; ``kl_coef``: beta with --kl-penalty, else None."""
    newlogprob = agent.log_prob(agent.actor_mean(mb_obs), mb_actions)
    newvalue = agent.critic(mb_obs).squeeze(-1)
    mb_adv = common.normalize_advantages(mb_adv, args)
    pg_loss = ppo_policy_loss(newlogprob, mb_oldlogprob, mb_adv, args.clip_coef, mb_weight, kl_coef)
    v_loss = common.value_loss(newvalue, mb_values, mb_returns, args)
    loss = pg_loss - args.ent_coef * agent.entropy() + args.vf_coef * v_loss
    return loss, (newlogprob, pg_loss, v_loss)


def main(args: Args) -> dict:
    kl_ctl = None
    unused = (
        [f for f in KL_PENALTY_FIELDS if getattr(args, f) != getattr(Args, f)] if not args.kl_penalty else []
    )
    if unused:  # a flag that would change nothing is refused rather than silently ignored
        raise UsageError(f"{', '.join(unused)} only take effect with --kl-penalty")
    if args.kl_penalty:  # the controller checks its own parameters, before anything is created
        try:
            kl_ctl = rgpo_trl.make_kl_controller(
                args.kl_controller,
                kl_coef=args.kl_coef,
                kl_target=args.kl_target,
                kl_coef_min=args.kl_coef_min,
                kl_coef_max=args.kl_coef_max,
            )
        except ValueError as err:
            raise UsageError(str(err)) from None
    # input checks, run directory, config.json, TensorBoard, the checkpoint if resuming, then the seeding
    run = common.TrainingRun(args)
    env = MujocoEnv(args)
    agent = Agent(env.obs_dim, env.act_dim, args)
    # the actor that collects: L iterations behind the learner (--policy-lag)
    staleness = common.PolicyLag(agent, args.policy_lag)
    # Adam and the mini-batch step: eager, or with --compile the same step as one compiled function (chosen
    # here, once)
    loss_fn = functools.partial(minibatch_loss, args=args)
    update = common.UpdateStep(agent, agent.parameters(), loss_fn, args, tracked=agent.policy_parameters())
    rollout = common.Rollout(args, env, agent, fast=args.compile, actor=staleness.actor)
    lagged = {"policy_lag": staleness} if args.policy_lag > 0 else {}
    penalised = {"kl_controller": kl_ctl} if kl_ctl is not None else {}
    run.restore(rollout, agent=agent, optimizer=update.optimizer, env=env, **lagged, **penalised)
    with run:
        for iteration in run.iterations():
            # ---- rollout, by the actor of iteration - policy_lag, and advantages: GAE (numpy, float64)
            batch = common.collect_batch(
                iteration, rollout, update.optimizer, args, run.writer, lag=staleness
            )
            # ---- stale samples: the ratio's anchor is the behaviour policy, or with --decoupled the proximal
            # policy (the learner now) with the truncated weight pi_prox / pi_behaviour
            anchor = staleness.anchor(batch, args.decoupled, args.max_is_weight)
            start = common.start_of_update_stats(anchor)  # what the clip sees before the first epoch
            if anchor.start_logprobs is not None:
                start["start_clipfrac"] = float(
                    ppo_epoch_stats(anchor.start_logprobs, anchor.logprobs, args.clip_coef)["clipfrac"]
                )

            # ---- update: PPO's clipped surrogate, `update_epochs` epochs of mini-batches (with --kl-penalty
            # RGPO's KL penalty, its coefficient beta this iteration's, and RGPO's backstop)
            shared = () if kl_ctl is None else (update.scalar(kl_ctl.kl_coef),)
            update_start = time.perf_counter()
            update.begin_iteration()
            stats, losses, epochs_run, backstop = common.MinibatchStats(), common.MinibatchStats(), 0, False
            for epoch, idxs in enumerate(common.epoch_indices(args)):
                batches = batch.minibatches(idxs, anchor.logprobs, anchor.weight, shared=shared)
                newlogprobs = update.epoch(batches, iteration, epoch, losses)
                # per-mini-batch stats of this epoch (the log-probs each mini-batch's loss saw)
                stats.add(**ppo_epoch_stats(newlogprobs, anchor.logprobs[torch.stack(idxs)], args.clip_coef))
                epochs_run += 1
                if args.target_kl is not None and stats.mean("kl") > args.target_kl:
                    break
                backstop = kl_ctl is not None and args.kl_backstop > 0 and stats.mean("kl") > args.kl_backstop
                if backstop:
                    break
            update_time = time.perf_counter() - update_start
            kl_final = common.final_kl(agent, batch, anchor.logprobs)

            # ---- logging
            grad_var = update.grad_var(len(stats))
            summary = common.UpdateSummary(stats, losses, epochs_run, kl_final, grad_var, update_time)
            row = run.iteration_metrics(iteration, batch, summary)
            if (
                kl_ctl is not None
            ):  # the next iteration's beta (paper Eq. beta_update) from this one's mean KL
                kl_coef_used = kl_ctl.kl_coef
                kl_ctl.update(row["kl"])
                row.update(kl_coef=kl_coef_used, kl_coef_next=kl_ctl.kl_coef, backstop=int(backstop))
            row.update(anchor.stats)
            row.update(start)
            run.log(iteration, row)
        return run.finish()


if __name__ == "__main__":
    sys.exit(run_main(lambda: main(tyro.cli(Args, description=__doc__)), errors=common.SCRIPT_ERRORS))
