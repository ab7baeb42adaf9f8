"""Builds, evaluates and caches the tiny-HH assets (see the package docstring)."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..hh_common.hh_data import hh_text_to_prompt, parse_hh_dialogue
from ..hh_common.rewards import PairwiseRewardModel
from .dialogues import generate_dialogues, write_jsonl
from .gold_v3 import gold_reward_func_v3, gold_score_v3, keyword_salad
from .responses import _items, make_response, sample_kind
from .tokenizers import (
    make_policy_tokenizer,
    make_policy_tokenizer_template_text,
    make_rm_tokenizer,
    train_bpe,
)
from .world import find_item, gold_reward_func, gold_score

BUILDER_VERSION = 3  # the world the recipe uses by default
VERSIONS = (2, 3)  # v2: the world of the committed v2 results, still buildable
DEFAULT_SEED = 1234
CACHE_ENV = "RGPO_TRL_CACHE"


# --------------------------------------------------------------------------------------------
# Builder
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildSettings:
    n_train: int
    n_test: int
    vocab_size: int
    sft_epochs: int
    sft_batch_size: int
    sft_lr: float
    rm_epochs: int
    rm_batch_size: int
    rm_lr: float
    policy_hidden: int = 64
    policy_layers: int = 2
    rm_hidden: int = 64
    rm_layers: int = 2
    n_policy_samples: int = 64
    rm_train_pairs: int | None = None  # first N training rows for the reward model (None: all)


FULL = BuildSettings(
    n_train=6000,
    n_test=600,
    vocab_size=2048,
    sft_epochs=2,
    sft_batch_size=20,
    sft_lr=4e-3,
    rm_epochs=1,
    rm_batch_size=32,
    rm_lr=2e-3,
    rm_train_pairs=4000,
)
QUICK = BuildSettings(
    n_train=800,
    n_test=200,
    vocab_size=1024,
    sft_epochs=1,
    sft_batch_size=32,
    sft_lr=5e-3,
    rm_epochs=2,
    rm_batch_size=32,
    rm_lr=3e-3,
    n_policy_samples=16,
)


@dataclass(frozen=True)
class TinyAssets:
    root: Path
    train_file: Path
    test_file: Path
    policy_dir: Path
    reward_model_dir: Path
    build_info_file: Path
    validation_file: Path  # world v3 only: prompts for model selection, disjoint from training and test

    @property
    def data_dir(self) -> Path:
        return self.train_file.parent

    @property
    def build_info(self) -> dict[str, Any]:
        return json.loads(self.build_info_file.read_text())

    @classmethod
    def at(cls, root: str | os.PathLike) -> TinyAssets:
        root = Path(root)
        return cls(
            root=root,
            train_file=root / "data" / "train.jsonl",
            test_file=root / "data" / "test.jsonl",
            policy_dir=root / "policy",
            reward_model_dir=root / "reward_model",
            build_info_file=root / "build_info.json",
            validation_file=root / "data" / "validation.jsonl",
        )

    def exists(self) -> bool:
        return (
            self.build_info_file.is_file()
            and (self.policy_dir / "config.json").is_file()
            and (self.reward_model_dir / "config.json").is_file()
        )

    def built(self, version: int, seed: int) -> bool:
        """Whether complete assets of world ``version`` and ``seed`` are here: the cache's test (anything
        else is rebuilt)."""
        info = self.build_info if self.exists() else {}
        return (info.get("builder_version"), info.get("seed")) == (version, seed)


def default_cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rgpo_trl").expanduser()


def check_version(version: int) -> int:
    if version not in VERSIONS:
        raise ValueError(f"tiny-HH world version must be one of {list(VERSIONS)}, got {version!r}")
    return version


def gold_for(version: int):
    """The gold rule of a world version: (score(prompt, completion), TRL reward function named ``gold``)."""
    return (
        (gold_score, gold_reward_func)
        if check_version(version) == 2
        else (gold_score_v3, gold_reward_func_v3)
    )


def assets_dir(
    cache_dir: str | os.PathLike | None = None,
    *,
    quick: bool = False,
    seed: int = DEFAULT_SEED,
    version: int = BUILDER_VERSION,
) -> Path:
    """Where the assets for (version, quick, seed) live: ``<root>/tiny_hh/v<VERSION>[-quick][-seed<N>]``."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    name = (
        f"v{check_version(version)}"
        + ("-quick" if quick else "")
        + (f"-seed{seed}" if seed != DEFAULT_SEED else "")
    )
    return root / "tiny_hh" / name


