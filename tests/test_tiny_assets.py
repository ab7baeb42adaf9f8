"""The embedded tiny-HH assets: gold rule, deterministic data, quick build, Auto-class reloading.

The quick build (~1 min on 2 shared cores) is made once per session into the cache
(``$RGPO_TRL_CACHE`` or ``~/.cache/rgpo_trl``), so later runs reuse it. Set
``RGPO_TRL_TEST_FRESH_BUILD=1`` to build into a pytest temporary directory instead.
"""

from __future__ import annotations

import json
import random
import time

import pytest
import torch
from conftest import assets_cache_root

from recipes import tiny_hh
from recipes.hh_common.hh_data import hh_text_to_prompt, load_hh_helpful_prompts, parse_hh_dialogue
from recipes.tiny_hh import (
    BUILDER_VERSION,
    assets_dir,
    build_tiny_assets,
    generate_dialogues,
    gold_components,
    gold_score,
    write_jsonl,
)
from recipes.tiny_hh import responses as tiny_responses
from recipes.tiny_hh.__main__ import main as tiny_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ------------------------------------------------------------------ gold rule (hand-computed references)
def test_gold_rule_components_by_hand():
    q = [{"role": "user", "content": "How do I boil an egg?"}]
    ideal = (
        "Sure! Put the egg in boiling water, leave it for about nine minutes, and then cool it in cold water."
    )
    assert gold_components(q, ideal) == {
        "answers": 1.0,
        "on_topic": 1.0,
        "polite": 1.0,
        "rude": 0.0,
        "repetition": 0.0,
        "length_penalty": 0.0,
    }
    assert gold_score(q, ideal) == pytest.approx(3.5)
    # terse: no politeness -> 3.0 ; rude: 2 + 1 - 1.5 * 2 ("ugh", "obviously") = 0.0
    assert gold_score(q, "Put the egg in boiling water for nine minutes, then cool it in cold water.") == 3.0
    assert gold_score(
        q, "Ugh, obviously put it in boiling water for minutes, then cold water."
    ) == pytest.approx(0.0)
    # partial (1 of 3 key words) + polite: 2/3 + 1 + 0.5
    assert gold_score(q, "Sure! Use boiling water.") == pytest.approx(2 / 3 + 1.5)
    # off topic: key words of another topic only -> on_topic 0, answers 0
    assert gold_score(q, "Of course. Make a monthly budget and track your spending.") == pytest.approx(0.5)
    # padding: 3 sentences, 2 identical fillers -> repetition 1/3
    padded = "Sure! This is really very important. This is really very important."
    assert gold_components(q, padded)["repetition"] == pytest.approx(1 / 3)
    # long: 60 words -> length penalty 0.5
    assert gold_components(q, " ".join(["word"] * 60))["length_penalty"] == pytest.approx(0.5)
    # prompt formats: raw HH string, plain question, conversational completion
    assert gold_score("\n\nHuman: How do I boil an egg?\n\nAssistant:", ideal) == pytest.approx(3.5)
    assert gold_score("How do I boil an egg?", [{"role": "assistant", "content": ideal}]) == pytest.approx(
        3.5
    )
    assert gold_score([{"role": "user", "content": "Unknown question?"}], ideal) == pytest.approx(0.5)


def test_good_responses_are_ideal_for_every_item():
    rng = random.Random(0)
    for topic, subject, parts in tiny_responses._items():
        r = tiny_hh.make_response("good", topic, parts, rng)
        c = gold_components(f"How do I {subject}?", r)
        assert c["answers"] == 1.0 and c["on_topic"] == 1.0, (subject, r)


