"""Off-policy corrections for samples whose log-probs come from another policy (a vLLM-like sampler, an int8
or bf16 rollout engine, top-p sampling, stale weights): the per-token losses the field uses, in one registry.

With r = pi / mu (mu: the sampler's reported log-probs), A the advantage and sg the stop-gradient, each
correction's per-token loss has the gradient -weight(r) * A * grad log pi; what tells them apart is the
weight each puts on a token as a function of r:

- ``ignore``: weight 1 (the trainer's own log-probs taken as the behaviour: no correction);
- ``ppo_clip``: PPO's clip against the sampler, weight r where the unclipped side is the minimum, else 0
  (TRL's AsyncGRPOTrainer; eps 0.2 both sides, its default);
- ``tis``: truncated importance sampling, weight min(r, C), C = 2 (Yao et al., 2025, "Your efficient RL
  framework secretly brings you off-policy RL training"; CISPO has the same form with its own cap);
- ``icepop``: masked importance sampling, weight r inside [0.5, 5], 0 outside (IcePop, Ling team 2025);
- ``seq_mask``: TRL's synchronous default (``vllm_importance_sampling_mode="sequence_mask"``, cap 3): one
  weight per sequence, exp(sum_t log r_t), set to 0 above the cap;
- ``rgpo``: the acceptance gate -g(r) A plus beta (r - 1 - log r) (the paper), weight g'(r) r; its gate,
  ratio mode and KL controller are the trainer's RGPO settings.

With one optimizer step per sample (TRL's async trainer) the proximal policy of decoupled PPO is the current
one, so decoupled PPO reduces to plain importance weighting by r (uncapped, or with tokens masked above a cap
as AReaL does), not to ``tis`` with C = 1, which truncates every weight above 1; it is not an entry here. At
r = 1 every weight is 1 except RGPO's, g'(1) (k / 4 for the sigmoid gate): plain policy gradient up to a
constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import torch

from .gates import Gate, clamp_log_ratio
from .objective import rgpo_terms
from .registry import registrar


class CorrectionTerms(NamedTuple):
    loss: torch.Tensor  # per-token loss, with grad through log pi
    weight: torch.Tensor  # per-token gradient weight (detached): d loss / d log pi = -weight * A
    log_ratio: torch.Tensor  # clamped log r = log pi - log mu (detached)


class Correction:
    """A per-token off-policy loss. ``PARAMS``: name -> (default, low, high, why), checked at construction.
    ``terms(logps, sampler_logps, advantages, segment_ids=..., **rgpo)`` returns `CorrectionTerms` with the
    shape of ``logps``; ``segment_ids`` (one id per token, the sample it belongs to) is needed by
    sequence-level corrections only."""

    name: ClassVar[str] = ""
    PARAMS: ClassVar[dict[str, tuple[float, float, float, str]]] = {}
    uses_rgpo_settings: ClassVar[bool] = False  # reads the gate, the ratio mode and the KL controller

    def __init__(self, **params: float):
        unknown = sorted(set(params) - set(self.PARAMS))
        if unknown:
            allowed = ", ".join(self.PARAMS) or "none"
            raise ValueError(
                f"off_policy_correction {self.name!r}: unknown parameter(s) {unknown}; it takes {allowed}"
            )
        self.params: dict[str, float] = {}
        for key, (default, low, high, why) in self.PARAMS.items():
            value = params.get(key, default)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
                raise ValueError(
                    f"off_policy_correction {self.name!r}: {key} must be a number in [{low}, {high}] "
                    f"({why}), got {value!r}"
                )
            self.params[key] = float(value)

    def weight(self, log_r: torch.Tensor, advantages: torch.Tensor, segment_ids: torch.Tensor | None):
        raise NotImplementedError

    def terms(
        self,
        logps: torch.Tensor,
        sampler_logps: torch.Tensor,
        advantages: torch.Tensor,
        *,
        segment_ids: torch.Tensor | None = None,
        **_: Any,
    ) -> CorrectionTerms:
        """-sg(weight) * A * log pi per token: the gradient of a weighted policy gradient."""
        log_r = clamp_log_ratio(logps.detach() - sampler_logps.detach())
        weight = self.weight(log_r, advantages, segment_ids).detach()
        return CorrectionTerms(-weight * advantages * logps, weight, log_r)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v:g}' for k, v in self.params.items())})"


CORRECTIONS: dict[str, type[Correction]] = {}
register_correction: Callable[[str], Callable[[type], type]] = registrar(
    CORRECTIONS, Correction, "correction"
)


def make_correction(name: str, **params: float) -> Correction:
    """The registered correction ``name`` with its parameters (missing ones take their published default)."""
    if name not in CORRECTIONS:
        raise ValueError(f"off_policy_correction must be one of {sorted(CORRECTIONS)}, got {name!r}")
    return CORRECTIONS[name](**params)


def describe_corrections() -> str:
    return "; ".join(
        f"{n} ({', '.join(f'{k}={v[0]:g}' for k, v in c.PARAMS.items()) or 'no parameters'})"
        for n, c in CORRECTIONS.items()
    )


@register_correction("ignore")
class Ignore(Correction):
    """No correction: the sampler's tokens trained as if the trainer had sampled them, -r_self A with
    r_self = pi / sg(pi) (value 1, gradient A grad log pi)."""

    def weight(self, log_r, advantages, segment_ids):
        return torch.ones_like(log_r)

    def terms(self, logps, sampler_logps, advantages, *, segment_ids=None, **_):
        log_r = clamp_log_ratio(logps.detach() - sampler_logps.detach())
        r_self = torch.exp(logps - logps.detach())
        return CorrectionTerms(-r_self * advantages, torch.ones_like(log_r), log_r)


@register_correction("ppo_clip")
class PPOClip(Correction):
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = pi / mu (TRL's AsyncGRPOTrainer)."""

    PARAMS = {
        "eps_low": (0.2, 0.0, 1.0, "TRL AsyncGRPOConfig.epsilon"),
        "eps_high": (0.2, 0.0, 10.0, "TRL AsyncGRPOConfig.epsilon_high, default = epsilon"),
    }

    def weight(self, log_r, advantages, segment_ids):
        r = torch.exp(log_r)
        clipped = r.clamp(1 - self.params["eps_low"], 1 + self.params["eps_high"])
        # the minimum takes the unclipped term (gradient r A grad log pi) unless the clipped one is smaller
        return torch.where(r * advantages <= clipped * advantages, r, torch.zeros_like(r))

    def terms(self, logps, sampler_logps, advantages, *, segment_ids=None, **_):
        log_r_grad = clamp_log_ratio(logps - sampler_logps.detach())
        r = torch.exp(log_r_grad)
        clipped = r.clamp(1 - self.params["eps_low"], 1 + self.params["eps_high"])
        loss = -torch.minimum(r * advantages, clipped * advantages)
        log_r = log_r_grad.detach()
        return CorrectionTerms(loss, self.weight(log_r, advantages, segment_ids), log_r)


