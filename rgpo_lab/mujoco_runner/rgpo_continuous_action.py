"""RGPO (rejection-gated policy optimisation) on a MuJoCo task, the lab runner's (rgpo_lab.mujoco_runner:
each module holds its method's flags and update; the shared flags, rollout, GAE, logging, checkpoints and
evaluation are in its common.py)."""

# The policy loss is rgpo_trl.rgpo_loss (the same code the TRL trainer uses), with a gate from
# rgpo_trl.make_gate and the KL-to-old coefficient from rgpo_trl.make_kl_controller (adaptive by default).
# ppo / rgpo / trpo / awr differ in their own flags, their loss and their update; what they share (the
# other flags, the environment, rollout, GAE, metrics, checkpoints) is common.py's, imported as `common`
# (see rgpo_lab/mujoco_runner/__init__.py). The product's single-file version of this method is
# mujoco_baselines/rgpo_continuous_action.py, the same algorithm (tests/test_mujoco_script_vs_lab.py).
from __future__ import annotations

import functools
import os
import sys
import time
from dataclasses import dataclass, field

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
    """the decoupled objective for stale samples (Hilton et al., 2021): gate on the ratio to the proximal
    policy pi_prox (the learner as the update starts), KL penalty to pi_prox, each sample weighted by
    min(pi_prox / pi_behaviour, max_is_weight); the same as RGPO without it at --policy-lag 0
    (with max_is_weight >= 1)"""

    # RGPO specific (paper Sec. 5 and App. Implementation Details; Ablation A for the gates)
    gate: str = "sigmoid"
    """acceptance gate: any name registered with rgpo_trl.register_gate (built in: sigmoid, clipped_linear,
    temperature; is and ppo_clip as reference correspondences)"""
    gate_params: dict[str, float] = field(default_factory=dict)
    """the gate's parameters as name value pairs, e.g. `--gate-params k 10` (sigmoid k, default 5;
    clipped_linear c, default 2; temperature temperature, default 1; ppo_clip eps, default 0.2)"""
    kl_controller: str = "adaptive"
    """rule for the KL-to-old coefficient after every iteration: adaptive (paper Eq. beta_update) | fixed"""
    # the adaptive controller's defaults: the paper's values, rgpo_trl.core.PAPER_KL_DEFAULTS
    kl_coef: float = PAPER_KL_DEFAULTS["kl_coef"]
    """initial KL-to-old coefficient beta_0"""
    kl_target: float = PAPER_KL_DEFAULTS["kl_target"]
    """target KL Delta"""
    kl_coef_min: float = PAPER_KL_DEFAULTS["kl_coef_min"]
    """lower bound of beta"""
    kl_coef_max: float = PAPER_KL_DEFAULTS["kl_coef_max"]
    """upper bound of beta"""
    kl_backstop: float = 0.1
    """hard backstop: leave the epoch loop after an epoch when the iteration's mean KL so far exceeds this
    (<= 0 disables)"""


# --------------------------------------------------------------------------------------------- #
# Method-specific part: the RGPO loss, from the library (never a copy).
# --------------------------------------------------------------------------------------------- #
def rgpo_policy_loss(newlogprob, oldlogprob, advantages, gate, kl_coef, weight=None):
    """-mean(g(r) A) + beta * mean(r - 1 - log r) via rgpo_trl.rgpo_loss (with a `weight`, the decoupled form:
    -mean(weight g(r) A) + ..., r = pi / pi_prox); its diagnostics are reduced once per epoch by
    `rgpo_epoch_stats` instead of per mini-batch step."""
    loss, _ = rgpo_trl.rgpo_loss(
        newlogprob, oldlogprob, advantages, gate, kl_coef=kl_coef, weights=weight, diagnostics=False
    )
    return loss


def rgpo_epoch_stats(newlogprobs, oldlogprobs, gate):
    """Per-mini-batch stats of one epoch (kl to pi_old, ess with w = g'(r) r, gate_mean, weight_mean,
    rejected_frac, ratio_max), from log-probs stacked as (mini-batches, samples): rgpo_trl.rgpo_diagnostics,
    the values rgpo_loss reports for each mini-batch, in one vectorised reduction per epoch."""
    d = rgpo_trl.rgpo_diagnostics(newlogprobs, oldlogprobs, gate, dim=-1)
    return {
        "kl": d["kl_old"],
        "ess": d["ess"],
        "gate_mean": d["gate_mean"],
        "weight_mean": d["weight_mean"],
        "rejected_frac": d["rejected_frac"],
        "ratio_max": d["ratio_old_max"],
    }


