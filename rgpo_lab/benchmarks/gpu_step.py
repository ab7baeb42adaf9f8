"""Optimizer-step time, generation share, tokens/s and peak memory of RGPOTrainer vs its peers on a GPU.

Blocks (each a set of cases run in interleaved rounds):

- ``full_1.5b``: Qwen2.5-1.5B's architecture, full fine-tune: RGPOTrainer (its defaults: sigmoid gate, dual
  ratio, adaptive KL-to-old, beta_ref 0.05), TRL's GRPOTrainer with the same reference penalty (``grpo_ref``:
  loss_type "grpo", beta 0.05), the project's PPORLHFTrainer (value model, GAE, beta 0.05 in the reward) and
  GRPOTrainer without reference (``grpo_noref``: beta 0, the paper's GRPO);
- ``lora_7b``: Qwen2.5-7B's architecture with LoRA r 16 on every linear projection: RGPO vs GRPO with the
  reference penalty (the reference is the adapter switched off, no second model);
- ``generation_1.5b``: RGPOTrainer at 1.5B with the generation options TRL offers without vLLM: plain
  ``generate``, transformers' continuous batching (``use_transformers_continuous_batching``) and a static KV
  cache (``cache_implementation="static"``).

Models are built from the configs below with random weights (the hubs are unreachable; step time and memory do
not depend on the weights), with a word-level tokenizer of the architecture's vocabulary size. The paper's
batch: 4 prompts x 4 completions = 16 sequences, every prompt exactly 256 tokens, every completion forced to
256 tokens (EOS suppressed with ``suppress_tokens``, the one length control that transformers' continuous
batching keeps; it drops ``min_new_tokens``), each generation batch reused twice (num_iterations 2), bf16,
activation checkpointing. Every run is a fresh trainer for (1 + measured) iterations; the first iteration (its
generation and its optimizer steps) is discarded. In round r the block's cases run in its order rotated by r.

A step is timed from ``on_step_begin`` to ``on_step_end`` (generation, scoring, loss, backward, optimizer;
CUDA synchronised at both ends), generation around TRL's ``_generate_single_turn``; completion tokens are
counted from the completion masks. A ratio A/B is the median over rounds of A's mean step time / B's in the
same round (rounds where both ran). Peak memory: ``torch.cuda.max_memory_allocated`` over a run (null on CPU).

A budget (``--budget-minutes``) stops the benchmark cleanly: a run starts only when the time left covers the
longest run of that case so far (else of its block, else of any); what does not fit is recorded as
``not_run_budget`` with everything after it, exit code 3. A case that raises is recorded as ``failed`` with
its error and the benchmark goes on (exit code 1). The CSV, JSON and Markdown are rewritten after every run,
so a run killed from outside leaves its finished rows (the rest ``pending``).

    python -m rgpo_lab.benchmarks.gpu_step --budget-minutes 8          # on a GPU; or: .ci/run_gpu
    python -m rgpo_lab.benchmarks.gpu_step --tiny --out /tmp/gpu_tiny   # CPU, tiny Qwen2, seconds
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PrinterCallback, Qwen2Config, Qwen2ForCausalLM, TrainerCallback

from rgpo_lab.benchmarks.common import ROOT

# the architectures' published config.json values (Qwen/Qwen2.5-1.5B-Instruct, Qwen/Qwen2.5-7B-Instruct)
ARCHS = {
    "qwen2.5-1.5b": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
}
TINY_ARCH = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=128,
    tie_word_embeddings=True,
)
# on CPU the default cache sizing takes tens of seconds per generation: a small fixed cache in tiny mode
TINY_CB = {"num_blocks": 16, "max_batch_tokens": 256}
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
SPECIALS = ["<pad>", "<eos>", "<unk>"]
PAD_ID, EOS_ID = 0, 1


@dataclass(frozen=True)
class Case:
    name: str
    arch: str
    method: str  # rgpo | grpo_ref | ppo | grpo_noref
    lora: bool = False
    generation: str = "generate"  # generate | continuous_batching | static_cache


BLOCKS: dict[str, list[Case]] = {
    "full_1.5b": [
        Case("rgpo", "qwen2.5-1.5b", "rgpo"),
        Case("grpo_ref", "qwen2.5-1.5b", "grpo_ref"),
        Case("ppo", "qwen2.5-1.5b", "ppo"),
        Case("grpo_noref", "qwen2.5-1.5b", "grpo_noref"),
    ],
    "lora_7b": [
        Case("rgpo", "qwen2.5-7b", "rgpo", lora=True),
        Case("grpo_ref", "qwen2.5-7b", "grpo_ref", lora=True),
    ],
    "generation_1.5b": [
        Case("generate", "qwen2.5-1.5b", "rgpo"),
        Case("continuous_batching", "qwen2.5-1.5b", "rgpo", generation="continuous_batching"),
        Case("static_cache", "qwen2.5-1.5b", "rgpo", generation="static_cache"),
    ],
}
# (numerator, denominator) per block
RATIOS = {
    "full_1.5b": [("rgpo", "grpo_ref"), ("rgpo", "ppo"), ("rgpo", "grpo_noref")],
    "lora_7b": [("rgpo", "grpo_ref")],
    "generation_1.5b": [("continuous_batching", "generate"), ("static_cache", "generate")],
}
FIELDS = (  # one CSV row per run
    "block round position case arch method lora generation status error steps_measured step_time_s "
    "generation_s generation_share prompt_tokens_per_generation completion_tokens_per_generation "
    "tokens_per_s peak_memory_gib peak_reserved_gib memory_at_start_gib wall_s"
).split()


@dataclass(frozen=True)
class Setup:
    tiny: bool
    prompts: int = 4
    generations: int = 4
    prompt_length: int = 256
    completion_length: int = 256
    num_iterations: int = 2
    warmup_iterations: int = 1
    measured_iterations: int = 1
    rounds: int = 2
    beta: float = 0.05
    learning_rate: float = 1e-6
    activation_checkpointing: bool = True
    bf16: bool = True
    # transformers' ContinuousBatchingConfig kwargs; None: its defaults (the cache sized from free memory)
    continuous_batching_config: dict | None = None


def now() -> float:
    return time.monotonic()


# ------------------------------------------------------------------------------------------- models and data
def arch_config(arch: str, tiny: bool) -> Qwen2Config:
    values = dict(TINY_ARCH if tiny else ARCHS[arch])
    return Qwen2Config(**values, pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=None)


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer with one token per id ("w<id>"), so any sampled id decodes and a prompt of n
    words is n tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )


def prompt_dataset(vocab_size: int, length: int, n: int):
    from datasets import Dataset

    rng = random.Random(0)
    words = [
        " ".join(f"w{rng.randrange(len(SPECIALS), vocab_size)}" for _ in range(length)) for _ in range(n)
    ]
    return Dataset.from_dict({"prompt": words})


def checksum_reward(completions, **kwargs) -> list[float]:
    """A cheap reward that varies across completions (so advantages are non-zero); its value is irrelevant."""
    return [(sum(map(ord, c)) % 97) / 97 for c in completions]


def random_policy(config: Qwen2Config, device: torch.device, dtype: torch.dtype, name_or_path: str):
    """The policy with random weights, built on the device; ``name_or_path`` is where GRPOTrainer loads the
    reference model (and PPORLHFTrainer its value model) from."""
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(config, dtype=dtype)
    model.config._name_or_path = name_or_path
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    return model


# --------------------------------------------------------------------------------------------- one run
class StepTimer(TrainerCallback):
    """Wall time of each optimizer step (generation included), CUDA synchronised at both ends."""

    def __init__(self, sync):
        self.sync, self.times, self._t0 = sync, [], 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.sync()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.sync()
        self.times.append(time.perf_counter() - self._t0)


def trainer_args(case: Case, setup: Setup, output_dir: str, use_cpu: bool) -> dict:
    steps = (setup.warmup_iterations + setup.measured_iterations) * setup.num_iterations
    args = dict(
        output_dir=output_dir,
        per_device_train_batch_size=setup.prompts * setup.generations,
        gradient_accumulation_steps=1,
        num_generations=setup.generations,
        num_iterations=setup.num_iterations,
        max_completion_length=setup.completion_length,
        generation_kwargs={"suppress_tokens": [EOS_ID]},  # every completion runs to max_completion_length
        learning_rate=setup.learning_rate,
        beta=0.0 if case.method == "grpo_noref" else setup.beta,
        max_steps=steps,
        bf16=setup.bf16,
        activation_checkpointing=setup.activation_checkpointing,
        use_cpu=use_cpu,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        disable_dropout=True,
        dataloader_num_workers=0,
        seed=0,
        temperature=1.0,
        use_transformers_continuous_batching=case.generation == "continuous_batching",
        cache_implementation="static" if case.generation == "static_cache" else None,
    )
    if case.generation == "continuous_batching" and setup.continuous_batching_config:
        args["transformers_continuous_batching_config"] = dict(setup.continuous_batching_config)
    if case.method in ("grpo_ref", "grpo_noref"):
        args["loss_type"] = "grpo"
    if case.method == "ppo" and setup.bf16:
        args["model_init_kwargs"] = {"dtype": "bfloat16"}  # the value model, loaded from the saved policy
    return args


def build_trainer(case: Case, setup: Setup, model_dir: str, output_dir: str):
    """The case's trainer on a fresh random policy (the reference / value model loaded from ``model_dir``)."""
    import trl

    from rgpo_trl import PPORLHFConfig, PPORLHFTrainer, RGPOConfig, RGPOTrainer

    use_cpu = setup.tiny or not torch.cuda.is_available()
    device = torch.device("cpu" if use_cpu else "cuda")
    dtype = torch.bfloat16 if setup.bf16 else torch.float32
    config = arch_config(case.arch, setup.tiny)
    args = trainer_args(case, setup, output_dir, use_cpu)
    config_cls, trainer_cls = {
        "rgpo": (RGPOConfig, RGPOTrainer),
        "ppo": (PPORLHFConfig, PPORLHFTrainer),
        "grpo_ref": (trl.GRPOConfig, trl.GRPOTrainer),
        "grpo_noref": (trl.GRPOConfig, trl.GRPOTrainer),
    }[case.method]
    extra = {}
    if case.lora:
        from peft import LoraConfig

        extra["peft_config"] = LoraConfig(**LORA)
    iterations = setup.warmup_iterations + setup.measured_iterations
    return trainer_cls(
        random_policy(config, device, dtype, model_dir),
        checksum_reward,
        args=config_cls(**args),
        train_dataset=prompt_dataset(
            config.vocab_size, setup.prompt_length, setup.prompts * (iterations + 1)
        ),
        processing_class=word_tokenizer(config.vocab_size),
        **extra,
    )


