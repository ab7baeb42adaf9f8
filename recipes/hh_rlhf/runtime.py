"""A recipe run's process plumbing: distributed start-up for DeepSpeed on CPU, logging, where the reward model
lives, and the end as in TRL's ``grpo.py`` (the model and its card saved, pushed with ``--push_to_hub``)."""

from __future__ import annotations

import logging
import os
import sys
import warnings

import torch
import transformers

logger = logging.getLogger("rgpo_trl.recipe")


def init_distributed_for_cpu_deepspeed() -> bool:
    """DeepSpeed without CUDA must run over gloo; otherwise ZeRO-3 fails while loading the reference
    model ("train_batch_size is not equal to ..."). Initialise it before anything builds the
    accelerator state. Returns True when it did."""
    use_deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    use_cpu = os.environ.get("ACCELERATE_USE_CPU", "false").lower() == "true" or not torch.cuda.is_available()
    if not (use_deepspeed and use_cpu and "WORLD_SIZE" in os.environ):
        return False
    # imported here: DeepSpeed is optional (a DeepSpeed launch only), and importing it reads DS_ACCELERATOR
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    return True


def set_cpu_threads(cpu_threads: int | None, training_args) -> None:
    """``--cpu_threads`` on a CPU run: the preset's thread count, whatever the launcher (plain ``python`` or
    ``accelerate launch`` without ``--num_cpu_threads_per_process``); None leaves torch's."""
    if cpu_threads is not None and (training_args.use_cpu or not torch.cuda.is_available()):
        torch.set_num_threads(cpu_threads)


def setup_logging(training_args) -> None:
    """The recipe logs through `logging` (``[rgpo-trl] ...`` on the main process); transformers and TRL at the
    run's ``--log_level``; their deprecation notices about gradient checkpointing, a feature the recipe never
    sets, are silenced."""
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


def model_init_kwargs(model_args, training_args, trainer: str = "sync") -> dict:
    """The policy's ``from_pretrained`` arguments, as TRL's grpo.py builds them from ModelConfig, under the
    config's own ``model_init_kwargs``; without ``attn_implementation`` for the asynchronous trainer, whose
    packed rows need its own tree attention."""
    kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    if trainer == "async":
        del kwargs["attn_implementation"]
    return {**kwargs, **(training_args.model_init_kwargs or {})}


def place_reward_model(reward_model, trainer) -> None:
    """Put the reward model where the trainer computes: on its device or, under ZeRO-3, where it was loaded
    partitioned (zero.Init), in a DeepSpeed inference engine, as GRPOTrainer does for its own reward
    models."""
    if trainer.is_deepspeed_enabled:
        from trl.models.utils import prepare_deepspeed  # imported here: a DeepSpeed run only, and heavy

        reward_model.model = prepare_deepspeed(reward_model.model, trainer.accelerator)
    else:
        reward_model.to(trainer.accelerator.device)


def finish(trainer, script_args, training_args) -> None:
    """End like TRL's grpo.py: save the model and write its card (README.md, tagged rgpo) to output_dir; push
    both with --push_to_hub (refused offline before training, see `recipes.hh_rlhf.parsing`)."""
    if script_args.save_final_model:
        trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.create_model_card(dataset_name=script_args.dataset_name)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
