"""The TRL layer: `RGPOConfig` (a `trl.GRPOConfig`) and `RGPOTrainer` (a `trl.GRPOTrainer` whose loss is the core's)."""

from .config import RGPOConfig, micro_batches_per_iteration, optimizer_steps_per_iteration
from .trainer import RGPOTrainer

__all__ = ["RGPOConfig", "RGPOTrainer", "micro_batches_per_iteration", "optimizer_steps_per_iteration"]
