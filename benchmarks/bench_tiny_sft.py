"""The tiny-HH policy's SFT step: the builder's own loop vs TRL's SFTTrainer, same data, same settings.

    OMP_NUM_THREADS=1 python benchmarks/bench_tiny_sft.py [--quick] [--rounds 2]

The issue asked for TRL's SFTTrainer (as RewardTrainer is used for the reward model) unless a measured reason
says otherwise. This benchmark is that measurement: both run on the same dialogues, tokenizer, model config,
batch size, epochs, learning rate and warm-up, interleaved (ABBA) in one process, one torch thread. The
SFTTrainer variant lives here, not in the package. Writes ``benchmarks/results/tiny_sft.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rgpo_trl.tiny_hh import build  # noqa: E402
from rgpo_trl.tiny_hh.build import BuildSettings  # noqa: E402
from rgpo_trl.tiny_hh.dialogues import _items, generate_dialogues, make_response, sample_kind  # noqa: E402
from rgpo_trl.tiny_hh.tokenizers import make_policy_tokenizer, train_bpe  # noqa: E402
from rgpo_trl.tiny_hh.world import find_item  # noqa: E402


def train_policy_with_sfttrainer(tok, train_rows, s: BuildSettings, seed: int, workdir: Path, log):
    """TRL's SFTTrainer on conversational prompt/completion pairs (loss on the completion only). The targets
    are a *mix* of response kinds (RESPONSE_KINDS weights), so the policy's samples have mixed gold
    quality."""
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl import SFTConfig, SFTTrainer

    from rgpo_trl.rlhf.hh_data import hh_text_to_prompt

    torch.manual_seed(seed)
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=s.policy_hidden,
        intermediate_size=2 * s.policy_hidden,
        num_hidden_layers=s.policy_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        rope_theta=10000.0,
        use_cache=True,
    )
    model = Qwen2ForCausalLM(cfg)
    rng = random.Random(seed + 1)
    prompts, completions = [], []
    for row in train_rows:
        prompt = hh_text_to_prompt(row["chosen"])
        item = find_item(prompt[-1]["content"])
        topic, parts = item[1], next(p for t, sbj, p in _items() if sbj == item[0])
        prompts.append(prompt)
        completions.append(
            [{"role": "assistant", "content": make_response(sample_kind(rng), topic, parts, rng)}]
        )
    dataset = Dataset.from_dict({"prompt": prompts, "completion": completions})
    args = SFTConfig(
        output_dir=str(workdir / "sft_trainer"),
        per_device_train_batch_size=s.sft_batch_size,
        num_train_epochs=s.sft_epochs,
        learning_rate=s.sft_lr,
        lr_scheduler_type="linear",
        warmup_steps=20,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        seed=seed,
        data_seed=seed,
        use_cpu=True,
        disable_tqdm=True,
        bf16=False,
        dataloader_num_workers=0,
        max_length=None,
        completion_only_loss=True,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok)
    t0 = time.time()
    out = trainer.train()
    log(f"policy SFT (SFTTrainer) in {time.time() - t0:.1f}s, final train loss {out.training_loss:.3f}")
    model = trainer.model.eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = None
    return model, float(out.training_loss)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the builder's QUICK settings (default: FULL)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tiny_sft"))
    a = p.parse_args()
    torch.set_num_threads(1)
    s = build.QUICK if a.quick else build.FULL
    rows = generate_dialogues(s.n_train, build.DEFAULT_SEED)
    tok = make_policy_tokenizer(train_bpe([r[k] for r in rows for k in ("chosen", "rejected")], s.vocab_size))
    times = {"builder_loop": [], "sfttrainer": []}
    for rnd in range(a.rounds):
        for name in ("builder_loop", "sfttrainer") if rnd % 2 == 0 else ("sfttrainer", "builder_loop"):
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as d:
                if name == "builder_loop":
                    build._train_policy(tok, rows, s, build.DEFAULT_SEED, lambda m: None)
                else:
                    train_policy_with_sfttrainer(tok, rows, s, build.DEFAULT_SEED, Path(d), lambda m: None)
            times[name].append(time.perf_counter() - t0)
            print(name, round(times[name][-1], 1), flush=True)
    ratio = statistics.median(times["sfttrainer"]) / statistics.median(times["builder_loop"])
    command = (
        "OMP_NUM_THREADS=1 python benchmarks/bench_tiny_sft.py"
        + (" --quick" if a.quick else "")
        + f" --rounds {a.rounds}"
    )
    result = {
        "command": command,
        "settings": "QUICK" if a.quick else "FULL",
        "rows": len(rows),
        "seconds": times,
        "sfttrainer_over_builder_loop": ratio,
        "torch": torch.__version__,
        "platform": platform.platform(),
        "load_average_at_end": os.getloadavg(),
    }
    Path(a.out + ".json").write_text(json.dumps(result, indent=2))
    md = [
        "# tiny-HH policy SFT: the builder's loop vs TRL's SFTTrainer",
        "",
        f"Command: `{command}`  ",
        f"{result['settings']} settings ({len(rows)} dialogues, {s.sft_epochs} epoch(s), batch "
        f"{s.sft_batch_size}), interleaved rounds, one torch thread; load average at the end "
        f"{os.getloadavg()[0]:.1f} (shared 2-core machine).",
        "",
        "| variant | seconds per round | median |",
        "|---|---|---|",
        *[
            f"| {k} | {', '.join(f'{t:.1f}' for t in v)} | {statistics.median(v):.1f} |"
            for k, v in times.items()
        ],
        "",
        f"SFTTrainer / builder loop: **{ratio:.2f}x** the time. Likely causes (not measured separately): the "
        "builder's loop computes the LM head on the response positions only and has no per-step Trainer "
        "overhead.",
    ]
    Path(a.out + ".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
