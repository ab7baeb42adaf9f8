"""GRPOTrainer options that are orthogonal to the gate, on RGPOTrainer: each one's loss on captured batches
against a formula written out here from GRPOTrainer's definition (no library code), and a short run with it
changes the parameters."""

from __future__ import annotations

import math

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
LOSS_ATOL = 1e-5
K = 5.0  # the default sigmoid gate


@torch.no_grad()
def token_entropies(model, inputs) -> torch.Tensor:
    """Entropy of the next-token distribution at each completion position, from a plain forward pass."""
    completion_ids = inputs["completion_ids"]
    input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    n = completion_ids.size(1)
    logp = (
        model(input_ids=input_ids, attention_mask=attention_mask)
        .logits[:, -n - 1 : -1]
        .float()
        .log_softmax(-1)
    )
    return -(logp.exp() * logp).sum(-1)


def reference_loss(
    trainer,
    record,
    *,
    loss_type="dapo",
    entropy_mask=None,
    seq_mask=None,
    is_ratio=None,
    bias_corrected=False,
    entropy_coef=0.0,
):
    """RGPO per-token terms (paper) with GRPO's option applied where GRPOTrainer applies it, aggregated as
    GRPOTrainer aggregates ``loss_type``."""
    inputs, logps = record["inputs"], record["logps"]
    mask = inputs["completion_mask"].float()
    old, ref = inputs["old_per_token_logps"], inputs["ref_per_token_logps"]
    log_r_old, log_r_ref = logps - old, logps - ref
    gate = torch.sigmoid(K * (torch.exp(torch.maximum(log_r_old, log_r_ref)) - 1.0))
    policy = -gate * inputs["advantages"][:, None]
    for factor in (entropy_mask, seq_mask, is_ratio):
        if factor is not None:
            policy = policy * factor
    kl_ref = torch.exp(ref - logps) - (ref - logps) - 1.0
    if bias_corrected:
        kl_ref = kl_ref * torch.exp(log_r_old)
    per_token = policy + record["kl_coef"] * (torch.exp(log_r_old) - 1.0 - log_r_old) + 0.05 * kl_ref
    args = trainer.args
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum()
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (per_token.size(0) * args.max_completion_length)
    else:
        n = (
            inputs["num_items_in_batch"].float()
            * args.gradient_accumulation_steps
            / args.steps_per_generation
        )
        return (per_token * mask).sum() / n - entropy_coef * _mean_entropy(record, entropy_mask)
    return loss / args.gradient_accumulation_steps - entropy_coef * _mean_entropy(record, entropy_mask)


def _mean_entropy(record, entropy_mask=None):
    mask = record["inputs"]["completion_mask"].float()
    if entropy_mask is not None:
        mask = mask * entropy_mask
    return (record["entropies"] * mask).sum() / mask.sum()


def train(model_path, tmp_path, wrap=None, **overrides):
    args = RGPOConfig(**base_args(tmp_path, max_steps=3, max_completion_length=16, **overrides))
    tokenizer = tiny_tokenizer()
    tokenizer.eos_token = (
        "e"  # a frequent end of sequence: completions of different lengths, so the aggregations differ
    )
    trainer = RGPOTrainer(
        model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tokenizer
    )

    def extra(trainer, model, inputs, record):
        record["entropies"] = token_entropies(trainer.accelerator.unwrap_model(model), inputs)

    if wrap is not None:
        wrap(trainer)
    records = attach_recorder(trainer, extra=extra)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert changed, "a short run with the option must change the parameters"
    assert len(records) == 3 * args.gradient_accumulation_steps and all(
        torch.isfinite(r["loss"]) for r in records
    )
    lengths = torch.cat([r["inputs"]["completion_mask"].sum(-1) for r in records])
    assert lengths.min() < lengths.max()  # ragged completions
    return trainer, records


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_loss_type_aggregates_as_grpo_trainer(model_path, tmp_path, loss_type):
    # two micro-batches per generation batch: 'dapo' divides by the tokens of both, 'bnpo' by its own
    trainer, records = train(model_path, tmp_path, loss_type=loss_type, gradient_accumulation_steps=2)
    for record in records:
        expected = reference_loss(trainer, record, loss_type=loss_type)
        torch.testing.assert_close(record["loss"], expected, atol=LOSS_ATOL, rtol=0)
    # on ragged batches the aggregation matters: the loss differs from the 'dapo' one somewhere
    assert max((r["loss"] - reference_loss(trainer, r)).abs().item() for r in records) > 1e-4


