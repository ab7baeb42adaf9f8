"""The paper's optional learned acceptance classifier (Sec. 4.6, "RLHF extension and dual gate": "Optionally,
one can train a separate acceptance classifier"), torch only.

alpha_phi(s, a) = sigmoid(f_phi(s, a)) is trained by the paper's binary cross-entropy on the sign of the
advantage, max_phi E[log alpha 1(A > 0) + log(1 - alpha) 1(A < 0)] (`acceptance_bce` is its negative). In the
policy loss alpha multiplies g(r) and is detached (`rgpo_loss(..., acceptance=alpha)`), so phi learns from its
BCE alone; docs/design.md ("The learned acceptance classifier") says why.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .objective import masked_mean

#: g(r) below this counts as a rejection, as in the RGPO diagnostics' ``rejected_frac``.
GATE_REJECT_BELOW = 0.1


def acceptance_bce(
    logits: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The classifier's loss, to minimise: -mean(1(A > 0) log alpha + 1(A < 0) log(1 - alpha)), alpha =
    sigmoid(logits). A sample with A = 0 adds 0 and counts in the mean (the paper's expectation over all
    samples). From log-sigmoids, so finite for every finite logit; the advantages are targets (no gradient).

    Args:
        logits: f_phi(s, a) per sample (or token), with gradient.
        advantages: the advantages the policy loss uses, broadcastable to ``logits``; only their sign is read.
        mask: 1 for valid elements, 0 for padding; the mean runs over the valid ones.
    """
    a = advantages.detach()
    positive, negative = (a > 0).to(logits.dtype), (a < 0).to(logits.dtype)
    per_element = -(positive * F.logsigmoid(logits) + negative * F.logsigmoid(-logits))
    return masked_mean(per_element, mask)


@torch.no_grad()
def acceptance_diagnostics(
    logits: torch.Tensor,
    advantages: torch.Tensor,
    gate_values: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """What the classifier decides, against the sign of A and against the gate. It accepts where alpha > 1/2
    (logit > 0); the gate accepts where g(r) >= `GATE_REJECT_BELOW`.

    Keys (detached): ``accuracy``, the share of the samples with A != 0 whose sign the decision matches (NaN
    when every A is 0); ``alpha_mean``, the mean of alpha; ``agreement_with_gate``, the share of samples on
    which the classifier and the gate take the same decision. Means over the valid elements of ``mask``.
    """
    logits, advantages, gate_values = torch.broadcast_tensors(logits, advantages, gate_values)
    accept = logits > 0
    valid = (
        torch.ones_like(logits) if mask is None else torch.broadcast_to(mask, logits.shape).to(logits.dtype)
    )
    signed = valid * (advantages != 0).to(logits.dtype)
    correct = (accept == (advantages > 0)).to(logits.dtype)
    agree = (accept == (gate_values >= GATE_REJECT_BELOW)).to(logits.dtype)
    return {
        "accuracy": (correct * signed).sum() / signed.sum(),
        "alpha_mean": masked_mean(torch.sigmoid(logits), mask),
        "agreement_with_gate": masked_mean(agree, mask),
    }
