# Copyright 2026 The rgpo-trl developers. Apache-2.0.
"""RGPO on Anthropic HH-RLHF (helpful) with a pairwise DeBERTa reward model: the paper's Sec. 7.3.

Two presets, one code path:

* ``--preset paper``: Qwen/Qwen2.5-1.5B-Instruct, OpenAssistant/reward-model-deberta-v3-large-v2,
  Anthropic/hh-rlhf helpful-base (43,835 prompts), 4 prompts x 4 completions per iteration,
  lr 1e-6, 256 prompt / 256 completion tokens, 400 iterations, beta_ref 0.05, k 5, bf16.
  Needs GPUs and the hub (or local copies: pass paths instead of ids)::

      accelerate launch --config_file recipes/accelerate_configs/single_gpu.yaml \\
          recipes/hh_rlhf_qwen.py --preset paper --method rgpo --seed 1

* ``--preset tiny`` (default): the embedded offline default. It builds (once, cached) a synthetic
  HH-format dialogue set with gold quality scores, a tiny Qwen2 policy and a tiny DeBERTa-v2 reward
  model, and runs the same recipe on CPU::

      accelerate launch --config_file recipes/accelerate_configs/cpu.yaml recipes/hh_rlhf_qwen.py

``--method rgpo | grpo | ppo_clip_kl | sapo`` runs the paper's baselines through the same code
(see `rgpo_trl.rlhf_methods`). Any RGPOConfig / GRPOConfig / ModelConfig field can be set on the
command line or in a YAML file given with ``--config``; the preset only sets defaults.
Per-iteration metrics go to ``<output_dir>/metrics.jsonl`` (and ``metrics.csv``), and the window
averages the paper reports (iterations 300-400 for the paper preset) to ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field, fields

import yaml

PRESETS = ("paper", "tiny")


@dataclass
class HHScriptArguments:
    """Recipe arguments (data, reward model, preset, method, evaluation window)."""

    preset: str = field(default="tiny", metadata={"help": "Defaults to start from: 'paper' or 'tiny'."})
    method: str = field(
        default="rgpo", metadata={"help": "Policy loss: 'rgpo', 'grpo', 'ppo_clip_kl' or 'sapo'."}
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
    dataset_split: str = field(default="train", metadata={"help": "Split to take prompts from."})
    max_prompt_length: int = field(
        default=256, metadata={"help": "Prompts longer than this (in tokens, chat template applied) are dropped."}
    )
    max_train_prompts: int | None = field(
        default=None, metadata={"help": "Keep only the first N prompts (after filtering); None keeps all."}
    )
    num_rl_iterations: int = field(
        default=400,
        metadata={
            "help": "RL iterations: generation batches of per_device_train_batch_size / num_generations prompts "
            "per process. max_steps = num_rl_iterations * num_iterations (each batch is reused "
            "num_iterations times), unless max_steps is given."
        },
    )
    window_start: int | None = field(
        default=300, metadata={"help": "Summary window start (exclusive); None = 3/4 of the run."}
    )
    window_end: int | None = field(default=400, metadata={"help": "Summary window end; None = last iteration."})
    reward_batch_size: int = field(default=16, metadata={"help": "Batch size of the reward model."})
    reward_max_length: int | None = field(
        default=None, metadata={"help": "Truncate (question, answer) pairs to this length; None = model max."}
    )
    cache_dir: str | None = field(
        default=None, metadata={"help": "Tiny preset: where the assets are cached (default: $RGPO_TRL_CACHE)."}
    )
    tiny_quick: bool = field(
        default=False, metadata={"help": "Tiny preset: use the smaller, faster-to-build assets (tests)."}
    )


def preset_defaults(preset: str, method: str, cache_dir: str | None = None, tiny_quick: bool = False) -> dict:
    """Default values of every argument for a preset and method (CLI and --config override them)."""
    from rgpo_trl.rlhf_methods import METHOD_OVERRIDES, check_method

    check_method(method)
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {list(PRESETS)}, got {preset!r}")
    shared = dict(
        num_generations=4,
        per_device_train_batch_size=16,  # 4 prompts x 4 completions per process
        gradient_accumulation_steps=1,
        num_iterations=2,  # every method reuses each batch twice, so only the loss differs
        logging_steps=1,
        save_strategy="steps",
        save_total_limit=2,
        temperature=1.0,
        log_completions=False,
        disable_dropout=True,
        remove_unused_columns=False,
    )
    if preset == "paper":
        defaults = dict(
            model_name_or_path="Qwen/Qwen2.5-1.5B-Instruct",
            reward_model_name_or_path="OpenAssistant/reward-model-deberta-v3-large-v2",
            dataset_name="Anthropic/hh-rlhf",
            dataset_data_dir="helpful-base",
            learning_rate=1e-6,
            max_prompt_length=256,
            max_completion_length=256,
            num_rl_iterations=400,
            window_start=300,
            window_end=400,
            bf16=True,
            dtype="bfloat16",
            save_steps=200,
            activation_checkpointing=True,
            report_to="tensorboard",
        )
    else:
        from accelerate import PartialState

        from rgpo_trl.tiny_hh import build_tiny_assets

        with PartialState().main_process_first():  # rank 0 builds (once, cached); the others then load
            assets = build_tiny_assets(cache_dir, quick=tiny_quick)
        defaults = dict(
            model_name_or_path=str(assets.policy_dir),
            reward_model_name_or_path=str(assets.reward_model_dir),
            dataset_name=str(assets.train_file),
            dataset_data_dir=None,
            learning_rate=1e-3,  # large enough for a visible KL to pi_old and to the reference in 60 iterations
            max_prompt_length=128,
            max_completion_length=24,
            num_rl_iterations=60,
            window_start=None,
            window_end=None,
            bf16=False,
            use_cpu=True,
            save_steps=60,
            report_to="none",
            reward_batch_size=64,
        )
    defaults.update(shared)
    defaults.update(METHOD_OVERRIDES[method])
    defaults.update(preset=preset, method=method, output_dir=f"runs/hh_rlhf_qwen/{preset}-{method}")
    return defaults


def _pre_parse(argv: list[str]) -> tuple[str, str, str | None, bool]:
    """Read --preset / --method / --cache_dir / --tiny_quick (CLI or YAML --config) before full parsing."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    pre.add_argument("--preset")
    pre.add_argument("--method")
    pre.add_argument("--cache_dir", "--cache-dir")
    pre.add_argument("--tiny_quick", "--tiny-quick", nargs="?", const="true")
    known, _ = pre.parse_known_args(argv)
    from_yaml = {}
    if known.config:
        with open(known.config) as f:
            from_yaml = yaml.safe_load(f) or {}
    preset = known.preset or from_yaml.get("preset", "tiny")
    method = known.method or from_yaml.get("method", "rgpo")
    quick = known.tiny_quick if known.tiny_quick is not None else from_yaml.get("tiny_quick", False)
    quick = str(quick).lower() in ("1", "true", "yes")
    return preset, method, known.cache_dir or from_yaml.get("cache_dir"), quick


