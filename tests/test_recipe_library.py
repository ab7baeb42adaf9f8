"""The HH-RLHF recipe's library pieces (recipes.hh_rlhf: arguments, parsing, worlds, prompt_splits,
recipe_evaluation, runtime), without training: what they decide from the arguments."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest
from datasets import Dataset

from recipes.hh_rlhf.arguments import (
    HHScriptArguments,
    PresetGeneration,
    make_recipe_parser,
    model_config_without,
)
from recipes.hh_rlhf.parsing import (
    EarlySettings,
    check_hub_ids,
    config_name,
    parse_recipe_args,
    preset_generation,
    read_early_settings,
)
from recipes.hh_rlhf.prompt_splits import split_validation
from recipes.hh_rlhf.recipe_evaluation import RunEvaluation, sampling_settings, summary_window
from recipes.hh_rlhf.runtime import init_distributed_for_cpu_deepspeed, model_init_kwargs, verbose_console
from recipes.hh_rlhf.worlds import (
    WORLDS,
    gold_function,
    resolve_tiny_assets,
    training_rewards,
    unknown_tiny_asset,
)
from recipes.tiny_hh import gold_reward_func, gold_reward_func_v3
from rgpo_trl.cli import UsageError

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "recipes" / "configs" / "hh_rlhf_tiny.yaml")


def _script(**kw):
    return SimpleNamespace(**{**vars(HHScriptArguments()), **kw})


def test_config_name_is_the_preset_and_a_missing_file_lists_the_presets(tmp_path):
    assert config_name([]) == "default"
    assert config_name(["--config", TINY]) == "tiny"
    with pytest.raises(ValueError, match=r"config file 'nope.yaml' not found.*for <name> in .*tiny_paper"):
        config_name(["--config", "nope.yaml"])


def test_parse_errors_are_usage_errors_and_method_defaults_sit_under_the_yaml(tmp_path):
    with pytest.raises(UsageError, match="heldout_samples must be >= 1, got 0"):
        parse_recipe_args(["--config", TINY, "--heldout_samples", "0"], check_hub=False)
    script, train, model = parse_recipe_args(["--config", TINY, "--method", "grpo"], check_hub=False)
    assert script.method == "grpo" and train.beta == 0.0 and train.loss_type == "grpo"  # the method's
    assert train.learning_rate == 1e-4 and script.world == "tiny"  # the YAML's
    assert model.model_name_or_path == "tiny-hh/policy"  # resolved later, by main
    assert script.unused_preset_settings == {} and train.output_dir == "runs/hh_rlhf_qwen/tiny-grpo"


def test_an_offline_method_lists_the_preset_settings_it_does_not_read():
    script, train, _ = parse_recipe_args(["--config", TINY, "--method", "dpo"], check_hub=False)
    assert type(train).__name__ == "DPOConfig"
    assert script.unused_preset_settings["num_generations"] == "4"


def test_hub_check_skips_tiny_assets_and_data_files():
    check_hub_ids(  # nothing here names a hub id: no network, no error
        EarlySettings(
            method="rgpo",
            trainer="sync",
            world="tiny",
            model_name_or_path="tiny-hh/policy",
            reward_model_name_or_path="tiny-hh/reward_model",
            dataset_name="data/train.jsonl",
        )
    )


def test_parser_help_starts_with_the_description_and_async_has_one_dtype():
    from rgpo_trl import RGPOConfig

    text = make_recipe_parser(RGPOConfig).format_help()
    assert text.index("RGPO (and the paper's baselines)") < text.index("--world") < text.index("--output_dir")
    reduced = model_config_without({"dtype"})
    names = set(reduced.__dataclass_fields__)
    assert "dtype" not in names and "model_name_or_path" in names


def test_unknown_tiny_asset_and_v2_validation_are_refused():
    model = SimpleNamespace(model_name_or_path="tiny-hh/policy")
    unknown_tiny_asset(_script(dataset_name="tiny-hh/train"), model)
    with pytest.raises(ValueError, match=r"dataset_name='tiny-hh/trian': tiny-hh assets are"):
        unknown_tiny_asset(_script(dataset_name="tiny-hh/trian"), model)
    with pytest.raises(ValueError, match="tiny-hh/validation exists in world v3 only"):
        unknown_tiny_asset(_script(tiny_version=2, validation_dataset_name="tiny-hh/validation"), model)


def test_resolve_is_a_no_op_without_tiny_paths():
    script, model = _script(), SimpleNamespace(model_name_or_path="Qwen/Qwen2.5-1.5B-Instruct")
    before = (dict(vars(script)), dict(vars(model)))
    resolve_tiny_assets(script, model)  # would build assets (minutes) if it named one
    assert (vars(script), vars(model)) == before


def test_training_rewards_add_the_worlds_gold_with_weight_zero():
    assert set(WORLDS) == {"hh", "tiny"}
    rm = object()
    assert training_rewards(_script(world="hh"), rm) == ([rm], [1.0]) and gold_function(_script()) is None
    funcs, weights = training_rewards(_script(world="tiny", tiny_version=3), rm)
    assert funcs == [rm, gold_reward_func_v3] and weights == [1.0, 0.0]
    assert gold_function(_script(world="tiny", tiny_version=2)) is gold_reward_func


def test_split_validation_holds_the_last_prompts_out():
    prompts = [[{"role": "user", "content": f"q{i % 5}"}] for i in range(10)]
    train, validation = split_validation(
        Dataset.from_dict({"prompt": prompts}), _script(validation_prompts=2), None
    )
    assert validation == prompts[-2:]  # q3, q4: their repeats leave training too
    assert [p[0]["content"] for p in train["prompt"]] == ["q0", "q1", "q2", "q0", "q1", "q2"]


def test_summary_window_and_validation_iterations():
    assert summary_window(_script(window_start=None, window_end=None), 8) == (6, 8)
    assert summary_window(_script(window_start=2, window_end=5), 8) == (2, 5)
    args = SimpleNamespace(output_dir="out", seed=3, max_completion_length=8, temperature=0.7)
    assert sampling_settings(args) == {"max_new_tokens": 8, "temperature": 0.7, "seed": 3}
    off = RunEvaluation(_script(validation_prompts=0), None, None, sampling_settings(args))
    assert off.validation_callback(args, [], None, 2, (2, 8)) is None
    on = RunEvaluation(_script(validation_prompts=1, validation_every=3), None, None, sampling_settings(args))
    callback = on.validation_callback(args, ["p"], None, 2, (2, 8))
    assert callback.iterations == [5, 8] and callback.seed == 3000 and callback.steps_per_iteration == 2


def test_model_init_kwargs_and_console():
    model = SimpleNamespace(model_revision="main", attn_implementation="eager", dtype="float32")
    train = SimpleNamespace(trust_remote_code=False, model_init_kwargs={"dtype": "bfloat16"})
    kwargs = model_init_kwargs(model, train)
    assert kwargs == {
        "revision": "main",
        "trust_remote_code": False,
        "attn_implementation": "eager",
        "dtype": "bfloat16",
    }
    assert "attn_implementation" not in model_init_kwargs(model, train, trainer="async")
    assert verbose_console(SimpleNamespace(log_level="info")) and not verbose_console(
        SimpleNamespace(log_level="passive")
    )


def test_no_distributed_start_outside_a_cpu_deepspeed_launch(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    assert init_distributed_for_cpu_deepspeed() is False


def test_an_offline_methods_preset_generation_is_typed_from_the_leftover_settings():
    settings = preset_generation(
        {"max_completion_length": "24", "temperature": "0.7", "num_generations": "4"}
    )
    assert (settings.max_completion_length, settings.temperature, settings.num_iterations) == (24, 0.7, 2)
    assert preset_generation({}) == PresetGeneration()  # the defaults: 64 tokens, temperature 1, 2 steps


def test_an_offline_methods_bad_generation_setting_is_refused_at_parse_time_naming_the_field():
    """DPO reads three of the preset's generation settings itself; a bad value is a UsageError naming the
    field before anything is built (it was argparse's exit with an internal parser's usage line, after
    loading)."""
    argv = ["--config", TINY, "--method", "dpo", "--temperature", "abc"]
    with pytest.raises(UsageError, match="--temperature: invalid float value: 'abc'"):
        parse_recipe_args(argv, check_hub=False)
    with pytest.raises(ValueError, match="--max_completion_length"):
        preset_generation({"max_completion_length": "long"})


def test_a_missing_config_lists_the_presets_only_where_they_are(tmp_path):
    """In a checkout the message lists the presets; without the presets folder (an installed package) it says
    where they are instead of listing nothing."""
    with pytest.raises(ValueError, match="for <name> in paper, tiny, tiny_paper, tiny_paper_v3"):
        config_name(["--config", "nope.yaml"])
    with pytest.raises(ValueError, match="in a checkout of rgpo-trl$"):
        config_name(["--config", "nope.yaml"], tmp_path / "no-configs")


def test_one_trl_parser_pass_for_every_kind_of_method(monkeypatch):
    """The command line is parsed by one TrlParser, once (the early read of the method and trainer is plain
    argparse), whatever the method's config class: GRPOTrainer family, offline (DPO), asynchronous."""
    from trl import TrlParser

    calls = []
    original = TrlParser.parse_args_and_config

    def counted(self, *args, **kwargs):
        calls.append([t.__name__ for t in self.dataclass_types])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TrlParser, "parse_args_and_config", counted)
    for flags, config in (
        ([], "RGPOConfig"),
        (["--method", "grpo"], "GRPOSamplerConfig"),
        (["--method", "dpo"], "DPOConfig"),
        (["--trainer", "async"], "AsyncRGPOConfig"),
    ):
        calls.clear()
        _, train, _ = parse_recipe_args(["--config", TINY, *flags], check_hub=False)
        assert type(train).__name__ == config and len(calls) == 1 and calls[0][1] == config


