# Copyright 2026 The rgpo-trl developers. Apache-2.0.
"""RGPO on Anthropic HH-RLHF (helpful) with a pairwise DeBERTa reward model: the paper's Sec. 7.3.

Presets are YAML files in ``recipes/configs/`` passed with ``--config``, as for any TRL script:

* ``hh_rlhf_paper.yaml``: Qwen/Qwen2.5-1.5B-Instruct, OpenAssistant/reward-model-deberta-v3-large-v2,
  Anthropic/hh-rlhf helpful-base (43,835 prompts), 4 prompts x 4 completions per iteration, lr 1e-6,
  256 prompt / 256 completion tokens, 400 iterations, window 300-400, bf16. Needs GPUs and the hub (or
  local copies: pass paths instead of ids)::

      accelerate launch --config_file recipes/accelerate_configs/single_gpu.yaml \\
          recipes/hh_rlhf_qwen.py --config recipes/configs/hh_rlhf_paper.yaml --method rgpo --seed 1

* ``hh_rlhf_tiny.yaml``: the embedded offline default, the same recipe on CPU on the tiny-HH world
  (``world: tiny``; ``tiny-hh/<asset>`` paths are built once and cached, see `rgpo_trl.tiny_hh`)::

      accelerate launch --config_file recipes/accelerate_configs/cpu.yaml recipes/hh_rlhf_qwen.py \\
          --config recipes/configs/hh_rlhf_tiny.yaml

* ``hh_rlhf_tiny_paper.yaml``: the paper's protocol (400 iterations) in the tiny world.

``--method`` picks a registered method (`rgpo_trl.rlhf.methods`: rgpo, rgpo_old, ppo, grpo, ppo_clip_kl, sapo,
cispo, dpo, sft); it applies its loss settings over the preset. Precedence: field defaults < method < YAML <
command line. Any RGPOConfig / GRPOConfig / ModelConfig field can be set. The default output directory is
``runs/hh_rlhf_qwen/<preset>-<method>``. Per-iteration metrics go to ``<output_dir>/metrics.jsonl`` (and
``metrics.csv``), the window averages the paper reports to ``summary.json``. The console shows a progress bar
and a compact table every ``table_every`` iterations; ``--log_level info`` prints TRL's per-step metric dicts
too. It ends like TRL's ``grpo.py``: the model and its card (``README.md``, tagged ``rgpo``) in
``output_dir``, and with ``--push_to_hub`` both pushed (refused up front when the hub is offline).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trl import ScriptArguments

logger = logging.getLogger("rgpo_trl.recipe")
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
TINY_PREFIX = "tiny-hh/"  # `tiny-hh/<asset>` in a preset names an asset of the embedded tiny-HH world


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
            "cispo, dpo, or sft (no training: the initial policy through the same evaluation)."
        },
    )
    trainer: str = field(
        default="sync",
        metadata={
            "help": "'sync': TRL's GRPOTrainer family, generation and training in turn; 'async': TRL's "
            "asynchronous trainer (trl.experimental.async_grpo), where samples arrive up to max_staleness "
            "weight versions old (methods rgpo, rgpo_old, grpo; its fields such as --max_staleness apply).",
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


def config_name(argv: list[str]) -> str:
    """The name of the ``--config`` YAML (``hh_rlhf_tiny_paper.yaml`` -> ``tiny_paper``), found as TrlParser
    finds it: the default output directory is per config file, so two presets never share one."""
    if "--config" not in argv:
        return "default"
    path = Path(argv[argv.index("--config") + 1])
    if not path.is_file():
        known = sorted(p.stem.removeprefix("hh_rlhf_") for p in CONFIG_DIR.glob("hh_rlhf_*.yaml"))
        raise ValueError(
            f"config file {str(path)!r} not found; the presets are recipes/configs/hh_rlhf_<name>.yaml "
            f"for <name> in {', '.join(known)}"
        )
    return path.stem.removeprefix("hh_rlhf_")


def check_hub_ids(script_args, model_args) -> None:
    """Fail before anything is built (a paper config without a GPU fails on bf16 first) when a hub id of the
    model, reward model or dataset cannot be loaded, e.g. offline without a local copy."""
    from rgpo_trl.rlhf.hub_access import ensure_loadable

    for value, kind in (
        (model_args.model_name_or_path, "model"),
        (script_args.reward_model_name_or_path, "model"),
        (script_args.dataset_name, "dataset"),
    ):
        if value and not value.startswith(TINY_PREFIX) and not value.endswith((".json", ".jsonl")):
            ensure_loadable(value, kind)


TINY_ASSETS = ("policy", "reward_model", "train", "test", "validation")


def unknown_tiny_asset(script_args, model_args) -> None:
    """Refuse a ``tiny-hh/<asset>`` path naming no asset (before anything is built)."""
    for name, obj in (
        ("heldout_dataset_name", script_args),
        ("validation_dataset_name", script_args),
        ("model_name_or_path", model_args),
        ("reward_model_name_or_path", script_args),
        ("dataset_name", script_args),
    ):
        value = str(getattr(obj, name) or "")
        if value.startswith(TINY_PREFIX) and value.removeprefix(TINY_PREFIX) not in TINY_ASSETS:
            raise ValueError(f"{name}={value!r}: tiny-hh assets are {list(TINY_ASSETS)}")
    if script_args.tiny_version == 2 and str(script_args.validation_dataset_name).endswith("/validation"):
        raise ValueError(
            "validation_dataset_name: tiny-hh/validation exists in world v3 only (tiny_version 3)"
        )


def resolve_tiny_assets(script_args, model_args) -> None:
    """Replace ``tiny-hh/<asset>`` paths by the cached tiny-HH assets, building them once (rank 0 first)."""
    paths = {
        "heldout_dataset_name": script_args,
        "validation_dataset_name": script_args,
        "model_name_or_path": model_args,
        "reward_model_name_or_path": script_args,
        "dataset_name": script_args,
    }
    if not any(str(getattr(obj, name) or "").startswith(TINY_PREFIX) for name, obj in paths.items()):
        return
    from accelerate import PartialState

    from rgpo_trl.tiny_hh import build_tiny_assets

    with PartialState().main_process_first():
        assets = build_tiny_assets(
            script_args.cache_dir, quick=script_args.tiny_quick, version=script_args.tiny_version
        )
    known = {
        "policy": assets.policy_dir,
        "reward_model": assets.reward_model_dir,
        "train": assets.train_file,
        "test": assets.test_file,
    }
    if assets.validation_file.exists():
        known["validation"] = assets.validation_file
    for name, obj in paths.items():
        value = str(getattr(obj, name))
        if value.startswith(TINY_PREFIX):
            asset = value.removeprefix(TINY_PREFIX)
            if asset not in known:
                raise ValueError(
                    f"{name}={value!r}: tiny-hh v{script_args.tiny_version} assets are {sorted(known)}"
                )
            setattr(obj, name, str(known[asset]))


def parse_args(argv: list[str] | None = None, check_hub: bool = True, resolve_assets: bool = True):
    """(script_args, training_args, model_args) from TrlParser's ``parse_args_and_config`` (YAML via
    ``--config``). The method decides the config class, so a first pass reads the script's own fields (and the
    model's, to check hub ids before anything is built); the second parses everything with the method's loss
    settings as defaults, which the YAML and the command line override: field defaults < method < YAML <
    command line."""
    from trl import ModelConfig, TrlParser

    argv = list(sys.argv[1:] if argv is None else argv)
    run_name = config_name(argv)
    first, model_first, _ = TrlParser((HHScriptArguments, ModelConfig), add_help=False).parse_args_and_config(
        args=argv, return_remaining_strings=True
    )
    if first.trainer not in ("sync", "async"):
        raise ValueError(f"trainer must be 'sync' or 'async', got {first.trainer!r}")
    if first.world not in WORLDS:
        raise ValueError(f"world must be one of {sorted(WORLDS)}, got {first.world!r}")
    if check_hub and not {"-h", "--help"} & set(argv):  # --help is printed by the second parse, offline too
        check_hub_ids(first, model_first)
    parse = _parse_async if first.trainer == "async" else _parse_sync
    script_args, training_args, model_args = parse(argv, first, run_name)
    if model_args.model_name_or_path is None:
        raise ValueError("model_name_or_path is required")
    for name in ("heldout_samples", "validation_samples", "validation_every"):
        if getattr(script_args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(script_args, name)}")
    if script_args.validation_prompts < 0:
        raise ValueError(
            f"validation_prompts must be >= 0 (0 disables), got {script_args.validation_prompts}"
        )
    if script_args.tiny_version not in (2, 3):
        raise ValueError(f"tiny_version must be 2 or 3, got {script_args.tiny_version!r}")
    if training_args.push_to_hub:
        refuse_offline_push(training_args)
    if resolve_assets:  # builds the tiny-HH assets if missing (minutes)
        resolve_tiny_assets(script_args, model_args)
    return script_args, training_args, model_args


def _parse_sync(argv, first, run_name):
    """The second pass of `parse_args` for the GRPOTrainer family (and DPO)."""
    from rgpo_trl.rlhf.methods import get_rlhf_method

    method = get_rlhf_method(first.method)
    parser = make_parser(method.config_class)
    parser.set_defaults(
        **method.config, method=method.name, output_dir=f"runs/hh_rlhf_qwen/{run_name}-{method.name}"
    )
    if method.online:
        script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
        script_args.unused_preset_settings = {}
    else:  # an offline method (DPO) does not read the preset's generation settings; they are listed, not lost
        script_args, training_args, model_args, rest = parser.parse_args_and_config(
            args=argv, return_remaining_strings=True, fail_with_unknown_args=False
        )
        script_args.unused_preset_settings = dict(
            zip([k.lstrip("-") for k in rest[::2]], rest[1::2], strict=True)
        )
    return script_args, training_args, model_args


def _parse_async(argv, first, run_name):
    """`parse_args` for --trainer async: the method's asynchronous trainer config. Preset settings it has no
    field for (num_iterations: no batch reuse; disable_dropout) are listed in ``unused_preset_settings``; an
    unknown command-line option is an error."""
    import torch

    from rgpo_trl.rlhf.async_methods import get_async_method

    method = get_async_method(first.method)
    if first.async_rollout == "auto":
        first.async_rollout = "vllm" if torch.cuda.is_available() else "in_process"
    if first.rollout_lag is not None and first.async_rollout == "vllm":
        raise ValueError("rollout_lag needs async_rollout='in_process' (a vLLM server generates freely)")
    parser = make_parser(method.config_class, model_config_without({"dtype"}))
    parser.set_defaults(
        **method.config, method=method.name, output_dir=f"runs/hh_rlhf_qwen/{run_name}-{method.name}-async"
    )
    script_args, training_args, model_args, rest = parser.parse_args_and_config(
        args=argv, return_remaining_strings=True, fail_with_unknown_args=False
    )
    unknown = [k for k in rest[::2] if k in argv]
    if unknown:
        raise ValueError(
            f"{', '.join(unknown)}: not a field of the recipe or of {method.config_class.__name__}"
        )
    script_args.unused_preset_settings = dict(
        zip([k.lstrip("-") for k in rest[::2]], rest[1::2], strict=True)
    )
    script_args.async_rollout = first.async_rollout  # resolved above
    model_args.dtype = training_args.dtype  # one --dtype, declared by the trainer config
    lag = script_args.rollout_lag
    if lag is not None and not 1 <= lag <= training_args.max_staleness:
        raise ValueError(
            f"rollout_lag must be in [1, max_staleness = {training_args.max_staleness}], got {lag}: older "
            "samples are dropped, and TRL's loader reads one micro-batch ahead of the weights it trains"
        )
    if model_args.attn_implementation is not None:
        raise ValueError(
            f"attn_implementation={model_args.attn_implementation!r} cannot be used with --trainer async: "
            "TRL's asynchronous trainer packs samples into prefix trees and runs its own tree attention"
        )
    if training_args.token_budget is None and script_args.async_rollout != "vllm":
        training_args.token_budget = 0  # the in-process worker: a fixed number of samples per micro-batch
    if script_args.validation_prompts:
        raise ValueError(
            "validation_prompts must be 0 with --trainer async (the window evaluation is sync-only)"
        )
    return script_args, training_args, model_args


WORLDS = {"hh", "tiny"}
# printed as it is by --help (RawDescriptionHelpFormatter); a backslash at a line's end continues the line
DESCRIPTION = """RGPO (and the paper's baselines) on Anthropic HH-RLHF with a pairwise DeBERTa reward model.

Run a preset: --config recipes/configs/hh_rlhf_{tiny,tiny_paper,paper}.yaml; \
pick the loss with --method (rgpo,
rgpo_old, ppo, grpo, ppo_clip_kl, sapo, cispo, dpo, sft; \
rgpo, rgpo_old and grpo also with --trainer async). The
recipe's own options come first below, then TRL's GRPOConfig / RGPOConfig fields (RGPO's: gate, gate_params,
ratio_mode, kl_controller, kl_coef, kl_target, kl_coef_min, kl_coef_max, beta) and ModelConfig's (PEFT:
--use_peft --lora_r 16)."""


def model_config_without(names: set[str]):
    """TRL's ModelConfig without the fields in ``names``, for a trainer config that declares them itself
    (AsyncGRPOConfig's ``dtype``): one option, read from the trainer config."""
    from dataclasses import fields, make_dataclass

    from trl import ModelConfig

    kept = [
        (f.name, f.type, field(default=f.default, default_factory=f.default_factory, metadata=f.metadata))
        for f in fields(ModelConfig)
        if f.name not in names
    ]
    return make_dataclass("ModelConfig", kept, namespace={"__post_init__": ModelConfig.__post_init__})


def make_parser(config_class, model_config=None):
    """The recipe's TrlParser: a description at the top of --help, the script's own fields first."""
    from trl import ModelConfig, TrlParser

    usage = (
        "accelerate launch [--config_file recipes/accelerate_configs/<launch>.yaml] recipes/hh_rlhf_qwen.py "
        "--config recipes/configs/hh_rlhf_<preset>.yaml [--method METHOD] [--<field> VALUE ...]"
    )
    return TrlParser(
        (HHScriptArguments, config_class, model_config or ModelConfig),
        usage=usage,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def refuse_offline_push(training_args) -> None:
    """``--push_to_hub`` needs the hub: refused before training when it is offline (the model card is still
    written to output_dir at the end)."""
    from rgpo_trl.rlhf.hub_access import hub_offline

    if hub_offline("model"):
        raise ValueError(
            "push_to_hub=True but the Hugging Face Hub is offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE): "
            f"the model and its card are saved to {training_args.output_dir!r} only. Unset the offline "
            "variables and log in (`hf auth login`) to push, or drop --push_to_hub."
        )


def evaluate_prompts(
    model,
    ref_model,
    tokenizer,
    script_args,
    reward_model,
    prompts,
    sampling,
    samples: int = 1,
    per_completion: bool = False,
):
    """The shared evaluation (`rgpo_trl.rlhf.evaluation`) of ``model`` on ``prompts``, ``samples`` completions
    each; gold where the world has one."""
    from rgpo_trl.rlhf.evaluation import evaluate_policy, repeat_prompts

    gold_fn = None
    if script_args.world == "tiny":
        from rgpo_trl.tiny_hh import gold_for

        _, gold_fn = gold_for(script_args.tiny_version)
    result = evaluate_policy(
        model,
        tokenizer,
        repeat_prompts(prompts, samples),
        reward_model,
        ref_model=ref_model,
        gold_fn=gold_fn,
        per_completion=per_completion,
        **sampling,
    )
    result.update(prompts=len(prompts), samples_per_prompt=samples)
    return result


def evaluate_on(
    model,
    ref_model,
    tokenizer,
    script_args,
    reward_model,
    name,
    split,
    sampling,
    n: int,
    samples: int = 1,
    per_completion: bool = False,
) -> dict:
    """`evaluate_prompts` on the first ``n`` prompts of (name, split)."""
    from rgpo_trl.rlhf.hh_data import load_hh_helpful_prompts

    n = max(n, 1)
    prompts, _ = load_hh_helpful_prompts(
        name,
        split,
        tokenizer,
        script_args.max_prompt_length,
        data_dir=script_args.dataset_data_dir,
        max_rows=4 * n,
    )
    prompts = [p["prompt"] for p in prompts.select(range(min(n, len(prompts))))]
    result = evaluate_prompts(
        model, ref_model, tokenizer, script_args, reward_model, prompts, sampling, samples, per_completion
    )
    result.update(dataset=name, split=None if os.path.isfile(name) else split, seed=sampling["seed"])
    return result


def summary_window(script_args, n_iters: int) -> tuple[int, int]:
    """The summary window (start exclusive, end): the given bounds, else the last quarter of the run."""
    start = script_args.window_start if script_args.window_start is not None else (3 * n_iters) // 4
    return start, script_args.window_end if script_args.window_end is not None else n_iters


def validation_callback(
    script_args,
    training_args,
    tokenizer,
    prompts,
    reward_model,
    ref_model_fn,
    sampling,
    steps_per_iteration: int,
    window: tuple[int, int],
):
    """The `WindowEvaluation` on the validation prompts: every ``validation_every`` iterations in the window
    and at its end; None when ``validation_prompts`` is 0."""
    from rgpo_trl.rlhf.evaluation import WindowEvaluation

    if script_args.validation_prompts == 0:
        return None
    lo, hi = window
    at = [*range(hi, lo, -script_args.validation_every)][::-1]

    def evaluate(model, prompts, seed):
        return evaluate_prompts(
            model,
            ref_model_fn(),
            tokenizer,
            script_args,
            reward_model,
            prompts,
            {**sampling, "seed": seed},
            script_args.validation_samples,
        )

    out = training_args.output_dir
    return WindowEvaluation(
        os.path.join(out, "validation.jsonl"),
        os.path.join(out, "validation.json"),
        prompts,
        at,
        steps_per_iteration,
        evaluate,
        seed=1000 * training_args.seed,
    )


def split_validation(dataset, script_args, tokenizer):
    """(training prompts, validation prompts as a list): the first ``validation_prompts`` prompts of
    ``validation_dataset_name``, or `hold_out_validation` of the training split; a training prompt equal to a
    validation prompt leaves training either way."""
    from rgpo_trl.rlhf.hh_data import hold_out_validation, load_hh_helpful_prompts

    n, name = script_args.validation_prompts, script_args.validation_dataset_name
    if name is None or n == 0:
        train, validation = hold_out_validation(dataset, n)
        return train, list(validation["prompt"])
    prompts, _ = load_hh_helpful_prompts(
        name, "train", tokenizer, script_args.max_prompt_length, max_rows=4 * n
    )
    if len(prompts) < n:
        raise ValueError(f"validation_prompts={n}, but {name} has {len(prompts)} prompts")
    validation = list(prompts.select(range(n))["prompt"])
    held = {json.dumps(p, sort_keys=True) for p in validation}
    keep = [i for i, p in enumerate(dataset["prompt"]) if json.dumps(p, sort_keys=True) not in held]
    return dataset.select(keep), validation


def write_heldout(
    model, ref_model, tokenizer, script_args, output_dir, reward_model, sampling, name: str = "heldout.json"
) -> dict:
    """The same held-out evaluation for every method, written to ``name`` (heldout.json); the returned result
    also has every completion's scores (``per_completion``, not written), for the demo's paired comparison."""
    result = evaluate_on(
        model,
        ref_model,
        tokenizer,
        script_args,
        reward_model,
        script_args.heldout_dataset_name or script_args.dataset_name,
        script_args.dataset_test_split,
        sampling,
        script_args.heldout_prompts,
        script_args.heldout_samples,
        per_completion=True,
    )
    written = {k: v for k, v in result.items() if k != "per_completion"}
    with open(os.path.join(output_dir, name), "w") as f:
        json.dump(written, f, indent=2)
    logger.info("held-out: %s", json.dumps(written))
    return result


def print_comparison(
    trained, model_args, tokenizer, script_args, training_args, reward_model, sampling
) -> None:
    """The demo's ending: the initial policy through the same held-out evaluation (its own reference: KL_ref
    0), the table of both, what happened, and where the results are (heldout_initial.json next to
    heldout.json)."""
    from transformers import AutoModelForCausalLM

    from rgpo_trl.rlhf.evaluation import comparison_table

    device = next(reward_model.model.parameters()).device
    initial_model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path).to(device).eval()
    out = training_args.output_dir
    initial = write_heldout(
        initial_model,
        initial_model,
        tokenizer,
        script_args,
        out,
        reward_model,
        sampling,
        name="heldout_initial.json",
    )
    where = [
        f"metrics: {os.path.join(out, 'metrics.jsonl')}",
        f"held-out: {os.path.join(out, 'heldout.json')}",
    ]
    if script_args.save_final_model:
        where = [f"model: {out}", f"model card: {os.path.join(out, 'README.md')}", *where]
    print("\n" + comparison_table(initial, trained, script_args.method) + "\n" + "\n".join(where), flush=True)


def run_offline(script_args, training_args, model_args, tokenizer, state) -> dict:
    """An offline method: DPO (TRL's DPOTrainer on the dataset's chosen/rejected pairs from the same initial
    policy and reference, for as many optimizer steps as the online methods take) or ``sft`` (no training: the
    initial policy itself, the baseline every method starts from). Then the shared evaluation on training
    prompts (summary.json, the counterpart of the online methods' window) and on held-out prompts
    (heldout.json)."""
    from transformers import AutoModelForCausalLM
    from trl import get_peft_config

    from rgpo_trl.rlhf.hh_data import load_hh_helpful_prompts, load_hh_preference_pairs
    from rgpo_trl.rlhf.methods import get_rlhf_method
    from rgpo_trl.rlhf.rewards import load_pairwise_reward

    method = get_rlhf_method(script_args.method)
    unused = script_args.unused_preset_settings
    if state.is_main_process and unused:
        logger.info("%s does not read these settings: %s", script_args.method, unused)
    info: dict = {}
    if state.num_processes > 1 and script_args.validation_prompts:
        raise ValueError(
            "validation_prompts: the validation evaluation runs in single-process runs only; set 0"
        )
    reward_model = load_pairwise_reward(
        script_args.reward_model_name_or_path,
        batch_size=script_args.reward_batch_size,
        max_length=script_args.reward_max_length,
    )
    sampling = {
        "max_new_tokens": int(unused.get("max_completion_length", 64)),
        "temperature": float(unused.get("temperature", 1.0)),
        "seed": training_args.seed,
    }
    validation_prompts: list = []
    if script_args.validation_prompts:  # the same validation prompts as the online methods, out of training
        with state.main_process_first():
            prompts, _ = load_hh_helpful_prompts(
                script_args.dataset_name,
                script_args.dataset_train_split,
                tokenizer,
                script_args.max_prompt_length,
                data_dir=script_args.dataset_data_dir,
            )
        _, validation_prompts = split_validation(prompts, script_args, tokenizer)
    if method.trainer_class is None:  # the initial policy, evaluated as it is (its own reference: KL_ref = 0)
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path).to(state.device)
        ref_model, device = model, state.device
        info.update(optimizer_steps=0)
        if validation_prompts:  # one evaluation: the policy does not change
            result = evaluate_prompts(
                model,
                ref_model,
                tokenizer,
                script_args,
                reward_model.to(device),
                validation_prompts,
                sampling,
                script_args.validation_samples,
            )
            os.makedirs(training_args.output_dir, exist_ok=True)
            with open(os.path.join(training_args.output_dir, "validation.json"), "w") as f:
                json.dump({"iterations": [0], "expected_iterations": [0], **result}, f, indent=2)
    else:
        with state.main_process_first():
            pairs, stats = load_hh_preference_pairs(
                script_args.dataset_name,
                script_args.dataset_train_split,
                tokenizer,
                script_args.max_prompt_length,
                data_dir=script_args.dataset_data_dir,
            )
        if validation_prompts:
            held = {json.dumps(p, sort_keys=True) for p in validation_prompts}
            pairs = pairs.filter(lambda r: json.dumps(r["prompt"], sort_keys=True) not in held)
        if script_args.max_train_prompts is not None:
            pairs = pairs.select(range(min(script_args.max_train_prompts, len(pairs))))
        if training_args.max_steps is None or training_args.max_steps <= 0:
            training_args.max_steps = script_args.num_rl_iterations * int(unused.get("num_iterations", 2))
        trainer = method.trainer_class(
            model=model_args.model_name_or_path,
            args=training_args,
            train_dataset=pairs,
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
        )
        reward_model.to(trainer.accelerator.device)
        steps_per_iteration = int(unused.get("num_iterations", 2))
        n_iters = training_args.max_steps // steps_per_iteration
        window = summary_window(script_args, n_iters)
        validation = validation_callback(
            script_args,
            training_args,
            tokenizer,
            validation_prompts,
            reward_model,
            lambda: trainer.ref_model,
            sampling,
            steps_per_iteration,
            window,
        )
        if validation is not None:
            trainer.add_callback(validation)
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        finish(trainer, script_args, training_args)
        model, ref_model = trainer.accelerator.unwrap_model(trainer.model), trainer.ref_model
        device = trainer.accelerator.device
        info.update(pairs=len(pairs), optimizer_steps=trainer.state.global_step)
    if state.num_processes > 1:
        logger.warning("the %s evaluation runs in single-process runs only; skipped", method.name)
        return {}
    reward_model.to(device)
    n_train = (
        script_args.heldout_prompts
        if script_args.train_eval_prompts is None
        else script_args.train_eval_prompts
    )
    summary = evaluate_on(
        model,
        ref_model,
        tokenizer,
        script_args,
        reward_model,
        script_args.dataset_name,
        script_args.dataset_train_split,
        sampling,
        n_train,
    )
    summary.update(
        method=script_args.method,
        world_size=state.num_processes,
        **info,
        unused_settings=unused,
        evaluated_on="training prompts, one sample each" + (" after training" if info.get("pairs") else ""),
    )
    os.makedirs(training_args.output_dir, exist_ok=True)
    with open(os.path.join(training_args.output_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if script_args.heldout_prompts > 0:
        write_heldout(
            model, ref_model, tokenizer, script_args, training_args.output_dir, reward_model, sampling
        )
    logger.info("%s: %s", script_args.method, json.dumps(summary))
    return summary


def build_async_trainer(
    script_args, training_args, model_args, tokenizer, dataset, reward_funcs, reward_weights
):
    """(method, trainer) for --trainer async: the method's asynchronous trainer with the in-process rollout
    worker (a thread generating with transformers) or, on GPUs, TRL's vLLM worker; the vLLM path fails up
    front when vllm is not installed."""
    import importlib.util

    from trl import get_peft_config

    from rgpo_trl.async_rgpo import InProcessRolloutWorker, InProcessWeightTransfer, install_cpu_shims
    from rgpo_trl.cli import UsageError
    from rgpo_trl.rlhf.async_methods import get_async_method

    method = get_async_method(script_args.method)
    rollout = script_args.async_rollout  # resolved by the parser: in_process or vllm
    if rollout == "vllm" and any(w != 1.0 for w in reward_weights):
        raise UsageError(
            f"reward weights {reward_weights} with async_rollout='vllm': TRL's vLLM worker adds every reward "
            "function with weight 1, so the tiny world's gold score (weight 0) would be trained on; use "
            "--async_rollout in_process"
        )
    workers = {}
    if rollout == "in_process":
        install_cpu_shims()
        worker = InProcessRolloutWorker(
            model_args.model_name_or_path,
            tokenizer,
            dataset,
            reward_funcs,
            training_args,
            reward_weights=reward_weights,
            lag=script_args.rollout_lag,
        )
        workers = {"rollout_worker": worker, "weight_transfer": InProcessWeightTransfer(worker)}
    elif importlib.util.find_spec("vllm") is None:
        raise UsageError(
            "async_rollout='vllm' needs vllm (pip install vllm) and a running server: "
            f"`trl vllm-serve --model {model_args.model_name_or_path}` (--vllm_server_base_url, default "
            f"{training_args.vllm_server_base_url}); without a GPU use --async_rollout in_process"
        )
    trainer = method.trainer_class(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        **workers,
    )
    return method, trainer


def plain_policy(path: str, device, trained=None):
    """The policy at ``path`` in float32 with standard attention, on ``device``, holding ``trained``'s weights
    if given (a PEFT model's adapter merged in): TRL's asynchronous trainer runs packed tree attention, which
    cannot generate. Called after training and saving."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if trained is not None:
        if hasattr(trained, "merge_and_unload"):  # PEFT: the adapter folded into the base weights
            trained = trained.merge_and_unload()
        model.load_state_dict({k: v.float() for k, v in trained.state_dict().items()})
    return model.to(device).eval()


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


def setup_logging(training_args) -> None:
    """The recipe logs through `logging` (``[rgpo-trl] ...`` on the main process); transformers and TRL at the
    run's ``--log_level``; their deprecation notices about gradient checkpointing, a feature the recipe never
    sets, are silenced."""
    import warnings

    import transformers

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[rgpo-trl] %(message)s"))
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO if training_args.should_log else logging.WARNING)
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*", category=FutureWarning)


def verbose_console(training_args) -> bool:
    """TRL's per-step metric dicts on the console: only when asked for with --log_level info/debug."""
    return training_args.log_level in ("info", "debug")


def finish(trainer, script_args, training_args) -> None:
    """End like TRL's grpo.py: save the model and write its card (README.md, tagged rgpo) to output_dir; push
    both with --push_to_hub (refused offline before training, see `refuse_offline_push`)."""
    if script_args.save_final_model:
        trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.create_model_card(dataset_name=script_args.dataset_name)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)


def main(argv: list[str] | None = None) -> dict:
    from rgpo_trl.cli import UsageError, plain_output_when_piped, quiet_cpu_libraries

    quiet_cpu_libraries()
    init_distributed_for_cpu_deepspeed()
    try:  # a bad preset, field or value: one line from the command line (__main__); nothing built yet
        script_args, training_args, model_args = parse_args(argv, resolve_assets=False)
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err)) from err
    try:  # an unknown tiny-hh/<asset> name is an input error; a failing asset build is not
        unknown_tiny_asset(script_args, model_args)
    except ValueError as err:
        raise UsageError(str(err)) from err
    resolve_tiny_assets(script_args, model_args)
    setup_logging(training_args)
    if plain_output_when_piped():  # a log file gets plain lines, no progress-bar frames
        training_args.disable_tqdm = True

    from accelerate import PartialState
    from transformers import AutoTokenizer
    from trl import get_peft_config

    from rgpo_trl.rlhf.hh_data import load_hh_helpful_prompts
    from rgpo_trl.rlhf.methods import IterationMetricsWriter, get_rlhf_method, quiet_console
    from rgpo_trl.rlhf.rewards import load_pairwise_reward
    from rgpo_trl.trainer import optimizer_steps_per_iteration

    state = PartialState()
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")
    if not get_rlhf_method(script_args.method).online:
        return run_offline(script_args, training_args, model_args, tokenizer, state)
    with state.main_process_first():
        dataset, stats = load_hh_helpful_prompts(
            script_args.dataset_name,
            script_args.dataset_train_split,
            tokenizer,
            script_args.max_prompt_length,
            data_dir=script_args.dataset_data_dir,
        )
    dataset, validation_prompts = split_validation(dataset, script_args, tokenizer)
    if script_args.max_train_prompts is not None:
        dataset = dataset.select(range(min(script_args.max_train_prompts, len(dataset))))
    if state.is_main_process:
        logger.info("prompts: %s; training on %d", json.dumps(stats.as_dict()), len(dataset))

    reward_model = load_pairwise_reward(
        script_args.reward_model_name_or_path,
        batch_size=script_args.reward_batch_size,
        max_length=script_args.reward_max_length,
    )
    reward_funcs, reward_weights = [reward_model], [1.0]
    if script_args.world == "tiny":
        from rgpo_trl.tiny_hh import gold_for

        # The generator's gold quality score, logged as rewards/gold/mean with weight 0 (never
        # optimised), to watch the proxy reward model being over-optimised.
        reward_funcs.append(gold_for(script_args.tiny_version)[1])
        reward_weights.append(0.0)
    if script_args.trainer == "sync":  # the async worker weighs the rewards itself
        training_args.reward_weights = reward_weights
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    if script_args.trainer == "async":  # its packed rows need its own tree attention
        del model_init_kwargs["attn_implementation"]
    training_args.model_init_kwargs = {**model_init_kwargs, **(training_args.model_init_kwargs or {})}

    # one iteration: a generation batch and its reuse (sync); one optimizer step (async: generation never
    # pauses)
    steps_per_iteration = optimizer_steps_per_iteration(training_args) if script_args.trainer == "sync" else 1
    if training_args.max_steps is None or training_args.max_steps <= 0:
        training_args.max_steps = script_args.num_rl_iterations * steps_per_iteration
    n_iters = training_args.max_steps // steps_per_iteration
    window = summary_window(script_args, n_iters)

    if script_args.trainer == "async":
        if state.is_main_process and script_args.unused_preset_settings:
            logger.info(
                "the asynchronous trainer does not read these settings: %s",
                script_args.unused_preset_settings,
            )
        method, trainer = build_async_trainer(
            script_args, training_args, model_args, tokenizer, dataset, reward_funcs, reward_weights
        )
    else:
        method = get_rlhf_method(script_args.method)
        trainer = method.trainer_class(
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
        IterationMetricsWriter(
            training_args.output_dir,
            steps_per_iteration,
            window,
            method,
            state.num_processes,
            table_every=script_args.table_every,
        )
    )
    if not verbose_console(training_args):
        quiet_console(trainer)
    sampling = {
        "max_new_tokens": training_args.max_completion_length,
        "temperature": training_args.temperature,
        "seed": training_args.seed,
    }
    validation = validation_callback(
        script_args,
        training_args,
        tokenizer,
        validation_prompts,
        reward_model,
        lambda: trainer.ref_model,
        sampling,
        steps_per_iteration,
        window,
    )
    if validation is not None:
        trainer.add_callback(validation)
    if state.is_main_process:
        logger.info(
            "%s (%s world): %d iterations x %d optimizer steps, %d process(es), metrics -> %s/metrics.jsonl",
            script_args.method,
            script_args.world,
            n_iters,
            steps_per_iteration,
            state.num_processes,
            training_args.output_dir,
        )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    finish(trainer, script_args, training_args)
    if script_args.heldout_prompts > 0 and state.num_processes > 1:
        logger.warning("held-out evaluation runs in single-process runs only; skipped")
    elif script_args.heldout_prompts > 0:
        policy, reference = (
            trainer.accelerator.unwrap_model(trainer.model),
            getattr(trainer, "ref_model", None),
        )
        if script_args.trainer == "async":  # packed tree attention cannot generate: plain copies evaluate
            device = trainer.accelerator.device
            policy = plain_policy(model_args.model_name_or_path, device, policy)
            reference = plain_policy(model_args.model_name_or_path, device)
        trained = write_heldout(
            policy,
            reference,
            tokenizer,
            script_args,
            training_args.output_dir,
            reward_model,
            sampling,
        )
        if script_args.heldout_compare_initial:
            print_comparison(
                trained, model_args, tokenizer, script_args, training_args, reward_model, sampling
            )
    summary = {}
    summary_path = os.path.join(training_args.output_dir, "summary.json")
    if state.is_main_process and os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    state.wait_for_everyone()
    return summary


if __name__ == "__main__":
    from rgpo_trl.cli import UsageError, run_main
    from rgpo_trl.rlhf.hub_access import HubUnavailableError

    sys.exit(run_main(main, errors=(UsageError, HubUnavailableError)))
