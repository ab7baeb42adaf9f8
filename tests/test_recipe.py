"""The HH-RLHF recipe: presets, launch configs, offline failure, end-to-end runs of every method."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import trl
import yaml
from _references import paper_rule
from conftest import assets_cache_root

from recipes.hh_rlhf.arguments import HHScriptArguments, make_recipe_parser
from recipes.hh_rlhf.parsing import parse_recipe_args
from recipes.hh_rlhf.prompt_splits import split_validation
from recipes.hh_rlhf.worlds import resolve_tiny_assets

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "hh_rlhf_qwen.py"
CONFIGS = ROOT / "recipes" / "accelerate_configs"


def _load_recipe():
    spec = importlib.util.spec_from_file_location("hh_rlhf_qwen", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


recipe = _load_recipe()


def _run_recipe(argv):
    """The recipe's ``main`` on a command line, as its ``__main__`` runs it."""
    return recipe.main(*parse_recipe_args(argv))


def _parse_paper(tmp_path, *extra):
    # bf16 needs a GPU; --use_cpu lets the paper's config be built (and checked) on this CPU machine
    argv = [
        "--config",
        str(ROOT / "recipes/configs/hh_rlhf_paper.yaml"),
        "--use_cpu",
        "true",
        "--output_dir",
        str(tmp_path),
        *extra,
    ]
    return parse_recipe_args(argv, check_hub=False)


def test_paper_preset_resolves_to_the_papers_hyperparameters(tmp_path):
    script, train, model = _parse_paper(tmp_path)
    assert model.model_name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert script.reward_model_name_or_path == "OpenAssistant/reward-model-deberta-v3-large-v2"
    assert script.dataset_name == "Anthropic/hh-rlhf" and script.dataset_data_dir == "helpful-base"
    assert (
        script.dataset_train_split == "train" and script.dataset_test_split == "test" and script.world == "hh"
    )
    assert train.output_dir == str(tmp_path)
    assert train.per_device_train_batch_size // train.num_generations == 4  # 4 prompts
    assert train.num_generations == 4  # K = 4 completions per prompt
    assert train.gradient_accumulation_steps == 1
    assert train.learning_rate == 1e-6
    assert script.max_prompt_length == 256 and train.max_completion_length == 256
    assert script.num_rl_iterations == 400
    assert (script.window_start, script.window_end) == (300, 400)
    assert train.beta == 0.05  # beta_ref
    assert train.gate == "sigmoid" and train.make_gate().k == 5.0 and train.ratio_mode == "dual"
    assert (train.kl_coef, train.kl_target, train.kl_coef_min, train.kl_coef_max) == (0.5, 0.02, 0.01, 5.0)
    assert train.bf16 is True and model.dtype == "bfloat16"
    assert train.num_iterations == 2
    assert type(train).__name__ == "RGPOConfig"


@pytest.mark.parametrize(
    "method,loss_type,beta,config",
    [
        # TRL's GRPOConfig with the in-process sampler's fields (off by default)
        ("grpo", "grpo", 0.0, "GRPOSamplerConfig"),
        ("ppo_clip_kl", "dapo", 0.05, "GRPOSamplerConfig"),
        ("sapo", "sapo", 0.05, "GRPOSamplerConfig"),
        ("rgpo", "dapo", 0.05, "RGPOConfig"),
    ],
)
def test_methods_share_everything_but_the_loss(tmp_path, method, loss_type, beta, config):
    _, train, _ = _parse_paper(tmp_path, "--method", method)
    _, rgpo, _ = _parse_paper(tmp_path)
    assert type(train).__name__ == config
    assert train.loss_type == loss_type and train.beta == beta
    for name in (
        "learning_rate",
        "per_device_train_batch_size",
        "num_generations",
        "max_completion_length",
        "num_iterations",
        "temperature",
        "bf16",
        "seed",
    ):
        assert getattr(train, name) == getattr(rgpo, name), name


