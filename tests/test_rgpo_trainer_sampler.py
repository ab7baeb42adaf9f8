"""RGPOConfig(gate_on_sampler=True): the synchronous trainer gates on pi / pi_sampler, the sampler's reported
log-probs (vLLM's on the real path, synthetic here: the vLLM path itself is not run in these tests)."""

from __future__ import annotations

import pytest
import torch
from _trainer_utils import (
    attach_recorder,
    base_args,
    tiny_dataset,
    tiny_tokenizer,
    vowel_reward,
)

from rgpo_trl import RGPOConfig, RGPOTrainer

torch.set_num_threads(1)


def _trainer(model_path, tmp_path, **overrides):
    args = RGPOConfig(**base_args(tmp_path, gate_on_sampler=True, **overrides))
    return RGPOTrainer(
        model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tiny_tokenizer()
    )


def test_the_gate_and_the_kl_act_on_the_samplers_log_probs(model_path, tmp_path):
    """With synthetic sampler log-probs (the trainer's plus N(0, 0.3^2), one NaN), the loss is the paper's
    written out with pi_old := pi_sampler (a NaN token at ratio 1), whatever TRL's own old log-probs are."""
    trainer = _trainer(model_path, tmp_path, max_steps=3, ratio_mode="old", beta=0.0, num_iterations=1)
    records = attach_recorder(trainer)
    recorded = trainer._compute_loss
    generator = torch.Generator().manual_seed(0)

    def with_sampler(model, inputs):
        from _trainer_utils import independent_logps

        logps = independent_logps(trainer.accelerator.unwrap_model(model), inputs, trainer.temperature)
        sampled = logps + 0.3 * torch.randn(logps.shape, generator=generator)
        sampled[0, 0] = float("nan")
        return recorded(model, {**inputs, "sampling_per_token_logps": sampled})

    trainer._compute_loss = with_sampler
    trainer.train()
    assert len(records) == 3
    for record in records:
        inputs, logps = record["inputs"], record["logps"].double()
        mask = inputs["completion_mask"].double()
        sampled = inputs["sampling_per_token_logps"].double()
        sampled = torch.where(torch.isnan(sampled), logps, sampled)
        log_r = logps - sampled
        r = torch.exp(log_r)
        per_token = -torch.sigmoid(5.0 * (r - 1)) * inputs["advantages"].double()[:, None]
        per_token = per_token + record["kl_coef"] * (r - 1 - log_r)
        normalizer = inputs["num_items_in_batch"].double() * trainer.args.gradient_accumulation_steps
        normalizer = normalizer / trainer.args.steps_per_generation
        expected = (per_token * mask).sum() / normalizer
        assert record["loss"].item() == pytest.approx(expected.item(), abs=1e-5)
        assert (log_r * mask).abs().max() > 0.3  # the sampler differs: the gate sees r != 1


def test_a_batch_without_sampler_log_probs_is_refused(model_path, tmp_path):
    trainer = _trainer(model_path, tmp_path, max_steps=1, ratio_mode="old", beta=0.0)
    with pytest.raises(ValueError, match="gate_on_sampler=True needs the sampler's log-probs"):
        trainer.train()
