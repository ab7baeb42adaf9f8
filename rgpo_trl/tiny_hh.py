"""The embedded default "tiny HH": offline, deterministic assets for the RLHF recipe.

``build_tiny_assets()`` makes (once) and caches:

* ``data/train.jsonl``, ``data/test.jsonl``: synthetic HH-format dialogues
  (``\\n\\nHuman: ...\\n\\nAssistant: ...``, multi-turn included) generated from a seed. Each row has
  ``chosen`` / ``rejected`` (raw HH strings, same prompt prefix), ``chosen_gold`` /
  ``rejected_gold`` (the gold scores of the two final responses) and ``topic``. It is read by
  :func:`rgpo_trl.hh_data.load_hh_helpful_prompts` like the real dataset.
* ``policy/``: a byte-level BPE tokenizer (trained on the dialogues) with a Qwen-style chat
  template (``<|im_start|>role\\n...<|im_end|>``) and a tiny ``Qwen2ForCausalLM`` briefly SFT-ed on a
  *mix* of good and bad responses, so that its samples are of mixed gold quality.
* ``reward_model/``: a tiny ``DebertaV2ForSequenceClassification`` (``num_labels=1``) trained with
  TRL's ``RewardTrainer`` on the chosen/rejected pairs, encoded as text pairs
  ``tokenizer(question, answer)`` exactly like :class:`rgpo_trl.rewards.PairwiseRewardModel`
  scores them (question = last user turn). It is an imperfect proxy of the gold score.
* ``build_info.json``: builder version, seed, sizes, build time, RM held-out pairwise accuracy
  and the gold quality of the SFT policy's samples.

Everything is saved with ``save_pretrained``, so ``AutoModelForCausalLM`` /
``AutoModelForSequenceClassification`` / ``AutoTokenizer.from_pretrained(dir)`` load it exactly as
they load hub checkpoints.

Cache: ``$RGPO_TRL_CACHE/tiny_hh/v<BUILDER_VERSION>`` (default ``RGPO_TRL_CACHE=~/.cache/rgpo_trl``;
suffix ``-quick`` for the small test variant and ``-seed<N>`` for a non-default seed). Bumping
``BUILDER_VERSION`` gives a new directory, i.e. a rebuild.

The gold rule (:func:`gold_score`), known to the generator, scores a response to a question:
``2 * answers + 1 * on_topic + 0.5 * polite - 1.5 * rude - 2 * repetition - length_penalty``
where ``answers`` is the fraction of the asked item's key words present, ``on_topic`` the
fraction of topic words in the response that belong to the question's topic, ``polite`` whether
a polite phrase is present, ``rude`` the number (max 2) of rude phrases, ``repetition`` the
fraction of repeated sentences and ``length_penalty = max(0, words - 45) / 30``.

CLI: ``python -m rgpo_trl.tiny_hh [--force] [--quick] [--cache-dir DIR] [--seed N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUILDER_VERSION = 2
DEFAULT_SEED = 1234
CACHE_ENV = "RGPO_TRL_CACHE"

# --------------------------------------------------------------------------------------------
# Content bank: topic -> items (subject phrase used in questions, three (key word, clause) parts)
# --------------------------------------------------------------------------------------------
_BANK: dict[str, list[tuple[str, list[tuple[str, str]]]]] = {
    "cooking": [
        ("boil an egg", [("boiling", "put the egg in boiling water"), ("minutes", "leave it for about nine minutes"),
                         ("cold", "then cool it in cold water")]),
        ("make rice", [("rinse", "rinse the rice first"), ("cups", "use two cups of water per cup of rice"),
                       ("simmer", "simmer it with the lid on")]),
        ("bake bread", [("flour", "mix flour with water and salt"), ("yeast", "add a little yeast"),
                        ("dough", "let the dough rise before it goes in the oven")]),
        ("cook pasta", [("salted", "use plenty of salted water"), ("package", "check the package for the time"),
                        ("taste", "taste a piece before you drain it")]),
    ],
    "gardening": [
        ("grow tomatoes", [("sun", "plant them in full sun"), ("soil", "water the soil deeply"),
                           ("stake", "tie each stem to a stake")]),
        ("prune roses", [("winter", "prune them in late winter"), ("bud", "cut just above an outward bud"),
                         ("shears", "use clean sharp shears")]),
        ("start a compost pile", [("scraps", "mix green kitchen scraps"), ("leaves", "add dry brown leaves"),
                                  ("damp", "keep the pile damp and turn it")]),
        ("keep a lawn healthy", [("mow", "mow it high"), ("grass", "water the grass deeply but rarely"),
                                 ("fertilize", "fertilize it in spring")]),
    ],
    "fitness": [
        ("start running", [("walking", "mix short runs with walking"), ("pace", "keep an easy pace"),
                           ("gradually", "add distance gradually")]),
        ("build strength", [("weights", "lift moderate weights"), ("rest", "rest a day between sessions"),
                            ("form", "focus on good form")]),
        ("stretch after exercise", [("stretch", "hold each stretch"), ("seconds", "for about thirty seconds"),
                                    ("muscles", "and let your muscles relax")]),
        ("stay hydrated", [("drink", "drink water through the day"), ("bottle", "carry a bottle with you"),
                           ("thirsty", "do not wait until you are thirsty")]),
    ],
    "travel": [
        ("pack a suitcase", [("roll", "roll your clothes"), ("heavy", "put heavy items near the wheels"),
                             ("documents", "keep your documents in a small pouch")]),
        ("find cheap flights", [("early", "book early"), ("dates", "compare several dates"),
                                ("alert", "set a price alert")]),
        ("beat jet lag", [("sleep", "shift your sleep before the trip"), ("daylight", "get daylight on arrival"),
                          ("naps", "avoid long naps")]),
        ("plan a road trip", [("route", "map your route"), ("fuel", "plan your fuel stops"),
                              ("breaks", "leave time for breaks")]),
    ],
    "computers": [
        ("speed up my laptop", [("programs", "close unused programs"), ("startup", "remove startup apps"),
                                ("disk", "free some disk space")]),
        ("make a strong password", [("passphrase", "use a long passphrase"), ("random", "pick random words"),
                                    ("manager", "store it in a password manager")]),
        ("back up my files", [("external", "copy them to an external drive"), ("cloud", "use a cloud service"),
                              ("schedule", "run the backup on a schedule")]),
        ("learn to code", [("python", "pick one language like python"), ("projects", "build small projects"),
                           ("daily", "write code daily")]),
    ],
    "pets": [
        ("train a puppy", [("treats", "reward good behavior with treats"), ("patient", "be patient and calm"),
                           ("consistent", "be consistent")]),
        ("care for a cat", [("litter", "keep the litter box clean"), ("vet", "visit the vet every year"),
                            ("fresh", "give it fresh water")]),
        ("keep a fish tank clean", [("filter", "clean the filter"), ("quarter", "change a quarter of the water weekly"),
                                    ("overfeed", "do not overfeed the fish")]),
        ("help my dog lose weight", [("meals", "weigh its meals"), ("snacks", "cut back on snacks"),
                                     ("walks", "take longer walks together")]),
    ],
    "money": [
        ("save money", [("budget", "make a monthly budget"), ("spending", "track your spending"),
                        ("payday", "move savings first each payday")]),
        ("pay off debt", [("debts", "list all your debts"), ("interest", "pay the highest interest first"),
                          ("charges", "avoid new charges")]),
        ("start investing", [("index", "start with low cost index funds"),
                             ("diversify", "diversify across many companies"),
                             ("fixed", "invest a fixed amount regularly")]),
        ("build an emergency fund", [("expenses", "set aside three months of expenses"),
                                     ("separate", "keep it separate from everyday money"),
                                     ("account", "use a savings account")]),
    ],
    "music": [
        ("learn guitar", [("chords", "learn a few basic chords"), ("switching", "drill switching between them"),
                          ("metronome", "play slowly with a metronome")]),
        ("sing better", [("voice", "warm up your voice"), ("diaphragm", "breathe from the diaphragm"),
                         ("record", "record yourself and listen back")]),
        ("read sheet music", [("notes", "learn the notes on the staff"), ("rhythm", "count the rhythm"),
                              ("measure", "go one measure at a time")]),
        ("write a song", [("melody", "start with a simple melody"), ("chorus", "write the chorus first"),
                          ("lyrics", "keep the lyrics honest")]),
    ],
}

_QUESTION_TEMPLATES = [
    "How do I {s}?", "What is the best way to {s}?", "Can you tell me how to {s}?", "I want to {s}. Any tips?",
    "Do you know how to {s}?", "Any advice on how to {s}?", "What should I do to {s}?", "Please explain how to {s}.",
]
_FOLLOWUP_TEMPLATES = [
    "Thanks! And how do I {s}?", "Got it. What about how to {s}?", "Great. Can you also tell me how to {s}?",
    "Okay. One more thing: how do I {s}?",
]
_GREETINGS = [("Hi there.", "Hello! How can I help you today?"), ("Hello!", "Hi! What can I do for you?"),
              ("Hey, can you help me?", "Of course, I am glad to help. What do you need?")]
_POLITE_OPENERS = ["Sure!", "Happy to help.", "Great question.", "Of course.", "Glad you asked.", "Sure thing."]
_POLITE_CLOSERS = ["Hope this helps!", "Good luck!", "Let me know if you have more questions.", "Have fun!"]
_RUDE_OPENERS = ["Ugh, obviously", "That is a dumb question, but", "Whatever.", "Figure it out yourself, but",
                 "This is stupid, but"]
_FILLERS = ["This is really very important.", "As I said before, it really matters a lot.",
            "There are many many things to think about here.", "It is what it is, you know."]
_EVASIVE = ["I am not sure about that.", "Maybe ask someone else.", "It depends on a lot of things.",
            "Hard to say, really."]

POLITE_MARKERS = ("sure", "happy to help", "great question", "of course", "glad", "hope this helps", "good luck",
                  "let me know", "have fun")
RUDE_MARKERS = ("obviously", "dumb", "whatever", "figure it out yourself", "stupid", "ugh")

# response kinds and their sampling weights for the SFT mix (good responses are a minority)
RESPONSE_KINDS = {
    "good": 0.30, "terse": 0.10, "partial": 0.10, "rude": 0.10, "padded": 0.12, "wrong_item": 0.08,
    "off_topic": 0.08, "evasive": 0.08, "rude_evasive": 0.04,
}

_WORD_RE = re.compile(r"[a-z']+")
_SUBJECTS = sorted(((s, topic, [k for k, _ in parts]) for topic, items in _BANK.items() for s, parts in items),
                   key=lambda x: -len(x[0]))
_TOPIC_VOCAB = {topic: {k for _, parts in items for k, _ in parts} for topic, items in _BANK.items()}
_WORD_TOPIC = {w: t for t, ws in _TOPIC_VOCAB.items() for w in ws}


# --------------------------------------------------------------------------------------------
# Gold rule
# --------------------------------------------------------------------------------------------
def _text_of(x: Any, role: str | None = None) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, Mapping):
        return str(x.get("content", ""))
    parts = [m.get("content", "") for m in x if role is None or m.get("role") == role]
    return parts[-1] if (role == "user" and parts) else " ".join(parts)


def find_item(question: str) -> tuple[str, str, list[str]] | None:
    """(subject, topic, key words) of the bank item a question asks about, or None."""
    q = question.lower()
    for subject, topic, keys in _SUBJECTS:
        if subject in q:
            return subject, topic, keys
    return None


def gold_components(prompt: Any, completion: Any) -> dict[str, float]:
    """The parts of the gold rule (see module docstring) for one response."""
    from rgpo_trl.hh_data import last_user_text

    question = last_user_text(prompt) if not isinstance(prompt, Mapping) else _text_of(prompt)
    answer = _text_of(completion).strip()
    low = answer.lower()
    words = _WORD_RE.findall(low)
    item = find_item(question)
    wordset = set(words)
    answers = sum(k in wordset for k in item[2]) / 3.0 if item else 0.0
    topic_words = [_WORD_TOPIC[w] for w in words if w in _WORD_TOPIC]
    on_topic = (sum(t == item[1] for t in topic_words) / len(topic_words)) if (item and topic_words) else 0.0
    polite = float(any(m in low for m in POLITE_MARKERS))
    rude = float(min(2, sum(m in low for m in RUDE_MARKERS)))
    sentences = [s.strip() for s in re.split(r"[.!?]+", low) if s.strip()]
    repetition = (1.0 - len(set(sentences)) / len(sentences)) if sentences else 0.0
    length_penalty = max(0.0, len(words) - 45) / 30.0
    return {"answers": answers, "on_topic": on_topic, "polite": polite, "rude": rude,
            "repetition": repetition, "length_penalty": length_penalty}


def gold_reward_func(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """:func:`gold_score` as a TRL ``reward_funcs`` entry (metric name ``gold``).

    Give it weight 0 in ``reward_weights`` to *log* the true quality next to the proxy reward
    (``rewards/gold/mean``) without training on it: the gap shows reward-model over-optimisation.
    """
    return [gold_score(p, c) for p, c in zip(prompts, completions, strict=True)]


gold_reward_func.__name__ = "gold"


def gold_score(prompt: Any, completion: Any) -> float:
    """Gold quality of ``completion`` as a response to ``prompt``.

    ``prompt``: conversational messages, a raw HH string, or the question text; ``completion``: a
    string or assistant messages. Higher is better; about 3.5 for an ideal answer, <= 1 for
    evasive / off-topic ones. Used by the generator to make chosen/rejected pairs and by the
    recipe to track true quality (over-optimisation of the proxy reward model).
    """
    c = gold_components(prompt, completion)
    return (2.0 * c["answers"] + 1.0 * c["on_topic"] + 0.5 * c["polite"] - 1.5 * c["rude"]
            - 2.0 * c["repetition"] - c["length_penalty"])


# --------------------------------------------------------------------------------------------
# Dialogue generator
# --------------------------------------------------------------------------------------------
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
        msgs += [{"role": "user", "content": rng.choice(_QUESTION_TEMPLATES).format(s=s0)},
                 {"role": "assistant", "content": make_response("good", t0, p0, rng)}]
        if shape >= 0.9 and s0 != subject:  # a third exchange
            t1, s1, p1 = rng.choice(items)
            msgs += [{"role": "user", "content": rng.choice(_FOLLOWUP_TEMPLATES).format(s=s1)},
                     {"role": "assistant", "content": make_response("good", t1, p1, rng)}]
        msgs.append({"role": "user", "content": rng.choice(_FOLLOWUP_TEMPLATES).format(s=subject)})
    else:
        msgs.append({"role": "user", "content": rng.choice(_QUESTION_TEMPLATES).format(s=subject)})
    return msgs, topic, parts


def generate_dialogues(n: int, seed: int, *, min_margin: float = 0.5) -> list[dict[str, Any]]:
    """``n`` HH-format preference rows from ``seed`` (deterministic)."""
    from rgpo_trl.hh_data import render_hh_text

    rng = random.Random(seed)
    rows = []
    while len(rows) < n:
        msgs, topic, parts = make_prompt(rng)
        k1, k2 = sample_kind(rng), sample_kind(rng)
        r1, r2 = make_response(k1, topic, parts, rng), make_response(k2, topic, parts, rng)
        g1, g2 = gold_score(msgs, r1), gold_score(msgs, r2)
        if abs(g1 - g2) < min_margin:
            continue
        if g2 > g1:
            (r1, g1, k1), (r2, g2, k2) = (r2, g2, k2), (r1, g1, k1)
        prefix = render_hh_text(msgs, add_generation_prompt=False)
        rows.append({"chosen": f"{prefix}\n\nAssistant: {r1}", "rejected": f"{prefix}\n\nAssistant: {r2}",
                     "chosen_gold": round(g1, 6), "rejected_gold": round(g2, 6),
                     "chosen_kind": k1, "rejected_kind": k2, "topic": topic})
    return rows


def write_jsonl(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
POLICY_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
RM_SPECIAL = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]


def train_bpe(texts: Sequence[str], vocab_size: int):
    """A byte-level BPE ``tokenizers.Tokenizer`` holding both policy and reward-model special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    # The exact normalizer / pre-tokenizer of transformers' Qwen2Tokenizer, which rebuilds them when
    # AutoTokenizer loads the policy directory (model_type qwen2): training and loading must agree.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=POLICY_SPECIAL + RM_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def make_policy_tokenizer(bpe):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    t = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(bpe.to_str()), eos_token="<|im_end|>",
                                pad_token="<|endoftext|>", model_max_length=1024, padding_side="left")
    t.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    t.chat_template = CHAT_TEMPLATE
    return t


