"""Configuration of `RGPOTrainer`: TRL's `GRPOConfig` plus the RGPO gate and adaptive KL-to-old controller.

RGPO (paper Sec. 4 and Eq. rgpo_rlhf) replaces GRPO's clipped surrogate with a smooth acceptance gate
g(r) on the importance ratio, a differentiable KL penalty to the behaviour policy pi_old whose coefficient
adapts once per iteration, and, for RLHF, a fixed KL penalty to the frozen reference model. Everything
else (generation, rewards, group advantages, vLLM, PEFT, logging) is GRPO's, so the config subclasses
`GRPOConfig` the way TRL's own `trl/experimental/gmpo` does and only adds the RGPO knobs. Two inherited
defaults change meaning or value: ``beta`` is the fixed KL-to-reference coefficient beta_ref (paper: 0.05,
needed for the ``ref`` / ``dual`` ratio modes) and ``num_iterations`` defaults to 2, so that each generation
batch is reused and the ratio to pi_old is not identically 1.

GRPO options orthogonal to the surrogate work as in GRPOTrainer: the ``loss_type`` aggregations ``grpo``,
``bnpo``, ``dr_grpo`` and ``dapo``, the entropy bonus (static and adaptive), the top-entropy-quantile token
mask, the off-policy sequence mask, the bias-corrected KL to the reference and the vLLM importance-sampling
correction (README: table of GRPO options). Options that would replace the gate (``cispo``, ``sapo``,
``vespo``, ``luspo``, two-sided ``delta`` clipping, GRPO's clipping range ``epsilon``) or that only such a
loss reads are refused at construction with a ``ValueError`` naming the field, rather than silently ignored.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from trl import GRPOConfig

from ..core import (
    GATES,
    KL_CONTROLLERS,
    PAPER_KL_DEFAULTS,
    RATIO_MODES,
    Gate,
    KLController,
    check_gate,
    describe_gates,
    make_gate,
    make_kl_controller,
)
from .sync_sampler import InProcessSamplerArguments

AGGREGATIONS = ("dapo", "grpo", "bnpo", "dr_grpo")
GATE_REPLACING = ("cispo", "sapo", "vespo", "luspo")
# GRPOConfig fields that RGPO refuses when set away from their default, and why.
REFUSED_IF_SET = {
    "delta": "two-sided clipping is a PPO/GRPO mechanism; RGPO gates instead (see `gate`)",
    "epsilon": "GRPO's clipping range is not used by the RGPO loss, which gates instead "
    "(see `gate`, `gate_params`)",
    "epsilon_high": "GRPO's upper clipping range is not used by the RGPO loss, which gates instead",
    "sapo_temperature_pos": "only loss_type='sapo' reads it, a surrogate RGPO replaces",
    "sapo_temperature_neg": "only loss_type='sapo' reads it, a surrogate RGPO replaces",
    "vespo_k_pos": "only loss_type='vespo' reads it, a surrogate RGPO replaces",
    "vespo_lambda_pos": "only loss_type='vespo' reads it, a surrogate RGPO replaces",
    "vespo_k_neg": "only loss_type='vespo' reads it, a surrogate RGPO replaces",
    "vespo_lambda_neg": "only loss_type='vespo' reads it, a surrogate RGPO replaces",
}


def refuse_changed_grpo_fields(config: GRPOConfig, reasons: dict[str, str], trainer: str) -> None:
    """Raise for the first field of ``reasons`` set away from its `GRPOConfig` default (an ``epsilon_high``
    equal to ``epsilon`` is GRPOConfig's own default, not a change)."""
    defaults = {f.name: f.default for f in fields(GRPOConfig) if f.name in reasons}
    for name, why in reasons.items():
        value = getattr(config, name)
        if value != defaults[name] and not (name == "epsilon_high" and value == config.epsilon):
            raise ValueError(
                f"{name}={value!r} is not supported by {trainer}: {why}. Leave it at its default "
                f"({defaults[name]!r})."
            )


class RGPOLossSettings:
    """The settings every RGPO trainer reads the same way (mixed into `RGPOConfig` and `AsyncRGPOConfig`): the
    gate, the ratio mode, the KL-to-old controller and ``beta``, validated by name and range at
    construction."""

    def _validate_gate_and_kl(self) -> None:
        if isinstance(self.gate_params, str):
            try:
                self.gate_params = json.loads(self.gate_params)
            except json.JSONDecodeError as err:
                raise ValueError(f"gate_params must be a JSON object, got {self.gate_params!r}") from err
        self.gate_params = dict(self.gate_params or {})
        try:
            # the name and the parameters against the gate's declaration; the trainer builds the gate, once
            check_gate(self.gate, **self.gate_params)
        except ValueError as err:
            if self.gate not in GATES:  # the unknown name is the whole message: no second copy of it
                raise ValueError(str(err)) from None
            raise ValueError(f"gate_params: {err}") from err
        if self.ratio_mode not in RATIO_MODES:
            raise ValueError(f"ratio_mode must be one of {list(RATIO_MODES)}, got {self.ratio_mode!r}")
        if self.kl_controller not in KL_CONTROLLERS:
            raise ValueError(
                f"kl_controller must be one of {sorted(KL_CONTROLLERS)}, got {self.kl_controller!r}"
            )
        self.make_kl_controller()  # validates kl_coef and the controller's own settings
        if (
            isinstance(self.beta, bool)
            or not isinstance(self.beta, (int, float))
            or not math.isfinite(self.beta)
            or self.beta < 0
        ):
            raise ValueError(f"beta must be a finite number >= 0, got {self.beta!r}")

    def make_gate(self) -> Gate:
        """The `Gate` named by ``gate`` with ``gate_params``."""
        return make_gate(self.gate, **self.gate_params)

    def make_kl_controller(self) -> KLController:
        """A fresh KL-to-old controller named by ``kl_controller``."""
        return make_kl_controller(
            self.kl_controller,
            kl_coef=self.kl_coef,
            kl_target=self.kl_target,
            kl_coef_min=self.kl_coef_min,
            kl_coef_max=self.kl_coef_max,
        )


@dataclass
class RGPOConfig(RGPOLossSettings, InProcessSamplerArguments, GRPOConfig):
    r"""
    Configuration class for `RGPOTrainer` (Rejection-Gated Policy Optimization).

    Inherits every parameter of `trl.GRPOConfig`. The RGPO loss, per completion token, is

        -g(r) A + kl_coef * (r_old - 1 - log r_old) + beta * KL_ref(k3)

    with r = r_old = pi/pi_old (``ratio_mode="old"``), r_ref = pi/pi_ref (``"ref"``) or max(r_old, r_ref)
    (``"dual"``, the paper's RLHF default), summed over the completion tokens of the whole accumulated batch
    across processes and divided by their number (TRL's ``"dapo"`` normalisation; ``grpo``, ``bnpo`` and
    ``dr_grpo`` aggregate as GRPOTrainer does). The parameters below are new or have a new default.

    Parameters:
        gate (str): acceptance gate g, any name registered with
            `rgpo_trl.register_gate` (built in: `sigmoid`, `clipped_linear`, `temperature`, and the reference
            correspondences `is` and `ppo_clip`).
        gate_params (dict or JSON str): the gate's parameters, e.g. `{"k": 5.0}`; each
            gate declares its parameters, defaults and allowed ranges.
        ratio_mode (str): which ratio is gated: `old`, `ref` or `dual`.
        kl_controller (str): rule for the KL-to-old coefficient (`adaptive`,
            `fixed`).
        kl_coef (float): initial KL-to-old coefficient, 0.5 (beta_0 of the paper).
        kl_target (float): target KL-to-old per iteration, 0.02 (Delta of the paper).
        kl_coef_min (float): lower bound of the KL-to-old coefficient, 0.01.
        kl_coef_max (float): upper bound of the KL-to-old coefficient, 5.0.
        beta (float): fixed KL-to-reference coefficient beta_ref.
        num_iterations (int): optimisation passes over each generation batch.
        loss_type (str): loss aggregation: `dapo`, `grpo`, `bnpo` or `dr_grpo`.
        gate_on_sampler (bool): gate and KL on pi / pi_sampler (the coupled design).
        use_in_process_sampler (bool): generate with a (mismatched) in-process sampler
            where TRL keeps vLLM (`rgpo_trl.trainer.sync_sampler`), set by `sampler_dtype`,
            `sampler_quantization`, `sampler_logit_noise` and `sampler_top_p`.
    """

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + ["gate_params"]

    # ---- gate ----
    gate: str = field(
        default="sigmoid",
        metadata={
            "help": "Acceptance gate g(r) applied to the importance ratio (paper Sec. 4.4): any gate "
            "registered with rgpo_trl.register_gate. Built in, with their parameters (set them in "
            f"`gate_params`): {describe_gates()}. 'is' (g(r) = r) and 'ppo_clip' are reference "
            "correspondences, not gates."
        },
    )
    gate_params: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Parameters of the gate as a dict or JSON string, e.g. '{\"k\": 10}' for the sigmoid's "
            "k. Missing parameters take the gate's declared default; unknown names and values outside the "
            "declared range are refused."
        },
    )
    ratio_mode: str = field(
        default="dual",
        metadata={
            "help": "Which importance ratio the gate sees: 'old' = pi/pi_old (trust region to the behaviour "
            "policy), 'ref' = pi/pi_ref (anchor to the frozen reference), 'dual' (paper's RLHF default) = "
            "max(pi/pi_old, pi/pi_ref) per token. 'ref' and 'dual' need the reference model, i.e. "
            "`beta` > 0.",
            "choices": list(RATIO_MODES),
        },
    )
    # ---- adaptive KL to pi_old ----
    kl_coef: float = field(
        default=PAPER_KL_DEFAULTS["kl_coef"],
        metadata={
            "help": "Initial coefficient of the KL-to-old penalty kl_coef * mean(r_old - 1 - log r_old) "
            "(paper: beta_0 = 0.5). Must lie in [kl_coef_min, kl_coef_max]."
        },
    )
    kl_target: float = field(
        default=PAPER_KL_DEFAULTS["kl_target"],
        metadata={
            "help": "Target KL-to-old Delta of the adaptive rule (paper Eq. beta_update, default 0.02): once "
            "per iteration (one generation batch and all its `num_iterations` reuses), from the "
            "token-weighted mean of r_old - 1 - log r_old over the iteration and all processes, the "
            "coefficient doubles if that mean >= 1.5 * kl_target and halves if it is <= kl_target / 1.5, "
            "within [kl_coef_min, kl_coef_max]."
        },
    )
    kl_coef_min: float = field(
        default=PAPER_KL_DEFAULTS["kl_coef_min"],
        metadata={"help": "Lower bound of the adaptive KL-to-old coefficient (paper: 0.01)."},
    )
    kl_coef_max: float = field(
        default=PAPER_KL_DEFAULTS["kl_coef_max"],
        metadata={"help": "Upper bound of the adaptive KL-to-old coefficient (paper: 5)."},
    )
    kl_controller: str = field(
        default="adaptive",
        metadata={
            "help": "Rule for the KL-to-old coefficient, once per iteration: 'adaptive' (paper Eq. "
            "beta_update, see kl_target) or 'fixed' (stays at kl_coef); more with "
            "rgpo_trl.register_kl_controller.",
        },
    )
    # ---- inherited fields with RGPO defaults / meaning ----
    beta: float = field(
        default=0.05,
        metadata={
            "help": "Fixed coefficient beta_ref of the KL-to-reference penalty (TRL's k3 estimator, as in "
            "GRPO). Paper (RLHF): 0.05. When > 0, GRPOTrainer loads the reference model (or disables the "
            "LoRA adapter for PEFT models), which the 'ref' and 'dual' ratio modes need; 0 is only allowed "
            "with ratio_mode='old'."
        },
    )
    num_iterations: int = field(
        default=2,
        metadata={
            "help": "Number of optimisation passes over each generation batch (mu). RGPO defaults to 2: with "
            "1 (and steps_per_generation == gradient_accumulation_steps) every update is on-policy, pi_old "
            "== pi, r_old == 1 and the gate and KL-to-old penalty are inert."
        },
    )
    use_bias_correction_kl: bool = field(
        default=False,
        metadata={
            "help": "Multiply the k3 KL-to-reference term by the importance ratio to pi_old, as "
            "GRPOTrainer's option does. RGPO defaults to False (GRPOConfig: True): the paper's Eq. rgpo_rlhf "
            "uses the plain k3."
        },
    )
    loss_type: str = field(
        default="dapo",
        metadata={
            "help": "Aggregation of the per-token RGPO loss, as GRPOTrainer aggregates its own: 'dapo' "
            "(default) sums over the completion tokens of the whole accumulated batch on all processes and "
            "divides by their number, the paper's mini-batch mean, without length bias and exact under "
            "gradient accumulation (2 x batch b = 1 x batch 2b); 'grpo' averages each sequence, then the "
            "sequences; 'bnpo' averages the micro-batch's tokens; 'dr_grpo' divides the sum by sequences x "
            "max_completion_length. The surrogate loss types 'cispo', 'sapo', 'vespo' and 'luspo' replace "
            "the gate and are refused.",
            "choices": ["dapo", "grpo", "bnpo", "dr_grpo"],
        },
    )

    gate_on_sampler: bool = field(
        default=False,
        metadata={
            "help": "Gate on pi / pi_sampler, the log-probs the sampler (vLLM, or a rollout_func that "
            "returns logprobs) reported for what it sampled, instead of pi / pi_old times GRPOTrainer's "
            "importance-sampling factor: RGPO's gate and its KL-to-behaviour penalty then act on the "
            "sampler/trainer mismatch itself, as in AsyncRGPOTrainer. TRL's vllm_importance_sampling_* "
            "factor is not applied (the gate replaces it). A batch without sampler log-probs is refused."
        },
    )

    def __post_init__(self):
        self._validate_rgpo()
        super().__post_init__()

    def _validate_rgpo(self) -> None:
        self._validate_gate_and_kl()
        self.validate_in_process_sampler()
        if self.ratio_mode in ("ref", "dual") and self.beta == 0:
            raise ValueError(
                f"beta must be > 0 with ratio_mode={self.ratio_mode!r}: GRPOTrainer only builds the "
                "reference model (and its log-probs) when beta != 0. Set beta > 0 (paper: 0.05) or "
                "ratio_mode='old'."
            )
        if (
            isinstance(self.num_iterations, bool)
            or not isinstance(self.num_iterations, int)
            or self.num_iterations < 1
        ):
            raise ValueError(f"num_iterations must be an integer >= 1, got {self.num_iterations!r}")
        if self.loss_type not in AGGREGATIONS:
            why = (
                "it is a surrogate loss that replaces the gate"
                if self.loss_type in GATE_REPLACING
                else "unknown"
            )
            raise ValueError(
                f"loss_type={self.loss_type!r} is not supported by RGPOTrainer ({why}); RGPO's loss_type "
                f"chooses how its per-token loss is aggregated: one of {list(AGGREGATIONS)}."
            )
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(
                "importance_sampling_level must be 'token' or 'sequence', got "
                f"{self.importance_sampling_level!r}"
            )
        # GRPO options that would change or replace the gate, or that only such a loss reads: refused, never
        # ignored.
        refuse_changed_grpo_fields(self, REFUSED_IF_SET, "RGPOTrainer")


def micro_batches_per_iteration(args: GRPOConfig) -> int:
    """Training micro-batches of one RL iteration (one generation batch and all its reuse), for any
    GRPOConfig."""
    return args.steps_per_generation * args.num_iterations


def optimizer_steps_per_iteration(args: GRPOConfig) -> int:
    """Optimizer steps of one RL iteration (at least 1), for any GRPOConfig."""
    return max(1, micro_batches_per_iteration(args) // args.gradient_accumulation_steps)
