"""The mismatch report on synthetic runs: tests equal scipy's Welch with Holm by hand, the matched-KL rule,
cells where ignore is not hurt say they cannot rank, and a partial study is interim."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from _references import holm_by_hand
from scipy import stats

from rgpo_lab import rlhf_mismatch as mm
from rgpo_lab.rlhf_report import (
    mismatch,
    mismatch_figures,
    mismatch_markdown,
    mismatch_runs,
    mismatch_verdicts,
)
from rgpo_lab.rlhf_suite import SUITE_BUILDERS


def _study(tmp_path, monkeypatch, gold, kl=None, skip=()):
    """Finished runs of both suites: gold[(arm, cell)] = mean (default 2.0), seed noise 0.05."""
    monkeypatch.setattr(mm, "OUT", str(tmp_path / "mm"))
    (tmp_path / "mm").mkdir()
    (tmp_path / "mm" / "calibration.json").write_text(
        json.dumps({"calibrated_sigma": 0.15, "bf16_is_a_cell": False})
    )
    (tmp_path / "mm" / "precheck.json").write_text(json.dumps({"complete": True, "hurt_at": 1.0}))
    results = tmp_path / "rlhf"
    rng = np.random.default_rng(0)
    for suite in ("v3/mismatch", "v3/mismatch_lag"):
        for r in SUITE_BUILDERS[suite](str(results)):
            if r.name in skip:
                continue
            arm, cell = r.tag.split("__")
            d = results / suite / r.name
            d.mkdir(parents=True)
            g = gold.get((arm, cell), 2.0) + rng.normal(0, 0.05)
            k = (kl or {}).get((arm, cell), 0.1) + rng.normal(0, 0.005)
            (d / "heldout.json").write_text(json.dumps({"gold": g, "kl_ref": k}))
            with open(d / "metrics.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["iteration", "rgpo/rejected_frac", "mismatch/outside_0.5_2", "rewards/gold/mean"])
                for it in (300, 350, 400):
                    w.writerow([it, 0.1 if it > 304 else 9.0, 0.2, g + it / 1000])
    return str(results)


def test_tests_match_scipy_and_holm_and_matched_kl(tmp_path, monkeypatch):
    gold = {("ignore", "sigma1.0"): 1.0, ("tis", "sigma1.0"): 2.5, ("icepop", "sigma1.0"): 2.5}
    kl = {("icepop", "sigma1.0"): 0.5}  # icepop wins on gold but at a much higher KL_ref
    results = _study(tmp_path, monkeypatch, gold, kl)
    md = mismatch.build(results, str(tmp_path / "out"))
    s = json.loads((tmp_path / "out" / "studies.json").read_text())
    data, missing, failed = mismatch_runs.load(results)
    assert missing == [] and failed == [] and "Status: **final**" in md
    cell = s["cells"]["sigma1.0"]["vs_rgpo"]
    arms = [a for a in mm.ARMS if a != "rgpo"]
    ps = [
        stats.ttest_ind(
            mismatch_runs.values(data, "sigma1.0", a),
            mismatch_runs.values(data, "sigma1.0", "rgpo"),
            equal_var=False,
        ).pvalue
        for a in arms
    ]
    assert [cell[a]["p_holm"] for a in arms] == pytest.approx(holm_by_hand(ps))
    assert cell["ignore"]["verdict"] == "rgpo higher than ignore"
    assert cell["tis"]["verdict"] == "rgpo lower than tis"
    assert cell["icepop"]["verdict"] == "icepop higher gold at a higher KL_ref: undecided"
    assert s["cells"]["sigma1.0"]["best_peer"] in ("tis", "icepop")
    # ignore is hurt only at sigma 1.0: the other cells say they cannot rank
    assert s["hurt"]["sigma1.0"]["ranks"] and not s["hurt"]["int8"]["ranks"]
    assert "**int8** (ignore is not hurt here (n = 5 vs 5, Holm p = 1.000): this cell cannot rank" in md
    assert "**fp32** (the control: this cell cannot rank the corrections)" in md
    # the across-cell families: each suite's cells (INTERPRETATION.md)
    assert s["families"][1] == ["lag8", "lag32"]
    assert sorted(s["families"][0]) == sorted(c for c in data if c not in ("fp32", "lag8", "lag32"))
    assert set(s["hurt"]["lag8"]["family"]) == {"lag8", "lag32"}
    assert s["changes"]["ignore"]["sigma1.0"]["verdict"] == "lower"
    assert data["fp32"]["rgpo"][0]["window"]["rejected_frac"] == pytest.approx(0.1)  # window: steps 305-400
    peer = s["cells"]["sigma1.0"]["best_peer"]  # read from rgpo's side: rgpo is lower than the best peer
    expected = {
        "tis": "rgpo lower than tis (gold -0.",
        "icepop": "icepop higher gold at a higher KL_ref: undecided (gold -0.",
    }
    assert f"rgpo against the best peer ({peer}): {expected[peer]}" in md
    gold_curve = dict(data["fp32"]["tis"][0]["curves"]["gold"])
    assert gold_curve[400] - gold_curve[300] == pytest.approx(0.1)
    assert mismatch_figures.binned([(1, 1.0), (20, 3.0), (21, 5.0)]) == {20: 2.0, 40: 5.0}
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0 and (tmp_path / "out" / "gate.png").exists()


def test_partial_study_is_interim(tmp_path, monkeypatch):
    skip = {"rgpo_mu__rgpo__lag32__s5"}
    results = _study(tmp_path, monkeypatch, {}, skip=skip)
    md = mismatch.build(results, str(tmp_path / "out"))
    assert "INTERIM" in md and "| v3/mismatch_lag | lag32 | 1 | s5 |" in md
    studies = json.loads((tmp_path / "out" / "studies.json").read_text())
    assert studies["missing"] == ["v3/mismatch_lag/rgpo_mu__rgpo__lag32__s5"]


def test_untested_hurt_is_not_called_not_hurt(tmp_path, monkeypatch):
    """With one finished ignore run in a cell, whether ignore is hurt there is not tested, and the report
    says so instead of "not hurt"."""
    skip = {f"ignore__ignore__int8__s{seed}" for seed in (2, 3, 4, 5)}
    results = _study(tmp_path, monkeypatch, {}, skip=skip)
    md = mismatch.build(results, str(tmp_path / "out"))
    hurt = json.loads((tmp_path / "out" / "studies.json").read_text())["hurt"]
    assert hurt["int8"]["state"] == "not tested" and hurt["sigma0.5"]["state"] == "not hurt"
    assert "**int8** (whether ignore is hurt is not tested yet" in md


def test_ignore_significantly_higher_is_not_hurt_and_says_higher(tmp_path, monkeypatch):
    """A small Holm p beside "not hurt" where ignore's gold is above fp32 says "higher" (not nearly hurt)."""
    results = _study(tmp_path, monkeypatch, {("ignore", "lag32"): 3.0})
    md = mismatch.build(results, str(tmp_path / "out"))
    hurt = json.loads((tmp_path / "out" / "studies.json").read_text())["hurt"]
    assert hurt["lag32"]["state"] == "not hurt" and hurt["lag32"]["p_holm"] <= 0.05
    assert "**lag32** (ignore is not hurt here, its gold higher (n = 5 vs 5" in md
    assert "| not hurt: higher (" in next(x for x in md.splitlines() if x.startswith("| lag32 | "))
    assert "**lag8** (ignore is not hurt here (n = 5 vs 5" in md


