"""RGPO in TRL's asynchronous trainer (`trl.experimental.async_grpo`): `AsyncRGPOTrainer`, its config, and an
in-process rollout worker and weight transfer for CPU runs."""

from .config import AsyncRGPOConfig
from .cpu import install_cpu_shims
from .trainer import AsyncRGPOTrainer
from .worker import InProcessRolloutWorker, InProcessWeightTransfer, RolloutWorkerError

__all__ = [
    "AsyncRGPOConfig",
    "AsyncRGPOTrainer",
    "InProcessRolloutWorker",
    "InProcessWeightTransfer",
    "RolloutWorkerError",
    "install_cpu_shims",
]
