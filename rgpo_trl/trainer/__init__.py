"""The TRL layer: `RGPOConfig` (a `trl.GRPOConfig`) and `RGPOTrainer` (a `trl.GRPOTrainer` whose loss is the
core's)."""

import trl

from .trl_version import check_trl_version

check_trl_version(trl.__version__)

from .config import RGPOConfig, micro_batches_per_iteration, optimizer_steps_per_iteration  # noqa: E402
from .ppo_rlhf import PPORLHFConfig, PPORLHFTrainer  # noqa: E402
from .sync_sampler import GRPOSamplerConfig, GRPOSamplerTrainer  # noqa: E402
from .trainer import RGPOTrainer  # noqa: E402

__all__ = [
    "GRPOSamplerConfig",
    "GRPOSamplerTrainer",
    "PPORLHFConfig",
    "PPORLHFTrainer",
    "RGPOConfig",
    "RGPOTrainer",
    "micro_batches_per_iteration",
    "optimizer_steps_per_iteration",
]
