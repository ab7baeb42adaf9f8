"""KL to the reference, logged the same way for every method (`ReferenceKLMonitor`): the paper's primary RLHF
stability metric, also for GRPO, which does not optimise it. A mixin for any `trl.GRPOTrainer` subclass
(`RGPOTrainer`, `PPORLHFTrainer`, TRL's own losses), e.g.
``class Monitored(ReferenceKLMonitor, GRPOTrainer)``; the HH-RLHF recipe's trainers use it for every method.
It follows TRL's own reference code line by line (pinned in tests/test_reference_kl_monitor.py)."""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from typing import Any

import peft
import torch
from accelerate.utils import is_peft_model
from packaging.version import Version
from peft import LoraConfig
from trl.models.utils import disable_gradient_checkpointing, prepare_deepspeed, prepare_fsdp
from trl.trainer.utils import (
    add_fused_lm_head,
    create_model_from_path,
    disable_dropout_in_model,
    get_config_model_id,
    use_adapter,
)

from ..core import clamp_log_ratio, kl_ref_estimate


def _given_arguments(init: Any, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of the call ``init(*args, **kwargs)`` by name, bound to ``init``'s own signature (a
    monitored trainer's: `PPORLHFTrainer` adds ``value_model`` and passes GRPOTrainer's keywords on in
    ``**kwargs``), those its ``**kwargs`` collects included."""
    signature = inspect.signature(init)
    given = dict(signature.bind(*args, **kwargs).arguments)
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            given.update(given.pop(name, {}))
    return given


class ReferenceKLMonitor:
    """Mixin: logs ``kl_ref/monitor`` = mean k3 KL(pi_old || pi_ref) over the completion tokens of each
    generation batch, for every method.

    With beta != 0, GRPOTrainer builds the reference and scores each generation batch under it
    (``ref_per_token_logps``) for its loss, and the monitor reads those log-probs. With beta = 0 (GRPO) TRL
    neither builds nor runs a reference, and the trainer is left so (its config, ``beta`` and loss are
    GRPO's); the monitor brings its own:

    - after construction, `_build_reference` builds the reference as GRPOTrainer does for beta != 0 and sets
      it as ``ref_model``, which GRPOTrainer leaves None with beta = 0 and then never reads (for a PEFT
      policy the reference is the policy with its adapter disabled, or a pre-trained adapter's frozen
      ``"ref"`` copy);
    - after each generation batch, `_reference_per_token_logps` scores it under that reference with TRL's
      reference forward; the log-probs never enter the batch, so the loss is exactly GRPO's.

    pi_old is the batch's ``old_per_token_logps``; with one optimizer step per generation batch TRL computes
    none (the behaviour policy is the policy as it is), and the monitor scores the batch under the policy
    itself. ``monitor_builds_reference`` says which case a trainer is in. The trainer's state is not changed
    while a batch is scored or the metric computed.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.monitor_builds_reference = self.beta == 0.0
        if self.monitor_builds_reference:
            given = _given_arguments(super().__init__, args, kwargs)  # as the trainer below took them
            self.ref_model = self._build_reference(
                pre_wrapped_peft=given.get("peft_config") is None,
                quantization_config=given.get("quantization_config"),
            )

    def _build_reference(self, pre_wrapped_peft: bool, quantization_config=None):
        """The reference GRPOTrainer's ``__init__`` builds when beta != 0, built the same way here (the TRL
        lines followed are pinned by a digest in tests/test_reference_kl_monitor.py): a frozen copy of the
        initial policy loaded from its path, dropout disabled as configured, with TRL's fused LM head,
        prepared for DeepSpeed, FSDP or the accelerator; None for a PEFT policy, whose reference is the policy
        with its adapter disabled or, for a model passed with a pre-trained adapter, its ``"ref"`` copy, added
        here. With ``cast_lm_head_to_fp32`` the fused head (the monitor's forward) runs in float32 as TRL's
        does; the copy's plain forward keeps its dtype."""
        args, policy = self.args, self.accelerator.unwrap_model(self.model)
        if is_peft_model(policy):
            default_config = policy.peft_config["default"]
            if not pre_wrapped_peft or (
                isinstance(default_config, LoraConfig)
                and Version("0.17.0") <= Version(peft.__version__) < Version("0.20.0")
                and default_config.target_parameters
            ):  # the base model is the reference (for the second case TRL says so in a warning)
                return None
            policy.add_adapter("ref", default_config)
            for name, param in policy.named_parameters():
                if ".default." in name:
                    policy.get_parameter(name.replace(".default.", ".ref.")).data.copy_(param.data)
            if args.disable_dropout:
                disable_dropout_in_model(policy)
            return None
        model_init_kwargs = dict(args.model_init_kwargs or {})
        if quantization_config is not None:
            model_init_kwargs["quantization_config"] = quantization_config
        if args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
            model_init_kwargs["device_map"] = None
        model_init_kwargs.setdefault("trust_remote_code", args.trust_remote_code)
        model_init_kwargs.setdefault("dtype", policy.dtype)
        model_init_kwargs.setdefault("attn_implementation", policy.config._attn_implementation)
        reference = create_model_from_path(get_config_model_id(policy.config), **model_init_kwargs)
        if args.disable_dropout:
            disable_dropout_in_model(reference)
        add_fused_lm_head(
            reference, temperature=self.temperature, cast_lm_head_to_fp32=args.cast_lm_head_to_fp32
        )
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(reference, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(reference, self.accelerator)
        return self.accelerator.prepare_model(reference, evaluation_mode=True)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self._log_reference_kl(output)
        return output

    def _log_reference_kl(self, batch: dict[str, Any]) -> None:
        """Append the batch's k3 KL(pi_old || pi_ref), token-weighted over all processes, to
        ``kl_ref/monitor``; the reference log-probs are the batch's, or computed here when the loss has
        none."""
        mode = "train" if self.model.training else "eval"
        old = batch.get("old_per_token_logps")
        if old is None:  # one optimizer step per generation batch: TRL skips pi_old, the policy as it is now
            old = self._reference_per_token_logps(batch, policy=True)
        ref = batch.get("ref_per_token_logps")
        if ref is None and self.monitor_builds_reference:
            ref = self._reference_per_token_logps(batch)
        if ref is None:
            return
        mask = batch["completion_mask"].to(ref.dtype)
        kl = kl_ref_estimate(clamp_log_ratio(old - ref))
        totals = self.accelerator.reduce(torch.stack([(kl * mask).sum(), mask.sum()]), reduction="sum")
        self._metrics[mode]["kl_ref/monitor"].append((totals[0] / totals[1].clamp(min=1.0)).item())

    def _reference_per_token_logps(self, batch: dict[str, Any], policy: bool = False) -> torch.Tensor:
        """Log-probs of the batch's completion tokens under the reference, as GRPOTrainer's
        `_generate_and_score_completions` computes ``ref_per_token_logps`` (from ``ref_model``, or with the
        PEFT adapter disabled / the ``"ref"`` adapter), its inputs rebuilt from the batch as GRPOTrainer's
        `_compute_loss` does. tests/test_reference_kl_monitor.py pins a digest of the TRL lines followed.
        With ``policy``, the same forward under the policy as it is (no adapter switched)."""
        prompt_ids, prompt_mask = batch["prompt_ids"], batch["prompt_mask"]
        completion_ids, completion_mask = batch["completion_ids"], batch["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mode = "train" if self.model.training else "eval"
        batch_size = (
            self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        )
        if policy:
            model, reference = self.model, nullcontext()
        elif self.ref_model is not None:
            model, reference = self.ref_model, nullcontext()
        else:
            policy = self.accelerator.unwrap_model(self.model)
            model = self.model
            reference = use_adapter(policy, adapter_name="ref" if "ref" in policy.peft_config else None)
        with (
            torch.no_grad(),
            disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
            reference,
        ):
            ref_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                completion_ids.size(1),
                batch_size=batch_size,
                **{key: batch.get(key) for key in _MULTIMODAL_FORWARD_KEYS},
            )
        return ref_per_token_logps


# The batch entries GRPOTrainer's `_compute_loss` passes to the forward besides the token ids and masks (for
# multimodal policies; absent, None, for text).
_MULTIMODAL_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