def _log(msg: str, verbose: bool) -> None:
    if verbose:
        print(f"[tiny_hh] {msg}", file=sys.stderr, flush=True)


def _train_policy(tok, train_rows, s: BuildSettings, seed: int, log):
    """SFT with a hand-written loop rather than TRL's SFTTrainer: on these assets SFTTrainer is several times
    slower (results/benchmarks/tiny_sft.md), which would make the demo's asset build minutes longer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

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
    # SFT targets: a *mix* of response kinds (RESPONSE_KINDS weights), so samples have mixed quality
    rng = random.Random(seed + 1)
    examples = []
    for row in train_rows:
        prompt = hh_text_to_prompt(row["chosen"])
        item = find_item(prompt[-1]["content"])
        topic, parts = item[1], next(p for t, sbj, p in _items() if sbj == item[0])
        response = make_response(sample_kind(rng), topic, parts, rng)
        p_ids = tok(
            tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
        r_ids = tok(response, add_special_tokens=False)["input_ids"] + [eos]
        examples.append((p_ids + r_ids, [-100] * len(p_ids) + r_ids))
    opt = torch.optim.AdamW(model.parameters(), lr=s.sft_lr, weight_decay=0.0)
    n_steps = s.sft_epochs * ((len(examples) + s.sft_batch_size - 1) // s.sft_batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / 20) * max(0.05, 1 - i / n_steps)
    )
    model.train()
    step = 0
    for epoch in range(s.sft_epochs):
        order = list(range(len(examples)))
        random.Random(seed + 10 + epoch).shuffle(order)
        for b in range(0, len(order), s.sft_batch_size):
            batch = [examples[i] for i in order[b : b + s.sft_batch_size]]
            L = max(len(x) for x, _ in batch)
            ids = torch.full((len(batch), L), pad, dtype=torch.long)
            labels = torch.full((len(batch), L), -100, dtype=torch.long)
            att = torch.zeros((len(batch), L), dtype=torch.long)
            for j, (x, y) in enumerate(batch):
                ids[j, : len(x)] = torch.tensor(x)
                labels[j, : len(y)] = torch.tensor(y)
                att[j, : len(x)] = 1
            # next-token loss on response tokens only; the LM head runs on those positions only (cheap on CPU)
            hidden = model.model(input_ids=ids, attention_mask=att).last_hidden_state[:, :-1]
            tgt = labels[:, 1:]
            keep = tgt != -100
            loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]), tgt[keep])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            if step % 50 == 0 or step == n_steps:
                log(f"policy SFT step {step}/{n_steps} loss {loss.item():.3f}")
    model.eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = None
    return model, float(loss.item())


def _train_reward_model(rm_tok, train_rows, s: BuildSettings, seed: int, workdir: Path, log):
    import torch
    from datasets import Dataset
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    torch.manual_seed(seed)
    cfg = DebertaV2Config(
        vocab_size=len(rm_tok),
        hidden_size=s.rm_hidden,
        num_hidden_layers=s.rm_layers,
        num_attention_heads=4,
        intermediate_size=2 * s.rm_hidden,
        max_position_embeddings=rm_tok.model_max_length,
        type_vocab_size=0,
        relative_attention=True,
        position_buckets=32,
        max_relative_positions=-1,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        pooler_hidden_size=s.rm_hidden,
        pooler_hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pooler_dropout=0.0,
        num_labels=1,
        pad_token_id=rm_tok.pad_token_id,
    )
    model = DebertaV2ForSequenceClassification(cfg)
    # Pre-tokenize as text pairs, exactly like recipes.hh_common.rewards.PairwiseRewardModel encodes them:
    # RewardTrainer would otherwise concatenate prompt+completion into one text (no pair encoding).
    # type_vocab_size=0, so the token_type_ids the collator drops carry no information anyway.
    chosen_ids, rejected_ids = [], []
    for row in train_rows:
        c, r = parse_hh_dialogue(row["chosen"]), parse_hh_dialogue(row["rejected"])
        q = c[-2]["content"]
        enc = rm_tok(
            [q, q],
            [c[-1]["content"], r[-1]["content"]],
            truncation="longest_first",
            max_length=rm_tok.model_max_length,
        )
        chosen_ids.append(enc["input_ids"][0])
        rejected_ids.append(enc["input_ids"][1])
    ds = Dataset.from_dict({"chosen_ids": chosen_ids, "rejected_ids": rejected_ids})
    args = RewardConfig(
        output_dir=str(workdir / "rm_trainer"),
        per_device_train_batch_size=s.rm_batch_size,
        num_train_epochs=s.rm_epochs,
        learning_rate=s.rm_lr,
        lr_scheduler_type="linear",
        warmup_steps=20,
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        seed=seed,
        data_seed=seed,
        use_cpu=True,
        disable_tqdm=True,
        max_length=None,
        bf16=False,
        dataloader_num_workers=0,
        weight_decay=0.0,
    )
    trainer = RewardTrainer(model=model, args=args, train_dataset=ds, processing_class=rm_tok)
    # no per-50-step metric dicts on stdout (the builder logs its own lines to stderr; stdout is the manifest)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    t0 = time.time()
    out = trainer.train()
    log(f"reward model trained in {time.time() - t0:.1f}s, final train loss {out.training_loss:.3f}")
    model = trainer.model.eval()
    return model, float(out.training_loss)


def _eval_reward_model(rm_dir: Path, test_rows) -> dict[str, float]:
    rm = PairwiseRewardModel(str(rm_dir), batch_size=64)
    prompts = [hh_text_to_prompt(r["chosen"]) for r in test_rows]
    ch = [parse_hh_dialogue(r["chosen"])[-1]["content"] for r in test_rows]
    rj = [parse_hh_dialogue(r["rejected"])[-1]["content"] for r in test_rows]
    sc, sr = rm(prompts, ch), rm(prompts, rj)
    acc = sum(a > b for a, b in zip(sc, sr, strict=True)) / len(test_rows)
    # rank correlation-ish sanity: accuracy restricted to pairs with a large gold margin
    big = [
        (a > b)
        for a, b, r in zip(sc, sr, test_rows, strict=True)
        if r["chosen_gold"] - r["rejected_gold"] >= 1.5
    ]
    return {
        "rm_heldout_pairwise_accuracy": acc,
        "rm_heldout_accuracy_gold_margin_ge_1.5": (sum(big) / len(big)) if big else float("nan"),
        "rm_heldout_pairs": len(test_rows),
    }


def sample_policy(
    policy_dir: str | os.PathLike,
    prompts,
    *,
    max_new_tokens: int = 48,
    seed: int = 0,
    do_sample: bool = True,
    temperature: float = 1.0,
) -> list[str]:
    """Generate one completion per conversational prompt with the chat template (left padding)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    texts = [tok.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True) for p in prompts]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
        )
    return tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def _eval_policy(policy_dir: Path, test_rows, n: int, seed: int, gold=gold_score) -> dict[str, Any]:
    prompts = [hh_text_to_prompt(r["chosen"]) for r in test_rows[:n]]
    comps = sample_policy(policy_dir, prompts, seed=seed)
    golds = [gold(p, c) for p, c in zip(prompts, comps, strict=True)]
    return {
        "policy_sample_gold_mean": sum(golds) / len(golds),
        "policy_sample_good_fraction": sum(g >= 3.0 for g in golds) / len(golds),
        "policy_sample_bad_fraction": sum(g < 1.5 for g in golds) / len(golds),
        "policy_samples": len(golds),
        "policy_sample_examples": comps[:4],
    }


