"""A sampler that differs from the trainer, as vLLM does: a copy of the policy in bfloat16 or int8, noise on
its logits, nucleus truncation in the sampler only. Each reports its own log-probs of what it sampled (the
log-softmax of the scores it sampled from), so pi / mu measures the mismatch a correction must handle.

Shared by the asynchronous trainer's in-process worker (`AsyncRGPOConfig` fields) and the synchronous
trainers' in-process sampler (`rgpo_trl.trainer.sync_sampler`, the same fields on `RGPOConfig` and
`GRPOSamplerConfig`): ``sampler_dtype``, ``sampler_quantization``, ``sampler_logit_noise``, ``sampler_top_p``.
With all at their defaults the sampler is faithful: it samples with the float32 policy itself, and its
log-probs come from a forward of the finished sequences.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

SAMPLER_DTYPES = ("float32", "bfloat16")
SAMPLER_QUANTIZATIONS = ("none", "int8")


@dataclass(frozen=True)
class SamplerSettings:
    dtype: str = "float32"
    quantization: str = "none"
    logit_noise: float = 0.0
    top_p: float = 1.0

    def __post_init__(self):
        check_sampler_settings(self.dtype, self.quantization, self.logit_noise, self.top_p)

    @classmethod
    def from_args(cls, args: Any) -> SamplerSettings:
        """From a config; TRL's own AsyncGRPOConfig (without these fields) gives the faithful sampler."""
        return cls(
            getattr(args, "sampler_dtype", "float32"),
            getattr(args, "sampler_quantization", "none"),
            getattr(args, "sampler_logit_noise", 0.0),
            getattr(args, "sampler_top_p", 1.0),
        )

    @property
    def active(self) -> bool:
        return self != SamplerSettings()

    def describe(self) -> str:
        parts = [f"{self.dtype} weights"]
        if self.quantization != "none":
            parts.append(f"{self.quantization} Linear layers")
        if self.logit_noise:
            parts.append(f"logit noise sigma {self.logit_noise:g}")
        if self.top_p < 1:
            parts.append(f"top_p {self.top_p:g}")
        return ", ".join(parts)


def check_sampler_settings(dtype: str, quantization: str, logit_noise: float, top_p: float) -> None:
    """Config-time checks, each naming the field and the allowed values."""
    if dtype not in SAMPLER_DTYPES:
        raise ValueError(f"sampler_dtype must be one of {list(SAMPLER_DTYPES)}, got {dtype!r}")
    if quantization not in SAMPLER_QUANTIZATIONS:
        raise ValueError(
            f"sampler_quantization must be one of {list(SAMPLER_QUANTIZATIONS)}, got {quantization!r}"
        )
    if quantization != "none" and dtype != "float32":
        raise ValueError(
            f"sampler_quantization={quantization!r} quantises a float32 copy: leave sampler_dtype at "
            f"'float32' (got {dtype!r})"
        )
    if not (_is_number(logit_noise) and math.isfinite(logit_noise) and logit_noise >= 0):
        raise ValueError(f"sampler_logit_noise must be a finite number >= 0 (0: none), got {logit_noise!r}")
    if not (_is_number(top_p) and 0 < top_p <= 1):
        raise ValueError(f"sampler_top_p must be in (0, 1] (1: no truncation), got {top_p!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def sampler_model(model: torch.nn.Module, settings: SamplerSettings) -> torch.nn.Module:
    """The copy the sampler runs: ``model`` itself (float32), a bfloat16 copy, or a copy whose Linear layers
    are dynamically quantised to int8 (torch.ao, the CPU analogue of an int8 / fp8 rollout engine)."""
    if settings.dtype == "bfloat16":
        return _own_copy(model).to(torch.bfloat16)
    if settings.quantization == "int8":
        try:
            from torch.ao.quantization import quantize_dynamic
        except ImportError as err:  # pragma: no cover - depends on the torch release
            raise RuntimeError(
                "sampler_quantization='int8' needs torch.ao.quantization.quantize_dynamic, which this torch "
                f"({torch.__version__}) does not have"
            ) from err
        with warnings.catch_warnings():  # torch.ao's deprecation notice, every call
            warnings.simplefilter("ignore")
            return quantize_dynamic(_own_copy(model), {torch.nn.Linear}, dtype=torch.qint8)
    return model


def _own_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy that runs its own weights: a ``forward`` patched onto a module instance is dropped, so each
    module runs its class's forward (TRL's fused LM head patches the policy's ``forward`` with a closure over
    the *original* model's, which a copy would otherwise call)."""
    copied = copy.deepcopy(model)
    for module in copied.modules():
        module.__dict__.pop("forward", None)
    return copied


class LogitNoise:
    """A logits processor adding N(0, sigma^2) to every score, from its own seeded generator (so the noise
    does not move the sampling's random stream)."""

    def __init__(self, sigma: float, seed: int):
        self.sigma = sigma
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(scores.shape, generator=self.generator, dtype=torch.float32)
        return scores + (self.sigma * noise).to(device=scores.device, dtype=scores.dtype)


def sampled_log_probs(scores: tuple[torch.Tensor, ...], completions: torch.Tensor) -> torch.Tensor:
    """log mu of each generated token: log-softmax of the processed scores it was sampled from (what vLLM
    reports), ``(num_sequences, steps)``; positions after a sequence's end are meaningless."""
    steps = torch.stack([s.float() for s in scores], dim=1)  # (B, T, V)
    logp = torch.log_softmax(steps, dim=-1)
    return logp.gather(-1, completions[:, : steps.shape[1], None])[..., 0]
