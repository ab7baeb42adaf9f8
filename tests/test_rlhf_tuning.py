"""The RLHF tuning protocol: validation prompts held out of training, their window evaluation, the selection
rule and the suites built from it."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest


def _prompts(texts):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in texts]})


def test_hold_out_validation_removes_every_copy_of_a_validation_prompt():
    from recipes.hh_common.hh_data import hold_out_validation

    train, validation = hold_out_validation(_prompts(["a", "b", "c", "b", "d", "e"]), 2)
    assert [p[0]["content"] for p in validation["prompt"]] == ["d", "e"]
    assert [p[0]["content"] for p in train["prompt"]] == ["a", "b", "c", "b"]
    train, validation = hold_out_validation(_prompts(["a", "b", "a"]), 1)  # "a" repeats: both copies leave
    assert [p[0]["content"] for p in train["prompt"]] == ["b"]
    with pytest.raises(ValueError, match=r"validation_prompts must be in \[0, 2\]"):
        hold_out_validation(_prompts(["a", "b", "c"]), 3)


def test_window_evaluation_rows_resume_and_summary(tmp_path):
    from recipes.hh_rlhf.evaluation import WindowEvaluation

    seen = []

    def evaluate(model, prompts, seed):
        seen.append(seed)
        return {"gold": float(seed), "reward": 1.0, "kl_ref": 0.5}

    def callback():
        return WindowEvaluation(
            str(tmp_path / "v.jsonl"), str(tmp_path / "v.json"), ["p"], [2, 4, 6], 2, evaluate, seed=100
        )

    def state(step):
        return SimpleNamespace(global_step=step, is_world_process_zero=True)

    cb = callback()
    cb.on_train_begin(None, state(0), None)
    for step in range(1, 11):  # iterations 1-5 (2 steps each); evaluated at iterations 2 and 4
        cb.on_step_end(None, state(step), None, model=None)
    assert seen == [102, 104]
    # resumed from the checkpoint at step 6 (iteration 3): the row of iteration 4 is dropped and made again
    cb = callback()
    cb.on_train_begin(None, state(6), None)
    for step in range(7, 13):
        cb.on_step_end(None, state(step), None, model=None)
    cb.on_train_end(None, state(12), None)
    rows = [json.loads(line) for line in open(tmp_path / "v.jsonl")]
    assert [r["iteration"] for r in rows] == [2, 4, 6] and seen == [102, 104, 104, 106]
    summary = json.load(open(tmp_path / "v.json"))
    assert summary["iterations"] == summary["expected_iterations"] == [2, 4, 6]
    assert summary["gold"] == pytest.approx(104.0) and summary["kl_ref"] == 0.5


def test_selection_takes_the_highest_validation_gold_only_when_every_rate_finished(tmp_path):
    from rgpo_lab import rlhf_select, rlhf_suite

    def validation(gold):
        return {"iterations": [325], "expected_iterations": [325], "gold": gold, "reward": 2.0, "kl_ref": 0.1}

    golds = {"5e-5": 1.0, "1e-4": 1.7, "2e-4": 1.2}
    for lr, gold in golds.items():
        d = tmp_path / f"rgpo__lr{lr}__s100"
        d.mkdir()
        (d / "validation.json").write_text(json.dumps(validation(gold)))
    (tmp_path / "ppo__lr5e-5__s100").mkdir()  # ppo: nothing finished
    (tmp_path / "ppo__lr5e-5__s100" / "validation.json").write_text(json.dumps(validation(9.0)))
    assert rlhf_select.main([str(tmp_path)]) == 0
    selection = json.load(open(tmp_path / "selection.json"))
    assert selection["methods"]["rgpo"]["selected_lr"] == "1e-4"
    assert selection["methods"]["ppo"]["selected_lr"] is None  # 2 of 3 rates missing: no choice yet
    text = (tmp_path / "selection.md").read_text()
    assert "| rgpo | 1e-4 | 1.700 | 2.000 | 0.100 | **yes** |" in text and "| ppo | 1e-4 | not run" in text
    # the later suites use the choice, and only for methods that have one
    results = tmp_path.parent / "results"
    (results / "tune").mkdir(parents=True)
    os.replace(tmp_path / "selection.json", results / "tune" / "selection.json")
    final = rlhf_suite.SUITE_BUILDERS["final"](str(results))
    assert (
        sorted({r.method for r in final}) == ["rgpo", "sft"] and len(final) == 5 + 5
    )  # and the SFT baseline
    assert all(r.extra[r.extra.index("--learning_rate") + 1] == "1e-4" for r in final if r.method == "rgpo")
    # seed by seed, each seed with its SFT baseline: an interrupted suite leaves whole seeds
    assert [(r.seed, r.method) for r in final] == [(s, m) for s in range(1, 6) for m in ("rgpo", "sft")]
    reuse = rlhf_suite.SUITE_BUILDERS["reuse"](str(results))
    assert sorted({r.tag for r in reuse}) == ["reuse1", "reuse4", "reuse8"] and len(reuse) == 9
    with pytest.raises(SystemExit, match="selection.json is missing"):
        rlhf_suite.SUITE_BUILDERS["final"](str(tmp_path / "nowhere"))


def test_tuning_suite_is_fixed_and_uses_no_later_seed():
    from rgpo_lab import rlhf_suite

    runs = rlhf_suite.SUITE_BUILDERS["tune"]("unused")
    assert len(runs) == 6 * 3 + 3 and {r.seed for r in runs} == {rlhf_suite.TUNE_SEED}
    assert "--validation_prompts" in runs[0].extra and runs[0].name == "rgpo__lr5e-5__s100"


def test_path_containment_is_not_a_string_prefix(tmp_path):
    from rgpo_lab import rlhf_suite

    (tmp_path / "proj").mkdir()
    (tmp_path / "proj-cache").mkdir()
    assert not rlhf_suite.inside(str(tmp_path / "proj-cache"), str(tmp_path / "proj"))
    assert rlhf_suite.inside(str(tmp_path / "proj" / "x"), str(tmp_path / "proj"))


def test_v3_edge_rule_extends_the_grid_once_and_selects_over_the_extension(tmp_path):
    from rgpo_lab import rlhf_select, rlhf_suite

    tune = tmp_path / "v3" / "tune"

    def finish(method, lr, gold):
        d = tune / f"{method}__lr{lr}__s100"
        d.mkdir(parents=True)
        result = {
            "iterations": [325],
            "expected_iterations": [325],
            "gold": gold,
            "reward": 2.0,
            "kl_ref": 0.1,
        }
        (d / "validation.json").write_text(json.dumps(result))

    for lr, gold in {"5e-5": 2.0, "1e-4": 1.5, "2e-4": 1.0}.items():  # rgpo: best at the lowest rate
        finish("rgpo", lr, gold)
    for lr, gold in {"5e-5": 1.0, "1e-4": 1.8, "2e-4": 1.2}.items():  # ppo: an interior best
        finish("ppo", lr, gold)
    for lr, gold in {"5e-5": 1.0, "1e-4": 1.1}.items():  # grpo: unfinished grid, no extension yet
        finish("grpo", lr, gold)
    runs = {r.name for r in rlhf_suite.SUITE_BUILDERS["v3/tune"](str(tmp_path))}
    assert "rgpo__lr2.5e-5__s100" in runs and "rgpo__lr4e-4__s100" not in runs
    assert not any(
        n.startswith(("ppo__lr2.5e-5", "ppo__lr4e-4", "grpo__lr2.5e-5", "grpo__lr4e-4")) for n in runs
    )
    assert len(runs) == 24 + 1  # 8 methods (cispo joins v3's tuning) x 3 rates, and the extension
    # the v2 suite never extends
    assert len(rlhf_suite.SUITE_BUILDERS["tune"](str(tmp_path / "v3"))) == 21
    rlhf_select.main([str(tune)])
    selection = json.load(open(tune / "selection.json"))
    assert selection["methods"]["rgpo"]["selected_lr"] is None  # the extension has not run
    assert (
        selection["methods"]["ppo"]["selected_lr"] == "1e-4" and selection["methods"]["ppo"]["edge"] is None
    )
    finish("rgpo", "2.5e-5", 2.5)  # still best at the new edge: selected there, said so, no second extension
    assert len(rlhf_suite.SUITE_BUILDERS["v3/tune"](str(tmp_path))) == 25
    rlhf_select.main([str(tune)])
    selection = json.load(open(tune / "selection.json"))
    rgpo = selection["methods"]["rgpo"]
    assert rgpo["selected_lr"] == "2.5e-5" and rgpo["edge"] == "lowest" and rgpo["extended"]
    assert [r["lr"] for r in rgpo["rates"]] == ["2.5e-5", "5e-5", "1e-4", "2e-4"]
    text = (tune / "selection.md").read_text()
    assert "| rgpo | 2.5e-5 | 2.500 | 2.000 | 0.100 | **yes** (the lowest rate tried) |" in text
    assert "Grid extended by the edge rule: rgpo." in text


def test_staleness_suites_are_fixed_with_one_budget_per_level(tmp_path):
    """stale_sync: 5 methods x S in {1, 4, 16}, seeds 1-3 / 1-3 / 1-5; stale_async: 3 methods x L in {1, 2,
    8}; 400 optimizer steps at every level, the window on steps 304-400, each method at its v3 rate."""
    from rgpo_lab import rlhf_suite

    (tmp_path / "v3" / "tune").mkdir(parents=True)
    rates = {"rgpo": "5e-5", "rgpo_old": "1e-4", "grpo": "2.5e-5", "cispo": "1e-4", "sapo": "5e-5"}
    selection = {"methods": {m: {"selected_lr": lr} for m, lr in rates.items()}}
    (tmp_path / "v3" / "tune" / "selection.json").write_text(json.dumps(selection))
    sync = rlhf_suite.SUITE_BUILDERS["v3/stale_sync"](str(tmp_path))
    asyn = rlhf_suite.SUITE_BUILDERS["v3/stale_async"](str(tmp_path))
    assert len(sync) == 5 * (3 + 3 + 5) and len(asyn) == 3 * (3 + 3 + 5)

    def flag(run, name):
        return run.extra[run.extra.index(name) + 1]

    for run in sync:
        s = int(flag(run, "--steps_per_generation"))
        assert run.tag == f"S{s}" and flag(run, "--num_iterations") == "1"
        assert int(flag(run, "--num_rl_iterations")) * s == 400  # the same optimizer steps at every S
        assert int(flag(run, "--window_start")) * s == 304 and int(flag(run, "--window_end")) * s == 400
        assert flag(run, "--learning_rate") == rates[run.method] and flag(run, "--validation_prompts") == "0"
    for run in asyn:
        lag = int(flag(run, "--rollout_lag"))
        assert (
            run.tag == f"L{lag}"
            and flag(run, "--trainer") == "async"
            and run.method in ("rgpo", "rgpo_old", "grpo")
        )
        assert int(flag(run, "--max_staleness")) >= lag and flag(run, "--num_rl_iterations") == "400"
    assert {r.seed for r in sync if r.tag == "S16"} == {1, 2, 3, 4, 5}
    assert {r.seed for r in asyn if r.tag == "L8"} == {1, 2, 3, 4, 5}
    del selection["methods"]["cispo"]
    (tmp_path / "v3" / "tune" / "selection.json").write_text(json.dumps(selection))
    with pytest.raises(SystemExit, match="cispo has no selected v3 rate"):
        rlhf_suite.SUITE_BUILDERS["v3/stale_sync"](str(tmp_path))
    assert "Verdict per other method" in rlhf_suite.STALENESS_RULE
