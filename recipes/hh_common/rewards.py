"""Reward function for pairwise-text sequence-classification reward models.

Models such as ``OpenAssistant/reward-model-deberta-v3-large-v2`` score a *text pair*::

    inputs = tokenizer(question, answer, return_tensors="pt")
    score = model(**inputs).logits[0]

(model card). TRL's built-in reward-model path (a ``PreTrainedModel`` in ``reward_funcs``) instead
renders prompt + completion as *one* text and loses the pair encoding (``[CLS] q [SEP] a [SEP]``
with segment ids), so it must not be used for these models. :class:`PairwiseRewardModel` is a
callable usable as a TRL ``reward_funcs`` entry::

    reward = PairwiseRewardModel("OpenAssistant/reward-model-deberta-v3-large-v2")
    reward.to(trainer.accelerator.device)           # or device="auto" / "cuda" at construction
    GRPOTrainer(..., reward_funcs=[reward])

Choices (documented, configurable):

* ``question="last_user"`` (default): the question is the text of the last user turn, the answer
  the completion text, as in the model card's ``(question, answer)`` example. ``"conversation"``
  renders all prompt turns as ``Human: ...\\n\\nAssistant: ...`` text instead (more context for
  multi-turn dialogues; the *end* of a long history may then be truncated, see below).
* truncation ``"longest_first"`` to ``max_length`` (default: the smaller of the tokenizer's
  ``model_max_length`` and the model's ``max_position_embeddings``, 512 for DeBERTa-v3): tokens are
  removed from whichever of question/answer is longer, so an over-long answer never makes the
  call fail (``only_first`` would raise when the answer alone is too long) and both parts keep
  some text.
* completions are scored under ``torch.no_grad()`` in batches of ``batch_size`` (padding is per
  batch; scores do not depend on the batch size up to float rounding). One float per completion:
  the logit of the single label.
* conversational completions (``[{"role": "assistant", "content": ...}]``) are joined to text;
  string prompts in raw HH format (``\\n\\nHuman: ...``) are parsed, other strings used as is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from .hh_data import HHFormatError, last_user_text, parse_hh_dialogue, render_hh_text
from .hub_access import ensure_loadable

QuestionMode = Literal["last_user", "conversation"]


def _completion_text(c: Any) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, Mapping):
        return str(c.get("content", ""))
    return "".join(str(m.get("content", "")) for m in c)


def _question_text(prompt: Any, mode: QuestionMode) -> str:
    if mode == "last_user":
        return last_user_text(prompt)
    if isinstance(prompt, str):
        try:
            msgs = parse_hh_dialogue(prompt)
        except HHFormatError:
            return prompt.strip()
        if msgs and msgs[-1]["role"] == "assistant" and not msgs[-1]["content"]:
            msgs = msgs[:-1]  # trailing "\n\nAssistant:" generation prompt
    else:
        msgs = [m for m in prompt if m.get("role") != "system"]
    return render_hh_text(msgs, add_generation_prompt=False).strip()


class PairwiseRewardModel:
    """Callable reward: ``__call__(prompts, completions, **kwargs) -> list[float]``.

    Args:
        model_name_or_path: hub id or local directory; checked with
            :func:`recipes.hh_common.hub_access.ensure_loadable` (fails fast offline). Omit it when
            passing ``model`` and ``tokenizer``.
        model, tokenizer: already loaded objects (used instead of loading).
        batch_size: completions per forward pass.
        max_length: truncation length (default: see module docstring).
        question: ``"last_user"`` or ``"conversation"`` (module docstring).
        device: ``None`` (keep where the model is), ``"auto"`` (cuda if available) or any torch device.
        dtype: optional torch dtype for loading (e.g. ``torch.bfloat16`` on GPU).
        name: ``__name__`` used by TRL for metric names (default: last part of the id/path).
    """

    def __init__(
        self,
        model_name_or_path: str | os.PathLike | None = None,
        *,
        model=None,
        tokenizer=None,
        batch_size: int = 16,
        max_length: int | None = None,
        question: QuestionMode = "last_user",
        device: Any = None,
        dtype: Any = None,
        name: str | None = None,
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if question not in ("last_user", "conversation"):
            raise ValueError(f"question must be 'last_user' or 'conversation', got {question!r}")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if model is None or tokenizer is None:
            if model_name_or_path is None:
                raise ValueError("pass model_name_or_path, or both model and tokenizer")
            src = ensure_loadable(model_name_or_path, kind="model")
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(src)
            if model is None:
                kw = {"dtype": dtype} if dtype is not None else {}
                model = AutoModelForSequenceClassification.from_pretrained(src, **kw)
        if getattr(model.config, "num_labels", 1) != 1:
            raise ValueError(
                f"expected a single-label reward model, got num_labels={model.config.num_labels}"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.question = question
        self.max_length = max_length or self._default_max_length()
        src_name = (
            os.fspath(model_name_or_path)
            if model_name_or_path is not None
            else getattr(model.config, "_name_or_path", "") or type(model).__name__
        )
        self.__name__ = name or (os.path.basename(os.path.normpath(src_name)) or "pairwise_reward")
        if device is not None:
            self.to(device)

    def _default_max_length(self) -> int:
        cands = [
            getattr(self.tokenizer, "model_max_length", None),
            getattr(self.model.config, "max_position_embeddings", None),
        ]
        cands = [int(c) for c in cands if c is not None and 0 < c < 1_000_000]
        return min(cands) if cands else 512

    @property
    def device(self):
        return next(self.model.parameters()).device

    def to(self, device: Any) -> PairwiseRewardModel:
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model.to(device)
        return self

    def encode(self, questions: Sequence[str], answers: Sequence[str]):
        """The exact tokenization used for scoring (and for training the tiny reward model)."""
        return self.tokenizer(
            list(questions),
            list(answers),
            padding=True,
            truncation="longest_first",
            max_length=self.max_length,
            return_tensors="pt",
        )

    def score_pairs(self, questions: Sequence[str], answers: Sequence[str]) -> list[float]:
        """Scores of ``(question, answer)`` text pairs."""
        import torch

        if len(questions) != len(answers):
            raise ValueError(f"{len(questions)} questions but {len(answers)} answers")
        out: list[float] = []
        dev = self.device
        with torch.no_grad():
            for i in range(0, len(questions), self.batch_size):
                enc = self.encode(questions[i : i + self.batch_size], answers[i : i + self.batch_size])
                enc = {k: v.to(dev) for k, v in enc.items()}
                logits = self.model(**enc).logits
                out.extend(logits[:, 0].float().cpu().tolist())
        return out

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        questions = [_question_text(p, self.question) for p in prompts]
        answers = [_completion_text(c).strip() for c in completions]
        return self.score_pairs(questions, answers)

    def __repr__(self) -> str:
        return (
            f"PairwiseRewardModel(name={self.__name__!r}, question={self.question!r}, "
            f"max_length={self.max_length}, batch_size={self.batch_size}, device={self.device})"
        )


def load_pairwise_reward(model_name_or_path: str | os.PathLike, **kwargs: Any) -> PairwiseRewardModel:
    """Shorthand for ``PairwiseRewardModel(model_name_or_path, **kwargs)``."""
    return PairwiseRewardModel(model_name_or_path, **kwargs)
