"""Fine-tune your own model with RGPOTrainer and see what its trust region did.

    python examples/own_model.py --model Qwen/Qwen2.5-0.5B-Instruct   # a hub id, on a GPU
    python examples/own_model.py --model ./my-checkpoint              # a local folder
    python examples/own_model.py --tiny tiny-policy                   # offline: a 2-layer model, seconds
    python examples/own_model.py --tiny tiny-policy --prompts prompts.jsonl --reward my_rewards:score

Your prompts (--prompts) and reward function (--reward) need no edit of this file. Without a GPU it trains on
the CPU in float32. The closing lines say what changed: the reward, KLhat_old (the mean KL to the policy that
sampled the batch, per iteration) against kl_target, the KL-to-old coefficient the controller moved, and how
much the gate rejected.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import NoReturn

import torch
from datasets import Dataset

from rgpo_trl import RGPOConfig, RGPOTrainer

WORDS = ["hello", "what is", "tell me", "why", "how do i", "please", "can you", "where"]


def vowel_share(prompts, completions, **kwargs) -> list[float]:
    """A reward function: one float per completion (None to skip one). Text prompts give text completions,
    chat prompts give message lists; the dataset's other columns arrive as keyword arguments."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch in "aeiou" for ch in text) / max(len(text), 1) for text in texts]


def fail(message: str) -> NoReturn:
    """One line on stderr and exit status 1: a newcomer's mistake is not a traceback."""
    sys.exit(f"error: {message}")


def check_model_folder(option: str, path: str) -> None:
    """A local folder must hold a model (config.json, weights) and its tokenizer; hub ids are the hub's."""
    if not os.path.exists(path):
        if path.startswith((".", "/", "~")) or path.count("/") > 1:
            fail(f"{option} {path}: no such folder")
        return  # a hub id such as Qwen/Qwen2.5-0.5B-Instruct
    if not os.path.isdir(path):
        fail(f"{option} {path}: not a folder (a model folder holds config.json, weights and a tokenizer)")
    files = os.listdir(path)
    missing = [
        what
        for what, found in [
            ("config.json", "config.json" in files),
            ("weights (*.safetensors or *.bin)", any(f.endswith((".safetensors", ".bin")) for f in files)),
            ("a tokenizer (tokenizer_config.json)", {"tokenizer.json", "tokenizer_config.json"} & set(files)),
        ]
        if not found
    ]
    if missing:
        fail(f"{option} {path}: the folder lacks {', '.join(missing)} (save_pretrained writes them)")


def read_prompts(path: str) -> Dataset:
    """A .jsonl file: one JSON object per line with a "prompt" (text or chat messages); its other fields reach
    the reward as keyword arguments. Any other file: one text prompt per line. Blank lines are skipped."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = [(n, line.strip()) for n, line in enumerate(file, 1) if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        fail(f"--prompts {path}: cannot read it ({error.__class__.__name__}: {error})")
    if not lines:
        fail(f"--prompts {path}: the file has no prompts")
    if not path.endswith(".jsonl"):
        return Dataset.from_dict({"prompt": [line for _, line in lines]})
    rows = []
    for n, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            fail(f"--prompts {path}, line {n}: not JSON ({error.msg}); a .jsonl file holds one object a line")
        if not isinstance(row, dict) or "prompt" not in row:
            fail(f'--prompts {path}, line {n}: no "prompt" field')
        rows.append(row)
    return Dataset.from_list(rows)


def load_reward(spec: str) -> Callable:
    """``module:function``, the module importable from the current folder (or installed)."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        fail(f"--reward {spec}: expected module:function, e.g. my_rewards:score for score() in my_rewards.py")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        fail(f"--reward {spec}: cannot import {module_name} ({error}); run from the folder that holds it")
    function = getattr(module, function_name, None)
    if not callable(function):
        fail(f"--reward {spec}: {module_name} has no function {function_name}")
    return function


