"""Configuration of `AsyncRGPOTrainer`: TRL's `AsyncGRPOConfig` plus the RGPO gate and KL-to-behaviour
controller.

In TRL's asynchronous trainer a generation server samples continuously while the trainer consumes samples up
to ``max_staleness`` weight updates old; the sampler's log-probs are the behaviour policy. The RGPO loss
replaces its PPO clip: per trained token, with r = pi / pi_behaviour (and, in ``dual`` mode, r_ref = pi /
pi_ref),

    -g(r) A + kl_coef * (r_old - 1 - log r_old) + beta * KL_ref(k3)

normalised as TRL normalises its own loss (the micro-batch's trained tokens, then gradient accumulation). The
KL controller updates once per optimizer step, from the step's token-weighted mean KLhat_old to the behaviour
policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl.experimental.async_grpo import AsyncGRPOConfig

from ..core import (
    CORRECTIONS,
    PAPER_KL_DEFAULTS,
    RATIO_MODES,
    describe_corrections,
    describe_gates,
    make_correction,
)
from ..sampler import SAMPLER_DTYPES, SAMPLER_QUANTIZATIONS, check_sampler_settings
from ..trainer.config import RGPOLossSettings

# the settings only the rgpo correction reads
RGPO_ONLY_FIELDS = (
    "gate",
    "gate_params",
    "ratio_mode",
    "kl_controller",
    "kl_coef",
    "kl_target",
    "kl_coef_min",
    "kl_coef_max",
    "beta",
)
# AsyncGRPOConfig fields the RGPO loss does not read, refused when changed (the gate replaces the clip).
REFUSED_IF_SET = {
    "epsilon": (
        "the PPO clipping range is not used by the RGPO loss, which gates instead (see `gate`, "
        "`gate_params`); PPO's clip against the sampler is off_policy_correction='ppo_clip' with "
        "correction_params eps_low / eps_high"
    ),
    "epsilon_high": "the PPO upper clipping range is not used by the RGPO loss, which gates instead",
}


@dataclass
class AsyncRGPOConfig(RGPOLossSettings, AsyncGRPOConfig):
    r"""
    Configuration class for `AsyncRGPOTrainer`: every parameter of
    `trl.experimental.async_grpo.AsyncGRPOConfig` (``max_staleness``, ``weight_sync_steps``, the vLLM server,
    ``token_budget``, ...) plus RGPO's, below.

    Parameters:
        gate (str): acceptance gate g, any name registered with
            `rgpo_trl.register_gate`.
        gate_params (dict or JSON str): the gate's parameters, e.g. `{"k": 5.0}`.
        ratio_mode (str): `old` gates r = pi / pi_behaviour; `ref` and `dual` (max of
            the two) need the frozen reference model, loaded when `ratio_mode != "old"` or `beta > 0`.
        kl_controller (str): rule for the KL-to-behaviour coefficient (`adaptive`,
            `fixed`), applied once per optimizer step.
        kl_coef (float): initial KL-to-behaviour coefficient, 0.5.
        kl_target (float): target KL to the behaviour policy per optimizer step, 0.02.
        kl_coef_min (float): lower bound of the KL-to-behaviour coefficient, 0.01.
        kl_coef_max (float): upper bound of the KL-to-behaviour coefficient, 5.0.
        beta (float): fixed KL-to-reference coefficient beta_ref (paper RLHF: 0.05).
        off_policy_correction (str): the per-token loss against the sampler's log-probs, from
            `rgpo_trl.core.corrections` (`rgpo` uses the gate, ratio mode and KL controller above).
        correction_params (dict or JSON str): the correction's parameters; missing ones take its default.
        sampler_dtype (str): `InProcessRolloutWorker` only: the sampler's copy of the policy in this dtype.
        sampler_quantization (str): `InProcessRolloutWorker` only: `int8` quantises the sampler's Linear
            layers.
        sampler_logit_noise (float): `InProcessRolloutWorker` only: sigma of Gaussian noise on its logits.
        sampler_top_p (float): `InProcessRolloutWorker` only: nucleus truncation in the sampler, not the
            trainer.
    """

    _VALID_DICT_FIELDS = [
        *getattr(AsyncGRPOConfig, "_VALID_DICT_FIELDS", []),
        "gate_params",
        "correction_params",
    ]

    gate: str = field(
        default="sigmoid",
        metadata={
            "help": "Acceptance gate g(r) applied to the importance ratio: any gate registered with "
            "rgpo_trl.register_gate. Built in, with their parameters (set them in `gate_params`): "
            f"{describe_gates()}."
        },
    )
    gate_params: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Parameters of the gate as a dict or JSON string, e.g. '{\"k\": 10}'. Missing "
            "parameters take the gate's declared default; unknown names and values outside the declared "
            "range are refused."
        },
    )
    ratio_mode: str = field(
        default="old",
        metadata={
            "help": "Which importance ratio the gate sees: 'old' = pi/pi_behaviour (the sampler's "
            "log-probs), 'ref' = pi/pi_ref, 'dual' = max(pi/pi_behaviour, pi/pi_ref) per token. 'ref' and "
            "'dual' load a frozen copy of the initial model as the reference and run it on the same packed "
            "rows.",
            "choices": list(RATIO_MODES),
        },
    )
    kl_coef: float = field(
        default=PAPER_KL_DEFAULTS["kl_coef"],
        metadata={"help": "Initial coefficient of the KL-to-behaviour penalty (paper: beta_0 = 0.5)."},
    )
    kl_target: float = field(
        default=PAPER_KL_DEFAULTS["kl_target"],
        metadata={
            "help": "Target KL to the behaviour policy of the adaptive rule: once per optimizer step, from "
            "the token-weighted mean of r - 1 - log r over the step's trained tokens on all processes, the "
            "coefficient doubles if that mean >= 1.5 * kl_target and halves if it is <= kl_target / 1.5."
        },
    )
    kl_coef_min: float = field(
        default=PAPER_KL_DEFAULTS["kl_coef_min"],
        metadata={"help": "Lower bound of the adaptive coefficient."},
    )
    kl_coef_max: float = field(
        default=PAPER_KL_DEFAULTS["kl_coef_max"],
        metadata={"help": "Upper bound of the adaptive coefficient."},
    )
    kl_controller: str = field(
        default="adaptive",
        metadata={
            "help": "Rule for the KL-to-behaviour coefficient, once per optimizer step: 'adaptive' (paper "
            "Eq. beta_update) or 'fixed'; more with rgpo_trl.register_kl_controller."
        },
    )
    beta: float = field(
        default=0.0,
        metadata={
            "help": "Fixed coefficient beta_ref of the k3 KL-to-reference penalty (paper RLHF: 0.05). "
            "When > 0, or with ratio_mode 'ref' / 'dual', a frozen reference model is loaded from the "
            "policy's path."
        },
    )

    off_policy_correction: str = field(
        default="rgpo",
        metadata={
            "help": "Per-token loss for samples whose log-probs come from the sampler (rgpo_trl.core."
            f"corrections; more with rgpo_trl.register_correction). Built in, with defaults: "
            f"{describe_corrections()}. 'rgpo' uses the gate, ratio mode and KL controller above; the "
            "others use none of them (changing those settings with another correction is refused).",
            "choices": list(CORRECTIONS),
        },
    )
    correction_params: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Parameters of the correction as a dict or JSON string, e.g. '{\"cap\": 2}' for tis; "
            "missing ones take the published default, unknown names and values out of range are refused."
        },
    )
    sampler_dtype: str = field(
        default="float32",
        metadata={
            "help": "InProcessRolloutWorker only: the sampler's copy of the policy in this dtype while the "
            "trainer trains in float32 (a bf16 rollout engine); it reports its own log-probs.",
            "choices": list(SAMPLER_DTYPES),
        },
    )
    sampler_quantization: str = field(
        default="none",
        metadata={
            "help": "InProcessRolloutWorker only: 'int8' quantises the sampler's Linear layers dynamically "
            "(torch.ao; the CPU analogue of an int8 / fp8 rollout engine).",
            "choices": list(SAMPLER_QUANTIZATIONS),
        },
    )
    sampler_logit_noise: float = field(
        default=0.0,
        metadata={
            "help": "InProcessRolloutWorker only: sigma of Gaussian noise added to the sampler's logits "
            "before sampling (a dose of mismatch; >= 0, 0 = none)."
        },
    )
    sampler_top_p: float = field(
        default=1.0,
        metadata={
            "help": "InProcessRolloutWorker only: nucleus truncation in the sampler, not in the trainer (the "
            "setting behind TRL issue 6789); in (0, 1], 1 = none."
        },
    )

    def make_correction(self):
        """The configured off-policy correction (checked at construction)."""
        return make_correction(self.off_policy_correction, **(self.correction_params or {}))

    def __post_init__(self):
        if isinstance(self.correction_params, str):
            import json

            try:
                self.correction_params = json.loads(self.correction_params)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"correction_params must be a JSON object, got {self.correction_params!r}"
                ) from err
        if self.correction_params is not None and not isinstance(self.correction_params, dict):
            raise ValueError(f"correction_params must be a dict, got {self.correction_params!r}")
        self.make_correction()  # name and parameters, named in the error
        check_sampler_settings(
            self.sampler_dtype, self.sampler_quantization, self.sampler_logit_noise, self.sampler_top_p
        )
        if self.off_policy_correction != "rgpo":
            changed = [name for name in RGPO_ONLY_FIELDS if _changed(self, name)]
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} only apply with off_policy_correction='rgpo' (got "
                    f"{self.off_policy_correction!r}): leave them at their defaults"
                )
        self._validate_gate_and_kl()
        for name, why in REFUSED_IF_SET.items():
            default = AsyncGRPOConfig.__dataclass_fields__[name].default
            if getattr(self, name) != default:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not supported by AsyncRGPOTrainer: {why}. "
                    f"Leave it at its default ({default!r})."
                )
        super().__post_init__()

    @property
    def needs_reference(self) -> bool:
        """Whether the loss reads the frozen reference model's log-probs."""
        return self.off_policy_correction == "rgpo" and (self.ratio_mode != "old" or self.beta > 0)


def _changed(config: AsyncRGPOConfig, name: str) -> bool:
    value, default = getattr(config, name), AsyncRGPOConfig.__dataclass_fields__[name].default
    if name == "gate_params":  # None and {} both mean the gate's defaults
        return bool(value)
    return value != default
