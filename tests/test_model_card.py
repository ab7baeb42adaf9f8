"""RGPOTrainer's model card (issue 49): for a local model and dataset no "None" and no huggingface.co link,
the output directory's name as the title, the local directory in the quick start; for hub names TRL's hub
links; and in both the RGPO settings the run used. Offline: the card is built directly from a tiny local
model."""

from __future__ import annotations

import re

import pytest
import torch
from _trainer_utils import base_args, save_tiny_model, tiny_dataset, vowel_reward
from huggingface_hub import ModelCard
from trl import GRPOTrainer

from rgpo_trl import RGPOConfig, RGPOTrainer
from rgpo_trl.trainer.model_card import hub_id

torch.set_num_threads(1)

BASE = "Qwen/Qwen2.5-1.5B-Instruct"
DATASET = "Anthropic/hh-rlhf"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("card") / "policy")


def _card(output_dir) -> tuple[str, dict]:
    """The card's text and its metadata, as the hub reads them."""
    path = output_dir / "README.md"
    return path.read_text(), ModelCard.load(path).data.to_dict()


def test_hub_id_names_hub_repositories_only(tmp_path, monkeypatch):
    assert hub_id(BASE) == BASE and hub_id(DATASET) == DATASET and hub_id("gpt2") == "gpt2"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    # an existing directory, even one spelled like a repository id, and what no repository id could spell
    for local in (str(tmp_path), "org/name", "org", "/no/such/dir", "./model", "~/.cache/data", None, ""):
        assert hub_id(local) is None, local


