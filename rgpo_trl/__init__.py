"""rgpo-trl: Rejection-Gated Policy Optimization.

The core math (gates, loss, adaptive KL controller) is torch-only and imported eagerly. The TRL
trainer and its config are exported lazily, the way TRL exports its own trainers, so that
``import rgpo_trl`` does not import trl / transformers (the MuJoCo scripts rely on that).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .gates import GATES, LOG_RATIO_CLAMP, Gate, clamp_log_ratio, clamped_log_ratio, make_gate
from .kl_control import AdaptiveKLController
from .objective import (
    RATIO_MODES,
    RGPOTerms,
    effective_sample_size,
    kl_old_estimate,
    kl_ref_estimate,
    rgpo_diagnostics,
    rgpo_loss,
    rgpo_terms,
)

__version__ = "0.1.0"

_LAZY = {
    "RGPOConfig": "rgpo_trl.rgpo_config",
    "RGPOTrainer": "rgpo_trl.rgpo_trainer",
}

if TYPE_CHECKING:  # pragma: no cover
    from .rgpo_config import RGPOConfig
    from .rgpo_trainer import RGPOTrainer


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rgpo_trl' has no attribute {name!r}")


__all__ = [
    "GATES",
    "LOG_RATIO_CLAMP",
    "RATIO_MODES",
    "AdaptiveKLController",
    "Gate",
    "RGPOConfig",
    "RGPOTerms",
    "RGPOTrainer",
    "clamp_log_ratio",
    "clamped_log_ratio",
    "effective_sample_size",
    "kl_old_estimate",
    "kl_ref_estimate",
    "make_gate",
    "rgpo_diagnostics",
    "rgpo_loss",
    "rgpo_terms",
]