def _calibration(rm_dir: Path, test_rows, gold) -> dict[str, Any]:
    """World v3's calibration table: a scripted ideal answer's gold, keyword salad's gold, and the proxy
    reward model's scores for both on the test prompts (does the proxy prefer salad?)."""
    prompts = [hh_text_to_prompt(r["chosen"]) for r in test_rows]
    ideal, salad = [], []
    for p in prompts:
        item = find_item(p[-1]["content"])
        parts = next(pt for _, sbj, pt in _items() if sbj == item[0])
        body = ", ".join(c for _, c in parts[:-1]) + ", and " + parts[-1][1]
        ideal.append(f"Sure! {body[0].upper()}{body[1:]}. Hope this helps!")
        salad.append(keyword_salad(parts))
    rm = PairwiseRewardModel(str(rm_dir), batch_size=64)
    rm_ideal, rm_salad = rm(prompts, ideal), rm(prompts, salad)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {
        "calibration_prompts": len(prompts),
        "ideal_answer_gold_mean": mean([gold(p, c) for p, c in zip(prompts, ideal, strict=True)]),
        "keyword_salad_gold_mean": mean([gold(p, c) for p, c in zip(prompts, salad, strict=True)]),
        "proxy_ideal_answer_mean": mean(rm_ideal),
        "proxy_keyword_salad_mean": mean(rm_salad),
        "proxy_prefers_salad_fraction": mean([float(s > i) for s, i in zip(rm_salad, rm_ideal, strict=True)]),
        "calibration_examples": {"ideal": ideal[0], "salad": salad[0]},
    }


