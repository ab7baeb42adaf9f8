"""PPORLHFTrainer on the tiny Qwen2 policy: advantages from GAE against a float64 recomputation, the loss
against a formula written out here, a short run that raises the reward, and resume of the value model and
optimizer."""

from __future__ import annotations

import json
import os

import pytest
import torch
from _trainer_utils import (
    attach_recorder,
    base_args,
    tiny_dataset,
    tiny_tokenizer,
    vowel_reward,
)

from rgpo_trl import PPORLHFConfig, PPORLHFTrainer

torch.set_num_threads(1)


def make(model_path, out, **overrides):
    kw = base_args(out, **overrides)
    kw.pop("beta")
    args = PPORLHFConfig(**kw)
    return PPORLHFTrainer(
        model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tiny_tokenizer()
    )


def capture_generation(trainer):
    """Record each generation batch's output and the raw reward scores GRPOTrainer computed."""
    batches = []
    original = trainer._generate_and_score_completions

    def wrapped(inputs):
        out = original(inputs)
        batches.append(
            {
                "out": {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in out.items()},
                "scores": trainer._last_scores.detach().clone(),
            }
        )
        return out

    trainer._generate_and_score_completions = wrapped
    return batches


def test_advantages_are_whitened_gae_of_the_shaped_reward(model_path, tmp_path):
    trainer = make(model_path, tmp_path, max_steps=2)
    batches = capture_generation(trainer)
    trainer.train()
    out, scores = batches[0]["out"], batches[0]["scores"][:, 0].double()
    mask = out["completion_mask"].double()
    old, ref = out["old_per_token_logps"].double(), out["ref_per_token_logps"].double()
    values = out["old_values"].double()
    B, T = mask.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        n = int(mask[b].sum())
        running = 0.0
        for t in reversed(range(n)):
            reward = -0.05 * (old[b, t] - ref[b, t]).item() + (scores[b].item() if t == n - 1 else 0.0)
            next_v = values[b, t + 1].item() if t + 1 < n else 0.0
            running = reward + next_v - values[b, t].item() + 0.95 * running  # gamma 1, lambda 0.95
            adv[b, t] = running
    valid = adv[mask.bool()]
    whitened = torch.zeros_like(adv)
    whitened[mask.bool()] = (valid - valid.mean()) / torch.sqrt(valid.var(unbiased=False) + 1e-8)
    torch.testing.assert_close(out["advantages"].double(), whitened, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out["returns"].double(), (adv + values) * mask, atol=1e-5, rtol=1e-5)
    assert values.abs().max() == 0  # the value head starts at zero


def test_loss_is_clipped_surrogate_plus_clipped_value_loss(model_path, tmp_path):
    trainer = make(model_path, tmp_path, max_steps=2, learning_rate=5e-2)

    def values_now(trainer, model, inputs, record):  # the value model's output before the step
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        with torch.no_grad():
            record["values"] = trainer._values(model, ids, att, inputs["completion_ids"].size(1))

    records = attach_recorder(trainer, extra=None)
    original = trainer._compute_loss

    def with_values(model, inputs):
        record = {}
        values_now(trainer, model, inputs, record)
        loss = original(model, inputs)
        records[-1]["values"] = record["values"]
        return loss

    trainer._compute_loss = with_values
    trainer.train()
    for record in records:
        inputs, logps, values = record["inputs"], record["logps"], record["values"]
        mask = inputs["completion_mask"].float()
        ratio = torch.exp(logps - inputs["old_per_token_logps"])
        adv = inputs["advantages"]
        pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        v_clip = inputs["old_values"] + (values - inputs["old_values"]).clamp(-0.2, 0.2)
        vf = 0.5 * torch.maximum((values - inputs["returns"]) ** 2, (v_clip - inputs["returns"]) ** 2)
        n = (
            inputs["num_items_in_batch"].float()
            * trainer.args.gradient_accumulation_steps
            / trainer.args.steps_per_generation
        )
        expected = ((pg + 0.1 * vf) * mask).sum() / n
        torch.testing.assert_close(record["loss"], expected, atol=1e-5, rtol=0)
    # the second pass reuses the batch: the value model has moved, so its loss term is live
    assert (records[1]["values"] - records[1]["inputs"]["old_values"]).abs().max() > 1e-6


def test_short_run_raises_the_reward(model_path, tmp_path):
    trainer = make(model_path, tmp_path, max_steps=40, learning_rate=2e-2, logging_steps=1)
    trainer.train()
    rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e]  # one per generation batch
    assert len(rewards) == 20
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.05, (first, last)


def test_resume_restores_value_model_and_optimizer(model_path, tmp_path):
    trainer = make(model_path, tmp_path, max_steps=2, save_strategy="steps", save_steps=2, learning_rate=5e-2)
    trainer.train()
    ckpt = os.path.join(tmp_path, "checkpoint-2")
    saved = {k: v.clone() for k, v in trainer.model.value_model.state_dict().items()}
    assert any(v.abs().max() > 0 for k, v in saved.items() if "score" in k)  # the head has been trained
    resumed = make(model_path, tmp_path / "resumed", max_steps=2, save_strategy="no")
    assert all(
        torch.count_nonzero(v) == 0 for k, v in resumed.model.value_model.state_dict().items() if "score" in k
    )
    resumed.train(resume_from_checkpoint=ckpt)  # already at max_steps: loads, trains nothing
    for key, value in resumed.model.value_model.state_dict().items():
        torch.testing.assert_close(value, saved[key], msg=key)
    opt_state = torch.load(os.path.join(ckpt, "optimizer.pt"), weights_only=True)
    n_params = sum(1 for _ in trainer.model.parameters())
    assert len(opt_state["state"]) == n_params  # the optimizer holds the value model's parameters too
    with open(os.path.join(ckpt, "trainer_state.json")) as f:
        assert json.load(f)["global_step"] == 2


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"loss_type": "grpo"}, "loss_type='grpo' is not supported by PPORLHFTrainer"),
        ({"scale_rewards": "batch"}, "scale_rewards"),
        ({"beta": 0.0}, r"beta must be a number in \(0, inf\)"),
        ({"gae_lambda": 1.5}, r"gae_lambda must be a number in \[0, 1\]"),
        ({"vf_coef": 0}, "vf_coef"),
        ({"entropy_coef": 0.1}, "entropy_coef"),
    ],
)
def test_config_refuses_what_ppo_does_not_read(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        PPORLHFConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **kwargs)


def test_peft_trains_the_adapter_and_the_value_model_only(model_path, tmp_path):
    from peft import LoraConfig

    kw = base_args(tmp_path, max_steps=2, learning_rate=5e-2)
    kw.pop("beta")
    trainer = PPORLHFTrainer(
        model_path,
        vowel_reward,
        args=PPORLHFConfig(**kw),
        train_dataset=tiny_dataset(),
        processing_class=tiny_tokenizer(),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert any("lora_" in n for n in moved) and any(n.startswith("value_model.") for n in moved)
    frozen_policy = [n for n in before if "lora_" not in n and not n.startswith("value_model.")]
    assert frozen_policy and not (
        moved & set(frozen_policy)
    )  # the base policy stays frozen (it is the reference)
