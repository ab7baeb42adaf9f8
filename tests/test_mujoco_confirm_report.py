"""The policy_lag_confirm report on synthetic runs: its tests equal scipy's Welch and a hand Holm, its
reading follows RULES.md, and a partial suite is labelled interim with its missing runs named."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rgpo_lab import mujoco_confirm_report as rep
from rgpo_lab.mujoco_grid import SUITES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEANS = {  # arm -> raw mean return, the same in every environment
    "ppo_dec": 1000.0,
    "rgpo_dec": 2500.0,
    "ppo_dec_kl": 1100.0,
    "rgpo_dec_nokl": 2400.0,
    "ppo_plain": 500.0,
    "rgpo_plain": 500.0,
    "ppo_L0": 3000.0,
    "rgpo_L0": 3000.0,
}


def _write_suite(root, skip=()):
    """Every run of the suite as a folder with final.json and a 3-row metrics.csv; arm means from MEANS plus
    seeded noise."""
    by_key = {v: k for k, v in rep.ARMS.items()}
    rng = np.random.default_rng(0)
    for r in SUITES["policy_lag_confirm"]:
        if r.name in skip:
            continue
        d = os.path.join(root, r.suite, r.name)
        os.makedirs(d, exist_ok=True)
        value = MEANS[by_key[(r.method, r.variant)]] + rng.normal(0, 150)
        with open(os.path.join(d, "final.json"), "w") as f:
            json.dump({"eval_return_mean": value}, f)
        metrics = {"global_step": [2048, 4096, 6144], "return_last100": [0.0, value / 2, value]}
        if "lag8" in r.variant and "decoupled" not in r.variant:
            metrics.update(
                {"start_ratio_beyond_2": [0.1, 0.2, 0.3], "start_rejected_frac": [0.05, 0.05, 0.05]}
            )
        pd.DataFrame(metrics).to_csv(os.path.join(d, "metrics.csv"), index=False)
    os.makedirs(os.path.join(root, "normalisation"), exist_ok=True)
    with open(os.path.join(ROOT, "results", "mujoco", "normalisation", "baselines.json")) as f:
        baselines = json.load(f)
    with open(os.path.join(root, "normalisation", "baselines.json"), "w") as f:
        json.dump(baselines, f)


def test_report_tests_match_scipy_and_holm_and_the_reading_follows_the_rule(tmp_path):
    _write_suite(str(tmp_path))
    md = rep.build(str(tmp_path), str(tmp_path / "out"), n_boot=500, plots=False)
    studies = json.loads((tmp_path / "out" / "studies.json").read_text())
    assert studies["missing"] == [] and "Status: **final**" in md
    data, _ = rep.load(str(tmp_path))
    (a,) = [c for c in studies["comparisons"] if c["name"] == "more robust"]
    ps = [a["aggregate"]["p"]]
    for env in rep.CONFIRM_ENVS:
        x, y = rep.returns(data, "rgpo_dec", env), rep.returns(data, "ppo_dec", env)
        assert len(x) == len(y) == 10
        t = stats.ttest_ind(x, y, equal_var=False)
        assert a["per_env"][env]["p"] == pytest.approx(t.pvalue, rel=1e-12)
        assert a["per_env"][env]["diff"] == pytest.approx(x.mean() - y.mean(), rel=1e-12)
        ps.append(t.pvalue)
    order = np.argsort(ps)  # Holm by hand
    adjusted, running = [0.0] * 4, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (4 - rank) * ps[i]))
        adjusted[i] = running
    assert a["aggregate"]["p_holm"] == pytest.approx(adjusted[0])
    assert [a["per_env"][e]["p_holm"] for e in rep.CONFIRM_ENVS] == pytest.approx(adjusted[1:])
    assert a["aggregate"]["p"] >= 1 / 500  # floored at 1 / n_boot
    # RGPO far above PPO everywhere, PPO + KL penalty not above decoupled PPO: the gate is the cause
    assert a["aggregate"]["verdict"] == "higher"
    assert studies["reading"].endswith("confirmed; cause: gate.")
    gates = studies["gate_activity"]["rgpo_plain"]["Hopper-v4"]
    assert gates["start_ratio_beyond_2"] == pytest.approx(0.2) and gates[
        "start_rejected_frac"
    ] == pytest.approx(0.05)


def test_a_partial_suite_is_interim_and_names_its_missing_runs(tmp_path):
    skip = {r.name for r in SUITES["policy_lag_confirm"] if r.env_id == "Hopper-v4" and r.seed >= 2}
    _write_suite(str(tmp_path), skip=skip)
    md = rep.build(str(tmp_path), str(tmp_path / "out"), n_boot=200, plots=False)
    studies = json.loads((tmp_path / "out" / "studies.json").read_text())
    assert (
        len(studies["missing"]) == len(skip) and "INTERIM" in md and "Interim, on an incomplete suite" in md
    )
    # Hopper has 2 runs per arm: still in the aggregate; with one it would be left out and named
    (a,) = [c for c in studies["comparisons"] if c["name"] == "more robust"]
    assert a["aggregate"]["envs"] == rep.CONFIRM_ENVS


def test_no_significant_difference_attributes_no_cause():
    comparisons = [
        {
            "aggregate": {
                "a": 0.5,
                "b": 0.4,
                "diff": 0.1,
                "low": -0.1,
                "high": 0.3,
                "p_holm": 0.4,
                "verdict": "no significant difference",
            }
        }
    ] + [{"aggregate": {"verdict": "higher"}}] * (len(rep.COMPARISONS) - 1)
    words = rep.attribution_words(comparisons)
    assert "not confirmed (no significant difference)" in words and "no cause is attributed" in words
    assert "cause:" not in words
    comparisons[0]["aggregate"].update(diff=-0.3, p_holm=0.01, verdict="lower")
    assert "refuted" in rep.attribution_words(comparisons)


def test_provenance_compares_code_paths_by_syntax_tree():
    """The suite commit is its own code path; the commit before the component flags is not; a commit whose
    only change in the code path is the closing console line (TrainingRun.finish) is."""
    assert rep.same_code_path(rep.SUITE_COMMIT) is True
    assert rep.same_code_path("e53d11f") is False  # before --kl-penalty and the start-of-update statistics
    assert rep.same_code_path("f76bccb") is True  # TrainingRun.finish's closing line only
    assert rep.same_code_path("0" * 40) is None


def test_provenance_at_a_commit_with_the_lab_runner_compares_the_runner(monkeypatch):
    """From issue 48 on, the code the suite's runs execute is rgpo_lab/mujoco_runner (moved from
    mujoco_baselines/, imports and texts changed) and mujoco_baselines/ holds the single-file scripts: at such
    a commit (here the working tree, standing in for one) the suite commit's mujoco_baselines/<file> is
    compared with the runner's <file>, found the same code path; compared with the scripts instead, it is
    not."""
    real_show = rep._git_show

    def show(commit, path):
        if commit != "WORKTREE":
            return real_show(commit, path)
        full = os.path.join(ROOT, path)
        return open(full).read() if os.path.isfile(full) else None

    monkeypatch.setattr(rep, "_git_show", show)
    assert rep.same_code_path("WORKTREE") is True
    monkeypatch.setattr(rep, "RUNNER", "mujoco_baselines")  # no mapping: the suite's files vs the scripts
    assert rep.same_code_path("WORKTREE") is not True
