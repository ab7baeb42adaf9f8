"""The RGPO policy loss (paper Eq. practical and Eq. rgpo_rlhf) and its diagnostics, torch only.

    L = -mean(g(r) A) + kl_coef * mean(r_old - 1 - log r_old) + ref_kl_coef * mean(KL_ref)

with r = r_old (``ratio_mode="old"``), r_ref (``"ref"``) or max(r_old, r_ref) (``"dual"``), and KL_ref
the k3 estimator that TRL's GRPOTrainer uses for its ``beta`` term. Inputs are per sample (MuJoCo:
``(N,)``) or per token with a mask (LLM: ``(B, T)``); means run over the valid elements.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .gates import Gate, clamp_log_ratio

RATIO_MODES = ("old", "ref", "dual")


def check_ratio_mode(ratio_mode: str) -> str:
    if ratio_mode not in RATIO_MODES:
        raise ValueError(f"ratio_mode must be one of {list(RATIO_MODES)}, got {ratio_mode!r}")
    return ratio_mode


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None) -> torch.Tensor:
    """Mean over ``dim`` (None: all elements) of the elements where ``mask`` is 1; 0 where none is."""
    if mask is None:
        return x.mean() if dim is None else x.mean(dim)
    x, mask = torch.broadcast_tensors(x, mask.to(x.dtype))
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp_min(1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1.0)


def masked_max(x: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None) -> torch.Tensor:
    """Max over ``dim`` (None: all elements) of the valid elements; -inf where none is."""
    if mask is not None:
        x, mask = torch.broadcast_tensors(x, mask)
        x = x.masked_fill(mask == 0, -torch.inf)
    return x.amax() if dim is None else x.amax(dim)


def kl_old_estimate(log_r: torch.Tensor) -> torch.Tensor:
    """KLhat_old per element (paper Eq. kl_estimator): r - 1 - log r >= 0, from a clamped log r."""
    return torch.expm1(log_r) - log_r  # expm1: no cancellation near r = 1


def kl_ref_estimate(log_r_ref: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || pi_ref) per element, 1/r_ref - 1 + log r_ref (TRL's GRPO ``beta`` term)."""
    return kl_old_estimate(-log_r_ref)


def ess_from_moments(mean_w: torch.Tensor, mean_w_sq: torch.Tensor) -> torch.Tensor:
    """Normalised ESS = (sum w)^2 / (N sum w^2) = mean(w)^2 / mean(w^2) (paper, Ablation D); 0 when every
    weight is 0. From the means, ESS over several batches or processes is exact."""
    return torch.nan_to_num(mean_w.square() / mean_w_sq, nan=0.0)


def effective_sample_size(
    weights: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None
) -> torch.Tensor:
    """ESS in [0, 1] of ``weights`` over ``dim`` (None: all elements), see `ess_from_moments`."""
    w = weights.detach().double()
    return ess_from_moments(masked_mean(w, mask, dim), masked_mean(w * w, mask, dim)).float()


class LogRatios(NamedTuple):
    old: torch.Tensor  # clamped log r_old per element, with gradient
    ref: torch.Tensor | None  # clamped log r_ref per element (None without ref_logps)
    gated: torch.Tensor  # log of the ratio the gate sees (one per sequence with a sequence_mask)
    ref_is_larger: torch.Tensor | None  # dual mode: 1 where the reference ratio is the larger one


def log_ratios(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None = None,
    ratio_mode: str = "old",
    sequence_mask: torch.Tensor | None = None,
) -> LogRatios:
    """Clamped log-ratios to pi_old and pi_ref, and the one the gate sees. ``old_logps=None`` means on-policy
    (log r_old = 0 with the gradient of log pi kept, as TRL does when a batch is not reused). With
    ``sequence_mask`` ``(B, T)`` the gate sees per-sequence ratios exp(masked mean_t log r_t), shape
    ``(B, 1)`` (GSPO's sequence-level importance sampling); the KL terms stay per element."""
    check_ratio_mode(ratio_mode)
    if ratio_mode != "old" and ref_logps is None:
        raise ValueError(f"ratio_mode={ratio_mode!r} needs ref_logps (the reference model's log-probs)")
    log_r_old = clamp_log_ratio(logps - (logps if old_logps is None else old_logps).detach())
    log_r_ref = None if ref_logps is None else clamp_log_ratio(logps - ref_logps.detach())
    gated_old, gated_ref = log_r_old, log_r_ref
    if sequence_mask is not None:
        gated_old = masked_mean(log_r_old, sequence_mask, dim=-1)[..., None]
        gated_ref = None if log_r_ref is None else masked_mean(log_r_ref, sequence_mask, dim=-1)[..., None]
    if ratio_mode == "old":
        return LogRatios(log_r_old, log_r_ref, gated_old, None)
    if ratio_mode == "ref":
        return LogRatios(log_r_old, log_r_ref, gated_ref, None)
    # max(r_old, r_ref): the gradient flows through the larger one; both share d log pi.
    return LogRatios(
        log_r_old, log_r_ref, torch.maximum(gated_old, gated_ref), (gated_ref > gated_old).detach()
    )