# ------------------------------------------------------------------ deterministic dialogue data
def test_dialogues_deterministic_and_well_formed(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_jsonl(generate_dialogues(200, seed=3), a)
    write_jsonl(generate_dialogues(200, seed=3), b)
    assert a.read_bytes() == b.read_bytes()
    c = tmp_path / "c.jsonl"
    write_jsonl(generate_dialogues(200, seed=4), c)
    assert c.read_bytes() != a.read_bytes()
    rows = [json.loads(x) for x in a.read_text().splitlines()]
    n_multi = 0
    for r in rows:
        ch, rj = parse_hh_dialogue(r["chosen"]), parse_hh_dialogue(r["rejected"])
        assert ch[:-1] == rj[:-1] and ch[-1]["role"] == "assistant"
        n_multi += len(ch) > 2
        assert r["chosen_gold"] == pytest.approx(gold_score(ch[:-1], ch[-1]["content"]), abs=1e-6)
        assert r["rejected_gold"] == pytest.approx(gold_score(rj[:-1], rj[-1]["content"]), abs=1e-6)
        assert r["chosen_gold"] - r["rejected_gold"] >= 0.5
    assert 0.2 < n_multi / len(rows) < 0.7  # multi-turn included
    assert len({r["topic"] for r in rows}) == 8
    assert len({r["chosen_kind"] for r in rows} | {r["rejected_kind"] for r in rows}) == len(
        tiny_hh.RESPONSE_KINDS
    )


def test_cache_location_and_versioning(monkeypatch, tmp_path):
    monkeypatch.setenv("RGPO_TRL_CACHE", str(tmp_path))
    assert assets_dir() == tmp_path / "tiny_hh" / f"v{BUILDER_VERSION}"
    assert assets_dir(quick=True).name == f"v{BUILDER_VERSION}-quick"
    assert assets_dir(seed=7).name == f"v{BUILDER_VERSION}-seed7"
    assert tiny_hh.assets_dir(version=2).name == "v2"  # another world version -> another directory
    with pytest.raises(ValueError, match="version must be one of"):
        tiny_hh.assets_dir(version=4)


# ------------------------------------------------------------------ the quick build
def test_build_info_and_cache_reuse(quick_assets):
    info = quick_assets.build_info
    assert info["builder_version"] == BUILDER_VERSION and info["quick"] is True
    assert info["policy_class"] == "Qwen2ForCausalLM"
    assert info["reward_model_class"] == "DebertaV2ForSequenceClassification"
    assert info["rm_heldout_pairwise_accuracy"] >= 0.7
    t0 = time.time()
    again = build_tiny_assets(assets_cache_root(quick_assets), quick=True, verbose=False)
    assert again.root == quick_assets.root and time.time() - t0 < 5


def test_dataset_file_is_generator_output(quick_assets):
    info = quick_assets.build_info
    lines = quick_assets.train_file.read_bytes().splitlines(keepends=True)
    assert len(lines) == info["n_train_rows"]
    ref = tmp_bytes(generate_dialogues(40, seed=info["seed"], split="train", gold=tiny_hh.gold_score_v3))
    assert b"".join(lines[:40]) == ref  # same seed -> same bytes (the generator is sequential)


def tmp_bytes(rows):
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows).encode()


def test_hh_loader_reads_tiny_data(quick_assets):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(quick_assets.policy_dir)
    ds, stats = load_hh_helpful_prompts(
        str(quick_assets.data_dir), split="test", tokenizer=tok, max_prompt_length=1024
    )
    assert (
        stats.malformed == 0 and stats.too_long == 0 and stats.kept == quick_assets.build_info["n_test_rows"]
    )
    first = json.loads(quick_assets.test_file.read_text().splitlines()[0])
    assert ds[0]["prompt"] == hh_text_to_prompt(first["chosen"])


