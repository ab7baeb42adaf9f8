"""The HH-RLHF recipe's prompt sets: the training prompts and the validation prompts kept out of them (the
model-selection set of a tuning suite, never the test split)."""

from __future__ import annotations

import json
import logging

from .hh_data import hold_out_validation, load_hh_helpful_prompts

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
    held = {json.dumps(p, sort_keys=True) for p in validation}
    keep = [i for i, p in enumerate(dataset["prompt"]) if json.dumps(p, sort_keys=True) not in held]
    return dataset.select(keep), validation


def training_prompts(script_args, tokenizer, state, log: bool = True):
    """(training prompts, validation prompts): the training split's prompts (rank 0 reads them first), less
    the validation prompts (`split_validation`), cut to ``max_train_prompts``; ``log`` reports the data
    statistics on the main process."""
    with state.main_process_first():
        dataset, stats = load_hh_helpful_prompts(
            script_args.dataset_name,
            script_args.dataset_train_split,
            tokenizer,
            script_args.max_prompt_length,
            data_dir=script_args.dataset_data_dir,
        )
    dataset, validation = split_validation(dataset, script_args, tokenizer)
    if script_args.max_train_prompts is not None:
        dataset = dataset.select(range(min(script_args.max_train_prompts, len(dataset))))
    if log and state.is_main_process:
        logger.info("prompts: %s; training on %d", json.dumps(stats.as_dict()), len(dataset))
    return dataset, validation
