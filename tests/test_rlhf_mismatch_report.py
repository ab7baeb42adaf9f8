"""The mismatch report on synthetic runs: tests equal scipy's Welch with Holm by hand, the matched-KL rule,
cells where ignore is not hurt say they cannot rank, and a partial study is interim."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from scipy import stats

from rgpo_lab import rlhf_mismatch as mm
from rgpo_lab import rlhf_mismatch_report as rep
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
                w.writerow(["iteration", "rgpo/rejected_frac", "mismatch/outside_0.5_2"])
                for it in (300, 350, 400):
                    w.writerow([it, 0.1 if it > 304 else 9.0, 0.2])
    return str(results)


def test_tests_match_scipy_and_holm_and_matched_kl(tmp_path, monkeypatch):
    gold = {("ignore", "sigma1.0"): 1.0, ("tis", "sigma1.0"): 2.5, ("icepop", "sigma1.0"): 2.5}
    kl = {("icepop", "sigma1.0"): 0.5}  # icepop wins on gold but at a much higher KL_ref
    results = _study(tmp_path, monkeypatch, gold, kl)
    md = rep.build(results, str(tmp_path / "out"))
    s = json.loads((tmp_path / "out" / "studies.json").read_text())
    data, missing = rep.load(results)
    assert missing == [] and "Status: **final**" in md
    cell = s["cells"]["sigma1.0"]["vs_rgpo"]
    arms = [a for a in mm.ARMS if a != "rgpo"]
    ps = [
        stats.ttest_ind(
            rep._values(data, "sigma1.0", a), rep._values(data, "sigma1.0", "rgpo"), equal_var=False
        ).pvalue
        for a in arms
    ]
    m = len(ps)
    order, adjusted, running = np.argsort(ps), [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    assert [cell[a]["p_holm"] for a in arms] == pytest.approx(adjusted)
    assert cell["ignore"]["verdict"] == "lower" and cell["tis"]["verdict"] == "higher"
    assert cell["icepop"]["verdict"] == "higher gold at a higher KL_ref: undecided"
    assert s["cells"]["sigma1.0"]["best_peer"] in ("tis", "icepop")
    # ignore is hurt only at sigma 1.0: the other cells say they cannot rank
    assert s["hurt"]["sigma1.0"]["ranks"] and not s["hurt"]["int8"]["ranks"]
    assert "**int8** (ignore is not hurt here: this cell cannot rank the corrections)" in md
    assert s["changes"]["ignore"]["sigma1.0"]["verdict"] == "lower"
    assert data["fp32"]["rgpo"][0]["window"]["rejected_frac"] == pytest.approx(0.1)  # window: steps 305-400


def test_partial_study_is_interim(tmp_path, monkeypatch):
    skip = {"rgpo_mu__rgpo__lag32__s5"}
    results = _study(tmp_path, monkeypatch, {}, skip=skip)
    md = rep.build(results, str(tmp_path / "out"))
    assert "INTERIM" in md and "v3/mismatch_lag/rgpo_mu__rgpo__lag32__s5" in md
