"""`AsyncRGPOTrainer`: the RGPO loss in TRL's asynchronous trainer, where samples are stale.

`trl.experimental.async_grpo.AsyncGRPOTrainer` trains while a generation server samples with older weights;
each sample carries the sampler's log-probs (the behaviour policy) and the weight version it was generated
with, and samples more than ``max_staleness`` versions old are dropped. This trainer changes the loss to
RGPO's (the gate on r = pi / pi_behaviour, or on the dual ratio with a frozen reference, and the
KL-to-behaviour penalty whose coefficient adapts once per optimizer step) and makes staleness visible: each
trained token carries its sample's version into the batch, and the gate's statistics are logged split by
staleness (0, 1, >= 2 versions behind).

Overridden: ``compute_loss`` (its packed forward is TRL's, kept in `_packed_forward`), ``training_step`` (the
KL controller), ``get_train_dataloader`` (TRL's, with the sample version carried through), checkpoint save and
resume (controller and weight version). Everything else (packing, the worker protocol, weight sync, logging)
is TRL's.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any, NamedTuple

import torch
from trl.experimental.async_grpo import AsyncGRPOTrainer
from trl.experimental.async_grpo import async_grpo_trainer as trl_async

from ..core import ess_from_moments, per_element_diagnostics, rgpo_terms
from ..trainer.checkpoint import (  # one checkpoint format for both trainers
    checkpoint_folder,
    load_kl_controller,
    read_json_state,
    save_kl_controller,
    write_json_state,
)
from ..trainer.model_card import build_model_card
from ..trainer.trainer import RGPO_PAPER
from .config import AsyncRGPOConfig
from .cpu import install_cpu_shims
from .model_card import async_training_settings

VERSION_FILE = "async_rgpo_state.json"
STALENESS_BUCKETS = ("0", "1", "2plus")  # weight versions behind: 0, 1, >= 2


class _VersionRecordingQueue:
    """The rollout queue as `RolloutQueueDataset` reads it, remembering the version of the sample it handed
    out last (the dataset yields each sample right after taking it, or drops it and takes the next)."""

    def __init__(self, inner):
        self.inner, self.last_version = inner, None

    def get(self, *args, **kwargs):
        sample = self.inner.get(*args, **kwargs)
        self.last_version = sample.model_version
        return sample

    def __getattr__(self, name):
        return getattr(self.inner, name)


class VersionedQueueDataset(trl_async.RolloutQueueDataset):
    """TRL's queue dataset, with each yielded sample's weight version (TRL drops it)."""

    def __init__(self, rollout_queue, *args, **kwargs):
        super().__init__(_VersionRecordingQueue(rollout_queue), *args, **kwargs)

    def __iter__(self):
        for item in super().__iter__():
            item["model_version"] = self.queue.last_version
            yield item


class VersionedCollator(trl_async.DataCollatorForRollout):
    """TRL's collator, adding ``model_version`` per trained token (aligned with ``token_index``)."""

    def torch_call(self, examples: list[Any]) -> dict[str, Any]:
        batch = super().torch_call(examples)
        (rows,) = examples
        versions = torch.zeros_like(batch["segment_id"])
        for r, row in enumerate(rows):
            per_sample = torch.tensor([s["model_version"] for s in row.samples], dtype=torch.long)
            versions[r] = per_sample[batch["segment_id"][r].clamp(max=len(per_sample) - 1)]
        batch["model_version"] = versions
        return batch


class PackedForward(NamedTuple):
    log_probs: torch.Tensor  # (M,) log pi of each trained token, with grad
    entropy: torch.Tensor
    old_log_probs: torch.Tensor  # the behaviour policy's (the sampler's)
    advantages: torch.Tensor
    versions: torch.Tensor  # the weight version each token's sample was generated with
    segments: torch.Tensor  # the sample each token belongs to (sequence-level corrections)
    model_inputs: dict[str, torch.Tensor]  # the packed row, for the reference model
    token_index: torch.Tensor
    tokens_per_rank: torch.Tensor
    aux_loss: torch.Tensor | None


