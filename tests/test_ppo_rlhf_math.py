"""PPO-RLHF's token-level math against float64 loops written out here."""

from __future__ import annotations

import pytest
import torch

from rgpo_trl.core.ppo_rlhf import clipped_surrogate, clipped_value_loss, gae, masked_whiten, shaped_rewards


def _batch(seed=0, B=5, T=7):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 1, 5, 6])[:B]
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    return gen, lengths, mask


def test_shaped_rewards_kl_on_every_token_score_on_the_last():
    gen, lengths, mask = _batch()
    logps, ref = (
        torch.randn(5, 7, generator=gen, dtype=torch.float64),
        torch.randn(5, 7, generator=gen, dtype=torch.float64),
    )
    scores = torch.randn(5, generator=gen, dtype=torch.float64)
    rewards, kl = shaped_rewards(scores, logps, ref, mask, kl_coef=0.05)
    for b in range(5):
        for t in range(7):
            expected = 0.0 if t >= lengths[b] else -0.05 * (logps[b, t] - ref[b, t]).item()
            if t == lengths[b] - 1:
                expected += scores[b].item()
            assert rewards[b, t].item() == pytest.approx(expected, abs=1e-12)
    assert torch.equal(kl, (logps - ref) * mask)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.9), (1.0, 1.0)])
def test_gae_and_returns_match_a_float64_loop(gamma, lam):
    gen, lengths, mask = _batch(1)
    rewards = torch.randn(5, 7, generator=gen, dtype=torch.float64) * mask
    values = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    for b in range(5):
        n = int(lengths[b])
        running = 0.0
        for t in reversed(range(n)):
            next_v = values[b, t + 1].item() if t + 1 < n else 0.0
            delta = rewards[b, t].item() + gamma * next_v - values[b, t].item()
            running = delta + gamma * lam * running
            assert adv[b, t].item() == pytest.approx(running, abs=1e-12)
            assert ret[b, t].item() == pytest.approx(running + values[b, t].item(), abs=1e-12)
        assert (adv[b, n:] == 0).all() and (ret[b, n:] == 0).all()
    # lambda = 1, gamma = 1: the advantage is the reward-to-go minus the value
    if gamma == lam == 1.0:
        to_go = torch.flip(torch.cumsum(torch.flip(rewards, [1]), 1), [1]) * mask
        torch.testing.assert_close(adv, (to_go - values) * mask)


def test_whitening_ignores_padding():
    gen, lengths, mask = _batch(2)
    x = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    x_padded = torch.where(mask.bool(), x, torch.full_like(x, 1e6))  # padding values must not matter
    w = masked_whiten(x_padded, mask)
    valid = x[mask.bool()]
    expected = (valid - valid.mean()) / torch.sqrt(valid.var(unbiased=False) + 1e-8)
    torch.testing.assert_close(w[mask.bool()], expected)
    assert (w[~mask.bool()] == 0).all()
    assert w[mask.bool()].mean().abs() < 1e-12 and w[mask.bool()].std(unbiased=False) == pytest.approx(
        1, abs=1e-6
    )


def test_clipped_value_loss_and_surrogate():
    old_v, ret = torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([2.0, 0.0, 1.1, 1.5])
    v = torch.tensor([1.5, 1.5, 1.05, 1.1])
    loss, clipped = clipped_value_loss(v, old_v, ret, clip=0.2)
    # clipped values: 1.2, 1.2, 1.05, 1.1
    expected = 0.5 * torch.tensor([max(0.25, 0.64), max(2.25, 1.44), max(0.0025, 0.0025), max(0.16, 0.16)])
    torch.testing.assert_close(loss, expected)
    assert clipped.tolist() == [1.0, 0.0, 0.0, 0.0]
    lp, old = torch.log(torch.tensor([1.5, 0.5, 1.1])), torch.zeros(3)
    adv = torch.tensor([1.0, -1.0, 2.0])
    pg, pg_clipped = clipped_surrogate(lp, old, adv, clip=0.2)
    torch.testing.assert_close(pg, torch.tensor([-1.2, 0.8, -2.2]))  # min(r A, clip(r) A), negated
    assert pg_clipped.tolist() == [1.0, 1.0, 0.0]
