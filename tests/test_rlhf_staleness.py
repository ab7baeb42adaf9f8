"""The staleness study's report on synthetic runs: rules A-C and the verdict against scipy and hand values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from rgpo_lab.rlhf_report import staleness
from rgpo_lab.rlhf_report.build import build_studies
from rgpo_lab.rlhf_report.runs import load
from rgpo_lab.statistics import holm

# test gold per seed: rgpo keeps its gold as S grows, grpo loses it; cispo has two seeds at S = 16 only
GOLD = {
    ("rgpo", 1): [2.00, 2.10, 1.90],
    ("rgpo", 4): [2.05, 1.95, 2.00],
    ("rgpo", 16): [1.98, 2.02, 2.00, 1.96, 2.04],
    ("grpo", 1): [2.00, 2.05, 1.95],
    ("grpo", 16): [1.50, 1.55, 1.45, 1.60, 1.40],
    ("cispo", 16): [1.90, 2.10],
}
KL = {("rgpo", 1): 0.1, ("rgpo", 4): 0.2, ("rgpo", 16): 0.3, ("grpo", 1): 0.1, ("grpo", 16): 0.2}
KL[("cispo", 16)] = 0.5  # outside RGPO's KL range


def _write(root, method, level, seed, gold, kl):
    d = root / "stale_sync" / f"{method}__S{level}__s{seed}"
    d.mkdir(parents=True)
    window = [304 // level, 400 // level]
    rows = []
    for it in range(1, 400 // level + 1):
        for k in range(level):
            step = (it - 1) * level + k + 1
            row = {"iteration": it, "step": step, "behaviour/ratio_mean": 1.0 + 0.01 * k}
            row |= {"behaviour/ratio_max": 1.0 + 0.1 * k + (5.0 if step == 390 else 0.0)}
            row |= {"behaviour/beyond_1.2": 0.02 * k, "behaviour/beyond_2": 0.0, "behaviour/kl_old": 1e-4 * k}
            if method == "rgpo":
                row |= {"rgpo/kl_coef": 0.01, "rgpo/rejected_frac": 0.0}
            rows.append(row)
    (d / "summary.json").write_text(json.dumps({"window": window, "gold": gold, "kl_ref": kl}))
    (d / "heldout.json").write_text(json.dumps({"gold": gold, "kl_ref": kl, "reward": 1.0}))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def study(tmp_path):
    for (m, level), values in GOLD.items():
        for seed, g in enumerate(values, start=1):
            # KL_ref varies a little with the seed so the bootstrap has something to resample
            _write(tmp_path, m, level, seed, g, KL[(m, level)] * (1 + 0.01 * (seed - 3)))
    return tmp_path


def test_staleness_tests_follow_the_reading_rule(study):
    runs = load(str(study / "stale_sync"))
    points = staleness.staleness_points(runs, "stale_sync")
    tests = {t["method"]: t for t in staleness.staleness_tests(points, "stale_sync")}
    # A: two-sided Welch at S = 16, Holm over the methods that have runs there (grpo, cispo)
    p = {
        m: stats.ttest_ind(GOLD[("rgpo", 16)], GOLD[(m, 16)], equal_var=False).pvalue
        for m in ("grpo", "cispo")
    }
    # Holm over the rule's whole family (rgpo_old, grpo, cispo, sapo): the two not yet testable count as p = 1
    adjusted = dict(zip(p, holm([*p.values(), 1.0, 1.0])[:2], strict=True))
    for m in ("grpo", "cispo"):
        assert tests[m]["a_p"] == pytest.approx(p[m]) and tests[m]["a_p_holm"] == pytest.approx(adjusted[m])
    assert adjusted["grpo"] == pytest.approx(4 * p["grpo"])  # the smallest of 4
    assert np.isnan(tests["sapo"]["a_p"]) and np.isnan(tests["sapo"]["a_p_holm"])
    assert tests["sapo"]["verdict"].startswith("undecided")
    # B's change family: every method's Welch change, RGPO's own included (5 methods), Holm over all of them
    changes = {
        m: stats.ttest_ind(GOLD[(m, 16)], GOLD[(m, 1)], equal_var=False).pvalue for m in ("rgpo", "grpo")
    }
    b_adjusted = holm([1.0, changes["grpo"], 1.0, 1.0, changes["rgpo"]])  # rgpo_old grpo cispo sapo rgpo
    assert tests["grpo"]["b_p_holm"] == pytest.approx(b_adjusted[1])
    assert tests["rgpo"]["b_p_holm"] == pytest.approx(b_adjusted[4])
    # B: grpo's change from S = 1 to 16, and RGPO's change minus grpo's (a difference of differences)
    change = np.mean(GOLD[("grpo", 16)]) - np.mean(GOLD[("grpo", 1)])
    assert tests["grpo"]["b_change"] == pytest.approx(change)
    rgpo_change = np.mean(GOLD[("rgpo", 16)]) - np.mean(GOLD[("rgpo", 1)])
    assert tests["grpo"]["b_diff"] == pytest.approx(rgpo_change - change)
    assert tests["rgpo"]["b_change"] == pytest.approx(rgpo_change)
    # C: grpo at S = 16 sits at KL_ref ~0.2, where RGPO's curve passes through its S = 4 point
    c = tests["grpo"]["c"]
    rgpo_kl = [
        np.mean([KL[("rgpo", s)] * (1 + 0.01 * (i - 3)) for i in range(1, len(GOLD[("rgpo", s)]) + 1)])
        for s in (1, 4, 16)
    ]
    grpo_kl = np.mean([0.2 * (1 + 0.01 * (i - 3)) for i in range(1, 6)])
    expected = np.interp(grpo_kl, rgpo_kl, [np.mean(GOLD[("rgpo", s)]) for s in (1, 4, 16)])
    assert c["rgpo_gold"] == pytest.approx(expected)
    assert c["difference"] == pytest.approx(expected - np.mean(GOLD[("grpo", 16)]))
    assert c["low"] > 0 and tests["grpo"]["verdict"] == "RGPO is more robust to staleness than grpo"
    # cispo's point lies outside RGPO's KL range: no matched-KL interval, so undecided whatever A says
    assert tests["cispo"]["c"]["rgpo_gold"] is None and tests["cispo"]["verdict"].startswith("undecided")


def test_window_metrics_and_the_section(study):
    runs = load(str(study / "stale_sync"))
    points = staleness.staleness_points(runs, "stale_sync")
    p16 = next(p for p in points if p["method"] == "rgpo" and p["level"] == 16)
    # window = iterations 20-25 = steps 305-400: the mean over the batch's 16 steps,
    # the largest incl. step 390
    assert p16["r_mean"].mean == pytest.approx(1.0 + 0.01 * 7.5)
    assert p16["r_max"].mean == pytest.approx(1.0 + 0.1 * 5 + 5.0)  # step 390 is the 6th of its batch
    assert p16["kl_coef"].mean == pytest.approx(0.01) and p16["clip_frac"].n == 0
    text = build_studies(str(study), str(study / "report"))
    assert "## Stale samples (staleness study)" in text and "stale samples" in text.splitlines()[0]
    assert "| sapo | 16 | 0 | not run | not run |" in text
    assert "Runs finished: 21 of 55." in text
    # the gate on r_old rejected nothing and the controller sat at its floor
    assert "rgpo at S = 16: the gate on r_old rejected no token" in text
    assert "the KL-to-old controller stayed at its floor" in text
    data = json.load(open(study / "report" / "studies.json"))
    assert {t["method"] for t in data["staleness"]["stale_sync"]["tests"]} == {
        "rgpo_old",
        "grpo",
        "cispo",
        "sapo",
        "rgpo",
    }
    for name in ("stale_sync.png", "stale_sync_per_step.png"):
        assert (study / "report" / name).stat().st_size > 0


def _row(a_diff, a_p_holm, low, high, method="grpo"):
    return {"method": method, "a_diff": a_diff, "a_p_holm": a_p_holm, "c": {"low": low, "high": high}}


def test_the_verdict_words_of_the_rule():
    v = staleness.verdict
    assert v(_row(+0.3, 0.01, 0.1, 0.5)) == "RGPO is more robust to staleness than grpo"
    assert v(_row(-0.3, 0.01, -0.5, -0.1)) == "grpo is more robust to staleness than RGPO"
    assert v(_row(+0.1, 0.40, -0.2, 0.3)) == "no difference"
    # A significant but C's interval contains 0, or A not significant but C excludes 0: undecided
    assert v(_row(+0.3, 0.01, -0.1, 0.5)) == "undecided"
    assert v(_row(+0.1, 0.40, 0.1, 0.3)) == "undecided"
    assert v(_row(+0.1, float("nan"), 0.1, 0.3)).startswith("undecided")
    assert v(_row(+0.3, 0.01, None, None)) == "undecided (no matched-KL interval)"


def test_async_runs_read_the_async_trainers_keys(tmp_path):
    """AsyncRGPOTrainer logs r_b as rgpo/ratio_old_*, the staleness per trained token and the gate on r_old
    apart (dual); TRL's AsyncGRPOTrainer only the mean ratio and its k3 KL to the behaviour policy."""
    for m in ("rgpo", "grpo"):
        d = tmp_path / "stale_async" / f"{m}__L8__s1"
        d.mkdir(parents=True)
        rows = []
        for step in range(1, 401):
            row = {"iteration": step, "step": step}
            if m == "rgpo":
                row |= {"rgpo/ratio_old_mean": 1.01, "rgpo/ratio_old_max": 2.0 + step / 400}
                row |= {
                    "rgpo/ratio_old_beyond_1.2": 0.05,
                    "rgpo/ratio_old_beyond_2": 0.01,
                    "rgpo/kl_old": 0.002,
                }
                row |= {"rgpo/rejected_frac": 0.03, "rgpo/rejected_frac_old": 0.01, "rgpo/kl_coef": 0.4}
                row |= {"rgpo/ref_ratio_larger_frac": 0.25 + 0.5 * (step > 352), "rgpo/gate_mean": 0.6}
                row |= {"staleness/mean": 8.0, "sample/staleness_mean": 7.0}
            else:
                row |= {
                    "ratio": 1.02,
                    "kl": 0.003,
                    "clip_ratio/region_mean": 0.1,
                    "sample/staleness_mean": 7.0,
                }
            rows.append(row)
        (d / "summary.json").write_text(json.dumps({"window": [304, 400]}))
        (d / "heldout.json").write_text(json.dumps({"gold": 1.0, "kl_ref": 0.1, "reward": 1.0}))
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = load(str(tmp_path / "stale_async"))
    points = {p["method"]: p for p in staleness.staleness_points(runs, "stale_async") if p["level"] == 8}
    rgpo, grpo = points["rgpo"], points["grpo"]
    assert rgpo["r_mean"].mean == pytest.approx(1.01) and rgpo["r_max"].mean == pytest.approx(3.0)
    assert rgpo["r_beyond_1.2"].mean == pytest.approx(0.05) and rgpo["kl_old"].mean == pytest.approx(0.002)
    assert rgpo["rejected_old"].mean == pytest.approx(0.01)  # the r_old gate's share, not the dual gate's
    assert rgpo["staleness"].mean == pytest.approx(8.0)  # the trained tokens' own
    assert grpo["r_mean"].mean == pytest.approx(1.02) and grpo["kl_old"].mean == pytest.approx(0.003)
    assert grpo["r_max"].n == 0 and grpo["staleness"].mean == pytest.approx(7.0)
    assert grpo["clip_frac"].mean == pytest.approx(0.1)
    text = staleness.gate_acted(list(points.values()), "stale_async")
    assert "rgpo at L = 8: the gate on r_old rejected tokens (share 0.010)" in text
    assert "the KL-to-old controller left its floor (kl_coef 0.400" in text
    # the dual gate's pi/pi_ref side, over the window (steps 305-400: half of them at 0.75)
    assert rgpo["ref_larger"].mean == pytest.approx(0.5) and grpo["ref_larger"].n == 0
    assert "Its dual gate as a whole rejected a share 0.030" in text
    assert "was the ratio to pi_ref on a share 0.500 of the tokens; mean gate weight 0.600." in text
