"""The RLHF methods the paper compares, each defined in one place, and the metrics the paper reports.

A method (`RLHFMethod`) is a trainer class, its config class, the loss settings it applies over the shared
preset, and the per-iteration metrics it adds. Everything else (data, reward, generation, batch, learning
rate, ``num_iterations``) comes from the preset, so runs differ only in the policy loss. Built in:

- ``rgpo``: `RGPOTrainer`, sigmoid gate (k = 5) on the dual ratio max(r_old, r_ref), adaptive KL-to-old,
  fixed beta_ref = 0.05 (paper Eq. rgpo_rlhf).
- ``rgpo_old``: the same with the gate on r_old alone (the paper's Eq. rgpo_rlhf gates max(r_old, r_ref),
  its Sec. 7.3 text the ratio to pi_old; both are run).
- ``grpo``: TRL's GRPO clipped loss (``loss_type="grpo"``), no reference penalty (beta = 0), as in the
  paper's GRPO baseline ("no explicit reference anchor").
- ``ppo``: PPO-RLHF with a value model (`PPORLHFTrainer`): KL to the reference in the per-token reward
  (beta = 0.05), GAE (gamma 1, lambda 0.95), whitened advantages, clipped surrogate and value loss.
- ``ppo_clip_kl``: PPO's clipped surrogate with a k3 KL-to-reference penalty (beta = 0.05), token-level, on
  GRPO's group-relative advantages (no value model): the stand-in used before ``ppo`` existed.
- ``sapo``: TRL's SAPO soft gate (``loss_type="sapo"``) with the same beta_ref = 0.05.
- ``cispo``: TRL's CISPO (``loss_type="cispo"``): the importance weight to pi_old clipped from above at
  ``epsilon_high`` = 5 (ScaleRL's recommendation, TRL's docs) and stop-gradient, times A log pi; the same
  beta_ref = 0.05: the off-policy peer of the staleness study.
- ``dpo``: TRL's DPOTrainer (beta 0.1) on the dataset's chosen/rejected pairs, same initial policy and
  reference; offline, so its reward, gold and KL_ref come from the shared end-of-run evaluation.
- ``sft``: no training; the initial policy through the same evaluation (KL_ref = 0): the baseline.

More are added with `register_rlhf_method`. KL to the reference is the paper's primary RLHF stability
metric, also for GRPO, which does not optimise it: `ReferenceKLMonitor` computes it the same way for every
method, from the reference log-probabilities the trainer computes for its loss or, for GRPO (beta = 0), from
the same reference forward made by the monitor itself. How stale the samples a step trains on are is logged
the same way for every GRPO-family method by `BehaviourRatioMonitor` (``behaviour/*``: the ratio to the
behaviour policy, from the loss's own log-probabilities).
"""

from __future__ import annotations

import csv
import inspect
import json
import logging
import math
import os
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import peft
import torch
from accelerate.utils import is_peft_model
from packaging.version import Version
from peft import LoraConfig
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, get_peft_config
from trl.models.utils import disable_gradient_checkpointing, prepare_deepspeed, prepare_fsdp
from trl.trainer.utils import (
    add_fused_lm_head,
    create_model_from_path,
    disable_dropout_in_model,
    get_config_model_id,
    use_adapter,
)

from ..core import clamp_log_ratio, kl_ref_estimate
from ..trainer import PPORLHFConfig, PPORLHFTrainer, RGPOConfig, RGPOTrainer
from .behaviour_ratio import BehaviourRatioMonitor

logger = logging.getLogger("rgpo_trl.recipe")


