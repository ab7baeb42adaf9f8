"""RGPO (rejection-gated policy optimisation) on an Atari game through envpool: ppo_atari_envpool.py with
PPO's clipped ratio replaced by a smooth acceptance gate g(r) of the categorical policy's ratio and an
adaptive KL-to-old penalty. One file in CleanRL's structure; the loss, gate and KL controller are
rgpo_trl's."""

# docs: docs/atari.md. tests/test_atari_scripts.py checks that with PPO's clip as the gate (and no KL penalty)
# the first update is ppo_atari_envpool.py's.
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import envpool
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions.categorical import Categorical
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
    cuda: bool = True
    """if toggled, cuda will be enabled by default"""
    torch_threads: int = 1
    """torch intra-op threads on the CPU"""
    env_threads: int = 0
    """envpool's worker threads (0: envpool's default, one per environment)"""
    save_model: bool = False
    """whether to save the model into the `runs/{run_name}` folder"""

    # Algorithm specific arguments
    env_id: str = "Breakout-v5"
    """the id of the environment (an envpool Atari game, e.g. Breakout-v5, Pong-v5)"""
    total_timesteps: int = 10000000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    vclip_coef: float = 0.1
    """the value clipping coefficient (CleanRL's clip_coef clips the value too)"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""

    # RGPO specific (paper Sec. 5), as in mujoco_baselines/rgpo_continuous_action.py
    gate: str = "sigmoid"
    """acceptance gate: a name registered with rgpo_trl.register_gate (built in: sigmoid, clipped_linear,
    temperature; is and ppo_clip as reference correspondences)"""
    gate_params: dict[str, float] = field(default_factory=dict)
    """the gate's parameters as name value pairs, e.g. `--gate-params k 10` (sigmoid k, default 5)"""
    kl_controller: str = "adaptive"
    """the KL-to-old coefficient beta after each iteration: adaptive (paper Eq. beta_update) or fixed"""
    kl_coef: float = rgpo_trl.PAPER_KL_DEFAULTS["kl_coef"]
    """initial KL-to-old coefficient beta_0"""
    kl_target: float = rgpo_trl.PAPER_KL_DEFAULTS["kl_target"]
    """target KL Delta"""
    kl_coef_min: float = rgpo_trl.PAPER_KL_DEFAULTS["kl_coef_min"]
    """lower bound of beta"""
    kl_coef_max: float = rgpo_trl.PAPER_KL_DEFAULTS["kl_coef_max"]
    """upper bound of beta"""
    kl_backstop: float = 0.1
    """leave the epoch loop after an epoch when the iteration's mean KL so far exceeds this (<= 0 disables)"""

    # to be filled in runtime
    batch_size: tyro.conf.Suppress[int] = 0
    minibatch_size: tyro.conf.Suppress[int] = 0
    num_iterations: tyro.conf.Suppress[int] = 0


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """The Nature CNN (Mnih et al., 2015) with a categorical actor and a critic on its 512 features."""

    def __init__(self, envs):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, envs.single_action_space.n), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def get_value(self, x):
        return self.critic(self.network(x / 255.0))

    def get_action_and_value(self, x, action=None):
        hidden = self.network(x / 255.0)
        logits = self.actor(hidden)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