class RGPOTerms(NamedTuple):
    """The per-element pieces of the RGPO loss, for callers that weight or mask them separately (the trainer's
    GRPO options): loss = mean(policy + kl_coef * kl_old + ref_kl_coef * kl_ref)."""

    policy: torch.Tensor  # -g(r) A, the gated advantage term
    kl_old: torch.Tensor  # KLhat_old = r_old - 1 - log r_old
    kl_ref: torch.Tensor | None  # k3 KL to the reference
    log_ratios: LogRatios


def rgpo_terms(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    gate: Gate,
    *,
    ref_logps: torch.Tensor | None = None,
    ratio_mode: str = "old",
    sequence_mask: torch.Tensor | None = None,
) -> RGPOTerms:
    """The gated advantage term and the two KL terms per element (arguments as `rgpo_loss`)."""
    lr = log_ratios(logps, old_logps, ref_logps, ratio_mode, sequence_mask)
    kl_ref = None if lr.ref is None else kl_ref_estimate(lr.ref)
    return RGPOTerms(-gate.g(lr.gated) * advantages, kl_old_estimate(lr.old), kl_ref, lr)


def rgpo_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    gate: Gate,
    *,
    kl_coef: float | torch.Tensor = 0.0,
    ref_logps: torch.Tensor | None = None,
    ref_kl_coef: float = 0.0,
    ratio_mode: str = "old",
    mask: torch.Tensor | None = None,
    normalizer: float | torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    acceptance: torch.Tensor | None = None,
    diagnostics: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """RGPO loss (to minimise) and, with ``diagnostics``, `rgpo_diagnostics` of the same inputs (from the
    log-ratios the loss formed).

    Args:
        logps: log pi_theta of the taken actions/tokens, ``(N,)`` or ``(B, T)``, with grad.
        old_logps: log pi_old (the behaviour policy), same shape; ``None`` = on-policy.
        advantages: broadcastable to ``logps`` (``(B, 1)`` for a per-sequence advantage).
        gate: a `Gate` (`make_gate`).
        kl_coef: the KL-to-old coefficient (the paper's beta, adapted by a KL controller).
        ref_logps: log pi_ref, needed by ``ratio_mode`` ``ref``/``dual`` and ``ref_kl_coef``.
        ref_kl_coef: the fixed KL-to-reference coefficient (paper's beta_ref = 0.05; TRL's ``beta``).
        ratio_mode: ``old``, ``ref`` or ``dual`` (r = max(r_old, r_ref)).
        mask: 1 for valid elements (completion tokens), 0 for padding; broadcast against ``logps``.
        normalizer: divide the masked sum by this instead of the number of valid elements (e.g. the
            token count of the whole accumulated batch, which makes gradient accumulation exact).
        weights: per-element weights of the gated advantage term only, broadcast against ``logps``: the
            decoupled objective for stale samples gates on pi / pi_prox and weights by the truncated
            pi_prox / pi_behaviour (Hilton et al., 2021). ``None``: no weighting.
        acceptance: the learned acceptance classifier's alpha = sigmoid(f_phi(s, a)) in [0, 1] per element
            (`acceptance_bce` trains it), multiplying g(r) in the gated advantage term, detached: the policy
            gradient is the w(r)-weighted one scaled by alpha, and no gradient reaches the classifier.
            ``None``: no classifier (the loss as without the argument).
        diagnostics: False returns an empty dict; callers that reduce them in bulk use `rgpo_diagnostics`.
    """
    if ref_kl_coef and ref_logps is None:
        raise ValueError("ref_kl_coef > 0 needs ref_logps (the reference model's log-probs)")
    terms = rgpo_terms(logps, old_logps, advantages, gate, ref_logps=ref_logps, ratio_mode=ratio_mode)
    policy = terms.policy if weights is None else weights.detach() * terms.policy
    if acceptance is not None:
        policy = acceptance.detach() * policy
    per_element = policy + kl_coef * terms.kl_old
    if ref_kl_coef:
        per_element = per_element + ref_kl_coef * terms.kl_ref
    if normalizer is None:
        loss = masked_mean(per_element, mask)
    else:
        loss = (per_element if mask is None else per_element * mask).sum() / normalizer
    if not diagnostics:
        return loss, {}
    return loss, log_ratio_diagnostics(terms.log_ratios, gate, mask=mask)


