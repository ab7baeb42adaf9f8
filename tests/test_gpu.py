"""The trainers on a CUDA GPU in bf16 (marker ``gpu``; skipped without one, excluded from the default run).

    python -m pytest -m gpu tests/test_gpu.py        # or: .ci/run_gpu

A few optimizer steps of RGPOTrainer (dual ratio, adaptive KL), PPORLHFTrainer and AsyncRGPOTrainer on the
tiny policy, on the GPU, in bf16: the parameters move, the loss and every logged metric are finite, and the
model sits on the GPU."""

from __future__ import annotations

import math

import pytest
import torch
from _trainer_utils import base_args, save_tiny_model, tiny_dataset, tiny_tokenizer, vowel_reward

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"))


def _gpu_args(tmp_path, **overrides):
    return base_args(tmp_path, use_cpu=False, bf16=True, **overrides)


def _check(trainer, before):
    assert next(trainer.model.parameters()).device.type == "cuda"
    after = {n: p.detach().float().cpu() for n, p in trainer.model.named_parameters()}
    assert any(not torch.equal(before[n], after[n]) for n in before), "no parameter moved"
    for entry in trainer.state.log_history:
        for key, value in entry.items():
            if isinstance(value, float) and not _empty_staleness_bucket(entry, key):
                assert math.isfinite(value), (key, value)


def _empty_staleness_bucket(entry: dict, key: str) -> bool:
    """AsyncRGPOTrainer's per-staleness statistics are nan, by definition, for a bucket that held no token in
    the logging window (``staleness/tokens_<bucket>`` = 0)."""
    if "_staleness" not in key:
        return False
    return entry.get(f"staleness/tokens_{key.rsplit('_staleness', 1)[1]}") == 0


def test_rgpo_trainer_trains_in_bf16_on_cuda(model_path, tmp_path):
    from rgpo_trl import RGPOConfig, RGPOTrainer

    args = RGPOConfig(**_gpu_args(tmp_path, max_steps=4, ratio_mode="dual"))
    trainer = RGPOTrainer(
        model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tiny_tokenizer()
    )
    before = {n: p.detach().float().cpu() for n, p in trainer.model.named_parameters()}
    trainer.train()
    _check(trainer, before)
    logged = set().union(*(e.keys() for e in trainer.state.log_history))
    assert {"rgpo/gate_mean", "rgpo/kl_coef", "rgpo/ratio_ref_max"} <= logged


def test_ppo_rlhf_trainer_trains_in_bf16_on_cuda(model_path, tmp_path):
    from rgpo_trl import PPORLHFConfig, PPORLHFTrainer

    args = PPORLHFConfig(**_gpu_args(tmp_path, max_steps=4))
    trainer = PPORLHFTrainer(
        model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tiny_tokenizer()
    )
    before = {n: p.detach().float().cpu() for n, p in trainer.model.named_parameters()}
    trainer.train()
    _check(trainer, before)


def test_async_rgpo_trainer_trains_in_bf16_on_cuda(model_path, tmp_path):
    """AsyncRGPOTrainer with the in-process worker at lag 1, dual ratio; the packed attention through SDPA
    (`install_cpu_shims(force=True)`: TRL's flash-attention kernel would be fetched from the hub)."""
    from rgpo_trl.async_rgpo import (
        AsyncRGPOConfig,
        AsyncRGPOTrainer,
        InProcessRolloutWorker,
        InProcessWeightTransfer,
        install_cpu_shims,
    )

    install_cpu_shims(force=True)
    args = AsyncRGPOConfig(
        output_dir=str(tmp_path),
        bf16=True,
        report_to="none",
        max_steps=4,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=8,
        token_budget=0,
        logging_steps=1,
        save_strategy="no",
        ratio_mode="dual",
        beta=0.05,
        max_staleness=2,
    )
    worker = InProcessRolloutWorker(model_path, tiny_tokenizer(), tiny_dataset(), [vowel_reward], args, lag=1)
    trainer = AsyncRGPOTrainer(
        model_path,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tiny_tokenizer(),
        rollout_worker=worker,
        weight_transfer=InProcessWeightTransfer(worker),
    )
    before = {n: p.detach().float().cpu() for n, p in trainer.model.named_parameters()}
    trainer.train()
    _check(trainer, before)
    logged = set().union(*(e.keys() for e in trainer.state.log_history))
    assert {"rgpo/gate_mean", "rgpo/kl_coef", "staleness/max", "rgpo/kl_ref"} <= logged


@pytest.mark.parametrize("loss_type", ["grpo", "cispo"])
def test_monitored_grpo_trainer_on_stale_samples_in_bf16_on_cuda(model_path, tmp_path, loss_type):
    """The staleness suite's trainer for TRL's losses: beta = 0 (grpo), so `ReferenceKLMonitor` builds the
    reference itself and must place it on the GPU; two optimizer steps per generation batch, so the second
    trains on stale samples and `BehaviourRatioMonitor` sees r_b != 1."""
    from trl import GRPOConfig

    from recipes.hh_rlhf.trainers import GRPOMonitoredTrainer

    beta = 0.0 if loss_type == "grpo" else 0.05
    args = GRPOConfig(
        **_gpu_args(
            tmp_path, max_steps=4, num_iterations=1, steps_per_generation=2, beta=beta, loss_type=loss_type
        )
    )
    trainer = GRPOMonitoredTrainer(
        model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tiny_tokenizer()
    )
    assert trainer.monitor_builds_reference == (beta == 0.0)
    assert next(trainer.ref_model.parameters()).device.type == "cuda"
    before = {n: p.detach().float().cpu() for n, p in trainer.model.named_parameters()}
    trainer.train()
    _check(trainer, before)
    kl_old = [e["behaviour/kl_old"] for e in trainer.state.log_history if "behaviour/kl_old" in e]
    assert len(kl_old) == 4 and kl_old[1] > 0 and kl_old[3] > 0  # the second step of each batch is stale
    assert [e for e in trainer.state.log_history if "kl_ref/monitor" in e]
