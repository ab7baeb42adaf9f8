"""The synchronous mismatch report on synthetic run folders: its tests equal scipy's Welch with Holm and the
Welch interval by hand, the words follow the adjusted p-values, a win at a significantly higher KL_ref is
not a win, no ranking cell means no primary family, the gate's first-step share is read per generation
batch, and a partial suite is interim and names what is missing."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from _references import holm_by_hand
from scipy import stats

from rgpo_lab import rlhf_suite
from rgpo_lab import rlhf_sync_mismatch as smm
from rgpo_lab.rlhf_report import sync_mismatch, sync_mismatch_runs

TWO_RANKING = ["sigma4__k1", "sigma1__k4"]
SIX = ("uncorrected", "sequence_mask", "tis", "rgpo", "rgpo_coupled", "rgpo_gate")
LOGGED_STEPS = (
    *range(297, 313),
    *range(393, 401),
)  # either side of the window's start (step 305) and its end


def _metrics(path, k: int, corrected: bool) -> None:
    """A per-step log: the gate rejects 0 at the first step of each batch of k steps, 0.3 at the others,
    and 9 before the window (a window that leaked would show it)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        sampling = ["sampling/importance_sampling_ratio/mean"] if corrected else []
        w.writerow(["iteration", "step", "rgpo/rejected_frac", *sampling])
        for step in LOGGED_STEPS:
            rejected = 9.0 if step <= 304 else (0.0 if (step - 1) % k == 0 else 0.3)
            w.writerow([(step - 1) // k + 1, step, rejected, *([0.8] if corrected else [])])


def _suite(tmp_path, monkeypatch, ranking, gold=None, kl=None, skip=()):
    """precheck.json with ``ranking``, selection.json, and every planned run of v3/sync_mismatch finished
    (but ``skip``): gold[(arm, cell)] mean (default 2.0) with seed noise 0.05, KL_ref likewise (0.1, noise
    0.005). Returns the results folder and {(arm, cell): {seed: (gold, kl_ref)}} as written."""
    monkeypatch.setattr(smm, "OUT", str(tmp_path / "sm"))
    (tmp_path / "sm").mkdir()
    pre = {"complete": True, "ranking_cells": ranking, "a": {}, "b": {}, "sft": [1.1, 1.1, 1.1]}
    (tmp_path / "sm" / "precheck.json").write_text(json.dumps(pre))
    selection = {
        "cells": ["fp32__k4", "sigma0.15__k4"],
        "gold": {a: {"1.25e-5": 1.0, "2.5e-5": 1.5, "5e-5": 1.2} for a in smm.ARMS},
        "selected_lr": {a: "2.5e-5" for a in smm.ARMS},
    }
    (tmp_path / "sm" / "selection.json").write_text(json.dumps(selection))
    results, rng, written = tmp_path / "rlhf", np.random.default_rng(0), {}
    for r in rlhf_suite.SUITE_BUILDERS["v3/sync_mismatch"](str(results)):
        arm, cell = r.tag.split("__", 1)
        if r.name in skip:
            continue
        d = results / "v3" / "sync_mismatch" / r.name
        d.mkdir(parents=True)
        g = (gold or {}).get((arm, cell), 2.0) + rng.normal(0, 0.05)
        k = (kl or {}).get((arm, cell), 0.1) + rng.normal(0, 0.005)
        written.setdefault((arm, cell), {})[r.seed] = (g, k)
        (d / "summary.json").write_text("{}")
        (d / "heldout.json").write_text(json.dumps({"gold": g, "kl_ref": k}))
        _metrics(d / "metrics.csv", int(cell.split("__k")[1]), arm not in ("uncorrected", "rgpo_coupled"))
    return str(results), written


def _welch_ci_by_hand(a, b) -> tuple[float, float]:
    a, b = np.asarray(a), np.asarray(b)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = stats.t.ppf(0.975, df) * np.sqrt(va + vb)
    return a.mean() - b.mean() - half, a.mean() - b.mean() + half


def test_planned_runs_are_the_suites_runs(tmp_path, monkeypatch):
    results, _ = _suite(tmp_path, monkeypatch, TWO_RANKING)
    pre = json.loads((tmp_path / "sm" / "precheck.json").read_text())
    built = rlhf_suite.SUITE_BUILDERS["v3/sync_mismatch"](results)
    assert sorted(n for *_, n in sync_mismatch_runs.planned(pre)) == sorted(r.name for r in built)


def test_primary_family_pools_ranking_cells_and_words_follow_holm(tmp_path, monkeypatch):
    """tis planted +1 gold in both ranking cells (KL_ref as rgpo's), rgpo_gate +1 gold at +0.5 KL_ref, the
    uncorrected arm -1: the first is a win, the second undecided, the third a loss; the others null."""
    gold = {
        (a, c): g for c in TWO_RANKING for a, g in (("tis", 3.0), ("rgpo_gate", 3.0), ("uncorrected", 1.0))
    }
    kl = {("rgpo_gate", c): 0.6 for c in TWO_RANKING}
    results, written = _suite(tmp_path, monkeypatch, TWO_RANKING, gold, kl)
    md = sync_mismatch.build(results, str(tmp_path / "out"))
    v = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    assert v["status"] == "final" and v["arms"] == list(SIX) and "Status: **final**" in md

    def pooled(arm, i):  # per seed the mean over the two ranking cells, from the values written
        return [np.mean([written[(arm, c)][s][i] for c in TWO_RANKING]) for s in range(1, 11)]

    others = [a for a in SIX if a != "rgpo"]
    tests = v["primary"]["tests"]
    ps = [stats.ttest_ind(pooled(a, 0), pooled("rgpo", 0), equal_var=False).pvalue for a in others]
    kl_ps = [stats.ttest_ind(pooled(a, 1), pooled("rgpo", 1), equal_var=False).pvalue for a in others]
    assert [tests[a]["p"] for a in others] == pytest.approx(ps)
    assert [tests[a]["p_holm"] for a in others] == pytest.approx(holm_by_hand(ps))
    assert [tests[a]["kl_p_holm"] for a in others] == pytest.approx(holm_by_hand(kl_ps))
    assert tests["tis"]["gold_diff"] == pytest.approx(np.mean(pooled("tis", 0)) - np.mean(pooled("rgpo", 0)))
    assert tests["tis"]["ci95"] == pytest.approx(_welch_ci_by_hand(pooled("tis", 0), pooled("rgpo", 0)))
    assert tests["tis"]["words"] == "rgpo lower than tis"
    assert tests["uncorrected"]["words"] == "rgpo higher than uncorrected"
    assert tests["rgpo_gate"]["words"] == "rgpo_gate higher gold at a higher KL_ref: undecided"
    null = dict(zip(others, holm_by_hand(ps), strict=True))["sequence_mask"]
    assert null > 0.05 and tests["sequence_mask"]["words"] == (
        f"no significant difference (n = 10 / 10, Holm p = {null:.3f}, smallest detectable "
        f"{tests['sequence_mask']['smallest_detectable']:.3f})"
    )
    from rgpo_lab.statistics import smallest_detectable_difference

    # the simulated Welch test's power point; with 10 seeds a side the noncentral-t form is within 5% of it
    sdd = smallest_detectable_difference(pooled("sequence_mask", 0), pooled("rgpo", 0), 0.05 / 5, 0.8)
    assert tests["sequence_mask"]["smallest_detectable"] == pytest.approx(sdd, rel=0.05)
    # per cell: the secondary family in a ranking cell, descriptive elsewhere, on that cell's runs alone
    cell = v["cells"]["sigma4__k1"]
    assert cell["role"] == "secondary" and v["cells"]["fp32__k1"]["role"] == "descriptive"
    one = [w[0] for w in written[("tis", "sigma4__k1")].values()]
    ref = [w[0] for w in written[("rgpo", "sigma4__k1")].values()]
    assert cell["tests"]["tis"]["p"] == pytest.approx(stats.ttest_ind(one, ref, equal_var=False).pvalue)
    assert "**sigma4__k1** (a ranking cell: the secondary family)" in md
    assert "**fp32__k4** (not a ranking cell: descriptive, it ranks no correction)" in md
    assert "By the rule the ranking cells are sigma4__k1, sigma1__k4" in md
    assert "the SFT policy's test gold 1.100 (n = 3)" in md
    # dose-response: tis at k = 1 over doses 0, 0.15, 4 (its cells at k = 1), the means as written
    curve = v["dose_response"]["tis"]["k1"]
    assert [p["dose"] for p in curve] == [0.0, 0.15, 4.0]
    assert curve[2]["gold"]["mean"] == pytest.approx(np.mean(one)) and curve[2]["gold"]["n"] == 10
    assert (tmp_path / "out" / "dose_response.png").stat().st_size > 0


def test_no_ranking_cell_says_cannot_rank_and_has_no_primary_family(tmp_path, monkeypatch):
    results, _ = _suite(tmp_path, monkeypatch, [], gold={("tis", "sigma0.15__k4"): 3.0})
    assert sync_mismatch.main(["--results", results, "--out", str(tmp_path / "out")]) == 0  # the command
    md = (tmp_path / "out" / "report.md").read_text()
    v = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    assert v["primary"] is None and len(v["arms"]) == 8
    assert "the study **cannot rank corrections**" in md and "**no primary family**" in md
    assert "None: the pre-check found no ranking cell" in md
    assert {c["role"] for c in v["cells"].values()} == {"descriptive"}
    # a planted difference is still tested and its numbers given, but no "higher / lower" in a cell that
    # ranks nothing
    said = v["cells"]["sigma0.15__k4"]["tests"]["tis"]["words"]
    assert said.startswith("difference +") and "descriptive, ranks no correction" in said
    assert "lower" not in said and "higher" not in said
    assert "| 2.5e-5 |" in md and "| tis | 1.000 | 1.500 | 1.200 | 2.5e-5 |" in md


def test_gate_first_step_of_each_batch_and_window(tmp_path, monkeypatch):
    """At k = 4 a quarter of the window's steps open a batch (rejected 0), the rest reject 0.3: first step
    0, every step 0.225; the rows before step 305 (9.0) stay out. TRL's sampling/* only where logged."""
    results, _ = _suite(tmp_path, monkeypatch, [])
    md = sync_mismatch.build(results, str(tmp_path / "out"))
    gate = json.loads((tmp_path / "out" / "verdicts.json").read_text())["gate"]
    assert gate["fp32__k4"]["rgpo"]["first_step_rejected"]["mean"] == pytest.approx(0.0)
    assert gate["fp32__k4"]["rgpo"]["rejected_frac"]["mean"] == pytest.approx(12 * 0.3 / 16)
    assert gate["fp32__k4"]["rgpo"]["rejected_frac"]["n"] == 5
    assert gate["fp32__k1"]["rgpo_coupled"]["rejected_frac"]["mean"] == pytest.approx(0.0)
    assert gate["fp32__k4"]["tis"]["is_mean"]["mean"] == pytest.approx(0.8)
    assert gate["fp32__k4"]["uncorrected"]["is_mean"]["n"] == 0
    assert "| fp32__k4 | rgpo | 0.000 ± 0.000 (5) | 0.225 ± 0.000 (5) |" in md
    assert "| fp32__k4 | uncorrected |" not in md and "| fp32__k4 | tis | - | 0.800 ± 0.000 (5) | - |" in md


def test_partial_suite_is_interim_and_names_missing_and_failed_runs(tmp_path, monkeypatch):
    skip = {"grpo__tis__sigma0.15__k4__s3", "grpo__tis__sigma0.15__k4__s5", "rgpo_old__rgpo__fp32__k1__s2"}
    results, _ = _suite(tmp_path, monkeypatch, [], skip=skip)
    crashed = tmp_path / "rlhf" / "v3" / "sync_mismatch" / "rgpo_old__rgpo__fp32__k1__s2"
    crashed.mkdir(parents=True)
    (crashed / "run.log").write_text("step 3\nTraceback (most recent call last):\nValueError: x\n")
    md = sync_mismatch.build(results, str(tmp_path / "out"))
    v = json.loads((tmp_path / "out" / "verdicts.json").read_text())
    assert v["status"] == "interim" and sorted(v["missing"]) == sorted(f"v3/sync_mismatch/{n}" for n in skip)
    assert v["failed"] == ["v3/sync_mismatch/rgpo_old__rgpo__fp32__k1__s2"]
    assert f"INTERIM: {v['planned'] - 3} of {v['planned']} runs finished" in md
    assert "| sigma0.15__k4 | tis | 2 | s3, s5 |" in md and "## Failed (1" in md
    assert v["cells"]["sigma0.15__k4"]["tests"]["tis"]["n"] == 3
    assert "Interim: every test below is on the runs finished so far." in md


def test_unfinished_precheck_stops_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(smm, "OUT", str(tmp_path))
    with pytest.raises(SystemExit, match="the pre-check has not finished"):
        sync_mismatch.build(str(tmp_path), str(tmp_path / "out"))
