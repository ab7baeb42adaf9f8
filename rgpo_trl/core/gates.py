"""Acceptance gates g(r) and their effective gradient weights w(r) = g'(r) r (paper Sec. 4.3-4.4).

Every surrogate E[g(r) A] is a reweighted policy gradient E[w(r) grad log pi A]. A gate is therefore two
formulas, g (the loss term) and w (ESS and the other diagnostics), plus its declared parameters. Both take
the log-ratio log r, clamped once where it is formed (`clamp_log_ratio`), because callers hold
log-probabilities and ``exp`` of a raw log-ratio overflows float32 beyond ~88.

New gates are added with `register_gate`; they then work everywhere a built-in does (`make_gate`,
`RGPOConfig`, the recipe's command line, the MuJoCo RGPO script's ``--gate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .registry import registrar

# Log-ratios are clamped to [-20, 20], i.e. r in [2.1e-9, 4.9e8], with a straight-through gradient: the
# value is bounded, the gradient is kept, so a sample far outside the trust region is still pulled back
# by the KL penalty instead of silently losing its gradient.
LOG_RATIO_CLAMP = 20.0


def clamp_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """``log_ratio`` clamped to +-LOG_RATIO_CLAMP in value, with the identity as its gradient.

    Exactly ``log_ratio`` inside the range (the correction added is an exact 0 there)."""
    detached = log_ratio.detach()  # the correction is computed off the graph: one recorded op
    return log_ratio + (detached.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) - detached)


@dataclass(frozen=True)
class GateParam:
    """A gate parameter: its default and allowed interval, declared once. Config validation, command-line
    help and error messages all come from here."""

    default: float
    help: str
    low: float = 0.0
    high: float = math.inf
    low_open: bool = True
    high_open: bool = True

    @property
    def interval(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def check(self, gate: str, name: str, value: Any) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if ok:
            ok = (value > self.low if self.low_open else value >= self.low) and (
                value < self.high if self.high_open else value <= self.high
            )
        if not ok:
            raise ValueError(
                f"gate {gate!r}: {name} must be a finite number in {self.interval}, got {value!r}"
            )
        return float(value)


class Gate:
    """g(r) and w(r) = g'(r) r, both from a clamped log-ratio ``log_r``; ``g`` is differentiable.

    Subclasses declare ``params`` (name -> `GateParam`); the values are validated against that declaration
    (`check_params`, which a config also calls without building a gate) and set as attributes by the
    constructor.
    """

    name: ClassVar[str] = ""
    params: ClassVar[dict[str, GateParam]] = {}
    #: g in [0, 1]: the paper's acceptance gates. False for the IS / PPO correspondences (baselines).
    is_acceptance_gate: bool = True

    def __init__(self, **values: float | None):
        for key, value in self.check_params(values).items():
            setattr(self, key, value)

    @classmethod
    def check_params(cls, values: dict[str, float | None]) -> dict[str, float]:
        """The parameter values the constructor sets (``None`` or missing: the declared default), validated
        against ``params``; an unknown name or a value outside its declared range raises ``ValueError``."""
        unknown = sorted(set(values) - set(cls.params))
        if unknown:
            raise ValueError(f"gate {cls.name!r} accepts parameters {sorted(cls.params)}, got {unknown}")
        checked = {}
        for key, spec in cls.params.items():
            value = values.get(key)
            checked[key] = spec.check(cls.name, key, spec.default if value is None else value)
        return checked

    def g(self, log_r: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def w(self, log_r: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def param_values(self) -> dict[str, float]:
        return {key: getattr(self, key) for key in self.params}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.param_values.items())
        return f"{type(self).__name__}({args})"


GATES: dict[str, type[Gate]] = {}


register_gate = registrar(GATES, Gate, "gate")
register_gate.__doc__ = (
    """Class decorator: ``@register_gate("name")`` adds a `Gate` subclass to the registry."""
)


def _gate_class(name: str) -> type[Gate]:
    if name not in GATES:
        raise ValueError(f"gate must be one of the registered gates {sorted(GATES)}, got {name!r}")
    return GATES[name]


def make_gate(name: str, **params: float | None) -> Gate:
    """The registered gate ``name`` with ``params`` (``None`` or missing: the declared default)."""
    return _gate_class(name)(**params)


def check_gate(name: str, **params: float | None) -> dict[str, float]:
    """Validate a gate's name and parameters as `make_gate` does (a config checks its gate at construction;
    the trainer builds the one gate it uses). A gate declared by its ``params`` alone is not built; one whose
    class defines its own ``__init__`` (checks of its own) is built once here, so those checks run now too.
    Returns the parameter values, defaults filled in."""
    cls = _gate_class(name)
    values = cls.check_params(params)
    if "__init__" in vars(cls):
        cls(**params)
    return values


def describe_gates() -> str:
    """One line per registered gate with its parameters, defaults and ranges (for help texts)."""
    return "; ".join(
        f"{name}({', '.join(f'{k}={p.default:g} in {p.interval}' for k, p in cls.params.items())})"
        for name, cls in GATES.items()
    )


@register_gate("sigmoid")
class SigmoidGate(Gate):
    """g(r) = sigmoid(k (r - 1)), w(r) = k g (1 - g) r. The paper's default gate."""

    params = {"k": GateParam(5.0, "sharpness k of g(r) = sigmoid(k (r - 1)); paper: 5")}
    k: float

    def g(self, log_r: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.k * torch.expm1(log_r))

    def w(self, log_r: torch.Tensor) -> torch.Tensor:
        g = self.g(log_r)
        return self.k * g * (1.0 - g) * torch.exp(log_r)


