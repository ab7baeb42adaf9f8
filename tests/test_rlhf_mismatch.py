"""The mismatch study's design (rgpo_lab.rlhf_mismatch): the statistics of the calibration, the pre-check's
decision and ladder, and the suites built from the committed calibration and pre-check."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rgpo_lab import rlhf_mismatch as mm
from rgpo_lab import rlhf_suite


def test_mismatch_stats_by_hand():
    pi = np.log(np.array([0.5, 0.5, 0.5, 0.5]))
    mu = np.log(np.array([0.5, 0.4, 0.2, 0.9]))  # r = 1, 1.25, 2.5, 0.5556
    s = mm.mismatch_stats(mu, pi)
    r = np.array([1.0, 1.25, 2.5, 0.5 / 0.9])
    assert s["outside_0.9_1.1"] == 0.75 and s["outside_0.5_2"] == 0.25
    assert s["below_gate_rejection"] == 0.25  # r < 0.5606: g = sigmoid(5 (r - 1)) < 0.1
    assert s["ratio_max"] == pytest.approx(2.5)
    assert s["abs_log_ratio_mean"] == pytest.approx(np.abs(np.log(r)).mean())
    assert s["k3_kl"] == pytest.approx((r - 1 - np.log(r)).mean())


def _runs(golds, kls=None):
    kls = kls or [0.1] * len(golds)
    return [
        {"seed": i + 1, "gold": g, "kl_ref": k, "diverged": False}
        for i, (g, k) in enumerate(zip(golds, kls, strict=True))
    ]


def test_precheck_decision_hurt_by_lower_gold_or_divergence_not_by_higher_gold():
    control = _runs([2.0, 2.1, 1.9])
    low = mm.precheck_decision(control, _runs([1.0, 1.1, 0.9]))
    assert low["gold_lower"] and low["hurt"] and low["p"] < 0.05
    high = mm.precheck_decision(control, _runs([3.0, 3.1, 2.9]))
    assert not high["hurt"]  # significantly different, but not lower: the dose did not hurt
    same = mm.precheck_decision(control, _runs([2.0, 2.05, 1.95]))
    assert not same["hurt"] and same["diverged_seeds"] == []
    blown = mm.precheck_decision(control, _runs([2.0, 2.05, 1.95], [0.1, 1.5, 0.1]))  # 15x the control KL
    assert blown["hurt"] and blown["diverged_seeds"] == [2]


def test_precheck_ladder_stops_at_the_first_rung_that_hurts():
    assert mm.precheck_tags(None) == ["fp32", "sigma1"]
    not_hurt = {"rungs": [{"sigma": 1.0, "state": "decided", "hurt": False}]}
    assert mm.precheck_tags(not_hurt) == ["fp32", "sigma1", "sigma2"]
    two = {
        "rungs": [
            {"sigma": 1.0, "state": "decided", "hurt": False},
            {"sigma": 2.0, "state": "decided", "hurt": True},
        ]
    }
    assert mm.precheck_tags(two) == ["fp32", "sigma1", "sigma2"]
    all_rungs = {"rungs": [{"sigma": s, "state": "decided", "hurt": False} for s in mm.PRECHECK_LADDER]}
    assert mm.precheck_tags(all_rungs) == ["fp32", "sigma1", "sigma2", "sigma4", "sigma8"]


def _precheck_runs(tmp_path, golds_by_tag: dict[str, list[float]]):
    """Finished pre-check runs of the ignore arm (test gold per seed, KL_ref 0.1) under tmp_path/rlhf."""
    results = tmp_path / "rlhf"
    for tag, golds in golds_by_tag.items():
        for seed, g in zip(mm.PRECHECK_SEEDS, golds, strict=True):
            d = results / "v3" / "mismatch_precheck" / f"ignore__{tag}__s{seed}"
            d.mkdir(parents=True)
            (d / "heldout.json").write_text(json.dumps({"gold": g, "kl_ref": 0.1}))
    return results


def test_precheck_reads_runs_and_decides(tmp_path):
    results = _precheck_runs(tmp_path, {"fp32": [2.0, 2.1, 1.9], "sigma1": [1.0, 1.1, 0.9]})
    r = mm.precheck(str(results), str(tmp_path / "out"))
    assert r["hurt_at"] == 1.0 and r["passed"] and r["complete"]
    assert json.loads((tmp_path / "out" / "precheck.json").read_text())["hurt_at"] == 1.0


def test_suites_follow_the_calibration_and_the_precheck(tmp_path, monkeypatch):
    monkeypatch.setattr(mm, "OUT", str(tmp_path))
    with pytest.raises(SystemExit, match="calibration first"):
        rlhf_suite._mismatch("results")
    (tmp_path / "calibration.json").write_text(
        json.dumps({"calibrated_sigma": 0.15, "bf16_is_a_cell": False})
    )
    with pytest.raises(SystemExit, match="pre-check first"):
        rlhf_suite._mismatch("results")
    (tmp_path / "precheck.json").write_text(json.dumps({"complete": True, "hurt_at": 2.0}))
    runs = rlhf_suite._mismatch("results")
    cells = {r.tag.split("__")[1] for r in runs}
    assert cells == {"fp32", "int8", "sigma0.5", "sigma1.0", "top_p0.9", "sigma0.15_calibrated", "sigma2"}
    assert len(runs) == len(cells) * len(mm.ARMS) * len(mm.SEEDS)
    run = next(r for r in runs if r.tag == "rgpo__sigma2" and r.seed == 1)
    assert run.method == "rgpo_mu" and run.extra[-2:] == ("--sampler_logit_noise", "2")
    for flag, value in (
        ("--learning_rate", "5e-5"),
        ("--lr_scheduler_type", "constant"),
        ("--rollout_lag", "1"),
    ):
        assert run.extra[run.extra.index(flag) + 1] == value
    lag = rlhf_suite._mismatch_lag("results")
    assert {r.tag.split("__")[1] for r in lag} == {"lag8", "lag32"} and len(lag) == 2 * 8 * 5
    r32 = next(r for r in lag if r.tag.endswith("lag32"))
    assert r32.extra[r32.extra.index("--max_staleness") + 1] == "32"


def test_precheck_markdown_says_passed_failed_or_in_progress(tmp_path):
    results = _precheck_runs(tmp_path, {"fp32": [2.0, 2.1, 1.9], "sigma1": [2.0, 2.1, 2.2]})
    r = mm.precheck(str(results), str(tmp_path / "out"))
    assert not r["complete"] and r["rungs"][-1] == {"sigma": 2.0, "state": "not run"}
    md = (tmp_path / "out" / "precheck.md").read_text()
    assert "In progress" in md and "| sigma 1 | 2.100 ± 0.100 (3) |" in md and "| sigma 2 | not run yet" in md
