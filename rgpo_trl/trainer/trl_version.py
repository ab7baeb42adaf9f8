"""The TRL versions the trainers are tested with. `RGPOTrainer` and `PPORLHFTrainer` override private
`GRPOTrainer` methods (`_compute_loss`, `_generate_and_score_completions`, `_save_checkpoint`,
`_load_optimizer_and_scheduler`, `_get_per_token_logps_and_entropies`'s callers), which TRL may change in any
release; outside the tested range they may still work, so importing them warns once instead of failing."""

from __future__ import annotations

import warnings

from packaging.version import Version

TESTED_TRL = (Version("1.16"), Version("1.17"))  # [low, high): the releases the test suite has run against


def check_trl_version(installed: str) -> bool:
    """True when ``installed`` is in the tested range; otherwise warn, naming the range (called once, at
    import)."""
    low, high = TESTED_TRL
    if low <= Version(Version(installed).base_version) < high:  # a pre-release counts as its release
        return True
    warnings.warn(
        f"rgpo-trl's trainers are tested with trl>={low},<{high}; trl {installed} is installed. They "
        "override private GRPOTrainer methods, which may have changed: run the test suite (`make test`) "
        "before relying on results.",
        UserWarning,
        stacklevel=3,
    )
    return False
