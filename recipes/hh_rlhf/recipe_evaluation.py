"""The HH-RLHF recipe's evaluations, all through the shared `recipes.hh_rlhf.evaluation` code with the world's
gold score where it has one: the held-out prompts after training (``heldout.json``; the demo's comparison
with the initial policy), the validation prompts during the summary window (``validation.jsonl`` /
``validation.json``) and an offline method's training prompts (its ``summary.json``)."""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM

from ..hh_common.hh_data import load_hh_helpful_prompts
from .evaluation import WindowEvaluation, comparison_table, evaluate_policy, repeat_prompts
from .json_io import dump
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


class EvaluationProgress:
    """The progress of one held-out evaluation, a minute or more on a CPU and silent before: a tqdm bar
    (``bar``: a terminal, the training's own bar shown) or else a log line at each of ``lines`` steps, as the
    training's table replaces its bar when the output is piped or ``disable_tqdm`` is set. Called with the
    completions scored so far (`evaluate_policy`'s ``progress``)."""

    def __init__(self, label: str, total: int, bar: bool, lines: int = 4):
        self.label, self.total = label, total
        self.every = max(1, math.ceil(total / lines))
        self._next = self.every
        self._start = time.monotonic()
        self._bar = tqdm(total=total, desc=label, unit="completion", leave=False) if bar else None

    def __call__(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        elif self._next <= done < self.total:  # the end is the caller's line, with the result
            logger.info("%s: %d/%d completions, %.0f s", self.label, done, self.total, self.elapsed)
            self._next = (done // self.every + 1) * self.every

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@dataclass
class RunEvaluation:
    """What every evaluation of one run shares: the recipe's arguments (prompt length, held-out and
    validation settings, the world's gold score), the tokenizer, the reward model and how completions are
    sampled (`sampling_settings`, or an offline method's preset generation settings); ``progress_bar``: the
    held-out evaluation's progress as a tqdm bar, else as log lines (`EvaluationProgress`)."""

    script_args: Any
    tokenizer: Any
    reward_model: Any
    sampling: dict[str, Any]
    progress_bar: bool = False

    def prompts(
        self,
        model,
        ref_model,
        prompts,
        samples: int = 1,
        per_completion: bool = False,
        seed: int | None = None,
        progress: EvaluationProgress | None = None,
    ) -> dict:
        """The shared evaluation (`recipes.hh_rlhf.evaluation`) of ``model`` on ``prompts``, ``samples``
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
            progress=progress,
            **sampling,
        )
        result.update(prompts=len(prompts), samples_per_prompt=samples)
        return result

    def dataset(
        self,
        model,
        ref_model,
        name,
        split,
        n: int,
        samples: int = 1,
        per_completion: bool = False,
        label: str | None = None,
    ) -> dict:
        """`prompts` on the first ``n`` prompts of (name, split); with ``label``, its progress on the console
        (`EvaluationProgress`) under that name and its time in ``seconds``."""
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
        progress = None
        if label is not None:
            progress = EvaluationProgress(label, len(prompts) * samples, self.progress_bar)
        try:
            result = self.prompts(model, ref_model, prompts, samples, per_completion, progress=progress)
        finally:
            if progress is not None:
                progress.close()
        if progress is not None:
            result["seconds"] = round(progress.elapsed, 1)
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

    def heldout(
        self,
        model,
        ref_model,
        output_dir,
        name: str = "heldout.json",
        policy: str | None = None,
        table_follows: bool = False,
    ) -> dict:
        """The same held-out evaluation for every method, written to ``name`` (heldout.json); the returned
        result also has every completion's scores (``per_completion``, not written), for the demo's paired
        comparison. The console shows its progress and one line naming the ``policy`` evaluated (default: the
        trained one), how long it took and where it went, with its numbers unless ``table_follows`` (the
        demo's comparison table shows them)."""
        script_args = self.script_args
        label = f"held-out test ({policy or f'trained {script_args.method} policy'})"
        result = self.dataset(
            model,
            ref_model,
            script_args.heldout_dataset_name or script_args.dataset_name,
            script_args.dataset_test_split,
            script_args.heldout_prompts,
            script_args.heldout_samples,
            per_completion=True,
            label=label,
        )
        written = {k: v for k, v in result.items() if k not in ("per_completion", "seconds")}
        path = os.path.join(output_dir, name)
        with open(path, "w") as f:
            dump(written, f, indent=2)
        logger.info("%s", heldout_line(label, result, path, table_follows))
        return result

    def print_comparison(self, trained, model_args, training_args) -> None:
        """The demo's ending: the initial policy through the same held-out evaluation (its own reference:
        KL_ref 0), the table of both, what happened, and where the results are (heldout_initial.json next
        to heldout.json)."""
        device = next(self.reward_model.model.parameters()).device
        initial_model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path).to(device).eval()
        out = training_args.output_dir
        initial = self.heldout(
            initial_model, initial_model, out, "heldout_initial.json", policy="SFT policy", table_follows=True
        )
        where = [
            f"metrics: {os.path.join(out, 'metrics.jsonl')}",
            f"held-out: {os.path.join(out, 'heldout.json')}",
        ]
        if self.script_args.save_final_model:
            where = [f"model: {out}", f"model card: {os.path.join(out, 'README.md')}", *where]
        table = comparison_table(initial, trained, self.script_args.method)
        print("\n" + table + "\n" + "\n".join(where), flush=True)


def heldout_line(label: str, result: dict[str, Any], path: str, table_follows: bool) -> str:
    """The console's line for one held-out evaluation: what was evaluated on how many completions, in how
    long, its numbers (proxy reward, gold where scored, KL_ref) unless a table with them follows, and the
    file."""
    samples = result.get("samples_per_prompt", 1)
    size = f"{result['prompts']} prompts x {samples} sample{'s' * (samples != 1)}"
    took = f" in {result['seconds']:.0f} s" if "seconds" in result else ""
    numbers = ""
    if not table_follows:
        named = [("proxy reward", "reward"), ("gold", "gold"), ("KL_ref", "kl_ref")]
        numbers = ": " + ", ".join(f"{n} {result[k]:.3f}" for n, k in named if k in result)
    return f"{label}: {size}{took}{numbers} -> {path}"


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
    trained = evaluation.heldout(
        policy, reference, training_args.output_dir, table_follows=script_args.heldout_compare_initial
    )
    if script_args.heldout_compare_initial:
        evaluation.print_comparison(trained, model_args, training_args)