@torch.no_grad()
def per_element_diagnostics(lr: LogRatios, gate: Gate) -> dict[str, torch.Tensor]:
    """The per-element quantities whose means and maxima are the RGPO diagnostics, from log-ratios already
    formed (the loss's own `RGPOTerms.log_ratios`, so the loss and its diagnostics share one computation).

    Keys (detached, in the log-ratios' dtype): ``gate`` g(r), ``weight`` w = g'(r) r, ``weight_sq`` w^2,
    ``rejected`` (1 where g < 0.1), ``kl_old`` (r_old - 1 - log r_old), ``ratio_old``; with a reference
    ``kl_ref`` (k3) and ``ratio_ref``; in dual mode ``ref_ratio_larger`` and ``rejected_old`` (1 where the
    gate on r_old alone is below 0.1: which of the dual gate's rejections the ratio to pi_old would make).
    ``gate``, ``weight``, ``weight_sq``, ``rejected`` and ``ref_ratio_larger`` have the shape of ``lr.gated``
    (one per sequence with a sequence-level ratio, broadcast against the token mask by the reductions), the
    others that of ``lr.old``.
    """
    g, w = gate.g(lr.gated), gate.w(lr.gated)
    out = {
        "gate": g,
        "weight": w,
        "weight_sq": w * w,
        "rejected": (g < 0.1).to(g.dtype),
        "kl_old": kl_old_estimate(lr.old),
        "ratio_old": torch.exp(lr.old),
    }
    if lr.ref is not None:
        out["kl_ref"] = kl_ref_estimate(lr.ref)
        out["ratio_ref"] = torch.exp(lr.ref)
    if lr.ref_is_larger is not None:
        out["ref_ratio_larger"] = lr.ref_is_larger.to(g.dtype)
        out["rejected_old"] = (gate.g(lr.old) < 0.1).to(g.dtype)
    return out


@torch.no_grad()
def log_ratio_diagnostics(
    lr: LogRatios, gate: Gate, *, mask: torch.Tensor | None = None, dim: int | None = None
) -> dict[str, torch.Tensor]:
    """`rgpo_diagnostics` from log-ratios already formed (`log_ratios`, or `RGPOTerms.log_ratios` of the
    loss): the means of `per_element_diagnostics` over the valid elements (or over ``dim``), the maxima of
    the ratios, and the ESS from the means of w and w^2. Keys as `rgpo_diagnostics`."""
    e = per_element_diagnostics(lr, gate)
    out = {
        "gate_mean": masked_mean(e["gate"], mask, dim),
        "weight_mean": masked_mean(e["weight"], mask, dim),
        "weight_sq_mean": masked_mean(e["weight_sq"], mask, dim),
        "kl_old": masked_mean(e["kl_old"], mask, dim),
        "rejected_frac": masked_mean(e["rejected"], mask, dim),
        "ratio_old_mean": masked_mean(e["ratio_old"], mask, dim),
        "ratio_old_max": masked_max(e["ratio_old"], mask, dim),
    }
    out["ess"] = ess_from_moments(out["weight_mean"], out["weight_sq_mean"])
    if "kl_ref" in e:
        out["kl_ref"] = masked_mean(e["kl_ref"], mask, dim)
        out["ratio_ref_mean"] = masked_mean(e["ratio_ref"], mask, dim)
        out["ratio_ref_max"] = masked_max(e["ratio_ref"], mask, dim)
    if "ref_ratio_larger" in e:
        out["ref_ratio_larger_frac"] = masked_mean(e["ref_ratio_larger"], mask, dim)
        out["rejected_frac_old"] = masked_mean(e["rejected_old"], mask, dim)
    return out


@torch.no_grad()
def rgpo_diagnostics(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    gate: Gate,
    *,
    ref_logps: torch.Tensor | None = None,
    ratio_mode: str = "old",
    mask: torch.Tensor | None = None,
    dim: int | None = None,
    sequence_mask: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Diagnostics of the RGPO loss, reduced over all valid elements or over ``dim`` only: the log-ratios
    formed from the log-probs as the loss forms them, then `log_ratio_diagnostics` (callers that already hold
    the loss's `RGPOTerms` pass its ``log_ratios`` there instead of forming them twice).

    With log-probs of one epoch stacked as ``(mini-batches, samples)`` and ``dim=-1``, every value has one
    entry per mini-batch, equal to what `rgpo_loss` returns for it, so a script can reduce once per epoch.

    Keys (detached tensors on the inputs' device): ``gate_mean``, ``weight_mean`` (w = g'(r) r),
    ``weight_sq_mean``, ``ess``, ``kl_old``, ``rejected_frac`` (g < 0.1), ``ratio_old_mean``,
    ``ratio_old_max``; with ``ref_logps`` also ``kl_ref``, ``ratio_ref_mean``, ``ratio_ref_max``, and in
    dual mode ``ref_ratio_larger_frac``. Maxima over nothing are -inf, ESS of nothing 0.
    """
    lr = log_ratios(logps.detach(), old_logps, ref_logps, ratio_mode, sequence_mask)
    return log_ratio_diagnostics(lr, gate, mask=mask, dim=dim)
