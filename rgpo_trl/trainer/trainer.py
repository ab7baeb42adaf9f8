"""`RGPOTrainer`: the RGPO loss inside TRL's `GRPOTrainer`.

GRPOTrainer already does everything RGPO needs around the loss: it samples a group of completions per
prompt, turns rewards into group-relative advantages, scores the completions under the behaviour policy
(``old_per_token_logps``, whenever a generation batch is reused) and under the frozen reference model
(``ref_per_token_logps``, whenever ``beta != 0``; for PEFT models the reference is the base model with the
adapter disabled), and reuses each generation batch ``num_iterations`` times. So, like TRL's own
``trl/experimental/gmpo``, this trainer overrides ``_compute_loss`` and little else: the per-token loss is
`rgpo_trl.rgpo_loss` (the same torch-only code the MuJoCo scripts validate, no second copy of the math)
with the gate, the ratio mode (``old`` / ``ref`` / ``dual`` = max(r_old, r_ref)), the adaptive KL-to-old
coefficient and the fixed KL-to-reference coefficient ``beta``. It adds no forward pass to what GRPO makes
with ``beta > 0`` and ``num_iterations > 1``.

GRPO's options that are orthogonal to the surrogate (the ``loss_type`` aggregations, the entropy bonus, the
entropy and off-policy masks, the bias-corrected KL, the vLLM importance-sampling correction) are applied to
the RGPO terms where GRPOTrainer applies them to its own surrogate (`rgpo_trl.rgpo_terms` gives the terms
separately); the options that would replace the gate are refused by `RGPOConfig`. TRL has no hook inside
its ``_compute_loss`` and no method for these pieces of it, so the pieces this trainer follows are each one
helper of its ``_compute_loss`` (`_policy_forward`, `_aggregate`, `_apply_entropy_bonus`, `_add_aux_loss`),
marked as mirrors, and a test pins a digest of the TRL lines each follows, failing when a TRL release changes
them.

RGPOTrainer sets none of the attributes GRPOTrainer or transformers' Trainer create (a test records every
assignment through training, checkpointing and resuming), except, with ``use_in_process_sampler``, the three
vLLM ones its in-process sampler takes the place of (`rgpo_trl.trainer.sync_sampler`). In particular
GRPOTrainer's adaptive entropy controller belongs to GRPOTrainer's loss, which this trainer replaces: the same
rule runs on RGPO's own state, `EntropyControllerState` in ``entropy_ctl``, initialised as GRPOTrainer
initialises its own. GRPOTrainer's public ``entropy_coef`` is a property reading (and writing)
``entropy_ctl.coef``, so it is always the coefficient in force, as TRL's tests and user callbacks expect; its
private ``_last_world_entropy`` and ``_entropy_window_stats`` keep the values its ``__init__`` gave them.

The other additions are the adaptive KL-to-old controller (paper Eq. beta_update) and its bookkeeping. One
RGPO *iteration* is one generation batch and all its reuse (``num_iterations * steps_per_generation``
micro-batches). Every training micro-batch adds the globally reduced (all processes) sum of
r_old - 1 - log r_old over its completion tokens and their count; after the iteration's last micro-batch the
controller is updated once from the token-weighted mean, so all ranks hold the same coefficient. The
controller state is written to ``rgpo_kl_controller.json`` in every checkpoint, with
``use_adaptive_entropy`` the entropy controller's to ``rgpo_entropy_controller.json``, and both are restored
on ``resume_from_checkpoint``.
"""

from __future__ import annotations

import math
import os
import textwrap
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from ..core import ess_from_moments, log_ratio_diagnostics, masked_mean, rgpo_terms
from .checkpoint import (
    ENTROPY_CONTROLLER_FILE,
    KL_CONTROLLER_FILE,
    checkpoint_folder,
    load_controller,
    load_kl_controller,
    save_controller,
    save_kl_controller,
)
from .config import RGPOConfig, micro_batches_per_iteration
from .model_card import build_model_card
from .sync_sampler import MismatchedSamplerMixin

__all__ = ["ENTROPY_CONTROLLER_FILE", "KL_CONTROLLER_FILE", "EntropyControllerState", "RGPOTrainer"]