def test_matched_kl_words_name_the_winner():
    """The rule's words from rgpo's side; a win at a significantly higher KL_ref is the winner's, named."""
    w = mismatch_verdicts.matched_kl_words
    assert w("tis", 0.3, 0.01, 0.0, 0.9) == "rgpo lower than tis"
    assert w("tis", -0.3, 0.01, 0.0, 0.9) == "rgpo higher than tis"
    assert w("tis", 0.3, 0.01, 0.5, 0.01) == "tis higher gold at a higher KL_ref: undecided"
    assert w("tis", -0.3, 0.01, -0.5, 0.01) == "rgpo higher gold at a higher KL_ref: undecided"
    assert w("tis", -0.3, 0.01, 0.5, 0.01) == "rgpo higher than tis"  # rgpo wins at a lower KL_ref
    assert w("tis", 0.3, 0.01, 0.5, float("nan")) == "tis higher gold, KL_ref not testable: undecided"
    assert w("tis", 0.3, 0.2, 0.5, 0.01) == "no significant difference"
    row = {"gold_diff_vs_rgpo": 0.3, "n": 5, "n_rgpo": 4, "p_holm": 0.0496, "verdict": "rgpo lower than tis"}
    assert (
        mismatch_markdown._against_peer("tis", row)
        == "rgpo lower than tis (gold -0.300, n = 4 / 5, Holm p = 0.0496)"
    )


def test_crashed_runs_are_failed_and_diverged_runs_named(tmp_path, monkeypatch):
    """A run folder whose run.log ends in a traceback is listed as failed (the report stays interim); a
    finished run with test KL_ref above 10x its arm's fp32 mean stays in the tests and is named."""
    kl = {("rgpo", "sigma1.0"): 5.0}  # 50x rgpo's fp32 mean of 0.1
    results = _study(tmp_path, monkeypatch, {}, kl=kl, skip={"tis__tis__int8__s3"})
    crashed = tmp_path / "rlhf" / "v3" / "mismatch" / "tis__tis__int8__s3"
    crashed.mkdir(parents=True)
    (crashed / "run.log").write_text("step 3\nTraceback (most recent call last):\nValueError: kl\n")
    md = mismatch.build(results, str(tmp_path / "out"))
    s = json.loads((tmp_path / "out" / "studies.json").read_text())
    assert s["failed"] == ["v3/mismatch/tis__tis__int8__s3"] and s["status"] == "interim"
    assert "## Failed (1" in md and "INTERIM" in md
    assert s["diverged"]["sigma1.0"] == [f"rgpo s{seed}" for seed in mm.SEEDS]
    assert s["cells"]["sigma1.0"]["vs_rgpo"]["tis"]["n_rgpo"] == len(mm.SEEDS)  # diverged runs stay in