def test_card_of_a_local_run_names_local_things_and_states_the_settings(model_path, tmp_path):
    """2 steps on a local model with non-default RGPO settings: the card TRL writes at the checkpoint and the
    one the recipe writes at the end (with the local dataset)."""
    dataset_dir = tmp_path / "prompts"
    tiny_dataset().save_to_disk(str(dataset_dir))
    output_dir = tmp_path / "my-rgpo-run"
    settings = dict(
        gate="clipped_linear",
        gate_params={"c": 1.5},
        ratio_mode="old",
        beta=0.02,
        kl_coef=0.4,
        kl_target=0.03,
        learning_rate=3e-3,
        entropy_coef=0.1,
        save_strategy="steps",
        save_steps=2,
    )
    args = RGPOConfig(**base_args(output_dir, **settings))
    trainer = RGPOTrainer(model_path, vowel_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    assert trainer.state.global_step == 2

    checkpoint_card, _ = _card(output_dir)  # GRPOTrainer._save_checkpoint wrote it at step 2
    trainer.create_model_card(dataset_name=str(dataset_dir))
    final_card, metadata = _card(output_dir)
    for text in (checkpoint_card, final_card):
        assert "None" not in text and "huggingface.co" not in text
        assert "# Model Card for my-rgpo-run\n" in text
        assert "This model is a fine-tuned version of the local model `policy`" in text
        assert f'pipeline("text-generation", model="{output_dir}", device_map="auto")' in text
        procedure = text.split("## Training procedure")[1].split("### Framework versions")[0]
        for line in (
            "- gate: `clipped_linear` (c=1.5)\n",
            "- ratio mode: `old` (the gate sees π/π_old",
            "- KL to π_old (r_old - 1 - log r_old): `adaptive` controller from kl_coef 0.4, target kl_target "
            f"0.03, bounds [0.01, 5], updated once per iteration; {trainer.kl_coef:g} at step 2\n",
            "- KL to the reference (k3): beta (β_ref) 0.02\n",
            "- loss aggregation `dapo`, importance sampling level `token`\n",
            "- entropy bonus: entropy_coef 0.1\n",
            "- learning rate 0.003 (`linear` schedule",
            "- optimizer steps: 2 trained (max_steps 2)\n",
            "- 4 completions per prompt, up to 8 tokens, temperature 1; num_iterations 2",
            "- batch: 4 completions per device x 1 accumulation steps x 1 processes; seed 0\n",
        ):
            assert line in procedure, line
    assert "the local dataset `prompts`" in final_card and "prompts" not in checkpoint_card
    assert "base_model" not in metadata and "datasets" not in metadata  # the hub would refuse a local path
    assert metadata["model_name"] == "my-rgpo-run" and {"trl", "rgpo"} <= set(metadata["tags"])


def test_card_of_a_hub_run_links_the_hub_as_trl_does(model_path, tmp_path):
    """A hub base model (patched in: offline), a hub dataset and a pushed run (``hub_model_id``, which
    ``push_to_hub`` sets): the same huggingface.co links as TRL's own card, and the settings."""
    args = RGPOConfig(**base_args(tmp_path / "out"))
    trainer = RGPOTrainer(model_path, vowel_reward, args=args, train_dataset=tiny_dataset())
    trainer.model.config._name_or_path = BASE
    trainer.hub_model_id = "someone/qwen-rgpo"

    GRPOTrainer.create_model_card(trainer, dataset_name=DATASET)  # TRL's card: the reference for the links
    trl_links = set(re.findall(r"https://huggingface\.co/[^)\s\"]*", _card(tmp_path / "out")[0]))
    assert trl_links == {f"https://huggingface.co/{BASE}", f"https://huggingface.co/datasets/{DATASET}"}

    trainer.create_model_card(dataset_name=DATASET)
    text, metadata = _card(tmp_path / "out")
    assert set(re.findall(r"https://huggingface\.co/[^)\s\"]*", text)) == trl_links
    assert f"fine-tuned version of [{BASE}](https://huggingface.co/{BASE}) on [{DATASET}]" in text
    assert "# Model Card for qwen-rgpo\n" in text and "None" not in text
    assert 'pipeline("text-generation", model="someone/qwen-rgpo", device_map="auto")\n' in text
    assert metadata["base_model"] == BASE and metadata["datasets"] in (DATASET, [DATASET])
    for line in (
        "- gate: `sigmoid` (k=5)\n",
        "- ratio mode: `dual` (the gate sees max(π/π_old, π/π_ref) per token)\n",
        "`adaptive` controller from kl_coef 0.5, target kl_target 0.02, bounds [0.01, 5], updated once per "
        "iteration; 0.5 at step 0\n",
        "- KL to the reference (k3): beta (β_ref) 0.05\n",
        "- learning rate 0.01 (`linear` schedule",
        "- optimizer steps: 0 trained (max_steps 2)\n",
    ):
        assert line in text, line
    assert "entropy bonus" not in text  # GRPOConfig's default: no bonus


def test_async_trainer_card_of_a_local_run_states_its_own_settings(tmp_path):
    """AsyncRGPOTrainer on a local model (CPU, in-process worker at an exact lag): TRL's card for it is the
    broken one ("None", huggingface.co/None); the card it writes has neither, names the local things and lists
    its own settings: the correction, the gate and KL updated per optimizer step, staleness, the sampler, and
    no num_iterations. With another correction, the RGPO lines (which it does not read) are left out."""
    import warnings

    warnings.filterwarnings("ignore", message=".*trl.experimental.*")
    from _async_utils import config, trainer_with_worker
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from rgpo_trl.testing import tiny_model, tiny_tokenizer

    model_dir = tmp_path / "policy"
    tok = tiny_tokenizer()
    tiny_model(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    output_dir = tmp_path / "my-async-run"
    settings = dict(ratio_mode="dual", beta=0.02, kl_coef=0.4, max_staleness=3, sampler_logit_noise=0.1)
    args = config(tmp_path, output_dir=str(output_dir), max_steps=2, sampler_top_p=0.9, **settings)
    trainer, _ = trainer_with_worker(str(model_dir), args, lag=2)
    trainer.train()
    assert trainer.state.global_step == 2

    AsyncGRPOTrainer.create_model_card(trainer, dataset_name=str(tmp_path / "prompts"))  # TRL's own card
    assert "Model Card for None" in _card(output_dir)[0]  # what this test guards against
    trainer.create_model_card(dataset_name=str(tmp_path / "prompts"))
    text, metadata = _card(output_dir)
    assert "None" not in text and "huggingface.co" not in text
    assert "# Model Card for my-async-run\n" in text
    assert (
        "This model is a fine-tuned version of the local model `policy` on the local dataset `prompts`"
        in text
    )
    assert f'pipeline("text-generation", model="{output_dir}", device_map="auto")' in text
    assert "rgpo-trl's `AsyncRGPOTrainer`" in text and "trained with AsyncRGPO" in text
    procedure = text.split("## Training procedure")[1].split("### Framework versions")[0]
    for line in (
        "- off-policy correction: `rgpo`, against the sampler's log-probs\n",
        "- gate: `sigmoid` (k=5)\n",
        "- ratio mode: `dual` (the gate sees max(π/π_old, π/π_ref) per token)\n",
        "- KL to the sampling policy π_old (r_old - 1 - log r_old): `adaptive` controller from kl_coef 0.4, "
        "target kl_target 0.02, bounds [0.01, 5], updated once per optimizer step; "
        f"{trainer.kl_ctl.kl_coef:g} at step 2\n",
        "- KL to the reference (k3): beta (β_ref) 0.02\n",
        "- staleness: samples up to max_staleness 3 weight versions behind are trained on; weights published "
        "every 1 optimizer step(s)\n",
        "- sampler: the in-process rollout worker (exact lag 2 weight versions), dtype `float32`, "
        "quantization `none`, logit noise sigma 0.1, top_p 0.9\n",
        "- learning rate 0.01 (`constant` schedule, warmup_steps 0)\n",  # AsyncGRPOConfig's default
        "- optimizer steps: 2 trained (max_steps 2)\n",
        "- 4 completions per prompt, up to 8 tokens, temperature 1; each sample trained on once "
        "(asynchronous)\n",
        "- batch: 4 completions per device x 2 accumulation steps x 1 processes; seed 42\n",
    ):
        assert line in procedure, line
    assert "num_iterations" not in procedure and "loss aggregation" not in procedure
    assert "base_model" not in metadata and "datasets" not in metadata
    assert metadata["model_name"] == "my-async-run" and {"trl", "rgpo", "async-grpo"} <= set(metadata["tags"])

    tis = config(tmp_path, output_dir=str(tmp_path / "tis"), off_policy_correction="tis")
    other, _ = trainer_with_worker(str(model_dir), tis, lag=None)
    other.create_model_card()
    procedure = _card(tmp_path / "tis")[0].split("## Training procedure")[1]
    assert "- off-policy correction: `tis` (cap=2), against the sampler's log-probs\n" in procedure
    assert "gate:" not in procedure and "KL to" not in procedure
    assert "- sampler: the in-process rollout worker (free running), dtype `float32`" in procedure
