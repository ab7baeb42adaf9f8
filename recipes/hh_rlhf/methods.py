"""The registry of the RLHF methods the paper compares, each defined in one place (`RLHFMethod`,
`register_rlhf_method`, `get_rlhf_method`): settings only. The recipe (`recipes/hh_rlhf_qwen.py`) builds each
method's trainer in plain view from `RLHFMethod.trainer`.

A method (`RLHFMethod`) names the trainer that runs it, its config class, the loss settings it applies over
the shared preset, and the per-iteration metrics it adds. Everything else (data, reward, generation, batch,
learning rate, ``num_iterations``) comes from the preset, so runs differ only in the policy loss. Built in:

- ``rgpo``: `RGPOTrainer`, sigmoid gate (k = 5) on the dual ratio max(r_old, r_ref), adaptive KL-to-old,
  fixed beta_ref = 0.05 (paper Eq. rgpo_rlhf).
- ``rgpo_old``: the same with the gate on r_old alone (the paper's Eq. rgpo_rlhf gates max(r_old, r_ref),
  its Sec. 7.3 text the ratio to pi_old; both are run).
- ``grpo``: TRL's GRPO clipped loss (``loss_type="grpo"``), no reference penalty (beta = 0), as in the
  paper's GRPO baseline ("no explicit reference anchor").
- ``ppo``: PPO-RLHF with a value model (`PPORLHFTrainer`): KL to the reference in the per-token reward
  (beta = 0.05), GAE (gamma 1, lambda 0.95), whitened advantages, clipped surrogate and value loss.
- ``ppo_clip_kl``: PPO's clipped surrogate with a k3 KL-to-reference penalty (beta = 0.05), token-level, on
  GRPO's group-relative advantages (no value model): the stand-in used before ``ppo`` existed.
- ``sapo``: TRL's SAPO soft gate (``loss_type="sapo"``) with the same beta_ref = 0.05.
- ``cispo``: TRL's CISPO (``loss_type="cispo"``): the importance weight to pi_old clipped from above at
  ``epsilon_high`` = 5 (ScaleRL's recommendation, TRL's docs) and stop-gradient, times A log pi; the same
  beta_ref = 0.05: the off-policy peer of the staleness study.
- ``dpo``: TRL's DPOTrainer (beta 0.1) on the dataset's chosen/rejected pairs, same initial policy and
  reference; offline, so its reward, gold and KL_ref come from the shared end-of-run evaluation.
- ``sft``: no training; the initial policy through the same evaluation (KL_ref = 0): the baseline.

The GRPOTrainer methods take `GRPOSamplerConfig` (TRL's GRPOConfig plus the in-process sampler's fields,
off by default): with ``--use_in_process_sampler true`` and ``--sampler_*`` they generate with a mismatched
sampler and TRL's own ``vllm_importance_sampling_*`` correction applies, as for RGPOConfig's methods (which
also take ``gate_on_sampler``). More are added with `register_rlhf_method`. The online methods' trainers
carry the library's monitors (`recipes.hh_rlhf.trainers`); a run's metrics files and console table are
`recipes.hh_rlhf.metrics_log`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl import DPOConfig, GRPOConfig

from rgpo_trl.trainer import GRPOSamplerConfig, PPORLHFConfig, RGPOConfig

# Columns of the per-iteration metrics file that every method has: name -> key logged by the trainer.
BASE_METRICS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "kl_ref": "kl_ref/monitor",
    "gold": "rewards/gold/mean",
    "completion_length": "completions/mean_length",
}
RGPO_METRICS = {
    "kl_old": "rgpo/kl_old_iteration",
    "kl_coef": "rgpo/kl_coef",
    "gate_mean": "rgpo/gate_mean",
    "rejected_frac": "rgpo/rejected_frac",
    "ess": "rgpo/ess",
}

PPO_METRICS = {"value_loss": "ppo/value_loss", "clipfrac": "ppo/clipfrac", "score": "ppo/score"}


# The values of RLHFMethod.trainer, the trainer the recipe builds: RGPOTrainer, TRL's GRPOTrainer,
# PPORLHFTrainer, TRL's DPOTrainer, or None (no training: the SFT baseline).
TRAINERS = ("rgpo", "grpo", "ppo", "dpo", None)


@dataclass(frozen=True)
class RLHFMethod:
    """A policy-loss method of the comparison: the trainer that runs it (one of `TRAINERS`), its config
    class, the loss settings it applies over the shared preset, and the metrics it adds to `BASE_METRICS`."""

    name: str
    trainer: str | None
    config_class: type[GRPOConfig] | type[DPOConfig]
    config: dict[str, Any]
    metrics: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.trainer not in TRAINERS:
            raise ValueError(f"trainer must be one of {list(TRAINERS)}, got {self.trainer!r}")

    @property
    def online(self) -> bool:
        """False: trained on the preference pairs (DPO) or not at all (SFT), evaluated with the same code."""
        return self.trainer not in ("dpo", None)

    @property
    def metric_columns(self) -> dict[str, str]:
        return {**BASE_METRICS, **self.metrics}


RLHF_METHODS: dict[str, RLHFMethod] = {}


def register_rlhf_method(method: RLHFMethod) -> RLHFMethod:
    if method.name in RLHF_METHODS:
        raise ValueError(f"an RLHF method named {method.name!r} is already registered")
    RLHF_METHODS[method.name] = method
    return method


def get_rlhf_method(name: str) -> RLHFMethod:
    if name not in RLHF_METHODS:
        raise ValueError(f"method must be one of {list(RLHF_METHODS)}, got {name!r}")
    return RLHF_METHODS[name]


_RGPO = {"gate": "sigmoid", "gate_params": {"k": 5.0}, "beta": 0.05, "loss_type": "dapo"}
register_rlhf_method(RLHFMethod("rgpo", "rgpo", RGPOConfig, {**_RGPO, "ratio_mode": "dual"}, RGPO_METRICS))
register_rlhf_method(RLHFMethod("rgpo_old", "rgpo", RGPOConfig, {**_RGPO, "ratio_mode": "old"}, RGPO_METRICS))
register_rlhf_method(RLHFMethod("ppo", "ppo", PPORLHFConfig, {"beta": 0.05, "epsilon": 0.2}, PPO_METRICS))
register_rlhf_method(
    RLHFMethod("grpo", "grpo", GRPOSamplerConfig, {"loss_type": "grpo", "beta": 0.0, "epsilon": 0.2})
)
register_rlhf_method(
    RLHFMethod(
        "ppo_clip_kl",
        "grpo",
        GRPOSamplerConfig,
        {"loss_type": "dapo", "beta": 0.05, "epsilon": 0.2, "use_bias_correction_kl": False},
    )
)
register_rlhf_method(
    RLHFMethod(
        "sapo",
        "grpo",
        GRPOSamplerConfig,
        {"loss_type": "sapo", "beta": 0.05, "use_bias_correction_kl": False},
    )
)
register_rlhf_method(
    RLHFMethod(
        "cispo",
        "grpo",
        GRPOSamplerConfig,
        {"loss_type": "cispo", "epsilon_high": 5.0, "beta": 0.05, "use_bias_correction_kl": False},
        {"cispo_clip_ratio": "cispo_clip_ratio"},
    )
)
register_rlhf_method(RLHFMethod("dpo", "dpo", DPOConfig, {"beta": 0.1}))
# The initial (SFT) policy, evaluated with the same code and no training: the baseline a method must beat.
register_rlhf_method(RLHFMethod("sft", None, DPOConfig, {}))
