"""RGPOTrainer end to end on a tiny Qwen2 policy built from a config (no hub), CPU, 1 thread.

Each test trains for a handful of optimizer steps (tens of milliseconds each) and checks one claim of the
trainer against an independent recomputation from the recorded micro-batches (see `attach_recorder`)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _references import paper_rule
from _trainer_utils import (
    attach_recorder,
    base_args,
    tiny_dataset,
    tiny_tokenizer,
    vowel_reward,
)
from transformers import set_seed

from rgpo_trl import RGPOConfig, RGPOTrainer, rgpo_loss
from rgpo_trl.trainer.trainer import KL_CONTROLLER_FILE

torch.set_num_threads(1)

LOSS_ATOL = 1e-5  # float32 loss of O(0.1-1); independent log-probs agree with TRL's to ~3e-7


def make_trainer(model_path, output_dir, peft_config=None, **overrides):
    args = RGPOConfig(**base_args(output_dir, **overrides))
    return RGPOTrainer(
        model_path,
        vowel_reward,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tiny_tokenizer(),
        peft_config=peft_config,
    )


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def normalizer_of(trainer, inputs) -> torch.Tensor:
    """TRL's 'dapo' normaliser for one micro-batch on one process."""
    args = trainer.args
    return inputs["num_items_in_batch"].float() * args.gradient_accumulation_steps / args.steps_per_generation


def explicit_loss(record, *, k, kl_coef, beta, ratio_mode, normalizer):
    """The RGPO loss written out from the paper, on the recorded log-probabilities (no library code)."""
    inputs, logps = record["inputs"], record["logps"]
    mask = inputs["completion_mask"].float()
    old = inputs.get("old_per_token_logps", logps)
    ref = inputs["ref_per_token_logps"]
    log_r_old, log_r_ref = logps - old, logps - ref
    log_r = {"old": log_r_old, "ref": log_r_ref, "dual": torch.maximum(log_r_old, log_r_ref)}[ratio_mode]
    gate = torch.sigmoid(k * (torch.exp(log_r) - 1.0))
    kl_old = torch.exp(log_r_old) - 1.0 - log_r_old
    kl_ref = torch.exp(ref - logps) - (ref - logps) - 1.0
    per_token = -gate * inputs["advantages"][:, None] + kl_coef * kl_old + beta * kl_ref
    return (per_token * mask).sum() / normalizer


def library_loss(trainer, record, ratio_mode=None):
    inputs = record["inputs"]
    loss, _ = rgpo_loss(
        record["logps"],
        inputs.get("old_per_token_logps"),
        inputs["advantages"][:, None],
        trainer.args.make_gate(),
        kl_coef=record["kl_coef"],
        ref_logps=inputs["ref_per_token_logps"],
        ref_kl_coef=trainer.args.beta,
        ratio_mode=ratio_mode or trainer.args.ratio_mode,
        mask=inputs["completion_mask"],
        normalizer=normalizer_of(trainer, inputs),
    )
    return loss


# ---------------------------------------------------------------------------------------------- training
def test_training_changes_parameters_and_logs_rgpo_metrics(model_path, tmp_path):
    trainer = make_trainer(model_path, tmp_path, max_steps=2)
    before = snapshot(trainer.model)
    trainer.train()
    after = snapshot(trainer.model)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) == len(before), "every parameter of the policy should move"
    logged = set().union(*(entry.keys() for entry in trainer.state.log_history))
    expected = {
        "rgpo/gate_mean",
        "rgpo/rejected_frac",
        "rgpo/weight_mean",
        "rgpo/ess",
        "rgpo/kl_old",
        "rgpo/kl_coef",
        "rgpo/ratio_old_mean",
        "rgpo/ratio_old_max",
        "rgpo/ratio_ref_mean",
        "rgpo/ratio_ref_max",
        "rgpo/ref_ratio_larger_frac",
        "rgpo/kl_old_iteration",
        "kl",
        "entropy",
        "reward",
    }
    assert expected <= logged, expected - logged
    assert "clip_ratio/region_mean" not in logged  # GRPO's clipped loss is not what runs
    assert all(math.isfinite(e["loss"]) for e in trainer.state.log_history if "loss" in e)


