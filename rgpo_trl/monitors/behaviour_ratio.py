"""`BehaviourRatioMonitor`: the importance ratio to the behaviour policy, logged the same way for every
GRPO-family method.

When a generation batch serves several optimizer steps (``steps_per_generation`` > 1 or ``num_iterations``
> 1), step s of a batch trains on completions sampled by the policy of s - 1 updates ago, so the ratio
r_b = pi_theta / pi_behaviour leaves 1. TRL logs only its own loss's clip fractions and RGPO its gate's
statistics, so neither tells how stale the samples were; this mixin does, for any `GRPOTrainer` subclass,
from the log-probabilities the loss itself computes (the first `_get_per_token_logps_and_entropies` call of
each `_compute_loss`): nothing is recomputed and the loss is untouched. Per loss call, token-weighted over
the completion tokens of all processes:

- ``behaviour/ratio_mean``, ``behaviour/ratio_max`` (the largest r_b of the call, over processes);
- ``behaviour/beyond_1.2``, ``behaviour/beyond_2``: the share of tokens with max(r_b, 1 / r_b) above 1.2 / 2
  (the MuJoCo scripts' definition, so both domains read alike);
- ``behaviour/kl_old``: KLhat(pi_behaviour || pi_theta) = mean(r_b - 1 - log r_b), RGPO's k3 estimator.

Without ``old_per_token_logps`` in the batch (one step per generation batch: TRL skips them because the
behaviour policy is the current one) r_b = 1 exactly. pi_behaviour is ``old_per_token_logps``, the policy that
generated as the trainer scores it; with vLLM the sampler's own log-probs differ from it by the inference
mismatch, which TRL corrects separately and which is not staleness. The tokens are the loss's (the completion
mask, times the tool mask where there is one). Each loss call appends once and TRL's logging averages a
step's calls, so with gradient accumulation ``ratio_max`` is the mean of the micro-batches' maxima and the
others unweighted means over them (the staleness study runs one micro-batch per step).
"""

from __future__ import annotations

from typing import Any

import torch

from ..core import clamp_log_ratio, kl_old_estimate

BEYOND = (1.2, 2.0)


class BehaviourRatioMonitor:
    """Mixin for a `GRPOTrainer` subclass (put it first in the bases): logs the ``behaviour/*`` metrics."""

    _capturing: bool = False
    _captured_logps: torch.Tensor | None = None

    def _compute_loss(self, model, inputs):
        self._capturing, self._captured_logps = True, None
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._capturing = False
        if self._captured_logps is not None:
            self._log_behaviour_ratio(self._captured_logps, inputs)
            self._captured_logps = None
        return loss

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._capturing and self._captured_logps is None:
            self._captured_logps = out[0].detach()
        return out

    @torch.no_grad()
    def _log_behaviour_ratio(self, logps: torch.Tensor, inputs: dict[str, Any]) -> None:
        mode = "train" if self.model.training else "eval"
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:  # the tokens the loss trains on, as GRPOTrainer's _compute_loss
            mask = mask * inputs["tool_mask"]
        stats = behaviour_ratio_sums(logps, inputs.get("old_per_token_logps"), mask)
        sums = self.accelerator.reduce(stats["sums"], reduction="sum")
        ratio_max = self.accelerator.gather(stats["max"].reshape(1)).max()
        tokens = sums[-1].clamp(min=1.0)
        metrics = self._metrics[mode]
        metrics["behaviour/ratio_mean"].append((sums[0] / tokens).item())
        for i, x in enumerate(BEYOND, start=1):
            metrics[f"behaviour/beyond_{x:g}"].append((sums[i] / tokens).item())
        metrics["behaviour/kl_old"].append((sums[len(BEYOND) + 1] / tokens).item())
        metrics["behaviour/ratio_max"].append(ratio_max.item())


def behaviour_ratio_sums(
    logps: torch.Tensor, behaviour_logps: torch.Tensor | None, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Masked sums of r_b, of the indicators max(r_b, 1 / r_b) > x for x in `BEYOND`, of the k3 KLhat_old,
    and the token count (``sums``, in that order, float64 so the cross-process sum is exact), and the largest
    r_b over the mask (``max``); r_b = 1 where ``behaviour_logps`` is None."""
    log_ratio = (
        torch.zeros_like(logps) if behaviour_logps is None else clamp_log_ratio(logps - behaviour_logps)
    )
    m = mask.to(torch.float64)
    ratio = log_ratio.exp().to(torch.float64)
    distance = log_ratio.abs().to(torch.float64)  # log max(r, 1 / r)
    terms = [ratio, *((distance > torch.log(torch.tensor(x, dtype=torch.float64))).double() for x in BEYOND)]
    terms.append(kl_old_estimate(log_ratio).to(torch.float64))
    sums = torch.stack([*((t * m).sum() for t in terms), m.sum()])
    masked = torch.where(m > 0, ratio, torch.zeros_like(ratio))
    return {"sums": sums, "max": masked.max() if masked.numel() else torch.zeros((), dtype=torch.float64)}
