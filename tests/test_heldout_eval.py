"""The held-out evaluation every RLHF method shares (recipes.hh_rlhf.evaluation), on the quick tiny-HH
assets."""

from __future__ import annotations

import copy
import statistics

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from recipes.hh_common.hh_data import load_hh_helpful_prompts
from recipes.hh_rlhf.evaluation import evaluate_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def setup(quick_assets):
    tok = AutoTokenizer.from_pretrained(quick_assets.policy_dir)
    model = AutoModelForCausalLM.from_pretrained(quick_assets.policy_dir)
    prompts, _ = load_hh_helpful_prompts(str(quick_assets.test_file), "train", tok, 128, max_rows=8)
    return tok, model, [p["prompt"] for p in prompts]


def test_kl_ref_is_zero_for_the_reference_itself_and_rewards_are_means_of_the_scored_samples(setup):
    tok, model, prompts = setup
    seen = []

    def reward(prompts, completions, **kw):
        seen.extend(c[0]["content"] for c in completions)
        return [float(len(c[0]["content"])) for c in completions]

    def gold(prompts, completions, **kw):
        return [1.0 if "a" in c[0]["content"] else 0.0 for c in completions]

    res = evaluate_policy(
        model,
        tok,
        prompts,
        reward,
        ref_model=copy.deepcopy(model),
        gold_fn=gold,
        max_new_tokens=12,
        batch_size=3,
        seed=5,
    )
    assert res["kl_ref"] == 0.0 and res["prompts"] == len(prompts) == len(seen)
    assert res["reward"] == pytest.approx(sum(len(s) for s in seen) / len(seen))
    assert res["gold"] == pytest.approx(sum("a" in s for s in seen) / len(seen))
    lengths = [float(len(s)) for s in seen]
    assert res["reward_std"] == pytest.approx(statistics.stdev(lengths))  # sample std, ddof 1
    assert res["gold_std"] == pytest.approx(statistics.stdev([float("a" in s) for s in seen]))
    again = evaluate_policy(
        model, tok, prompts, reward, ref_model=copy.deepcopy(model), max_new_tokens=12, batch_size=3, seed=5
    )
    assert again["reward"] == res["reward"]  # seeded sampling


def test_kl_ref_grows_with_the_distance_to_the_reference(setup):
    tok, model, prompts = setup
    reward = lambda prompts, completions, **kw: [0.0] * len(completions)  # noqa: E731
    kls = []
    for scale in (0.01, 0.1):
        moved = copy.deepcopy(model)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in moved.parameters():
                p.add_(scale * torch.randn(p.shape, generator=gen))
        kls.append(
            evaluate_policy(moved, tok, prompts, reward, ref_model=model, max_new_tokens=12, seed=1)["kl_ref"]
        )
    assert 0 < kls[0] < kls[1]