def test_early_settings_read_the_yaml_under_the_command_line(tmp_path):
    """The method and trainer that pick the config class are read as TrlParser reads every field: the YAML
    over the defaults, the command line over the YAML; an abbreviated --method is refused."""
    preset = tmp_path / "hh_rlhf_mine.yaml"
    preset.write_text(Path(TINY).read_text() + "\nmethod: grpo\n")
    early = read_early_settings(["--config", str(preset)])
    assert (early.method, early.trainer, early.world) == ("grpo", "sync", "tiny")
    assert read_early_settings(["--config", str(preset), "--method=sapo"]).method == "sapo"
    assert (
        read_early_settings([]).reward_model_name_or_path == "OpenAssistant/reward-model-deberta-v3-large-v2"
    )
    script, train, _ = parse_recipe_args(["--config", str(preset)], check_hub=False)
    assert script.method == "grpo" and type(train).__name__ == "GRPOSamplerConfig"
    assert train.output_dir == "runs/hh_rlhf_qwen/mine-grpo"
    with pytest.raises(
        UsageError, match=re.escape("--metho: options must be given in full (did you mean --method?)")
    ):
        parse_recipe_args(["--config", TINY, "--metho", "grpo"], check_hub=False)
    for flags, needle in (
        (["--trainer", "later"], "trainer must be 'sync' or 'async', got 'later'"),
        (["--world", "mars"], "world must be one of"),
        (["--config"], "--config needs the path of a YAML file"),
        (["--method"], "--method: expected one argument"),
    ):
        with pytest.raises(UsageError, match=re.escape(needle)):
            parse_recipe_args(flags, check_hub=False)
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(UsageError, match="must contain a YAML mapping"):
        parse_recipe_args(["--config", str(bad)], check_hub=False)