@register_correction("tis")
class TruncatedIS(Correction):
    """-sg(min(r, C)) A log pi (Yao et al., 2025; CISPO's form)."""

    PARAMS = {"cap": (2.0, 1.0, 1e6, "the truncation C; Yao et al. and verl's rollout_is_threshold use 2")}

    def weight(self, log_r, advantages, segment_ids):
        return torch.exp(log_r).clamp(max=self.params["cap"])


@register_correction("icepop")
class IcePop(Correction):
    """-sg(r 1[low <= r <= high]) A log pi: tokens whose ratio leaves [low, high] get no gradient (IcePop's
    masked importance sampling, [0.5, 5])."""

    PARAMS = {
        "low": (0.5, 0.0, 1.0, "IcePop's alpha"),
        "high": (5.0, 1.0, 1e6, "IcePop's beta"),
    }

    def weight(self, log_r, advantages, segment_ids):
        r = torch.exp(log_r)
        inside = (r >= self.params["low"]) & (r <= self.params["high"])
        return torch.where(inside, r, torch.zeros_like(r))


@register_correction("seq_mask")
class SequenceMask(Correction):
    """TRL's ``sequence_mask``: per sequence s = exp(sum_t log r_t), every token of the sequence weighted by
    s, sequences with s above the cap (3, TRL's vllm_importance_sampling_clip_max) weighted 0."""

    PARAMS = {"cap": (3.0, 1.0, 1e6, "TRL GRPOConfig.vllm_importance_sampling_clip_max")}

    def weight(self, log_r, advantages, segment_ids):
        if segment_ids is None:
            raise ValueError("off_policy_correction 'seq_mask' needs each token's sequence (segment_ids)")
        ids, inverse = torch.unique(segment_ids, return_inverse=True)
        per_seq = torch.zeros(len(ids), dtype=torch.float64, device=log_r.device)
        per_seq.index_add_(0, inverse, log_r.double())
        s = torch.exp(per_seq)  # inf above ~709: masked like any ratio above the cap
        s = torch.where(s > self.params["cap"], torch.zeros_like(s), s)
        return s[inverse].to(log_r.dtype)

    def terms(self, logps, sampler_logps, advantages, *, segment_ids=None, **_):
        # TRL multiplies GRPO's per-token loss (-r_self A with r_self = pi / sg(pi) on a batch used once) by s
        log_r = clamp_log_ratio(logps.detach() - sampler_logps.detach())
        weight = self.weight(log_r, advantages, segment_ids)
        return CorrectionTerms(-weight * torch.exp(logps - logps.detach()) * advantages, weight, log_r)


@register_correction("rgpo")
class RGPO(Correction):
    """-g(r) A + kl_coef (r - 1 - log r) (+ ref_kl_coef KL_ref), r = pi / mu or the dual ratio: `rgpo_terms`
    with the trainer's gate, ratio mode, reference log-probs and controller's coefficient."""

    uses_rgpo_settings = True

    def terms(
        self,
        logps,
        sampler_logps,
        advantages,
        *,
        segment_ids=None,
        gate: Gate | None = None,
        kl_coef: float = 0.0,
        ref_logps: torch.Tensor | None = None,
        ratio_mode: str = "old",
        ref_kl_coef: float = 0.0,
        **_,
    ):
        if gate is None:
            raise ValueError("off_policy_correction 'rgpo' needs the gate")
        t = rgpo_terms(logps, sampler_logps, advantages, gate, ref_logps=ref_logps, ratio_mode=ratio_mode)
        loss = t.policy + kl_coef * t.kl_old
        if ref_kl_coef:
            loss = loss + ref_kl_coef * t.kl_ref
        return CorrectionTerms(loss, gate.w(t.log_ratios.gated).detach(), t.log_ratios.old.detach())