def _given_arguments(init: Any, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of the call ``init(*args, **kwargs)`` by name, bound to ``init``'s own signature (a
    monitored trainer's: `PPORLHFTrainer` adds ``value_model`` and passes GRPOTrainer's keywords on in
    ``**kwargs``), those its ``**kwargs`` collects included."""
    signature = inspect.signature(init)
    given = dict(signature.bind(*args, **kwargs).arguments)
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            given.update(given.pop(name, {}))
    return given


class ReferenceKLMonitor:
    """Mixin: logs ``kl_ref/monitor`` = mean k3 KL(pi_old || pi_ref) over the completion tokens of each
    generation batch, for every method.

    With beta != 0, GRPOTrainer builds the reference and scores each generation batch under it
    (``ref_per_token_logps``) for its loss, and the monitor reads those log-probs. With beta = 0 (GRPO) TRL
    neither builds nor runs a reference, and the trainer is left so (its config, ``beta`` and loss are
    GRPO's); the monitor brings its own:

    - after construction, `_build_reference` builds the reference as GRPOTrainer does for beta != 0 and sets
      it as ``ref_model``, which GRPOTrainer leaves None with beta = 0 and then never reads (for a PEFT
      policy the reference is the policy with its adapter disabled, or a pre-trained adapter's frozen
      ``"ref"`` copy);
    - after each generation batch, `_reference_per_token_logps` scores it under that reference with TRL's
      reference forward; the log-probs never enter the batch, so the loss is exactly GRPO's.

    pi_old is the batch's ``old_per_token_logps``; with one optimizer step per generation batch TRL computes
    none (the behaviour policy is the policy as it is), and the monitor scores the batch under the policy
    itself. ``monitor_builds_reference`` says which case a trainer is in. The trainer's state is not changed
    while a batch is scored or the metric computed.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.monitor_builds_reference = self.beta == 0.0
        if self.monitor_builds_reference:
            given = _given_arguments(super().__init__, args, kwargs)  # as the trainer below took them
            self.ref_model = self._build_reference(
                pre_wrapped_peft=given.get("peft_config") is None,
                quantization_config=given.get("quantization_config"),
            )

    def _build_reference(self, pre_wrapped_peft: bool, quantization_config=None):
        """The reference GRPOTrainer's ``__init__`` builds when beta != 0, built the same way here (the TRL
        lines followed are pinned by a digest in tests/test_reference_kl_monitor.py): a frozen copy of the
        initial policy loaded from its path, dropout disabled as configured, with TRL's fused LM head,
        prepared for DeepSpeed, FSDP or the accelerator; None for a PEFT policy, whose reference is the policy
        with its adapter disabled or, for a model passed with a pre-trained adapter, its ``"ref"`` copy, added
        here. With ``cast_lm_head_to_fp32`` the fused head (the monitor's forward) runs in float32 as TRL's
        does; the copy's plain forward keeps its dtype."""
        args, policy = self.args, self.accelerator.unwrap_model(self.model)
        if is_peft_model(policy):
            default_config = policy.peft_config["default"]
            if not pre_wrapped_peft or (
                isinstance(default_config, LoraConfig)
                and Version("0.17.0") <= Version(peft.__version__) < Version("0.20.0")
                and default_config.target_parameters
            ):  # the base model is the reference (for the second case TRL says so in a warning)
                return None
            policy.add_adapter("ref", default_config)
            for name, param in policy.named_parameters():
                if ".default." in name:
                    policy.get_parameter(name.replace(".default.", ".ref.")).data.copy_(param.data)
            if args.disable_dropout:
                disable_dropout_in_model(policy)
            return None
        model_init_kwargs = dict(args.model_init_kwargs or {})
        if quantization_config is not None:
            model_init_kwargs["quantization_config"] = quantization_config
        if args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
            model_init_kwargs["device_map"] = None
        model_init_kwargs.setdefault("trust_remote_code", args.trust_remote_code)
        model_init_kwargs.setdefault("dtype", policy.dtype)
        model_init_kwargs.setdefault("attn_implementation", policy.config._attn_implementation)
        reference = create_model_from_path(get_config_model_id(policy.config), **model_init_kwargs)
        if args.disable_dropout:
            disable_dropout_in_model(reference)
        add_fused_lm_head(
            reference, temperature=self.temperature, cast_lm_head_to_fp32=args.cast_lm_head_to_fp32
        )
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(reference, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(reference, self.accelerator)
        return self.accelerator.prepare_model(reference, evaluation_mode=True)

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        self._log_reference_kl(output)
        return output

    def _log_reference_kl(self, batch: dict[str, Any]) -> None:
        """Append the batch's k3 KL(pi_old || pi_ref), token-weighted over all processes, to
        ``kl_ref/monitor``; the reference log-probs are the batch's, or computed here when the loss has
        none."""
        mode = "train" if self.model.training else "eval"
        old = batch.get("old_per_token_logps")
        if old is None:  # one optimizer step per generation batch: TRL skips pi_old, the policy as it is now
            old = self._reference_per_token_logps(batch, policy=True)
        ref = batch.get("ref_per_token_logps")
        if ref is None and self.monitor_builds_reference:
            ref = self._reference_per_token_logps(batch)
        if ref is None:
            return
        mask = batch["completion_mask"].to(ref.dtype)
        kl = kl_ref_estimate(clamp_log_ratio(old - ref))
        totals = self.accelerator.reduce(torch.stack([(kl * mask).sum(), mask.sum()]), reduction="sum")
        self._metrics[mode]["kl_ref/monitor"].append((totals[0] / totals[1].clamp(min=1.0)).item())

    def _reference_per_token_logps(self, batch: dict[str, Any], policy: bool = False) -> torch.Tensor:
        """Log-probs of the batch's completion tokens under the reference, as GRPOTrainer's
        `_generate_and_score_completions` computes ``ref_per_token_logps`` (from ``ref_model``, or with the
        PEFT adapter disabled / the ``"ref"`` adapter), its inputs rebuilt from the batch as GRPOTrainer's
        `_compute_loss` does. tests/test_reference_kl_monitor.py pins a digest of the TRL lines followed.
        With ``policy``, the same forward under the policy as it is (no adapter switched)."""
        prompt_ids, prompt_mask = batch["prompt_ids"], batch["prompt_mask"]
        completion_ids, completion_mask = batch["completion_ids"], batch["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mode = "train" if self.model.training else "eval"
        batch_size = (
            self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        )
        if policy:
            model, reference = self.model, nullcontext()
        elif self.ref_model is not None:
            model, reference = self.ref_model, nullcontext()
        else:
            policy = self.accelerator.unwrap_model(self.model)
            model = self.model
            reference = use_adapter(policy, adapter_name="ref" if "ref" in policy.peft_config else None)
        with (
            torch.no_grad(),
            disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs),
            reference,
        ):
            ref_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                completion_ids.size(1),
                batch_size=batch_size,
                **{key: batch.get(key) for key in _MULTIMODAL_FORWARD_KEYS},
            )
        return ref_per_token_logps


# The batch entries GRPOTrainer's `_compute_loss` passes to the forward besides the token ids and masks (for
# multimodal policies; absent, None, for text).
_MULTIMODAL_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


# Columns of the per-iteration metrics file that every method has: name -> key logged by the trainer.
BASE_METRICS = {
    "reward": "reward",
    "reward_std": "reward_std",
    "kl_ref": "kl_ref/monitor",
    "gold": "rewards/gold/mean",
    "completion_length": "completions/mean_length",
}
RGPO_METRICS = {
    "kl_old": "rgpo/kl_old_iteration",
    "kl_coef": "rgpo/kl_coef",
    "gate_mean": "rgpo/gate_mean",
    "rejected_frac": "rgpo/rejected_frac",
    "ess": "rgpo/ess",
}

PPO_METRICS = {"value_loss": "ppo/value_loss", "clipfrac": "ppo/clipfrac", "score": "ppo/score"}


@dataclass(frozen=True)
class RLHFMethod:
    """A policy-loss method of the comparison: its trainer, its config class, the loss settings it applies
    over the shared preset, and the metrics it adds to `BASE_METRICS`."""

    name: str
    trainer_class: type[GRPOTrainer] | type[DPOTrainer] | None  # None: no training (the SFT baseline)
    config_class: type[GRPOConfig] | type[DPOConfig]
    config: dict[str, Any]
    metrics: dict[str, str] = field(default_factory=dict)
    online: bool = True  # False: trained on the preference pairs (DPO), evaluated with the same sampling code

    @property
    def metric_columns(self) -> dict[str, str]:
        return {**BASE_METRICS, **self.metrics}


RLHF_METHODS: dict[str, RLHFMethod] = {}


def register_rlhf_method(method: RLHFMethod) -> RLHFMethod:
    if method.name in RLHF_METHODS:
        raise ValueError(f"an RLHF method named {method.name!r} is already registered")
    RLHF_METHODS[method.name] = method
    return method


def get_rlhf_method(name: str) -> RLHFMethod:
    if name not in RLHF_METHODS:
        raise ValueError(f"method must be one of {list(RLHF_METHODS)}, got {name!r}")
    return RLHF_METHODS[name]


def make_trainer(trainer_class: type, model_args, training_args, tokenizer, dataset, **kwargs: Any):
    """``trainer_class`` built as the recipe builds every method's trainer (sync, async, offline): the policy
    by its path with ModelConfig's PEFT settings, the run's config, training data and tokenizer; ``kwargs``
    add what the trainer takes besides (reward functions, a rollout worker)."""
    return trainer_class(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        **kwargs,
    )


class RGPOMonitoredTrainer(BehaviourRatioMonitor, ReferenceKLMonitor, RGPOTrainer):
    pass


class GRPOMonitoredTrainer(BehaviourRatioMonitor, ReferenceKLMonitor, GRPOTrainer):
    pass


class PPORLHFMonitoredTrainer(ReferenceKLMonitor, PPORLHFTrainer):
    pass


_RGPO = {"gate": "sigmoid", "gate_params": {"k": 5.0}, "beta": 0.05, "loss_type": "dapo"}
register_rlhf_method(
    RLHFMethod("rgpo", RGPOMonitoredTrainer, RGPOConfig, {**_RGPO, "ratio_mode": "dual"}, RGPO_METRICS)
)
register_rlhf_method(
    RLHFMethod("rgpo_old", RGPOMonitoredTrainer, RGPOConfig, {**_RGPO, "ratio_mode": "old"}, RGPO_METRICS)
)
register_rlhf_method(
    RLHFMethod("ppo", PPORLHFMonitoredTrainer, PPORLHFConfig, {"beta": 0.05, "epsilon": 0.2}, PPO_METRICS)
)
register_rlhf_method(
    RLHFMethod("grpo", GRPOMonitoredTrainer, GRPOConfig, {"loss_type": "grpo", "beta": 0.0, "epsilon": 0.2})
)
register_rlhf_method(
    RLHFMethod(
        "ppo_clip_kl",
        GRPOMonitoredTrainer,
        GRPOConfig,
        {"loss_type": "dapo", "beta": 0.05, "epsilon": 0.2, "use_bias_correction_kl": False},
    )
)
register_rlhf_method(
    RLHFMethod(
        "sapo",
        GRPOMonitoredTrainer,
        GRPOConfig,
        {"loss_type": "sapo", "beta": 0.05, "use_bias_correction_kl": False},
    )
)
register_rlhf_method(
    RLHFMethod(
        "cispo",
        GRPOMonitoredTrainer,
        GRPOConfig,
        {"loss_type": "cispo", "epsilon_high": 5.0, "beta": 0.05, "use_bias_correction_kl": False},
        {"cispo_clip_ratio": "cispo_clip_ratio"},
    )
)


class IterationMetricsWriter(TrainerCallback):
    """Writes one JSONL row per logged optimizer step (all of TRL's and RGPO's metrics, plus
    ``iteration`` = generation-batch index) and, at the end, ``summary.json`` with the averages
    over the evaluation window (the paper: iterations 300-400)."""

    def __init__(
        self,
        output_dir: str,
        steps_per_iteration: int,
        window: tuple[int, int],
        method: RLHFMethod,
        world_size: int = 1,
        table_every: int = 0,
    ):
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.csv_path = os.path.join(output_dir, "metrics.csv")
        self.summary_path = os.path.join(output_dir, "summary.json")
        self.steps_per_iteration = steps_per_iteration
        self.window = window
        self.method = method
        self.world_size = world_size
        self.table_every = table_every  # a compact table row every N iterations (0: none), for the console
        self.rows: list[dict[str, Any]] = []
        self._printed_header = False

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            if os.path.exists(self.path):
                # a fresh run starts over; a resumed run keeps the rows up to its checkpoint's step and
                # appends (rows logged after the checkpoint by the interrupted run are logged again)
                kept = [r for r in read_metrics(self.path) if r["step"] <= state.global_step]
                with open(self.path, "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in kept)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "train_runtime" in logs:
            return
        row = {
            "step": state.global_step,
            "iteration": (state.global_step - 1) // self.steps_per_iteration + 1,
        }
        row.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        iteration_done = state.global_step % self.steps_per_iteration == 0
        if self.table_every and iteration_done and row["iteration"] % self.table_every == 0:
            rows = [r for r in self.rows if r["iteration"] == row["iteration"]]
            header, line = format_table(rows, {}, self.window, self.method.metric_columns).split("\n")[:2]
            if not self._printed_header:
                logger.info(header)
                self._printed_header = True
            logger.info(line)

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        rows = read_metrics(self.path)
        write_csv(rows, self.csv_path)
        summary = window_summary(rows, self.window, self.method.metric_columns)
        summary.update(method=self.method.name, world_size=self.world_size)
        with open(self.summary_path, "w") as f:
            json.dump(summary, f, indent=2)
        logger.info("\n%s", format_table(rows, summary, self.window, self.method.metric_columns))


def read_metrics(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_csv(rows: Sequence[dict[str, Any]], path: str) -> None:
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("step", "iteration"), k))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def window_summary(
    rows: Sequence[dict[str, Any]], window: tuple[int, int], columns: dict[str, str] | None = None
) -> dict[str, Any]:
    """Averages of the paper's metrics over iterations ``window[0] < it <= window[1]``."""
    lo, hi = window
    in_window = [r for r in rows if lo < r["iteration"] <= hi]
    summary: dict[str, Any] = {"window": [lo, hi], "rows_in_window": len(in_window)}
    for name, key in (columns or {**BASE_METRICS, **RGPO_METRICS}).items():
        summary[name] = _mean([r.get(key) for r in in_window])
    return summary


def format_table(
    rows: Sequence[dict[str, Any]],
    summary: dict[str, Any],
    window: tuple[int, int],
    columns: dict[str, str] | None = None,
    every: int | None = None,
) -> str:
    """A text table of reward / KL_ref / KL_old per iteration and the window averages."""
    by_iter: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_iter.setdefault(r["iteration"], []).append(r)
    iters = sorted(by_iter)
    every = every or max(1, len(iters) // 10)
    columns = columns or {**BASE_METRICS, **RGPO_METRICS}
    cols = [c for c in ("reward", "kl_ref", "kl_old", "kl_coef", "gate_mean", "gold") if c in columns]
    lines = ["iteration " + "".join(f"{c:>11}" for c in cols)]
    for it in iters[::every] + ([iters[-1]] if iters and iters[-1] not in iters[::every] else []):
        vals = [_mean([r.get(columns[c]) for r in by_iter[it]]) for c in cols]
        lines.append(f"{it:>9} " + "".join(f"{v:>11.4f}" for v in vals))
    lines.append(
        f"window {window[0]}-{window[1]}".ljust(10)
        + "".join(f"{summary.get(c, float('nan')):>11.4f}" for c in cols)
    )
    return "\n".join(lines)


register_rlhf_method(RLHFMethod("dpo", DPOTrainer, DPOConfig, {"beta": 0.1}, online=False))
# The initial (SFT) policy, evaluated with the same code and no training: the baseline a method must beat.
register_rlhf_method(RLHFMethod("sft", None, DPOConfig, {}, online=False))


class QuietProgressCallback(ProgressCallback):
    """transformers' progress bar without its per-step metric dicts (35 keys every step): the recipe's console
    shows the bar and `IterationMetricsWriter`'s compact table; every metric still goes to metrics.jsonl and
    the ``report_to`` loggers."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


def quiet_console(trainer) -> None:
    """Swap the trainer's console callback (the progress bar, or the printer under ``disable_tqdm``) for
    `QuietProgressCallback` (or nothing)."""
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if not trainer.args.disable_tqdm:
        trainer.add_callback(QuietProgressCallback)