def test_static_entropy_bonus(model_path, tmp_path):
    trainer, records = train(model_path, tmp_path, entropy_coef=0.1)
    for record in records:
        torch.testing.assert_close(
            record["loss"], reference_loss(trainer, record, entropy_coef=0.1), atol=LOSS_ATOL, rtol=0
        )
    assert any(e.get("entropy_coef") == 0.1 for e in trainer.state.log_history)


def test_adaptive_entropy_bonus(model_path, tmp_path):
    """No bonus until a window's entropy is measured below the target; then the coefficient steps up by
    delta."""
    trainer, records = train(
        model_path,
        tmp_path,
        entropy_coef=0.1,
        use_adaptive_entropy=True,
        entropy_target=100.0,
        entropy_coef_delta=0.02,
    )
    coefs = [0.0, 0.12, 0.14]  # applied: 0 before any measurement, then 0.1 + 0.02 after each window
    for record, coef in zip(records, coefs, strict=True):
        torch.testing.assert_close(
            record["loss"], reference_loss(trainer, record, entropy_coef=coef), atol=LOSS_ATOL, rtol=0
        )
    ctl = trainer.entropy_ctl  # RGPO's controller state (GRPOTrainer's own is left alone)
    assert ctl.coef == pytest.approx(0.16)
    assert ctl.last_world_entropy == pytest.approx(_mean_entropy(records[-1]).item(), rel=1e-5)


def test_top_entropy_quantile_mask(model_path, tmp_path):
    trainer, records = train(model_path, tmp_path, top_entropy_quantile=0.5)
    for record in records:
        mask = record["inputs"]["completion_mask"].bool()
        h = record["entropies"]
        threshold = torch.quantile(h[mask], 0.5)  # keep the upper half of the valid tokens' entropies
        entropy_mask = ((h >= threshold) & mask).float()
        assert 0 < entropy_mask.sum() < mask.sum()
        expected = reference_loss(trainer, record, entropy_mask=entropy_mask)
        torch.testing.assert_close(record["loss"], expected, atol=LOSS_ATOL, rtol=0)


def test_off_policy_sequence_mask(model_path, tmp_path):
    threshold = 1e-4
    trainer, records = train(model_path, tmp_path, off_policy_mask_threshold=threshold, learning_rate=5e-2)
    dropped = 0
    for record in records:
        inputs, logps = record["inputs"], record["logps"]
        mask = inputs["completion_mask"].float()
        seq_kl = ((inputs["old_per_token_logps"] - logps) * mask).sum(-1) / mask.sum(-1)  # KL(pi_old || pi)
        keep = ((inputs["advantages"] >= 0) | (seq_kl <= threshold)).float()[:, None]
        dropped += int((keep == 0).sum())
        expected = reference_loss(trainer, record, seq_mask=keep)
        torch.testing.assert_close(record["loss"], expected, atol=LOSS_ATOL, rtol=0)
    assert dropped > 0  # the mask did act on the reused batches


def test_bias_corrected_kl(model_path, tmp_path):
    trainer, records = train(model_path, tmp_path, use_bias_correction_kl=True)
    for record in records:
        expected = reference_loss(trainer, record, bias_corrected=True)
        torch.testing.assert_close(record["loss"], expected, atol=LOSS_ATOL, rtol=0)
    moved = records[1]  # the reused batch: r_old != 1, so the correction changes the loss
    assert (reference_loss(trainer, moved, bias_corrected=True) - reference_loss(trainer, moved)).abs() > 1e-7


