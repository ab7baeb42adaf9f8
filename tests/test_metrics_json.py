"""The recipe's JSON files are valid JSON (a non-finite number is null, never NaN), an iteration without a
gold score says why, and the lab reads null as the NaN older files held."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState

from recipes.hh_rlhf.json_io import dump, dumps, finite_or_null
from recipes.hh_rlhf.methods import get_rlhf_method
from recipes.hh_rlhf.metrics_log import (
    GOLD_MISSING,
    NO_GOLD_LOGGED,
    NO_GOLD_SCORED,
    IterationMetricsWriter,
    write_csv,
)

ROOT = Path(__file__).resolve().parents[1]


def strict_loads(text: str):
    """json.loads that refuses NaN and Infinity, as jq, JavaScript and most JSON libraries do."""

    def refuse(constant):
        raise ValueError(f"not valid JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_are_written_as_null_everywhere_in_the_value():
    value = {"a": float("nan"), "b": [1.0, float("inf"), {"c": -float("inf")}], "d": (2, "x"), "e": None}
    assert finite_or_null(value) == {"a": None, "b": [1.0, None, {"c": None}], "d": [2, "x"], "e": None}
    assert strict_loads(dumps(value)) == finite_or_null(value)
    with pytest.raises(ValueError):
        strict_loads(json.dumps(value))  # what the recipe wrote before: not valid JSON
    np = pytest.importorskip("numpy")
    assert dumps({"g": np.float64("nan"), "h": np.float64(1.5)}) == '{"g": null, "h": 1.5}'


def _log(writer: IterationMetricsWriter, step: int, logs: dict) -> None:
    writer.on_log(SimpleNamespace(), TrainerState(global_step=step), TrainerControl(), logs=logs)


def test_writer_writes_valid_json_and_says_why_an_iteration_has_no_gold(tmp_path, caplog, monkeypatch):
    """One optimizer step per iteration (the asynchronous trainer): step 2 drained no generation batch (no
    reward metrics at all), step 3's batch had only NaN gold scores (TRL logs None), step 4 logged a NaN."""
    # a recipe run in this process (setup_logging) stops the recipe's logger from reaching caplog's handler
    monkeypatch.setattr(logging.getLogger("rgpo_trl.recipe"), "propagate", True)
    writer = IterationMetricsWriter(str(tmp_path), 1, (0, 4), get_rlhf_method("rgpo"), scores_gold=True)
    state = TrainerState(global_step=0)
    writer.on_train_begin(SimpleNamespace(), state, TrainerControl())
    with caplog.at_level(logging.INFO, logger="rgpo_trl.recipe"):
        _log(writer, 1, {"reward": 1.0, "rewards/gold/mean": 2.0})
        _log(writer, 2, {"reward": 1.5})
        _log(writer, 3, {"reward": 2.0, "rewards/gold/mean": None})
        _log(writer, 4, {"reward": float("nan"), "rewards/gold/mean": 3.0})
    writer.on_train_end(SimpleNamespace(), TrainerState(global_step=4), TrainerControl())
    rows = [strict_loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r.get(GOLD_MISSING) for r in rows] == [None, NO_GOLD_LOGGED, NO_GOLD_SCORED, None]
    assert rows[3]["reward"] is None  # NaN written as null
    # one record, once: pytest >= 9.2 can hand the same record to caplog twice (its handler on the named
    # logger and on the root), so records are counted by identity
    said = {id(r): r.getMessage() for r in caplog.records if "gold not logged" in r.getMessage()}
    assert len(said) == 1
    assert next(iter(said.values())).startswith(f"iteration 2: gold not logged: {NO_GOLD_LOGGED}")
    summary = strict_loads((tmp_path / "summary.json").read_text())
    assert summary["gold"] == pytest.approx(2.5) and summary["reward"] == pytest.approx(1.5)
    assert summary["reward_std"] is None and summary["kl_ref"] is None  # no iteration logged them
    assert "gold_missing_reason" in (tmp_path / "metrics.csv").read_text().splitlines()[0]


