"""PPO-RLHF's token-level math (Ouyang et al. 2022; Ziegler et al. 2019), torch only: the paper's main RLHF
baseline. Completions are right-padded ``(B, T)`` tensors with a ``mask`` of 1 on the completion tokens.

- shaped rewards: ``-kl_coef * (log pi_old - log pi_ref)`` on every completion token, plus the reward-model
  score on the last one;
- GAE over the completion tokens, bootstrapping 0 after the last one;
- advantage whitening over the valid tokens, PPO's clipped surrogate and clipped value loss.
"""

from __future__ import annotations

import torch

from .objective import masked_mean


def shaped_rewards(
    scores: torch.Tensor, logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards ``(B, T)``: the KL penalty on every valid token and ``scores`` ``(B,)`` added on each
    sequence's last valid token. Also returns the per-token KL estimate ``log pi - log pi_ref``."""
    kl = (logps - ref_logps) * mask
    rewards = -kl_coef * kl
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    rewards[torch.arange(len(scores)), last] += scores.to(rewards.dtype) * (mask.sum(-1) > 0)
    return rewards, kl


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns (``advantages + values``) over the valid tokens; the value
    after a sequence's last token is 0 (the episode ends)."""
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    T = rewards.size(1)
    for t in reversed(range(T)):
        next_mask = mask[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        next_value = values[:, t + 1] * next_mask if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * next_mask * last
        advantages[:, t] = last
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` with mean and (population) variance over the valid elements; padding
    stays 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def clipped_surrogate(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token loss ``-min(r A, clip(r, 1 - eps, 1 + eps) A)`` and where the clip is active."""
    ratio = torch.exp(logps - old_logps)
    unclipped, clipped = -advantages * ratio, -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token value loss ``0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)`` and where the
    clipped branch is the larger one."""
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    unclipped, clipped = (values - returns) ** 2, (clipped_values - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()
