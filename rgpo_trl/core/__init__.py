"""The paper's math, torch only: gates g(r) and w(r), the RGPO loss and its diagnostics, KL controllers.

Imports nothing from the trainer, the RLHF recipe or gymnasium, so the TRL trainer and the MuJoCo scripts
run the same loss code.
"""

from .gates import (
    GATES,
    LOG_RATIO_CLAMP,
    Gate,
    GateParam,
    check_gate,
    clamp_log_ratio,
    describe_gates,
    make_gate,
    register_gate,
)
from .kl_control import (
    KL_CONTROLLERS,
    PAPER_KL_DEFAULTS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    make_kl_controller,
    register_kl_controller,
)
from .objective import (
    RATIO_MODES,
    LogRatios,
    RGPOTerms,
    effective_sample_size,
    ess_from_moments,
    kl_old_estimate,
    kl_ref_estimate,
    log_ratio_diagnostics,
    log_ratios,
    masked_max,
    masked_mean,
    per_element_diagnostics,
    rgpo_diagnostics,
    rgpo_loss,
    rgpo_terms,
)

__all__ = [
    "PAPER_KL_DEFAULTS",
    "GATES",
    "KL_CONTROLLERS",
    "LOG_RATIO_CLAMP",
    "RATIO_MODES",
    "LogRatios",
    "RGPOTerms",
    "AdaptiveKLController",
    "FixedKLController",
    "Gate",
    "GateParam",
    "KLController",
    "check_gate",
    "clamp_log_ratio",
    "describe_gates",
    "effective_sample_size",
    "ess_from_moments",
    "kl_old_estimate",
    "kl_ref_estimate",
    "log_ratio_diagnostics",
    "log_ratios",
    "make_gate",
    "make_kl_controller",
    "masked_max",
    "masked_mean",
    "per_element_diagnostics",
    "register_gate",
    "register_kl_controller",
    "rgpo_diagnostics",
    "rgpo_loss",
    "rgpo_terms",
]