def make_rm_tokenizer(bpe, max_length: int = 512):
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(bpe.to_str())
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                                   unk_token="[UNK]", mask_token="[MASK]", model_max_length=max_length,
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])


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


FULL = BuildSettings(n_train=6000, n_test=600, vocab_size=2048, sft_epochs=2, sft_batch_size=20, sft_lr=4e-3,
                     rm_epochs=1, rm_batch_size=32, rm_lr=2e-3, rm_train_pairs=4000)
QUICK = BuildSettings(n_train=800, n_test=200, vocab_size=1024, sft_epochs=1, sft_batch_size=32, sft_lr=5e-3,
                      rm_epochs=2, rm_batch_size=32, rm_lr=3e-3, n_policy_samples=16)


@dataclass(frozen=True)
class TinyAssets:
    root: Path
    train_file: Path
    test_file: Path
    policy_dir: Path
    reward_model_dir: Path
    build_info_file: Path

    @property
    def data_dir(self) -> Path:
        return self.train_file.parent

    @property
    def build_info(self) -> dict[str, Any]:
        return json.loads(self.build_info_file.read_text())

    @classmethod
    def at(cls, root: str | os.PathLike) -> TinyAssets:
        root = Path(root)
        return cls(root=root, train_file=root / "data" / "train.jsonl", test_file=root / "data" / "test.jsonl",
                   policy_dir=root / "policy", reward_model_dir=root / "reward_model",
                   build_info_file=root / "build_info.json")

    def exists(self) -> bool:
        return self.build_info_file.is_file() and (self.policy_dir / "config.json").is_file() and (
            self.reward_model_dir / "config.json").is_file()


