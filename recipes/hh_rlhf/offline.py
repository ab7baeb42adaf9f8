"""The HH-RLHF recipe's offline methods (`RLHFMethod.online` False): ``dpo`` (TRL's DPOTrainer, built by the
recipe, on the dataset's chosen/rejected pairs) and ``sft`` (no training), evaluated like the online
methods."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from datasets import Dataset
from transformers import AutoModelForCausalLM, Trainer

from ..hh_common.rewards import load_pairwise_reward
from .input_checks import checkpoint_load_errors
from .json_io import dump, dumps
from .methods import get_rlhf_method
from .prompt_splits import training_pairs, training_prompts
from .recipe_evaluation import RunEvaluation, summary_window
from .runtime import finish

logger = logging.getLogger("rgpo_trl.recipe")


def run_offline(
    script_args,
    training_args,
    model_args,
    tokenizer,
    state,
    build_trainer: Callable[[Dataset], Trainer] | None,
) -> dict:
    """An offline method: DPO (``build_trainer(pairs)``, the recipe's DPOTrainer, on the dataset's
    chosen/rejected pairs from the same initial policy and reference, for as many optimizer steps as the
    online methods take) or ``sft`` (``build_trainer`` None, no training: the initial policy itself, the
    baseline every method starts from). Then the shared evaluation on training prompts (summary.json, the
    counterpart of the online methods' window) and on held-out prompts (heldout.json). Returns the summary
    ({} on all but single-process runs)."""
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
    preset = script_args.preset_generation  # a PresetGeneration, typed by parse_recipe_args
    sampling = {
        "max_new_tokens": preset.max_completion_length,
        "temperature": preset.temperature,
        "seed": training_args.seed,
    }
    evaluation = RunEvaluation(script_args, tokenizer, reward_model, sampling)
    validation_prompts: list = []
    if script_args.validation_prompts:  # the same validation prompts as the online methods, out of training
        _, validation_prompts = training_prompts(script_args, tokenizer, state, log=False)
    if build_trainer is None:  # the initial policy, evaluated as it is (its own reference: KL_ref = 0)
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path).to(state.device)
        ref_model, device = model, state.device
        info.update(optimizer_steps=0)
        if validation_prompts:  # one evaluation: the policy does not change
            reward_model.to(device)
            result = evaluation.prompts(model, ref_model, validation_prompts, script_args.validation_samples)
            os.makedirs(training_args.output_dir, exist_ok=True)
            with open(os.path.join(training_args.output_dir, "validation.json"), "w") as f:
                dump({"iterations": [0], "expected_iterations": [0], **result}, f, indent=2)
    else:
        pairs = training_pairs(script_args, tokenizer, state, validation_prompts)
        steps_per_iteration = preset.num_iterations  # as many optimizer steps as an online run
        if training_args.max_steps is None or training_args.max_steps <= 0:
            training_args.max_steps = script_args.num_rl_iterations * steps_per_iteration
        trainer = build_trainer(pairs)
        reward_model.to(trainer.accelerator.device)
        window = summary_window(script_args, training_args.max_steps // steps_per_iteration)
        evaluation.add_validation(trainer, training_args, validation_prompts, steps_per_iteration, window)
        with checkpoint_load_errors(training_args.resume_from_checkpoint):
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
    summary = evaluation.dataset(
        model, ref_model, script_args.dataset_name, script_args.dataset_train_split, n_train
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
        dump(summary, f, indent=2)
    if script_args.heldout_prompts > 0:
        evaluation.heldout(model, ref_model, training_args.output_dir)
    logger.info("%s: %s", script_args.method, dumps(summary))
    return summary