def _check_hub_ids_first(argv: list[str], defaults: dict) -> None:
    """Fail before anything else (config validation, model loading) when a hub id cannot be loaded,
    e.g. offline without a local copy; the error names the id and the way out."""
    from trl import ModelConfig, TrlParser

    from rgpo_trl.hub_access import ensure_loadable

    light = TrlParser((HHScriptArguments, ModelConfig))
    dests = {f.name for dc in (HHScriptArguments, ModelConfig) for f in fields(dc)}
    light.set_defaults(**{k: v for k, v in defaults.items() if k in dests})
    script_args, model_args, _ = light.parse_args_and_config(
        args=argv, return_remaining_strings=True, fail_with_unknown_args=False
    )
    ensure_loadable(model_args.model_name_or_path, "model")
    ensure_loadable(script_args.reward_model_name_or_path, "model")
    if not script_args.dataset_name.endswith((".json", ".jsonl")):
        ensure_loadable(script_args.dataset_name, "dataset")


def parse_args(argv: list[str] | None = None, check_hub: bool = True):
    """Returns (script_args, training_args, model_args) with the preset's defaults applied.
    With ``check_hub`` (the default) hub ids are checked before the configs are built."""
    from trl import ModelConfig, TrlParser

    from rgpo_trl.rlhf_methods import trainer_and_config_class

    argv = sys.argv[1:] if argv is None else argv
    preset, method, cache_dir, tiny_quick = _pre_parse(argv)
    defaults = preset_defaults(preset, method, cache_dir, tiny_quick)
    _, config_class = trainer_and_config_class(method)
    if check_hub:
        _check_hub_ids_first(argv, defaults)
    parser = TrlParser((HHScriptArguments, config_class, ModelConfig))
    known_dests = {f.name for dc in (HHScriptArguments, config_class, ModelConfig) for f in fields(dc)}
    parser.set_defaults(**{k: v for k, v in defaults.items() if k in known_dests})
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    if script_args.preset != preset or script_args.method != method:
        raise ValueError("--preset/--method must be given once (CLI or --config), not overridden later")
    if model_args.model_name_or_path is None:
        raise ValueError("model_name_or_path is required")
    return script_args, training_args, model_args


