"""The worlds the HH-RLHF recipe runs in, named by its ``world`` field:

- ``hh``: Anthropic HH-RLHF and its pairwise reward model; no gold score.
- ``tiny``: the embedded tiny-HH world (`recipes.tiny_hh`). A path ``tiny-hh/<asset>`` in the recipe's
  arguments names one of its assets, built once and cached; the world's gold score is logged next to the
  proxy reward (weight 0: never optimised) and reported by every evaluation.
"""

from __future__ import annotations

from collections.abc import Callable

from accelerate import PartialState

from ..tiny_hh import build_tiny_assets, gold_for

WORLDS = ("hh", "tiny")
TINY_PREFIX = "tiny-hh/"
TINY_ASSETS = ("policy", "reward_model", "train", "test", "validation")


def _asset_fields(script_args, model_args) -> dict:
    """The arguments that may name a ``tiny-hh/<asset>``: {field name: the arguments object holding it}."""
    return {
        "heldout_dataset_name": script_args,
        "validation_dataset_name": script_args,
        "model_name_or_path": model_args,
        "reward_model_name_or_path": script_args,
        "dataset_name": script_args,
    }


def unknown_tiny_asset(script_args, model_args) -> None:
    """Refuse a ``tiny-hh/<asset>`` path naming no asset, and the v3-only validation split in world v2 (before
    anything is built)."""
    for name, obj in _asset_fields(script_args, model_args).items():
        value = str(getattr(obj, name) or "")
        if value.startswith(TINY_PREFIX) and value.removeprefix(TINY_PREFIX) not in TINY_ASSETS:
            raise ValueError(f"{name}={value!r}: tiny-hh assets are {list(TINY_ASSETS)}")
    if script_args.tiny_version == 2 and str(script_args.validation_dataset_name).endswith("/validation"):
        raise ValueError(
            "validation_dataset_name: tiny-hh/validation exists in world v3 only (tiny_version 3)"
        )


def resolve_tiny_assets(script_args, model_args) -> None:
    """Replace ``tiny-hh/<asset>`` paths by the cached tiny-HH assets, building them once (rank 0 first); a
    no-op when no argument names one."""
    paths = _asset_fields(script_args, model_args)
    if not any(str(getattr(obj, name) or "").startswith(TINY_PREFIX) for name, obj in paths.items()):
        return
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


def gold_function(script_args) -> Callable | None:
    """The world's gold score as a TRL reward function (named ``gold``), or None where there is none."""
    return gold_for(script_args.tiny_version)[1] if script_args.world == "tiny" else None


def training_rewards(script_args, reward_model) -> tuple[list, list[float]]:
    """(reward functions, weights) of training: the proxy reward model with weight 1 and, where the world has
    one, its gold score with weight 0, logged as ``rewards/gold/mean`` to watch the proxy being
    over-optimised, never optimised."""
    gold = gold_function(script_args)
    return ([reward_model], [1.0]) if gold is None else ([reward_model, gold], [1.0, 0.0])
