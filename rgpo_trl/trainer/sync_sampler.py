"""A mismatched sampler for the synchronous trainers: the CPU stand-in for vLLM on the path most users run.

With ``use_in_process_sampler=True`` (`RGPOConfig`, `GRPOSamplerConfig`) a `GRPOTrainer` subclass generates
with `InProcessSampler`, a sampler that differs from the trainer as the asynchronous worker's does
(`rgpo_trl.sampler`: bf16 or int8 copy, logit noise, top-p in the sampler only) and reports its own per-token
log-probs of what it sampled. It is installed where TRL keeps its vLLM engine (``use_vllm`` and
``vllm_generation``), so TRL's own vLLM branches run unchanged: the weight sync at each optimizer step, the
sampler's log-probs landing in ``sampling_per_token_logps``, the importance-sampling factor pi_old / mu in
each ``vllm_importance_sampling_mode`` with its clip bounds, and the ``sampling/*`` metrics.

Nothing of TRL's is mirrored for the factor. What this module follows is TRL's plain generation (padding,
``generate``, the cut after the first EOS) and the batch TRL scores, so that a faithful sampler (every
setting at its default) generates exactly what GRPOTrainer generates without it and reports the trainer's own
log-probs from the forward TRL makes of the same batch (the factor is then exactly 1);
tests/test_sync_sampler.py pins digests of those TRL lines.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LogitsProcessorList
from trl import GRPOConfig, GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing, unwrap_model_for_generation
from trl.trainer.utils import pad

from ..sampler import (
    SAMPLER_DTYPES,
    SAMPLER_QUANTIZATIONS,
    LogitNoise,
    SamplerSettings,
    check_sampler_settings,
    sampled_log_probs,
    sampler_model,
)

__all__ = ["GRPOSamplerConfig", "GRPOSamplerTrainer", "InProcessSampler", "MismatchedSamplerMixin"]

# GRPOConfig's sampling settings the in-process sampler needs at their neutral values: its log-probs describe
# softmax(logits / temperature) after its own perturbations only.
NEUTRAL_SAMPLING = {
    "top_p": 1.0,
    "top_k": 0,
    "min_p": None,
    "repetition_penalty": 1.0,
    "generation_kwargs": None,
}
SAMPLER_FIELDS = ("sampler_dtype", "sampler_quantization", "sampler_logit_noise", "sampler_top_p")
TRL_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class InProcessSamplerArguments:
    """The in-process sampler's fields, shared by `RGPOConfig` and `GRPOSamplerConfig` (validated by
    `validate_in_process_sampler` in their ``__post_init__``)."""

    use_in_process_sampler: bool = field(
        default=False,
        metadata={
            "help": "Generate with an in-process sampler installed where TRL keeps vLLM, so TRL's vLLM code "
            "runs on it: weight sync, the sampler's log-probs in sampling_per_token_logps, the "
            "vllm_importance_sampling_* factor and the sampling/* metrics (and, in RGPOTrainer, "
            "gate_on_sampler). The CPU stand-in for vLLM; with the sampler_* fields at their defaults it is "
            "faithful (generates as GRPOTrainer does and reports the trainer's own log-probs). Needs "
            "use_vllm=False."
        },
    )
    sampler_dtype: str = field(
        default="float32",
        metadata={
            "help": "In-process sampler only: its copy of the policy in this dtype (bfloat16: a bf16 rollout "
            "engine), refreshed at every weight sync; it reports its own log-probs.",
            "choices": list(SAMPLER_DTYPES),
        },
    )
    sampler_quantization: str = field(
        default="none",
        metadata={
            "help": "In-process sampler only: 'int8' quantises its copy's Linear layers dynamically "
            "(torch.ao, CPU only; the CPU analogue of an int8 / fp8 rollout engine).",
            "choices": list(SAMPLER_QUANTIZATIONS),
        },
    )
    sampler_logit_noise: float = field(
        default=0.0,
        metadata={
            "help": "In-process sampler only: sigma of Gaussian noise added to its logits before temperature "
            "and top-p (a dose of mismatch; >= 0, 0 = none), from its own generator seeded with seed + 1 + "
            "the process index."
        },
    )
    sampler_top_p: float = field(
        default=1.0,
        metadata={
            "help": "In-process sampler only: nucleus truncation in the sampler, not in the trainer (the "
            "setting behind TRL issue 6789); in (0, 1], 1 = none."
        },
    )

    def validate_in_process_sampler(self) -> None:
        """Config-time checks, each one line naming the field and what is allowed."""
        if not isinstance(self.use_in_process_sampler, bool):
            raise ValueError(
                f"use_in_process_sampler must be True or False, got {self.use_in_process_sampler!r}"
            )
        check_sampler_settings(
            self.sampler_dtype, self.sampler_quantization, self.sampler_logit_noise, self.sampler_top_p
        )
        if not self.use_in_process_sampler:
            changed = [
                name for name in SAMPLER_FIELDS if getattr(self, name) != getattr(SamplerSettings(), name[8:])
            ]
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} set the in-process sampler: set use_in_process_sampler=True, or "
                    "leave them at their defaults"
                )
            return
        if self.use_vllm:
            raise ValueError(
                "use_in_process_sampler=True replaces vLLM (it is installed where TRL keeps its vLLM "
                "engine): set use_vllm=False"
            )
        # use_transformers_paged: GRPOConfig's deprecated name, made continuous batching after this check
        if self.use_transformers_continuous_batching or getattr(self, "use_transformers_paged", False):
            raise ValueError(
                "use_in_process_sampler=True generates with its own sampler: set "
                "use_transformers_continuous_batching=False (and use_transformers_paged=False)"
            )
        for name, neutral in NEUTRAL_SAMPLING.items():
            value = getattr(self, name)
            if value != neutral and not (name == "top_k" and value in (None, -1)):
                raise ValueError(
                    f"{name}={value!r} is not supported with use_in_process_sampler=True: the sampler's "
                    "log-probs describe softmax(logits / temperature) and its own sampler_* perturbations; "
                    f"leave {name} at {neutral!r} (sampler_top_p truncates in the sampler only)"
                )
        if self.vllm_importance_sampling_mode not in TRL_IS_MODES:
            raise ValueError(
                f"vllm_importance_sampling_mode must be one of {list(TRL_IS_MODES)}, got "
                f"{self.vllm_importance_sampling_mode!r}"
            )
        if (
            self.loss_type == "vespo"
            and self.vllm_importance_sampling_correction
            and self.vllm_importance_sampling_mode not in ("token_truncate", "token_mask")
        ):  # GRPOTrainer's own check, which its __init__ runs only with use_vllm=True
            raise ValueError(
                "loss_type='vespo' needs vllm_importance_sampling_mode 'token_truncate' or 'token_mask', got "
                f"{self.vllm_importance_sampling_mode!r}"
            )


@dataclass
class GRPOSamplerConfig(InProcessSamplerArguments, GRPOConfig):
    """`trl.GRPOConfig` plus the in-process sampler's fields (`InProcessSamplerArguments`), for
    `GRPOSamplerTrainer`."""

    def __post_init__(self):
        self.validate_in_process_sampler()
        super().__post_init__()


def refuse_sharded_training(is_zero3: bool, is_fsdp: bool) -> None:
    """The sampler generates with, and copies, the full parameters of this process: refused under DeepSpeed
    ZeRO-3 and FSDP, which shard them."""
    if is_zero3 or is_fsdp:
        name = "DeepSpeed ZeRO-3" if is_zero3 else "FSDP"
        raise ValueError(
            f"use_in_process_sampler=True is not supported with {name}: the sampler needs each process's "
            "full parameters (use DDP or ZeRO-1/2, or vLLM)"
        )


def refuse_int8_off_cpu(settings: SamplerSettings, device: torch.device) -> None:
    if settings.quantization == "int8" and device.type != "cpu":
        raise ValueError(
            f"sampler_quantization='int8' runs on the CPU only (torch.ao dynamic quantisation); the trainer "
            f"is on {device.type}: use sampler_dtype='bfloat16' there"
        )


def refuse_other_generation(trainer_kwargs: dict[str, Any]) -> None:
    """Before GRPOTrainer is built: tools, environments and a rollout_func generate otherwise."""
    if trainer_kwargs.get("tools") or trainer_kwargs.get("environment_factory") is not None:
        raise ValueError(
            "use_in_process_sampler=True does not run tool calls or environments (TRL's tool loop reads "
            "vLLM's engine): pass no tools / environment_factory"
        )
    if trainer_kwargs.get("rollout_func") is not None:
        raise ValueError(
            "use_in_process_sampler=True generates itself; a rollout_func replaces the generation: pass "
            "one or the other"
        )


class InProcessSampler:
    """Generates for a `GRPOTrainer` in place of its `VLLMGeneration` (same ``sync_weights`` and ``generate``;
    each process samples its own prompts, as vLLM's colocate mode does).

    Faithful (every sampler_* field at its default): samples as GRPOTrainer's plain path does, with the
    trainer's model and generation config, and reports log-probs from the trainer's forward of the finished
    batch, built as GRPOTrainer builds it. Otherwise it samples from its copy of the policy (bf16 / int8,
    refreshed at each ``sync_weights``) or the trainer's own float32 model, with its logit noise and top-p,
    and reports the log-softmax of the scores it sampled from (vLLM's ``processed_logprobs``). It generates
    in eval mode (a sampler has no dropout)."""

    def __init__(self, trainer: GRPOTrainer, settings: SamplerSettings):
        self.trainer = trainer
        self.settings = settings
        self.copy: torch.nn.Module | None = None  # the bf16 / int8 copy, made at the first sync
        seed = trainer.args.seed + 1 + trainer.accelerator.process_index
        self.noise = LogitNoise(settings.logit_noise, seed) if settings.logit_noise else None
        self.generation_config = copy.deepcopy(trainer.generation_config)
        self.generation_config.top_p = settings.top_p
        # the processed scores it sampled from, whose log-softmax it reports
        self.generation_config.update(output_scores=True, return_dict_in_generate=True)

    @property
    def needs_copy(self) -> bool:
        return self.settings.dtype != "float32" or self.settings.quantization != "none"

    def sync_weights(self) -> None:
        """TRL calls this when the optimizer has stepped since the last generation, as it syncs vLLM."""
        if self.needs_copy:
            model = self.trainer.accelerator.unwrap_model(self.trainer.model)
            self.copy = None  # release the old copy before making the new one
            self.copy = sampler_model(model, self.settings).eval().requires_grad_(False)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], images, num_generations: int, profiler=None) -> tuple:
        """VLLMGeneration.generate's contract: ``prompts`` are this process's token ids (each prompt repeated
        per generation already); returns (prompt_ids, completion_ids, logprobs, None) with each token's
        log-prob as a one-element list (TRL keeps ``lp[0]``)."""
        if images is not None and any(image is not None for image in images):
            raise ValueError("use_in_process_sampler=True generates from text prompts only (got images)")
        trainer = self.trainer
        pad_id, pad_to = trainer._tokenizer.pad_token_id, trainer.pad_to_multiple_of
        device = trainer.accelerator.device
        prompt_tensors = [torch.tensor(ids) for ids in prompts]
        # GRPOTrainer's plain generation path: left-padded prompts, generate, cut after the first EOS
        prompt_ids = pad(prompt_tensors, padding_value=pad_id, padding_side="left", pad_to_multiple_of=pad_to)
        prompt_mask = pad(
            [torch.ones_like(t) for t in prompt_tensors],
            padding_value=0,
            padding_side="left",
            pad_to_multiple_of=pad_to,
        )
        inputs = {"input_ids": prompt_ids.to(device), "attention_mask": prompt_mask.to(device)}
        with (
            profiler or nullcontext(),
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                generation_kwargs=trainer.generation_kwargs,
                gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
            ) as unwrapped,
            _eval_mode(unwrapped),
        ):
            if not self.settings.active:
                sequences = unwrapped.generate(**inputs, generation_config=trainer.generation_config)
            else:
                if self.needs_copy and self.copy is None:
                    self.sync_weights()
                model = self.copy if self.needs_copy else unwrapped
                out = model.generate(
                    **inputs,
                    generation_config=self.generation_config,
                    logits_processor=LogitsProcessorList([self.noise] if self.noise is not None else []),
                )
                sequences = out.sequences
        completion = sequences[:, prompt_ids.size(1) :].cpu()
        completion_ids = [_until_eos(row.tolist(), trainer.eos_token_ids) for row in completion]
        if self.settings.active:
            sampled = sampled_log_probs(out.scores, completion.to(out.scores[0].device)).cpu()
            logps = [sampled[i, : len(ids)].tolist() for i, ids in enumerate(completion_ids)]
        else:
            logps = self._trainer_log_probs(inputs, completion_ids)
        logprobs = [[[value] for value in row] for row in logps]
        return prompts, completion_ids, logprobs, None

    def _trainer_log_probs(self, inputs: dict[str, torch.Tensor], completion_ids: list[list[int]]) -> list:
        """The faithful sampler's log-probs: the trainer's forward of the finished batch, padded, masked and
        chunked as GRPOTrainer's ``_generate_and_score_completions`` does before its own forward of it."""
        trainer = self.trainer
        pad_id, pad_to = trainer._tokenizer.pad_token_id, trainer.pad_to_multiple_of
        device = trainer.accelerator.device
        tensors = [torch.tensor(ids) for ids in completion_ids]
        ids = pad(tensors, padding_value=pad_id, padding_side="right", pad_to_multiple_of=pad_to).to(device)
        mask = pad(
            [torch.ones_like(t) for t in tensors],
            padding_value=0,
            padding_side="right",
            pad_to_multiple_of=pad_to,
        ).to(device)
        if trainer.mask_truncated_completions:
            eos_and_pad = [*trainer.eos_token_ids, pad_id]
            truncated = torch.tensor([row[-1] not in eos_and_pad for row in completion_ids], device=device)
            mask = mask * (~truncated).unsqueeze(1).int()
        mode = "train" if trainer.model.training else "eval"
        args = trainer.args
        batch_size = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
        model = trainer.accelerator.unwrap_model(trainer.model)
        with (
            _eval_mode(model),
            disable_gradient_checkpointing(trainer.model, args.gradient_checkpointing_kwargs),
        ):
            logps, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model,
                torch.cat([inputs["input_ids"], ids], dim=1),
                torch.cat([inputs["attention_mask"], mask], dim=1),
                ids.size(1),
                batch_size=batch_size,
            )
        return [logps[i, : len(row)].tolist() for i, row in enumerate(completion_ids)]


class _eval_mode:
    """Run ``model`` in eval mode, then restore its mode (a sampler has no dropout)."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.was_training = model, model.training

    def __enter__(self):
        self.model.eval()

    def __exit__(self, *exc):
        self.model.train(self.was_training)


def _until_eos(ids: list[int], eos_token_ids: list[int]) -> list[int]:
    """The completion through its first EOS (GRPOTrainer's completion mask), the rest dropped."""
    for k, token in enumerate(ids):
        if token in eos_token_ids:
            return ids[: k + 1]
    return ids


class MismatchedSamplerMixin:
    """Installs `InProcessSampler` where TRL keeps vLLM when ``args.use_in_process_sampler`` is True (put it
    before `GRPOTrainer` in the bases); otherwise sets nothing."""

    def __init__(self, *args: Any, **kwargs: Any):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        sampler_on = getattr(config, "use_in_process_sampler", False)
        if sampler_on:
            refuse_other_generation(kwargs)
        super().__init__(*args, **kwargs)
        if sampler_on:
            self._install_in_process_sampler()

    def _install_in_process_sampler(self) -> None:
        refuse_sharded_training(self._dist.is_zero3, self.is_fsdp_enabled)
        settings = SamplerSettings.from_args(self.args)
        refuse_int8_off_cpu(settings, self.accelerator.device)
        self.use_vllm = True  # TRL's vLLM branches now run on the in-process sampler
        self.vllm_generation = InProcessSampler(self, settings)
        # as GRPOTrainer initialises it for vLLM: weights are synced before the first generation
        self._last_loaded_step = -1


class GRPOSamplerTrainer(MismatchedSamplerMixin, GRPOTrainer):
    """TRL's `GRPOTrainer` with the in-process sampler (`GRPOSamplerConfig(use_in_process_sampler=True)`):
    every GRPO loss and TRL's importance-sampling correction, unchanged, against a mismatched sampler."""

    def __init__(self, model, reward_funcs=None, args: GRPOSamplerConfig | None = None, **kwargs):
        if not isinstance(args, GRPOSamplerConfig):
            raise TypeError(
                f"GRPOSamplerTrainer needs a GRPOSamplerConfig (got {type(args).__name__}): the in-process "
                "sampler's settings live there"
            )
        super().__init__(model, reward_funcs, args=args, **kwargs)
