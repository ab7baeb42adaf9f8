"""The HH-RLHF recipe's offline methods (`RLHFMethod.online` False): ``dpo`` (TRL's DPOTrainer on the
dataset's chosen/rejected pairs) and ``sft`` (no training), evaluated like the online methods."""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import dataclass

from transformers import AutoModelForCausalLM, HfArgumentParser
from trl import get_peft_config

from .hh_data import load_hh_preference_pairs
from .methods import get_rlhf_method
from .prompt_splits import training_prompts
from .recipe_evaluation import (
    add_validation,
    evaluate_on,
    evaluate_prompts,
    summary_window,
    write_heldout,
)
from .rewards import load_pairwise_reward
from .runtime import finish

logger = logging.getLogger("rgpo_trl.recipe")


@dataclass
class PresetGeneration:
    """The preset's settings an offline method's trainer config (DPOConfig) has no field for but its run still
    uses, with the online methods' meaning: the evaluation's completion length and temperature, and
    ``num_iterations``, the optimizer steps of one iteration (so DPO takes as many steps as an online run)."""

    max_completion_length: int = 64
    temperature: float = 1.0
    num_iterations: int = 2


def preset_generation(unused_settings: dict[str, str]) -> PresetGeneration:
    """`PresetGeneration` from the settings the parser left over (``unused_preset_settings``: name -> the
    command-line string), typed by its fields; the others are ignored."""
    args = [s for name, value in unused_settings.items() for s in (f"--{name}", value)]
    parser = HfArgumentParser(PresetGeneration, allow_abbrev=False, exit_on_error=False)
    try:
        settings, _ = parser.parse_args_into_dataclasses(args=args, return_remaining_strings=True)
    except argparse.ArgumentError as err:  # a bad value: a ValueError naming the field, not argparse's exit
        raise ValueError(f"{err.argument_name}: {err.message}") from err
    return settings


def run_offline(script_args, training_args, model_args, tokenizer, state) -> dict:
    """An offline method: DPO (TRL's DPOTrainer on the dataset's chosen/rejected pairs from the same initial
    policy and reference, for as many optimizer steps as the online methods take) or ``sft`` (no training: the
    initial policy itself, the baseline every method starts from). Then the shared evaluation on training
    prompts (summary.json, the counterpart of the online methods' window) and on held-out prompts
    (heldout.json). Returns the summary ({} on all but single-process runs)."""
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
    preset = script_args.preset_generation  # typed by parse_recipe_args
    sampling = {
        "max_new_tokens": preset.max_completion_length,
        "temperature": preset.temperature,
        "seed": training_args.seed,
    }
    validation_prompts: list = []
    if script_args.validation_prompts:  # the same validation prompts as the online methods, out of training
        _, validation_prompts = training_prompts(script_args, tokenizer, state, log=False)
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
        steps_per_iteration = preset.num_iterations  # as many optimizer steps as an online run
        if training_args.max_steps is None or training_args.max_steps <= 0:
            training_args.max_steps = script_args.num_rl_iterations * steps_per_iteration
        trainer = method.trainer_class(
            model=model_args.model_name_or_path,
            args=training_args,
            train_dataset=pairs,
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
        )
        reward_model.to(trainer.accelerator.device)
        window = summary_window(script_args, training_args.max_steps // steps_per_iteration)
        add_validation(
            trainer,
            script_args,
            training_args,
            tokenizer,
            validation_prompts,
            reward_model,
            sampling,
            steps_per_iteration,
            window,
        )
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