def run_case(case: Case, setup: Setup, model_dir: str) -> dict:
    """Train one fresh trainer for (warm-up + measured) iterations; the measurements of the measured ones."""
    cuda = torch.cuda.is_available() and not setup.tiny
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    at_start = torch.cuda.memory_allocated() / 2**30 if cuda else None  # > 0: an earlier run's leftovers
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(case, setup, model_dir, out)
        trainer.remove_callback(PrinterCallback)
        timer = StepTimer(sync)
        trainer.add_callback(timer)
        generation_s, prompt_tokens, completion_tokens = [], [], []
        generate = trainer._generate_single_turn
        score = trainer._generate_and_score_completions

        def timed_generate(*args, **kwargs):
            sync()
            t0 = time.perf_counter()
            out = generate(*args, **kwargs)
            sync()
            generation_s.append(time.perf_counter() - t0)
            return out

        def counted_score(*args, **kwargs):
            output = score(*args, **kwargs)
            prompt_tokens.append(int(output["prompt_mask"].sum()))
            completion_tokens.append(int(output["completion_mask"].sum()))
            return output

        trainer._generate_single_turn = timed_generate
        trainer._generate_and_score_completions = counted_score
        try:
            trainer.train()
        finally:
            del trainer
    skip = setup.warmup_iterations
    steps = timer.times[skip * setup.num_iterations :]
    gens, tokens = generation_s[skip:], completion_tokens[skip:]
    expected = (setup.warmup_iterations + setup.measured_iterations) * setup.num_iterations
    if (
        len(timer.times) != expected
        or len(generation_s) != setup.warmup_iterations + setup.measured_iterations
    ):
        raise RuntimeError(
            f"timed {len(timer.times)} steps and {len(generation_s)} generations, expected {expected}"
        )
    return {
        "steps_measured": len(steps),
        "step_time_s": statistics.fmean(steps),
        "generation_s": statistics.fmean(gens),
        "generation_share": sum(gens) / sum(steps),
        "prompt_tokens_per_generation": statistics.fmean(prompt_tokens[skip:]),
        "completion_tokens_per_generation": statistics.fmean(tokens),
        "tokens_per_s": sum(tokens) / sum(gens),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
        "memory_at_start_gib": at_start,
    }


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------- schedule
def schedule(blocks: list[str], rounds: int) -> list[dict]:
    """Every run in order: block by block; in round r the block's cases rotated by r."""
    rows = []
    for block in blocks:
        cases = BLOCKS[block]
        for r in range(rounds):
            order = cases[r % len(cases) :] + cases[: r % len(cases)]
            for position, case in enumerate(order):
                row = dict.fromkeys(FIELDS)
                row.update(block=block, round=r, position=position, case=case.name, arch=case.arch)
                row.update(method=case.method, lora=case.lora, generation=case.generation, status="pending")
                rows.append(row)
    return rows