def test_every_arm_against_the_best_peer_is_holm_over_the_other_arms(tmp_path, monkeypatch):
    """The issue's "every arm against the best peer" (INTERPRETATION.md, 6): scipy's Welch against the best
    peer's runs, Holm over the seven other arms, the matched-KL words from the peer's side."""
    gold = {("tis", "sigma1.0"): 2.6, ("rgpo", "sigma1.0"): 1.0, ("rgpo_gate", "sigma1.0"): 2.55}
    results = _study(tmp_path, monkeypatch, gold)
    md = mismatch.build(results, str(tmp_path / "out"))
    s = json.loads((tmp_path / "out" / "studies.json").read_text())
    data, _, _ = mismatch_runs.load(results)
    cell = s["cells"]["sigma1.0"]
    assert cell["best_peer"] == "tis"
    rows = cell["vs_best_peer"]
    arms = [a for a in mm.ARMS if a != "tis"]
    assert list(rows) == arms
    tis = mismatch_runs.values(data, "sigma1.0", "tis")
    ps = [
        stats.ttest_ind(mismatch_runs.values(data, "sigma1.0", a), tis, equal_var=False).pvalue for a in arms
    ]
    assert [rows[a]["p_holm"] for a in arms] == pytest.approx(holm_by_hand(ps))
    assert rows["rgpo"]["gold_diff"] == pytest.approx(
        np.mean(mismatch_runs.values(data, "sigma1.0", "rgpo")) - np.mean(tis)
    )
    assert rows["rgpo"]["verdict"] == "tis higher than rgpo"
    assert rows["ignore"]["verdict"] == "tis higher than ignore"  # ignore at 2.0 against tis at 2.6
    assert rows["rgpo_gate"]["verdict"] == "no significant difference"
    line = next(x for x in md.splitlines() if x.startswith("| sigma1.0 (cell does not rank) | tis |"))
    assert "(best peer)" in line and "tis higher than rgpo" in line and "rgpo_gate" not in line.split("|")[-2]


def test_sensitivity_section_gate_shares_detectable_differences_and_resumed_runs(tmp_path, monkeypatch):
    """Added after the final reading (issue 55): every gate arm's rejected share, the smallest detectable
    difference of each test at alpha 0.05 / m of its Holm family (statistics' function, checked there by
    simulation), and a run whose run_info.json lists a resumed launch, named with its checkpoint."""
    from rgpo_lab.statistics import smallest_detectable_difference

    results = _study(tmp_path, monkeypatch, {("tis", "sigma1.0"): 2.6})
    run = tmp_path / "rlhf" / "v3" / "mismatch" / "tis__tis__int8__s3"
    launch = {"command": ["python", "recipes/hh_rlhf_qwen.py", "--seed", "3"], "git_commit": "abc"}
    resumed = {**launch, "command": [*launch["command"], "--resume_from_checkpoint", f"{run}/checkpoint-200"]}
    (run / "run_info.json").write_text(json.dumps([launch, resumed]))
    md = mismatch.build(results, str(tmp_path / "out"))
    sens = json.loads((tmp_path / "out" / "studies.json").read_text())["sensitivity"]
    data, _, _ = mismatch_runs.load(results)
    assert sens["rejected"]["fp32"]["rgpo_gate"] == pytest.approx([0.1] * 5)  # window steps 305-400 only
    assert set(sens["rejected"]["fp32"]) == {"rgpo", "rgpo_gate", "rgpo_dual"}
    family = next(f for f in mismatch_verdicts.families(data) if "int8" in f)
    expected = smallest_detectable_difference(
        mismatch_runs.values(data, "int8", "ignore"),
        mismatch_runs.values(data, "fp32", "ignore"),
        0.05 / len(family),
        0.8,
    )
    assert sens["detectable_change_from_control"]["ignore"]["int8"] == pytest.approx(expected)
    expected = smallest_detectable_difference(
        mismatch_runs.values(data, "sigma1.0", "rgpo_gate"),
        mismatch_runs.values(data, "sigma1.0", "tis"),
        0.05 / 7,
        0.8,
    )
    assert sens["detectable_vs_best_peer"]["sigma1.0"]["rgpo_gate"] == pytest.approx(expected)
    assert sens["resumed"] == {"tis int8 s3": ["checkpoint-200"]}
    assert "(1; run_info.json lists each launch): tis int8 s3 (from checkpoint-200)." in md
    assert md.index("## Each arm's change of gold") < md.index("## Sensitivity (added ")
    assert "after the final reading; not in RULES.md, decides nothing" in md