def build_tiny_assets(
    cache_dir: str | os.PathLike | None = None,
    *,
    force: bool = False,
    quick: bool = False,
    seed: int = DEFAULT_SEED,
    num_threads: int | None = 1,
    verbose: bool = True,
    version: int = BUILDER_VERSION,
) -> TinyAssets:
    """Build (or reuse from the cache) the tiny-HH assets and return their paths.

    ``cache_dir`` replaces the cache root (default ``$RGPO_TRL_CACHE`` or ``~/.cache/rgpo_trl``);
    the assets go to :func:`assets_dir`. ``quick=True`` builds a smaller variant (~30 s) for tests.
    ``num_threads`` caps torch's intra-op threads during the build (restored afterwards).
    The directory is written under a temporary name and renamed when complete, so concurrent
    builders never see half-written assets. ``version`` 3 (default) is the world with disjoint train /
    validation / test questions and the well-formedness gold (`splits`, `gold_v3`); 2 the world of the
    committed v2 results, built exactly as before.
    """
    target = assets_dir(cache_dir, quick=quick, seed=seed, version=version)
    assets = TinyAssets.at(target)
    if not force and assets.built(version, seed):
        return assets
    gold, _ = gold_for(version)
    import torch

    s = QUICK if quick else FULL
    log = lambda m: _log(m, verbose)  # noqa: E731
    old_threads = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    t_start = time.time()
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / "data").mkdir(parents=True)
        tmp_assets = TinyAssets.at(tmp)
        log(f"building {'quick ' if quick else ''}tiny-HH assets v{version} (seed {seed}) in {target}")
        validation_rows = []
        if version == 2:
            train_rows = generate_dialogues(s.n_train, seed)
            test_rows = generate_dialogues(s.n_test, seed + 7919)
        else:  # disjoint question splits; the validation set is as large as the test set
            train_rows = generate_dialogues(s.n_train, seed, split="train", gold=gold)
            validation_rows = generate_dialogues(s.n_test, seed + 104729, split="validation", gold=gold)
            test_rows = generate_dialogues(s.n_test, seed + 7919, split="test", gold=gold)
            write_jsonl(validation_rows, tmp_assets.validation_file)
        write_jsonl(train_rows, tmp_assets.train_file)
        write_jsonl(test_rows, tmp_assets.test_file)
        log(
            f"dialogues: {len(train_rows)} train / {len(validation_rows)} validation / {len(test_rows)} test "
            f"rows ({time.time() - t_start:.1f}s)"
        )

        texts = [r[k] for r in train_rows for k in ("chosen", "rejected")]
        texts += [
            make_policy_tokenizer_template_text(hh_text_to_prompt(r["chosen"])) for r in train_rows[:200]
        ]
        texts += [" ".join(str(i) for i in range(2100))] * 4  # digits, so the tokenizer knows numbers
        bpe = train_bpe(texts, s.vocab_size)
        pol_tok, rm_tok = make_policy_tokenizer(bpe), make_rm_tokenizer(bpe)
        log(f"tokenizer: {len(pol_tok)} tokens ({time.time() - t_start:.1f}s)")

        t0 = time.time()
        policy, sft_loss = _train_policy(pol_tok, train_rows, s, seed, log)
        policy.save_pretrained(tmp_assets.policy_dir)
        pol_tok.save_pretrained(tmp_assets.policy_dir)
        t_policy = time.time() - t0
        log(f"policy: {sum(p.numel() for p in policy.parameters())} params, SFT {t_policy:.1f}s")

        t0 = time.time()
        rm, rm_loss = _train_reward_model(rm_tok, train_rows[: s.rm_train_pairs], s, seed, tmp, log)
        rm.save_pretrained(tmp_assets.reward_model_dir)
        rm_tok.save_pretrained(tmp_assets.reward_model_dir)
        shutil.rmtree(tmp / "rm_trainer", ignore_errors=True)
        t_rm = time.time() - t0

        t0 = time.time()
        rm_eval = _eval_reward_model(tmp_assets.reward_model_dir, test_rows)
        pol_eval = _eval_policy(tmp_assets.policy_dir, test_rows, s.n_policy_samples, seed, gold)
        calibration = {} if version == 2 else _calibration(tmp_assets.reward_model_dir, test_rows, gold)
        log(
            f"RM held-out pairwise accuracy {rm_eval['rm_heldout_pairwise_accuracy']:.3f}; policy sample "
            f"gold mean {pol_eval['policy_sample_gold_mean']:.2f} ({time.time() - t0:.1f}s)"
        )
        info = {
            "builder_version": version,
            "seed": seed,
            "quick": quick,
            "settings": s.__dict__,
            "n_train_rows": len(train_rows),
            "n_test_rows": len(test_rows),
            **({"n_validation_rows": len(validation_rows)} if validation_rows else {}),
            "vocab_size": len(pol_tok),
            "policy_class": type(policy).__name__,
            "policy_params": sum(p.numel() for p in policy.parameters()),
            "reward_model_class": type(rm).__name__,
            "reward_model_params": sum(p.numel() for p in rm.parameters()),
            "reward_question_mode": "last_user",
            "reward_truncation": "longest_first",
            "policy_sft_final_loss": sft_loss,
            "rm_train_loss": rm_loss,
            **rm_eval,
            **pol_eval,
            **calibration,
            "build_time_s": round(time.time() - t_start, 1),
            "policy_sft_time_s": round(t_policy, 1),
            "rm_train_time_s": round(t_rm, 1),
            "torch_threads": torch.get_num_threads(),
            "versions": _versions(),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        tmp_assets.build_info_file.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        if assets.exists() and not force:
            log("another process finished the same build first; keeping its assets")
        else:
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
        log(f"done in {info['build_time_s']}s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        torch.set_num_threads(old_threads)
    return TinyAssets.at(target)


def _versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers
    import trl

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "tokenizers": tokenizers.__version__,
    }