def test_lora_only_the_adapter_changes(model_path, tmp_path):
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = make_trainer(model_path, tmp_path, peft_config=peft_config, max_steps=3)
    assert trainer.ref_model is None  # the reference is the base model with the adapter disabled
    records = attach_recorder(trainer)
    before = snapshot(trainer.model)
    trainer.train()
    after = snapshot(trainer.model)
    adapter = [n for n in before if "lora_" in n]
    frozen = [n for n in before if "lora_" not in n]
    assert adapter and frozen
    assert all(torch.equal(before[n], after[n]) for n in frozen)
    assert any(not torch.equal(before[n], after[n]) for n in adapter)
    # The reference log-probs come from the disabled adapter: equal to the policy's until the adapter moves.
    first = records[0]
    mask = first["inputs"]["completion_mask"].bool()
    assert torch.allclose(first["inputs"]["ref_per_token_logps"][mask], first["logps"][mask], atol=1e-5)
    last = records[-1]
    mask = last["inputs"]["completion_mask"].bool()
    assert (last["inputs"]["ref_per_token_logps"] - last["logps"])[mask].abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------- the loss
def test_loss_equals_library_loss_and_differs_from_grpo(model_path, tmp_path):
    from trl import GRPOTrainer

    def grpo_loss_on_same_batch(trainer, model, inputs, record):
        with torch.no_grad():
            record["grpo_loss"] = GRPOTrainer._compute_loss(trainer, model, inputs).detach()

    trainer = make_trainer(model_path, tmp_path, max_steps=4)
    records = attach_recorder(trainer, extra=grpo_loss_on_same_batch)
    trainer.train()
    assert len(records) == 4
    for record in records:
        normalizer = normalizer_of(trainer, record["inputs"])
        expected = library_loss(trainer, record)
        written_out = explicit_loss(
            record, k=5.0, kl_coef=record["kl_coef"], beta=0.05, ratio_mode="dual", normalizer=normalizer
        )
        torch.testing.assert_close(record["loss"], expected, atol=LOSS_ATOL, rtol=0)
        torch.testing.assert_close(record["loss"], written_out, atol=LOSS_ATOL, rtol=0)
        assert (record["loss"] - record["grpo_loss"]).abs() > 1e-3


def test_num_iterations_2_uses_old_logps_and_ratio_moves_on_second_pass(model_path, tmp_path):
    trainer = make_trainer(model_path, tmp_path, num_iterations=2, max_steps=2)
    records = attach_recorder(trainer)
    trainer.train()
    first, second = records
    assert "old_per_token_logps" in first["inputs"] and "old_per_token_logps" in second["inputs"]
    assert torch.equal(first["inputs"]["completion_ids"], second["inputs"]["completion_ids"])  # reused batch
    for record, moved in ((first, False), (second, True)):
        mask = record["inputs"]["completion_mask"].bool()
        log_r_old = (record["logps"] - record["inputs"]["old_per_token_logps"])[mask]
        if moved:
            assert log_r_old.abs().max() > 1e-3
        else:
            assert log_r_old.abs().max() < 1e-5
    logged = [e for e in trainer.state.log_history if "rgpo/ratio_old_max" in e]
    assert logged[0]["rgpo/ratio_old_max"] == pytest.approx(1.0, abs=1e-5)
    assert logged[1]["rgpo/ratio_old_max"] > 1.0 + 1e-4


def test_num_iterations_1_is_on_policy_and_warns(model_path, tmp_path):
    with pytest.warns(UserWarning, match="old_per_token_logps"):
        trainer = make_trainer(model_path, tmp_path, num_iterations=1, ratio_mode="old", max_steps=1)
    records = attach_recorder(trainer)
    trainer.train()
    assert "old_per_token_logps" not in records[0]["inputs"]
    torch.testing.assert_close(records[0]["loss"], library_loss(trainer, records[0]), atol=LOSS_ATOL, rtol=0)