def test_writer_marks_only_an_iteration_whose_every_step_lacks_gold(tmp_path):
    """Two optimizer steps per iteration (the synchronous trainers): the batch's reward metrics are logged at
    its first step only, which is not a missing gold; a world without gold marks nothing."""
    writer = IterationMetricsWriter(str(tmp_path), 2, (0, 2), get_rlhf_method("rgpo"), scores_gold=True)
    _log(writer, 1, {"reward": 1.0, "rewards/gold/mean": 2.0})
    _log(writer, 2, {"loss": 0.1})
    _log(writer, 3, {"loss": 0.2})
    _log(writer, 4, {"loss": 0.3})
    rows = [strict_loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r.get(GOLD_MISSING) for r in rows] == [None, None, None, NO_GOLD_LOGGED]
    hh = tmp_path / "hh"
    hh.mkdir()
    writer = IterationMetricsWriter(str(hh), 1, (0, 1), get_rlhf_method("rgpo"))
    _log(writer, 1, {"reward": 1.0})
    assert GOLD_MISSING not in strict_loads((hh / "metrics.jsonl").read_text())


def test_lab_reads_null_as_nan_and_keeps_text_fields(tmp_path):
    """rgpo_lab's readers take the new files (null, a text column in metrics.csv) as they took the old."""
    from rgpo_lab.rlhf_report.comparison import table
    from rgpo_lab.rlhf_report.runs import load, read_rows
    from rgpo_lab.rlhf_suite import read_run_json, read_validation

    run = tmp_path / "rgpo__s1"
    run.mkdir()
    with open(run / "summary.json", "w") as f:
        dump({"method": "rgpo", "window": [0, 2], "reward": 1.0, "gold": float("nan")}, f)
    with open(run / "heldout.json", "w") as f:
        dump({"reward": 2.0, "gold": float("nan"), "kl_ref": 0.1, "split": None}, f)
    with open(run / "validation.json", "w") as f:
        dump({"iterations": [2], "expected_iterations": [2], "gold": float("nan"), "reward": 1.0}, f)
    logged = [
        {"step": 1, "iteration": 1, "reward": 1.0, "rewards/gold/mean": 2.0},
        {"step": 2, "iteration": 2, "reward": 1.5, GOLD_MISSING: NO_GOLD_LOGGED},
    ]
    write_csv(logged, str(run / "metrics.csv"))  # as the recipe writes it
    summary = read_run_json(str(run / "summary.json"))
    assert math.isnan(summary["gold"]) and summary["reward"] == 1.0 and summary["method"] == "rgpo"
    assert read_run_json(str(run / "heldout.json"))["split"] is None  # a text field stays null
    assert math.isnan(read_validation(str(run))["gold"])
    assert read_rows(str(run)) == logged
    rgpo = next(r for r in table(load(str(tmp_path))) if r["method"] == "rgpo")
    assert rgpo["n"] == 1 and rgpo["reward"][0] == 1.0 and rgpo["gold"][2] == 0  # NaN: no finite value


def test_async_recipe_run_writes_valid_json_and_explains_every_missing_gold(tmp_path, quick_assets):
    """The asynchronous recipe on the tiny world: summary.json has reward_std null (not logged by TRL's
    asynchronous trainer) and every iteration has a finite gold or the reason it has none."""
    import importlib.util

    from conftest import assets_cache_root

    from recipes.hh_rlhf.parsing import parse_recipe_args

    spec = importlib.util.spec_from_file_location("hh_rlhf_qwen", ROOT / "recipes" / "hh_rlhf_qwen.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)

    argv = ["--config", str(ROOT / "recipes/configs/hh_rlhf_tiny.yaml"), "--tiny_quick"]
    argv += ["--cache_dir", str(assets_cache_root(quick_assets)), "--output_dir", str(tmp_path)]
    argv += ["--num_rl_iterations", "6", "--max_completion_length", "8", "--disable_tqdm", "true"]
    argv += ["--save_strategy", "no", "--heldout_prompts", "8", "--heldout_compare_initial", "false"]
    argv += ["--trainer", "async", "--max_staleness", "4", "--rollout_lag", "2"]
    recipe.main(*parse_recipe_args(argv))
    summary = strict_loads((tmp_path / "summary.json").read_text())
    assert summary["reward_std"] is None and isinstance(summary["gold"], float)
    strict_loads((tmp_path / "heldout.json").read_text())
    rows = [strict_loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for r in rows:
        has_gold = isinstance(r.get("rewards/gold/mean"), float)
        assert has_gold != (GOLD_MISSING in r), r
        if not has_gold:
            assert r[GOLD_MISSING] == NO_GOLD_LOGGED and "completions/mean_length" not in r
