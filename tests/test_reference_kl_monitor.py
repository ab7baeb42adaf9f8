"""`ReferenceKLMonitor` (rgpo_trl.rlhf.methods): for a method trained with beta = 0 (GRPO) it computes the
reference log-probs itself, with GRPOTrainer's reference forward, instead of lending the trainer a beta while
a batch is scored. These tests pin the TRL lines that forward follows, and check on a tiny policy (full and
LoRA) that the monitor leaves the trainer's state alone and logs the k3 KL(pi_old || pi_ref) of an
independent computation."""

from __future__ import annotations

import inspect

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
from trl import GRPOConfig, GRPOTrainer

from rgpo_trl.rlhf.methods import GRPOMonitoredTrainer, ReferenceKLMonitor
from rgpo_trl.trainer.trl_version import source_segment_digest

# GRPOTrainer method -> [(first text, last text) of the lines `ReferenceKLMonitor._reference_per_token_logps`
# follows, digest]
FOLLOWED = {
    "_generate_and_score_completions": [
        # the forward's batch size (the token ids and masks are rebuilt as _compute_loss does, below)
        (
            "prompt_completion_ids = torch.cat([prompt_ids, completion_ids], dim=1)",
            "else self.args.per_device_eval_batch_size",
            "74ab8514d79c611f",
        ),
        (
            "with torch.no_grad(), disable_gradient_checkpointing(",
            "self.args.gradient_checkpointing_kwargs):",
            "7f755164d3a895d5",
        ),
        # the reference forward: ref_model, or the PEFT policy with its adapter disabled / its "ref" adapter
        ("if self.ref_model is not None:", "ref_per_token_logps = None", "21fbf5b4879bfbce"),
    ],
    "_compute_loss": [
        # the forward's inputs rebuilt from the batch: token ids, masks and the multimodal entries
        (
            'prompt_ids, prompt_mask = inputs["prompt_ids"]',
            "logits_to_keep = completion_ids.size(1)",
            "bf65989a75655ebb",
        ),
        (
            "per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(",
            'image_position_ids=inputs.get("image_position_ids"),',
            "bcdbdccefce77d29",
        ),
    ],
}


@pytest.mark.parametrize("trl_method", list(FOLLOWED))
def test_the_trl_lines_the_reference_forward_follows_have_not_changed(trl_method):
    """Fails when TRL changes how it computes ``ref_per_token_logps``: re-read TRL's lines, update
    `ReferenceKLMonitor._reference_per_token_logps` (and its `_MULTIMODAL_FORWARD_KEYS`), then the digest."""
    assert "_reference_per_token_logps" in vars(ReferenceKLMonitor)
    source = inspect.getsource(getattr(GRPOTrainer, trl_method))
    for start, end, digest in FOLLOWED[trl_method]:
        assert source_segment_digest(source, start, end) == digest, (
            f"GRPOTrainer.{trl_method}: the lines from {start!r} to {end!r} changed; "
            "ReferenceKLMonitor._reference_per_token_logps follows them"
        )


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2_monitor"))


class _RecordingTrainer(GRPOMonitoredTrainer):
    """Records every attribute assignment on the trainer while ``_recording`` is set."""

    def __setattr__(self, name, value):
        if self.__dict__.get("_recording"):
            self.__dict__["_assigned"].append(name)
        super().__setattr__(name, value)


def _k3(old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> float:
    """Token mean of the k3 estimator of KL(pi_old || pi_ref), exp(ref - old) - (ref - old) - 1."""
    d = (ref - old).double()
    return ((d.exp() - d - 1) * mask).sum().item() / mask.sum().item()


@pytest.mark.parametrize("peft", [False, True], ids=["ref_model", "lora"])
def test_monitor_leaves_the_trainer_alone_and_logs_the_k3_kl_to_the_reference(
    model_path, tmp_path, one_torch_thread, peft
):
    peft_config = None
    if peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    args = GRPOConfig(**base_args(tmp_path, beta=0.0, loss_type="grpo", max_steps=4))
    trainer = _RecordingTrainer(
        model_path,
        vowel_reward,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tiny_tokenizer(),
        peft_config=peft_config,
    )
    assert trainer.beta == 0.0 and trainer.args.beta == 0.0
    assert (trainer.ref_model is None) == peft  # the reference: a frozen copy, or the adapter disabled
    # Move the policy off the reference, so that the KL of the first batch is not 0.
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if p.requires_grad and (not peft or "lora_B" in name):
                p.add_(0.1 * torch.randn_like(p))
    policy = trainer.accelerator.unwrap_model(trainer.model)
    trainer.__dict__.update(_recording=False, _assigned=[])

    forward_betas = []  # (self.beta, self.args.beta) at every forward GRPOTrainer or the monitor makes
    forward = trainer._get_per_token_logps_and_entropies

    def recording_forward(*a, **k):
        forward_betas.append((trainer.beta, trainer.args.beta))
        return forward(*a, **k)

    trainer._get_per_token_logps_and_entropies = recording_forward

    checks = []
    log_reference_kl = trainer._log_reference_kl

    def checked_log_reference_kl(batch):
        mask = batch["completion_mask"].to(torch.float32)
        old = independent_logps(policy, batch, trainer.temperature)
        if peft:
            with policy.disable_adapter():
                ref = independent_logps(policy, batch, trainer.temperature)
        else:
            ref = independent_logps(trainer.ref_model, batch, trainer.temperature)
        state = dict(vars(trainer))
        args_state = trainer.args.to_dict()
        logged = trainer._metrics["train"]["kl_ref/monitor"]
        n_logged, n_forwards, training = len(logged), len(forward_betas), policy.training
        trainer.__dict__["_recording"] = True
        try:
            log_reference_kl(batch)
        finally:
            trainer.__dict__["_recording"] = False
        checks.append(
            dict(
                assigned=list(trainer._assigned),
                same_state=vars(trainer).keys() == state.keys()
                and all(vars(trainer)[k] is v for k, v in state.items()),
                same_args=trainer.args.to_dict() == args_state,
                training=policy.training == training,
                forwards=len(forward_betas) - n_forwards,
                appended=logged[n_logged:],
                expected=_k3(old, ref, mask),
                policy_unchanged=torch.allclose(
                    independent_logps(policy, batch, trainer.temperature), old, atol=0, rtol=0
                ),
            )
        )

    trainer._log_reference_kl = checked_log_reference_kl
    records = attach_recorder(trainer)
    trainer.train()

    assert len(checks) == 2  # max_steps 4, num_iterations 2: two generation batches
    for check in checks:
        assert check["assigned"] == []  # no attribute of the trainer is set, not even for a moment
        assert check["same_state"] and check["same_args"] and check["training"] and check["policy_unchanged"]
        assert check["forwards"] == 1  # the reference forward, made by the monitor
        assert len(check["appended"]) == 1
        assert check["appended"][0] == pytest.approx(check["expected"], rel=1e-4, abs=1e-8)
    assert checks[0]["expected"] > 1e-4  # the policy was moved off the reference
    assert forward_betas and all(b == (0.0, 0.0) for b in forward_betas)  # beta is 0 throughout
    # The loss sees GRPO's batch: no reference log-probs in it.
    assert records and all("ref_per_token_logps" not in r["inputs"] for r in records)
    logged = [e["kl_ref/monitor"] for e in trainer.state.log_history if "kl_ref/monitor" in e]
    assert logged == pytest.approx([c["appended"][0] for c in checks], rel=1e-6)
