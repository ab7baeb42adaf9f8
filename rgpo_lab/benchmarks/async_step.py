"""Optimizer-step time of AsyncRGPOTrainer vs TRL's AsyncGRPOTrainer on the same tiny model (not a test).

Both trainers read the same fixed stream of samples from a stub rollout worker (no generation thread competing
for the CPU, the same token counts for every trainer): before each optimizer step the worker queues the next
step's samples, 16 completions of 24 tokens after a 12-token prompt (gradient_accumulation_steps 2, 8 per
micro-batch), with behaviour log-probs 0.1 nat off the initial policy's so that ratios are not 1. Three
trainers, run alternately (the order rotates each repeat), each repeat a fresh trainer for a few optimizer
steps, the first two discarded:
- ``grpo``: AsyncGRPOTrainer (PPO clip against the behaviour policy, no reference);
- ``rgpo_old``: AsyncRGPOTrainer with the gate on pi / pi_behaviour and beta = 0 (the same forward passes as
  grpo);
- ``rgpo_dual``: AsyncRGPOTrainer, dual ratio with beta_ref = 0.05 (one more forward: the frozen reference).

Reported: the median over repeats of the ratio of mean optimizer-step times (the trainer's own training_step
calls of one step: forward, loss, backward; and the optimizer), against grpo. Writes
``results/benchmarks/async_step.{csv,json,md}``.

    OMP_NUM_THREADS=1 python -m rgpo_lab.benchmarks.async_step --repeats 8 --steps 8
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import queue
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import transformers
import trl
from transformers import PrinterCallback
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

from rgpo_lab.benchmarks.common import RESULTS
from rgpo_trl.async_rgpo import AsyncRGPOConfig, AsyncRGPOTrainer, install_cpu_shims
from rgpo_trl.testing import save_tiny_model, tiny_dataset, tiny_tokenizer

KINDS = ("grpo", "rgpo_old", "rgpo_dual")
PROMPT, COMPLETION, PER_STEP = 12, 24, 16


class FixedStreamWorker:
    """`RolloutWorkerProtocol` that queues the same pseudo-random step of samples before every optimizer step
    (two steps ahead: TRL's loader reads one micro-batch ahead)."""

    def __init__(self, vocab: int):
        rng = np.random.default_rng(0)
        self.steps = [
            [
                (rng.integers(3, vocab, size=PROMPT + COMPLETION), float(rng.normal()), rng.normal(-3.4, 0.1))
                for _ in range(PER_STEP)
            ]
            for _ in range(64)
        ]
        self.rollout_buffer, self.metrics_queue, self.version, self.filled = (
            queue.Queue(),
            queue.Queue(),
            0,
            0,
        )

    def _fill(self):
        while self.filled < self.version + 2:
            for i, (ids, advantage, logp) in enumerate(self.steps[self.filled % len(self.steps)]):
                self.rollout_buffer.put(
                    RolloutSample(
                        prompt=[],
                        completion=[],
                        input_ids=ids.astype(np.int64),
                        completion_mask=np.array([0] * PROMPT + [1] * COMPLETION),
                        old_log_probs=np.full(PROMPT + COMPLETION, logp, dtype=np.float32),
                        advantage=advantage,
                        model_version=self.version,
                        group_id=self.filled * PER_STEP + i,
                        metrics={},
                    )
                )
            self.filled += 1

    def start(self):
        self._fill()

    def stop(self):
        pass

    def update_model_version(self, version):
        self.version = version
        self._fill()

    def check_health(self, stale_after_s):
        pass


class NoTransfer:
    def init_weight_transfer(self):
        pass

    def pause(self):
        pass

    def send_weights(self, iterator):
        for _ in iterator:
            pass

    def resume(self):
        pass

    def destroy(self):
        pass


def build(kind: str, model_dir: str, out: str, steps: int):
    common = dict(
        output_dir=out,
        use_cpu=True,
        bf16=False,
        report_to="none",
        max_steps=steps,
        per_device_train_batch_size=PER_STEP // 2,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=COMPLETION,
        token_budget=0,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-4,
        disable_tqdm=True,
        max_staleness=4,
    )
    if kind == "grpo":
        args, cls = AsyncGRPOConfig(**common), AsyncGRPOTrainer
    else:
        mode = {"rgpo_old": dict(ratio_mode="old", beta=0.0), "rgpo_dual": dict(ratio_mode="dual", beta=0.05)}
        args, cls = AsyncRGPOConfig(**common, **mode[kind]), AsyncRGPOTrainer
    worker = FixedStreamWorker(len(tiny_tokenizer()))
    trainer = cls(
        model_dir,
        args=args,
        train_dataset=tiny_dataset(),
        processing_class=tiny_tokenizer(),
        rollout_worker=worker,
        weight_transfer=NoTransfer(),
    )
    trainer.remove_callback(PrinterCallback)
    return trainer


def run_once(kind: str, model_dir: str, steps: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        trainer = build(kind, model_dir, out, steps)
        times, step = [], trainer.training_step

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            result = step(*args, **kwargs)
            times.append(time.perf_counter() - t0)
            return result

        trainer.training_step = timed
        optimizer_times = []
        trainer.train()
        optimizer_times = [
            e["perf/optimizer_s"] for e in trainer.state.log_history if "perf/optimizer_s" in e
        ]
    per_step = [
        sum(times[i : i + 2]) + o for i, o in zip(range(0, len(times), 2), optimizer_times, strict=True)
    ]
    assert len(per_step) == steps, (len(times), len(optimizer_times))
    return {"kind": kind, "step_time_mean_s": statistics.fmean(per_step[warmup:])}


def main() -> None:
    warnings.filterwarnings("ignore")  # the trainers' deprecation notices would bury the table
    parser = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.async_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(RESULTS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    install_cpu_shims()
    warmup, rows = 2, []
    with tempfile.TemporaryDirectory() as model_dir:
        save_tiny_model(model_dir, hidden=args.hidden)
        for repeat in range(args.repeats):
            order = KINDS[repeat % 3 :] + KINDS[: repeat % 3]
            for kind in order:
                row = {**run_once(kind, model_dir, args.steps, warmup), "repeat": repeat}
                rows.append(row)
                print(json.dumps(row), flush=True)
    by = {(r["repeat"], r["kind"]): r["step_time_mean_s"] for r in rows}
    ratios = {k: [by[(i, k)] / by[(i, "grpo")] for i in range(args.repeats)] for k in KINDS[1:]}
    summary = {
        k: {"ratio_median": statistics.median(v), "ratio_min": min(v), "ratio_max": max(v)}
        for k, v in ratios.items()
    }
    step_s = {k: statistics.median(by[(i, k)] for i in range(args.repeats)) for k in KINDS}
    command = (
        f"OMP_NUM_THREADS={args.threads} python -m rgpo_lab.benchmarks.async_step --repeats {args.repeats} "
        f"--steps {args.steps} --hidden {args.hidden} --threads {args.threads}"
    )
    info = {
        "command": command,
        "summary": summary,
        "step_time_median_s": step_s,
        "setup": {
            "model": f"Qwen2 2 layers, hidden {args.hidden}, from a config",
            "samples_per_step": PER_STEP,
            "prompt_tokens": PROMPT,
            "completion_tokens": COMPLETION,
            "gradient_accumulation_steps": 2,
            "steps_per_run": args.steps,
            "warmup_steps_discarded": warmup,
            "repeats": args.repeats,
        },
        "env": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
            "machine": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average_at_end": os.getloadavg(),
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "async_step.json", "w") as f:
        json.dump(info, f, indent=2)
    with open(args.out / "async_step.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["repeat", "kind", "step_time_mean_s"])
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        "# AsyncRGPOTrainer vs AsyncGRPOTrainer: optimizer-step time",
        "",
        f"`{command}` (TRL {trl.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
        f"at the end {os.getloadavg()[0]:.2f}). Same fixed sample stream for every trainer; run alternately; "
        "the ratio is per repeat, then the median.",
        "",
        "| trainer | median step time (s) | ratio to AsyncGRPO (median) | min | max |",
        "|---|---|---|---|---|",
        f"| AsyncGRPOTrainer (PPO clip) | {step_s['grpo']:.4f} | 1 | | |",
    ]
    for k, label in (
        ("rgpo_old", "AsyncRGPOTrainer, ratio_mode old, beta 0"),
        ("rgpo_dual", "AsyncRGPOTrainer, ratio_mode dual, beta 0.05 (+ reference forward)"),
    ):
        s = summary[k]
        lines.append(
            f"| {label} | {step_s[k]:.4f} | {s['ratio_median']:.3f} | {s['ratio_min']:.3f} | "
            f"{s['ratio_max']:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    (args.out / "async_step.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
