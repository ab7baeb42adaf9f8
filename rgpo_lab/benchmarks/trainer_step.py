"""Step time and forward passes of RGPOTrainer vs TRL's GRPOTrainer on the same tiny model (not a test).

Both trainers get the same model, data, seed, ``beta`` (0.05) and ``num_iterations`` (2); GRPO uses
``loss_type="grpo"`` (its clipped surrogate with the per-sequence mean), RGPO its defaults (sigmoid gate, dual
ratio, adaptive KL-to-old, ``dapo`` aggregation). Completions are forced to the full length
(``min_new_tokens``) so both generate the same number of tokens. The two trainers are run alternately
(ABAB, then BABA, ...) over several repeats, each repeat a fresh trainer for a few optimizer steps; the first
iteration of each run is discarded as warm-up.

Reported: the median over repeats of the ratio of mean optimizer-step times (TRL's own ``step_time`` metric:
generation, scoring, loss, backward, optimizer), the same for the loss computation alone (``compute_loss``
forward, i.e. the part that differs), and the number of model forward passes made while scoring
(``_get_per_token_logps_and_entropies``: old, reference and training forwards) and in total, per optimizer
step. Writes ``results/benchmarks/trainer_step.{csv,json,md}``.

    OMP_NUM_THREADS=1 python -m rgpo_lab.benchmarks.trainer_step --repeats 8 --steps 8
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
import trl
from transformers import PrinterCallback, set_seed

from rgpo_lab.benchmarks.common import RESULTS
from rgpo_trl import PPORLHFConfig, PPORLHFTrainer, RGPOConfig, RGPOTrainer
from rgpo_trl.testing import (
    base_args,
    save_tiny_model,
    tiny_dataset,
    tiny_tokenizer,
    vowel_reward,
)


def build(kind: str, model_dir: str, output_dir: str, steps: int, completion_length: int):
    common = base_args(
        output_dir,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=completion_length,
        generation_kwargs={"min_new_tokens": completion_length},
        beta=0.05,
        num_iterations=2,
        learning_rate=1e-3,
        max_steps=steps,
        logging_steps=1,
    )
    if kind == "rgpo":
        args, cls = RGPOConfig(**common), RGPOTrainer
    elif kind == "ppo":
        args, cls = PPORLHFConfig(**common), PPORLHFTrainer
    else:
        args, cls = trl.GRPOConfig(loss_type="grpo", **common), trl.GRPOTrainer
    return cls(
        model_dir, vowel_reward, args=args, train_dataset=tiny_dataset(64), processing_class=tiny_tokenizer()
    )


def instrument(trainer) -> dict:
    """Count model forward passes (all, and those made while scoring) and time compute_loss."""
    counts = {
        "forward_total": 0,
        "forward_scoring": 0,
        "forward_value": 0,
        "scoring_calls": 0,
        "compute_loss_s": [],
    }
    state = {"scoring": False}
    models = [trainer.model] + ([trainer.ref_model] if trainer.ref_model is not None else [])

    def hook(module, args, kwargs):
        counts["forward_total"] += 1
        if state["scoring"]:
            counts["forward_scoring"] += 1

    for model in models:
        model.register_forward_pre_hook(hook, with_kwargs=True)
    if hasattr(trainer.model, "value_model"):  # PPO-RLHF's value model, a submodule of the policy

        def value_hook(module, args, kwargs):
            counts["forward_value"] += 1

        trainer.model.value_model.register_forward_pre_hook(value_hook, with_kwargs=True)

    scoring = trainer._get_per_token_logps_and_entropies

    def counted_scoring(*args, **kwargs):
        counts["scoring_calls"] += 1
        state["scoring"] = True
        try:
            return scoring(*args, **kwargs)
        finally:
            state["scoring"] = False

    trainer._get_per_token_logps_and_entropies = counted_scoring

    compute_loss = trainer.compute_loss

    def timed_compute_loss(*args, **kwargs):
        t0 = time.perf_counter()
        out = compute_loss(*args, **kwargs)
        counts["compute_loss_s"].append(time.perf_counter() - t0)
        return out

    trainer.compute_loss = timed_compute_loss
    return counts


def run_once(kind, model_dir, steps, completion_length, warmup_steps):
    with tempfile.TemporaryDirectory() as out:
        trainer = build(kind, model_dir, out, steps, completion_length)
        trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
        counts = instrument(trainer)
        set_seed(0)
        trainer.train()
    step_times = [e["step_time"] for e in trainer.state.log_history if "step_time" in e]
    assert len(step_times) == steps, step_times
    loss_times = counts["compute_loss_s"][warmup_steps:]  # gradient_accumulation_steps == 1
    return {
        "kind": kind,
        "step_time_mean_s": statistics.fmean(step_times[warmup_steps:]),
        "compute_loss_mean_s": statistics.fmean(loss_times),
        "forward_scoring_per_step": counts["forward_scoring"] / steps,
        "forward_total_per_step": counts["forward_total"] / steps,
        "scoring_calls_per_step": counts["scoring_calls"] / steps,
        "forward_value_per_step": counts["forward_value"] / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.trainer_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument(
        "--steps", type=int, default=6, help="optimizer steps per run (even: whole iterations)"
    )
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--completion-length", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(RESULTS))
    parser.add_argument(
        "--candidate",
        choices=["rgpo", "ppo"],
        default="rgpo",
        help="trainer compared with GRPOTrainer: RGPOTrainer (writes trainer_step.*) or PPORLHFTrainer "
        "(ppo_step.*)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warmup_steps = 2  # the first iteration (one generation batch, two passes)

    rows = []
    with tempfile.TemporaryDirectory() as model_dir:
        save_tiny_model(model_dir, hidden=args.hidden)
        for repeat in range(args.repeats):
            order = (args.candidate, "grpo") if repeat % 2 == 0 else ("grpo", args.candidate)
            for kind in order:
                row = run_once(kind, model_dir, args.steps, args.completion_length, warmup_steps)
                row["repeat"] = repeat
                rows.append(row)
                print(json.dumps(row), flush=True)

    by = {(r["repeat"], r["kind"]): r for r in rows}
    step_ratios = [
        by[(i, args.candidate)]["step_time_mean_s"] / by[(i, "grpo")]["step_time_mean_s"]
        for i in range(args.repeats)
    ]
    loss_ratios = [
        by[(i, args.candidate)]["compute_loss_mean_s"] / by[(i, "grpo")]["compute_loss_mean_s"]
        for i in range(args.repeats)
    ]

    def per_kind(key, kind):
        return statistics.median(r[key] for r in rows if r["kind"] == kind)

    summary = {
        "step_time_ratio_median": statistics.median(step_ratios),
        "step_time_ratio_min": min(step_ratios),
        "step_time_ratio_max": max(step_ratios),
        "compute_loss_ratio_median": statistics.median(loss_ratios),
        "per_kind": {
            kind: {
                key: per_kind(key, kind)
                for key in (
                    "step_time_mean_s",
                    "compute_loss_mean_s",
                    "forward_scoring_per_step",
                    "forward_total_per_step",
                    "scoring_calls_per_step",
                    "forward_value_per_step",
                )
            }
            for kind in (args.candidate, "grpo")
        },
    }
    command = (
        f"OMP_NUM_THREADS={args.threads} python -m rgpo_lab.benchmarks.trainer_step --repeats {args.repeats} "
        f"--steps {args.steps} --hidden {args.hidden} --completion-length {args.completion_length} "
        f"--threads {args.threads}" + (" --candidate ppo" if args.candidate == "ppo" else "")
    )
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
    }
    setup = {
        "model": f"Qwen2 2 layers, hidden {args.hidden}, char vocab {len(tiny_tokenizer())}, from a config",
        "batch": "8 completions per step (2 prompts x 4 generations), gradient_accumulation_steps 1",
        "completion_length": args.completion_length,
        "beta": 0.05,
        "num_iterations": 2,
        "grpo_loss_type": "grpo",
        "rgpo": "sigmoid k=5, ratio_mode dual, adaptive KL-to-old, loss_type dapo",
        "ppo": "PPO-RLHF: value model (copy of the policy backbone), GAE, clipped surrogate and value loss",
        "candidate": args.candidate,
        "steps_per_run": args.steps,
        "warmup_steps_discarded": warmup_steps,
        "repeats": args.repeats,
    }
    stem = "trainer_step" if args.candidate == "rgpo" else "ppo_step"
    label = {"rgpo": "RGPOTrainer", "ppo": "PPORLHFTrainer"}[args.candidate]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    (args.out / f"{stem}.json").write_text(
        json.dumps(
            {"command": command, "setup": setup, "env": env, "summary": summary, "rows": rows}, indent=2
        )
    )
    r, g = summary["per_kind"][args.candidate], summary["per_kind"]["grpo"]
    md = [
        f"# {label} vs GRPOTrainer: step time and forward passes",
        "",
        f"Command: `{command}`",
        "",
        f"Setup: {setup['model']}; {setup['batch']}; completions forced to {args.completion_length} tokens; "
        f"beta 0.05, num_iterations 2 for both; GRPO loss_type 'grpo'; {label}: {setup[args.candidate]}. "
        f"{args.repeats} repeats, trainers alternated (ABAB/BABA), {args.steps} optimizer steps per run, "
        f"first {warmup_steps} discarded. CPU, torch threads {args.threads}, load average at the end "
        f"{env['load_average_at_end'][0]:.1f} on {env['cpu_count']} cores (shared machine).",
        "",
        f"| | {label} | GRPOTrainer | ratio {label}/GRPOTrainer |",
        "|---|---|---|---|",
        f"| mean step time (s) | {r['step_time_mean_s']:.4f} | {g['step_time_mean_s']:.4f} | "
        f"**{summary['step_time_ratio_median']:.3f}** (min {summary['step_time_ratio_min']:.3f}, "
        f"max {summary['step_time_ratio_max']:.3f}) |",
        f"| mean compute_loss time (s) | {r['compute_loss_mean_s']:.4f} | {g['compute_loss_mean_s']:.4f} | "
        f"{summary['compute_loss_ratio_median']:.3f} |",
        f"| scoring forward passes / step | {r['forward_scoring_per_step']:.2f} | "
        f"{g['forward_scoring_per_step']:.2f} | |",
        f"| all forward passes / step (incl. generation) | {r['forward_total_per_step']:.2f} | "
        f"{g['forward_total_per_step']:.2f} | |",
        f"| value-model forward passes / step | {r['forward_value_per_step']:.2f} | "
        f"{g['forward_value_per_step']:.2f} | |",
        "",
        "Ratios are medians over repeats of per-repeat ratios of mean times (a run's mean over its measured "
        "steps, whole iterations: one generation step and one reuse step each). Scoring forwards per "
        "optimizer step = (old + reference forwards, once per generation batch) / num_iterations + 1 "
        "training forward.",
        "",
        f"Versions: torch {torch.__version__}, transformers {transformers.__version__}, trl "
        f"{trl.__version__}.",
        "",
    ]
    (args.out / f"{stem}.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