def test_dual_mode_uses_the_reference_ratio_when_larger(model_path, tmp_path):
    trainer = make_trainer(model_path, tmp_path, ratio_mode="dual", max_steps=4)
    records = attach_recorder(trainer)
    trainer.train()
    # Second iteration, first pass: r_old == 1 and the policy has moved away from the reference.
    record = records[2]
    inputs = record["inputs"]
    mask = inputs["completion_mask"].bool()
    log_r_old = record["logps"] - inputs["old_per_token_logps"]
    log_r_ref = record["logps"] - inputs["ref_per_token_logps"]
    ref_larger = (log_r_ref > log_r_old)[mask].float().mean().item()
    assert 0.0 < ref_larger < 1.0
    normalizer = normalizer_of(trainer, inputs)
    kwargs = dict(k=5.0, kl_coef=record["kl_coef"], beta=0.05, normalizer=normalizer)
    dual = explicit_loss(record, ratio_mode="dual", **kwargs)
    old_only = explicit_loss(record, ratio_mode="old", **kwargs)
    torch.testing.assert_close(record["loss"], dual, atol=LOSS_ATOL, rtol=0)
    assert (dual - old_only).abs() > 1e-3
    logged = [
        e["rgpo/ref_ratio_larger_frac"]
        for e in trainer.state.log_history
        if "rgpo/ref_ratio_larger_frac" in e
    ]
    assert logged[2] == pytest.approx(ref_larger, abs=1e-6)


@pytest.mark.parametrize("ratio_mode", ["old", "ref"])
def test_single_ratio_modes(model_path, tmp_path, ratio_mode):
    trainer = make_trainer(model_path, tmp_path, ratio_mode=ratio_mode, max_steps=3)
    records = attach_recorder(trainer)
    trainer.train()
    for record in records:
        expected = explicit_loss(
            record,
            k=5.0,
            kl_coef=record["kl_coef"],
            beta=0.05,
            ratio_mode=ratio_mode,
            normalizer=normalizer_of(trainer, record["inputs"]),
        )
        torch.testing.assert_close(record["loss"], expected, atol=LOSS_ATOL, rtol=0)
    logged = set().union(*(e.keys() for e in trainer.state.log_history))
    assert "rgpo/ref_ratio_larger_frac" not in logged


