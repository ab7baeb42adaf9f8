"""World v3's prompt splits: training, validation and test questions never share a normalised question text.

A question is an item of the content bank asked in a *form* (a question or follow-up template). Test and
validation each own two whole forms (a question form and a follow-up form that training never uses) and a
share of the remaining item x form combinations, drawn once from a fixed seed; training gets the rest. Every
question of a dialogue, earlier turns included, comes from the dialogue's own split (the three greetings,
which ask nothing, are shared), so a test question occurs nowhere
in what the SFT policy, the reward model or the RL run were trained on: they are the "pretrained" knowledge of
the bank's items and answers, learnt from training questions only.
"""

from __future__ import annotations

import random
import re
from functools import cache

from .responses import make_response
from .world import _BANK, _FOLLOWUP_TEMPLATES, _GREETINGS, _QUESTION_TEMPLATES

SPLITS = ("train", "validation", "test")
# whole forms owned by one split: (kind, index into its template list)
HELD_OUT_FORMS = {
    "validation": (("question", 6), ("followup", 2)),
    "test": (("question", 7), ("followup", 3)),
}
HELD_OUT_SHARE = 0.12  # of the remaining item x form combinations, per held-out split
SPLIT_SEED = 2026

_PUNCT_RE = re.compile(r"[^a-z' ]+")


def normalise_question(text: str) -> str:
    """Lower case, punctuation removed, whitespace collapsed: the text two questions are compared by."""
    return " ".join(_PUNCT_RE.sub(" ", text.lower()).split())


def _forms() -> list[tuple[str, int, str]]:
    return [("question", i, t) for i, t in enumerate(_QUESTION_TEMPLATES)] + [
        ("followup", i, t) for i, t in enumerate(_FOLLOWUP_TEMPLATES)
    ]


def _items() -> list[tuple[str, str, list]]:
    return [(topic, subject, parts) for topic, items in _BANK.items() for subject, parts in items]


@cache
def combinations() -> dict[str, tuple[tuple[str, int, str], ...]]:
    """split -> its (subject, form kind, form index) combinations; disjoint, covering every combination."""
    owner = {form: split for split, forms in HELD_OUT_FORMS.items() for form in forms}
    free = []
    out: dict[str, list] = {s: [] for s in SPLITS}
    for _, subject, _ in _items():
        for kind, i, _ in _forms():
            split = owner.get((kind, i))
            if split is None:
                free.append((subject, kind, i))
            else:
                out[split].append((subject, kind, i))
    rng = random.Random(SPLIT_SEED)
    rng.shuffle(free)
    k = round(HELD_OUT_SHARE * len(free))
    out["validation"] += free[:k]
    out["test"] += free[k : 2 * k]
    out["train"] += free[2 * k :]
    return {s: tuple(sorted(v)) for s, v in out.items()}


def _question(subject: str, kind: str, i: int) -> str:
    templates = _QUESTION_TEMPLATES if kind == "question" else _FOLLOWUP_TEMPLATES
    return templates[i].format(s=subject)


def make_prompt_in_split(rng: random.Random, split: str) -> tuple[list[dict[str, str]], str, list]:
    """A (possibly multi-turn) prompt whose every question is one of ``split``'s combinations, in the shapes
    of v2's ``make_prompt`` (greeting, earlier exchanges with good answers, a follow-up); returns (messages,
    topic, parts of the final question)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    combos = combinations()[split]
    questions = [c for c in combos if c[1] == "question"]
    followups = [c for c in combos if c[1] == "followup"]
    by_subject = {s: (t, p) for t, s, p in _items()}
    msgs: list[dict[str, str]] = []
    shape = rng.random()
    if shape < 0.15:
        h, a = rng.choice(_GREETINGS)
        msgs += [{"role": "user", "content": h}, {"role": "assistant", "content": a}]
    if shape >= 0.55:  # earlier exchanges, then a follow-up as the final question
        final = rng.choice(followups)
        for _ in range(2 if shape >= 0.9 else 1):
            s0, kind, i = rng.choice([c for c in questions if c[0] != final[0]])
            t0, p0 = by_subject[s0]
            msgs += [
                {"role": "user", "content": _question(s0, kind, i)},
                {"role": "assistant", "content": make_response("good", t0, p0, rng)},
            ]
    else:
        final = rng.choice(questions)
    topic, parts = by_subject[final[0]]
    msgs.append({"role": "user", "content": _question(*final)})
    return msgs, topic, parts
