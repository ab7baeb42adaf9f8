"""What the recipe's ``main`` hands each method's trainer, now that it builds them in plain view
(recipes/hh_rlhf_qwen.py): the trainer class, its config and the method's settings in it, the training data,
the reward functions, the recipe's callbacks and the asynchronous rollout worker. The expectations are written
from what the docs say each method is, not read back from the registry. Training stops at ``train()``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import transformers
import yaml
from accelerate import PartialState
from conftest import assets_cache_root
from trl import DPOConfig, DPOTrainer, GRPOTrainer

from recipes.hh_rlhf.parsing import parse_recipe_args
from recipes.hh_rlhf.prompt_splits import training_pairs, training_prompts
from recipes.hh_rlhf.worlds import resolve_tiny_assets
from rgpo_trl.monitors import BehaviourRatioMonitor, ReferenceKLMonitor
from rgpo_trl.trainer import (
    GRPOSamplerConfig,
    PPORLHFConfig,
    PPORLHFTrainer,
    RGPOConfig,
    RGPOTrainer,
)
from rgpo_trl.trainer.sync_sampler import MismatchedSamplerMixin

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "configs" / "hh_rlhf_tiny.yaml"
ITERATIONS = 2
RGPO = {"gate": "sigmoid", "gate_params": {"k": 5.0}, "beta": 0.05}
RGPO_OLD = {**RGPO, "loss_type": "dapo", "ratio_mode": "old"}
BOTH_MONITORS = (BehaviourRatioMonitor, ReferenceKLMonitor)

# (trainer, method) -> (the trainer's bases, or its class; its config class; the method's settings). From the
# recipe's docs: rgpo gates max(r_old, r_ref), rgpo_old r_old; grpo is TRL's clipped loss without reference;
# ppo is PPO-RLHF; ppo_clip_kl, sapo, cispo are TRL's losses with beta_ref 0.05; dpo is TRL's DPOTrainer.
# TRL's GRPOTrainer methods carry the in-process sampler's mixin and take its config (the sampler off by
# default).
SYNC = {
    "rgpo": ((*BOTH_MONITORS, RGPOTrainer), RGPOConfig, {**RGPO, "loss_type": "dapo", "ratio_mode": "dual"}),
    "rgpo_old": (
        (*BOTH_MONITORS, RGPOTrainer),
        RGPOConfig,
        {**RGPO, "loss_type": "dapo", "ratio_mode": "old"},
    ),
    "ppo": ((ReferenceKLMonitor, PPORLHFTrainer), PPORLHFConfig, {"beta": 0.05, "epsilon": 0.2}),
    "grpo": (
        (*BOTH_MONITORS, MismatchedSamplerMixin, GRPOTrainer),
        GRPOSamplerConfig,
        {"loss_type": "grpo", "beta": 0.0, "epsilon": 0.2},
    ),
    "ppo_clip_kl": (
        (*BOTH_MONITORS, MismatchedSamplerMixin, GRPOTrainer),
        GRPOSamplerConfig,
        {"loss_type": "dapo", "beta": 0.05, "epsilon": 0.2, "use_bias_correction_kl": False},
    ),
    "sapo": (
        (*BOTH_MONITORS, MismatchedSamplerMixin, GRPOTrainer),
        GRPOSamplerConfig,
        {"loss_type": "sapo", "beta": 0.05},
    ),
    "cispo": (
        (*BOTH_MONITORS, MismatchedSamplerMixin, GRPOTrainer),
        GRPOSamplerConfig,
        {"loss_type": "cispo", "epsilon_high": 5.0, "beta": 0.05, "use_bias_correction_kl": False},
    ),
    "dpo": (DPOTrainer, DPOConfig, {"beta": 0.1}),
}
# --trainer async: AsyncRGPOTrainer for RGPO and the sampler-mismatch study's corrections (no reference but
# rgpo's), TRL's AsyncGRPOTrainer for grpo
ASYNC = {
    "rgpo": ("AsyncRGPOTrainer", {**RGPO, "ratio_mode": "dual", "off_policy_correction": "rgpo"}),
    "rgpo_old": ("AsyncRGPOTrainer", {**RGPO, "ratio_mode": "old"}),
    "grpo": ("AsyncGRPOTrainer", {"epsilon": 0.2}),
    **{
        name: ("AsyncRGPOTrainer", {"off_policy_correction": name, "beta": 0.0})
        for name in ("ignore", "ppo_clip", "tis", "icepop", "seq_mask")
    },
    "rgpo_mu": ("AsyncRGPOTrainer", {**RGPO, "beta": 0.0, "ratio_mode": "old", "kl_controller": "adaptive"}),
    "rgpo_gate": (
        "AsyncRGPOTrainer",
        {**RGPO, "beta": 0.0, "ratio_mode": "old", "kl_controller": "fixed", "kl_coef": 0.0},
    ),
}
# one method per trainer in the default run, the rest with the slow tests
QUICK = {
    ("sync", "rgpo"),
    ("sync", "ppo"),
    ("sync", "grpo"),
    ("sync", "dpo"),
    ("async", "rgpo"),
    ("async", "grpo"),
}
CASES = [
    pytest.param(trainer, method, marks=() if (trainer, method) in QUICK else pytest.mark.slow)
    for trainer, methods in (("sync", SYNC), ("async", ASYNC))
    for method in methods
]


class _Stop(Exception):
    pass


def _name(func) -> str:
    return getattr(func, "__name__", type(func).__name__)


def _load_recipe():
    spec = importlib.util.spec_from_file_location("hh_rlhf_qwen", ROOT / "recipes" / "hh_rlhf_qwen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _argv(assets, out, trainer, method, *extra):
    argv = ["--config", str(TINY), "--tiny_quick", "--cache_dir", str(assets_cache_root(assets))]
    argv += ["--trainer", trainer, "--method", method, "--output_dir", str(out), "--disable_tqdm", "true"]
    argv += ["--num_rl_iterations", str(ITERATIONS), "--max_completion_length", "8", "--save_strategy", "no"]
    return argv + (["--rollout_lag", "1"] if trainer == "async" else []) + list(extra)


def _built_trainer(monkeypatch, argv):
    """The trainer ``main`` builds for ``argv``, caught as its ``train()`` is called."""
    seen = {}

    def train(self, *args, **kwargs):
        seen["trainer"] = self
        raise _Stop

    monkeypatch.setattr(transformers.Trainer, "train", train)
    with pytest.raises(_Stop):
        _load_recipe().main(*parse_recipe_args(argv))
    return seen["trainer"]


@pytest.mark.parametrize("trainer_kind,method", CASES)
def test_each_method_gets_its_trainer_config_data_rewards_and_callbacks(
    trainer_kind, method, quick_assets, tmp_path, monkeypatch, one_torch_thread
):
    argv = _argv(quick_assets, tmp_path, trainer_kind, method)
    trainer = _built_trainer(monkeypatch, argv)
    preset = yaml.safe_load(TINY.read_text())
    args = trainer.args

    if trainer_kind == "sync":
        classes, config_class, settings = SYNC[method]
        if isinstance(classes, tuple):  # the recipe's monitored trainer: the monitors first, then the trainer
            assert type(trainer).__bases__ == classes
        else:
            assert type(trainer) is classes
        assert type(args) is config_class
    else:
        class_name, settings = ASYNC[method]
        assert type(trainer).__name__ == class_name
        assert type(args).__name__ == class_name.replace("Trainer", "Config")
    for key, value in settings.items():
        assert getattr(args, key) == value, key

    # the preset and the command line under the method's settings; as many optimizer steps as the runs take
    # (synchronous and DPO: each generation batch trained on num_iterations times; async: one a step)
    assert args.learning_rate == preset["learning_rate"] and args.output_dir == str(tmp_path)
    steps_per_iteration = 1 if trainer_kind == "async" else preset["num_iterations"]
    assert args.max_steps == ITERATIONS * steps_per_iteration
    assert not hasattr(trainer.model, "peft_config")  # no --use_peft: the plain policy

    script, _, model_args = parse_recipe_args(argv)
    resolve_tiny_assets(script, model_args)  # as main does: tiny-hh/<asset> -> the cached files
    recipe_callbacks = [
        c for c in trainer.callback_handler.callbacks if type(c).__module__.startswith("recipes")
    ]
    if method == "dpo":  # offline: its data are the preference pairs, its evaluation at the end
        validation = training_prompts(script, trainer.processing_class, PartialState(), log=False)[1]
        pairs = training_pairs(script, trainer.processing_class, PartialState(), validation)
        assert trainer.train_dataset["prompt"] == pairs["prompt"] and recipe_callbacks == []
        return
    assert args.num_generations == preset["num_generations"] and args.max_completion_length == 8
    assert [type(c).__name__ for c in recipe_callbacks] == ["IterationMetricsWriter"]
    writer = recipe_callbacks[0]
    assert writer.steps_per_iteration == steps_per_iteration and writer.method.name == method
    assert writer.path == str(tmp_path / "metrics.jsonl")
    prompts, _ = training_prompts(script, trainer.processing_class, PartialState(), log=False)
    if trainer_kind == "sync":  # the tiny world trains on the reward model and logs its gold score (weight 0)
        assert trainer.train_dataset["prompt"] == prompts["prompt"]
        assert [_name(f) for f in trainer.reward_funcs] == ["reward_model", "gold"]
        assert list(args.reward_weights) == [1.0, 0.0]
    else:  # the in-process worker generates and scores the same prompts, lagging by --rollout_lag
        worker = trainer.rollout_worker
        assert type(worker).__name__ == "InProcessRolloutWorker" and worker.lag == 1
        assert worker.prompts["prompt"] == prompts["prompt"] and list(worker.reward_weights) == [1.0, 0.0]
        assert [_name(f) for f in worker.reward_funcs] == ["reward_model", "gold"]


def test_peft_settings_reach_the_trainer(quick_assets, tmp_path, monkeypatch, one_torch_thread):
    """``--use_peft`` gives the policy a LoRA adapter, as get_peft_config(model_args) builds it."""
    argv = _argv(quick_assets, tmp_path, "sync", "rgpo", "--use_peft", "true", "--lora_r", "4")
    trainer = _built_trainer(monkeypatch, argv)
    assert type(trainer).__bases__ == (*BOTH_MONITORS, RGPOTrainer)
    assert trainer.model.peft_config["default"].r == 4