def test_sequence_level_importance_sampling_gates_on_sequence_ratio(model_path, tmp_path):
    trainer = make_trainer(model_path, tmp_path, importance_sampling_level="sequence", max_steps=2)
    records = attach_recorder(trainer)
    trainer.train()
    for record in records:
        inputs, logps = record["inputs"], record["logps"]
        mask = inputs["completion_mask"].float()
        old, ref = inputs["old_per_token_logps"], inputs["ref_per_token_logps"]

        def seq_mean(x, mask=mask):
            return (x * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)

        log_r = torch.maximum(seq_mean(logps - old), seq_mean(logps - ref))  # per sequence, dual
        gate = torch.sigmoid(5.0 * (torch.exp(log_r) - 1.0))
        log_r_old = logps - old
        kl_old = torch.exp(log_r_old) - 1.0 - log_r_old
        kl_ref = torch.exp(ref - logps) - (ref - logps) - 1.0
        per_token = -gate * inputs["advantages"][:, None] + record["kl_coef"] * kl_old + 0.05 * kl_ref
        expected = (per_token * mask).sum() / normalizer_of(trainer, inputs)
        torch.testing.assert_close(record["loss"], expected, atol=LOSS_ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- adaptive KL
def iteration_mean_kls(records, iteration_length) -> list[float]:
    """Token-weighted mean of r_old - 1 - log r_old per iteration, from the independent log-probs."""
    sums, counts = {}, {}
    for i, record in enumerate(records):
        inputs = record["inputs"]
        log_r = record["logps"] - inputs["old_per_token_logps"]
        mask = inputs["completion_mask"].double()
        it = i // iteration_length
        sums[it] = sums.get(it, 0.0) + ((torch.exp(log_r) - 1 - log_r).double() * mask).sum().item()
        counts[it] = counts.get(it, 0.0) + mask.sum().item()
    return [sums[i] / counts[i] for i in sorted(sums)]


@pytest.mark.parametrize(
    ("learning_rate", "direction"),
    [(0.3, "up"), (1e-7, "down")],
    ids=["high_kl_doubles", "low_kl_halves"],
)
def test_kl_coef_follows_the_paper_rule_once_per_iteration(model_path, tmp_path, learning_rate, direction):
    # 3 iterations of num_iterations (2) x steps_per_generation (2) = 4 micro-batches = 2 optimizer steps
    # each.
    trainer = make_trainer(
        model_path,
        tmp_path,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=6,
    )
    assert trainer.iteration_length == 4
    records = attach_recorder(trainer)
    trainer.train()
    coefs = [r["kl_coef"] for r in records]
    # Constant within an iteration, changes only at iteration boundaries.
    for it in range(3):
        assert len(set(coefs[4 * it : 4 * it + 4])) == 1
    mean_kls = iteration_mean_kls(records, 4)
    logged = [e["rgpo/kl_old_iteration"] for e in trainer.state.log_history if "rgpo/kl_old_iteration" in e]
    assert logged == pytest.approx(mean_kls, rel=1e-4, abs=1e-6)  # float32 noise of KL ~ 1e-8 at lr 1e-7
    expected = [0.5]
    for mean_kl in mean_kls:
        expected.append(paper_rule(expected[-1], mean_kl))
    assert [coefs[0], coefs[4], coefs[8], trainer.kl_coef] == pytest.approx(expected)
    if direction == "up":
        assert min(mean_kls[:2]) >= 0.03 and expected[:3] == [0.5, 1.0, 2.0]
    else:
        assert max(mean_kls) <= 0.02 / 1.5 and expected == [0.5, 0.25, 0.125, 0.0625]


def test_fixed_kl_controller_keeps_kl_coef(model_path, tmp_path):
    trainer = make_trainer(
        model_path, tmp_path, kl_controller="fixed", kl_coef=0.3, learning_rate=1e-7, max_steps=4
    )
    trainer.train()
    assert trainer.kl_coef == 0.3
    assert any("rgpo/kl_old_iteration" in e for e in trainer.state.log_history)


def test_kl_coef_checkpoint_and_resume(model_path, tmp_path):
    # Low KL: the coefficient halves after every iteration (2 optimizer steps): 0.5 -> 0.25 -> 0.125.
    common = dict(learning_rate=1e-7, max_steps=4, save_strategy="steps", save_steps=2)
    full = make_trainer(model_path, tmp_path / "full", **common)
    full.train()
    assert full.kl_coef == pytest.approx(0.125)

    ckpt = tmp_path / "full" / "checkpoint-2"
    saved = json.loads((ckpt / KL_CONTROLLER_FILE).read_text())
    assert saved["kl_coef"] == pytest.approx(0.25) and saved["num_updates"] == 1
    card = (tmp_path / "full" / "README.md").read_text()
    assert "- rgpo" in card  # model card tag (YAML list)

    resumed = make_trainer(model_path, tmp_path / "resumed", **common)
    records = attach_recorder(resumed)
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.state.global_step == 4
    assert records[0]["kl_coef"] == pytest.approx(0.25)  # continues with the saved value, not kl_coef=0.5
    assert resumed.kl_coef == pytest.approx(0.125)
    assert resumed.kl_ctl.num_updates == 2


def test_resume_refuses_a_corrupt_or_mismatched_kl_controller_file_and_warns_on_a_missing_one(
    model_path, tmp_path
):
    """The same checkpoint rules as AsyncRGPOTrainer's (shared helpers): a corrupt or mismatched file is
    refused naming it, before any step; a missing one warns and training continues from kl_coef."""
    common = dict(learning_rate=1e-7, max_steps=2, save_strategy="steps", save_steps=2)
    make_trainer(model_path, tmp_path / "full", **common).train()
    ckpt = tmp_path / "full" / "checkpoint-2"
    path = ckpt / KL_CONTROLLER_FILE
    saved = json.loads(path.read_text())
    resume = dict(common, max_steps=4, save_strategy="no")

    path.write_text("{not json")
    broken = make_trainer(model_path, tmp_path / "broken", **resume)
    with pytest.raises(ValueError, match=f"{KL_CONTROLLER_FILE} is not valid JSON.*checkpoint is corrupt"):
        broken.train(resume_from_checkpoint=str(ckpt))
    assert broken.state.global_step == 2 and broken.kl_ctl.state_dict()["num_updates"] == 0  # no step ran

    path.write_text(json.dumps({**saved, "controller": "fixed"}))
    other = make_trainer(model_path, tmp_path / "other", **resume)
    with pytest.raises(ValueError, match=f"{KL_CONTROLLER_FILE}: saved KL controller 'fixed' does not match"):
        other.train(resume_from_checkpoint=str(ckpt))

    path.unlink()
    missing = make_trainer(model_path, tmp_path / "missing", **resume)
    with pytest.warns(UserWarning, match=f"{KL_CONTROLLER_FILE} not found: the KL-to-old coefficient"):
        missing.train(resume_from_checkpoint=str(ckpt))
    # restarted at kl_coef = 0.5, then updated once, after the iteration of steps 3-4
    assert missing.state.global_step == 4 and missing.kl_ctl.num_updates == 1


# ---------------------------------------------------------------------------------------------- accumulation
def test_gradient_accumulation_matches_larger_batch(model_path, tmp_path):
    """2 micro-batches of 4 completions accumulated == 1 batch of 8, with plain SGD (update = -lr * grad) and
    no gradient clipping, so the comparison is of gradients.

    Tolerance: 1e-6 of the largest update entry (measured: ~1e-7), in float64. In float32 the two differ by
    ~1e-3 relative, for a reason unrelated to the loss: the group-normalised advantages sum to zero and the
    gradients of log pi of a random tiny model are nearly identical across samples, so sum_i A_i grad log pi_i
    cancels by ~4 orders of magnitude and amplifies float32 rounding differences between a batch of 4 and a
    batch of 8 (the loss values themselves agree to 1e-9)."""
    common = dict(
        optim="sgd",
        learning_rate=0.5,
        max_grad_norm=0.0,
        max_steps=1,
        num_iterations=2,
        model_init_kwargs={"dtype": torch.float64},
    )
    accumulated = make_trainer(
        model_path, tmp_path / "ga", per_device_train_batch_size=4, gradient_accumulation_steps=2, **common
    )
    large = make_trainer(
        model_path, tmp_path / "large", per_device_train_batch_size=8, gradient_accumulation_steps=1, **common
    )
    rec_acc, rec_large = attach_recorder(accumulated), attach_recorder(large)
    updates = []
    for trainer in (accumulated, large):
        before = snapshot(trainer.model)
        set_seed(0)  # same sampling RNG state for both generations
        trainer.train()
        after = snapshot(trainer.model)
        updates.append({n: after[n] - before[n] for n in before})
    # Same generation batch (8 completions), split in two micro-batches vs one batch.
    assert len(rec_acc) == 2 and len(rec_large) == 1

    def rows(records):
        return sorted(
            tuple(r["inputs"]["completion_ids"][i].tolist())
            + (round(r["inputs"]["advantages"][i].item(), 5),)
            for r in records
            for i in range(r["inputs"]["completion_ids"].size(0))
        )

    assert rows(rec_acc) == rows(rec_large)
    scale = max(u.abs().max().item() for u in updates[1].values())
    assert scale > 1e-4
    for name in updates[0]:
        torch.testing.assert_close(updates[0][name], updates[1][name], atol=1e-6 * scale, rtol=0)


def test_the_gate_is_built_once_by_the_trainer_and_the_config_only_validates_it(
    model_path, tmp_path, monkeypatch
):
    from rgpo_trl import Gate

    built, init = [], Gate.__init__

    def counting_init(self, **values):
        built.append(self)
        init(self, **values)

    monkeypatch.setattr(Gate, "__init__", counting_init)
    args = RGPOConfig(**base_args(tmp_path, gate_params={"k": 3.0}))
    assert built == []  # validated against the gate's declaration, not built
    trainer = RGPOTrainer(
        model_path, vowel_reward, args=args, train_dataset=tiny_dataset(), processing_class=tiny_tokenizer()
    )
    assert built == [trainer.gate] and trainer.gate.k == 3.0


def test_requires_rgpo_config(model_path, tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(**base_args(tmp_path))
    with pytest.raises(TypeError, match="RGPOConfig"):
        RGPOTrainer(
            model_path,
            vowel_reward,
            args=args,
            train_dataset=tiny_dataset(),
            processing_class=tiny_tokenizer(),
        )
