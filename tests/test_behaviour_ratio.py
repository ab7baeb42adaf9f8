"""The behaviour-ratio statistics against a float64 numpy reference, and the monitor on a real trainer."""

import numpy as np
import torch

from rgpo_trl.rlhf.behaviour_ratio import BEYOND, behaviour_ratio_sums


def reference(logps, behaviour, mask):
    """numpy float64: r = exp(logp - logp_b) on the masked tokens, its mean, max, the shares with
    max(r, 1/r) > x and mean(r - 1 - log r)."""
    lr = np.asarray(logps, np.float64) - np.asarray(behaviour, np.float64)
    keep = np.asarray(mask, bool)
    r = np.exp(lr[keep])
    far = np.maximum(r, 1 / r)
    return {
        "mean": r.mean(),
        "max": r.max(),
        "beyond": [(far > x).mean() for x in BEYOND],
        "kl": (r - 1 - np.log(r)).mean(),
        "tokens": keep.sum(),
    }


def test_sums_match_a_float64_reference():
    g = torch.Generator().manual_seed(0)
    logps = -torch.rand(4, 7, generator=g) * 3
    behaviour = logps + torch.randn(4, 7, generator=g) * 0.6  # ratios well beyond 1.2 and 2 on some tokens
    mask = (torch.rand(4, 7, generator=g) > 0.3).long()
    mask[0, 0] = 1
    logps[1, 2] = behaviour[1, 2] + 5.0  # a large ratio, masked out: must not be the max
    mask[1, 2] = 0
    out = behaviour_ratio_sums(logps, behaviour, mask)
    ref = reference(logps.numpy(), behaviour.numpy(), mask.numpy())
    sums = out["sums"].numpy()
    n = ref["tokens"]
    assert sums[-1] == n
    np.testing.assert_allclose(sums[0] / n, ref["mean"], rtol=1e-6)
    for i, share in enumerate(ref["beyond"], start=1):
        assert sums[i] / n == share
    assert 0 < ref["beyond"][0] < 1 and 0 < ref["beyond"][1] < ref["beyond"][0]  # the case is not trivial
    np.testing.assert_allclose(sums[len(BEYOND) + 1] / n, ref["kl"], rtol=1e-5)
    np.testing.assert_allclose(float(out["max"]), ref["max"], rtol=1e-6)


def test_no_behaviour_logps_means_on_policy():
    logps = -torch.rand(2, 5)
    out = behaviour_ratio_sums(logps, None, torch.ones(2, 5))
    assert out["sums"].tolist() == [10.0, 0.0, 0.0, 0.0, 10.0]
    assert float(out["max"]) == 1.0
