"""The HH-RLHF recipe's command line to ``(script_args, training_args, model_args)``, checked.

`parse_recipe_args` reads the command line with TrlParser's ``parse_args_and_config`` (YAML presets via
``--config``) in two passes, because the method decides the trainer config class: a first pass reads the
recipe's own fields and the model's (to check hub ids before anything is built), the second parses everything
with the method's loss settings as defaults, which the YAML and the command line override: field defaults <
method < YAML < command line. Every bad input is a `UsageError`, reported on one line by `rgpo_trl.cli`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from trl import ModelConfig, TrlParser

from ..cli import UsageError
from .arguments import HHScriptArguments, make_recipe_parser, model_config_without
from .hub_access import ensure_loadable, hub_offline
from .methods import get_rlhf_method
from .offline import preset_generation
from .worlds import TINY_PREFIX, WORLDS, unknown_tiny_asset

CONFIG_DIR = (
    Path(__file__).resolve().parents[2] / "recipes" / "configs"
)  # the presets of a repository checkout


def config_name(argv: list[str], config_dir: Path = CONFIG_DIR) -> str:
    """The name of the ``--config`` YAML (``hh_rlhf_tiny_paper.yaml`` -> ``tiny_paper``), found as TrlParser
    finds it: the default output directory is per config file, so two presets never share one."""
    if "--config" not in argv:
        return "default"
    path = Path(argv[argv.index("--config") + 1])
    if not path.is_file():
        known = sorted(p.stem.removeprefix("hh_rlhf_") for p in config_dir.glob("hh_rlhf_*.yaml"))
        presets = (  # listed where the presets are (a checkout); an installed package has none to list
            f"; the presets are recipes/configs/hh_rlhf_<name>.yaml for <name> in {', '.join(known)}"
            if known
            else "; the presets are recipes/configs/hh_rlhf_<name>.yaml in a checkout of rgpo-trl"
        )
        raise ValueError(f"config file {str(path)!r} not found{presets}")
    return path.stem.removeprefix("hh_rlhf_")


def check_hub_ids(script_args, model_args) -> None:
    """Fail before anything is built (a paper config without a GPU fails on bf16 first) when a hub id of the
    model, reward model or dataset cannot be loaded, e.g. offline without a local copy."""
    for value, kind in (
        (model_args.model_name_or_path, "model"),
        (script_args.reward_model_name_or_path, "model"),
        (script_args.dataset_name, "dataset"),
    ):
        if value and not value.startswith(TINY_PREFIX) and not value.endswith((".json", ".jsonl")):
            ensure_loadable(value, kind)


def refuse_offline_push(training_args) -> None:
    """``--push_to_hub`` needs the hub: refused before training when it is offline (the model card is still
    written to output_dir at the end)."""
    if hub_offline("model"):
        raise ValueError(
            "push_to_hub=True but the Hugging Face Hub is offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE): "
            f"the model and its card are saved to {training_args.output_dir!r} only. Unset the offline "
            "variables and log in (`hf auth login`) to push, or drop --push_to_hub."
        )


def parse_recipe_args(
    argv: list[str] | None = None, check_hub: bool = True, config_dir: Path = CONFIG_DIR
) -> tuple:
    """(script_args, training_args, model_args) of the command line ``argv`` (default ``sys.argv[1:]``),
    checked; ``tiny-hh/<asset>`` paths are left for `rgpo_trl.rlhf.worlds.resolve_tiny_assets`. A bad preset,
    field or value raises `UsageError`, before anything is built; ``check_hub=False`` skips the hub checks
    (tests). ``script_args.unused_preset_settings`` lists the preset's settings the trainer config has no
    field for (an offline method's generation settings; the asynchronous trainer's missing ones)."""
    try:
        return _parse_and_check(list(sys.argv[1:] if argv is None else argv), check_hub, config_dir)
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err)) from err


def _parse_and_check(argv: list[str], check_hub: bool, config_dir: Path) -> tuple:
    run_name = config_name(argv, config_dir)
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
    unknown_tiny_asset(script_args, model_args)
    return script_args, training_args, model_args


def _unused(rest: list[str]) -> dict[str, str]:
    """The ``--name value`` pairs the parser left over, as {name: value}."""
    return dict(zip([k.lstrip("-") for k in rest[::2]], rest[1::2], strict=True))


def _parse_sync(argv: list[str], first, run_name: str) -> tuple:
    """The second pass for the GRPOTrainer family (and DPO, and ``sft``)."""
    method = get_rlhf_method(first.method)
    parser = make_recipe_parser(method.config_class)
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
        script_args.unused_preset_settings = _unused(rest)
        # the ones it does read, typed (and so checked) now
        script_args.preset_generation = preset_generation(script_args.unused_preset_settings)
    return script_args, training_args, model_args


def _parse_async(argv: list[str], first, run_name: str) -> tuple:
    """The second pass for --trainer async: the method's asynchronous trainer config. Preset settings it has
    no field for (num_iterations: no batch reuse; disable_dropout) are listed in ``unused_preset_settings``;
    an unknown command-line option is an error."""
    # imported here: TRL's asynchronous trainer (trl.experimental) is loaded for --trainer async only
    from .async_methods import get_async_method

    method = get_async_method(first.method)
    if first.async_rollout == "auto":
        first.async_rollout = "vllm" if torch.cuda.is_available() else "in_process"
    if first.rollout_lag is not None and first.async_rollout == "vllm":
        raise ValueError("rollout_lag needs async_rollout='in_process' (a vLLM server generates freely)")
    parser = make_recipe_parser(method.config_class, model_config_without({"dtype"}))
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
    script_args.unused_preset_settings = _unused(rest)
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
