"""What the HH-RLHF recipe (``recipes/hh_rlhf_qwen.py``) accepts: its own fields (`HHScriptArguments`) and
the `TrlParser` that reads them with a trainer config and TRL's `ModelConfig`, with the recipe's ``--help``
description first."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any

from trl import ModelConfig, ScriptArguments, TrlParser


@dataclass
class HHScriptArguments(ScriptArguments):
    """The recipe's own arguments (world, method, data, reward model, evaluation); TRL's `ScriptArguments`
    fields (``dataset_train_split``, ``dataset_test_split``, ...) keep their meaning."""

    world: str = field(
        default="hh",
        metadata={
            "help": "'hh': Anthropic HH-RLHF and its reward model, no gold score; "
            "'tiny': the embedded tiny-HH world (`tiny-hh/<asset>` paths, built "
            "once and cached) whose gold score is logged next to the reward."
        },
    )
    method: str = field(
        default="rgpo",
        metadata={
            "help": "Policy loss, a registered RLHF method: rgpo, rgpo_old, ppo, grpo, ppo_clip_kl, sapo, "
            "cispo, dpo, or sft (no training: the initial policy through the same evaluation); with "
            "--trainer async also the off-policy corrections ignore, ppo_clip, tis, icepop, seq_mask, "
            "rgpo_mu, rgpo_gate (recipes.hh_rlhf.async_methods)."
        },
    )
    trainer: str = field(
        default="sync",
        metadata={
            "help": "'sync': TRL's GRPOTrainer family, generation and training in turn; 'async': TRL's "
            "asynchronous trainer (trl.experimental.async_grpo), where samples arrive up to max_staleness "
            "weight versions old (methods rgpo, rgpo_old, grpo and the corrections; its fields such as "
            "--max_staleness and the sampler's --sampler_dtype, --sampler_quantization, "
            "--sampler_logit_noise, --sampler_top_p apply).",
            "choices": ["sync", "async"],
        },
    )
    async_rollout: str = field(
        default="auto",
        metadata={
            "help": "With --trainer async: 'in_process' generates in a thread of the trainer with "
            "transformers (CPU, tests, the tiny world); 'vllm' uses TRL's vLLM server (`trl vllm-serve`, "
            "GPUs); 'auto' is in_process without a GPU and vllm with one.",
            "choices": ["auto", "in_process", "vllm"],
        },
    )
    rollout_lag: int | None = field(
        default=None,
        metadata={
            "help": "With --trainer async and the in-process worker: the samples of the "
            "optimizer step that trains weight version v are generated with version v - "
            "rollout_lag exactly (1 <= rollout_lag <= max_staleness), so staleness does "
            "not depend on the machine's speed; unset: the worker runs freely."
        },
    )
    reward_model_name_or_path: str = field(
        default="OpenAssistant/reward-model-deberta-v3-large-v2",
        metadata={"help": "Pairwise sequence-classification reward model (hub id or local directory)."},
    )
    dataset_name: str = field(
        default="Anthropic/hh-rlhf",
        metadata={"help": "HH-RLHF dataset: hub id, local directory or a .jsonl file in the HH row format."},
    )
    dataset_data_dir: str | None = field(
        default="helpful-base", metadata={"help": "data_dir of the hub dataset (the helpful subset)."}
    )
    max_prompt_length: int = field(
        default=256,
        metadata={"help": "Prompts longer than this (in tokens, chat template applied) are dropped."},
    )
    max_train_prompts: int | None = field(
        default=None, metadata={"help": "Keep only the first N prompts (after filtering); None keeps all."}
    )
    num_rl_iterations: int = field(
        default=400,
        metadata={
            "help": "RL iterations: generation batches of per_device_train_batch_size / num_generations "
            "prompts per process. max_steps = num_rl_iterations * num_iterations (each batch is reused "
            "num_iterations times), unless max_steps is given."
        },
    )
    window_start: int | None = field(
        default=300, metadata={"help": "Summary window start (exclusive); None = 3/4 of the run."}
    )
    window_end: int | None = field(
        default=400, metadata={"help": "Summary window end; None = last iteration."}
    )
    reward_batch_size: int = field(default=16, metadata={"help": "Batch size of the reward model."})
    reward_max_length: int | None = field(
        default=None, metadata={"help": "Truncate (question, answer) pairs to this length; None = model max."}
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "tiny-hh/ assets: where they are cached (default: $RGPO_TRL_CACHE)."}
    )
    tiny_quick: bool = field(
        default=False, metadata={"help": "tiny-hh/ assets: use the smaller, faster-to-build variant (tests)."}
    )
    tiny_version: int = field(
        default=3,
        metadata={
            "help": "tiny-hh/ assets: the world version. 3: training, validation (tiny-hh/validation) and "
            "test questions never share a text, gold penalises ill-formed text; 2: the world of the "
            "committed v2 results.",
            "choices": [2, 3],
        },
    )
    validation_dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Take the validation prompts from the first validation_prompts "
            "prompts of this dataset (e.g. tiny-hh/validation: questions no "
            "training prompt contains) instead of the last training prompts."
        },
    )
    heldout_dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Held-out prompts for the end-of-run evaluation (default: dataset_name, "
            "dataset_test_split)."
        },
    )
    save_final_model: bool = field(
        default=True, metadata={"help": "Save the trained model to output_dir (suites keep only metrics)."}
    )
    heldout_prompts: int = field(
        default=64,
        metadata={
            "help": "Held-out prompts evaluated after training (proxy reward, gold where known, KL_ref of "
            "one sample each, written to heldout.json); 0 disables. Single-process runs only."
        },
    )
    heldout_compare_initial: bool = field(
        default=False,
        metadata={
            "help": "Also evaluate the initial (SFT) policy on the held-out "
            "prompts and end with a table of both (proxy reward, gold, KL_ref) "
            "and a sentence on what training did (the demo). Online methods."
        },
    )
    heldout_samples: int = field(
        default=1,
        metadata={
            "help": "Sampled completions per held-out prompt (>= 1): more gives a less noisy estimate."
        },
    )
    validation_prompts: int = field(
        default=0,
        metadata={
            "help": "Hold the last N training-split prompts out of training and evaluate on them during the "
            "window (validation.jsonl / validation.json): the model-selection set of a tuning suite, so the "
            "test prompts are never used to choose settings. 0 disables."
        },
    )
    validation_samples: int = field(
        default=1, metadata={"help": "Sampled completions per validation prompt (>= 1)."}
    )
    validation_every: int = field(
        default=25,
        metadata={
            "help": "Evaluate on the validation prompts every N iterations inside the window "
            "(window_start < iteration <= window_end), the last iteration included."
        },
    )
    table_every: int = field(
        default=10,
        metadata={
            "help": "Console: a compact table row (reward, KL_ref, KL_old, "
            "kl_coef, gate, gold) every N iterations; 0 none. TRL's per-step "
            "metric dicts are printed only with --log_level info (or debug)."
        },
    )
    train_eval_prompts: int | None = field(
        default=None,
        metadata={
            "help": "Training prompts of an offline method's (dpo, sft) end-of-run evaluation, its "
            "counterpart of the online methods' window (summary.json); default: heldout_prompts."
        },
    )
    cpu_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch threads per process on a CPU run (use_cpu or no GPU), set at the start; the "
            "demo's preset (hh_rlhf_tiny.yaml) sets 1 (its models are too small to share out, and extra "
            "threads slow a busy machine down). Default: torch's own (OMP_NUM_THREADS, accelerate launch's "
            "--num_cpu_threads_per_process)."
        },
    )


@dataclass
class PresetGeneration:
    """The preset's settings an offline method's trainer config (DPOConfig) has no field for but its run still
    uses, with the online methods' meaning: the evaluation's completion length and temperature, and
    ``num_iterations``, the optimizer steps of one iteration (so DPO takes as many steps as an online run)."""

    max_completion_length: int = 64
    temperature: float = 1.0
    num_iterations: int = 2


# printed as it is by --help (RawDescriptionHelpFormatter); a backslash at a line's end continues the line
DESCRIPTION = """RGPO (and the paper's baselines) on Anthropic HH-RLHF with a pairwise DeBERTa reward model.

Run a preset: --config recipes/configs/hh_rlhf_{tiny,tiny_paper,paper}.yaml; \
pick the loss with --method (rgpo,
rgpo_old, ppo, grpo, ppo_clip_kl, sapo, cispo, dpo, sft; \
rgpo, rgpo_old, grpo and the off-policy corrections ignore, ppo_clip, tis, icepop, seq_mask, \
rgpo_mu, rgpo_gate with --trainer async). The
recipe's own options come first below, then TRL's GRPOConfig / RGPOConfig fields (RGPO's: gate, gate_params,
ratio_mode, kl_controller, kl_coef, kl_target, kl_coef_min, kl_coef_max, beta) and ModelConfig's (PEFT:
--use_peft --lora_r 16)."""


USAGE = (
    "accelerate launch [--config_file recipes/accelerate_configs/<launch>.yaml] recipes/hh_rlhf_qwen.py "
    "--config recipes/configs/hh_rlhf_<preset>.yaml [--method METHOD] [--<field> VALUE ...]"
)


def model_config_without(names: set[str]) -> type:
    """TRL's ModelConfig without the fields in ``names``, for a trainer config that declares them itself
    (AsyncGRPOConfig's ``dtype``): one option, read from the trainer config."""
    kept = [
        (f.name, f.type, field(default=f.default, default_factory=f.default_factory, metadata=f.metadata))
        for f in fields(ModelConfig)
        if f.name not in names
    ]
    return make_dataclass("ModelConfig", kept, namespace={"__post_init__": ModelConfig.__post_init__})


class RecipeParser(TrlParser):
    """TrlParser that hands the parsed values (field name -> value, the YAML and the command line applied) to
    ``check`` before the dataclasses are built: their ``__post_init__`` (TRL's GRPOConfig) divides by some of
    them, so a range check after the build would come after a ZeroDivisionError."""

    def __init__(self, *args: Any, check: Callable[[dict[str, Any]], None] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.check = check

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        if self.check is not None:
            self.check(vars(namespace))
        return namespace, rest


def make_recipe_parser(
    config_class: type,
    model_config: type = ModelConfig,
    check: Callable[[dict[str, Any]], None] | None = None,
) -> RecipeParser:
    """The recipe's TrlParser over (HHScriptArguments, ``config_class``, ``model_config``): a description at
    the top of --help, the script's own fields first, and no abbreviated options (argparse's
    ``allow_abbrev``, passed through by HfArgumentParser): the early read of `recipes.hh_rlhf.parsing` takes
    the options in full, so the parse must too. ``check`` sees the parsed values before the configs are
    built (`RecipeParser`)."""
    return RecipeParser(
        (HHScriptArguments, config_class, model_config),
        check=check,
        usage=USAGE,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
