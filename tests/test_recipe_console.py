"""What a person sees at the end of the recipe (issue 49): the iteration table once, a sentence on what RGPO's
trust region did and why (from the run's own metrics), and the held-out evaluation's progress and a labelled
line instead of an unlabelled JSON dict. Synthetic metric rows, no training."""

from __future__ import annotations

import logging
import re

import pytest
from transformers import TrainerControl, TrainerState

from recipes.hh_rlhf.methods import get_rlhf_method
from recipes.hh_rlhf.metrics_log import IterationMetricsWriter, trust_region_sentence
from recipes.hh_rlhf.recipe_evaluation import EvaluationProgress, heldout_line
from rgpo_trl.async_rgpo import AsyncRGPOConfig
from rgpo_trl.trainer import RGPOConfig

RGPO_COLUMNS = get_rlhf_method("rgpo").metric_columns


@pytest.fixture
def recipe_log(monkeypatch, caplog):
    """The recipe logger's INFO lines (a recipe run in this process turns its propagation off)."""
    monkeypatch.setattr(logging.getLogger("rgpo_trl.recipe"), "propagate", True)
    caplog.set_level(logging.INFO, logger="rgpo_trl.recipe")
    return caplog


def _sync_args(tmp_path, **overrides) -> RGPOConfig:
    """The tiny preset's RGPO settings: 16 completions a batch, 2 passes over it, lr 1e-4."""
    settings = dict(per_device_train_batch_size=16, num_generations=4, num_iterations=2, learning_rate=1e-4)
    return RGPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **{**settings, **overrides})


def _rows(iterations: int, steps: int, kl: float, rejected: float, coef_rule) -> list[dict]:
    """Rows as RGPOTrainer logs them with logging_steps 1: kl_coef every step, KLhat_old at an iteration's
    last step (then the controller updates), the gate's rejected share every step."""
    rows, coef = [], 0.5
    for it in range(1, iterations + 1):
        for s in range(steps):
            row = {"step": (it - 1) * steps + s + 1, "iteration": it, "rgpo/kl_coef": coef}
            row["rgpo/rejected_frac"] = rejected
            if s == steps - 1:
                row["rgpo/kl_old_iteration"] = kl * (1 + it % 3) / 2
                coef = coef_rule(coef, row["rgpo/kl_old_iteration"])
            rows.append(row)
    return rows


def _adaptive(coef: float, kl: float) -> float:
    """The paper's rule with RGPOConfig's defaults (target 0.02, bounds [0.01, 5])."""
    if kl >= 1.5 * 0.02:
        return min(2 * coef, 5.0)
    return max(coef / 2, 0.01) if kl <= 0.02 / 1.5 else coef


def test_sentence_of_a_run_whose_trust_region_did_not_act(tmp_path):
    """The demo's case: batches reused (num_iterations 2) but KLhat_old ~1e-5, the coefficient halves to its
    floor and no token is rejected; the sentence gives the numbers and the reason from the settings."""
    rows = _rows(60, 2, kl=2e-5, rejected=0.0, coef_rule=_adaptive)
    sentence = trust_region_sentence(rows, RGPO_COLUMNS, _sync_args(tmp_path))
    assert sentence.startswith(
        "RGPO's trust region around pi_old: its KL controller did not act (KLhat_old at most 3e-05 and on "
        "average "
    )
    assert ", against its target 0.02;" in sentence
    # 0.5 halves six times to 0.0078, held at 0.01 from the 7th iteration on
    assert "kl_coef fell from 0.5 to its floor 0.01 by iteration 7 and stayed there" in sentence
    assert "the gate rejected no token" in sentence
    assert "num_iterations 2" in sentence and "learning rate 0.0001" in sentence
    assert "stayed below kl_target / 1.5 = 0.0133" in sentence

    # the same metrics with each batch used once: the reason is that pi_old == pi, with the fix
    once = trust_region_sentence(rows, RGPO_COLUMNS, _sync_args(tmp_path, num_iterations=1))
    assert "did not act" in once and "num_iterations 1), so pi_old == pi" in once
    assert "--num_iterations 2" in once and "learning rate" not in once


def test_sentence_of_a_run_whose_trust_region_acted(tmp_path):
    """KLhat_old above 1.5 x target doubles the coefficient, and 2% of tokens are rejected: 'acted', with the
    range the coefficient moved in and the rejected share, and no reason for inaction."""
    rows = _rows(10, 2, kl=0.04, rejected=0.02, coef_rule=_adaptive)
    sentence = trust_region_sentence(rows, RGPO_COLUMNS, _sync_args(tmp_path))
    assert sentence.startswith(
        "RGPO's trust region around pi_old acted: KLhat_old at most 0.06 and on average "
    )
    assert "kl_coef went from 0.5 to 5 (range 0.5-5)" in sentence
    assert "the gate rejected 2.00% of tokens" in sentence
    assert "did not act" not in sentence and "num_iterations" not in sentence

    # a few rejected tokens with KLhat_old small (the demo's run): the controller did not act, the gate's
    # share is stated next to it, and the reason follows
    gate_only = trust_region_sentence(
        _rows(10, 2, kl=1e-5, rejected=0.001, coef_rule=_adaptive), RGPO_COLUMNS, _sync_args(tmp_path)
    )
    assert "its KL controller did not act (" in gate_only and " acted:" not in gate_only
    assert (
        "; the gate rejected 0.10% of tokens (g < 0.1; at most 0.10% in a step): each generation" in gate_only
    )


