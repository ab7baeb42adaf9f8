"""The world's assistant responses: one of each kind (`world.RESPONSE_KINDS`) to a question about a bank item,
from a seeded generator. Both dialogue generators use it: v2's (`dialogues.make_prompt`) and v3's split-aware
one (`splits.make_prompt_in_split`), and the v3 gold's grammar (`gold_v3`) is read off its phrases."""

from __future__ import annotations

import random

from .world import (
    _BANK,
    _EVASIVE,
    _FILLERS,
    _POLITE_CLOSERS,
    _POLITE_OPENERS,
    _RUDE_OPENERS,
    RESPONSE_KINDS,
)


def _items():
    return [(topic, s, parts) for topic, items in _BANK.items() for s, parts in items]


def _answer_body(parts, rng: random.Random, k: int | None = None) -> str:
    clauses = [c for _, c in parts]
    if k is not None:
        clauses = rng.sample(clauses, k)
    if len(clauses) == 1:
        body = clauses[0]
    else:
        body = ", ".join(clauses[:-1]) + rng.choice([", and ", " and "]) + clauses[-1]
    return body[0].upper() + body[1:] + "."


def make_response(kind: str, topic: str, parts, rng: random.Random) -> str:
    """One assistant response of a given kind to a question about ``(topic, parts)``."""
    if kind == "good":
        s = f"{rng.choice(_POLITE_OPENERS)} {_answer_body(parts, rng)}"
        return s + (f" {rng.choice(_POLITE_CLOSERS)}" if rng.random() < 0.5 else "")
    if kind == "terse":
        return _answer_body(parts, rng)
    if kind == "partial":
        return f"{rng.choice(_POLITE_OPENERS)} {_answer_body(parts, rng, k=rng.choice([1, 2]))}"
    if kind == "rude":
        body = _answer_body(parts, rng)
        return f"{rng.choice(_RUDE_OPENERS)} {body[0].lower() + body[1:]}"
    if kind == "padded":
        filler = rng.choice(_FILLERS)
        reps = rng.randint(2, 4)
        return f"{rng.choice(_POLITE_OPENERS)} {_answer_body(parts, rng)} " + " ".join([filler] * reps)
    if kind == "wrong_item":
        others = [p for t, _, p in _items() if t == topic and p is not parts]
        return f"{rng.choice(_POLITE_OPENERS)} {_answer_body(rng.choice(others), rng)}"
    if kind == "off_topic":
        others = [p for t, _, p in _items() if t != topic]
        return f"{rng.choice(_POLITE_OPENERS)} {_answer_body(rng.choice(others), rng)}"
    if kind == "evasive":
        return f"{rng.choice(_POLITE_OPENERS)} {rng.choice(_EVASIVE)}"
    if kind == "rude_evasive":
        return f"{rng.choice(_RUDE_OPENERS)} {rng.choice(_EVASIVE).lower()}"
    raise ValueError(f"unknown response kind {kind!r}")


def sample_kind(rng: random.Random) -> str:
    kinds, weights = zip(*RESPONSE_KINDS.items(), strict=True)
    return rng.choices(kinds, weights=weights)[0]
