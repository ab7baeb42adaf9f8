"""Fine-tune your own model with RGPOTrainer and see what its trust region did.

    python examples/own_model.py --model Qwen/Qwen2.5-0.5B-Instruct   # a hub id, on a GPU
    python examples/own_model.py --model ./my-checkpoint --cpu        # a local folder
    python examples/own_model.py --tiny tiny-policy --cpu             # offline: a 2-layer model, 1 minute

The same code trains each; replace the prompts and the reward with yours. The closing lines say what changed:
the reward, KLhat_old (the mean KL to the policy that sampled the batch, per iteration) against kl_target, the
KL-to-old coefficient the controller moved, and how much the gate rejected.
"""

from __future__ import annotations

import argparse

from datasets import Dataset

from rgpo_trl import RGPOConfig, RGPOTrainer

WORDS = ["hello", "what is", "tell me", "why", "how do i", "please", "can you", "where"]


def vowel_share(prompts, completions, **kwargs) -> list[float]:
    """A reward function: one float per completion (None to skip one). Text prompts give text completions,
    chat prompts give message lists; the dataset's other columns arrive as keyword arguments."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch in "aeiou" for ch in text) / max(len(text), 1) for text in texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a hub id or a local folder (a causal LM and its tokenizer)")
    parser.add_argument("--tiny", metavar="DIR", help="write the tiny offline test model to DIR and train it")
    parser.add_argument("--reward_model", help="a reward model (hub id or folder) instead of vowel_share")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU")
    parser.add_argument("--output_dir", default="own-model-rgpo")
    parser.add_argument("--max_steps", type=int, default=32, help="optimizer steps")
    parser.add_argument("--learning_rate", type=float, help="default: TRL's 1e-6; with --tiny 1e-2")
    parser.add_argument("--kl_target", type=float, default=0.02)
    parser.add_argument("--max_completion_length", type=int, help="default: 64; with --tiny 16")
    args = parser.parse_args()
    if (args.model is None) == (args.tiny is None):
        parser.error("give one of --model or --tiny")
    if args.tiny:
        from rgpo_trl.testing import save_tiny_model

        args.model = save_tiny_model(args.tiny)
    if args.learning_rate is None:
        args.learning_rate = 1e-2 if args.tiny else 1e-6

    # a "prompt" column: text, or chat messages ([{"role": "user", "content": "..."}]); a hub dataset
    # works the same way, e.g. datasets.load_dataset("trl-lib/tldr", split="train")
    dataset = Dataset.from_dict({"prompt": [f"{word} {letter}?" for word in WORDS for letter in "abcd"]})
    config = RGPOConfig(
        output_dir=args.output_dir,
        use_cpu=args.cpu,
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
    reward = args.reward_model or vowel_share  # a sequence-classification model with one label, or a function
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