def test_vllm_importance_sampling_correction(model_path, tmp_path):
    """vLLM is not installed here: the sampler's per-token ratio is injected into each batch and the loss is
    run with the correction switched on, as GRPOTrainer's vLLM path would run it."""

    def wrap(trainer):
        original = trainer._compute_loss

        def with_sampler_ratio(model, inputs):
            gen = torch.Generator().manual_seed(int(inputs["completion_ids"].sum()))
            ratio = 0.5 + torch.rand(inputs["completion_ids"].shape, generator=gen)
            trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
            try:
                return original(model, {**inputs, "importance_sampling_ratio": ratio})
            finally:
                trainer.use_vllm = False

        trainer._compute_loss = with_sampler_ratio

    trainer, records = train(model_path, tmp_path, wrap=wrap)
    for record in records:
        gen = torch.Generator().manual_seed(int(record["inputs"]["completion_ids"].sum()))
        ratio = 0.5 + torch.rand(record["inputs"]["completion_ids"].shape, generator=gen)
        expected = reference_loss(trainer, record, is_ratio=ratio)
        torch.testing.assert_close(record["loss"], expected, atol=LOSS_ATOL, rtol=0)
        assert (expected - reference_loss(trainer, record)).abs() > 1e-6


def _logged(trainer, key):
    return [e[key] for e in trainer.state.log_history if key in e]


@pytest.mark.parametrize(
    ("loss_type", "adaptive"),
    [("dapo", False), ("dapo", True), ("grpo", False)],
    ids=["static", "adaptive", "grpo"],
)
def test_policy_loss_logged_under_entropy_bonus(model_path, tmp_path, loss_type, adaptive):
    """With an entropy bonus GRPOTrainer logs the loss before the bonus as `policy_loss` (for grpo before the
    accumulation scaling): so does RGPOTrainer, per step, next to `entropy` and `entropy_coef`; in eval
    too."""
    options = (
        dict(use_adaptive_entropy=True, entropy_target=100.0, entropy_coef_delta=0.02) if adaptive else {}
    )
    trainer, records = train(
        model_path,
        tmp_path,
        entropy_coef=0.1,
        loss_type=loss_type,
        gradient_accumulation_steps=2,
        per_device_eval_batch_size=4,
        **options,
    )
    accumulation = 2 if loss_type == "grpo" else 1
    expected = [accumulation * reference_loss(trainer, r, loss_type=loss_type).item() for r in records]
    per_step = [sum(expected[i : i + 2]) / 2 for i in range(0, len(expected), 2)]  # log: mean over the window
    assert _logged(trainer, "policy_loss") == pytest.approx(per_step, abs=LOSS_ATOL)
    bonus = [(r["loss"] - reference_loss(trainer, r, loss_type=loss_type)).abs().item() for r in records]
    assert max(bonus) > 1e-4  # the bonus acted: the logged value is not the loss itself
    assert len(_logged(trainer, "entropy")) == len(_logged(trainer, "entropy_coef")) == 3
    metrics = trainer.evaluate(tiny_dataset())
    assert math.isfinite(metrics["eval_policy_loss"]) and "eval_entropy" in metrics


def test_no_policy_loss_without_entropy_bonus(model_path, tmp_path):
    trainer, _ = train(model_path, tmp_path)
    assert not _logged(trainer, "policy_loss") and not _logged(trainer, "entropy_coef")


@pytest.mark.parametrize("bias_corrected", [False, True])
def test_kl_logged_as_grpo_trainer(model_path, tmp_path, bias_corrected):
    """`kl` is the token mean of the k3 KL to the reference the loss uses (times r_old when
    bias-corrected)."""
    trainer, records = train(model_path, tmp_path, use_bias_correction_kl=bias_corrected)
    expected = []
    for record in records:
        inputs, logps = record["inputs"], record["logps"]
        mask, ref = inputs["completion_mask"].float(), inputs["ref_per_token_logps"]
        kl = torch.exp(ref - logps) - (ref - logps) - 1.0
        if bias_corrected:
            kl = kl * torch.exp(logps - inputs["old_per_token_logps"])
        expected.append(((kl * mask).sum() / mask.sum()).item())
    assert _logged(trainer, "kl") == pytest.approx(expected, rel=1e-4, abs=1e-7)