def default_cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rgpo_trl").expanduser()


def assets_dir(cache_dir: str | os.PathLike | None = None, *, quick: bool = False, seed: int = DEFAULT_SEED) -> Path:
    """Where the assets for (version, quick, seed) live: ``<root>/tiny_hh/v<VERSION>[-quick][-seed<N>]``."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    name = f"v{BUILDER_VERSION}" + ("-quick" if quick else "") + (f"-seed{seed}" if seed != DEFAULT_SEED else "")
    return root / "tiny_hh" / name


def _log(msg: str, verbose: bool) -> None:
    if verbose:
        print(f"[tiny_hh] {msg}", file=sys.stderr, flush=True)


def _train_policy(tok, train_rows, s: BuildSettings, seed: int, log):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rgpo_trl.hh_data import hh_text_to_prompt

    torch.manual_seed(seed)
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=s.policy_hidden, intermediate_size=2 * s.policy_hidden,
                      num_hidden_layers=s.policy_layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, tie_word_embeddings=True, eos_token_id=eos, pad_token_id=pad,
                      bos_token_id=None, rope_theta=10000.0, use_cache=True)
    model = Qwen2ForCausalLM(cfg)
    # SFT targets: a *mix* of response kinds (RESPONSE_KINDS weights), so samples have mixed quality
    rng = random.Random(seed + 1)
    examples = []
    for row in train_rows:
        prompt = hh_text_to_prompt(row["chosen"])
        item = find_item(prompt[-1]["content"])
        topic, parts = item[1], next(p for t, sbj, p in _items() if sbj == item[0])
        response = make_response(sample_kind(rng), topic, parts, rng)
        p_ids = tok(tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)["input_ids"]
        r_ids = tok(response, add_special_tokens=False)["input_ids"] + [eos]
        examples.append((p_ids + r_ids, [-100] * len(p_ids) + r_ids))
    opt = torch.optim.AdamW(model.parameters(), lr=s.sft_lr, weight_decay=0.0)
    n_steps = s.sft_epochs * ((len(examples) + s.sft_batch_size - 1) // s.sft_batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 20) * max(0.05, 1 - i / n_steps))
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

    from rgpo_trl.hh_data import parse_hh_dialogue

    torch.manual_seed(seed)
    cfg = DebertaV2Config(
        vocab_size=len(rm_tok), hidden_size=s.rm_hidden, num_hidden_layers=s.rm_layers, num_attention_heads=4,
        intermediate_size=2 * s.rm_hidden, max_position_embeddings=rm_tok.model_max_length, type_vocab_size=0,
        relative_attention=True, position_buckets=32, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
        position_biased_input=False, norm_rel_ebd="layer_norm", share_att_key=True, pooler_hidden_size=s.rm_hidden,
        pooler_hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pooler_dropout=0.0,
        num_labels=1, pad_token_id=rm_tok.pad_token_id)
    model = DebertaV2ForSequenceClassification(cfg)
    # Pre-tokenize as text pairs, exactly like rgpo_trl.rewards.PairwiseRewardModel encodes them:
    # RewardTrainer would otherwise concatenate prompt+completion into one text (no pair encoding).
    # type_vocab_size=0, so the token_type_ids the collator drops carry no information anyway.
    chosen_ids, rejected_ids = [], []
    for row in train_rows:
        c, r = parse_hh_dialogue(row["chosen"]), parse_hh_dialogue(row["rejected"])
        q = c[-2]["content"]
        enc = rm_tok([q, q], [c[-1]["content"], r[-1]["content"]], truncation="longest_first",
                     max_length=rm_tok.model_max_length)
        chosen_ids.append(enc["input_ids"][0])
        rejected_ids.append(enc["input_ids"][1])
    ds = Dataset.from_dict({"chosen_ids": chosen_ids, "rejected_ids": rejected_ids})
    args = RewardConfig(output_dir=str(workdir / "rm_trainer"), per_device_train_batch_size=s.rm_batch_size,
                        num_train_epochs=s.rm_epochs, learning_rate=s.rm_lr, lr_scheduler_type="linear",
                        warmup_steps=20, logging_steps=50, save_strategy="no", report_to="none", seed=seed,
                        data_seed=seed, use_cpu=True, disable_tqdm=True, max_length=None, bf16=False,
                        dataloader_num_workers=0, weight_decay=0.0)
    trainer = RewardTrainer(model=model, args=args, train_dataset=ds, processing_class=rm_tok)
    t0 = time.time()
    out = trainer.train()
    log(f"reward model trained in {time.time() - t0:.1f}s, final train loss {out.training_loss:.3f}")
    model = trainer.model.eval()
    return model, float(out.training_loss)


def _eval_reward_model(rm_dir: Path, test_rows) -> dict[str, float]:
    from rgpo_trl.hh_data import hh_text_to_prompt, parse_hh_dialogue
    from rgpo_trl.rewards import PairwiseRewardModel

    rm = PairwiseRewardModel(str(rm_dir), batch_size=64)
    prompts = [hh_text_to_prompt(r["chosen"]) for r in test_rows]
    ch = [parse_hh_dialogue(r["chosen"])[-1]["content"] for r in test_rows]
    rj = [parse_hh_dialogue(r["rejected"])[-1]["content"] for r in test_rows]
    sc, sr = rm(prompts, ch), rm(prompts, rj)
    acc = sum(a > b for a, b in zip(sc, sr, strict=True)) / len(test_rows)
    # rank correlation-ish sanity: accuracy restricted to pairs with a large gold margin
    big = [(a > b) for a, b, r in zip(sc, sr, test_rows, strict=True) if r["chosen_gold"] - r["rejected_gold"] >= 1.5]
    return {"rm_heldout_pairwise_accuracy": acc,
            "rm_heldout_accuracy_gold_margin_ge_1.5": (sum(big) / len(big)) if big else float("nan"),
            "rm_heldout_pairs": len(test_rows)}


def sample_policy(policy_dir: str | os.PathLike, prompts, *, max_new_tokens: int = 48, seed: int = 0,
                  do_sample: bool = True, temperature: float = 1.0) -> list[str]:
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
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
                             top_k=0, top_p=1.0)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def _eval_policy(policy_dir: Path, test_rows, n: int, seed: int) -> dict[str, Any]:
    from rgpo_trl.hh_data import hh_text_to_prompt

    prompts = [hh_text_to_prompt(r["chosen"]) for r in test_rows[:n]]
    comps = sample_policy(policy_dir, prompts, seed=seed)
    golds = [gold_score(p, c) for p, c in zip(prompts, comps, strict=True)]
    return {"policy_sample_gold_mean": sum(golds) / len(golds),
            "policy_sample_good_fraction": sum(g >= 3.0 for g in golds) / len(golds),
            "policy_sample_bad_fraction": sum(g < 1.5 for g in golds) / len(golds),
            "policy_samples": len(golds), "policy_sample_examples": comps[:4]}


def build_tiny_assets(cache_dir: str | os.PathLike | None = None, *, force: bool = False, quick: bool = False,
                      seed: int = DEFAULT_SEED, num_threads: int | None = 1, verbose: bool = True) -> TinyAssets:
    """Build (or reuse from the cache) the tiny-HH assets and return their paths.

    ``cache_dir`` replaces the cache root (default ``$RGPO_TRL_CACHE`` or ``~/.cache/rgpo_trl``);
    the assets go to :func:`assets_dir`. ``quick=True`` builds a smaller variant (~30 s) for tests.
    ``num_threads`` caps torch's intra-op threads during the build (restored afterwards).
    The directory is written under a temporary name and renamed when complete, so concurrent
    builders never see half-written assets.
    """
    target = assets_dir(cache_dir, quick=quick, seed=seed)
    assets = TinyAssets.at(target)
    if assets.exists() and not force:
        info = assets.build_info
        if info.get("builder_version") == BUILDER_VERSION and info.get("seed") == seed:
            return assets
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
        log(f"building {'quick ' if quick else ''}tiny-HH assets v{BUILDER_VERSION} (seed {seed}) in {target}")
        train_rows = generate_dialogues(s.n_train, seed)
        test_rows = generate_dialogues(s.n_test, seed + 7919)
        write_jsonl(train_rows, tmp_assets.train_file)
        write_jsonl(test_rows, tmp_assets.test_file)
        log(f"dialogues: {len(train_rows)} train / {len(test_rows)} test rows ({time.time() - t_start:.1f}s)")

        texts = [r[k] for r in train_rows for k in ("chosen", "rejected")]
        from rgpo_trl.hh_data import hh_text_to_prompt

        texts += [make_policy_tokenizer_template_text(hh_text_to_prompt(r["chosen"])) for r in train_rows[:200]]
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
        pol_eval = _eval_policy(tmp_assets.policy_dir, test_rows, s.n_policy_samples, seed)
        log(f"RM held-out pairwise accuracy {rm_eval['rm_heldout_pairwise_accuracy']:.3f}; policy sample gold "
            f"mean {pol_eval['policy_sample_gold_mean']:.2f} ({time.time() - t0:.1f}s)")
        info = {
            "builder_version": BUILDER_VERSION, "seed": seed, "quick": quick, "settings": s.__dict__,
            "n_train_rows": len(train_rows), "n_test_rows": len(test_rows), "vocab_size": len(pol_tok),
            "policy_class": type(policy).__name__, "policy_params": sum(p.numel() for p in policy.parameters()),
            "reward_model_class": type(rm).__name__, "reward_model_params": sum(p.numel() for p in rm.parameters()),
            "reward_question_mode": "last_user", "reward_truncation": "longest_first",
            "policy_sft_final_loss": sft_loss, "rm_train_loss": rm_loss,
            **rm_eval, **pol_eval,
            "build_time_s": round(time.time() - t_start, 1), "policy_sft_time_s": round(t_policy, 1),
            "rm_train_time_s": round(t_rm, 1), "torch_threads": torch.get_num_threads(),
            "versions": _versions(), "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
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


def make_policy_tokenizer_template_text(messages) -> str:
    """Chat-template text (without a tokenizer) used to let BPE see the template markup."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def _versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers
    import trl

    return {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
            "tokenizers": tokenizers.__version__}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build (if missing) the offline tiny-HH assets and print their paths.")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.add_argument("--quick", action="store_true", help="the small variant used by the tests")
    p.add_argument("--cache-dir", default=None, help=f"cache root (default ${CACHE_ENV} or ~/.cache/rgpo_trl)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--threads", type=int, default=1, help="torch threads during the build")
    a = p.parse_args(argv)
    assets = build_tiny_assets(a.cache_dir, force=a.force, quick=a.quick, seed=a.seed, num_threads=a.threads)
    print(json.dumps({"root": str(assets.root), "train_file": str(assets.train_file),
                      "test_file": str(assets.test_file), "policy_dir": str(assets.policy_dir),
                      "reward_model_dir": str(assets.reward_model_dir), "build_info": assets.build_info}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
