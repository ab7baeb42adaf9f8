"""The RLHF methods that run on TRL's asynchronous trainer (``--trainer async``), each defined in one place.

- ``rgpo``: `AsyncRGPOTrainer`, sigmoid gate (k = 5) on max(pi/pi_behaviour, pi/pi_ref), adaptive KL to the
  behaviour policy, beta_ref = 0.05: the synchronous ``rgpo`` with the sampler as pi_old.
- ``rgpo_old``: the same with the gate on pi/pi_behaviour alone.
- ``grpo``: TRL's own `AsyncGRPOTrainer` (PPO clip at 0.2 against the behaviour policy, no reference).

Imported only for ``--trainer async``: TRL's asynchronous trainer lives in ``trl.experimental``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

from ..async_rgpo import AsyncRGPOConfig, AsyncRGPOTrainer
from .methods import BASE_METRICS

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
    name: str
    trainer_class: type[AsyncGRPOTrainer]
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
        "rgpo", AsyncRGPOTrainer, AsyncRGPOConfig, {**_RGPO, "ratio_mode": "dual"}, ASYNC_RGPO_METRICS
    ),
    "rgpo_old": AsyncRLHFMethod(
        "rgpo_old", AsyncRGPOTrainer, AsyncRGPOConfig, {**_RGPO, "ratio_mode": "old"}, ASYNC_RGPO_METRICS
    ),
    "grpo": AsyncRLHFMethod(
        "grpo",
        AsyncGRPOTrainer,
        AsyncGRPOConfig,
        {"epsilon": 0.2},
        {"staleness_dequeued": "sample/staleness_mean"},
    ),
}


def get_async_method(name: str) -> AsyncRLHFMethod:
    if name not in ASYNC_METHODS:
        raise ValueError(f"method must be one of {list(ASYNC_METHODS)} with trainer='async', got {name!r}")
    return ASYNC_METHODS[name]
