# RGPO (Rejection-Gated Policy Optimization) on MuJoCo, CleanRL-style single file.
# The policy loss is rgpo_trl.rgpo_loss (the same code the TRL trainer uses), with a gate from
# rgpo_trl.make_gate and the KL-to-old coefficient from rgpo_trl.make_kl_controller (adaptive by default).
# Part of rgpo-trl's MuJoCo baselines: ppo / rgpo / trpo / awr share every line except the policy
# update (see mujoco_baselines/README.md). Structure follows CleanRL's ppo_continuous_action.py.
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field

import torch
import tyro

import rgpo_trl
from mujoco_baselines.common import (
    SPIKE_KL,
    Agent,
    IterationTimes,
    MinibatchStats,
    MujocoEnv,
    PolicyLag,
    Rollout,
    TrainingRun,
    UpdateStep,
    UpdateSummary,
    behaviour_ratio_stats,
    cli,
    minibatches,
    resolve_args,
    seed_everything,
    truncated_weight,
)
from rgpo_trl.cli import UsageError
from rgpo_trl.core import PAPER_KL_DEFAULTS

DESCRIPTION = (
    "RGPO (rejection-gated policy optimisation) on a MuJoCo task, "
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

    # Stale samples
    policy_lag: int = 0
    """collect iteration t's rollout with the actor of iteration t - L, as asynchronous actors that run L
    updates behind the learner (the critic stays current); 0: on-policy"""
    decoupled: bool = False
    """the decoupled objective for stale samples (Hilton et al., 2021): gate on the ratio to the proximal
    policy pi_prox (the learner as the update starts), KL penalty to pi_prox, each sample weighted by
    min(pi_prox / pi_behaviour, max_is_weight); the same as RGPO without it at --policy-lag 0
    (with max_is_weight >= 1)"""
    max_is_weight: float = 1.0
    """truncation of the decoupled objective's importance weight (V-trace's rho-bar); > 0"""

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

    # derived from the above at start (not command-line options)
    batch_size: tyro.conf.Suppress[int] = 0
    num_iterations: tyro.conf.Suppress[int] = 0


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
    """The mini-batch loss (policy - entropy + value) and what the statistics need, for the eager step and the
    --compile step alike."""
    newlogprob = agent.log_prob(agent.actor_mean(mb_obs), mb_actions)
    newvalue = agent.critic(mb_obs).squeeze(-1)
    if args.norm_adv:
        mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)

    # policy loss
    pg_loss = rgpo_policy_loss(newlogprob, mb_oldlogprob, mb_adv, gate, kl_coef, mb_weight)

    # value loss
    if args.clip_vloss:
        v_clipped = mb_values + (newvalue - mb_values).clamp(-args.vclip_coef, args.vclip_coef)
        v_loss = 0.5 * torch.max((newvalue - mb_returns) ** 2, (v_clipped - mb_returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
    loss = pg_loss - args.ent_coef * agent.entropy() + args.vf_coef * v_loss
    return loss, (newlogprob, pg_loss, v_loss)


def main(args: Args) -> dict:
    resolve_args(args)  # derived fields and input checks, before anything is created
    try:  # the gate and the KL controller check their own parameters
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
    run = TrainingRun(args, TB_KEYS)  # run directory, config.json, TensorBoard, the checkpoint if resuming
    seed_everything(args)

    env = MujocoEnv(args)
    agent = Agent(env.obs_dim, env.act_dim, args)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    # the mini-batch step: eager, or with --compile the same step as one compiled function (chosen here, once)
    update = UpdateStep(
        agent,
        optimizer,
        functools.partial(minibatch_loss, gate=gate, args=args),
        agent.parameters(),
        args.max_grad_norm,
        agent.policy_parameters(),
        fast=args.compile,
    )
    staleness = PolicyLag(agent, args.policy_lag)  # the actor that collects: L iterations behind the learner
    rollout = Rollout(args, env, agent, fast=args.compile, actor=staleness.actor)
    lagged = {"policy_lag": staleness} if args.policy_lag > 0 else {}
    run.restore(
        {"agent": agent, "optimizer": optimizer, "env": env, **lagged, "kl_controller": kl_ctl}, rollout
    )
    stale_samples = args.policy_lag > 0 or args.decoupled
    T, mb = args.num_steps, args.minibatch_size
    obs, actions = rollout.obs, rollout.actions
    try:
        for iteration in run.iterations():
            iter_start = time.perf_counter()
            lr_frac = 1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0
            optimizer.param_groups[0]["lr"] = lr_frac * args.learning_rate

            # ---- rollout, by the actor of iteration - policy_lag
            staleness.advance()
            b_values, next_value, b_logprobs = rollout.collect(run.writer)
            rollout_time = time.perf_counter() - iter_start

            # ---- advantages: GAE (numpy, float64)
            adv_np, values_np = rollout.advantages(b_values, next_value, args.gamma, args.gae_lambda)
            b_advantages = torch.as_tensor(adv_np, dtype=torch.float32)
            b_returns = torch.as_tensor(adv_np + values_np, dtype=torch.float32)
            b_values, b_logprobs = b_values.clone(), b_logprobs.clone()  # leave inference mode

            # ---- stale samples: the ratio's anchor is the behaviour policy, or with --decoupled the proximal
            # policy (the learner now) with the truncated weight pi_prox / pi_behaviour
            b_anchor, b_weight, stale = b_logprobs, None, {}
            if stale_samples:
                b_prox = staleness.proximal_log_prob(obs, actions)
                stale = behaviour_ratio_stats(b_prox, b_logprobs)
                if args.decoupled:
                    b_anchor, b_weight = b_prox, truncated_weight(b_prox, b_logprobs, args.max_is_weight)

            # ---- update: the gated loss with the adaptive KL-to-old penalty, stopped by the KL backstop
            update_start = time.perf_counter()
            stats, losses = MinibatchStats(), MinibatchStats()
            update.begin_iteration()
            epochs_run, backstop = 0, False
            beta = update.scalar(kl_ctl.kl_coef)  # this iteration's KL-to-old coefficient
            for epoch in range(args.update_epochs):
                idxs = torch.randperm(T).split(mb)
                batches = minibatches(
                    idxs, obs, actions, b_advantages, b_anchor, b_returns, b_values, b_weight, shared=(beta,)
                )
                epoch_logprobs = []  # for the stats, reduced once per epoch
                for _loss, (newlogprob, pg_loss, v_loss) in update.steps(batches, iteration, epoch):
                    epoch_logprobs.append(newlogprob.detach())
                    losses.add(policy_loss=pg_loss.detach(), value_loss=v_loss.detach())
                # per-mini-batch stats of this epoch (the log-probs each mini-batch's loss saw)
                epoch_anchor = b_anchor[torch.stack(idxs)]
                stats.add(**rgpo_epoch_stats(torch.stack(epoch_logprobs), epoch_anchor, gate))
                epochs_run += 1
                backstop = args.kl_backstop > 0 and stats.mean("kl") > args.kl_backstop
                if backstop:
                    break
            update_time = time.perf_counter() - update_start
            with torch.no_grad():  # KL of the iteration's final policy to pi_old over the whole batch
                final_logprob = agent.log_prob(agent.actor_mean(obs), actions)
                kl_final = float(
                    rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(final_logprob - b_anchor)).mean()
                )

            # ---- logging
            row = run.iteration_metrics(
                iteration,
                UpdateSummary(stats, losses, epochs_run, kl_final, update.grad_var(len(stats))),
                agent=agent,
                optimizer=optimizer,
                advantages=adv_np,
                values=values_np,
                times=IterationTimes(iter_start, rollout_time, update_time),
            )
            kl_coef_used = kl_ctl.kl_coef
            kl_ctl.update(row["kl"])  # paper Eq. beta_update (adaptive), from this iteration's mean KL
            row.update(kl_coef=kl_coef_used, kl_coef_next=kl_ctl.kl_coef, backstop=int(backstop))
            row.update(stale)
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
    "kl_coef": "rgpo/kl_coef",
    "gate_mean": "rgpo/gate_mean",
    "weight_mean": "rgpo/weight_mean",
    "rejected_frac": "rgpo/rejected_frac",
    "ratio_max": "rgpo/ratio_max",
}


if __name__ == "__main__":
    cli(main, Args, DESCRIPTION)