def test_cli_and_yaml_override_the_preset(tmp_path):
    cfg = tmp_path / "cfg.yaml"  # a user's config: the paper preset with two changes
    preset = yaml.safe_load((ROOT / "recipes" / "configs" / "hh_rlhf_paper.yaml").read_text())
    cfg.write_text(yaml.safe_dump({**preset, "learning_rate": 5e-7, "gate_params": {"k": 3.0}}))
    argv = [
        "--config",
        str(cfg),
        "--gate_params",
        '{"k": 4}',
        "--use_cpu",
        "true",
        "--output_dir",
        str(tmp_path),
    ]
    script, train, _ = parse_recipe_args(argv, check_hub=False)
    assert script.world == "hh" and train.learning_rate == 5e-7 and train.make_gate().k == 4.0
    assert train.max_completion_length == 256  # the rest of the preset is kept


@pytest.mark.parametrize(
    "bad",
    [["--method", "trpo"], ["--config", "recipes/configs/hh_rlhf_huge.yaml"], ["--world", "mars"]],
    ids=["method", "config", "world"],
)
def test_bad_preset_or_method_is_refused(tmp_path, bad):
    with pytest.raises(
        ValueError, match="method must|config file .* not found.*paper, tiny, tiny_paper|world must"
    ):
        parse_recipe_args(bad + ["--output_dir", str(tmp_path)], check_hub=False)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_launch_configs_load(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    raw = yaml.safe_load(path.read_text())
    assert config.distributed_type.value == raw["distributed_type"]
    assert config.num_processes == raw["num_processes"]
    if "zero" in path.name:
        assert config.deepspeed_config["zero_stage"] == int(path.stem[-1])


def test_expected_launch_configs_exist():
    names = {p.name for p in CONFIGS.glob("*.yaml")}
    assert {"single_gpu.yaml", "multi_gpu.yaml", "deepspeed_zero2.yaml", "deepspeed_zero3.yaml"} <= names


def test_hub_id_offline_fails_before_training_with_actionable_message(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [
            sys.executable,
            str(RECIPE),
            "--config",
            str(ROOT / "recipes/configs/hh_rlhf_paper.yaml"),
            "--output_dir",
            str(tmp_path / "out"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert (
        "Qwen/Qwen2.5-1.5B-Instruct" in proc.stderr
        and "--config recipes/configs/hh_rlhf_tiny.yaml" in proc.stderr
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--config", "/nonexistent.yaml"], "config file '/nonexistent.yaml' not found"),
        (["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--trainer", "later"], "trainer must be"),
        (["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--world", "mars"], "world must be one of"),
    ],
    ids=["config", "trainer", "world"],
)
def test_bad_preset_trainer_or_world_is_refused_before_the_trainers_load(flags, needle):
    """The recipe parses before it imports its trainers (as TRL's grpo.py imports its own in main), and reads
    the preset, method, trainer and world before the trainer configs: these errors come before transformers'
    Trainer, TRL's trainers and rgpo_trl's are imported (``-X importtime`` lists every module imported)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(RECIPE), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]
    assert "recipes.hh_rlhf.parsing" in imported  # the listing works
    loaded = imported & {
        "transformers.trainer",
        "trl.trainer.grpo_trainer",
        "rgpo_trl.trainer",
        "recipes.hh_rlhf.methods",
        "rgpo_trl.monitors.reference_kl",
        "recipes.hh_rlhf.metrics_log",
    }
    assert not loaded, loaded


def test_the_script_imports_the_recipes_package_from_anywhere(tmp_path):
    """Run as a script, where Python puts recipes/ first on sys.path, from another directory and without
    PYTHONPATH (pytest's `pythonpath` does not reach a subprocess), the recipe imports the `recipes` package
    of its checkout (recipes are not installed), and no sub-package of recipes/ under a second, top-level
    name."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    config = str(ROOT / "recipes" / "configs" / "hh_rlhf_tiny.yaml")
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(RECIPE), "--config", config, "--world", "mars"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "world must be one of" in errors[0]
    assert {"recipes", "recipes.hh_rlhf.parsing", "recipes.hh_common.hub_access"} <= imported
    assert not imported & {"hh_rlhf", "hh_common", "tiny_hh", "hh_rlhf.parsing"}


def _tiny_argv(assets, out, method, iterations=2, extra=()):
    """The tiny preset on exactly the fixture's assets (same cache root, quick variant)."""
    return [
        "--config",
        str(ROOT / "recipes/configs/hh_rlhf_tiny.yaml"),
        "--tiny_quick",
        "--cache_dir",
        str(assets_cache_root(assets)),
        "--method",
        method,
        "--output_dir",
        str(out),
        "--num_rl_iterations",
        str(iterations),
        "--max_completion_length",
        "8",
        "--disable_tqdm",
        "true",
        "--save_strategy",
        "no",
        "--heldout_prompts",
        "8",
        *extra,
    ]


@pytest.mark.parametrize("method", ["rgpo", "rgpo_old", "ppo", "grpo", "ppo_clip_kl", "sapo"])
def test_tiny_end_to_end_run_of_each_method(tmp_path, quick_assets, method, capsys):
    summary = _run_recipe(_tiny_argv(quick_assets, tmp_path, method, extra=("--table_every", "1")))
    console = capsys.readouterr().out
    assert (
        "'loss'" not in console and "{'" not in console
    )  # no per-step metric dicts: the compact table instead
    assert re.search(r"iteration +reward +kl_ref", console) and "window 1-2" in console
    card = (tmp_path / "README.md").read_text()  # the model card, written offline
    if method.startswith("rgpo"):
        assert "- rgpo" in card and "sun2025rgpo" in card
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["iteration"] for r in rows] == [1, 1, 2, 2]
    generation_rows = rows[::2]
    for r in generation_rows:
        assert isinstance(r["reward"], float) and isinstance(r["rewards/gold/mean"], float)
        assert r["kl_ref/monitor"] >= 0  # logged for every method, GRPO included
    assert generation_rows[0]["kl_ref/monitor"] == pytest.approx(0.0, abs=1e-6)  # pi_old == ref at start
    assert (tmp_path / "metrics.csv").exists() and summary["method"] == method
    assert summary["window"] == [1, 2] and summary["world_size"] == 1
    if method.startswith("rgpo"):
        assert "rgpo/kl_old_iteration" in rows[1] and "rgpo/gate_mean" in rows[0]
    else:
        assert not any(k.startswith("rgpo/") for r in rows for k in r)
    heldout = json.loads((tmp_path / "heldout.json").read_text())  # the same end-of-run evaluation for all
    assert heldout["prompts"] == 8 and heldout["kl_ref"] >= 0 and {"reward", "gold"} <= set(heldout)
    if method == "ppo":  # PPO-RLHF with its value model
        assert "ppo/value_loss" in rows[0] and "ppo/score" in rows[0] and "value_loss" in summary
    if method == "grpo":  # GRPO is trained without a reference penalty: TRL logs no "kl"
        assert not any("kl" in r for r in rows)


def test_grpo_monitor_keeps_the_loss_reference_free(tmp_path, quick_assets, monkeypatch):
    """The reference model exists only for the KL_ref metric: GRPO's loss keeps beta = 0."""
    import recipes.hh_rlhf.trainers as trainers

    seen = {}
    original = trainers.GRPOMonitoredTrainer.train

    def train(self, *a, **k):
        seen.update(beta=self.beta, args_beta=self.args.beta, has_ref=self.ref_model is not None)
        return original(self, *a, **k)

    # monkeypatch removes the class attribute afterwards (the method is inherited): assigning the inherited
    # function back would shadow Trainer.train for every later test
    monkeypatch.setattr(trainers.GRPOMonitoredTrainer, "train", train)
    _run_recipe(_tiny_argv(quick_assets, tmp_path, "grpo", iterations=1))
    assert seen == {"beta": 0.0, "args_beta": 0.0, "has_ref": True}


def _launch_two_processes(
    config: str, out: Path, quick_assets, method: str = "rgpo", iterations: int = 3
) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / config),
        "--num_processes",
        "2",
        str(RECIPE),
        *_tiny_argv(quick_assets, out, method, iterations=iterations),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rgpo", "ppo"])
@pytest.mark.parametrize(
    "config", ["cpu_ddp_2proc.yaml", "cpu_deepspeed_zero2.yaml", "cpu_deepspeed_zero3.yaml"]
)
def test_two_process_runs_on_cpu(tmp_path, quick_assets, config, method):
    """Two ranks train one model: RGPO's KL coefficient follows the paper's rule (written out here) from the
    logged KL, gathered over both ranks (a controller fed one rank's KL drifts from it); PPO-RLHF's value
    model trains; the held-out evaluation, single-process only, is skipped, not written half."""
    summary = _launch_two_processes(config, tmp_path, quick_assets, method)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary["world_size"] == 2 and sorted({r["iteration"] for r in rows}) == [1, 2, 3]
    assert not (tmp_path / "heldout.json").exists()
    if method == "rgpo":
        coef = {r["iteration"]: r["rgpo/kl_coef"] for r in rows if "rgpo/kl_coef" in r}
        kl = {r["iteration"]: r["rgpo/kl_old_iteration"] for r in rows if "rgpo/kl_old_iteration" in r}
        assert sorted(coef) == [1, 2, 3] and sorted(kl) == [1, 2, 3]
        assert [coef[i + 1] for i in (1, 2)] == pytest.approx([paper_rule(coef[i], kl[i]) for i in (1, 2)])
    else:  # PPO-RLHF: a value loss every optimizer step, and the value model moves between iterations
        losses = [r["ppo/value_loss"] for r in rows if "ppo/value_loss" in r]
        assert len(losses) == len(rows) and all(math.isfinite(v) and v > 0 for v in losses)
        assert len(set(losses)) > 1 and math.isfinite(summary["score"])


def test_dpo_baseline_trains_on_the_pairs_and_is_evaluated_like_the_online_methods(tmp_path, quick_assets):
    """DPO from the same initial policy on the tiny world's chosen/rejected pairs, for as many optimizer steps
    as an online run; its reward, gold and KL_ref come from the shared evaluation code."""
    summary = _run_recipe(_tiny_argv(quick_assets, tmp_path, "dpo", iterations=2))
    assert summary["method"] == "dpo" and summary["prompts"] == 8 and summary["pairs"] > 100
    assert summary["kl_ref"] > 0 and {"reward", "gold"} <= set(summary)  # the policy moved from the reference
    heldout = json.loads((tmp_path / "heldout.json").read_text())
    assert heldout["prompts"] == 8 and heldout["kl_ref"] > 0
    assert summary["optimizer_steps"] == 4  # 2 iterations x num_iterations 2, as an online run of the preset
    assert summary["unused_settings"]["num_generations"] == "4"  # listed, not silently dropped


def test_sft_baseline_is_the_initial_policy_through_the_same_evaluation(tmp_path, quick_assets):
    """``sft`` trains nothing: the initial policy is evaluated with the shared code (its own reference, so
    KL_ref is exactly 0), and with the same sampling seed it draws the same completions as the evaluation
    code called directly on the initial policy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recipes.hh_common.hh_data import load_hh_helpful_prompts
    from recipes.hh_common.rewards import load_pairwise_reward
    from recipes.hh_rlhf.evaluation import evaluate_policy
    from recipes.tiny_hh import gold_reward_func_v3

    summary = _run_recipe(
        _tiny_argv(quick_assets, tmp_path, "sft", iterations=2, extra=("--train_eval_prompts", "6"))
    )
    assert summary["method"] == "sft" and summary["optimizer_steps"] == 0 and summary["kl_ref"] == 0.0
    assert summary["prompts"] == 6  # training prompts: --train_eval_prompts; held out: --heldout_prompts (8)
    tok = AutoTokenizer.from_pretrained(quick_assets.policy_dir, padding_side="left")
    prompts, _ = load_hh_helpful_prompts(str(quick_assets.train_file), "train", tok, 128, max_rows=32)
    direct = evaluate_policy(
        AutoModelForCausalLM.from_pretrained(quick_assets.policy_dir),
        tok,
        [p["prompt"] for p in prompts.select(range(6))],
        load_pairwise_reward(str(quick_assets.reward_model_dir)),
        gold_fn=gold_reward_func_v3,
        max_new_tokens=8,
        temperature=1.0,
        seed=summary["seed"],
    )
    assert (summary["reward"], summary["gold"]) == pytest.approx((direct["reward"], direct["gold"]))
    heldout = json.loads((tmp_path / "heldout.json").read_text())
    assert heldout["kl_ref"] == 0.0 and heldout["prompts"] == 8


def test_presets_have_their_own_world_and_default_output_directory():
    """`world` is a field of the YAML, not the file name; the default output directory is per preset file, so
    the tiny and tiny_paper presets no longer share one."""
    seen = {}
    for name, world in (("tiny", "tiny"), ("tiny_paper", "tiny"), ("paper", "hh")):
        config = str(ROOT / "recipes" / "configs" / f"hh_rlhf_{name}.yaml")
        script, train, _ = parse_recipe_args(
            ["--config", config, "--use_cpu", "true", "--bf16", "false"], check_hub=False
        )
        assert script.world == world and train.output_dir == f"runs/hh_rlhf_qwen/{name}-rgpo"
        seen[name] = train.output_dir
    assert len(set(seen.values())) == 3


def test_help_documents_every_recipe_option_before_trls_own():
    """Every field of the recipe's own arguments has a help text, is listed in --help before TRL's training
    arguments, and shows that help (a field added without one, or lost from the parser, fails)."""
    import dataclasses

    from trl import ScriptArguments

    from rgpo_trl import RGPOConfig

    text = make_recipe_parser(RGPOConfig).format_help()
    head = " ".join(text[: text.index("--output_dir")].split())
    trl_fields = {f.name for f in dataclasses.fields(ScriptArguments)}
    assert "RGPO (and the paper's baselines) on Anthropic HH-RLHF" in text[:600]
    own = [f for f in dataclasses.fields(HHScriptArguments) if f.init and f.name not in trl_fields]
    assert len(own) > 10
    for f in own:
        help_text = f.metadata.get("help", "")
        assert help_text.strip(), f"{f.name} has no help text"
        assert f"--{f.name}" in head, f.name
        assert " ".join(help_text.split())[:40] in head, f.name


def test_push_to_hub_is_refused_offline_before_anything_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = str(ROOT / "recipes" / "configs" / "hh_rlhf_tiny.yaml")
    with pytest.raises(
        ValueError, match=r"push_to_hub=True but the Hugging Face Hub is offline .* drop --push_to_hub"
    ):
        parse_recipe_args(
            ["--config", config, "--push_to_hub", "true", "--output_dir", str(tmp_path)], check_hub=False
        )
    assert not any(tmp_path.iterdir())


def test_v3_validation_prompts_come_from_their_own_split(tmp_path, quick_assets):
    """World v3: `validation_dataset_name: tiny-hh/validation` takes the validation prompts from the
    validation file (no training prompt shares their question), the rest of training untouched; the gold
    logged is v3's."""
    from transformers import AutoTokenizer

    from recipes.hh_common.hh_data import load_hh_helpful_prompts
    from recipes.tiny_hh import gold_for, gold_score_v3

    argv = _tiny_argv(quick_assets, tmp_path, "rgpo") + [
        "--validation_dataset_name",
        "tiny-hh/validation",
        "--validation_prompts",
        "16",
    ]
    script, _, model = parse_recipe_args(argv, check_hub=False)
    resolve_tiny_assets(script, model)
    assert script.tiny_version == 3 and script.validation_dataset_name == str(quick_assets.validation_file)
    tok = AutoTokenizer.from_pretrained(model.model_name_or_path)
    train, _ = load_hh_helpful_prompts(str(quick_assets.train_file), "train", tok, 128)
    kept, validation = split_validation(train, script, tok)
    expected, _ = load_hh_helpful_prompts(str(quick_assets.validation_file), "train", tok, 128)
    assert validation == list(expected.select(range(16))["prompt"]) and len(kept) == len(train)
    assert gold_for(3)[0] is gold_score_v3
    script.validation_prompts = 10_000
    with pytest.raises(ValueError, match="validation_prompts=10000"):
        split_validation(train, script, tok)


def test_v2_preset_keeps_world_v2_and_v3_preset_names_its_splits():
    """The v2 protocol's preset pins world v2 (its committed results stay reproducible); the v3 preset names
    the validation split; a preset without the key gets the default, v3."""
    default = HHScriptArguments.__dataclass_fields__["tiny_version"].default
    assert default == 3
    for name, version, validation in (
        ("tiny_paper", 2, None),
        ("tiny_paper_v3", 3, "tiny-hh/validation"),
        ("tiny", 3, None),
    ):
        preset = yaml.safe_load((ROOT / "recipes" / "configs" / f"hh_rlhf_{name}.yaml").read_text())
        assert preset.get("tiny_version", default) == version
        assert preset.get("validation_dataset_name") == validation


@pytest.mark.parametrize("method", ["rgpo", "rgpo_old", "grpo"])
def test_tiny_async_run_shows_staleness_and_for_rgpo_the_gate(tmp_path, quick_assets, method):
    """--trainer async on CPU: TRL's asynchronous trainer with the in-process worker at a controlled lag of 2;
    the metrics show samples 2 versions old and, for RGPO, the gate's statistics by staleness and the
    controller."""
    argv = _tiny_argv(
        quick_assets,
        tmp_path,
        method,
        iterations=5,
        extra=("--trainer", "async", "--max_staleness", "4", "--rollout_lag", "2"),
    )
    summary = _run_recipe(argv)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and [r["iteration"] for r in rows] == [1, 2, 3, 4, 5]
    assert max(r.get("sample/staleness_max", 0) for r in rows) >= 1  # TRL's count, when a sample is taken
    if method.startswith("rgpo"):  # per trained token, at the gradient: exactly min(step - 1, 2)
        assert [r["staleness/mean"] for r in rows] == [0, 1, 2, 2, 2]
        assert all("rgpo/rejected_frac_staleness2plus" in r and "rgpo/kl_coef" in r for r in rows)
        assert rows[0]["rgpo/ratio_old_max"] == pytest.approx(1.0, abs=1e-4)
        assert (
            "rgpo/kl_ref" in rows[0]
        )  # beta_ref = 0.05 in both: the frozen reference runs on the packed rows
    heldout = json.loads((tmp_path / "heldout.json").read_text())  # evaluated by a plain copy of the policy
    assert heldout["prompts"] == 8 and heldout["kl_ref"] >= 0 and summary["method"] == method


@pytest.mark.parametrize(
    "flags, needle",
    [
        (
            ["--method", "ppo"],
            "'rgpo_mu', 'rgpo_gate'] with trainer='async', got 'ppo'",
        ),
        (["--rollout_lag", "9"], "rollout_lag must be in [1, max_staleness = 4], got 9"),
        (
            ["--attn_implementation", "eager"],
            "attn_implementation='eager' cannot be used with --trainer async",
        ),
        (["--bogus", "3"], "--bogus: not a field of the recipe or of AsyncRGPOConfig"),
        (["--epsilon", "0.3"], "epsilon=0.3 is not supported by AsyncRGPOTrainer"),
    ],
)
def test_async_bad_input_is_refused_by_name(tmp_path, flags, needle):
    with pytest.raises((ValueError, SystemExit)) as info:
        parse_recipe_args(
            [
                "--config",
                str(ROOT / "recipes/configs/hh_rlhf_tiny.yaml"),
                "--trainer",
                "async",
                "--output_dir",
                str(tmp_path),
                *flags,
            ],
            check_hub=False,
        )
    assert needle in str(info.value)


def test_cispo_is_trls_cispo_loss_with_the_shared_reference_penalty(tmp_path):
    script_args, training_args, _ = parse_recipe_args(
        [
            "--config",
            str(ROOT / "recipes/configs/hh_rlhf_tiny.yaml"),
            "--method",
            "cispo",
            "--output_dir",
            str(tmp_path),
        ],
        check_hub=False,
    )
    assert type(training_args).__name__ == "GRPOSamplerConfig" and training_args.loss_type == "cispo"
    assert isinstance(training_args, trl.GRPOConfig) and not training_args.use_in_process_sampler
    assert training_args.epsilon_high == 5.0 and training_args.beta == 0.05