def estimate_s(rows: list[dict], row: dict) -> float:
    """The longest earlier run of this case, else of its block, else of any block (0 for the first run)."""
    done = [r for r in rows if r["wall_s"] is not None]
    same_case = [r for r in done if (r["block"], r["case"]) == (row["block"], row["case"])]
    same_block = [r for r in done if r["block"] == row["block"]]
    return max(r["wall_s"] for r in same_case or same_block or done or [{"wall_s": 0.0}])


def run_all(rows: list[dict], setup: Setup, budget_s: float, model_dirs: dict, write) -> None:
    """Run the scheduled rows in order within the budget, writing the outputs after each."""
    start = now()
    cases = {(block, c.name): c for block, cs in BLOCKS.items() for c in cs}
    out_of_budget = False
    for row in rows:
        left = budget_s - (now() - start)
        if out_of_budget or left <= 0 or estimate_s(rows, row) > left:
            out_of_budget = True
            row.update(status="not_run_budget", error=f"{max(left, 0):.0f} s left of the budget")
            continue
        row["status"] = "running"
        write()
        t0 = now()
        case = cases[(row["block"], row["case"])]
        try:
            row.update(run_case(case, setup, model_dirs[case.arch]), status="ok")
        except Exception as err:  # recorded, and the benchmark goes on
            row.update(
                status="failed", error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            )
        row["wall_s"] = now() - t0
        free_memory()
        print(json.dumps({k: row[k] for k in ("block", "round", "case", "status", "step_time_s", "wall_s")}))
        write()


