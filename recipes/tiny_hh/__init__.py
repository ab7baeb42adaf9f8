"""The embedded default "tiny HH": offline, deterministic assets for the RLHF recipe.

``build_tiny_assets()`` makes (once) and caches:

* ``data/train.jsonl``, ``data/test.jsonl`` (and in world v3 ``data/validation.jsonl``): synthetic HH-format
  dialogues (``\n\nHuman: ...\n\nAssistant: ...``, multi-turn included) generated from a seed. Each row has
  ``chosen`` / ``rejected`` (raw HH strings, same prompt prefix), ``chosen_gold`` /
  ``rejected_gold`` (the gold scores of the two final responses) and ``topic``. It is read by
  :func:`recipes.hh_common.hh_data.load_hh_helpful_prompts` like the real dataset.
* ``policy/``: a byte-level BPE tokenizer (trained on the dialogues) with a Qwen-style chat
  template (``<|im_start|>role\n...<|im_end|>``) and a tiny ``Qwen2ForCausalLM`` briefly SFT-ed on a
  *mix* of good and bad responses, so that its samples are of mixed gold quality.
* ``reward_model/``: a tiny ``DebertaV2ForSequenceClassification`` (``num_labels=1``) trained with
  TRL's ``RewardTrainer`` on the chosen/rejected pairs, encoded as text pairs
  ``tokenizer(question, answer)`` exactly like :class:`recipes.hh_common.rewards.PairwiseRewardModel`
  scores them (question = last user turn). It is an imperfect proxy of the gold score.
* ``build_info.json``: builder version, seed, sizes, build time, RM held-out pairwise accuracy,
  the gold quality of the SFT policy's samples and (v3) the calibration table: a scripted ideal
  answer's gold, keyword salad's gold and the proxy's scores for both.

Everything is saved with ``save_pretrained``, so ``AutoModelForCausalLM`` /
``AutoModelForSequenceClassification`` / ``AutoTokenizer.from_pretrained(dir)`` load it exactly as
they load hub checkpoints.

Two world versions (``version=``; cache ``$RGPO_TRL_CACHE/tiny_hh/v<version>``, default
``RGPO_TRL_CACHE=~/.cache/rgpo_trl``, suffix ``-quick`` for the small test variant and ``-seed<N>``
for a non-default seed):

* **v3** (default): training, validation and test questions never share a normalised question
  text (`splits`: whole question forms and item x form combinations held out; the SFT policy and the
  reward model learn from training questions only), and the gold rule :func:`gold_score_v3` scores
  content only as far as the response is well formed (`gold_v3`), so keyword salad scores below 0.
* **v2**: the world of the committed v2 results: test prompts drawn from the same question pool as
  training, gold :func:`gold_score` =
  ``2 * answers + 1 * on_topic + 0.5 * polite - 1.5 * rude - 2 * repetition - length_penalty``
  (``answers``: the fraction of the asked item's key words present, ``on_topic``: the fraction of
  topic words that belong to the question's topic, ``polite``: a polite phrase present, ``rude``:
  rude phrases (max 2), ``repetition``: the fraction of repeated sentences,
  ``length_penalty = max(0, words - 45) / 30``), which keyword salad maxes.

CLI: ``python -m recipes.tiny_hh [--force] [--quick] [--version 2|3] [--cache-dir DIR] [--seed N]``.
"""

from .build import (
    BUILDER_VERSION,
    CACHE_ENV,
    DEFAULT_SEED,
    VERSIONS,
    TinyAssets,
    assets_dir,
    build_tiny_assets,
    gold_for,
    sample_policy,
)
from .dialogues import generate_dialogues, make_prompt, write_jsonl
from .gold_v3 import gold_components_v3, gold_reward_func_v3, gold_score_v3, keyword_salad, well_formedness
from .responses import make_response
from .splits import SPLITS, make_prompt_in_split, normalise_question
from .world import RESPONSE_KINDS, find_item, gold_components, gold_reward_func, gold_score

__all__ = [
    "BUILDER_VERSION",
    "CACHE_ENV",
    "DEFAULT_SEED",
    "RESPONSE_KINDS",
    "SPLITS",
    "VERSIONS",
    "TinyAssets",
    "assets_dir",
    "build_tiny_assets",
    "find_item",
    "generate_dialogues",
    "gold_components",
    "gold_components_v3",
    "gold_for",
    "gold_reward_func",
    "gold_reward_func_v3",
    "gold_score",
    "gold_score_v3",
    "keyword_salad",
    "make_prompt_in_split",
    "normalise_question",
    "well_formedness",
    "make_prompt",
    "make_response",
    "sample_policy",
    "write_jsonl",
]