def test_sentence_for_the_asynchronous_trainer_and_methods_without_a_trust_region(tmp_path):
    """The asynchronous trainer's pi_old is the sampler's policy and its reason is the samples' lag; GRPO
    logs no KLhat_old or coefficient, so it gets no sentence."""
    from recipes.hh_rlhf.async_methods import ASYNC_METHODS

    args = AsyncRGPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_staleness=4)
    rows = [
        {"step": s, "iteration": s, "rgpo/kl_old": 1e-4, "rgpo/kl_coef": max(0.5 / 2**s, 0.01)}
        | {"rgpo/rejected_frac": 0.0, "staleness/max": 2.0}
        for s in range(1, 9)
    ]
    sentence = trust_region_sentence(rows, ASYNC_METHODS["rgpo"].metric_columns, args)
    assert sentence.startswith(
        "RGPO's trust region around the sampling policy: its KL controller did not act"
    )
    assert "by iteration 6" in sentence and "up to 4 weight versions old, at most 2 in this run" in sentence
    assert trust_region_sentence(rows, get_rlhf_method("grpo").metric_columns, args) is None


def test_the_table_is_printed_once_and_ends_with_the_trust_region_sentence(tmp_path, recipe_log):
    """table_every 2 prints iterations 2 and 4 as they finish; the end prints only the window's averages
    (the header again), not the rows a second time, then the sentence."""
    args = _sync_args(tmp_path)
    writer = IterationMetricsWriter(str(tmp_path), 2, (2, 4), get_rlhf_method("rgpo"), table_every=2)
    writer.on_train_begin(args, TrainerState(global_step=0), TrainerControl())
    for row in _rows(4, 2, kl=2e-5, rejected=0.0, coef_rule=_adaptive):
        logs = {k: v for k, v in row.items() if k not in ("step", "iteration")} | {"reward": 0.5}
        writer.on_log(args, TrainerState(global_step=row["step"]), TrainerControl(), logs=logs)
    writer.on_train_end(args, TrainerState(global_step=8), TrainerControl())
    console = "\n".join(r.getMessage() for r in recipe_log.records)
    rows = re.findall(r"^ +(\d+) ", console, flags=re.MULTILINE)
    assert rows == ["2", "4"]  # each iteration row once
    assert len(re.findall(r"^window 2-4 ", console, flags=re.MULTILINE)) == 1
    assert len(re.findall(r"^iteration +reward", console, flags=re.MULTILINE)) == 2
    assert (
        recipe_log.records[-1].getMessage().startswith("RGPO's trust region around pi_old: its KL controller")
    )

    # without the periodic rows (table_every 0) the end prints the whole table
    recipe_log.clear()
    quiet = IterationMetricsWriter(str(tmp_path / "quiet"), 2, (2, 4), get_rlhf_method("rgpo"))
    quiet.on_train_begin(args, TrainerState(global_step=0), TrainerControl())
    for row in _rows(4, 2, kl=2e-5, rejected=0.0, coef_rule=_adaptive):
        logs = {k: v for k, v in row.items() if k not in ("step", "iteration")}
        quiet.on_log(args, TrainerState(global_step=row["step"]), TrainerControl(), logs=logs)
    quiet.on_train_end(args, TrainerState(global_step=8), TrainerControl())
    table = recipe_log.records[0].getMessage()
    assert re.findall(r"^ +(\d+) ", table, flags=re.MULTILINE) == ["1", "2", "3", "4"]


def test_heldout_progress_lines_and_the_labelled_result(recipe_log):
    """Piped output: a line at each quarter of the completions (not at the end, which the result's line
    says); with a bar, no lines. The result's line names the policy, the size, the time and the file, with
    its numbers only when no comparison table follows."""
    progress = EvaluationProgress("held-out test (SFT policy)", 256, bar=False)
    for done in range(16, 257, 16):  # the evaluation's batches of 16 completions
        progress(done)
    progress.close()
    lines = [r.getMessage() for r in recipe_log.records]
    assert [
        re.match(r"held-out test \(SFT policy\): (\d+)/256 completions, \d+ s$", m)[1] for m in lines
    ] == [
        "64",
        "128",
        "192",
    ]
    recipe_log.clear()
    bar = EvaluationProgress("held-out test (SFT policy)", 256, bar=True)
    for done in range(16, 257, 16):
        bar(done)
    assert bar._bar.n == 256 and not recipe_log.records
    bar.close()

    result = {"prompts": 64, "samples_per_prompt": 4, "reward": 1.23456, "gold": 2.5, "kl_ref": 0.0123}
    result["seconds"] = 53.4
    alone = heldout_line(
        "held-out test (trained rgpo policy)", result, "/run/heldout.json", table_follows=False
    )
    assert alone == (
        "held-out test (trained rgpo policy): 64 prompts x 4 samples in 53 s: proxy reward 1.235, "
        "gold 2.500, KL_ref 0.012 -> /run/heldout.json"
    )
    before_table = heldout_line("held-out test (SFT policy)", result, "/run/h.json", table_follows=True)
    assert before_table == "held-out test (SFT policy): 64 prompts x 4 samples in 53 s -> /run/h.json"
    assert "{" not in alone + before_table  # no JSON dict on the console
