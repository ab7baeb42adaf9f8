# Copyright 2026 The rgpo-trl developers. Apache-2.0.
"""RGPO on Anthropic HH-RLHF (helpful) with a pairwise DeBERTa reward model: the paper's Sec. 7.3.

Presets are YAML files in ``recipes/configs/`` passed with ``--config``, as for any TRL script:

* ``hh_rlhf_paper.yaml``: Qwen/Qwen2.5-1.5B-Instruct, OpenAssistant/reward-model-deberta-v3-large-v2,
  Anthropic/hh-rlhf helpful-base (43,835 prompts), 4 prompts x 4 completions per iteration, lr 1e-6,
  256 prompt / 256 completion tokens, 400 iterations, window 300-400, bf16. Needs GPUs and the hub (or
  local copies: pass paths instead of ids)::

      accelerate launch -q --config_file recipes/accelerate_configs/single_gpu.yaml \\
          recipes/hh_rlhf_qwen.py --config recipes/configs/hh_rlhf_paper.yaml --method rgpo --seed 1

* ``hh_rlhf_tiny.yaml``: the embedded offline default, the same recipe on CPU on the tiny-HH world
  (``world: tiny``; ``tiny-hh/<asset>`` paths are built once and cached, see `recipes.tiny_hh`)::

      python recipes/hh_rlhf_qwen.py --config recipes/configs/hh_rlhf_tiny.yaml

  (one CPU process needs no launcher: ``make demo`` runs it so, and the recipe's one-line errors keep their
  exit status; ``accelerate launch -q`` works too, without ``-q`` accelerate adds its own traceback. The
  preset's ``cpu_threads: 1`` keeps it on one torch thread whatever the launcher; times in
  results/benchmarks/demo_timing.md.)

* ``hh_rlhf_tiny_paper.yaml``: the paper's protocol (400 iterations) in the tiny world.
* ``hh_rlhf_tiny_paper_v3.yaml``: the same protocol in the tiny world v3, whose validation and test questions
  never occur in training and whose gold penalises ill-formed text.

``--method`` picks a registered method (`recipes.hh_rlhf.methods`: rgpo, rgpo_old, ppo, grpo, ppo_clip_kl,
sapo, cispo, dpo, sft); it applies its loss settings over the preset and names its trainer, which `main`
builds in plain view (RGPOTrainer, TRL's GRPOTrainer, PPORLHFTrainer, TRL's DPOTrainer; with
``--trainer async`` AsyncRGPOTrainer or TRL's AsyncGRPOTrainer). Precedence: field defaults < method <
YAML < command line. Any RGPOConfig / GRPOConfig / ModelConfig field can be set. The default output directory
is ``runs/hh_rlhf_qwen/<preset>-<method>``. Per-iteration metrics go to ``<output_dir>/metrics.jsonl`` (and
``metrics.csv``), the window averages the paper reports to ``summary.json``. The console shows a progress bar
and a compact table every ``table_every`` iterations; ``--log_level info`` prints TRL's per-step metric dicts
too. It ends like TRL's ``grpo.py``: the model and its card (``README.md``, tagged ``rgpo``) in
``output_dir``, and with ``--push_to_hub`` both pushed (refused up front when the hub is offline).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

# Run as a script (``python`` or ``accelerate launch recipes/hh_rlhf_qwen.py``), Python puts recipes/ first on
# sys.path, not the checkout root the `recipes` package is imported from: that entry becomes the root, so the
# script sees the modules `python -m` from the root would (this checkout's `recipes` and `rgpo_trl`, which go
# together) and no sub-package of recipes/ under a second, top-level name (``tiny_hh`` beside
# ``recipes.tiny_hh``). Imported (tests), the module leaves sys.path alone.
ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0] or ".").resolve() == ROOT / "recipes":
    sys.path[0] = str(ROOT)

from recipes.hh_common.hub_access import HubUnavailableError  # noqa: E402
from recipes.hh_rlhf.arguments import HHScriptArguments  # noqa: E402
from recipes.hh_rlhf.parsing import parse_recipe_args  # noqa: E402
from recipes.hh_rlhf.runtime import (  # noqa: E402
    finish,
    init_distributed_for_cpu_deepspeed,
    model_init_kwargs,
    place_reward_model,
    set_cpu_threads,
    setup_logging,
    verbose_console,
)
from recipes.hh_rlhf.worlds import gold_function, resolve_tiny_assets, training_rewards  # noqa: E402
from rgpo_trl.cli import UsageError, plain_output_when_piped, quiet_cpu_libraries, run_main  # noqa: E402

logger = logging.getLogger("rgpo_trl.recipe")
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def main(script_args: HHScriptArguments, training_args, model_args) -> dict:
    """Train ``script_args.method`` on the world's prompts and evaluate it; returns the window summary
    (summary.json, on the main process). The arguments are `parse_recipe_args`'s; ``tiny-hh/<asset>`` paths in
    them are resolved here (the assets are built once and cached)."""
    # imported here, as TRL's grpo.py imports its trainer: a bad command line is refused before the trainers
    # (transformers', TRL's, rgpo_trl's) and the models load
    from accelerate import PartialState
    from transformers import AutoTokenizer
    from trl import DPOTrainer, get_peft_config

    from recipes.hh_common.rewards import load_pairwise_reward
    from recipes.hh_rlhf.input_checks import checkpoint_load_errors
    from recipes.hh_rlhf.methods import get_rlhf_method
    from recipes.hh_rlhf.metrics_log import IterationMetricsWriter, quiet_console
    from recipes.hh_rlhf.offline import run_offline
    from recipes.hh_rlhf.prompt_splits import training_prompts
    from recipes.hh_rlhf.recipe_evaluation import (
        RunEvaluation,
        heldout_after_training,
        sampling_settings,
        summary_window,
    )
    from recipes.hh_rlhf.trainers import GRPOMonitoredTrainer, PPORLHFMonitoredTrainer, RGPOMonitoredTrainer
    from rgpo_trl.trainer import optimizer_steps_per_iteration

    set_cpu_threads(script_args.cpu_threads, training_args)
    resolve_tiny_assets(script_args, model_args)
    setup_logging(training_args)
    if plain_output_when_piped():  # a log file gets plain lines, no progress-bar frames
        training_args.disable_tqdm = True
    state = PartialState()
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")
    peft_config = get_peft_config(model_args)
    # every method of the asynchronous trainer trains online; an offline one (dpo, sft) is synchronous only
    if script_args.trainer == "sync" and not get_rlhf_method(script_args.method).online:

        def dpo_trainer(pairs):  # called by run_offline once it has read the preference pairs
            return DPOTrainer(
                model=model_args.model_name_or_path,
                args=training_args,
                train_dataset=pairs,
                processing_class=tokenizer,
                peft_config=peft_config,
            )

        trains = get_rlhf_method(script_args.method).trainer == "dpo"  # sft: the initial policy, untrained
        return run_offline(
            script_args, training_args, model_args, tokenizer, state, dpo_trainer if trains else None
        )

    dataset, validation_prompts = training_prompts(script_args, tokenizer, state)
    reward_model = load_pairwise_reward(
        script_args.reward_model_name_or_path,
        batch_size=script_args.reward_batch_size,
        max_length=script_args.reward_max_length,
    )
    reward_funcs, reward_weights = training_rewards(script_args, reward_model)
    if script_args.trainer == "sync":  # the async worker weighs the rewards itself
        training_args.reward_weights = reward_weights
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args, script_args.trainer)

    # one iteration: a generation batch and its reuse (sync); one optimizer step (async: generation never
    # pauses)
    steps_per_iteration = optimizer_steps_per_iteration(training_args) if script_args.trainer == "sync" else 1
    if training_args.max_steps is None or training_args.max_steps <= 0:
        training_args.max_steps = script_args.num_rl_iterations * steps_per_iteration
    n_iters = training_args.max_steps // steps_per_iteration
    window = summary_window(script_args, n_iters)

    if script_args.trainer == "async":
        # imported here: TRL's asynchronous trainer (trl.experimental) is loaded for --trainer async only
        from trl.experimental.async_grpo import AsyncGRPOTrainer

        from recipes.hh_rlhf.async_methods import get_async_method, rollout_workers
        from rgpo_trl.async_rgpo import AsyncRGPOTrainer

        workers = rollout_workers(
            script_args, training_args, model_args, tokenizer, dataset, reward_funcs, reward_weights
        )
        method = get_async_method(script_args.method)
        # rgpo, rgpo_old and the off-policy corrections: AsyncRGPOTrainer; grpo: TRL's own
        trainer_cls = AsyncRGPOTrainer if method.trainer == "rgpo" else AsyncGRPOTrainer
    else:
        workers = {}
        method = get_rlhf_method(script_args.method)
        # each with the KL_ref and behaviour-ratio monitors mixed in (recipes.hh_rlhf.trainers)
        if method.trainer == "rgpo":  # rgpo, rgpo_old: RGPOTrainer
            trainer_cls = RGPOMonitoredTrainer
        elif method.trainer == "ppo":  # PPO-RLHF with its value model: PPORLHFTrainer
            trainer_cls = PPORLHFMonitoredTrainer
        else:  # grpo, ppo_clip_kl, sapo, cispo: TRL's GRPOTrainer with its own loss_type
            trainer_cls = GRPOMonitoredTrainer
    trainer = trainer_cls(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        **workers,  # the asynchronous trainers' rollout workers
    )
    place_reward_model(reward_model, trainer)
    trainer.add_callback(
        IterationMetricsWriter(
            training_args.output_dir,
            steps_per_iteration,
            window,
            method,
            state.num_processes,
            table_every=script_args.table_every,
            scores_gold=gold_function(script_args) is not None,
        )
    )
    if not verbose_console(training_args):
        quiet_console(trainer)
    evaluation = RunEvaluation(
        script_args,
        tokenizer,
        reward_model,
        sampling_settings(training_args),
        progress_bar=not training_args.disable_tqdm,
    )
    evaluation.add_validation(trainer, training_args, validation_prompts, steps_per_iteration, window)
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
    with checkpoint_load_errors(training_args.resume_from_checkpoint):  # checked by the parser; the load too
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    finish(trainer, script_args, training_args)
    heldout_after_training(evaluation, trainer, training_args, model_args, state.num_processes)
    summary = {}
    summary_path = os.path.join(training_args.output_dir, "summary.json")
    if state.is_main_process and os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    state.wait_for_everyone()
    return summary


if __name__ == "__main__":
    quiet_cpu_libraries()
    init_distributed_for_cpu_deepspeed()  # before anything builds the accelerator state (the parser does)
    sys.exit(
        run_main(
            lambda: main(*parse_recipe_args(config_dir=CONFIG_DIR)),
            errors=(UsageError, HubUnavailableError),
        )
    )