# --------------------------------------------------------------------------------------------- summary
def ratio_median(rows: list[dict], block: str, num: str, den: str, key: str) -> dict:
    ok = {(r["round"], r["case"]): r[key] for r in rows if r["block"] == block and r["status"] == "ok"}
    rounds = sorted({r["round"] for r in rows if r["block"] == block})
    per_round = [ok[(i, num)] / ok[(i, den)] for i in rounds if (i, num) in ok and (i, den) in ok]
    return {
        "median": statistics.median(per_round) if per_round else None,
        "min": min(per_round, default=None),
        "max": max(per_round, default=None),
        "rounds": len(per_round),
    }


def summarise(rows: list[dict], blocks: list[str]) -> dict:
    summary = {}
    for block in blocks:
        per_case = {}
        for case in BLOCKS[block]:
            ok = [r for r in rows if r["block"] == block and r["case"] == case.name and r["status"] == "ok"]
            keys = (
                "step_time_s",
                "generation_s",
                "generation_share",
                "tokens_per_s",
                "completion_tokens_per_generation",
                "peak_memory_gib",
            )
            per_case[case.name] = {"runs_ok": len(ok)} | {
                k: (statistics.median(r[k] for r in ok) if ok and ok[0][k] is not None else None)
                for k in keys
            }
        ratios = {
            f"{num}/{den}": {
                key: ratio_median(rows, block, num, den, key) for key in ("step_time_s", "generation_s")
            }
            for num, den in RATIOS[block]
        }
        summary[block] = {"per_case": per_case, "ratios": ratios}
    return summary