def init_distributed_for_cpu_deepspeed() -> bool:
    """DeepSpeed without CUDA must run over gloo; otherwise ZeRO-3 fails while loading the reference
    model ("train_batch_size is not equal to ..."). Initialise it before anything builds the
    accelerator state. Returns True when it did."""
    import torch

    use_deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    use_cpu = os.environ.get("ACCELERATE_USE_CPU", "false").lower() == "true" or not torch.cuda.is_available()
    if not (use_deepspeed and use_cpu and "WORLD_SIZE" in os.environ):
        return False
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    return True


def main(argv: list[str] | None = None) -> dict:
    init_distributed_for_cpu_deepspeed()
    script_args, training_args, model_args = parse_args(argv)

    from accelerate import PartialState
    from transformers import AutoTokenizer
    from trl import get_peft_config

    from rgpo_trl.hh_data import load_hh_helpful_prompts
    from rgpo_trl.rewards import load_pairwise_reward
    from rgpo_trl.rlhf_methods import IterationMetricsWriter, trainer_and_config_class

    state = PartialState()
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")
    with state.main_process_first():
        dataset, stats = load_hh_helpful_prompts(
            script_args.dataset_name,
            script_args.dataset_split,
            tokenizer,
            script_args.max_prompt_length,
            data_dir=script_args.dataset_data_dir,
        )
    if script_args.max_train_prompts is not None:
        dataset = dataset.select(range(min(script_args.max_train_prompts, len(dataset))))
    if state.is_main_process:
        print(f"[rgpo-trl] prompts: {json.dumps(stats.as_dict())}; training on {len(dataset)}")

    reward_model = load_pairwise_reward(
        script_args.reward_model_name_or_path,
        batch_size=script_args.reward_batch_size,
        max_length=script_args.reward_max_length,
    )
    reward_funcs, reward_weights = [reward_model], [1.0]
    if script_args.preset == "tiny":
        from rgpo_trl.tiny_hh import gold_reward_func

        # The generator's gold quality score, logged as rewards/gold/mean with weight 0 (never
        # optimised), to watch the proxy reward model being over-optimised.
        reward_funcs.append(gold_reward_func)
        reward_weights.append(0.0)
    training_args.reward_weights = reward_weights
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    training_args.model_init_kwargs = {**model_init_kwargs, **(training_args.model_init_kwargs or {})}

    steps_per_iteration = training_args.num_iterations * max(
        1, training_args.steps_per_generation // training_args.gradient_accumulation_steps
    )
    if training_args.max_steps is None or training_args.max_steps <= 0:
        training_args.max_steps = script_args.num_rl_iterations * steps_per_iteration
    n_iters = training_args.max_steps // steps_per_iteration
    window = (
        script_args.window_start if script_args.window_start is not None else (3 * n_iters) // 4,
        script_args.window_end if script_args.window_end is not None else n_iters,
    )

    trainer_class, _ = trainer_and_config_class(script_args.method)
    trainer = trainer_class(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    if trainer.is_deepspeed_enabled:
        # Under ZeRO-3 the reward model was loaded partitioned (zero.Init); like GRPOTrainer does for
        # its own reward models, run it through a DeepSpeed inference engine.
        from trl.models.utils import prepare_deepspeed

        reward_model.model = prepare_deepspeed(reward_model.model, trainer.accelerator)
    else:
        reward_model.to(trainer.accelerator.device)
    trainer.add_callback(
        IterationMetricsWriter(training_args.output_dir, steps_per_iteration, window, script_args.method)
    )
    if state.is_main_process:
        print(
            f"[rgpo-trl] {script_args.method} ({script_args.preset} preset): {n_iters} iterations x "
            f"{steps_per_iteration} optimizer steps, {state.num_processes} process(es), "
            f"metrics -> {training_args.output_dir}/metrics.jsonl"
        )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    summary = {}
    summary_path = os.path.join(training_args.output_dir, "summary.json")
    if state.is_main_process and os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
        summary["world_size"] = state.num_processes
        with open(summary_path, "w") as f:
            json.dump(summary, f, indent=2)
    state.wait_for_everyone()
    return summary


if __name__ == "__main__":
    main()