@register_gate("clipped_linear")
class ClippedLinearGate(Gate):
    """g(r) = clip(r, 0, c), w(r) = r 1[r < c]: truncated importance sampling (Ablation A). With the
    paper's c = 2, g is capped at c, not bounded by 1."""

    params = {"c": GateParam(2.0, "cap c of g(r) = clip(r, 0, c); paper: 2")}
    c: float

    @property
    def is_acceptance_gate(self) -> bool:
        return self.c <= 1.0

    def g(self, log_r: torch.Tensor) -> torch.Tensor:
        return torch.exp(log_r.clamp(max=math.log(self.c)))  # r > 0, so clip(r, 0, c) = min(r, c)

    def w(self, log_r: torch.Tensor) -> torch.Tensor:
        return torch.exp(log_r) * (log_r < math.log(self.c))


@register_gate("temperature")
class TemperatureGate(Gate):
    """g(r) = r^b / (1 + r^b) = sigmoid(b log r), w(r) = b g (1 - g) in [0, b/4]."""

    params = {"temperature": GateParam(1.0, "exponent b of g(r) = r^b / (1 + r^b)")}
    temperature: float

    def g(self, log_r: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.temperature * log_r)

    def w(self, log_r: torch.Tensor) -> torch.Tensor:
        g = self.g(log_r)
        return self.temperature * g * (1.0 - g)


@register_gate("is")
class ImportanceSamplingGate(Gate):
    """g(r) = r, w(r) = r: plain importance sampling (TRPO's surrogate). A baseline, not a gate."""

    is_acceptance_gate = False

    def g(self, log_r: torch.Tensor) -> torch.Tensor:
        return torch.exp(log_r)

    def w(self, log_r: torch.Tensor) -> torch.Tensor:
        return torch.exp(log_r)


@register_gate("ppo_clip")
class PPOClipGate(Gate):
    """g(r) = clip(r, 1 - eps, 1 + eps), w(r) = r 1[1 - eps < r < 1 + eps]: PPO's gradient-level
    correspondence (paper Table 1; it ignores PPO's sign-dependent min). A baseline, not a gate."""

    params = {"eps": GateParam(0.2, "eps of g(r) = clip(r, 1 - eps, 1 + eps)", high=1.0)}
    is_acceptance_gate = False
    eps: float

    def g(self, log_r: torch.Tensor) -> torch.Tensor:
        return torch.exp(log_r.clamp(math.log1p(-self.eps), math.log1p(self.eps)))

    def w(self, log_r: torch.Tensor) -> torch.Tensor:
        inside = (log_r > math.log1p(-self.eps)) & (log_r < math.log1p(self.eps))
        return torch.exp(log_r) * inside
