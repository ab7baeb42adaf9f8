"""The HH-RLHF recipe's command line to ``(script_args, training_args, model_args)``, checked.

`parse_recipe_args` reads the command line in one `TrlParser` pass (``parse_args_and_config``, YAML presets
via ``--config``), as TRL's ``grpo.py`` does. That parser needs the trainer config class, which the method
(and ``--trainer``) decides, so `read_early_settings` reads those first: plain argparse and YAML over six
settings (method, trainer, world and the three hub ids), taken as TrlParser will take them (field default <
YAML < command line; ``--model_name_or_path`` and ``--model-name-or-path`` alike), with no dataclass built
and nothing else parsed twice. The world and the hub ids are checked from that read, before any config
exists: building a bf16 preset's config fails first on a CPU-only machine, and the hub error is the one to
act on. The parse then checks that it read the six settings as the early read did.

Options are given in full: argparse's abbreviations (``--reward_model_name`` for
``--reward_model_name_or_path``) are off in both reads, and one given is refused naming the option it
abbreviates, rather than read by one pass and not the other or left over as an unknown setting.

This module imports no trainer: the trainer configs and their registries (transformers' Trainer, TRL) load
after the early read, so a missing preset, a bad ``--trainer`` or ``--world``, or an unreachable hub id is
refused before them. The method's loss settings are the parser's defaults, which the YAML and the command line
override: field defaults < method < YAML < command line. Every bad input is a `UsageError`, reported on one
line by `rgpo_trl.cli`.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import HfArgumentParser

from rgpo_trl.cli import UsageError

from ..hh_common.hub_access import ensure_loadable, hub_offline
from .arguments import HHScriptArguments, PresetGeneration, make_recipe_parser, model_config_without
from .input_checks import check_async_batch, check_field_ranges, check_resume_checkpoint
from .worlds import TINY_PREFIX, WORLDS, unknown_tiny_asset

CONFIG_DIR = (
    Path(__file__).resolve().parents[2] / "recipes" / "configs"
)  # the presets of a repository checkout
TRAINERS = tuple(HHScriptArguments.__dataclass_fields__["trainer"].metadata["choices"])


def config_name(argv: list[str], config_dir: Path = CONFIG_DIR) -> str:
    """The name of the ``--config`` YAML (``hh_rlhf_tiny_paper.yaml`` -> ``tiny_paper``), found as TrlParser
    finds it: the default output directory is per config file, so two presets never share one."""
    if "--config" not in argv:
        return "default"
    path = Path(_config_path(argv))
    if not path.is_file():
        known = sorted(p.stem.removeprefix("hh_rlhf_") for p in config_dir.glob("hh_rlhf_*.yaml"))
        presets = (  # listed where the presets are (a checkout); an installed package has none to list
            f"; the presets are recipes/configs/hh_rlhf_<name>.yaml for <name> in {', '.join(known)}"
            if known
            else "; the presets are recipes/configs/hh_rlhf_<name>.yaml in a checkout of rgpo-trl"
        )
        raise ValueError(f"config file {str(path)!r} not found{presets}")
    return path.stem.removeprefix("hh_rlhf_")


def _config_path(argv: list[str]) -> str:
    i = argv.index("--config")
    if i + 1 == len(argv):
        raise ValueError("--config needs the path of a YAML file")
    return argv[i + 1]


@dataclass(frozen=True)
class EarlySettings:
    """The settings the recipe needs before its TrlParser pass: ``method`` and ``trainer`` pick the trainer
    config class; ``world`` and the hub ids are checked before any config is built."""

    method: str
    trainer: str
    world: str
    model_name_or_path: str | None
    reward_model_name_or_path: str | None
    dataset_name: str | None


def read_early_settings(argv: list[str]) -> EarlySettings:
    """`EarlySettings` of ``argv`` as TrlParser will read them: the command line over the ``--config`` YAML
    over `HHScriptArguments`' defaults (``model_name_or_path``: ModelConfig's, None)."""
    preset = _read_preset(_config_path(argv)) if "--config" in argv else {}
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    names = [f.name for f in fields(EarlySettings)]
    for name in names:  # both spellings, as HfArgumentParser registers a field with "_" in its name
        parser.add_argument(*dict.fromkeys((f"--{name}", f"--{name.replace('_', '-')}")), dest=name)
    with _argparse_errors():  # e.g. --method without a value
        given, rest = parser.parse_known_args(argv)
    # before the hub check: an abbreviated --reward_model_name must not leave the preset's hub id checked
    _refuse_abbreviations(rest, _option_strings(parser))
    defaults = {f.name: f.default for f in fields(HHScriptArguments)}
    values = {
        name: getattr(given, name)
        if getattr(given, name) is not None
        else preset.get(name, defaults.get(name))
        for name in names
    }
    if values["trainer"] not in TRAINERS:
        raise ValueError(f"trainer must be 'sync' or 'async', got {values['trainer']!r}")
    if values["world"] not in WORLDS:
        raise ValueError(f"world must be one of {sorted(WORLDS)}, got {values['world']!r}")
    return EarlySettings(**values)


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every spelling of every option ``parser`` knows (``--a_b`` and ``--a-b``, ``--no_a``)."""
    return [option for action in parser._actions for option in action.option_strings]


