"""The HH-RLHF recipe's evaluations, all through the shared `rgpo_trl.rlhf.evaluation` code with the world's
gold score where it has one: the held-out prompts after training (``heldout.json``; the demo's comparison
with the initial policy), the validation prompts during the summary window (``validation.jsonl`` /
``validation.json``) and an offline method's training prompts (its ``summary.json``)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from .evaluation import WindowEvaluation, comparison_table, evaluate_policy, repeat_prompts
from .hh_data import load_hh_helpful_prompts
from .json_io import dump, dumps
from .worlds import gold_function

logger = logging.getLogger("rgpo_trl.recipe")


def sampling_settings(training_args) -> dict:
    """How evaluations sample: the run's completion length, temperature and seed."""
    return {
        "max_new_tokens": training_args.max_completion_length,
        "temperature": training_args.temperature,
        "seed": training_args.seed,
    }


def summary_window(script_args, n_iters: int) -> tuple[int, int]:
    """The summary window (start exclusive, end): the given bounds, else the last quarter of the run."""
    start = script_args.window_start if script_args.window_start is not None else (3 * n_iters) // 4
    return start, script_args.window_end if script_args.window_end is not None else n_iters


@dataclass
class RunEvaluation:
    """What every evaluation of one run shares: the recipe's arguments (prompt length, held-out and
    validation settings, the world's gold score), the tokenizer, the reward model and how completions are
    sampled (`sampling_settings`, or an offline method's preset generation settings)."""

    script_args: Any
    tokenizer: Any
    reward_model: Any
    sampling: dict[str, Any]

    def prompts(
        self,
        model,
        ref_model,
        prompts,
        samples: int = 1,
        per_completion: bool = False,
        seed: int | None = None,
    ) -> dict:
        """The shared evaluation (`rgpo_trl.rlhf.evaluation`) of ``model`` on ``prompts``, ``samples``
        completions each (sampled with ``seed``, default the run's); gold where the world has one."""
        sampling = self.sampling if seed is None else {**self.sampling, "seed": seed}
        result = evaluate_policy(
            model,
            self.tokenizer,
            repeat_prompts(prompts, samples),
            self.reward_model,
            ref_model=ref_model,
            gold_fn=gold_function(self.script_args),
            per_completion=per_completion,
            **sampling,
        )
        result.update(prompts=len(prompts), samples_per_prompt=samples)
        return result

    def dataset(
        self, model, ref_model, name, split, n: int, samples: int = 1, per_completion: bool = False
    ) -> dict:
        """`prompts` on the first ``n`` prompts of (name, split)."""
        n = max(n, 1)
        prompts, _ = load_hh_helpful_prompts(
            name,
            split,
            self.tokenizer,
            self.script_args.max_prompt_length,
            data_dir=self.script_args.dataset_data_dir,
            max_rows=4 * n,
        )
        prompts = [p["prompt"] for p in prompts.select(range(min(n, len(prompts))))]
        result = self.prompts(model, ref_model, prompts, samples, per_completion)
        result.update(dataset=name, split=None if os.path.isfile(name) else split, seed=self.sampling["seed"])
        return result

    def validation_callback(
        self, training_args, prompts, ref_model_fn, steps_per_iteration: int, window: tuple[int, int]
    ) -> WindowEvaluation | None:
        """The `WindowEvaluation` on the validation prompts (against ``ref_model_fn()``): every
        ``validation_every`` iterations in the window and at its end; None when ``validation_prompts`` is
        0."""
        script_args = self.script_args
        if script_args.validation_prompts == 0:
            return None
        lo, hi = window
        at = [*range(hi, lo, -script_args.validation_every)][::-1]

        def evaluate(model, prompts, seed):
            return self.prompts(model, ref_model_fn(), prompts, script_args.validation_samples, seed=seed)

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

    def add_validation(
        self, trainer, training_args, prompts, steps_per_iteration: int, window: tuple[int, int]
    ) -> None:
        """Attach `validation_callback` to ``trainer`` (online and offline methods alike), against the
        trainer's own reference model; nothing when ``validation_prompts`` is 0."""
        callback = self.validation_callback(
            training_args, prompts, lambda: trainer.ref_model, steps_per_iteration, window
        )
        if callback is not None:
            trainer.add_callback(callback)

    def heldout(self, model, ref_model, output_dir, name: str = "heldout.json") -> dict:
        """The same held-out evaluation for every method, written to ``name`` (heldout.json); the returned
        result also has every completion's scores (``per_completion``, not written), for the demo's paired
        comparison."""
        script_args = self.script_args
        result = self.dataset(
            model,
            ref_model,
            script_args.heldout_dataset_name or script_args.dataset_name,
            script_args.dataset_test_split,
            script_args.heldout_prompts,
            script_args.heldout_samples,
            per_completion=True,
        )
        written = {k: v for k, v in result.items() if k != "per_completion"}
        with open(os.path.join(output_dir, name), "w") as f:
            dump(written, f, indent=2)
        logger.info("held-out: %s", dumps(written))
        return result

    def print_comparison(self, trained, model_args, training_args) -> None:
        """The demo's ending: the initial policy through the same held-out evaluation (its own reference:
        KL_ref 0), the table of both, what happened, and where the results are (heldout_initial.json next
        to heldout.json)."""
        device = next(self.reward_model.model.parameters()).device
        initial_model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path).to(device).eval()
        out = training_args.output_dir
        initial = self.heldout(initial_model, initial_model, out, name="heldout_initial.json")
        where = [
            f"metrics: {os.path.join(out, 'metrics.jsonl')}",
            f"held-out: {os.path.join(out, 'heldout.json')}",
        ]
        if self.script_args.save_final_model:
            where = [f"model: {out}", f"model card: {os.path.join(out, 'README.md')}", *where]
        table = comparison_table(initial, trained, self.script_args.method)
        print("\n" + table + "\n" + "\n".join(where), flush=True)


def plain_policy(path: str, device, trained=None):
    """The policy at ``path`` in float32 with standard attention, on ``device``, holding ``trained``'s weights
    if given (a PEFT model's adapter merged in): TRL's asynchronous trainer runs packed tree attention, which
    cannot generate. Called after training and saving."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if trained is not None:
        if hasattr(trained, "merge_and_unload"):  # PEFT: the adapter folded into the base weights
            trained = trained.merge_and_unload()
        model.load_state_dict({k: v.float() for k, v in trained.state_dict().items()})
    return model.to(device).eval()


def heldout_after_training(
    evaluation: RunEvaluation, trainer, training_args, model_args, num_processes: int
) -> None:
    """An online method's end: the trained policy on the held-out prompts (heldout.json; plain copies of the
    policy and reference after the asynchronous trainer) and, with ``heldout_compare_initial``, the demo's
    comparison with the initial policy. Single-process runs only; nothing with ``heldout_prompts`` 0."""
    script_args = evaluation.script_args
    if script_args.heldout_prompts <= 0:
        return
    if num_processes > 1:
        logger.warning("held-out evaluation runs in single-process runs only; skipped")
        return
    policy, reference = trainer.accelerator.unwrap_model(trainer.model), getattr(trainer, "ref_model", None)
    if script_args.trainer == "async":  # packed tree attention cannot generate: plain copies evaluate
        device = trainer.accelerator.device
        policy = plain_policy(model_args.model_name_or_path, device, policy)
        reference = plain_policy(model_args.model_name_or_path, device)
    trained = evaluation.heldout(policy, reference, training_args.output_dir)
    if script_args.heldout_compare_initial:
        evaluation.print_comparison(trained, model_args, training_args)
