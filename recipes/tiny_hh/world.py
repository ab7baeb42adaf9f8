"""The tiny-HH world: a content bank of topics and items, and the gold rule that scores any response."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..hh_common.hh_data import last_user_text

# --------------------------------------------------------------------------------------------
# Content bank: topic -> items (subject phrase used in questions, three (key word, clause) parts)
# --------------------------------------------------------------------------------------------
_BANK: dict[str, list[tuple[str, list[tuple[str, str]]]]] = {
    "cooking": [
        (
            "boil an egg",
            [
                ("boiling", "put the egg in boiling water"),
                ("minutes", "leave it for about nine minutes"),
                ("cold", "then cool it in cold water"),
            ],
        ),
        (
            "make rice",
            [
                ("rinse", "rinse the rice first"),
                ("cups", "use two cups of water per cup of rice"),
                ("simmer", "simmer it with the lid on"),
            ],
        ),
        (
            "bake bread",
            [
                ("flour", "mix flour with water and salt"),
                ("yeast", "add a little yeast"),
                ("dough", "let the dough rise before it goes in the oven"),
            ],
        ),
        (
            "cook pasta",
            [
                ("salted", "use plenty of salted water"),
                ("package", "check the package for the time"),
                ("taste", "taste a piece before you drain it"),
            ],
        ),
    ],
    "gardening": [
        (
            "grow tomatoes",
            [
                ("sun", "plant them in full sun"),
                ("soil", "water the soil deeply"),
                ("stake", "tie each stem to a stake"),
            ],
        ),
        (
            "prune roses",
            [
                ("winter", "prune them in late winter"),
                ("bud", "cut just above an outward bud"),
                ("shears", "use clean sharp shears"),
            ],
        ),
        (
            "start a compost pile",
            [
                ("scraps", "mix green kitchen scraps"),
                ("leaves", "add dry brown leaves"),
                ("damp", "keep the pile damp and turn it"),
            ],
        ),
        (
            "keep a lawn healthy",
            [
                ("mow", "mow it high"),
                ("grass", "water the grass deeply but rarely"),
                ("fertilize", "fertilize it in spring"),
            ],
        ),
    ],
    "fitness": [
        (
            "start running",
            [
                ("walking", "mix short runs with walking"),
                ("pace", "keep an easy pace"),
                ("gradually", "add distance gradually"),
            ],
        ),
        (
            "build strength",
            [
                ("weights", "lift moderate weights"),
                ("rest", "rest a day between sessions"),
                ("form", "focus on good form"),
            ],
        ),
        (
            "stretch after exercise",
            [
                ("stretch", "hold each stretch"),
                ("seconds", "for about thirty seconds"),
                ("muscles", "and let your muscles relax"),
            ],
        ),
        (
            "stay hydrated",
            [
                ("drink", "drink water through the day"),
                ("bottle", "carry a bottle with you"),
                ("thirsty", "do not wait until you are thirsty"),
            ],
        ),
    ],
    "travel": [
        (
            "pack a suitcase",
            [
                ("roll", "roll your clothes"),
                ("heavy", "put heavy items near the wheels"),
                ("documents", "keep your documents in a small pouch"),
            ],
        ),
        (
            "find cheap flights",
            [("early", "book early"), ("dates", "compare several dates"), ("alert", "set a price alert")],
        ),
        (
            "beat jet lag",
            [
                ("sleep", "shift your sleep before the trip"),
                ("daylight", "get daylight on arrival"),
                ("naps", "avoid long naps"),
            ],
        ),
        (
            "plan a road trip",
            [
                ("route", "map your route"),
                ("fuel", "plan your fuel stops"),
                ("breaks", "leave time for breaks"),
            ],
        ),
    ],
    "computers": [
        (
            "speed up my laptop",
            [
                ("programs", "close unused programs"),
                ("startup", "remove startup apps"),
                ("disk", "free some disk space"),
            ],
        ),
        (
            "make a strong password",
            [
                ("passphrase", "use a long passphrase"),
                ("random", "pick random words"),
                ("manager", "store it in a password manager"),
            ],
        ),
        (
            "back up my files",
            [
                ("external", "copy them to an external drive"),
                ("cloud", "use a cloud service"),
                ("schedule", "run the backup on a schedule"),
            ],
        ),
        (
            "learn to code",
            [
                ("python", "pick one language like python"),
                ("projects", "build small projects"),
                ("daily", "write code daily"),
            ],
        ),
    ],
    "pets": [
        (
            "train a puppy",
            [
                ("treats", "reward good behavior with treats"),
                ("patient", "be patient and calm"),
                ("consistent", "be consistent"),
            ],
        ),
        (
            "care for a cat",
            [
                ("litter", "keep the litter box clean"),
                ("vet", "visit the vet every year"),
                ("fresh", "give it fresh water"),
            ],
        ),
        (
            "keep a fish tank clean",
            [
                ("filter", "clean the filter"),
                ("quarter", "change a quarter of the water weekly"),
                ("overfeed", "do not overfeed the fish"),
            ],
        ),
        (
            "help my dog lose weight",
            [
                ("meals", "weigh its meals"),
                ("snacks", "cut back on snacks"),
                ("walks", "take longer walks together"),
            ],
        ),
    ],
    "money": [
        (
            "save money",
            [
                ("budget", "make a monthly budget"),
                ("spending", "track your spending"),
                ("payday", "move savings first each payday"),
            ],
        ),
        (
            "pay off debt",
            [
                ("debts", "list all your debts"),
                ("interest", "pay the highest interest first"),
                ("charges", "avoid new charges"),
            ],
        ),
        (
            "start investing",
            [
                ("index", "start with low cost index funds"),
                ("diversify", "diversify across many companies"),
                ("fixed", "invest a fixed amount regularly"),
            ],
        ),
        (
            "build an emergency fund",
            [
                ("expenses", "set aside three months of expenses"),
                ("separate", "keep it separate from everyday money"),
                ("account", "use a savings account"),
            ],
        ),
    ],
    "music": [
        (
            "learn guitar",
            [
                ("chords", "learn a few basic chords"),
                ("switching", "drill switching between them"),
                ("metronome", "play slowly with a metronome"),
            ],
        ),
        (
            "sing better",
            [
                ("voice", "warm up your voice"),
                ("diaphragm", "breathe from the diaphragm"),
                ("record", "record yourself and listen back"),
            ],
        ),
        (
            "read sheet music",
            [
                ("notes", "learn the notes on the staff"),
                ("rhythm", "count the rhythm"),
                ("measure", "go one measure at a time"),
            ],
        ),
        (
            "write a song",
            [
                ("melody", "start with a simple melody"),
                ("chorus", "write the chorus first"),
                ("lyrics", "keep the lyrics honest"),
            ],
        ),
    ],
}

_QUESTION_TEMPLATES = [
    "How do I {s}?",
    "What is the best way to {s}?",
    "Can you tell me how to {s}?",
    "I want to {s}. Any tips?",
    "Do you know how to {s}?",
    "Any advice on how to {s}?",
    "What should I do to {s}?",
    "Please explain how to {s}.",
]
_FOLLOWUP_TEMPLATES = [
    "Thanks! And how do I {s}?",
    "Got it. What about how to {s}?",
    "Great. Can you also tell me how to {s}?",
    "Okay. One more thing: how do I {s}?",
]
_GREETINGS = [
    ("Hi there.", "Hello! How can I help you today?"),
    ("Hello!", "Hi! What can I do for you?"),
    ("Hey, can you help me?", "Of course, I am glad to help. What do you need?"),
]
_POLITE_OPENERS = [
    "Sure!",
    "Happy to help.",
    "Great question.",
    "Of course.",
    "Glad you asked.",
    "Sure thing.",
]
_POLITE_CLOSERS = ["Hope this helps!", "Good luck!", "Let me know if you have more questions.", "Have fun!"]
_RUDE_OPENERS = [
    "Ugh, obviously",
    "That is a dumb question, but",
    "Whatever.",
    "Figure it out yourself, but",
    "This is stupid, but",
]
_FILLERS = [
    "This is really very important.",
    "As I said before, it really matters a lot.",
    "There are many many things to think about here.",
    "It is what it is, you know.",
]
_EVASIVE = [
    "I am not sure about that.",
    "Maybe ask someone else.",
    "It depends on a lot of things.",
    "Hard to say, really.",
]

POLITE_MARKERS = (
    "sure",
    "happy to help",
    "great question",
    "of course",
    "glad",
    "hope this helps",
    "good luck",
    "let me know",
    "have fun",
)
RUDE_MARKERS = ("obviously", "dumb", "whatever", "figure it out yourself", "stupid", "ugh")

# response kinds and their sampling weights for the SFT mix (good responses are a minority)
RESPONSE_KINDS = {
    "good": 0.30,
    "terse": 0.10,
    "partial": 0.10,
    "rude": 0.10,
    "padded": 0.12,
    "wrong_item": 0.08,
    "off_topic": 0.08,
    "evasive": 0.08,
    "rude_evasive": 0.04,
}

_WORD_RE = re.compile(r"[a-z']+")
_SUBJECTS = sorted(
    ((s, topic, [k for k, _ in parts]) for topic, items in _BANK.items() for s, parts in items),
    key=lambda x: -len(x[0]),
)
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
    return {
        "answers": answers,
        "on_topic": on_topic,
        "polite": polite,
        "rude": rude,
        "repetition": repetition,
        "length_penalty": length_penalty,
    }


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
    return (
        2.0 * c["answers"]
        + 1.0 * c["on_topic"]
        + 0.5 * c["polite"]
        - 1.5 * c["rude"]
        - 2.0 * c["repetition"]
        - c["length_penalty"]
    )
