"""`ReferenceKLMonitor` (rgpo_trl.monitors.reference_kl): for a method trained with beta = 0 (GRPO) it builds
the reference as GRPOTrainer does for beta != 0 and computes the reference log-probs itself, with
GRPOTrainer's reference forward, instead of lending the trainer a beta. These tests pin the TRL lines the
monitor follows, and check on a tiny policy (full, LoRA, and a model passed with a pre-trained adapter) that
the trainer and its config keep beta = 0 from construction on, that the monitor leaves the trainer's state
alone, and that it logs the k3 KL(pi_old || pi_ref) of an independent computation."""

from __future__ import annotations

import copy
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

from recipes.hh_rlhf.trainers import GRPOMonitoredTrainer
from rgpo_trl.monitors.reference_kl import ReferenceKLMonitor, _given_arguments
from rgpo_trl.trainer import PPORLHFTrainer
from rgpo_trl.trainer.trl_version import source_segment_digest

# GRPOTrainer method -> (the `ReferenceKLMonitor` method following it, [(first text, last text) of the lines
# followed, digest])
FOLLOWED = {
    "__init__": (
        "_build_reference",
        [
            # a model passed with a pre-trained adapter: its "ref" copy (or, for old PEFT, the base model)
            (
                "elif is_peft_model(model) and args.beta != 0.0:",
                "ref_param.data.copy_(param.data)",
                "70975795c9313455",
            ),
            # beta = 0 leaves ref_model None; otherwise the frozen copy is loaded from the policy's path
            (
                "self.beta = args.beta",
                "create_model_from_path(get_config_model_id(self.model.config), **model_init_kwargs)",
                "e9fdae11f22aae98",
            ),
            ("if args.disable_dropout:", "disable_dropout_in_model(self.ref_model)", "2b3c808eaeb97582"),
            (
                "self.ref_model, temperature=self.temperature",
                "cast_lm_head_to_fp32=args.cast_lm_head_to_fp32",
                "eb76510d79360010",
            ),
            (
                "self.ref_model = prepare_deepspeed(self.ref_model, self.accelerator)",
                "self.accelerator.prepare_model(self.ref_model, evaluation_mode=True)",
                "f120b02fd85746be",
            ),
        ],
    ),
    "_generate_and_score_completions": (
        "_reference_per_token_logps",
        [
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
            # the reference forward: ref_model, or the PEFT policy with its adapter disabled or "ref" adapter
            ("if self.ref_model is not None:", "ref_per_token_logps = None", "21fbf5b4879bfbce"),
        ],
    ),
    "_compute_loss": (
        "_reference_per_token_logps",
        [
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
    ),
}


@pytest.mark.parametrize("trl_method", list(FOLLOWED))
def test_the_trl_lines_the_monitor_follows_have_not_changed(trl_method):
    """Fails when TRL changes how it builds the reference or computes ``ref_per_token_logps``: re-read TRL's
    lines, update the `ReferenceKLMonitor` method named here (and its `_MULTIMODAL_FORWARD_KEYS`), then the
    digest."""
    follower, segments = FOLLOWED[trl_method]
    assert follower in vars(ReferenceKLMonitor)
    source = inspect.getsource(getattr(GRPOTrainer, trl_method))
    for start, end, digest in segments:
        assert source_segment_digest(source, start, end) == digest, (
            f"GRPOTrainer.{trl_method}: the lines from {start!r} to {end!r} changed; "
            f"ReferenceKLMonitor.{follower} follows them"
        )


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2_monitor"))


class _RecordingTrainer(GRPOMonitoredTrainer):
    """Records every value ``beta`` is set to, and every attribute assignment while ``_recording`` is set."""

    def __setattr__(self, name, value):
        if name == "beta":
            self.__dict__.setdefault("_betas", []).append(value)
        if self.__dict__.get("_recording"):
            self.__dict__["_assigned"].append(name)
        super().__setattr__(name, value)


class _RecordingConfig(GRPOConfig):
    """A GRPOConfig that records every value ``beta`` is set to after construction."""

    def __setattr__(self, name, value):
        if name == "beta" and "beta" in self.__dict__:
            self.__dict__.setdefault("_betas", []).append(value)
        super().__setattr__(name, value)


def _k3(old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> float:
    """Token mean of the k3 estimator of KL(pi_old || pi_ref), exp(ref - old) - (ref - old) - 1."""
    d = (ref - old).double()
    return ((d.exp() - d - 1) * mask).sum().item() / mask.sum().item()


@pytest.mark.parametrize("reference", ["ref_model", "lora", "pretrained_adapter"])
def test_monitor_leaves_the_trainer_alone_and_logs_the_k3_kl_to_the_reference(
    model_path, tmp_path, one_torch_thread, reference
):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    peft = reference != "ref_model"
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model, peft_config, initial = model_path, None, None
    if reference == "lora":
        peft_config = lora
    elif reference == "pretrained_adapter":  # a PeftModel whose adapter is not zero: the reference is it
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_path), lora)
        torch.manual_seed(2)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.1 * torch.randn_like(p))
        initial = copy.deepcopy(model).eval()
    args = _RecordingConfig(**base_args(tmp_path, beta=0.0, loss_type="grpo", max_steps=4))
    trainer = _RecordingTrainer(
        model,
        vowel_reward,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tiny_tokenizer(),
        peft_config=peft_config,
    )
    # beta is 0 from the start: set once (by GRPOTrainer), never lent, on the trainer or its config
    assert trainer.__dict__["_betas"] == [0.0] and "_betas" not in args.__dict__
    assert trainer.beta == 0.0 and trainer.args.beta == 0.0 and trainer.monitor_builds_reference
    # the reference: a frozen copy, the adapter disabled, or the pre-trained adapter's "ref" copy
    assert (trainer.ref_model is None) == peft
    assert ("ref" in getattr(trainer.model, "peft_config", {})) == (reference == "pretrained_adapter")
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
        if initial is not None:
            ref = independent_logps(initial, batch, trainer.temperature)
        elif peft:
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
    # TRL's fused forward with a second adapter active differs from a plain forward by ~1e-3 in log-prob (its
    # own reference log-probs do too); the "ref" adapter itself is checked exactly below
    rel = 2e-2 if reference == "pretrained_adapter" else 1e-4
    for check in checks:
        assert check["assigned"] == []  # no attribute of the trainer is set, not even for a moment
        assert check["same_state"] and check["same_args"] and check["training"] and check["policy_unchanged"]
        assert check["forwards"] == 1  # the reference forward, made by the monitor
        assert len(check["appended"]) == 1
        assert check["appended"][0] == pytest.approx(check["expected"], rel=rel, abs=1e-8)
    assert checks[0]["expected"] > 1e-4  # the policy was moved off the reference
    assert forward_betas and all(b == (0.0, 0.0) for b in forward_betas)  # beta is 0 throughout
    # The loss sees GRPO's batch: no reference log-probs in it.
    assert records and all("ref_per_token_logps" not in r["inputs"] for r in records)
    if initial is not None:  # the "ref" adapter: the pre-trained adapter as it was, frozen through training
        start = dict(initial.named_parameters())
        refs = [(n, p) for n, p in policy.named_parameters() if ".ref." in n]
        assert refs and not any(p.requires_grad for _, p in refs)
        assert all(torch.equal(p, start[n.replace(".ref.", ".default.")]) for n, p in refs)
    logged = [e["kl_ref/monitor"] for e in trainer.state.log_history if "kl_ref/monitor" in e]
    assert logged == pytest.approx([c["appended"][0] for c in checks], rel=1e-6)


