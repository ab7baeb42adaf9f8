# AWR (advantage-weighted regression, on-policy variant of the paper's baseline) on MuJoCo,
# CleanRL-style single file. Policy loss: -mean(min(exp(A / beta), max_weight) * log pi(a|s)).
# Part of rgpo-trl's MuJoCo baselines: ppo / rgpo / trpo / awr share every line except the policy
# update (see mujoco_baselines/README.md). Structure follows CleanRL's ppo_continuous_action.py.
from __future__ import annotations

import functools
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
    Rollout,
    TrainingRun,
    UpdateStep,
    UpdateSummary,
    cli,
    minibatches,
    resolve_args,
    seed_everything,
)

DESCRIPTION = (
    "AWR (advantage-weighted regression) on a MuJoCo task, "
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

    # AWR specific
    awr_beta: float = 1.0
    """temperature beta of the advantage weights exp(A / beta) (paper: 1.0)"""
    awr_max_weight: float = 20.0
    """weights are clipped to <= this (Peng et al. 2019 use 20); with normalised advantages and beta 1
    the clip binds only for A > 3 std"""

    # derived from the above at start (not command-line options)
    batch_size: tyro.conf.Suppress[int] = 0
    num_iterations: tyro.conf.Suppress[int] = 0


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
    """The mini-batch loss (policy - entropy + value) and what the statistics need, for the eager step and the
    --compile step alike."""
    newlogprob = agent.log_prob(agent.actor_mean(mb_obs), mb_actions)
    newvalue = agent.critic(mb_obs).squeeze(-1)
    if args.norm_adv:
        mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)

    # policy loss
    pg_loss, mb_stats = awr_policy_loss(newlogprob, mb_oldlogprob, mb_adv, args.awr_beta, args.awr_max_weight)

    # value loss
    if args.clip_vloss:
        v_clipped = mb_values + (newvalue - mb_values).clamp(-args.vclip_coef, args.vclip_coef)
        v_loss = 0.5 * torch.max((newvalue - mb_returns) ** 2, (v_clipped - mb_returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
    loss = pg_loss - args.ent_coef * agent.entropy() + args.vf_coef * v_loss
    return loss, (newlogprob, pg_loss, v_loss, mb_stats)


def main(args: Args) -> dict:
    resolve_args(args)  # derived fields and input checks, before anything is created
    run = TrainingRun(args, TB_KEYS)  # run directory, config.json, TensorBoard, the checkpoint if resuming
    seed_everything(args)

    env = MujocoEnv(args)
    agent = Agent(env.obs_dim, env.act_dim, args)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    # the mini-batch step: eager, or with --compile the same step as one compiled function (chosen here, once)
    update = UpdateStep(
        agent,
        optimizer,
        functools.partial(minibatch_loss, args=args),
        agent.parameters(),
        args.max_grad_norm,
        agent.policy_parameters(),
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

            # ---- update: advantage-weighted log-likelihood, `update_epochs` epochs of mini-batches
            update_start = time.perf_counter()
            stats, losses = MinibatchStats(), MinibatchStats()
            update.begin_iteration()
            epochs_run = 0
            for epoch in range(args.update_epochs):
                idxs = torch.randperm(T).split(mb)
                batches = minibatches(idxs, obs, actions, b_advantages, b_logprobs, b_returns, b_values)
                for _loss, (_newlogprob, pg_loss, v_loss, mb_stats) in update.steps(
                    batches, iteration, epoch
                ):
                    stats.add(**mb_stats)
                    losses.add(policy_loss=pg_loss.detach(), value_loss=v_loss.detach())
                epochs_run += 1
            update_time = time.perf_counter() - update_start
            with torch.no_grad():  # KL of the iteration's final policy to pi_old over the whole batch
                final_logprob = agent.log_prob(agent.actor_mean(obs), actions)
                kl_final = float(
                    rgpo_trl.kl_old_estimate(rgpo_trl.clamp_log_ratio(final_logprob - b_logprobs)).mean()
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