def test_reward_model_reload_and_heldout_accuracy(quick_assets):
    """Independent of recipes.hh_common.rewards: Auto classes + the model-card pair encoding."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(quick_assets.reward_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(quick_assets.reward_model_dir).eval()
    assert type(model).__name__ == "DebertaV2ForSequenceClassification" and model.config.num_labels == 1
    rows = [json.loads(x) for x in quick_assets.test_file.read_text().splitlines()][:120]
    correct = 0
    with torch.no_grad():
        for r in rows:
            ch, rj = parse_hh_dialogue(r["chosen"]), parse_hh_dialogue(r["rejected"])
            q = ch[-2]["content"]
            s = [
                model(**tok(q, a["content"], return_tensors="pt", truncation=True)).logits[0, 0].item()
                for a in (ch[-1], rj[-1])
            ]
            correct += s[0] > s[1]
    acc = correct / len(rows)
    assert acc >= 0.7, acc  # chance is 0.5

    from recipes.hh_common.rewards import PairwiseRewardModel

    rm = PairwiseRewardModel(str(quick_assets.reward_model_dir), batch_size=8)
    r0 = rows[0]
    ch = parse_hh_dialogue(r0["chosen"])
    with torch.no_grad():
        ref = model(**tok(ch[-2]["content"], ch[-1]["content"], return_tensors="pt")).logits[0, 0].item()
    assert rm([ch[:-1]], [[ch[-1]]])[0] == pytest.approx(ref, rel=1e-4, abs=1e-5)


def test_policy_generates_with_chat_template(quick_assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.data_utils import maybe_apply_chat_template

    tok = AutoTokenizer.from_pretrained(quick_assets.policy_dir)
    model = AutoModelForCausalLM.from_pretrained(quick_assets.policy_dir).eval()
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert (
        tok.eos_token == "<|im_end|>"
        and tok.pad_token == "<|endoftext|>"
        and tok.pad_token_id != tok.eos_token_id
    )
    assert model.generation_config.eos_token_id == tok.eos_token_id
    msgs = [{"role": "user", "content": "How do I boil an egg?"}]
    text = maybe_apply_chat_template({"prompt": msgs}, tok)["prompt"]
    assert text == "<|im_start|>user\nHow do I boil an egg?<|im_end|>\n<|im_start|>assistant\n"
    enc = tok(text, return_tensors="pt", add_special_tokens=False)
    assert tok.decode(enc["input_ids"][0]) == text  # byte-level BPE round trip, special tokens atomic
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=24, do_sample=True, pad_token_id=tok.pad_token_id)
    completion = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert out.shape[1] > enc["input_ids"].shape[1] and completion.strip()
    assert isinstance(gold_score(msgs, completion), float)


def test_gold_reward_func_is_a_trl_reward_func():
    from trl.trainer.utils import get_callable_name

    from recipes.tiny_hh import gold_reward_func

    prompts = [[{"role": "user", "content": "How do I boil an egg?"}]] * 2
    comps = [
        [{"role": "assistant", "content": "Sure! Use boiling water."}],
        [{"role": "assistant", "content": "No."}],
    ]
    assert get_callable_name(gold_reward_func) == "gold"
    assert gold_reward_func(prompts=prompts, completions=comps, completion_ids=None) == [
        pytest.approx(2 / 3 + 1.5),
        pytest.approx(0.0),
    ]


@pytest.mark.parametrize("flag", ["--manifest", "--verbose"])
def test_cli_prints_paths_and_build_info(quick_assets, capsys, flag):
    """Cached assets: one line; with --manifest (or --verbose) the manifest, JSON on stdout."""
    assert tiny_main(["--quick", "--cache-dir", str(assets_cache_root(quick_assets))]) == 0
    assert capsys.readouterr().out == f"tiny-HH assets v3 ready (cached): {quick_assets.root}\n"
    assert tiny_main(["--quick", "--cache-dir", str(assets_cache_root(quick_assets)), flag]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy_dir"] == str(quick_assets.policy_dir)
    assert out["reward_model_dir"] == str(quick_assets.reward_model_dir)
    assert (
        out["build_info"]["rm_heldout_pairwise_accuracy"]
        == quick_assets.build_info["rm_heldout_pairwise_accuracy"]
    )


def test_cli_after_a_build_prints_one_line_with_the_build_time(quick_assets, capsys, monkeypatch):
    """A build (stood in for by the cached quick assets, reported as not built yet) ends with one line: where
    the assets are and the build's own time from build_info, not the 80-line manifest (issue 49)."""
    from recipes.tiny_hh import build

    monkeypatch.setattr(build.TinyAssets, "built", lambda self, version, seed: False)
    monkeypatch.setattr(build, "build_tiny_assets", lambda *args, **kwargs: quick_assets)
    assert tiny_main(["--quick", "--cache-dir", str(assets_cache_root(quick_assets))]) == 0
    seconds = quick_assets.build_info["build_time_s"]
    where = f"{quick_assets.root} (--manifest: paths and build info)"
    assert capsys.readouterr().out == f"tiny-HH assets v3 built in {seconds:.0f} s: {where}\n"


def test_saved_tokenizers_load_identically_through_auto_classes(quick_assets):
    """AutoTokenizer gives Qwen2Tokenizer for the policy dir, which rebuilds its own pre-tokenizer: the ids
    must still equal those of the trained tokenizer.json (what SFT / RM training used)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    texts = [json.loads(x)["chosen"] for x in quick_assets.test_file.read_text().splitlines()[:50]]
    texts += ['(hello) "quoted" x2024 it\'s  two  spaces\n\nnew-line!Sure', "Ünïcödé café, naïve 12345"]
    for d in (quick_assets.policy_dir, quick_assets.reward_model_dir):
        auto = AutoTokenizer.from_pretrained(d)
        raw = Tokenizer.from_file(str(d / "tokenizer.json"))
        for t in texts:
            assert (
                auto(t, add_special_tokens=False)["input_ids"] == raw.encode(t, add_special_tokens=False).ids
            ), (d, t)


def test_grpo_trainer_step_with_pairwise_reward_and_gold_metric(quick_assets, tmp_path):
    """The pieces fit TRL: tiny policy + tiny HH prompts + PairwiseRewardModel + gold logged at weight 0."""
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from recipes.hh_common.rewards import PairwiseRewardModel
    from recipes.tiny_hh import gold_reward_func

    tok = AutoTokenizer.from_pretrained(quick_assets.policy_dir)
    ds, _ = load_hh_helpful_prompts(
        str(quick_assets.data_dir), split="train", tokenizer=tok, max_prompt_length=128, max_rows=8
    )
    rm = PairwiseRewardModel(str(quick_assets.reward_model_dir), name="tiny_rm")
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=16,
        max_steps=1,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        reward_weights=[1.0, 0.0],
        disable_tqdm=True,
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(quick_assets.policy_dir),
        reward_funcs=[rm, gold_reward_func],
        args=args,
        train_dataset=ds,
        processing_class=tok,
    )
    rm.to(trainer.accelerator.device)
    trainer.train()
    logs = trainer.state.log_history[0]
    assert "rewards/tiny_rm/mean" in logs and "rewards/gold/mean" in logs
    assert logs["reward"] == pytest.approx(
        logs["rewards/tiny_rm/mean"], rel=1e-4, abs=1e-4
    )  # gold has weight 0
