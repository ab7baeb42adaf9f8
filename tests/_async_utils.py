"""Test-only helpers of the asynchronous trainer's tests: a tiny config, a trainer with the in-process worker,
the per-step logs and a packed micro-batch whose float64 log-probs are known."""

from __future__ import annotations

import numpy as np
import torch

from rgpo_trl.async_rgpo import (
    AsyncRGPOConfig,
    AsyncRGPOTrainer,
    InProcessRolloutWorker,
    InProcessWeightTransfer,
)
from rgpo_trl.testing import tiny_dataset, tiny_tokenizer, vowel_reward


def config(tmp_path, **overrides) -> AsyncRGPOConfig:
    args = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        max_steps=5,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=8,
        token_budget=0,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-2,
        max_staleness=4,
        disable_tqdm=True,
    )
    return AsyncRGPOConfig(**{**args, **overrides})


def trainer_with_worker(model_path, args, reward=vowel_reward, lag=2, **worker_kwargs):
    tok = tiny_tokenizer()
    worker = InProcessRolloutWorker(model_path, tok, tiny_dataset(), [reward], args, lag=lag, **worker_kwargs)
    trainer = AsyncRGPOTrainer(
        model_path,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tok,
        rollout_worker=worker,
        weight_transfer=InProcessWeightTransfer(worker),
    )
    return trainer, worker


def step_logs(trainer) -> list[dict]:
    return [h for h in trainer.state.log_history if "loss" in h]


def _token_log_probs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 from a plain forward."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def packed_batch(model_path, trainer, noise=0.3, seed=0, reference=None):
    """A packed micro-batch of 4 samples whose sampler log-probs are the trainer's float64 ones plus N(0,
    noise^2); returns the batch and, per sample, (float64 log-probs of the trained tokens, the sample), with a
    ``reference`` model also the reference's float64 log-probs of the trained tokens as a third item."""
    from transformers import AutoModelForCausalLM
    from trl.experimental.async_grpo.packing import TreeRow

    from rgpo_trl.async_rgpo.trainer import VersionedCollator

    plain = AutoModelForCausalLM.from_pretrained(model_path)
    plain.load_state_dict(trainer.model.state_dict())
    plain = plain.double()
    rng = np.random.default_rng(seed)
    samples, row = [], TreeRow()
    for i in range(4):
        ids = [5, 9, 12] + rng.integers(3, 30, size=4 + i).tolist()
        logps = _token_log_probs(plain, ids)
        ref = () if reference is None else (_token_log_probs(reference, ids)[2:],)
        old = np.concatenate([[0.0], logps.numpy() + rng.normal(0, noise, size=len(ids) - 1)]).astype(
            np.float32
        )
        sample = {
            "input_ids": np.array(ids),
            "completion_mask": np.array([0] * 3 + [1] * (len(ids) - 3)),
            "old_log_probs": old,
            "advantage": float(rng.normal()),
            "group_id": 0,
            "metrics": {},
            "model_version": 0,
        }
        samples.append((logps[2:], sample, *ref))
        row.add(sample)
    batch = VersionedCollator(pad_token_id=0, num_processes=1).torch_call([[row]])
    return batch, samples
