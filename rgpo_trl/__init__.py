"""rgpo-trl: Rejection-Gated Policy Optimization.

The core math (gates, loss, adaptive KL controller) is torch-only and imported eagerly. The TRL trainers,
their configs and the trainer monitors (`rgpo_trl.monitors`) are exported lazily, the way TRL exports its own
trainers, so that ``import rgpo_trl`` does not import trl / transformers (the MuJoCo scripts rely on that).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core import *  # noqa: F403
from .core import __all__ as _core_all

__version__ = "0.1.0"

_LAZY = {
    "AsyncRGPOConfig": "rgpo_trl.async_rgpo",
    "AsyncRGPOTrainer": "rgpo_trl.async_rgpo",
    "BehaviourRatioMonitor": "rgpo_trl.monitors",
    "GRPOSamplerConfig": "rgpo_trl.trainer",
    "GRPOSamplerTrainer": "rgpo_trl.trainer",
    "ReferenceKLMonitor": "rgpo_trl.monitors",
    "RGPOConfig": "rgpo_trl.trainer",
    "RGPOTrainer": "rgpo_trl.trainer",
    "PPORLHFConfig": "rgpo_trl.trainer",
    "PPORLHFTrainer": "rgpo_trl.trainer",
}

if TYPE_CHECKING:  # pragma: no cover
    from .async_rgpo import AsyncRGPOConfig, AsyncRGPOTrainer
    from .monitors import BehaviourRatioMonitor, ReferenceKLMonitor
    from .trainer import (
        GRPOSamplerConfig,
        GRPOSamplerTrainer,
        PPORLHFConfig,
        PPORLHFTrainer,
        RGPOConfig,
        RGPOTrainer,
    )


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rgpo_trl' has no attribute {name!r}")


__all__ = [
    *_core_all,
    "AsyncRGPOConfig",
    "AsyncRGPOTrainer",
    "BehaviourRatioMonitor",
    "GRPOSamplerConfig",
    "GRPOSamplerTrainer",
    "PPORLHFConfig",
    "PPORLHFTrainer",
    "RGPOConfig",
    "RGPOTrainer",
    "ReferenceKLMonitor",
]
