"""A tiny offline trainer setup for tests, benchmarks and examples: a character-level tokenizer, a 2-layer
Qwen2 policy built from a config, a prompt dataset, a cheap reward and RGPOConfig/GRPOConfig arguments.
Nothing touches the hub. (The HH-RLHF recipe's tiny-HH world, `recipes.tiny_hh` in a checkout, is the
realistic offline default; this is the smallest thing a trainer step can run on.)"""

from __future__ import annotations

import torch
from datasets import Dataset
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHARS = "abcdefghijklmnopqrstuvwxyz .,?!"
SPECIALS = ["<pad>", "<eos>", "<unk>"]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )


def tiny_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0, hidden: int = 32) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def tiny_dataset(n: int = 16) -> Dataset:
    words = ["hello", "what is", "tell me", "why", "how do i", "please", "can you", "where"]
    prompts = [f"{words[i % len(words)]} {CHARS[i % 26]}?" for i in range(n)]
    return Dataset.from_dict({"prompt": prompts})


def vowel_reward(completions, **kwargs) -> list[float]:
    """Share of vowels in the completion: cheap, varied across samples, so advantages are non-zero."""
    return [sum(c in "aeiou" for c in text) / max(len(text), 1) for text in completions]


def base_args(output_dir, **overrides) -> dict:
    args = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-2,
        num_iterations=2,
        beta=0.05,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        temperature=1.0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    args.update(overrides)
    return args


def save_tiny_model(directory, seed: int = 0, hidden: int = 32) -> str:
    """Write the tiny policy and its tokenizer to ``directory`` (GRPOTrainer builds the reference model from
    the policy's path when ``beta != 0``, so the policy is passed as a local path, as a hub id would be)."""
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=seed, hidden=hidden)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return str(directory)