PAPER = str(ROOT / "recipes" / "configs" / "hh_rlhf_paper.yaml")
ON_CPU = ["--use_cpu", "true", "--bf16", "false"]  # the paper preset's config built without a GPU


@pytest.fixture
def hub_checks(monkeypatch):
    """The (id, kind) pairs `parse_recipe_args` checks on the hub, recorded instead of checked."""
    checked = []
    monkeypatch.setattr(
        "recipes.hh_rlhf.parsing.ensure_loadable", lambda name, kind: checked.append((name, kind))
    )
    return checked


def test_the_early_settings_are_read_in_either_spelling_and_the_given_hub_ids_checked(tmp_path, hub_checks):
    """TrlParser takes ``--model-name-or-path`` as ``--model_name_or_path``; so does the early read, so the
    hub check sees the paths given, not the preset's hub ids (offline, those were refused)."""
    local = str(tmp_path)
    argv = ["--config", PAPER, "--model-name-or-path", local, "--reward-model-name-or-path", local]
    argv += ["--dataset-name", str(tmp_path / "x.jsonl"), "--method=grpo", *ON_CPU]
    early = read_early_settings(argv)
    assert (early.method, early.model_name_or_path, early.reward_model_name_or_path) == ("grpo", local, local)
    assert early.dataset_name == str(tmp_path / "x.jsonl")
    script, train, model = parse_recipe_args(argv)
    assert hub_checks == [(local, "model"), (local, "model")]  # a .jsonl dataset is a file, not a hub id
    assert (script.method, type(train).__name__, model.model_name_or_path) == (
        "grpo",
        "GRPOSamplerConfig",
        local,
    )
    assert (script.reward_model_name_or_path, script.dataset_name) == (local, str(tmp_path / "x.jsonl"))
    assert read_early_settings(["--config", TINY, "--trainer", "async"]).trainer == "async"


