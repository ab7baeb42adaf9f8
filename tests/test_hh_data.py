"""HH-RLHF parsing, malformed-row accounting, length filter, local loading and the offline check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from recipes.hh_common.hh_data import (
    HHFormatError,
    hh_rows_to_prompts,
    hh_text_to_prompt,
    last_user_text,
    load_hh_helpful_prompts,
    parse_hh_dialogue,
    render_hh_text,
)
from recipes.hh_common.hub_access import HubUnavailableError, ensure_loadable

FIXTURE = Path(__file__).parent / "fixtures" / "hh_rlhf_sample.jsonl"
REPO_ROOT = Path(__file__).resolve().parents[1]


def U(c):
    return {"role": "user", "content": c}


def A(c):
    return {"role": "assistant", "content": c}


# Expected prompts of the 8 valid fixture rows, in file order, written by hand (independent of the parser).
EXPECTED_PROMPTS = [
    [U("What are some good vegetables to grow in a small garden?")],
    [
        U("How do I make a cup of tea?"),
        A("Boil water, pour it over a tea bag and steep for three minutes."),
        U("How long should green tea steep?"),
    ],
    [
        U("Hi there"),
        A("Hello! How can I help you today?"),
        U("I need a name for my dog.\nShe is a small brown terrier."),
        A("How about Hazel: it suits a brown dog."),
        U("Any other ideas?"),
    ],
    None,  # the long bicycle question, checked separately
    [U("What is the capital of France?")],
    [U("Why is the sky blue?")],
    [
        U("Write a line of dialogue that starts with Human: hello"),
        A("Human: hello, is anyone home?"),
        U("Now make it spookier."),
    ],
    [U("How many legs does a spider have?")],
]
EXPECTED_MALFORMED = {
    "no_markers": 1,
    "wrong_order": 2,
    "empty_turn": 2,
    "no_final_assistant": 1,
    "not_a_string": 1,
    "text_before_first_marker": 1,
}


def _load_fixture(**kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ds, stats = load_hh_helpful_prompts(str(FIXTURE), **kw)
    return ds, stats, [x for x in w if "malformed" in str(x.message)]


def test_fixture_turns_exact():
    ds, stats, warns = _load_fixture()
    prompts = ds["prompt"]
    assert len(prompts) == 8
    for got, exp in zip(prompts, EXPECTED_PROMPTS, strict=True):
        if exp is not None:
            assert got == exp
    assert prompts[3][0]["role"] == "user" and prompts[3][0]["content"].startswith(
        "Can you explain in great detail"
    )
    assert prompts[3][0]["content"].endswith("how a bicycle gear works?") and len(prompts[3]) == 1


def test_fixture_malformed_counted_exactly_with_one_warning():
    ds, stats, warns = _load_fixture()
    assert stats.rows_read == 16
    assert stats.malformed == 8
    assert stats.malformed_reasons == EXPECTED_MALFORMED
    assert stats.too_long == 0 and stats.kept == 8 == len(ds)
    assert len(warns) == 1 and "8 malformed" in str(warns[0].message)


def test_python_rows_not_strings_never_crash():
    rows = [
        {"chosen": 5},
        {"chosen": ["\n\nHuman: a\n\nAssistant: b"]},
        {"rejected": "x"},
        "not a dict",
        {"chosen": "\n\nHuman: hi\n\nAssistant: hello"},
    ]
    with pytest.warns(UserWarning, match="4 malformed"):
        ds, stats = hh_rows_to_prompts(rows)
    assert stats.malformed_reasons == {"not_a_string": 4}
    assert ds["prompt"] == [[U("hi")]]


def test_all_malformed_gives_empty_dataset():
    with pytest.warns(UserWarning):
        ds, stats = hh_rows_to_prompts([{"chosen": "nothing here"}])
    assert len(ds) == 0 and stats.kept == 0 and "prompt" in ds.column_names


def test_parser_details():
    assert parse_hh_dialogue("Human: a\n\nAssistant: b") == [U("a"), A("b")]  # no leading blank line
    with pytest.raises(HHFormatError) as e:
        hh_text_to_prompt("\n\nHuman: a\n\nAssistant: b\n\nAssistant: c")
    assert e.value.reason == "wrong_order"
    msgs = [U("q1"), A("a1"), U("q2")]
    assert hh_text_to_prompt(render_hh_text(msgs) + " final") == msgs
    assert last_user_text(msgs) == "q2"
    assert last_user_text(render_hh_text(msgs)) == "q2"
    assert last_user_text("plain question?") == "plain question?"


def _fixture_tokenizer():
    from recipes.tiny_hh.tokenizers import make_policy_tokenizer, train_bpe

    texts = [json.loads(line).get("chosen") or "" for line in FIXTURE.read_text().splitlines()]
    return make_policy_tokenizer(train_bpe(texts * 3, vocab_size=400))


def test_length_filter_counts_against_manual_lengths():
    tok = _fixture_tokenizer()
    # independent reference: render + tokenize each expected prompt by hand
    ds_all, _, _ = _load_fixture()
    manual = []
    for p in ds_all["prompt"]:
        text = tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_start|>assistant\n")
        manual.append(len(tok(text, add_special_tokens=False)["input_ids"]))
    longest = max(manual)
    assert manual.index(longest) == 3  # the long bicycle question
    limit = sorted(manual)[-2]  # keeps all but the longest
    ds, stats, _ = _load_fixture(tokenizer=tok, max_prompt_length=limit)
    assert stats.too_long == 1 and stats.kept == 7 and stats.malformed == 8
    assert all("bicycle" not in p[0]["content"] for p in ds["prompt"])
    limit2 = sorted(manual)[3]  # strictly between: count must match the reference exactly
    _, stats2, _ = _load_fixture(tokenizer=tok, max_prompt_length=limit2)
    assert stats2.too_long == sum(n > limit2 for n in manual) and stats2.kept == sum(
        n <= limit2 for n in manual
    )


def test_local_directory_with_data_dir_and_split(tmp_path):
    (tmp_path / "helpful-base").mkdir()
    rows = [
        {"chosen": f"\n\nHuman: q{i}\n\nAssistant: a{i}", "rejected": f"\n\nHuman: q{i}\n\nAssistant: no"}
        for i in range(5)
    ]
    for split, rs in (("train", rows[:3]), ("test", rows[3:])):
        with open(tmp_path / "helpful-base" / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rs)
    ds, stats = load_hh_helpful_prompts(str(tmp_path), split="test")
    assert ds["prompt"] == [[U("q3")], [U("q4")]] and stats.malformed == 0
    ds, stats = load_hh_helpful_prompts(str(tmp_path), split="train", max_rows=2)
    assert stats.rows_read == 2 and ds["prompt"] == [[U("q0")], [U("q1")]]


def test_missing_local_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_hh_helpful_prompts(str(tmp_path / "nope.jsonl"))


def test_offline_uncached_dataset_id_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.time()
    with pytest.raises(HubUnavailableError) as e:
        load_hh_helpful_prompts("rgpo-trl-test/definitely-not-cached-dataset")
    assert time.time() - t0 < 10
    msg = str(e.value)
    assert (
        "rgpo-trl-test/definitely-not-cached-dataset" in msg
        and "--config recipes/configs/hh_rlhf_tiny.yaml" in msg
        and "local path" in msg
    )


def test_offline_env_in_fresh_process_no_hang():
    """HF_HUB_OFFLINE=1 set before import (as a user would), uncached model id: error, well before a
    timeout."""
    code = (
        "from recipes.hh_common.hub_access import ensure_loadable, HubUnavailableError\n"
        "try:\n    ensure_loadable('Qwen/Qwen2.5-1.5B-Instruct', kind='model')\n"
        "except HubUnavailableError as e:\n    print('ERR:', e)\n"
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO_ROOT),
        "HF_HOME": "/nonexistent-rgpo-hf-home",
    }
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (
        "ERR:" in out.stdout
        and "Qwen/Qwen2.5-1.5B-Instruct" in out.stdout
        and "--config recipes/configs/hh_rlhf_tiny.yaml" in out.stdout
    )
    assert time.time() - t0 < 60


def test_ensure_loadable_local_paths(tmp_path):
    assert ensure_loadable(str(tmp_path)) == str(tmp_path)
    f = tmp_path / "x.jsonl"
    f.write_text("{}\n")
    assert ensure_loadable(str(f), kind="dataset") == str(f)
    with pytest.raises(FileNotFoundError):
        ensure_loadable("./no/such/dir")
    with pytest.raises(ValueError):
        ensure_loadable(str(tmp_path), kind="space")


def test_offline_but_cached_hub_id_is_accepted(monkeypatch, tmp_path):
    """An offline machine with a pre-downloaded snapshot must not be refused."""
    import huggingface_hub.constants as hf_constants

    snap = tmp_path / "models--fake-owner--fake-model"
    (snap / "refs").mkdir(parents=True)
    (snap / "refs" / "main").write_text("a" * 40)
    (snap / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (snap / "snapshots" / ("a" * 40) / "config.json").write_text("{}")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert ensure_loadable("fake-owner/fake-model", kind="model") == "fake-owner/fake-model"
    with pytest.raises(HubUnavailableError, match="fake-owner/not-cached"):
        ensure_loadable("fake-owner/not-cached", kind="model")
