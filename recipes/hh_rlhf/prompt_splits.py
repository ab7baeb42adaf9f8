"""The HH-RLHF recipe's training data: the training prompts (online methods) or preference pairs (offline
ones), less the validation prompts kept out of them (the model-selection set of a tuning suite, never the test
split)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from ..hh_common.hh_data import (
    hold_out_validation,
    load_hh_helpful_prompts,
    load_hh_preference_pairs,
    without_prompts,
)

logger = logging.getLogger("rgpo_trl.recipe")


def split_validation(dataset, script_args, tokenizer):
    """(training prompts, validation prompts as a list): the first ``validation_prompts`` prompts of
    ``validation_dataset_name``, or `hold_out_validation` of the training split; a training prompt equal to a
    validation prompt leaves training either way."""
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
    return without_prompts(dataset, validation), validation


def training_prompts(script_args, tokenizer, state, log: bool = True):
    """(training prompts, validation prompts): the training split's prompts, less the validation prompts
    (`split_validation`), cut to ``max_train_prompts``; ``log`` reports the data statistics on the main
    process."""
    dataset, stats = _training_split(load_hh_helpful_prompts, script_args, tokenizer, state)
    dataset, validation = split_validation(dataset, script_args, tokenizer)
    dataset = _first_rows(dataset, script_args.max_train_prompts)
    if log and state.is_main_process:
        logger.info("prompts: %s; training on %d", json.dumps(stats.as_dict()), len(dataset))
    return dataset, validation


def training_pairs(script_args, tokenizer, state, validation: list):
    """An offline method's training data: the training split's chosen/rejected pairs, less those whose prompt
    is one of ``validation`` (the online methods' validation prompts, from `training_prompts`), cut to
    ``max_train_prompts``."""
    pairs, _ = _training_split(load_hh_preference_pairs, script_args, tokenizer, state)
    return _first_rows(without_prompts(pairs, validation), script_args.max_train_prompts)


def _training_split(load: Callable, script_args, tokenizer, state):
    """``load`` (`load_hh_helpful_prompts` or `load_hh_preference_pairs`) on the training split, rank 0
    first (it fills the datasets cache the others read)."""
    with state.main_process_first():
        return load(
            script_args.dataset_name,
            script_args.dataset_train_split,
            tokenizer,
            script_args.max_prompt_length,
            data_dir=script_args.dataset_data_dir,
        )


def _first_rows(dataset, n: int | None):
    return dataset if n is None else dataset.select(range(min(n, len(dataset))))
