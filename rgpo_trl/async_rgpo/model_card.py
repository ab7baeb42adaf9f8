"""The settings `AsyncRGPOTrainer`'s model card lists (`rgpo_trl.trainer.model_card.build_model_card` writes
the card for both trainers): its own, since it has no num_iterations, loss aggregation or entropy bonus but
an off-policy correction, a staleness bound and, on a CPU, the in-process sampler's mismatch settings."""

from __future__ import annotations

from ..trainer.model_card import loss_settings, optimisation_settings
from .worker import InProcessRolloutWorker


def async_training_settings(trainer) -> list[str]:
    """The settings of an `AsyncRGPOTrainer`'s run as markdown list items: the off-policy correction (with the
    RGPO gate and KL lines only when it is ``rgpo``, the only one that reads them), staleness and weight sync,
    the in-process sampler's settings when it sampled, and the optimisation."""
    args = trainer.args
    params = ", ".join(f"{k}={v:g}" for k, v in trainer.correction.params.items())
    lines = [
        f"off-policy correction: `{args.off_policy_correction}`"
        + (f" ({params})" if params else "")
        + ", against the sampler's log-probs"
    ]
    if trainer.correction.uses_rgpo_settings:
        lines += loss_settings(trainer, "the sampling policy π_old", "once per optimizer step")
    lines.append(
        f"staleness: samples up to max_staleness {args.max_staleness} weight versions behind are trained on; "
        f"weights published every {args.weight_sync_steps} optimizer step(s)"
    )
    worker = getattr(trainer, "rollout_worker", None)
    if isinstance(worker, InProcessRolloutWorker):
        lag = "free running" if worker.lag is None else f"exact lag {worker.lag} weight versions"
        lines.append(
            f"sampler: the in-process rollout worker ({lag}), dtype `{args.sampler_dtype}`, quantization "
            f"`{args.sampler_quantization}`, logit noise sigma {args.sampler_logit_noise:g}, top_p "
            f"{args.sampler_top_p:g}"
        )
    lines += optimisation_settings(trainer, "each sample trained on once (asynchronous)")
    return [f"- {line}" for line in lines]