# --------------------------------------------------------------------------------------------- outputs
def environment() -> dict:
    import accelerate
    import peft
    import transformers
    import trl

    machine = {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "gpu": None,
        "gpu_memory_gib": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        machine.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "peft": peft.__version__,
        "accelerate": accelerate.__version__,
    }
    commit = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return {"machine": machine, "versions": versions, "git_commit": commit.stdout.strip() or None}


def fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: dict) -> str:
    setup, env = report["setup"], report["environment"]
    lines = [
        "# GPU step benchmark: RGPOTrainer vs GRPOTrainer vs PPO-RLHF (random weights)",
        "",
        f"Command: `{report['command']}` (commit {env['git_commit']}, {report['started']}); status "
        f"**{report['status']}**.",
        "",
        f"Machine: {env['machine']}. Versions: {env['versions']}.",
        "",
        f"Setup: {'tiny Qwen2 (CPU test mode)' if setup['tiny'] else 'Qwen2.5 architectures'}, "
        f"{setup['prompts']} prompts x {setup['generations']} completions, prompt {setup['prompt_length']} / "
        f"completion {setup['completion_length']} tokens (forced), num_iterations {setup['num_iterations']}, "
        f"beta {setup['beta']}, bf16 {setup['bf16']}, activation checkpointing "
        f"{setup['activation_checkpointing']}, LoRA {LORA}; {setup['rounds']} interleaved rounds, first "
        f"{setup['warmup_iterations']} iteration(s) of each run discarded, {setup['measured_iterations']} "
        f"measured. Budget {report['budget_minutes']} min.",
        "",
    ]
    for block, s in report["summary"].items():
        lines += [
            f"## {block}",
            "",
            "| case | runs ok | step (s) | generation (s) | generation share | tokens/s | tokens/generation "
            "| peak GiB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, c in s["per_case"].items():
            lines.append(
                f"| {name} | {c['runs_ok']} | {fmt(c['step_time_s'])} | {fmt(c['generation_s'])} | "
                f"{fmt(c['generation_share'])} | {fmt(c['tokens_per_s'], 1)} | "
                f"{fmt(c['completion_tokens_per_generation'], 0)} | {fmt(c['peak_memory_gib'], 1)} |"
            )
        lines += ["", "| ratio | step time (median, min-max, rounds) | generation time |", "|---|---|---|"]
        for name, r in s["ratios"].items():
            st, gen = r["step_time_s"], r["generation_s"]
            lines.append(
                f"| {name} | **{fmt(st['median'])}** ({fmt(st['min'])}-{fmt(st['max'])}, {st['rounds']}) | "
                f"{fmt(gen['median'])} |"
            )
        lines.append("")
    problems = [r for r in report["rows"] if r["status"] != "ok"]
    if problems:
        lines += ["## Runs not measured", ""]
        lines += [
            f"- {r['block']} round {r['round']} {r['case']}: {r['status']} {r['error'] or ''}"
            for r in problems
        ]
        lines.append("")
    lines.append("Step times are medians over rounds of each run's mean measured step; rows in gpu_step.csv.")
    return "\n".join(lines) + "\n"


def overall_status(rows: list[dict]) -> str:
    statuses = {r["status"] for r in rows}
    if "failed" in statuses:
        return "failed"
    if "not_run_budget" in statuses:
        return "budget"
    return "complete" if statuses == {"ok"} else "running"


def write_outputs(out: Path, report: dict) -> None:
    report["status"] = overall_status(report["rows"])
    report["summary"] = summarise(report["rows"], report["blocks"])
    with open(out / "gpu_step.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(report["rows"])
    (out / "gpu_step.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu_step.md").write_text(markdown(report))


def default_out() -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    return Path(ROOT) / "results" / "gpu" / datetime.date.today().isoformat()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.gpu_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tiny", action="store_true", help="tiny Qwen2 on CPU, 8/8 tokens (the test's mode)")
    parser.add_argument("--blocks", nargs="+", choices=list(BLOCKS), default=list(BLOCKS))
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds per block (>= 1)")
    parser.add_argument(
        "--measured-iterations", type=int, default=1, help="iterations measured per run (>= 1)"
    )
    parser.add_argument("--budget-minutes", type=float, default=60.0, help="time budget of all runs (> 0)")
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default $OUT or results/gpu/<date>)"
    )
    args = parser.parse_args(argv)
    for name in ("rounds", "measured_iterations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.budget_minutes >= 0:
        parser.error(f"--budget-minutes must be >= 0, got {args.budget_minutes}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        print("gpu_step: no CUDA GPU visible to torch; use --tiny for the CPU test mode", file=sys.stderr)
        return 2
    setup = Setup(tiny=args.tiny, rounds=args.rounds, measured_iterations=args.measured_iterations)
    if args.tiny:
        torch.set_num_threads(1)
        setup = Setup(
            **(
                asdict(setup)
                | dict(prompt_length=8, completion_length=8, bf16=False, continuous_batching_config=TINY_CB)
            )
        )
    out = args.out or default_out()
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "command": "python -m rgpo_lab.benchmarks.gpu_step "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "setup": asdict(setup),
        "lora": LORA,
        "blocks": args.blocks,
        "budget_minutes": args.budget_minutes,
        "rows": schedule(args.blocks, args.rounds),
    }
    write_outputs(out, report)
    with tempfile.TemporaryDirectory() as tmp:
        model_dirs = {}
        for arch in {c.arch for b in args.blocks for c in BLOCKS[b]}:
            # the reference / value model is loaded from disk; LoRA needs none (the adapter switched off)
            model_dirs[arch] = os.path.join(tmp, arch)
            if any(c.arch == arch and not c.lora for b in args.blocks for c in BLOCKS[b]):
                save_random_model(arch, setup, model_dirs[arch])
        gc.freeze()  # what exists now is never garbage: the trainers' gc.collect() calls skip it
        try:
            run_all(
                report["rows"],
                setup,
                args.budget_minutes * 60,
                model_dirs,
                lambda: write_outputs(out, report),
            )
        finally:
            gc.unfreeze()
    write_outputs(out, report)
    print(markdown(report))
    return {"complete": 0, "budget": 3}.get(report["status"], 1)


def save_random_model(arch: str, setup: Setup, directory: str) -> None:
    dtype = torch.bfloat16 if setup.bf16 else torch.float32
    device = "cpu" if setup.tiny or not torch.cuda.is_available() else "cuda"
    model = random_policy(arch_config(arch, setup.tiny), torch.device(device), dtype, directory)
    model.save_pretrained(directory)
    del model
    free_memory()


if __name__ == "__main__":
    sys.exit(main())
