"""Anthropic HH-RLHF (helpful) -> conversational prompts for TRL's ``GRPOTrainer``.

Raw HH rows are ``{"chosen": str, "rejected": str}`` where each string is a whole dialogue::

    "\\n\\nHuman: q1\\n\\nAssistant: a1\\n\\nHuman: q2\\n\\nAssistant: a2"

The prompt is every turn before the last Assistant turn, in TRL's conversational format::

    {"prompt": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                {"role": "user", "content": "q2"}]}

It is read from ``chosen`` (in HH, ``chosen`` and ``rejected`` share this prefix; this is what
``trl.data_utils.extract_prompt`` would find as the common prefix). A row is *malformed*, counted
and skipped (one warning with the counts, never an exception) when ``chosen`` is not a string,
has no ``Human:``/``Assistant:`` markers, has text before the first marker, does not alternate
Human/Assistant starting with Human, does not end with an Assistant turn, or has an empty turn in
the prompt. (An empty *final* Assistant response does not affect the prompt and is accepted.)

With a tokenizer and ``max_prompt_length``, prompts whose chat-template rendering (with the
generation prompt, tokenized without extra special tokens, as ``GRPOTrainer`` does) is longer
than ``max_prompt_length`` tokens are dropped and counted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .hub_access import ensure_loadable

logger = logging.getLogger(__name__)

HH_DATASET_ID = "Anthropic/hh-rlhf"
HH_HELPFUL_DATA_DIR = "helpful-base"

_MARKER_RE = re.compile(r"(?:^|\n\n)(Human|Assistant):")
_ROLE = {"Human": "user", "Assistant": "assistant"}


class HHFormatError(ValueError):
    """A raw HH dialogue string that cannot be parsed. ``reason`` is a short machine-readable tag."""

    def __init__(self, reason: str, message: str | None = None):
        super().__init__(message or reason)
        self.reason = reason


@dataclass
class HHPromptStats:
    rows_read: int = 0
    malformed: int = 0
    too_long: int = 0
    kept: int = 0
    malformed_reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_hh_dialogue(text: Any) -> list[dict[str, str]]:
    """Parse one raw HH string into ``[{"role": "user"|"assistant", "content": str}, ...]``.

    Contents are stripped. Raises :class:`HHFormatError` when the string is not a well-formed
    alternating Human/Assistant dialogue that starts with Human. Empty contents are returned
    as ``""`` (the caller decides whether they matter).
    """
    if not isinstance(text, str):
        raise HHFormatError("not_a_string", f"expected str, got {type(text).__name__}")
    matches = list(_MARKER_RE.finditer(text))
    if not matches:
        raise HHFormatError("no_markers")
    if text[: matches[0].start()].strip():
        raise HHFormatError("text_before_first_marker")
    turns = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        turns.append({"role": _ROLE[m.group(1)], "content": text[m.end() : end].strip()})
    for i, t in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if t["role"] != expected:
            raise HHFormatError("wrong_order", f"turn {i} is {t['role']}, expected {expected}")
    return turns


def hh_text_to_prompt(text: Any) -> list[dict[str, str]]:
    """All turns of a raw HH dialogue up to (excluding) its last Assistant turn."""
    turns = parse_hh_dialogue(text)
    if turns[-1]["role"] != "assistant":
        raise HHFormatError("no_final_assistant")
    prompt = turns[:-1]
    if any(not t["content"] for t in prompt):
        raise HHFormatError("empty_turn")
    return prompt


def last_user_text(prompt: Any) -> str:
    """The last user turn of a conversational prompt, a raw HH string, or a plain string."""
    if isinstance(prompt, str):
        try:
            turns = parse_hh_dialogue(prompt)
        except HHFormatError:
            return prompt.strip()
        users = [t["content"] for t in turns if t["role"] == "user"]
        return users[-1] if users else prompt.strip()
    users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
    return users[-1] if users else ""


def render_hh_text(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """Inverse of the parser: messages -> raw ``\\n\\nHuman: ...\\n\\nAssistant: ...`` text."""
    names = {"user": "Human", "assistant": "Assistant", "system": "System"}
    out = "".join(f"\n\n{names.get(m['role'], m['role'])}: {m['content']}" for m in messages)
    if add_generation_prompt:
        out += "\n\nAssistant:"
    return out


def prompt_token_lengths(
    prompts: Sequence[Sequence[Mapping[str, str]]], tokenizer, batch_size: int = 512
) -> list[int]:
    """Token count of each prompt as ``GRPOTrainer`` will see it (chat template + generation prompt)."""
    if getattr(tokenizer, "chat_template", None):
        texts = [
            tokenizer.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True)
            for p in prompts
        ]
    else:
        texts = [render_hh_text(p) for p in prompts]
    lengths: list[int] = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i : i + batch_size], add_special_tokens=False)
        lengths.extend(len(ids) for ids in enc["input_ids"])
    return lengths


def hh_rows_to_prompts(
    rows: Iterable[Mapping[str, Any]] | Any,
    tokenizer=None,
    max_prompt_length: int | None = None,
    *,
    text_column: str = "chosen",
    keep_columns: Sequence[str] = (),
):
    """Convert HH rows (a ``datasets.Dataset`` or any iterable of dicts) into a prompt dataset.

    Returns ``(datasets.Dataset with a "prompt" column (+ keep_columns), HHPromptStats)``.
    """
    from datasets import Dataset

    stats = HHPromptStats()
    reasons: Counter[str] = Counter()
    prompts: list[list[dict[str, str]]] = []
    kept_extra: dict[str, list[Any]] = {c: [] for c in keep_columns}
    if hasattr(rows, "column_names") and hasattr(rows, "__len__"):  # datasets.Dataset: read columns at once
        n = len(rows)
        texts = rows[text_column] if text_column in rows.column_names else [None] * n
        extras = {c: rows[c] if c in rows.column_names else [None] * n for c in keep_columns}
        records: Iterable[tuple[Any, dict[str, Any]]] = (
            (texts[i], {c: extras[c][i] for c in keep_columns}) for i in range(n)
        )
    else:
        records = (
            (row.get(text_column), {c: row.get(c) for c in keep_columns})
            if isinstance(row, Mapping)
            else (None, dict.fromkeys(keep_columns))
            for row in rows
        )
    for text, extra in records:
        stats.rows_read += 1
        try:
            prompt = hh_text_to_prompt(text)
        except HHFormatError as e:
            reasons[e.reason] += 1
            continue
        prompts.append(prompt)
        for c in keep_columns:
            kept_extra[c].append(extra[c])
    stats.malformed = sum(reasons.values())
    stats.malformed_reasons = dict(sorted(reasons.items()))
    if stats.malformed:
        warnings.warn(
            f"HH-RLHF: skipped {stats.malformed} malformed row(s) out of {stats.rows_read} "
            f"({', '.join(f'{k}={v}' for k, v in stats.malformed_reasons.items())}).",
            stacklevel=2,
        )

    if max_prompt_length is not None:
        if tokenizer is None:
            raise ValueError("max_prompt_length needs a tokenizer")
        lengths = prompt_token_lengths(prompts, tokenizer)
        keep = [n <= max_prompt_length for n in lengths]
        stats.too_long = keep.count(False)
        prompts = [p for p, k in zip(prompts, keep, strict=True) if k]
        kept_extra = {c: [v for v, k in zip(vals, keep, strict=True) if k] for c, vals in kept_extra.items()}
        if stats.too_long:
            logger.info(
                "HH-RLHF: dropped %d prompt(s) longer than %d tokens.", stats.too_long, max_prompt_length
            )
    stats.kept = len(prompts)
    data = {"prompt": prompts, **kept_extra}
    if not prompts:
        ds = Dataset.from_dict({k: [] for k in data})
    else:
        ds = Dataset.from_dict(data)
    return ds, stats


def load_hh_raw(
    dataset_name_or_path: str = HH_DATASET_ID,
    split: str = "train",
    *,
    data_dir: str | None = HH_HELPFUL_DATA_DIR,
    max_rows: int | None = None,
):
    """Load raw HH rows from a hub id, a local dataset directory, or a local json/jsonl file; ``max_rows``
    keeps the first rows only."""
    from datasets import load_dataset

    src = ensure_loadable(dataset_name_or_path, kind="dataset")
    if os.path.isfile(src):
        # a single file is always one split, whatever `split` says
        raw = load_dataset("json", data_files=src, split="train")
    elif os.path.isdir(src):
        use_dir = data_dir if data_dir and os.path.isdir(os.path.join(src, data_dir)) else None
        raw = load_dataset(src, data_dir=use_dir, split=split)
    else:
        raw = load_dataset(src, data_dir=data_dir, split=split)
    return raw if max_rows is None else raw.select(range(min(max_rows, len(raw))))


def load_hh_helpful_prompts(
    dataset_name_or_path: str = HH_DATASET_ID,
    split: str = "train",
    tokenizer=None,
    max_prompt_length: int | None = None,
    *,
    data_dir: str | None = HH_HELPFUL_DATA_DIR,
    max_rows: int | None = None,
    keep_columns: Sequence[str] = (),
):
    """HH-RLHF helpful prompts for ``GRPOTrainer``: ``(Dataset[{"prompt": [...]}], HHPromptStats)``.

    ``dataset_name_or_path``: a hub id (checked with :func:`recipes.hh_common.hub_access.ensure_loadable`
    first, so an offline machine fails fast), a local dataset directory (``data_dir`` is used if
    that sub-directory exists, e.g. a mirror of the hub repo), or a ``.jsonl`` file. The full
    ``helpful-base`` train split has 43,835 rows. ``max_rows`` keeps the first rows only.
    """
    raw = load_hh_raw(dataset_name_or_path, split, data_dir=data_dir, max_rows=max_rows)
    return hh_rows_to_prompts(raw, tokenizer, max_prompt_length, keep_columns=keep_columns)


def load_hh_preference_pairs(
    dataset_name_or_path: str = HH_DATASET_ID,
    split: str = "train",
    tokenizer=None,
    max_prompt_length: int | None = None,
    *,
    data_dir: str | None = HH_HELPFUL_DATA_DIR,
    max_rows: int | None = None,
):
    """HH-RLHF chosen/rejected pairs for TRL's DPOTrainer, in the conversational format: ``prompt`` (the turns
    before the last Assistant turn, parsed and filtered as `load_hh_helpful_prompts` does) and ``chosen`` /
    ``rejected`` (the two final Assistant turns). Rows whose rejected dialogue does not parse are skipped."""
    raw = load_hh_raw(dataset_name_or_path, split, data_dir=data_dir, max_rows=max_rows)
    ds, stats = hh_rows_to_prompts(raw, tokenizer, max_prompt_length, keep_columns=("chosen", "rejected"))

    def final_turn(text: Any) -> list[dict[str, str]] | None:
        try:
            turns = parse_hh_dialogue(text)
        except HHFormatError:
            return None
        return [turns[-1]] if turns[-1]["role"] == "assistant" and turns[-1]["content"] else None

    ds = ds.map(lambda r: {"chosen": final_turn(r["chosen"]), "rejected": final_turn(r["rejected"])})
    return ds.filter(lambda r: r["chosen"] is not None and r["rejected"] is not None), stats


def hold_out_validation(dataset, n: int):
    """Split a prompt dataset (a ``prompt`` column) into ``(train, validation)``: the last ``n`` rows are the
    validation prompts, and every row whose prompt equals one of them leaves training (a prompt can repeat in
    HH), so model selection is judged on prompts the policy never trained on, and never on the test split."""
    if n < 0 or n >= len(dataset):
        raise ValueError(
            f"validation_prompts must be in [0, {len(dataset) - 1}] (the training prompts), got {n}"
        )
    if n == 0:
        return dataset, dataset.select([])
    validation = dataset.select(range(len(dataset) - n, len(dataset)))
    return without_prompts(dataset, validation["prompt"]), validation


def without_prompts(dataset, prompts: Iterable[Any]):
    """The rows of ``dataset`` (a ``prompt`` column) whose prompt is none of ``prompts``, in order: every copy
    of a held-out prompt leaves (a prompt can repeat in HH). ``dataset`` itself when ``prompts`` is empty."""
    held = {json.dumps(p, sort_keys=True) for p in prompts}
    if not held:
        return dataset
    return dataset.select(
        [i for i, p in enumerate(dataset["prompt"]) if json.dumps(p, sort_keys=True) not in held]
    )
