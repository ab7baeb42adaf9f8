"""HH-format dialogues from the world, deterministic from a seed, with chosen/rejected pairs by gold score."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..hh_common.hh_data import render_hh_text
from .responses import _items, make_response, sample_kind
from .splits import make_prompt_in_split
from .world import _FOLLOWUP_TEMPLATES, _GREETINGS, _QUESTION_TEMPLATES, gold_score


# --------------------------------------------------------------------------------------------
# Dialogue generator
# --------------------------------------------------------------------------------------------
def make_prompt(rng: random.Random) -> tuple[list[dict[str, str]], str, list]:
    """A (possibly multi-turn) prompt; returns (messages, topic, parts of the final question)."""
    items = _items()
    topic, subject, parts = rng.choice(items)
    msgs: list[dict[str, str]] = []
    shape = rng.random()
    if shape < 0.15:  # greeting first
        h, a = rng.choice(_GREETINGS)
        msgs += [{"role": "user", "content": h}, {"role": "assistant", "content": a}]
    if shape >= 0.55:  # an earlier question (same topic 70%) with a good answer, then a follow-up
        same = [it for it in items if it[0] == topic and it[1] != subject]
        t0, s0, p0 = rng.choice(same) if rng.random() < 0.7 else rng.choice(items)
        msgs += [
            {"role": "user", "content": rng.choice(_QUESTION_TEMPLATES).format(s=s0)},
            {"role": "assistant", "content": make_response("good", t0, p0, rng)},
        ]
        if shape >= 0.9 and s0 != subject:  # a third exchange
            t1, s1, p1 = rng.choice(items)
            msgs += [
                {"role": "user", "content": rng.choice(_FOLLOWUP_TEMPLATES).format(s=s1)},
                {"role": "assistant", "content": make_response("good", t1, p1, rng)},
            ]
        msgs.append({"role": "user", "content": rng.choice(_FOLLOWUP_TEMPLATES).format(s=subject)})
    else:
        msgs.append({"role": "user", "content": rng.choice(_QUESTION_TEMPLATES).format(s=subject)})
    return msgs, topic, parts


def generate_dialogues(
    n: int,
    seed: int,
    *,
    min_margin: float = 0.5,
    split: str | None = None,
    gold: Callable[[Any, Any], float] = gold_score,
) -> list[dict[str, Any]]:
    """``n`` HH-format preference rows from ``seed`` (deterministic), ordered by ``gold``. ``split`` (world
    v3: train, validation or test) draws every question from that split's combinations (`splits`); None draws
    from the whole bank (world v2)."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < n:
        msgs, topic, parts = make_prompt(rng) if split is None else make_prompt_in_split(rng, split)
        k1, k2 = sample_kind(rng), sample_kind(rng)
        r1, r2 = make_response(k1, topic, parts, rng), make_response(k2, topic, parts, rng)
        g1, g2 = gold(msgs, r1), gold(msgs, r2)
        if abs(g1 - g2) < min_margin:
            continue
        if g2 > g1:
            (r1, g1, k1), (r2, g2, k2) = (r2, g2, k2), (r1, g1, k1)
        prefix = render_hh_text(msgs, add_generation_prompt=False)
        rows.append(
            {
                "chosen": f"{prefix}\n\nAssistant: {r1}",
                "rejected": f"{prefix}\n\nAssistant: {r2}",
                "chosen_gold": round(g1, 6),
                "rejected_gold": round(g2, 6),
                "chosen_kind": k1,
                "rejected_kind": k2,
                "topic": topic,
            }
        )
    return rows


def write_jsonl(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n")
