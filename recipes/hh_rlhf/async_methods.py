"""The RLHF methods that run on TRL's asynchronous trainer (``--trainer async``), each defined in one place.

- ``rgpo``: `AsyncRGPOTrainer`, sigmoid gate (k = 5) on max(pi/pi_behaviour, pi/pi_ref), adaptive KL to the
  behaviour policy, beta_ref = 0.05: the synchronous ``rgpo`` with the sampler as pi_old.
- ``rgpo_old``: the same with the gate on pi/pi_behaviour alone.
- ``grpo``: TRL's own `AsyncGRPOTrainer` (PPO clip at 0.2 against the behaviour policy, no reference).
- the sampler-mismatch study's corrections on `AsyncRGPOTrainer`, no reference: ``ignore``, ``ppo_clip``,
  ``tis``, ``icepop``, ``seq_mask`` (rgpo_trl.core.corrections), ``rgpo_mu`` (the gate on pi / pi_sampler
  with the adaptive KL to it) and ``rgpo_gate`` (the same gate, coefficient fixed at 0).

Settings only: the recipe builds the trainer (`AsyncRLHFMethod.trainer`: ``rgpo`` for `AsyncRGPOTrainer`,
``grpo`` for TRL's `AsyncGRPOTrainer`) in plain view, with the rollout worker `rollout_workers` makes.
Imported only for ``--trainer async``: TRL's asynchronous trainer lives in ``trl.experimental``.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

from accelerate import PartialState
from trl.experimental.async_grpo import AsyncGRPOConfig

from rgpo_trl.async_rgpo import (
    AsyncRGPOConfig,
    InProcessRolloutWorker,
    InProcessWeightTransfer,
    install_cpu_shims,
)
from rgpo_trl.cli import UsageError

from .methods import BASE_METRICS

logger = logging.getLogger("rgpo_trl.recipe")

ASYNC_RGPO_METRICS = {
    "kl_ref": "rgpo/kl_ref",
    "kl_old": "rgpo/kl_old",
    "kl_coef": "rgpo/kl_coef",
    "rejected_frac": "rgpo/rejected_frac",
    "staleness": "staleness/mean",  # per trained token, at the gradient
    # TRL's, when taken from the queue (one micro-batch earlier)
    "staleness_dequeued": "sample/staleness_mean",
}


@dataclass(frozen=True)
class AsyncRLHFMethod:
    """An asynchronous method: its trainer (``rgpo``: AsyncRGPOTrainer, ``grpo``: TRL's AsyncGRPOTrainer),
    config class, loss settings over the preset and the metrics it adds to `BASE_METRICS`."""

    name: str
    trainer: str
    config_class: type[AsyncGRPOConfig]
    config: dict[str, Any]
    metrics: dict[str, str]
    online: bool = True

    @property
    def metric_columns(self) -> dict[str, str]:
        return {**BASE_METRICS, **self.metrics}


_RGPO = {"gate": "sigmoid", "gate_params": {"k": 5.0}, "beta": 0.05}
ASYNC_METHODS = {
    "rgpo": AsyncRLHFMethod(
        "rgpo", "rgpo", AsyncRGPOConfig, {**_RGPO, "ratio_mode": "dual"}, ASYNC_RGPO_METRICS
    ),
    "rgpo_old": AsyncRLHFMethod(
        "rgpo_old", "rgpo", AsyncRGPOConfig, {**_RGPO, "ratio_mode": "old"}, ASYNC_RGPO_METRICS
    ),
    "grpo": AsyncRLHFMethod(
        "grpo",
        "grpo",
        AsyncGRPOConfig,
        {"epsilon": 0.2},
        {"staleness_dequeued": "sample/staleness_mean"},
    ),
}


# The off-policy corrections of the sampler-mismatch study (issue 47), all on AsyncRGPOTrainer so that one
# code path runs every arm, none with a reference penalty but rgpo_dual (the ``rgpo`` method above):
# ``ppo_clip`` is AsyncGRPOTrainer's loss (a test checks they are equal), ``rgpo_mu`` the gate on
# pi / pi_sampler with the adaptive KL to the sampler, ``rgpo_gate`` the same gate with the coefficient fixed
# at 0.
CORRECTION_METRICS = {
    "kl_old": "rgpo/kl_old",
    "mismatch": "mismatch/abs_log_ratio_mean",
    "outside_0.9_1.1": "mismatch/outside_0.9_1.1",
    "outside_0.5_2": "mismatch/outside_0.5_2",
    "below_rejection": "mismatch/below_gate_rejection",
    "ratio_max": "rgpo/ratio_old_max",
    "weight_mean": "correction/weight_mean",
    "zero_weight_frac": "correction/zero_weight_frac",
    "staleness": "staleness/mean",
}
for _name in ("ignore", "ppo_clip", "tis", "icepop", "seq_mask"):
    ASYNC_METHODS[_name] = AsyncRLHFMethod(
        _name, "rgpo", AsyncRGPOConfig, {"off_policy_correction": _name}, CORRECTION_METRICS
    )
ASYNC_METHODS["rgpo_mu"] = AsyncRLHFMethod(
    "rgpo_mu",
    "rgpo",
    AsyncRGPOConfig,
    {**_RGPO, "beta": 0.0, "ratio_mode": "old"},
    {**CORRECTION_METRICS, "kl_coef": "rgpo/kl_coef", "rejected_frac": "rgpo/rejected_frac"},
)
ASYNC_METHODS["rgpo_gate"] = AsyncRLHFMethod(
    "rgpo_gate",
    "rgpo",
    AsyncRGPOConfig,
    {**_RGPO, "beta": 0.0, "ratio_mode": "old", "kl_controller": "fixed", "kl_coef": 0.0},
    {**CORRECTION_METRICS, "rejected_frac": "rgpo/rejected_frac"},
)


def get_async_method(name: str) -> AsyncRLHFMethod:
    if name not in ASYNC_METHODS:
        raise ValueError(f"method must be one of {list(ASYNC_METHODS)} with trainer='async', got {name!r}")
    return ASYNC_METHODS[name]


def rollout_workers(
    script_args, training_args, model_args, tokenizer, dataset, reward_funcs, reward_weights
) -> dict[str, Any]:
    """The rollout keyword arguments of the recipe's asynchronous trainer: the in-process rollout worker (a
    thread generating with transformers) and its weight transfer, or none for TRL's vLLM worker, which fails
    up front when vllm is not installed. The preset's settings the trainer does not read are logged."""
    if PartialState().is_main_process and script_args.unused_preset_settings:
        logger.info(
            "the asynchronous trainer does not read these settings: %s", script_args.unused_preset_settings
        )
    rollout = script_args.async_rollout  # resolved by the parser: in_process or vllm
    if rollout == "vllm" and any(w != 1.0 for w in reward_weights):
        raise UsageError(
            f"reward weights {reward_weights} with async_rollout='vllm': TRL's vLLM worker adds every reward "
            "function with weight 1, so the tiny world's gold score (weight 0) would be trained on; use "
            "--async_rollout in_process"
        )
    if rollout == "in_process":
        install_cpu_shims()
        worker = InProcessRolloutWorker(
            model_args.model_name_or_path,
            tokenizer,
            dataset,
            reward_funcs,
            training_args,
            reward_weights=reward_weights,
            lag=script_args.rollout_lag,
        )
        return {"rollout_worker": worker, "weight_transfer": InProcessWeightTransfer(worker)}
    if importlib.util.find_spec("vllm") is None:
        raise UsageError(
            "async_rollout='vllm' needs vllm (pip install vllm) and a running server: "
            f"`trl vllm-serve --model {model_args.model_name_or_path}` (--vllm_server_base_url, default "
            f"{training_args.vllm_server_base_url}); without a GPU use --async_rollout in_process"
        )
    return {}