def _refuse_abbreviations(rest: Iterable[str], options: Iterable[str]) -> None:
    """Refuse an option of ``rest`` (what a parser left over) that abbreviates one of ``options``: the
    recipe's parsers do not expand abbreviations, which would otherwise be left over as unknown settings
    (or, for the early read, leave a setting at its preset value while the full parse expanded it)."""
    options = list(options)
    for arg in rest:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--") or flag == "--":
            continue
        meant = [option for option in options if option.startswith(flag) and option != flag]
        if meant:
            raise ValueError(f"{flag}: options must be given in full (did you mean {' or '.join(meant)}?)")


def _read_preset(path: str) -> dict[str, Any]:
    """The ``--config`` YAML, a mapping (TrlParser reads it again for every field)."""
    try:
        with open(path) as f:
            preset = yaml.safe_load(f)
    except yaml.YAMLError as err:
        raise ValueError(f"config file {path!r} is not valid YAML: {err}") from err
    if not isinstance(preset, dict):
        raise ValueError(f"config file {path!r} must contain a YAML mapping")
    return preset


def check_hub_ids(settings: EarlySettings) -> None:
    """Fail before anything is built (a paper config without a GPU fails on bf16 first) when a hub id of the
    model, reward model or dataset cannot be loaded, e.g. offline without a local copy."""
    for value, kind in (
        (settings.model_name_or_path, "model"),
        (settings.reward_model_name_or_path, "model"),
        (settings.dataset_name, "dataset"),
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
    checked; ``tiny-hh/<asset>`` paths are left for `recipes.hh_rlhf.worlds.resolve_tiny_assets`. A bad
    preset, field or value raises `UsageError`, before anything is built; ``check_hub=False`` skips the hub
    checks (tests). ``script_args.unused_preset_settings`` lists the preset's settings the trainer config has
    no field for (an offline method's generation settings; the asynchronous trainer's missing ones)."""
    try:
        return _parse_and_check(list(sys.argv[1:] if argv is None else argv), check_hub, config_dir)
    except (ValueError, FileNotFoundError) as err:
        raise UsageError(str(err)) from err


def _parse_and_check(argv: list[str], check_hub: bool, config_dir: Path) -> tuple:
    run_name = config_name(argv, config_dir)
    early = read_early_settings(argv)
    if check_hub and not {"-h", "--help"} & set(argv):  # --help is printed by the parser, offline too
        check_hub_ids(early)
    method, parser = _method_and_parser(early, run_name)
    script_args, training_args, model_args, from_preset, from_cli = parser.parse_args_and_config(
        args=argv, return_remaining_strings=True, separate_remaining_strings=True
    )
    _refuse_abbreviations(from_cli, _option_strings(parser))
    _check_early_settings(early, script_args, model_args)
    unknown = [s for s in from_cli if s.startswith("--")]
    fields_known = [action.dest for action in parser._actions if action.dest != "help"]
    if unknown and method.online:  # an offline method reads some generation settings itself (below)
        raise ValueError(
            f"{_with_suggestions(unknown, fields_known, '--')}: not a field of the recipe or of "
            f"{method.config_class.__name__}"
        )
    if from_preset and early.trainer == "sync" and method.online:
        raise ValueError(
            f"{_with_suggestions(from_preset[::2], fields_known, '')}: in the config file, but not a field "
            f"of the recipe or of {method.config_class.__name__}"
        )
    script_args.unused_preset_settings = _unused(from_preset + from_cli)
    _check_recipe_fields(script_args, training_args, model_args)
    if early.trainer == "async":
        _check_async(script_args, training_args, model_args)
    elif not method.online:  # the generation settings an offline method reads, typed (and so checked) now
        script_args.preset_generation = preset_generation(script_args.unused_preset_settings)
        check_field_ranges(vars(script_args.preset_generation))
    if training_args.resume_from_checkpoint is not None:
        check_resume_checkpoint(training_args.resume_from_checkpoint, training_args)
    return script_args, training_args, model_args


def _check_early_settings(early: EarlySettings, script_args, model_args) -> None:
    """The six settings the early read decided the trainer config and the hub checks by are the ones the
    parse read: a difference would train another method, or a model whose hub id was not checked."""
    parsed = EarlySettings(
        method=script_args.method,
        trainer=script_args.trainer,
        world=script_args.world,
        model_name_or_path=model_args.model_name_or_path,
        reward_model_name_or_path=script_args.reward_model_name_or_path,
        dataset_name=script_args.dataset_name,
    )
    differ = [f.name for f in fields(EarlySettings) if getattr(early, f.name) != getattr(parsed, f.name)]
    if differ:
        raise ValueError(
            "; ".join(
                f"{n}: read as {getattr(early, n)!r} first, {getattr(parsed, n)!r} by the parser"
                for n in differ
            )
            + ": give each once, in full, as --name value"
        )


def _method_and_parser(early: EarlySettings, run_name: str) -> tuple[Any, Any]:
    """The method and the run's one TrlParser: the recipe's fields, the method's trainer config with its loss
    settings as defaults, and ModelConfig (without ``dtype`` for the asynchronous trainer, whose config
    declares it)."""
    # imported here, after the early checks: the registries import transformers and TRL (seconds), and the
    # asynchronous one TRL's trl.experimental, loaded for --trainer async only
    if early.trainer == "async":
        from .async_methods import get_async_method

        method = get_async_method(early.method)
        parser = make_recipe_parser(
            method.config_class, model_config_without({"dtype"}), check=check_field_ranges
        )
        output_dir = f"runs/hh_rlhf_qwen/{run_name}-{method.name}-async"
    else:
        from .methods import get_rlhf_method

        method = get_rlhf_method(early.method)
        parser = make_recipe_parser(method.config_class, check=check_field_ranges)
        output_dir = f"runs/hh_rlhf_qwen/{run_name}-{method.name}"
    parser.set_defaults(**method.config, method=method.name, output_dir=output_dir)
    return method, parser


def preset_generation(unused_settings: dict[str, str]) -> PresetGeneration:
    """`PresetGeneration` from the settings the parser left over (``unused_preset_settings``: name -> the
    command-line string), typed by its fields; the others are ignored."""
    args = [s for name, value in unused_settings.items() for s in (f"--{name}", value)]
    parser = HfArgumentParser(PresetGeneration, allow_abbrev=False, exit_on_error=False)
    with _argparse_errors():  # a bad value
        settings, _ = parser.parse_args_into_dataclasses(args=args, return_remaining_strings=True)
    return settings


@contextmanager
def _argparse_errors() -> Iterator[None]:
    """argparse's error (``exit_on_error=False``) as a ValueError naming the option, not argparse's exit with
    an internal parser's usage line."""
    try:
        yield
    except argparse.ArgumentError as err:
        raise ValueError(f"{err.argument_name}: {err.message}") from err


def _with_suggestions(names: Iterable[str], known: list[str], prefix: str) -> str:
    """``names`` (``--learnig_rate``) as ``prefix + name``, each followed by "(did you mean ...?)" when a
    known field is spelled closely enough to be the one meant."""
    out = []
    for name in names:
        bare = name.lstrip("-").split("=", 1)[0].replace("-", "_")
        close = difflib.get_close_matches(bare, known, n=1, cutoff=0.75)
        out.append(prefix + bare + (f" (did you mean {prefix}{close[0]}?)" if close else ""))
    return ", ".join(out)


def _unused(rest: list[str]) -> dict[str, str]:
    """The ``--name value`` pairs the parser left over, as {name: value}."""
    return dict(zip([k.lstrip("-") for k in rest[::2]], rest[1::2], strict=True))


def _check_recipe_fields(script_args, training_args, model_args) -> None:
    """The recipe's own fields, which argparse types but does not range-check."""
    if model_args.model_name_or_path is None:
        raise ValueError("model_name_or_path is required")
    for name in ("heldout_samples", "validation_samples", "validation_every"):
        if getattr(script_args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(script_args, name)}")
    if script_args.validation_prompts < 0:
        raise ValueError(
            f"validation_prompts must be >= 0 (0 disables), got {script_args.validation_prompts}"
        )
    if script_args.cpu_threads is not None and script_args.cpu_threads < 1:
        raise ValueError(f"cpu_threads must be an integer >= 1 (or unset), got {script_args.cpu_threads}")
    if script_args.tiny_version not in (2, 3):
        raise ValueError(f"tiny_version must be 2 or 3, got {script_args.tiny_version!r}")
    if training_args.push_to_hub:
        refuse_offline_push(training_args)
    unknown_tiny_asset(script_args, model_args)


def _check_async(script_args, training_args, model_args) -> None:
    """--trainer async: the rollout worker resolved (``auto``: in_process without a GPU, vllm with one), one
    ``dtype`` (the trainer config's), and the combinations TRL's asynchronous trainer cannot run refused."""
    if script_args.async_rollout == "auto":
        script_args.async_rollout = "vllm" if torch.cuda.is_available() else "in_process"
    lag = script_args.rollout_lag
    if lag is not None and script_args.async_rollout == "vllm":
        raise ValueError("rollout_lag needs async_rollout='in_process' (a vLLM server generates freely)")
    model_args.dtype = training_args.dtype  # one --dtype, declared by the trainer config
    check_async_batch(training_args)
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
