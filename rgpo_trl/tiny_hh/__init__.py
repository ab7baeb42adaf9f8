"""The embedded default "tiny HH": offline, deterministic assets for the RLHF recipe.

``build_tiny_assets()`` makes (once) and caches:

* ``data/train.jsonl``, ``data/test.jsonl``: synthetic HH-format dialogues
  (``\\n\\nHuman: ...\\n\\nAssistant: ...``, multi-turn included) generated from a seed. Each row has
  ``chosen`` / ``rejected`` (raw HH strings, same prompt prefix), ``chosen_gold`` /
  ``rejected_gold`` (the gold scores of the two final responses) and ``topic``. It is read by
  :func:`rgpo_trl.rlhf.hh_data.load_hh_helpful_prompts` like the real dataset.
* ``policy/``: a byte-level BPE tokenizer (trained on the dialogues) with a Qwen-style chat
  template (``<|im_start|>role\\n...<|im_end|>``) and a tiny ``Qwen2ForCausalLM`` briefly SFT-ed on a
  *mix* of good and bad responses, so that its samples are of mixed gold quality.
* ``reward_model/``: a tiny ``DebertaV2ForSequenceClassification`` (``num_labels=1``) trained with
  TRL's ``RewardTrainer`` on the chosen/rejected pairs, encoded as text pairs
  ``tokenizer(question, answer)`` exactly like :class:`rgpo_trl.rlhf.rewards.PairwiseRewardModel`
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

from .build import (
    BUILDER_VERSION,
    CACHE_ENV,
    DEFAULT_SEED,
    TinyAssets,
    assets_dir,
    build_tiny_assets,
    sample_policy,
)
from .dialogues import generate_dialogues, make_prompt, make_response, write_jsonl
from .world import RESPONSE_KINDS, find_item, gold_components, gold_reward_func, gold_score

__all__ = [
    "BUILDER_VERSION",
    "CACHE_ENV",
    "DEFAULT_SEED",
    "RESPONSE_KINDS",
    "TinyAssets",
    "assets_dir",
    "build_tiny_assets",
    "find_item",
    "generate_dialogues",
    "gold_components",
    "gold_reward_func",
    "gold_score",
    "make_prompt",
    "make_response",
    "sample_policy",
    "write_jsonl",
]