@pytest.mark.parametrize(
    "flags,meant",
    [
        (
            ["--reward_model_name", "OpenAssistant/reward-model-deberta-v3-large-v2"],
            "--reward_model_name_or_path",
        ),
        (["--reward-model-name=x"], "--reward-model-name-or-path"),
        (["--dataset", "Anthropic/hh-rlhf"], "--dataset_name"),
        (["--metho", "dpo"], "--method"),
    ],
)
def test_an_abbreviated_early_setting_is_refused_before_the_hub_check(flags, meant, hub_checks):
    """argparse would expand an abbreviation in the full parse but not in the early read, which then checked
    the preset's hub id (or picked the config class) while the run used the one given: refused, naming the
    option, before the hub check."""
    with pytest.raises(UsageError, match=re.escape(f"options must be given in full (did you mean {meant}")):
        parse_recipe_args(["--config", PAPER, *flags, *ON_CPU])
    assert hub_checks == []


@pytest.mark.parametrize(
    "flags,meant",
    [
        (["--learning_rat", "1e-5"], "--learning_rate"),
        (["--method", "dpo", "--learning_rat", "1e-5"], "--learning_rate"),  # offline: not a leftover setting
        (["--trainer", "async", "--max_stale", "2"], "--max_staleness"),
        (["--use_pef"], "--use_peft"),
    ],
)
def test_any_abbreviated_option_is_refused_naming_the_option(flags, meant):
    with pytest.raises(UsageError, match=re.escape(f"options must be given in full (did you mean {meant}")):
        parse_recipe_args(["--config", TINY, *flags], check_hub=False)


def test_no_option_of_any_methods_parser_abbreviates_an_early_setting():
    """The early read refuses an option that abbreviates one of its six settings without knowing the method's
    parser: right only while no option of any method's parser is such a prefix."""
    from recipes.hh_rlhf.async_methods import ASYNC_METHODS
    from recipes.hh_rlhf.methods import RLHF_METHODS

    parsers = [make_recipe_parser(m.config_class) for m in RLHF_METHODS.values()]
    parsers += [
        make_recipe_parser(m.config_class, model_config_without({"dtype"})) for m in ASYNC_METHODS.values()
    ]
    options = {o for parser in parsers for action in parser._actions for o in action.option_strings}
    early = {f"--{n}" for f in fields(EarlySettings) for n in (f.name, f.name.replace("_", "-"))}
    assert early <= options
    assert not [o for o in options for e in early if e.startswith(o) and e != o]
    assert all(not parser.allow_abbrev for parser in parsers)


def test_the_tiny_presets_cpu_threads_is_set_on_a_cpu_run_only(tmp_path, monkeypatch):
    """The demo's preset asks for one torch thread (cpu_threads: 1), the command line overrides it, and it is
    applied on a CPU run whatever the launcher; a GPU run keeps torch's threads."""
    import torch

    from recipes.hh_rlhf import runtime

    script_args, training_args, _ = parse_recipe_args(
        ["--config", TINY, "--output_dir", str(tmp_path)], check_hub=False
    )
    assert script_args.cpu_threads == 1 and training_args.use_cpu
    given, _, _ = parse_recipe_args(
        ["--config", TINY, "--output_dir", str(tmp_path), "--cpu_threads", "2"], check_hub=False
    )
    assert given.cpu_threads == 2
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    runtime.set_cpu_threads(script_args.cpu_threads, training_args)
    runtime.set_cpu_threads(None, training_args)  # unset: torch's own
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    runtime.set_cpu_threads(3, SimpleNamespace(use_cpu=False))  # a GPU run
    assert calls == [1]