def test_the_constructor_arguments_are_bound_to_the_trainers_own_signature():
    """The monitor finds ``peft_config`` and ``quantization_config`` in the arguments of the trainer below it,
    bound to that trainer's signature: PPORLHFTrainer's takes ``value_model`` and passes GRPOTrainer's
    keywords on in ``**kwargs`` (binding to GRPOTrainer's signature raised TypeError on ``value_model``)."""
    lora, quantization, value_model = object(), object(), object()
    given = _given_arguments(
        PPORLHFTrainer.__init__, (None, "policy"), {"value_model": value_model, "peft_config": lora}
    )
    assert given == {"self": None, "model": "policy", "value_model": value_model, "peft_config": lora}
    positional = (None, "policy", None, None, None, None, None, None, None, (None, None), quantization, lora)
    given = _given_arguments(GRPOTrainer.__init__, positional, {})  # GRPOTrainer's takes them in place too
    assert (given["quantization_config"], given["peft_config"]) == (quantization, lora)


class _TrainerWithItsOwnSignature(GRPOTrainer):
    """A GRPOTrainer subclass whose constructor takes an argument GRPOTrainer's does not, as PPORLHFTrainer's
    takes ``value_model``."""

    def __init__(self, model, reward_funcs=None, args=None, extra=None, **kwargs):
        super().__init__(model, reward_funcs, args=args, **kwargs)
        self.extra = extra


class _MonitoredTrainerWithItsOwnSignature(ReferenceKLMonitor, _TrainerWithItsOwnSignature):
    pass


def test_the_monitor_builds_the_reference_under_a_trainer_with_its_own_signature(model_path, tmp_path):
    """At beta = 0 the monitor reads ``peft_config`` from the call: here through a trainer constructor that
    is not GRPOTrainer's. Seen, the policy wrapped by the trainer is its own reference with the adapter
    disabled; missed, the monitor would take the policy for a pre-trained adapter and add a ``"ref"`` copy."""
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = _MonitoredTrainerWithItsOwnSignature(
        model_path,
        vowel_reward,
        args=GRPOConfig(**base_args(tmp_path, beta=0.0, loss_type="grpo", max_steps=1)),
        extra="passed on",
        train_dataset=tiny_dataset(),
        processing_class=tiny_tokenizer(),
        peft_config=lora,
    )
    assert trainer.extra == "passed on" and trainer.monitor_builds_reference and trainer.ref_model is None
    assert list(trainer.model.peft_config) == ["default"]
