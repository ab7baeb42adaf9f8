"""Acceptance gates g(r) and their effective gradient weights w(r) = g'(r) * r.

The paper (Sec. 4.3-4.4) writes every surrogate of the form E[g(r) A] as a reweighted policy
gradient E[w(r) grad log pi A]. A gate therefore needs two things: its value g(r) (the loss term)
and its weight w(r) (diagnostics: ESS, mean weight). Both are computed *from log-ratios*, because
the trainer and the MuJoCo scripts hold log-probabilities, and ``exp`` of a raw log-ratio
overflows float32 beyond ~88.

This module is torch-only on purpose: the TRL trainer and the CleanRL-style scripts must test
the same code.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch

# Log-ratios are clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before exponentiation, i.e.
# r in [2.1e-9, 4.9e8]. The clamp is straight-through (see `clamp_log_ratio`): the value is
# bounded, the gradient is the one at the boundary, so a sample far outside the trust region is
# still pulled back by the KL penalty instead of silently losing its gradient.
LOG_RATIO_CLAMP = 20.0


def clamp_log_ratio(log_ratio: torch.Tensor, bound: float = LOG_RATIO_CLAMP) -> torch.Tensor:
    """Clamp log-ratios to [-bound, bound] with a straight-through gradient.

    Forward: ``log_ratio.clamp(-bound, bound)``. Backward: identity, i.e. d/d(log_ratio) of any
    f(clamped) equals f'(boundary). Inside the range this is exactly the identity.
    """
    detached = log_ratio.detach()  # the correction is computed off the graph: one recorded op
    return log_ratio + detached.clamp(-bound, bound).sub_(detached)


def clamped_log_ratio(
    logps: torch.Tensor, base_logps: torch.Tensor, bound: float = LOG_RATIO_CLAMP
) -> torch.Tensor:
    """``clamp_log_ratio(logps - base_logps)`` with one recorded op instead of two.

    ``base_logps`` (log pi_old or log pi_ref) is a constant, so the clamp can be folded into it:
    ``logps - (logps.detach() - clamp(logps.detach() - base_logps))``; the graph sees ``logps -
    constant`` (gradient 1, the straight-through clamp). The value equals the clamped difference up
    to a rounding at the scale of the log-probs (eps * max(|logps|, |base_logps|)), and is exactly 0
    where ``base_logps`` equals ``logps``. The loss runs once per mini-batch on small tensors, where
    recorded ops dominate the cost."""
    detached = logps.detach()
    return logps - (detached - (detached - base_logps.detach()).clamp_(-bound, bound))


class Gate(ABC):
    """A gate g: (0, inf) -> R applied to importance ratios r = pi_theta / pi_old.

    ``gate(r)`` returns g(r); ``gate.weight(r)`` returns w(r) = g'(r) r in closed form.
    ``from_log_ratio`` / ``weight_from_log_ratio`` do the same from log r, numerically stable
    for any finite log-ratio (values outside +-LOG_RATIO_CLAMP are clamped, see module doc).
    """

    name: str = ""
    #: True for gates with g in [0, 1] (the paper's acceptance gates); False for the IS / PPO
    #: correspondences, kept as baselines.
    is_acceptance_gate: bool = True

    def __call__(self, r: torch.Tensor) -> torch.Tensor:
        return self.from_log_ratio(torch.log(r))

    def weight(self, r: torch.Tensor) -> torch.Tensor:
        return self.weight_from_log_ratio(torch.log(r))

    @abstractmethod
    def from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        """g(exp(log_ratio)), differentiable."""

    @abstractmethod
    def weight_from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        """w = g'(r) r at r = exp(log_ratio), closed form."""

    def value(self, log_ratio: torch.Tensor, ratio_minus_one: torch.Tensor) -> torch.Tensor:
        """g from an already clamped log-ratio and ``ratio_minus_one = expm1(log_ratio)``.

        The loss's hot path: gates override it to reuse r - 1 instead of another ``exp``."""
        return self.from_log_ratio(log_ratio)

    def value_and_weight(
        self, log_ratio: torch.Tensor, ratio_minus_one: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(g, detached w), same inputs as `value`; gates override it to share work between g and w."""
        return self.value(log_ratio, ratio_minus_one), self.weight_from_log_ratio(log_ratio.detach())

    @property
    @abstractmethod
    def params(self) -> dict[str, float]:
        """The gate's parameters, e.g. ``{"k": 5.0}`` (for logging and configs)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"


def _require_positive(value: float, field: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field} must be a finite number > 0 (allowed range: (0, inf)), got {value!r}")
    return value


class SigmoidGate(Gate):
    """g(r) = sigmoid(k (r - 1)); w(r) = k s (1 - s) r. The paper's default gate (k = 5)."""

    name = "sigmoid"

    def __init__(self, k: float = 5.0):
        self.k = _require_positive(k, "k")

    @property
    def params(self) -> dict[str, float]:
        return {"k": self.k}

    def from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        r = torch.exp(clamp_log_ratio(log_ratio))
        return torch.sigmoid(self.k * (r - 1.0))

    def weight_from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        r = torch.exp(clamp_log_ratio(log_ratio))
        s = torch.sigmoid(self.k * (r - 1.0))
        return self.k * s * (1.0 - s) * r

    def value(self, log_ratio: torch.Tensor, ratio_minus_one: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.k * ratio_minus_one)

    def value_and_weight(
        self, log_ratio: torch.Tensor, ratio_minus_one: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.value(log_ratio, ratio_minus_one)
        gd = g.detach()  # w from detached tensors: no graph, and cheaper than a no_grad block
        w = (1.0 - gd).mul_(gd).mul_(ratio_minus_one.detach() + 1.0).mul_(self.k)
        return g, w


class ClippedLinearGate(Gate):
    """g(r) = clip(r, 0, c); w(r) = r 1[r < c] (truncated importance sampling, Ablation A).

    Not bounded in [0, 1] when c > 1 (the paper's default c = 2): it caps the acceptance weight.
    """

    name = "clipped_linear"

    def __init__(self, c: float = 2.0):
        self.c = _require_positive(c, "c")
        self.is_acceptance_gate = self.c <= 1.0

    @property
    def params(self) -> dict[str, float]:
        return {"c": self.c}

    def from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        # r > 0 always, so clip(r, 0, c) = min(r, c); clamp in log space to avoid overflow.
        return torch.exp(clamp_log_ratio(log_ratio).clamp(max=math.log(self.c)))

    def weight_from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        r = torch.exp(clamp_log_ratio(log_ratio))
        return torch.where(log_ratio < math.log(self.c), r, torch.zeros_like(r))


class TemperatureGate(Gate):
    """g(r) = r^b / (1 + r^b) = sigmoid(b log r); w(r) = b g (1 - g), in [0, b/4]."""

    name = "temperature"

    def __init__(self, temperature: float = 1.0):
        self.temperature = _require_positive(temperature, "temperature")

    @property
    def params(self) -> dict[str, float]:
        return {"temperature": self.temperature}

    def from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        # sigmoid of the raw log-ratio is stable everywhere; no clamp needed.
        return torch.sigmoid(self.temperature * log_ratio)

    def weight_from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        g = torch.sigmoid(self.temperature * log_ratio)
        return self.temperature * g * (1.0 - g)


class ImportanceSamplingGate(Gate):
    """g(r) = r: plain importance sampling (TRPO's surrogate); w(r) = r. A baseline, not a gate."""

    name = "is"
    is_acceptance_gate = False

    @property
    def params(self) -> dict[str, float]:
        return {}

    def from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        return torch.exp(clamp_log_ratio(log_ratio))

    def weight_from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        return torch.exp(clamp_log_ratio(log_ratio))

    def value(self, log_ratio: torch.Tensor, ratio_minus_one: torch.Tensor) -> torch.Tensor:
        return ratio_minus_one + 1.0

    def value_and_weight(
        self, log_ratio: torch.Tensor, ratio_minus_one: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ratio = self.value(log_ratio, ratio_minus_one)
        return ratio, ratio.detach()


class PPOClipGate(Gate):
    """g(r) = clip(r, 1 - eps, 1 + eps); w(r) = r 1[1 - eps < r < 1 + eps].

    The gradient-level correspondence of PPO from the paper's Table 1 (it ignores PPO's
    min(.) pessimism, which depends on the sign of A). A baseline, not an acceptance gate.
    """

    name = "ppo_clip"
    is_acceptance_gate = False

    def __init__(self, eps: float = 0.2):
        eps = float(eps)
        if not (0.0 < eps < 1.0):
            raise ValueError(f"eps must be in the open interval (0, 1), got {eps!r}")
        self.eps = eps

    @property
    def params(self) -> dict[str, float]:
        return {"eps": self.eps}

    def from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        lo, hi = math.log1p(-self.eps), math.log1p(self.eps)
        return torch.exp(clamp_log_ratio(log_ratio).clamp(lo, hi))

    def weight_from_log_ratio(self, log_ratio: torch.Tensor) -> torch.Tensor:
        lo, hi = math.log1p(-self.eps), math.log1p(self.eps)
        r = torch.exp(clamp_log_ratio(log_ratio))
        inside = (log_ratio > lo) & (log_ratio < hi)
        return torch.where(inside, r, torch.zeros_like(r))


GATES: dict[str, type[Gate]] = {
    cls.name: cls
    for cls in (SigmoidGate, ClippedLinearGate, TemperatureGate, ImportanceSamplingGate, PPOClipGate)
}


def make_gate(name: str, **params: Any) -> Gate:
    """Build a gate by name: ``sigmoid`` (k=5), ``clipped_linear`` (c=2.0),
    ``temperature`` (temperature=1.0), ``is``, ``ppo_clip`` (eps=0.2).

    Unknown names or parameters raise ``ValueError``; ``None`` parameter values mean "default".
    """
    if name not in GATES:
        raise ValueError(f"gate must be one of {sorted(GATES)}, got {name!r}")
    params = {k: v for k, v in params.items() if v is not None}
    try:
        return GATES[name](**params)
    except TypeError as err:
        allowed = list(GATES[name]().params)
        raise ValueError(
            f"gate {name!r} accepts parameters {allowed}, got {sorted(params)}"
        ) from err