def on_cpu(asked: bool) -> bool:
    """Train on the CPU when asked or when no GPU is there (then say so)."""
    if not asked and not torch.cuda.is_available():
        print("No GPU found: training on the CPU in float32.")
    return asked or not torch.cuda.is_available()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a hub id or a local folder (a causal LM and its tokenizer)")
    parser.add_argument("--tiny", metavar="DIR", help="write the tiny offline test model to DIR and train it")
    parser.add_argument(
        "--prompts",
        metavar="FILE",
        help='your prompts: a .jsonl file with a "prompt" field (other fields reach the reward), or a text '
        "file, one prompt a line (default: 32 toy prompts)",
    )
    rewards = parser.add_mutually_exclusive_group()
    rewards.add_argument(
        "--reward",
        metavar="MODULE:FUNCTION",
        help="your reward function f(prompts, completions, **kwargs) -> list[float], e.g. my_rewards:score "
        "for score() in ./my_rewards.py (default: vowel_share)",
    )
    rewards.add_argument("--reward_model", help="a reward model (hub id or folder) instead of a function")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU (the default without a GPU)")
    parser.add_argument("--output_dir", default="own-model-rgpo")
    parser.add_argument("--max_steps", type=int, default=32, help="optimizer steps")
    parser.add_argument("--learning_rate", type=float, help="default: TRL's 1e-6; with --tiny 1e-2")
    parser.add_argument("--kl_target", type=float, default=0.02)
    parser.add_argument("--max_completion_length", type=int, help="default: 64; with --tiny 16")
    args = parser.parse_args()
    if (args.model is None) == (args.tiny is None):
        parser.error("give one of --model or --tiny")
    if args.model:
        check_model_folder("--model", args.model)
    if args.reward_model:
        check_model_folder("--reward_model", args.reward_model)
    reward = load_reward(args.reward) if args.reward else args.reward_model or vowel_share

    # a "prompt" column: text, or chat messages ([{"role": "user", "content": "..."}]); a hub dataset
    # works the same way, e.g. datasets.load_dataset("trl-lib/tldr", split="train")
    dataset = Dataset.from_dict({"prompt": [f"{word} {letter}?" for word in WORDS for letter in "abcd"]})
    if args.prompts:
        dataset = read_prompts(args.prompts)
    if args.tiny:
        from rgpo_trl.testing import save_tiny_model

        args.model = save_tiny_model(args.tiny)
    if args.learning_rate is None:
        args.learning_rate = 1e-2 if args.tiny else 1e-6
    cpu = on_cpu(args.cpu)
    config = RGPOConfig(
        output_dir=args.output_dir,
        use_cpu=cpu,
        bf16=not cpu,  # float32 on the CPU
        model_init_kwargs={"dtype": "float32"} if cpu else None,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",  # not TRL's decay to 0: the KL controller sizes the updates
        num_iterations=2,  # two passes over each generated batch: the second is off-policy (r_old != 1)
        kl_target=args.kl_target,  # the controller doubles kl_coef above 1.5x this, halves it below 1/1.5
        kl_coef=0.5,
        ratio_mode="dual",  # the gate sees max(pi/pi_old, pi/pi_ref)
        beta=0.05,  # the fixed KL-to-reference coefficient
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=args.max_completion_length or (16 if args.tiny else 64),
        max_steps=args.max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    # reward: a function, or a sequence-classification model with one label (hub id or folder)
    trainer = RGPOTrainer(model=args.model, reward_funcs=reward, args=config, train_dataset=dataset)
    trainer.train()

    # what changed, from the logs (one per optimizer step): TRL's reward and RGPO's rgpo/* metrics
    logs = [log for log in trainer.state.log_history if "rgpo/kl_coef" in log]
    rewards = [log["reward"] for log in logs if "reward" in log]  # logged when a batch is generated
    kl_old = [log["rgpo/kl_old_iteration"] for log in logs if "rgpo/kl_old_iteration" in log]
    coefs = [log["rgpo/kl_coef"] for log in logs] + [trainer.kl_coef]
    raised = sum(b > a for a, b in zip(coefs[:-1], coefs[1:], strict=True))
    lowered = sum(b < a for a, b in zip(coefs[:-1], coefs[1:], strict=True))
    rejected = max(log["rgpo/rejected_frac"] for log in logs)
    n = max(1, len(rewards) // 4)
    first, last = sum(rewards[:n]) / n, sum(rewards[-n:]) / n
    print(
        f"RGPO, {len(logs)} optimizer steps ({len(kl_old)} iterations), learning rate {args.learning_rate:g}:"
    )
    for name, values, note in [
        ("reward", f"first {first:.4f} last {last:.4f}", f"mean of the first and last {n} generated batches"),
        (
            "kl_old",
            f"max {max(kl_old):.5f} last {kl_old[-1]:.5f} target {args.kl_target:g}",
            "KLhat_old, the mean KL to pi_old",
        ),
        (
            "kl_coef",
            f"first {coefs[0]:g} last {coefs[-1]:g} raised {raised} lowered {lowered}",
            "the KL-to-old coefficient",
        ),
        ("rejected_frac", f"max {rejected:.4f}", "tokens the gate rejects, g < 0.1"),
    ]:
        print(f"  {name:<14} {values:<48} ({note})")


if __name__ == "__main__":
    main()
