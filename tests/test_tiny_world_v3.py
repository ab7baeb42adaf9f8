"""World v3 of the tiny-HH assets: disjoint question splits and a gold rule that keyword salad cannot max."""

from __future__ import annotations

import hashlib
import json
import random
import statistics

import pytest

from recipes.hh_common.hh_data import hh_text_to_prompt
from recipes.tiny_hh import (
    RESPONSE_KINDS,
    generate_dialogues,
    gold_score,
    gold_score_v3,
    keyword_salad,
    make_response,
    normalise_question,
    well_formedness,
)
from recipes.tiny_hh.responses import _items
from recipes.tiny_hh.splits import HELD_OUT_FORMS, SPLITS, combinations


def _user_questions(rows, last_only: bool) -> set[str]:
    out = set()
    for r in rows:
        users = [m["content"] for m in hh_text_to_prompt(r["chosen"]) if m["role"] == "user"]
        out.update(normalise_question(u) for u in (users[-1:] if last_only else users))
    return out


def _overlaps(by_split: dict[str, set[str]]) -> dict[tuple[str, str], set[str]]:
    names = list(by_split)
    return {(a, b): by_split[a] & by_split[b] for i, a in enumerate(names) for b in names[i + 1 :]}


def test_combinations_partition_every_item_and_form():
    combos = combinations()
    flat = [c for s in SPLITS for c in combos[s]]
    assert len(flat) == len(set(flat)) == len(_items()) * 12  # 8 question + 4 follow-up forms
    for split, forms in HELD_OUT_FORMS.items():  # a held-out form belongs to its split alone
        for kind, i in forms:
            owners = {s for s in SPLITS for c in combos[s] if c[1:] == (kind, i)}
            assert owners == {split}
    assert len(combos["train"]) > 2 * len(combos["test"]) and len(combos["validation"]) == len(combos["test"])


def test_generated_splits_never_share_a_question():
    """No normalised user turn (the last one, or any earlier one) of one split occurs in another."""
    rows = {s: generate_dialogues(400, 7, split=s, gold=gold_score_v3) for s in SPLITS}
    for last_only in (True, False):
        questions = {s: _user_questions(r, last_only) for s, r in rows.items()}
        assert all(questions.values())
        greetings = {normalise_question(h) for h in ("Hi there.", "Hello!", "Hey, can you help me?")}
        for pair, common in _overlaps(questions).items():
            assert common <= greetings, (pair, sorted(common - greetings)[:5])


def test_built_assets_have_disjoint_splits(quick_assets):
    """The quick v3 build: train, validation and test files share no final question; the SFT policy and the
    reward model were trained on train.jsonl only (its rows are the build's training rows)."""
    files = {
        "train": quick_assets.train_file,
        "validation": quick_assets.validation_file,
        "test": quick_assets.test_file,
    }
    rows = {s: [json.loads(line) for line in open(p)] for s, p in files.items()}
    questions = {s: _user_questions(r, last_only=True) for s, r in rows.items()}
    assert all(not common for common in _overlaps(questions).values())
    info = quick_assets.build_info
    assert info["builder_version"] == 3 and info["n_validation_rows"] == len(rows["validation"])
    assert info["keyword_salad_gold_mean"] < 0 < info["ideal_answer_gold_mean"] - 3


def test_v2_dialogues_are_unchanged():
    """World v2 stays reproducible: its generator gives the rows it gave when the v2 results were made (hash
    taken from the builder at commit f303143, before v3 existed)."""
    rows = generate_dialogues(300, 1234) + generate_dialogues(100, 1234 + 7919)
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()
    assert digest == "c25cc05dcca960d18d3bc656991ed86ba3ae5f7bf866d4b01c3c75d2ee02f9e6"


def test_every_generated_response_is_well_formed():
    rng = random.Random(12345)
    for _ in range(3000):
        topic, _, parts = rng.choice(_items())
        kind = rng.choice(list(RESPONSE_KINDS))
        response = make_response(kind, topic, parts, rng)
        assert well_formedness(response) == 1.0, (kind, response)


def _mean_gold(kind_or_fn, gold=gold_score_v3, n=6) -> float:
    rng = random.Random(0)
    values = []
    for topic, subject, parts in _items():
        q = [{"role": "user", "content": f"How do I {subject}?"}]
        for _ in range(n):
            r = (
                kind_or_fn(topic, parts, rng)
                if callable(kind_or_fn)
                else make_response(kind_or_fn, topic, parts, rng)
            )
            values.append(gold(q, r))
    return statistics.mean(values)


def _salad(topic, parts, rng):
    return keyword_salad(parts)


def _shuffled_clauses(topic, parts, rng):
    """A good answer whose clauses have their words shuffled."""
    words = [w for _, c in parts for w in c.split()]
    rng.shuffle(words)
    return "Sure! " + " ".join(words) + "."


def _repeated_keywords(topic, parts, rng):
    return "Sure! " + " ".join(k for k, _ in parts for _ in range(3))


def test_gold_orders_responses_with_margins():
    """good > partial > terse ~ padded > wrong-kind answers > keyword salad, shuffled clauses and repeated
    keywords (mean over every item, margins of at least 0.2 between tiers); v2's gold gives salad the
    maximum."""
    g = {k: _mean_gold(k) for k in RESPONSE_KINDS}
    hacks = {
        name: _mean_gold(fn)
        for name, fn in (("salad", _salad), ("shuffled", _shuffled_clauses), ("repeated", _repeated_keywords))
    }
    assert g["good"] > g["partial"] + 0.2
    assert g["partial"] > max(g["terse"], g["padded"]) + 0.2
    assert abs(g["terse"] - g["padded"]) < 0.5
    assert (
        min(g["terse"], g["padded"]) > max(g["rude"], g["off_topic"], g["evasive"], g["rude_evasive"]) + 0.2
    )
    assert max(g["rude"], g["off_topic"], g["evasive"]) > max(hacks.values()) + 0.2
    assert max(hacks.values()) < 0.5 and g["good"] > 3.5
    # the fault v3 fixes: v2's bag of words scores keyword salad as high as a good answer
    assert _mean_gold(_salad, gold=gold_score) == pytest.approx(_mean_gold("good", gold=gold_score), abs=0.2)


def test_padding_costs_within_the_recipe_completion_length():
    """A good answer cut at about 24 tokens with one filler sentence scores below the same answer without
    it."""
    q = [{"role": "user", "content": "How do I boil an egg?"}]
    good = (
        "Sure! Put the egg in boiling water, leave it for about nine minutes, and then cool it in cold water."
    )
    assert gold_score_v3(q, good + " This is really very important.") == pytest.approx(
        gold_score_v3(q, good) - 0.5
    )
