"""The behaviour-ratio statistics against a float64 numpy reference, and the monitor on a real trainer."""

import numpy as np
import pytest
import torch
from _trainer_utils import (
    attach_recorder,
    base_args,
    independent_logps,
    save_tiny_model,
    tiny_dataset,
    tiny_tokenizer,
    vowel_reward,
)
from trl import GRPOConfig

from rgpo_trl.monitors.behaviour_ratio import BEYOND, behaviour_ratio_sums


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


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2_behaviour"))


@pytest.mark.parametrize("steps_per_generation", [1, 4])
def test_the_monitor_logs_the_ratio_each_step_trained_on(
    model_path, tmp_path, one_torch_thread, steps_per_generation
):
    """GRPO (beta = 0, one iteration) with S optimizer steps per generation batch: step s of a batch trains on
    samples s - 1 updates old. The logged r_b statistics equal those of log-probs recomputed by a plain
    forward against the batch's behaviour log-probs; with S = 1 the ratio is 1 and the monitor still logs
    KL_ref (scoring the batch under the policy itself)."""
    from recipes.hh_rlhf.trainers import GRPOMonitoredTrainer

    args = GRPOConfig(
        **base_args(
            tmp_path,
            beta=0.0,
            loss_type="grpo",
            num_iterations=1,
            max_steps=4,
            steps_per_generation=steps_per_generation,
        )
    )
    trainer = GRPOMonitoredTrainer(
        model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tiny_tokenizer()
    )

    def ref_logps(trainer, model, inputs, record):
        record["ref"] = independent_logps(trainer.ref_model, inputs, trainer.temperature)

    records = attach_recorder(trainer, ref_logps)
    trainer.train()
    logged = [e for e in trainer.state.log_history if "behaviour/ratio_mean" in e]
    assert len(logged) == len(records) == 4
    for step, (entry, record) in enumerate(zip(logged, records, strict=True)):
        behaviour = record["inputs"].get("old_per_token_logps")
        assert (behaviour is None) == (steps_per_generation == 1)
        if behaviour is None:
            assert entry["behaviour/ratio_mean"] == 1.0 and entry["behaviour/ratio_max"] == 1.0
            assert entry["behaviour/beyond_1.2"] == 0.0 and entry["behaviour/kl_old"] == 0.0
            continue
        ref = reference(
            record["logps"].numpy(), behaviour.numpy(), record["inputs"]["completion_mask"].numpy()
        )
        assert entry["behaviour/ratio_mean"] == pytest.approx(ref["mean"], rel=1e-4)
        assert entry["behaviour/ratio_max"] == pytest.approx(ref["max"], rel=1e-4)
        assert entry["behaviour/kl_old"] == pytest.approx(ref["kl"], rel=1e-3, abs=1e-7)
        if step % steps_per_generation == 0:  # the first step of a batch: the behaviour policy itself
            assert entry["behaviour/kl_old"] < 1e-8
    if steps_per_generation > 1:
        assert max(e["behaviour/kl_old"] for e in logged) > 1e-4  # the later steps trained on stale samples
    # KL_ref(k3) of pi_old to the reference, at S = 1 too (there pi_old is the policy as the batch is made)
    kl_ref = [e["kl_ref/monitor"] for e in trainer.state.log_history if "kl_ref/monitor" in e]
    first_of_batch = records[::steps_per_generation]
    assert len(kl_ref) == len(first_of_batch) == 4 // steps_per_generation
    for value, record in zip(kl_ref, first_of_batch, strict=True):
        mask = record["inputs"]["completion_mask"].double()
        d = (record["ref"] - record["logps"]).double()
        assert value == pytest.approx(((d.exp() - d - 1) * mask).sum().item() / mask.sum().item(), rel=1e-3)
    if len(kl_ref) > 1:  # after the first batch's updates the policy has moved off the reference
        assert max(kl_ref) > 1e-5