def minibatch_loss(
    agent, mb_obs, mb_actions, mb_adv, mb_oldlogprob, mb_returns, mb_values, mb_weight, kl_coef, gate, args
):
    """RGPO's mini-batch loss (policy - entropy + value) and what the statistics need, for the eager step and
    the --compile step alike."""
    newlogprob = agent.log_prob(agent.actor_mean(mb_obs), mb_actions)
    newvalue = agent.critic(mb_obs).squeeze(-1)
    mb_adv = common.normalize_advantages(mb_adv, args)
    pg_loss = rgpo_policy_loss(newlogprob, mb_oldlogprob, mb_adv, gate, kl_coef, mb_weight)
    v_loss = common.value_loss(newvalue, mb_values, mb_returns, args)
    loss = pg_loss - args.ent_coef * agent.entropy() + args.vf_coef * v_loss
    return loss, (newlogprob, pg_loss, v_loss)


def main(args: Args) -> dict:
    try:  # the gate and the KL controller check their own parameters, before anything is created
        gate = rgpo_trl.make_gate(args.gate, **args.gate_params)
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
    run = common.TrainingRun(args, TB_KEYS)
    env = MujocoEnv(args)
    agent = Agent(env.obs_dim, env.act_dim, args)
    # the actor that collects: L iterations behind the learner (--policy-lag)
    staleness = common.PolicyLag(agent, args.policy_lag)
    # Adam and the mini-batch step: eager, or with --compile the same step as one compiled function (chosen
    # here, once)
    loss_fn = functools.partial(minibatch_loss, gate=gate, args=args)
    update = common.UpdateStep(agent, agent.parameters(), loss_fn, args, tracked=agent.policy_parameters())
    rollout = common.Rollout(args, env, agent, fast=args.compile, actor=staleness.actor)
    lagged = {"policy_lag": staleness} if args.policy_lag > 0 else {}
    run.restore(rollout, agent=agent, optimizer=update.optimizer, env=env, **lagged, kl_controller=kl_ctl)
    with run:
        for iteration in run.iterations():
            # ---- rollout, by the actor of iteration - policy_lag, and advantages: GAE (numpy, float64)
            batch = common.collect_batch(
                iteration, rollout, update.optimizer, args, run.writer, lag=staleness
            )
            # ---- stale samples: the ratio's anchor is the behaviour policy, or with --decoupled the proximal
            # policy (the learner now) with the truncated weight pi_prox / pi_behaviour
            anchor = staleness.anchor(batch, args.decoupled, args.max_is_weight)
            start = common.start_of_update_stats(anchor)  # what the gate sees before the first epoch
            if anchor.start_logprobs is not None:
                gate_start = rgpo_trl.rgpo_diagnostics(anchor.start_logprobs, anchor.logprobs, gate)
                start.update(
                    start_rejected_frac=float(gate_start["rejected_frac"]),
                    start_gate_mean=float(gate_start["gate_mean"]),
                )

            # ---- update: the gated loss with the adaptive KL-to-old penalty, stopped by the KL backstop
            beta = update.scalar(kl_ctl.kl_coef)  # this iteration's KL-to-old coefficient
            update_start = time.perf_counter()
            update.begin_iteration()
            stats, losses, epochs_run, backstop = common.MinibatchStats(), common.MinibatchStats(), 0, False
            for epoch, idxs in enumerate(common.epoch_indices(args)):
                batches = batch.minibatches(idxs, anchor.logprobs, anchor.weight, shared=(beta,))
                newlogprobs = update.epoch(batches, iteration, epoch, losses)
                # per-mini-batch stats of this epoch (the log-probs each mini-batch's loss saw)
                stats.add(**rgpo_epoch_stats(newlogprobs, anchor.logprobs[torch.stack(idxs)], gate))
                epochs_run += 1
                backstop = args.kl_backstop > 0 and stats.mean("kl") > args.kl_backstop
                if backstop:
                    break
            update_time = time.perf_counter() - update_start
            kl_final = common.final_kl(agent, batch, anchor.logprobs)

            # ---- logging, and the next iteration's KL-to-old coefficient (paper Eq. beta_update, adaptive)
            grad_var = update.grad_var(len(stats))
            row = run.iteration_metrics(
                iteration,
                batch,
                common.UpdateSummary(stats, losses, epochs_run, kl_final, grad_var, update_time),
            )
            kl_coef_used = kl_ctl.kl_coef
            kl_ctl.update(row["kl"])  # from this iteration's mean KL
            row.update(kl_coef=kl_coef_used, kl_coef_next=kl_ctl.kl_coef, backstop=int(backstop))
            row.update(anchor.stats)
            row.update(start)
            run.log(iteration, row)
        return run.finish()


TB_KEYS = {  # TensorBoard's names of RGPO's own metrics, beside common.TB_KEYS
    "kl_coef": "rgpo/kl_coef",
    "gate_mean": "rgpo/gate_mean",
    "weight_mean": "rgpo/weight_mean",
    "rejected_frac": "rgpo/rejected_frac",
    "ratio_max": "rgpo/ratio_max",
}


if __name__ == "__main__":
    sys.exit(run_main(lambda: main(tyro.cli(Args, description=__doc__)), errors=common.SCRIPT_ERRORS))
