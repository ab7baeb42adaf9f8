"""The RGPO policy loss (paper Eq. practical and Eq. rgpo_rlhf), torch only.

    L = -mean(g(r) * A) + beta * KLhat_old + beta_ref * KL_ref

with r = r_old (``ratio_mode="old"``), r_ref (``"ref"``) or max(r_old, r_ref) (``"dual"``),
KLhat_old = mean(r_old - 1 - log r_old) (Eq. kl_estimator) and KL_ref the k3 estimator
exp(logp_ref - logp) - (logp_ref - logp) - 1 that TRL's GRPOTrainer uses for its ``beta`` term.

Inputs are per-sample (MuJoCo: shape ``(N,)``) or per-token with a mask (LLM: ``(B, T)``).
Means are taken over valid elements; pass ``normalizer`` to divide sums by a different count
(e.g. the number of tokens in the whole accumulated batch, so that gradient accumulation is
exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .gates import Gate, clamp_log_ratio, clamped_log_ratio

RATIO_MODES = ("old", "ref", "dual")


def check_ratio_mode(ratio_mode: str) -> str:
    if ratio_mode not in RATIO_MODES:
        raise ValueError(f"ratio_mode must be one of {list(RATIO_MODES)}, got {ratio_mode!r}")
    return ratio_mode


def kl_old_estimate(log_ratio_old: torch.Tensor) -> torch.Tensor:
    """Per-element r - 1 - log r (>= 0), from log r; the paper's KLhat before averaging."""
    log_ratio_old = clamp_log_ratio(log_ratio_old)
    return torch.expm1(log_ratio_old) - log_ratio_old