class AsyncRGPOTrainer(AsyncGRPOTrainer):
    """Asynchronous RGPO: `AsyncGRPOTrainer` with the RGPO loss against the behaviour policy.

    Same constructor as `trl.experimental.async_grpo.AsyncGRPOTrainer` (``model`` a path; ``rollout_worker`` /
    ``weight_transfer`` for a custom generation backend, e.g. `InProcessRolloutWorker` on a CPU); ``args``
    must be an `AsyncRGPOConfig`. Without a GPU the CUDA-only attention kernel and FLOPs probe are replaced
    (`install_cpu_shims`).

    Extra metrics: ``rgpo/gate_mean``, ``rgpo/rejected_frac`` (g < 0.1), ``rgpo/weight_mean`` (w = g'(r) r),
    ``rgpo/ess``, ``rgpo/kl_old`` (KLhat to the behaviour policy), ``rgpo/kl_coef``, ``rgpo/ratio_old_mean`` /
    ``_max`` / ``_beyond_1.2`` / ``_beyond_2`` (shares with max(r, 1 / r) above 1.2 / 2); with a reference
    ``rgpo/kl_ref``, ``rgpo/ratio_ref_mean`` / ``_max``; ``staleness/mean`` / ``max`` (versions behind the
    last published weights, per trained token) and ``rgpo/rejected_frac_staleness{0,1,2plus}``,
    ``rgpo/weight_mean_staleness{...}``, ``staleness/tokens_{...}``.

    ``off_policy_correction`` picks the per-token loss from `rgpo_trl.core.corrections` (default ``rgpo``;
    ``ppo_clip`` is AsyncGRPOTrainer's own loss). Whatever the loss, the mismatch between the trainer and the
    sampler at this step's forward is logged as the literature measures it: ``mismatch/abs_log_ratio_mean``
    (mean |log pi - log mu|), ``mismatch/outside_0.9_1.1``, ``mismatch/outside_0.5_2``,
    ``mismatch/below_gate_rejection`` (g(r) < 0.1 for the configured gate), the largest r
    (``rgpo/ratio_old_max``) and K3 KL (``rgpo/kl_old``, mean r - 1 - log r); and the correction's weight on
    A grad log pi: ``correction/weight_mean``, ``_max``, ``correction/zero_weight_frac``.
    """

    _tag_names = ["trl", "rgpo", "async-grpo"]
    _name = "AsyncRGPO"
    _paper = RGPO_PAPER

    def __init__(self, model: str, reward_funcs=None, args: AsyncRGPOConfig | None = None, **kwargs):
        if not isinstance(args, AsyncRGPOConfig):
            raise TypeError(
                f"AsyncRGPOTrainer needs an AsyncRGPOConfig (got {type(args).__name__}): the gate, ratio "
                "mode and KL controller settings live there."
            )
        if not isinstance(model, str):
            raise TypeError("AsyncRGPOTrainer takes the model as a path or hub id, as AsyncGRPOTrainer does")
        if args.needs_reference and kwargs.get("peft_config") is not None:
            raise ValueError(
                f"ratio_mode={args.ratio_mode!r} / beta={args.beta} need a reference model, which "
                "AsyncRGPOTrainer does not build for PEFT yet: use ratio_mode='old' and beta=0 with "
                "peft_config"
            )
        install_cpu_shims()
        super().__init__(model, reward_funcs, args=args, **kwargs)
        self.gate = args.make_gate()
        self.kl_ctl = args.make_kl_controller()
        self.correction = args.make_correction()  # the per-token loss against the sampler's log-probs
        self.ref_model = self._load_reference(model) if args.needs_reference else None
        # the global sum of KLhat_old over this optimizer step's trained tokens, and their number
        self._step_kl = torch.zeros(2, dtype=torch.float64)
        self._micro_batches = 0

    def _load_reference(self, path: str) -> torch.nn.Module:
        """A frozen copy of the initial policy, with the same packed attention and fused head as the
        policy."""
        kwargs = dict(self.args.model_init_kwargs or {})
        kwargs.setdefault("trust_remote_code", self.args.trust_remote_code)
        kwargs.setdefault("dtype", self.args.dtype)
        ref = trl_async.create_model_from_path(
            path, device_map=None, attn_implementation=trl_async.TREE_ATTENTION, **kwargs
        )
        trl_async.add_fused_lm_head(ref, temperature=self.temperature, outputs=("log_probs",))
        return ref.eval().requires_grad_(False).to(self.accelerator.device)

    # ---------------------------------------------------------------- data: the sample version travels along
    def get_train_dataloader(self):
        """TRL's data loader, built with `VersionedQueueDataset` and `VersionedCollator` in place of TRL's
        classes."""
        originals = (trl_async.RolloutQueueDataset, trl_async.DataCollatorForRollout)
        trl_async.RolloutQueueDataset, trl_async.DataCollatorForRollout = (
            VersionedQueueDataset,
            VersionedCollator,
        )
        try:
            return super().get_train_dataloader()
        finally:
            trl_async.RolloutQueueDataset, trl_async.DataCollatorForRollout = originals

    def _published_version(self) -> int:
        """The version of the last published weights, the same on every process."""
        version = torch.tensor([self.model_version], device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            from accelerate.utils import broadcast

            version = broadcast(version, from_process=0)
        return int(version.item())

    # ---------------------------------------------------------------- loss
    def _packed_forward(self, model, inputs) -> PackedForward:
        """AsyncGRPOTrainer.compute_loss's forward of the packed row and its per-step accounting, as in TRL
        1.16 (mirrored: TRL has no hook between its forward and its loss; a test fails when TRL's code
        changes)."""
        mask_bool = inputs["attention_mask"].bool()
        selected = inputs["token_index"] >= 0
        model_inputs = {
            "input_ids": inputs["input_ids"][mask_bool].unsqueeze(0),
            "position_ids": inputs["position_ids"][mask_bool].unsqueeze(0),
            "shift_labels": inputs["shift_labels"][mask_bool].unsqueeze(0),
        }
        tree_kwargs = {
            key: inputs[key][inputs[key] >= 0]
            for key in ("tree_kv_index", "tree_cu_seqlens_q", "tree_cu_seqlens_k")
        }
        tree_kwargs["tree_max_seqlen_q"], tree_kwargs["tree_max_seqlen_k"] = inputs["tree_max_seqlens"][
            0
        ].tolist()
        model_inputs.update(tree_kwargs)
        token_index = inputs["token_index"][selected]

        forward_start = time.time()
        router_kwargs = {"output_router_logits": True} if self.aux_loss_enabled else {}
        outputs = model(**model_inputs, fused_lm_head=True, **router_kwargs)
        log_probs = outputs.log_probs.flatten()[token_index]
        entropy = outputs.entropy.flatten()[token_index]
        self._last_forward_time_s = time.time() - forward_start

        global_n_tokens = inputs["global_n_tokens"][0]
        n_forward_tokens = float(inputs["global_n_forward_tokens"][0])
        mean_seq_len = float(inputs["mean_seq_len"][0])
        self._step_forward_tokens += n_forward_tokens
        self._step_trained_tokens += float(global_n_tokens)
        self._step_seq_len_weighted += mean_seq_len * n_forward_tokens
        self._step_samples += n_forward_tokens / mean_seq_len
        self._step_forward_s += self._last_forward_time_s
        return PackedForward(
            log_probs=log_probs,
            entropy=entropy,
            old_log_probs=inputs["old_log_probs"][selected],
            advantages=inputs["advantages"][selected],
            versions=inputs["model_version"][selected],
            segments=inputs["segment_id"][selected],
            model_inputs=model_inputs,
            token_index=token_index,
            tokens_per_rank=(global_n_tokens / self.accelerator.num_processes)
            .clamp(min=1.0)
            .to(torch.float32),
            aux_loss=outputs.aux_loss if self.aux_loss_enabled else None,
        )

    @torch.no_grad()
    def _reference_log_probs(self, packed: PackedForward) -> torch.Tensor:
        outputs = self.ref_model(**packed.model_inputs, fused_lm_head=True)
        return outputs.log_probs.flatten()[packed.token_index]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("AsyncRGPOTrainer does not return outputs from compute_loss")
        packed = self._packed_forward(model, inputs)
        ref_logps = self._reference_log_probs(packed) if self.ref_model is not None else None
        terms = rgpo_terms(
            packed.log_probs,
            packed.old_log_probs,
            packed.advantages,
            self.gate,
            ref_logps=ref_logps,
            ratio_mode=self.args.ratio_mode,
        )
        if self.correction.uses_rgpo_settings:
            per_token = terms.policy + self.kl_ctl.kl_coef * terms.kl_old
            if self.args.beta > 0:
                per_token = per_token + self.args.beta * terms.kl_ref
            weight = None  # the gate's w(r), from the diagnostics
        else:  # another correction's loss; the gate's log-ratios still give the mismatch statistics
            out = self.correction.terms(
                packed.log_probs, packed.old_log_probs, packed.advantages, segment_ids=packed.segments
            )
            per_token, weight = out.loss, out.weight
        # TRL's normalisation: the micro-batch's trained tokens per process, then gradient accumulation
        loss = per_token.sum() / packed.tokens_per_rank / self.current_gradient_accumulation_steps
        if packed.aux_loss is not None:
            loss = (
                loss + self.router_aux_loss_coef * packed.aux_loss / self.current_gradient_accumulation_steps
            )
        self._log_rgpo(terms, packed, weight)
        return loss

    @torch.no_grad()
    def _log_rgpo(self, terms, packed: PackedForward, correction_weight: torch.Tensor | None = None) -> None:
        """Global (all processes) token-weighted statistics of this micro-batch, as (sum, count) pairs that
        TRL's logger reduces over the logging window; maxima as maxima."""
        e = per_element_diagnostics(terms.log_ratios, self.gate)  # the loss's log-ratios, not formed again
        w, rejected, r_old = e["weight"].double(), e["rejected"].double(), e["ratio_old"]
        staleness = (self._published_version() - packed.versions).to(torch.float64)
        one = torch.ones_like(w)
        spread = torch.maximum(r_old, 1 / r_old)  # beyond x as behaviour/beyond_x and the MuJoCo scripts
        log_r_old = terms.log_ratios.old.detach().double()
        weight = w if correction_weight is None else correction_weight.double()
        sums = {
            "rgpo/gate_mean": e["gate"].double(),
            "rgpo/weight_mean": w,
            "rgpo/weight_sq_mean": e["weight_sq"].double(),
            "rgpo/kl_old": e["kl_old"].double(),
            "rgpo/rejected_frac": rejected,
            "rgpo/ratio_old_mean": r_old.double(),
            "rgpo/ratio_old_beyond_1.2": (spread > 1.2).double(),
            "rgpo/ratio_old_beyond_2": (spread > 2.0).double(),
            "entropy": packed.entropy.detach().double(),
            # the sampler/trainer mismatch as the literature measures it (pi / mu at this step's forward)
            "mismatch/abs_log_ratio_mean": log_r_old.abs(),
            "mismatch/outside_0.9_1.1": ((r_old < 0.9) | (r_old > 1.1)).double(),
            "mismatch/outside_0.5_2": ((r_old < 0.5) | (r_old > 2.0)).double(),
            "mismatch/below_gate_rejection": (self.gate.g(terms.log_ratios.old.detach()) < 0.1).double(),
            # the correction's weight on A grad log pi per token (RGPO: g'(r) r)
            "correction/weight_mean": weight,
            "correction/zero_weight_frac": (weight == 0).double(),
            "staleness/mean": staleness,
        }
        if "kl_ref" in e:
            sums["rgpo/kl_ref"] = e["kl_ref"].double()
            sums["rgpo/ratio_ref_mean"] = e["ratio_ref"].double()
        if "ref_ratio_larger" in e:
            sums["rgpo/ref_ratio_larger_frac"] = e["ref_ratio_larger"].double()
            sums["rgpo/rejected_frac_old"] = e["rejected_old"].double()
        buckets = [staleness == 0, staleness == 1, staleness >= 2]
        for name, in_bucket in zip(STALENESS_BUCKETS, buckets, strict=True):
            sums[f"rgpo/rejected_frac_staleness{name}"] = rejected * in_bucket
            sums[f"rgpo/weight_mean_staleness{name}"] = w * in_bucket
            sums[f"staleness/tokens_{name}"] = one * in_bucket
        keys = list(sums)
        local = torch.stack(
            [sums[k].sum() for k in keys] + [one.sum()] + [in_b.sum().double() for in_b in buckets]
        )
        totals = self.accelerator.reduce(local.to(self.accelerator.device), reduction="sum").cpu()
        count, bucket_counts = totals[len(keys)].item(), totals[len(keys) + 1 :].tolist()
        metrics = self._metrics["train" if self.model.training else "eval"]
        for i, key in enumerate(keys):
            if key.startswith("staleness/tokens_"):
                metrics[key].append((totals[i].item(), count))
            elif "_staleness" in key:
                metrics[key].append(
                    (totals[i].item(), bucket_counts[STALENESS_BUCKETS.index(key.rsplit("staleness", 1)[1])])
                )
            else:
                metrics[key].append((totals[i].item(), count))
        local_max = torch.stack(
            [
                r_old.max(),
                staleness.max().float(),
                weight.max().float(),
                e["ratio_ref"].max() if "ratio_ref" in e else r_old.new_tensor(0.0),
            ]
        )
        maxima = self.accelerator.gather(local_max[None].to(self.accelerator.device)).amax(0).tolist()
        metrics["rgpo/ratio_old_max"].append(maxima[0])
        metrics["staleness/max"].append(maxima[1])
        metrics["correction/weight_max"].append(maxima[2])
        if "ratio_ref" in e:
            metrics["rgpo/ratio_ref_max"].append(maxima[3])
        mean_w, mean_w_sq = (
            totals[keys.index("rgpo/weight_mean")] / count,
            totals[keys.index("rgpo/weight_sq_mean")] / count,
        )
        metrics["rgpo/ess"].append(ess_from_moments(mean_w, mean_w_sq).item())
        if self.correction.uses_rgpo_settings:
            metrics["rgpo/kl_coef"].append(self.kl_ctl.kl_coef)
        if self.model.training:
            self._step_kl += torch.tensor(
                [totals[keys.index("rgpo/kl_old")].item(), count], dtype=torch.float64
            )

    # ---------------------------------------------------------------- KL controller: once per optimizer step
    def training_step(self, model, inputs, num_items_in_batch):
        output = super().training_step(model, inputs, num_items_in_batch)
        self._micro_batches += 1
        if self._micro_batches % self.args.gradient_accumulation_steps == 0:
            kl_sum, count = self._step_kl.tolist()
            if count > 0 and self.correction.uses_rgpo_settings:  # only RGPO's loss reads the coefficient
                mean_kl = kl_sum / count
                self.kl_ctl.update(mean_kl)
                self._metrics["train"]["rgpo/kl_old_step"].append(mean_kl)
            self._step_kl.zero_()
        return output

    # ---------------------------------------------------------------- model card
    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
    ) -> None:
        """Write ``README.md`` to ``output_dir`` with RGPOTrainer's card builder
        (`rgpo_trl.trainer.model_card.build_model_card`) and this trainer's settings
        (`rgpo_trl.async_rgpo.model_card`): TRL's card titles a local model's card "Model Card for None",
        links it to huggingface.co and lists no settings."""
        if self.is_world_process_zero():
            card = build_model_card(self, model_name, dataset_name, tags, async_training_settings(self))
            card.save(os.path.join(self.args.output_dir, "README.md"))

    # ---------------------------------------------------------------- checkpoints
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = checkpoint_folder(self, trial)
            save_kl_controller(self.kl_ctl, folder)
            write_json_state(os.path.join(folder, VERSION_FILE), {"model_version": self.model_version})

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        if load_kl_controller(self.kl_ctl, checkpoint, "KL-to-behaviour"):
            self._step_kl.zero_()
            self._micro_batches = 0

    def _inner_training_loop(self, *args, **kwargs):
        checkpoint = kwargs.get("resume_from_checkpoint")
        custom_worker = not isinstance(self.rollout_worker, trl_async.AsyncRolloutWorker)
        if checkpoint is not None and custom_worker and self.accelerator.is_main_process:
            path = os.path.join(checkpoint, VERSION_FILE)
            if os.path.exists(path):
                version = read_json_state(path).get("model_version")
                if not isinstance(version, int) or version < 0:
                    raise ValueError(f"{path}: model_version must be an integer >= 0, got {version!r}")
                self.model_version = version
                if self.rollout_worker is not None:
                    self.rollout_worker.update_model_version(version)
            else:
                warnings.warn(
                    f"{path} not found: weight versions restart at 0, so staleness counts from the resume",
                    stacklevel=2,
                )
        return super()._inner_training_loop(*args, **kwargs)