# The model card's citation, shared by both RGPO trainers.
RGPO_PAPER = {
    "title": "Beyond Importance Sampling: Rejection-Gated Policy Optimization",
    "id": None,
    # docstyle-ignore
    "citation": textwrap.dedent("""\
        @inproceedings{sun2025rgpo,
            title        = {{Beyond Importance Sampling: Rejection-Gated Policy Optimization}},
            author       = {Ziwu Sun and Zhen Gao and Jiyong Zhang and Jiaheng Li},
            year         = 2025,
        }"""),
}


@dataclass
class EntropyControllerState:
    """RGPOTrainer's entropy-bonus coefficient and adaptive controller: GRPOTrainer's rule, RGPO's state.

    GRPOTrainer keeps this state in its own attributes (``entropy_coef``, ``_last_world_entropy``,
    ``_entropy_window_stats``) and updates it inside its ``_compute_loss``; RGPOTrainer replaces that method,
    so it keeps the state here instead of writing GRPOTrainer's (``RGPOTrainer.entropy_coef``, the public
    attribute, is a property of ``coef``). `from_config` initialises it as
    ``GRPOTrainer.__init__`` initialises its own; ``RGPOTrainer._apply_entropy_bonus`` applies and updates it
    as GRPOTrainer's ``_compute_loss`` does; ``state_dict`` is what GRPOTrainer's checkpoint saves of its own
    (the coefficient and the last window's entropy; the window is empty at an optimizer step, where
    checkpoints are written)."""

    coef: float  # the entropy coefficient (the static one, or the adaptive one in force)
    coef_min: float
    coef_max: float
    # the global entropy of the last optimizer step's window; inf before the first, so no bonus until then
    last_world_entropy: float = math.inf
    window: torch.Tensor | None = None  # (entropy sum, token count) of the optimizer step so far, this rank

    @classmethod
    def from_config(cls, args: RGPOConfig) -> EntropyControllerState:
        return cls(coef=args.entropy_coef, coef_min=args.entropy_coef_min, coef_max=args.entropy_coef_max)

    def state_dict(self) -> dict[str, Any]:
        """The coefficient and the last window's entropy (``null`` before the first window: JSON has no
        infinity, and a non-finite entropy gates the bonus off as inf does)."""
        entropy = self.last_world_entropy
        return {"entropy_coef": self.coef, "last_world_entropy": entropy if math.isfinite(entropy) else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved state; one with a coefficient outside [coef_min, coef_max], or not of this form, is
        refused whole."""
        coef, entropy = state.get("entropy_coef"), state.get("last_world_entropy", "missing")
        if not _is_number(coef) or not self.coef_min <= coef <= self.coef_max:
            raise ValueError(
                f"saved entropy_coef {coef!r} is outside [entropy_coef_min, entropy_coef_max] = "
                f"[{self.coef_min}, {self.coef_max}]"
            )
        if entropy is not None and not _is_number(entropy):
            raise ValueError(f"saved last_world_entropy must be a number or null, got {entropy!r}")
        self.coef = float(coef)
        self.last_world_entropy = math.inf if entropy is None else float(entropy)
        self.window = None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class RGPOTrainer(MismatchedSamplerMixin, GRPOTrainer):
    """Trainer for Rejection-Gated Policy Optimization (RGPO) on language models.

    Same constructor as `trl.GRPOTrainer`; ``args`` must be an `RGPOConfig`. The loss per completion token is

        -g(r) A + kl_coef * (r_old - 1 - log r_old) + beta * KL_ref(k3)

    aggregated over the completion tokens of the accumulated batch on all processes (TRL's ``dapo``
    normalisation). With ``importance_sampling_level="sequence"`` the gate sees the per-sequence ratio
    exp(mean_t log r_t) (as in GSPO) while both KL penalties stay per token.

    Extra metrics (``rgpo/...``, next to TRL's ``kl`` and ``entropy``): ``gate_mean``, ``rejected_frac``
    (share of tokens with g < 0.1), ``weight_mean`` (w = g'(r) r), ``ess``, ``kl_old`` (KLhat_old),
    ``kl_coef`` (the KL-to-old coefficient), ``ratio_old_mean/max``, ``ratio_ref_mean/max``, in dual mode
    ``ref_ratio_larger_frac`` and ``rejected_frac_old`` (the gate on r_old alone), and once per iteration
    ``kl_old_iteration`` (the controller's input).

    The entropy coefficient in force is ``entropy_coef`` (as in GRPOTrainer; a property of ``entropy_ctl``,
    RGPO's controller state) and is logged as ``entropy_coef``, as GRPOTrainer logs its own.
    """

    _tag_names = ["trl", "rgpo"]
    _name = "RGPO"
    _paper = RGPO_PAPER

    def __init__(self, model, reward_funcs=None, args: RGPOConfig | None = None, **kwargs):
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = RGPOConfig(f"{model_name.split('/')[-1]}-RGPO")
        elif not isinstance(args, RGPOConfig):
            raise TypeError(
                f"RGPOTrainer needs an RGPOConfig (got {type(args).__name__}): the RGPO gate, ratio mode and "
                "KL controller settings live there."
            )
        # the entropy bonus's controller, initialised as GRPOTrainer.__init__ initialises its own (pinned);
        # before that __init__, which sets and reads entropy_coef, a property of this state
        self.entropy_ctl = EntropyControllerState.from_config(args)
        super().__init__(model, reward_funcs, args=args, **kwargs)
        self.gate = args.make_gate()
        self.ratio_mode = args.ratio_mode
        self.kl_ctl = args.make_kl_controller()
        self.iteration_length = micro_batches_per_iteration(args)
        self._reset_iteration_stats()
        if self.args.gradient_accumulation_steps % self.iteration_length == 0 and not (
            (self.use_vllm and self.vllm_importance_sampling_correction) or args.gate_on_sampler
        ):
            warnings.warn(
                "With these settings GRPOTrainer never reuses a generation batch before an optimizer step "
                f"(num_iterations={self.num_iterations}, steps_per_generation={args.steps_per_generation}, "
                f"gradient_accumulation_steps={args.gradient_accumulation_steps}), so it does not compute "
                "old_per_token_logps: r_old == 1, KLhat_old == 0 and the KL-to-old coefficient only decays. "
                "Set num_iterations >= 2 for a non-trivial trust region.",
                stacklevel=2,
            )

    # ------------------------------------------------------------------ entropy coefficient
    @property
    def entropy_coef(self) -> float:
        """The entropy coefficient in force, ``entropy_ctl.coef``: GRPOTrainer's public attribute, which TRL's
        tests and user callbacks read, backed by RGPO's controller so the two cannot disagree."""
        return self.entropy_ctl.coef

    @entropy_coef.setter
    def entropy_coef(self, value: float) -> None:
        # GRPOTrainer's writes (its __init__, its checkpoint restore) and a user's set the controller's
        self.entropy_ctl.coef = float(value)

    # ------------------------------------------------------------------ KL controller
    @property
    def kl_coef(self) -> float:
        """The current KL-to-old coefficient."""
        return self.kl_ctl.kl_coef

    def _reset_iteration_stats(self) -> None:
        self._iter_kl_sum = 0.0  # global sum over the iteration's completion tokens of r_old - 1 - log r_old
        self._iter_kl_count = 0.0  # global number of those tokens

    def _end_iteration(self) -> None:
        """Update the KL-to-old coefficient from the iteration's mean KLhat_old (identical on all ranks)."""
        if self._iter_kl_count > 0:
            mean_kl = self._iter_kl_sum / self._iter_kl_count
            self.kl_ctl.update(mean_kl)
            self._metrics["train"]["rgpo/kl_old_iteration"].append(mean_kl)
        self._reset_iteration_stats()

    def training_step(self, model, inputs, num_items_in_batch):
        output = super().training_step(model, inputs, num_items_in_batch)  # increments self._step
        if self._step % self.iteration_length == 0:  # that was the iteration's last micro-batch
            self._end_iteration()
        return output

    # ------------------------------------------------------------------ model card
    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
    ) -> None:
        """Write ``README.md`` to ``output_dir`` as TRL's card does (TRL calls this at every checkpoint and
        on ``push_to_hub``), built by `rgpo_trl.trainer.model_card.build_model_card`: TRL's card assumes hub
        names and links a local model or dataset to huggingface.co, titles it "None" and lists no settings."""
        if self.is_world_process_zero():
            card = build_model_card(self, model_name, dataset_name, tags)
            card.save(os.path.join(self.args.output_dir, "README.md"))

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model, trial):
        """GRPOTrainer's checkpoint, and the controllers' states next to it: the KL controller's always, the
        entropy controller's when adaptive (as GRPOTrainer saves its own; its ``entropy_ctrl_state.json``
        there holds the coefficient in force, read through ``entropy_coef``, beside its own unused
        ``_last_world_entropy``)."""
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = checkpoint_folder(self, trial)
            save_kl_controller(self.kl_ctl, folder)
            if self.use_adaptive_entropy:
                save_controller(self.entropy_ctl, folder, ENTROPY_CONTROLLER_FILE)

    def _load_optimizer_and_scheduler(self, checkpoint):
        coef = self.entropy_ctl.coef
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        # GRPOTrainer has just set entropy_coef (the controller's) from its entropy_ctrl_state.json; RGPO's
        # own file is the one restored below, with its entropy and its checks, so that write is undone first
        self.entropy_ctl.coef = coef
        load_kl_controller(self.kl_ctl, checkpoint, "KL-to-old")
        if self.use_adaptive_entropy:
            load_controller(
                self.entropy_ctl,
                checkpoint,
                ENTROPY_CONTROLLER_FILE,
                missing="the adaptive entropy controller is not restored and restarts at "
                f"entropy_coef={self.entropy_ctl.coef}, with no bonus before its first window.",
                hint="resume with the same entropy_coef_min and entropy_coef_max",
            )
        # GRPOTrainer regenerates after a resume (its buffer is empty and its micro-batch counter restarts),
        # so a new iteration starts too.
        self._reset_iteration_stats()

    # ------------------------------------------------------------------ loss
    def _compute_loss(self, model, inputs):
        per_token_logps, entropies, aux_loss, mask = self._policy_forward(model, inputs)
        mask = mask.to(per_token_logps.dtype)
        mode = "train" if self.model.training else "eval"
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        # None when GRPOTrainer does not reuse the batch: on-policy, r_old == 1 (the core handles None).
        old_logps = inputs.get("old_per_token_logps")
        if self.args.gate_on_sampler:
            old_logps = self._sampler_logps(inputs, per_token_logps)
        ref_logps = inputs.get("ref_per_token_logps") if self.beta != 0.0 else None
        sequence_mask = mask if self.importance_sampling_level == "sequence" else None
        terms = rgpo_terms(
            per_token_logps,
            old_logps,
            advantages,
            self.gate,
            ref_logps=ref_logps,
            ratio_mode=self.ratio_mode,
            sequence_mask=sequence_mask,
        )

        # GRPO's options act on the gated advantage term, where GRPOTrainer applies them to its surrogate.
        policy, entropy_mask = terms.policy, None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
            policy = policy * entropy_mask
        if self.off_policy_mask_threshold is not None:
            behaviour = per_token_logps.detach() if old_logps is None else old_logps
            policy = policy * self.get_off_policy_mask(
                advantages=advantages,
                per_token_logps=per_token_logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", behaviour),
                mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )
        if self.use_vllm and self.vllm_importance_sampling_correction and not self.args.gate_on_sampler:
            policy = policy * inputs["importance_sampling_ratio"]
        per_token_loss = policy + self.kl_ctl.kl_coef * terms.kl_old
        if ref_logps is not None:
            kl_ref = terms.kl_ref
            if self.args.use_bias_correction_kl:  # TRL's correction: k3 times the importance ratio to pi_old
                log_r = terms.log_ratios.old
                kl_ref = kl_ref * torch.exp(
                    log_r if sequence_mask is None else masked_mean(log_r, mask, -1)[:, None]
                )
            per_token_loss = per_token_loss + self.beta * kl_ref
            # GRPOTrainer's `kl`: the k3 KL to the reference as in the loss (bias-corrected when that option
            # is on)
            self._metrics[mode]["kl"].append(self._global_masked_mean(kl_ref.detach(), mask))
        loss, policy_loss = self._aggregate(per_token_loss, mask, inputs, mode)
        if self._entropy_bonus_enabled:
            effective_mask = mask if entropy_mask is None else mask * entropy_mask
            loss = self._apply_entropy_bonus(loss, policy_loss, entropies, effective_mask, mode)
        if self.aux_loss_enabled:
            loss = self._add_aux_loss(loss, aux_loss, mode)

        # the diagnostics of the log-ratios the loss formed (not formed a second time)
        diag = log_ratio_diagnostics(terms.log_ratios, self.gate, mask=mask)
        self._log_rgpo_metrics(mode, diag, entropies, mask)
        return loss

    @staticmethod
    def _sampler_logps(inputs, per_token_logps: torch.Tensor) -> torch.Tensor:
        """gate_on_sampler's behaviour log-probs: the sampler's own (``sampling_per_token_logps``); a token
        the sampler reported no log-prob for (NaN, as vLLM may) gets the trainer's, so its ratio is 1, as
        TRL neutralises it."""
        sampled = inputs.get("sampling_per_token_logps")
        if sampled is None:
            raise ValueError(
                "gate_on_sampler=True needs the sampler's log-probs (sampling_per_token_logps: "
                "use_vllm=True, or a rollout_func that returns logprobs), and this batch has none"
            )
        return torch.where(torch.isnan(sampled), per_token_logps.detach(), sampled)

    # ------------------------------------------------------------------ mirrors of GRPOTrainer._compute_loss
    # Each helper below follows lines of GRPOTrainer._compute_loss that TRL offers no method or hook for;
    # tests/test_rgpo_trainer_trl_mirror.py pins a digest of those lines.
    def _policy_forward(self, model, inputs):
        """The policy's forward on the micro-batch, as GRPOTrainer's ``_compute_loss`` starts (mirrored: TRL
        has no hook between its forward and its loss; a test pins TRL's lines). Returns the per-token
        log-probs (with grad), the entropies, the MoE aux loss (None unless enabled) and the loss mask
        (completion tokens, without tool-output tokens)."""
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)  # logits for the completion tokens only
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            pixel_values=inputs.get("pixel_values"),
            image_grid_thw=inputs.get("image_grid_thw"),
            num_images=inputs.get("num_images"),
            pixel_attention_mask=inputs.get("pixel_attention_mask"),
            spatial_shapes=inputs.get("spatial_shapes"),
            num_tiles=inputs.get("num_tiles"),
            image_sizes=inputs.get("image_sizes"),
            token_type_ids=inputs.get("token_type_ids"),
            mm_token_type_ids=inputs.get("mm_token_type_ids"),
            image_position_ids=inputs.get("image_position_ids"),
        )
        return per_token_logps, entropies, aux_loss, mask

    def _aggregate(self, per_token_loss, mask, inputs, mode) -> tuple[torch.Tensor, torch.Tensor]:
        """Reduce the per-token loss as GRPOTrainer reduces its own for the same ``loss_type`` (mirrored; a
        test pins TRL's lines). Returns the loss and, detached, what GRPOTrainer records as ``policy_loss``
        for that ``loss_type`` (for grpo / bnpo / dr_grpo the value before the gradient-accumulation scaling,
        for dapo the loss itself)."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if self.loss_type in ("grpo", "bnpo", "dr_grpo"):
            if self.loss_type == "grpo":  # mean over each sequence's tokens, then over sequences
                loss = masked_mean(per_token_loss, mask, dim=-1).mean()
            elif self.loss_type == "bnpo":  # mean over the micro-batch's tokens
                loss = masked_mean(per_token_loss, mask)
            else:  # dr_grpo: sum / (sequences x max_completion_length)
                loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * self.max_completion_length)
            return loss / accumulation, loss.detach()
        # "dapo": sum over the completion tokens of the whole accumulated batch on all processes / their
        # number. `num_items_in_batch` spans the generation batch: rescaled to one optimizer step and divided
        # by the number of processes because DDP averages gradients.
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            normalizer = (
                normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            )
        loss = (per_token_loss * mask).sum() / normalizer
        return loss, loss.detach()

    def _apply_entropy_bonus(self, loss, policy_loss, entropies, effective_mask, mode) -> torch.Tensor:
        """``loss - coef * H`` (H: mean entropy of the tokens the policy term acts on), GRPOTrainer's entropy
        bonus, static or adaptive, and its bookkeeping: ``policy_loss`` (the loss before the bonus, gathered),
        the adaptive controller updated at optimizer-step boundaries from the window-global entropy, and
        ``entropy_coef``. Mirrors TRL's lines (TRL has no hook for them; a test pins their digest), with the
        controller's state in RGPO's ``entropy_ctl`` where TRL's lines use GRPOTrainer's ``entropy_coef``,
        ``_last_world_entropy`` and ``_entropy_window_stats`` (see `EntropyControllerState`)."""
        ctl = self.entropy_ctl
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        entropy = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation
        if self.use_adaptive_entropy:
            coef = ctl.coef if ctl.last_world_entropy <= self.args.entropy_target else 0.0
        else:
            coef = ctl.coef
        loss = loss - coef * entropy
        self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())
        if self.use_adaptive_entropy and mode == "train":
            stats = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()
            ctl.window = stats if ctl.window is None else ctl.window + stats
            if self.accelerator.sync_gradients:
                totals = self.accelerator.reduce(ctl.window, reduction="sum")
                world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                step = self.args.entropy_coef_delta
                if world_entropy <= self.args.entropy_target:
                    ctl.coef = min(ctl.coef + step, self.args.entropy_coef_max)
                else:
                    ctl.coef = max(ctl.coef - step, self.args.entropy_coef_min)
                ctl.last_world_entropy = world_entropy
                ctl.window = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(ctl.coef)
        return loss

    def _add_aux_loss(self, loss, aux_loss, mode) -> torch.Tensor:
        """The MoE router's auxiliary loss, scaled for gradient accumulation as the loss already is, and its
        metric, as GRPOTrainer adds them (mirrored; a test pins TRL's lines)."""
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        return loss + self.router_aux_loss_coef * aux_loss / accumulation

    def _global_masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        """Token-weighted mean over all processes (GRPOTrainer's ``global_masked_mean``, per token)."""
        totals = self.accelerator.reduce(torch.stack([(x * mask).sum(), mask.sum().float()]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    # ------------------------------------------------------------------ RGPO's metrics
    @torch.no_grad()
    def _log_rgpo_metrics(self, mode, diag, entropies, mask) -> None:
        """Reduce the diagnostics across processes and record them: ``*_max`` keys as maxima, ESS from the
        global means of w and w^2, every other key as a token-weighted mean (global sum / global count)."""
        max_keys = [k for k in diag if k.endswith("_max")]
        mean_keys = [k for k in diag if k not in max_keys and k != "ess"]
        count = mask.sum().float()
        local_sums = [diag[k].to(count.device) * count for k in mean_keys]
        local_sums += [(entropies.float() * mask).sum(), count]
        totals = self.accelerator.reduce(torch.stack(local_sums), reduction="sum")
        global_count = totals[-1]
        means = dict(
            zip([*mean_keys, "entropy"], (totals[:-1] / global_count.clamp(min=1.0)).tolist(), strict=True)
        )
        gathered = self.accelerator.gather(torch.stack([diag[k].to(count.device) for k in max_keys])[None])
        maxima = dict(zip(max_keys, gathered.max(dim=0).values.tolist(), strict=True))
        ess = ess_from_moments(
            torch.tensor(means["weight_mean"]), torch.tensor(means["weight_sq_mean"])
        ).item()

        metrics = self._metrics[mode]
        for key, value in {**means, **maxima, "ess": ess, "kl_coef": self.kl_ctl.kl_coef}.items():
            metrics["entropy" if key == "entropy" else f"rgpo/{key}"].append(value)
        if mode == "train":
            self._iter_kl_sum += totals[mean_keys.index("kl_old")].item()
            self._iter_kl_count += global_count.item()
