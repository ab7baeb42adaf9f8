"""The TRL layer: `RGPOConfig` (a `trl.GRPOConfig`) and `RGPOTrainer` (a `trl.GRPOTrainer` whose loss is the core's)."""

from .config import RGPOConfig, micro_batches_per_iteration, optimizer_steps_per_iteration
from .ppo_rlhf import PPORLHFConfig, PPORLHFTrainer
from .trainer import RGPOTrainer

__all__ = [
    "PPORLHFConfig",
    "PPORLHFTrainer",
    "RGPOConfig",
    "RGPOTrainer",
    "micro_batches_per_iteration",
    "optimizer_steps_per_iteration",
]