if __name__ == "__main__":
    args = tyro.cli(Args, description=__doc__)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // max(args.num_minibatches, 1))
    args.num_iterations = args.total_timesteps // args.batch_size if args.batch_size > 0 else 0
    batch = f"num_envs * num_steps = {args.batch_size}"
    try:  # a bad input stops here, in one line naming the field, before anything is written
        if args.num_envs < 1 or args.num_steps < 1:
            raise ValueError(f"num_envs and num_steps must be >= 1, got {args.num_envs} and {args.num_steps}")
        if args.num_iterations < 1:
            raise ValueError(f"total_timesteps must be >= {batch}, got {args.total_timesteps}")
        if args.num_minibatches < 1 or args.batch_size % args.num_minibatches:
            raise ValueError(f"num_minibatches must divide {batch}, got {args.num_minibatches}")
        if args.torch_threads < 1 or args.env_threads < 0:
            raise ValueError(
                f"torch_threads must be >= 1 and env_threads >= 0 (0: envpool's default), got "
                f"{args.torch_threads} and {args.env_threads}"
            )
        gate = rgpo_trl.make_gate(args.gate, **args.gate_params)
        kl_ctl = rgpo_trl.make_kl_controller(
            args.kl_controller,
            kl_coef=args.kl_coef,
            kl_target=args.kl_target,
            kl_coef_min=args.kl_coef_min,
            kl_coef_max=args.kl_coef_max,
        )
        known = args.env_id in envpool.list_all_envs()  # envpool spells its Atari games' spec AtariEnvSpec
        if not known or type(envpool.make_spec(args.env_id)).__name__ != "AtariEnvSpec":
            raise ValueError(
                f"env_id must be an envpool Atari id (e.g. Breakout-v5, Pong-v5), got {args.env_id!r}"
            )
        envs = envpool.make(
            args.env_id,
            env_type="gymnasium",
            num_envs=args.num_envs,
            num_threads=args.env_threads,
            episodic_life=True,
            reward_clip=True,
            seed=args.seed,
        )
    except ValueError as err:
        sys.exit(f"error: {err}")
    if args.total_timesteps % args.batch_size:  # iterations are whole rollouts of num_envs * num_steps
        print(
            f"total_timesteps {args.total_timesteps} is not a multiple of {batch}: "
            f"running {args.num_iterations} iterations = {args.num_iterations * args.batch_size} steps"
        )
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

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    agent = Agent(envs).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # storage
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)
    avg_returns = deque(maxlen=20)
    # a game's return and length over its lives (envpool ends an episode at each lost life: episodic_life)
    episode_returns = np.zeros(args.num_envs)
    episode_lengths = np.zeros(args.num_envs, dtype=np.int64)

    # start the game
    global_step = 0
    start_time = time.time()
    next_obs = torch.Tensor(envs.reset()[0]).to(device)
    next_done = torch.zeros(args.num_envs).to(device)

    for iteration in range(1, args.num_iterations + 1):
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            # action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # execute the game: done at each lost life; the game ends at the last one or at the time limit
            next_obs, reward, terminations, truncations, info = envs.step(action.cpu().numpy())
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_done = np.logical_or(terminations, truncations)
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)
            episode_returns += info["reward"]  # the game's score, not the clipped reward
            episode_lengths += 1
            for idx in np.flatnonzero(info["terminated"] | truncations):
                print(f"global_step={global_step}, episodic_return={episode_returns[idx]}")
                avg_returns.append(episode_returns[idx])
                writer.add_scalar("charts/avg_episodic_return", np.average(avg_returns), global_step)
                writer.add_scalar("charts/episodic_return", episode_returns[idx], global_step)
                writer.add_scalar("charts/episodic_length", episode_lengths[idx], global_step)
                episode_returns[idx], episode_lengths[idx] = 0.0, 0

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = (
                    delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                )
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        beta = float(kl_ctl.kl_coef)  # this iteration's KL-to-old coefficient
        pg_losses, v_losses, entropies, old_approx_kls, approx_kls, gate_means, rejected_fracs, esss = (
            [] for _ in range(8)
        )
        b_inds = np.arange(args.batch_size)
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            newlogprobs = []
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb_inds], b_actions.long()[mb_inds]
                )
                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss: -mean(g(r) A) + beta * mean(r - 1 - log r), r the ratio of the categorical
                # policy's probabilities of the taken actions, pi / pi_old (the library's)
                pg_loss, _ = rgpo_trl.rgpo_loss(
                    newlogprob, b_logprobs[mb_inds], mb_advantages, gate, kl_coef=beta, diagnostics=False
                )

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds],
                        -args.vclip_coef,
                        args.vclip_coef,
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
                if not torch.isfinite(loss):
                    sys.exit(f"error: non-finite loss at iteration {iteration}, epoch {epoch}: stopping")

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

                newlogprobs.append(newlogprob.detach())
                pg_losses.append(pg_loss.item())
                v_losses.append(v_loss.item())
                entropies.append(entropy_loss.item())
                old_approx_kls.append((b_logprobs[mb_inds] - newlogprobs[-1]).mean().item())

            # the epoch's statistics per mini-batch, from the log-probs each mini-batch's loss saw
            epoch_inds = torch.as_tensor(
                b_inds.reshape(args.num_minibatches, args.minibatch_size), device=device
            )
            d = rgpo_trl.rgpo_diagnostics(torch.stack(newlogprobs), b_logprobs[epoch_inds], gate, dim=-1)
            approx_kls += d["kl_old"].tolist()
            gate_means += d["gate_mean"].tolist()
            rejected_fracs += d["rejected_frac"].tolist()
            esss += d["ess"].tolist()
            if args.kl_backstop > 0 and np.mean(approx_kls) > args.kl_backstop:
                break

        # the next iteration's beta, from this iteration's mean KL to pi_old (paper Eq. beta_update)
        approx_kl = float(np.mean(approx_kls))
        kl_ctl.update(approx_kl)

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # record rewards for plotting purposes
        sps = int(global_step / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("losses/value_loss", np.mean(v_losses), global_step)
        writer.add_scalar("losses/policy_loss", np.mean(pg_losses), global_step)
        writer.add_scalar("losses/entropy", np.mean(entropies), global_step)
        writer.add_scalar("losses/old_approx_kl", np.mean(old_approx_kls), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl, global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("rgpo/kl_coef", beta, global_step)
        writer.add_scalar("rgpo/gate_mean", np.mean(gate_means), global_step)
        writer.add_scalar("rgpo/rejected_frac", np.mean(rejected_fracs), global_step)
        writer.add_scalar("rgpo/ess", np.mean(esss), global_step)
        writer.add_scalar("rgpo/epochs", epoch + 1, global_step)
        print(
            f"iteration={iteration} global_step={global_step} approx_kl={approx_kl:.4f} beta={beta} SPS={sps}"
        )
        writer.add_scalar("charts/SPS", sps, global_step)

    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        torch.save(agent.state_dict(), model_path)
        print(f"model saved to {model_path}")
    envs.close()
    writer.close()