def kl_ref_estimate(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-element k3 estimator of KL(pi || pi_ref), identical to TRL's GRPO ``beta`` term."""
    delta = clamp_log_ratio(ref_logps - logps)
    return torch.expm1(delta) - delta


def effective_sample_size(
    weights: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None
) -> torch.Tensor:
    """Normalised ESS = (sum w)^2 / (N sum w^2) in [0, 1] (paper, Ablation D).

    Reduces over all elements, or over ``dim`` only (e.g. one ESS per mini-batch row). Returns 0
    where all weights are zero (no sample contributes).
    """
    w = weights.detach().double()
    if mask is not None:
        w, m = torch.broadcast_tensors(w, mask.to(w.dtype))
        w = w * m
        n = m.sum() if dim is None else m.sum(dim)
    else:
        n = torch.tensor(float(w.numel() if dim is None else w.shape[dim]), dtype=w.dtype, device=w.device)
    s1 = w.sum() if dim is None else w.sum(dim)
    s2 = (w * w).sum() if dim is None else (w * w).sum(dim)
    return torch.where(s2 > 0, s1 * s1 / (n * s2).clamp_min(1e-300), torch.zeros_like(s1)).float()


@dataclass
class RGPOTerms:
    """Per-element pieces of the RGPO loss, before reduction (all the shape of ``logps``).

    ``weight``, ``ratio_old`` and ``ratio_ref`` feed only the diagnostics; they are ``None`` when
    `rgpo_terms` is called with ``with_weights=False``."""

    gate: torch.Tensor  # g(r), differentiable
    kl_old: torch.Tensor  # r_old - 1 - log r_old, differentiable
    kl_ref: torch.Tensor | None  # k3 KL to reference, differentiable (None without ref_logps)
    log_ratio_old: torch.Tensor  # detached
    log_ratio_ref: torch.Tensor | None  # detached
    log_ratio: torch.Tensor  # the gated log-ratio (after the ratio mode), detached
    weight: torch.Tensor | None = None  # w(r) = g'(r) r, detached
    ratio_old: torch.Tensor | None = None  # r_old (clamped), detached
    ratio_ref: torch.Tensor | None = None  # r_ref (clamped), detached


def rgpo_terms(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    gate: Gate,
    *,
    ref_logps: torch.Tensor | None = None,
    ratio_mode: str = "old",
    with_weights: bool = True,
) -> RGPOTerms:
    """Compute the per-element gate and KL terms (and, with ``with_weights``, the detached weight
    and ratios the diagnostics need). ``old_logps=None`` means on-policy (r_old == 1 with the
    gradient of log pi kept, as TRL does when it does not reuse a batch).

    Written for few tensor operations: the loss runs once per mini-batch in the MuJoCo scripts,
    where tensors are small and the cost is the number of ops, not their size."""
    check_ratio_mode(ratio_mode)
    if old_logps is None:
        old_logps = logps.detach()
    if ratio_mode in ("ref", "dual") and ref_logps is None:
        raise ValueError(f"ratio_mode={ratio_mode!r} needs ref_logps (the reference model's log-probs)")
    log_ratio_old = clamped_log_ratio(logps, old_logps)
    expm1_old = torch.expm1(log_ratio_old)  # r - 1: the gates and the KL need no separate r
    kl_old = expm1_old - log_ratio_old  # r - 1 - log r without cancellation near r = 1
    log_ratio_ref = expm1_ref = kl_ref = None
    if ref_logps is not None:
        log_ratio_ref = clamped_log_ratio(logps, ref_logps)
        kl_ref = kl_ref_estimate(logps, ref_logps)
    if ratio_mode == "old":
        log_ratio, expm1 = log_ratio_old, expm1_old
    elif ratio_mode == "ref":
        log_ratio = log_ratio_ref
        expm1 = expm1_ref = torch.expm1(log_ratio_ref)
    else:
        # max(r_old, r_ref) = exp(max(log r_old, log r_ref)); the gradient flows through the
        # larger one, and both share d log pi, so the gradient is w(max r) grad log pi.
        log_ratio = torch.maximum(log_ratio_old, log_ratio_ref)
        expm1 = torch.expm1(log_ratio)
    weight = ratio_old = ratio_ref = None
    if with_weights:
        g, weight = gate.value_and_weight(log_ratio, expm1)
        ratio_old = expm1_old.detach() + 1.0
        if log_ratio_ref is not None:
            ratio_ref = expm1_ref.detach() + 1.0 if expm1_ref is not None else torch.exp(log_ratio_ref.detach())
    else:
        g = gate.value(log_ratio, expm1)
    return RGPOTerms(
        gate=g,
        kl_old=kl_old,
        kl_ref=kl_ref,
        log_ratio_old=log_ratio_old.detach(),
        log_ratio_ref=None if log_ratio_ref is None else log_ratio_ref.detach(),
        log_ratio=log_ratio.detach(),
        weight=weight,
        ratio_old=ratio_old,
        ratio_ref=ratio_ref,
    )


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
    diagnostics: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """RGPO loss (to minimise) and diagnostics.

    Args:
        logps: log pi_theta of the taken actions/tokens, ``(N,)`` or ``(B, T)``, with grad.
        old_logps: log pi_old (the behaviour policy), same shape, no grad; ``None`` = on-policy.
        advantages: broadcastable to ``logps`` (``(B, 1)`` for a per-sequence advantage).
        gate: a `Gate` from `make_gate`.
        kl_coef: beta, the (adaptive) KL-to-old coefficient.
        ref_logps: log pi_ref, needed for ``ratio_mode`` ``ref``/``dual`` and ``ref_kl_coef``.
        ref_kl_coef: beta_ref, the fixed KL-to-reference coefficient (paper: 0.05).
        ratio_mode: ``old``, ``ref`` or ``dual`` (r = max(r_old, r_ref)).
        mask: 1 for valid elements (completion tokens), 0 for padding; broadcast against ``logps``.
        normalizer: divide masked sums by this instead of the number of valid elements.
        diagnostics: ``False`` skips them (the dict is empty): for callers that reduce them later
            and in bulk with `rgpo_diagnostics`, e.g. once per epoch over all mini-batches.

    Returns:
        ``(loss, diagnostics)``; see `rgpo_diagnostics` for the keys.
    """
    if ref_kl_coef and ref_logps is None:
        raise ValueError("ref_kl_coef > 0 needs ref_logps (the reference model's log-probs)")
    terms = None
    if diagnostics or ref_logps is not None or ratio_mode != "old":
        terms = rgpo_terms(
            logps, old_logps, gate, ref_logps=ref_logps, ratio_mode=ratio_mode, with_weights=diagnostics
        )
        gate_value, kl_old = terms.gate, terms.kl_old
    else:
        # The MuJoCo scripts' per-mini-batch path: rgpo_terms' math for ratio_mode "old" without
        # building the terms object (on 64-sample tensors Python overhead is a visible share of a step).
        log_ratio = clamped_log_ratio(logps, logps.detach() if old_logps is None else old_logps)
        expm1 = torch.expm1(log_ratio)
        gate_value, kl_old = gate.value(log_ratio, expm1), expm1 - log_ratio
    if mask is not None:
        mask = mask.to(logps.dtype)

    per_element = torch.addcmul(kl_coef * kl_old, gate_value, advantages, value=-1.0)
    if ref_kl_coef:
        per_element = per_element + ref_kl_coef * terms.kl_ref
    if mask is None:
        loss = per_element.mean() if normalizer is None else per_element.sum() / normalizer
    else:
        loss = (per_element * mask).sum() / (mask.sum().clamp_min(1.0) if normalizer is None else normalizer)
    return loss, (_reduce_diagnostics(terms, ratio_mode, mask, None) if diagnostics else {})


def rgpo_diagnostics(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    gate: Gate,
    *,
    ref_logps: torch.Tensor | None = None,
    ratio_mode: str = "old",
    mask: torch.Tensor | None = None,
    dim: int | None = None,
) -> dict[str, torch.Tensor]:
    """The diagnostics of `rgpo_loss` for the same inputs, reduced over all elements or over ``dim``.

    With ``dim``, e.g. log-probs of one epoch stacked as ``(mini-batches, samples)`` and ``dim=-1``,
    every value has one entry per mini-batch, equal to what `rgpo_loss` returned for it: a script
    can keep ``logps.detach()`` per step and reduce once per epoch instead of ~15 small ops per step.

    Keys (detached tensors): ``gate_mean``, ``weight_mean``, ``weight_sq_mean`` (mean of w^2:
    ESS = weight_mean^2 / weight_sq_mean, so ESS over several batches or processes follows from the
    means), ``ess``, ``kl_old``, ``rejected_frac`` (g < 0.1), ``ratio_old_mean``, ``ratio_old_max``
    and, with ``ref_logps``, ``kl_ref``, ``ratio_ref_mean``, ``ratio_ref_max``; in dual mode
    ``ref_ratio_larger_frac``. Means are over valid (mask) elements; maxima of nothing are -inf.
    """
    with torch.no_grad():
        terms = rgpo_terms(logps.detach(), old_logps, gate, ref_logps=ref_logps, ratio_mode=ratio_mode)
        return _reduce_diagnostics(terms, ratio_mode, None if mask is None else mask.to(logps.dtype), dim)


def _reduce_diagnostics(
    terms: RGPOTerms, ratio_mode: str, mask: torch.Tensor | None, dim: int | None
) -> dict[str, torch.Tensor]:
    """All diagnostics in one stacked reduction over ``dim`` (None: every element), kept on the
    device (no host sync per micro-batch). Inputs are detached: no graph, no no_grad block."""
    g, w = terms.gate.detach(), terms.weight
    means = {
        "gate_mean": g,
        "weight_mean": w,
        "weight_sq_mean": w * w,
        "kl_old": terms.kl_old.detach(),
        "rejected_frac": (g < 0.1).to(g.dtype),
        "ratio_old_mean": terms.ratio_old,
    }
    maxima = {"ratio_old_max": terms.ratio_old}
    if terms.kl_ref is not None:
        means.update(kl_ref=terms.kl_ref.detach(), ratio_ref_mean=terms.ratio_ref)
        maxima["ratio_ref_max"] = terms.ratio_ref
        if ratio_mode == "dual":
            means["ref_ratio_larger_frac"] = (terms.log_ratio_ref > terms.log_ratio_old).to(g.dtype)
    columns = [*means.values(), *maxima.values()]
    if mask is not None:
        *columns, mask = torch.broadcast_tensors(*columns, mask)
    # (columns, rows, reduced elements): one row for dim=None, one per remaining index otherwise
    stacked = torch.stack(columns)
    if dim is None:
        out_shape, stacked = (), stacked.reshape(len(columns), 1, -1)
    else:
        stacked = stacked.movedim(dim + 1 if dim >= 0 else dim, -1)
        out_shape = stacked.shape[1:-1]
        stacked = stacked.reshape(len(columns), -1, stacked.shape[-1])
        if mask is not None:
            mask = mask.movedim(dim, -1)
    k = len(means)
    if mask is None:
        mean_values = stacked[:k].mean(-1)
        top = stacked[k:].amax(-1)
    else:
        mask = mask.reshape(1, *stacked.shape[1:])
        mean_values = (stacked[:k] * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
        top = torch.where(mask.bool(), stacked[k:], -torch.inf).amax(-1)
    # ESS = mean(w)^2 / mean(w^2); 0/0 (every weight zero, or nothing valid) -> 0
    ess = torch.nan_to_num(mean_values[1:2].square() / mean_values[2:3], nan=0.0)
    values = torch.cat([mean_values, top, ess]).reshape(-1, *out_shape).unbind()
    return dict(zip([*means, *maxima, "ess"], values, strict=True))
