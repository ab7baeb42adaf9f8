"""Adaptive KL-to-old coefficient (paper Eq. beta_update), PPO's adaptive-KL heuristic.

Once per iteration, from the mean KLhat_old over all mini-batches of that iteration:
    mean_kl >= 1.5 * target  ->  beta = min(2 beta, max)
    mean_kl <= target / 1.5  ->  beta = max(beta / 2, min)
"""

from __future__ import annotations

import math
from typing import Any


class AdaptiveKLController:
    """Holds beta; ``update(mean_kl)`` applies the doubling / halving rule and returns beta."""

    def __init__(self, init: float = 0.5, target: float = 0.02, min: float = 0.01, max: float = 5.0):
        for field, value in (("init", init), ("target", target), ("min", min), ("max", max)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"AdaptiveKLController {field} must be a finite number > 0, got {value!r}")
        if not (min <= init <= max):
            raise ValueError(
                f"AdaptiveKLController needs min <= init <= max, got min={min}, init={init}, max={max}"
            )
        self.init, self.target, self.min, self.max = float(init), float(target), float(min), float(max)
        self.value = float(init)
        self.num_updates = 0

    def update(self, mean_kl: float) -> float:
        mean_kl = float(mean_kl)
        if not math.isfinite(mean_kl) or mean_kl < 0:
            raise ValueError(f"mean_kl must be a finite number >= 0, got {mean_kl!r}")
        if mean_kl >= 1.5 * self.target:
            self.value = min(2.0 * self.value, self.max)
        elif mean_kl <= self.target / 1.5:
            self.value = max(self.value / 2.0, self.min)
        self.num_updates += 1
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "num_updates": self.num_updates,
            "init": self.init,
            "target": self.target,
            "min": self.min,
            "max": self.max,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        value = float(state["value"])
        if not (self.min <= value <= self.max):
            raise ValueError(f"saved KL coefficient {value} is outside [min, max] = [{self.min}, {self.max}]")
        self.value = value
        self.num_updates = int(state.get("num_updates", 0))

    def __repr__(self) -> str:
        return (
            f"AdaptiveKLController(value={self.value}, target={self.target}, "
            f"min={self.min}, max={self.max})"
        )
