"""Controllers of the KL-to-old coefficient ``kl_coef`` (the paper's beta), selected by name.

``adaptive`` is the paper's Eq. beta_update, once per iteration from the iteration's mean KLhat_old:
    mean_kl >= 1.5 * kl_target  ->  kl_coef = min(2 kl_coef, kl_coef_max)
    mean_kl <= kl_target / 1.5  ->  kl_coef = max(kl_coef / 2, kl_coef_min)
``fixed`` keeps ``kl_coef``. More are added with `register_kl_controller`.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from .registry import registrar


def _check_positive(owner: str, field: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{owner}: {field} must be a finite number in (0, inf), got {value!r}")
    return float(value)


class KLController:
    """Holds ``kl_coef``; ``update(mean_kl)`` is called once per iteration and returns the new value.
    State is plain JSON (``state_dict`` / ``load_state_dict``) so checkpoints need no pickle."""

    name = ""

    def __init__(self, kl_coef: float = 0.5, kl_coef_min: float = 0.0, kl_coef_max: float = math.inf):
        self.kl_coef = float(kl_coef)
        self.kl_coef_min, self.kl_coef_max = float(kl_coef_min), float(kl_coef_max)
        self.num_updates = 0

    def update(self, mean_kl: float) -> float:
        mean_kl = float(mean_kl)
        if not math.isfinite(mean_kl) or mean_kl < 0:
            raise ValueError(f"mean_kl must be a finite number >= 0, got {mean_kl!r}")
        self.kl_coef = self._next(mean_kl)
        self.num_updates += 1
        return self.kl_coef

    def _next(self, mean_kl: float) -> float:
        return self.kl_coef

    def state_dict(self) -> dict[str, Any]:
        return {"controller": self.name, "kl_coef": self.kl_coef, "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved state; a state of another controller or out of bounds is refused whole."""
        if state.get("controller") != self.name:
            raise ValueError(f"saved KL controller {state.get('controller')!r} does not match {self.name!r}")
        kl_coef, num_updates = state.get("kl_coef"), state.get("num_updates")
        if not isinstance(kl_coef, (int, float)) or not self.kl_coef_min <= kl_coef <= self.kl_coef_max:
            raise ValueError(
                f"saved kl_coef {kl_coef!r} is outside [kl_coef_min, kl_coef_max] = "
                f"[{self.kl_coef_min}, {self.kl_coef_max}]"
            )
        if not isinstance(num_updates, int) or num_updates < 0:
            raise ValueError(f"saved num_updates must be an integer >= 0, got {num_updates!r}")
        self.kl_coef, self.num_updates = float(kl_coef), num_updates

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kl_coef={self.kl_coef})"


KL_CONTROLLERS: dict[str, type[KLController]] = {}


register_kl_controller = registrar(KL_CONTROLLERS, KLController, "kl_controller")
register_kl_controller.__doc__ = (
    """Class decorator: ``@register_kl_controller("name")`` adds a `KLController` subclass."""
)


def make_kl_controller(name: str, **kwargs: float) -> KLController:
    """The registered controller ``name``; ``kwargs`` are the subset of ``kl_coef``, ``kl_target``,
    ``kl_coef_min``, ``kl_coef_max`` it takes (the others are ignored, so one config serves all)."""
    if name not in KL_CONTROLLERS:
        raise ValueError(f"kl_controller must be one of {sorted(KL_CONTROLLERS)}, got {name!r}")
    cls = KL_CONTROLLERS[name]
    accepted = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in kwargs.items() if k in accepted})


@register_kl_controller("fixed")
class FixedKLController(KLController):
    """``kl_coef`` never changes."""

    def __init__(self, kl_coef: float = 0.5):
        if isinstance(kl_coef, bool) or not isinstance(kl_coef, (int, float)) or not kl_coef >= 0:
            raise ValueError(f"FixedKLController: kl_coef must be a finite number >= 0, got {kl_coef!r}")
        super().__init__(kl_coef, kl_coef_min=kl_coef, kl_coef_max=kl_coef)


# The paper's values (beta_0, Delta and beta's bounds, Sec. 5), written once: the adaptive controller, both
# trainer configs and the MuJoCo RGPO script take their defaults from here.
PAPER_KL_DEFAULTS: dict[str, float] = {
    "kl_coef": 0.5,
    "kl_target": 0.02,
    "kl_coef_min": 0.01,
    "kl_coef_max": 5.0,
}


@register_kl_controller("adaptive")
class AdaptiveKLController(KLController):
    """The paper's doubling / halving rule (Eq. beta_update), defaults from the paper."""

    def __init__(
        self,
        kl_coef: float = PAPER_KL_DEFAULTS["kl_coef"],
        kl_target: float = PAPER_KL_DEFAULTS["kl_target"],
        kl_coef_min: float = PAPER_KL_DEFAULTS["kl_coef_min"],
        kl_coef_max: float = PAPER_KL_DEFAULTS["kl_coef_max"],
    ):
        owner = "AdaptiveKLController"
        values = {
            "kl_coef": kl_coef,
            "kl_target": kl_target,
            "kl_coef_min": kl_coef_min,
            "kl_coef_max": kl_coef_max,
        }
        for field, value in values.items():
            _check_positive(owner, field, value)
        if not kl_coef_min <= kl_coef <= kl_coef_max:
            raise ValueError(
                f"{owner}: kl_coef must lie in [kl_coef_min, kl_coef_max] = [{kl_coef_min}, {kl_coef_max}], "
                f"got {kl_coef}"
            )
        super().__init__(kl_coef, kl_coef_min, kl_coef_max)
        self.kl_target = float(kl_target)

    def _next(self, mean_kl: float) -> float:
        if mean_kl >= 1.5 * self.kl_target:
            return min(2.0 * self.kl_coef, self.kl_coef_max)
        if mean_kl <= self.kl_target / 1.5:
            return max(self.kl_coef / 2.0, self.kl_coef_min)
        return self.kl_coef
