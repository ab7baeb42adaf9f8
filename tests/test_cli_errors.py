"""What a person sees at the command line: one-line errors for bad inputs (no traceback, no run folder left),
the MuJoCo scripts' description and rounding notice, and the demo's closing comparison. (The lab's driver of
the scripts passes their one-line errors on: tests/test_mujoco_drive.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _run(args, cwd, env=ENV):
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.parametrize(
    "method,flags,needle",
    [
        ("rgpo", ["--env-id", "CartPole-v1"], "env_id 'CartPole-v1' has a Discrete action space"),
        ("rgpo", ["--env-id", "Hoper-v4"], "Did you mean: `Hopper`?"),
        ("rgpo", ["--gate", "nope"], "gate must be one of the registered gates"),
        ("rgpo", ["--policy-lag", "-1"], "policy_lag must be an integer >= 0"),
        ("rgpo", ["--total-timesteps", "100"], "total_timesteps must be >= num_steps (2048), got 100"),
        ("ppo", ["--num-minibatches", "3"], "num_minibatches must divide num_steps (2048), got 3"),
        ("ppo", ["--kl-target", "0.05"], "kl_target only take effect with --kl-penalty"),
        ("awr", ["--env-id", "CartPole-v1"], "env_id 'CartPole-v1' has a Discrete action space"),
        ("trpo", ["--eval-episodes", "-1"], "eval_episodes must be an integer >= 0"),
        # the environment id and the gate are checked before the step count: the first error is the real one
        ("rgpo", ["--env-id", "Hoper-v4", "--total-timesteps", "1000"], "Did you mean: `Hopper`?"),
        ("rgpo", ["--gate", "nope", "--total-timesteps", "1000"], "gate must be one of the registered gates"),
        ("ppo", ["--env-id", "Hopper-v9", "--total-timesteps", "1000"], "version `v9` for environment"),
        ("trpo", ["--env-id", "Hoper-v4", "--total-timesteps", "1000"], "Did you mean: `Hopper`?"),
        ("awr", ["--env-id", "Hoper-v4", "--total-timesteps", "1000"], "Did you mean: `Hopper`?"),
    ],
)
def test_mujoco_script_bad_input_is_one_line_and_leaves_no_run_folder(method, flags, needle, tmp_path):
    """The product's scripts (mujoco_baselines/): a bad input ends the run in one line naming the field,
    before runs/ is written."""
    pytest.importorskip("mujoco")
    script = str(ROOT / "mujoco_baselines" / f"{method}_continuous_action.py")
    r = _run([script, *flags], tmp_path)
    assert r.returncode == 1, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("method", ["ppo", "rgpo", "trpo", "awr"])
def test_mujoco_script_says_how_many_steps_will_run(method, tmp_path):
    """Iterations are whole rollouts: 600 steps of 256-step rollouts run 512, and the first line says so."""
    pytest.importorskip("mujoco")
    script = str(ROOT / "mujoco_baselines" / f"{method}_continuous_action.py")
    flags = ["--env-id", "Hopper-v4", "--total-timesteps", "600", "--num-steps", "256"]
    flags += ["--eval-episodes", "0"]
    r = _run([script, *flags], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    first = r.stdout.splitlines()[0]
    assert first == "total_timesteps 600 is not a multiple of num_steps 256: running 2 iterations = 512 steps"
    exact = _run([script, *flags[:2], "--total-timesteps", "256", *flags[4:]], tmp_path)
    assert exact.returncode == 0 and "not a multiple" not in exact.stdout  # nothing to say


def test_mujoco_script_help(tmp_path):
    pytest.importorskip("mujoco")
    for method, title in (
        ("ppo", "PPO (clipped surrogate) on a MuJoCo task"),
        ("rgpo", "RGPO (rejection-gated"),
    ):
        help_text = _run(
            [str(ROOT / "mujoco_baselines" / f"{method}_continuous_action.py"), "--help"], tmp_path
        )
        assert help_text.returncode == 0 and title in help_text.stdout.split("options")[0]
        assert "--num-minibatches" in help_text.stdout and "--batch-size" not in help_text.stdout
        assert "--num-iterations" not in help_text.stdout  # derived, not an option


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--config", "nope.yaml"], "config file 'nope.yaml' not found"),
        (["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--method", "foo"], "method must be one of"),
        (["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--gate", "nope"], "gate must be one of"),
        # the hyphen spelling is read before the hub check: the path given is checked, not the preset's id
        (
            ["--config", "recipes/configs/hh_rlhf_paper.yaml", "--model-name-or-path", "/nonexistent/rv"],
            "Local model path '/nonexistent/rv' does not exist",
        ),
        # an abbreviation is refused, not left out of the hub check and expanded by the parser
        (
            [
                "--config",
                "recipes/configs/hh_rlhf_tiny.yaml",
                "--reward_model_name",
                "OpenAssistant/reward-model-deberta-v3-large-v2",
            ],
            "--reward_model_name: options must be given in full (did you mean --reward_model_name_or_path?)",
        ),
        # the fields passed on to transformers, TRL and torch, refused before the models load (torch's
        # optimizer would refuse the learning rate after them; TRL's config divides by num_generations)
        (
            ["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--learning_rate", "-1"],
            "learning_rate must be a finite number > 0, got -1.0",
        ),
        (
            ["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--num_generations", "0"],
            "num_generations must be an integer >= 2",
        ),
        (
            ["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--trainer", "async", "--num_generations", "3"],
            "processes = 16 must be a multiple of num_generations = 3",
        ),
        (
            ["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--max_completion_length", "0"],
            "max_completion_length must be an integer >= 1, got 0",
        ),
        (
            ["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--cpu_threads", "0"],
            "cpu_threads must be an integer >= 1 (or unset), got 0",
        ),
        # a misspelled option gets the field it is closest to; one far from every field gets none
        (
            ["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--learnig_rate", "1e-4", "--zzz", "1"],
            "--learnig_rate (did you mean --learning_rate?), --zzz: not a field of the recipe or of "
            "RGPOConfig",
        ),
    ],
)
def test_recipe_bad_input_is_one_line(flags, needle, tmp_path):
    out = tmp_path / "out"
    offline = {**ENV, "HF_HUB_OFFLINE": "1"}  # a hub id is refused at once, not after a network probe
    r = _run([str(ROOT / "recipes" / "hh_rlhf_qwen.py"), *flags, "--output_dir", str(out)], ROOT, offline)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr and not out.exists()


def test_recipe_misspelled_yaml_key_gets_a_suggestion(tmp_path):
    preset = (ROOT / "recipes" / "configs" / "hh_rlhf_tiny.yaml").read_text()
    assert "\nlearning_rate:" in preset
    (tmp_path / "typo.yaml").write_text(preset.replace("\nlearning_rate:", "\nlearnig_rate:"))
    out = tmp_path / "out"
    offline = {**ENV, "HF_HUB_OFFLINE": "1"}
    argv = [str(ROOT / "recipes" / "hh_rlhf_qwen.py"), "--config", str(tmp_path / "typo.yaml")]
    r = _run([*argv, "--output_dir", str(out)], ROOT, offline)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == [
        "error: learnig_rate (did you mean learning_rate?): in the config file, but not a field of the "
        "recipe or of RGPOConfig (--debug shows the traceback)"
    ], r.stderr
    assert not out.exists()


@pytest.mark.parametrize("quiet", [True, False], ids=["launch_-q", "launch"])
def test_recipe_error_through_accelerate_launch(quiet, tmp_path):
    """The documented one-process command, ``accelerate launch -q``: the recipe's line and a non-zero exit,
    nothing of accelerate's; without -q accelerate appends its own traceback of the child's exit (why the
    docs say -q and `make demo` runs the recipe with plain python)."""
    launch = ["-m", "accelerate.commands.launch", *(["-q"] if quiet else [])]
    launch += [
        "--config_file",
        "recipes/accelerate_configs/cpu.yaml",
        str(ROOT / "recipes" / "hh_rlhf_qwen.py"),
    ]
    args = ["--config", "recipes/configs/hh_rlhf_tiny.yaml", "--learning_rate", "-1"]
    r = _run([*launch, *args, "--output_dir", str(tmp_path / "out")], ROOT, {**ENV, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 1, r.stderr[-2000:]  # accelerate's status for a failed child
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines[0] == (
        "error: learning_rate must be a finite number > 0, got -1.0 (--debug shows the traceback)"
    ), r.stderr
    if quiet:
        assert len(lines) == 1 and "Traceback" not in r.stdout + r.stderr, r.stderr
    else:
        assert "CalledProcessError" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def recipe_checkpoint(tmp_path_factory, quick_assets):
    """A real checkpoint of the recipe (one tiny-world iteration, saved at its second optimizer step) and
    the command line that resumes from a copy of it (its folder to be appended)."""
    from conftest import assets_cache_root

    argv = [str(ROOT / "recipes" / "hh_rlhf_qwen.py"), "--config", "recipes/configs/hh_rlhf_tiny.yaml"]
    argv += ["--tiny_quick", "--cache_dir", str(assets_cache_root(quick_assets)), "--num_rl_iterations", "1"]
    argv += ["--max_completion_length", "8", "--heldout_prompts", "0", "--disable_tqdm", "true"]
    run = tmp_path_factory.mktemp("recipe_checkpoint") / "run"
    r = _run([*argv, "--save_steps", "2", "--output_dir", str(run)], ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return run / "checkpoint-2", argv


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


@pytest.mark.parametrize(
    "name,damage,needle",
    [
        ("rgpo_kl_controller.json", lambda p: p.write_text('{"kl_coef": '), "not valid JSON"),
        ("trainer_state.json", lambda p: p.write_bytes(b"garbage\x00\x01"), "not valid JSON"),
        ("model.safetensors", _truncate, "unreadable (Error while deserializing header"),
    ],
    ids=["kl_controller", "trainer_state", "safetensors"],
)
def test_recipe_resume_from_a_corrupt_checkpoint_is_one_line(
    recipe_checkpoint, tmp_path, name, damage, needle
):
    """A damaged file of the checkpoint is named, with what to do, before the models load and before the
    output folder exists (the Trainer would fail on it after both, with a long traceback)."""
    checkpoint, argv = recipe_checkpoint
    copy = tmp_path / "checkpoint-2"
    shutil.copytree(checkpoint, copy)
    damage(copy / name)
    out = tmp_path / "out"
    r = _run([*argv, "--output_dir", str(out), "--resume_from_checkpoint", str(copy)], ROOT)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {copy / name}: {needle}"), r.stderr
    assert f"delete the checkpoint folder {copy} or point --resume_from_checkpoint at another one" in lines[0]
    assert "Traceback" not in r.stdout + r.stderr and not out.exists()


def test_recipe_checkpoint_that_fails_to_load_names_its_weights(recipe_checkpoint, tmp_path):
    """The intact checkpoint passes the parser's check; weights damaged after it (as a concurrent write
    would) fail inside the Trainer's load, which safetensors reports without a file name: the recipe names
    the folder's weight files instead."""
    import importlib.util

    from recipes.hh_rlhf.parsing import parse_recipe_args
    from rgpo_trl.cli import UsageError

    checkpoint, argv = recipe_checkpoint
    copy = tmp_path / "checkpoint-2"
    shutil.copytree(checkpoint, copy)
    parsed = parse_recipe_args(
        [*argv[1:], "--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint", str(copy)]
    )
    _truncate(copy / "model.safetensors")
    spec = importlib.util.spec_from_file_location("hh_rlhf_qwen", ROOT / "recipes" / "hh_rlhf_qwen.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    with pytest.raises(UsageError, match="model.safetensors: failed to load") as info:
        recipe.main(*parsed)
    assert "delete the checkpoint folder" in str(info.value)


def _evaluation(reward, gold, kl_ref=0.0, k=2):
    """An evaluation result with per-completion scores (64 prompts, ``k`` samples each)."""
    n = 64
    return {
        "prompts": n,
        "samples_per_prompt": k,
        "reward": float(np.mean(reward)),
        "gold": float(np.mean(gold)),
        "kl_ref": kl_ref,
        "per_completion": {"reward": list(reward), "gold": list(gold)},
    }


def test_comparison_table_says_what_happened_with_a_paired_standard_error():
    from recipes.hh_rlhf.evaluation import comparison_table, paired_standard_error

    rng = np.random.default_rng(0)
    base_r, base_g = rng.normal(0, 1, 128), rng.normal(1, 1, 128)
    initial = _evaluation(base_r, base_g)
    shift = lambda x, d: x + d + rng.normal(0, 0.3, 128)  # noqa: E731
    improved = _evaluation(shift(base_r, 1.0), shift(base_g, 0.5), kl_ref=0.05)
    text = comparison_table(initial, improved, "rgpo")
    assert text.splitlines()[-1].startswith("Training improved the policy: gold +0.")
    assert text.splitlines()[2].split()[-1] == "0.050"  # the trained row ends with its KL_ref
    # the paired s.e.: std over prompts of the per-prompt mean difference / sqrt(64)
    d = (np.asarray(improved["per_completion"]["gold"]) - base_g).reshape(64, 2).mean(1)
    assert paired_standard_error(initial, improved, "gold") == pytest.approx(d.std(ddof=1) / 8)
    hacked = comparison_table(initial, _evaluation(shift(base_r, 2.0), shift(base_g, -0.8)), "rgpo")
    assert hacked.splitlines()[-1].startswith("Over-optimised:")
    worse = comparison_table(initial, _evaluation(shift(base_r, 0.0), shift(base_g, -0.8)), "rgpo")
    assert worse.splitlines()[-1].startswith("Training made the policy worse:")
    same = comparison_table(initial, _evaluation(shift(base_r, 0.0), shift(base_g, 0.0)), "rgpo")
    assert same.splitlines()[-1].startswith("No clear change:")
