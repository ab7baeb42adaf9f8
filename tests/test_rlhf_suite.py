"""rgpo_lab/rlhf_suite.py: runs, skips finished runs, and resumes from a checkpoint without duplicated
rows."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np

from rgpo_lab.rlhf_report.build import build_report, build_studies
from rgpo_lab.rlhf_report.comparison import gold_vs_sft, overoptimisation, pairwise, table
from rgpo_lab.rlhf_report.dynamics import dynamics
from rgpo_lab.rlhf_report.runs import load, read_rows, window_of
from rgpo_lab.rlhf_report.studies import frontier_interpolation, reuse_tests
from rgpo_lab.statistics import holm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
    return importlib.import_module(f"rgpo_lab.{name}")


def test_suite_runs_skips_and_resumes(tmp_path, quick_assets):
    from conftest import assets_cache_root

    suite = _load("rlhf_suite")
    extra = ("--tiny_quick", "--cache_dir", str(assets_cache_root(quick_assets)))
    options = ("--num_rl_iterations", "3", "--max_completion_length", "8", "--heldout_prompts", "4")
    options += ("--save_strategy", "steps", "--save_steps", "2")
    runs = [suite.RLHFRun("t", "rgpo", 1, "recipes/configs/hh_rlhf_tiny.yaml", options)]
    out = tmp_path / "t" / "rgpo__s1"
    assert suite.run_suite(runs, str(tmp_path), jobs=1, extra=extra, poll=0.5, keep_checkpoints=True) == []
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    summary = json.loads((out / "summary.json").read_text())
    # interrupted after step 6 with its last checkpoint at step 4: drop the end markers, resume
    os.remove(out / "summary.json")
    assert sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))[-1] == "checkpoint-6"
    import shutil

    shutil.rmtree(out / "checkpoint-6")
    assert runs[0].command(str(out))[-2:] == ["--resume_from_checkpoint", str(out / "checkpoint-4")]
    assert suite.run_suite(runs, str(tmp_path), jobs=1, extra=extra, poll=0.5) == []
    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]  # steps 5-6 logged once, after the resume
    assert [r["reward"] for r in resumed[:4:2]] == [r["reward"] for r in rows[:4:2]]
    assert json.loads((out / "summary.json").read_text())["window"] == summary["window"]
    assert not [d for d in os.listdir(out) if d.startswith("checkpoint-")]  # finished: checkpoints deleted
    info = json.loads((out / "run_info.json").read_text())  # one entry per launch: the run and its resume
    assert len(info) == 2 and info[1]["command"][-2:] == ["--cache_dir", extra[-1]]
    assert "--resume_from_checkpoint" in info[1]["command"] and info[0]["versions"]["trl"]
    mtime = os.path.getmtime(out / "summary.json")
    assert suite.run_suite(runs, str(tmp_path), jobs=1, extra=extra, poll=0.5) == []  # finished: skipped
    assert os.path.getmtime(out / "summary.json") == mtime


def test_report_on_a_synthetic_results_folder(tmp_path):
    import numpy as np
    import pytest

    values = {"rgpo": [(1.0, 0.3, 2.0), (2.0, 0.5, 1.0)], "grpo": [(3.0, 1.0, 0.5)]}
    for method, seeds in values.items():
        for seed, (reward, kl, gold) in enumerate(seeds, start=1):
            d = tmp_path / f"{method}__s{seed}"
            d.mkdir()
            (d / "summary.json").write_text(json.dumps({"reward": reward, "kl_ref": kl, "gold": gold}))
            (d / "heldout.json").write_text(json.dumps({"reward": reward + 1, "kl_ref": kl, "gold": gold}))
            rows = [
                {"step": s, "iteration": s, "reward": reward * s, "kl_ref/monitor": kl} for s in (1, 2, 3)
            ]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "ppo__s1").mkdir()  # unfinished: no summary / heldout
    rows = {r["method"]: r for r in table(load(str(tmp_path)))}
    assert rows["rgpo"]["n"] == 2 and rows["rgpo"]["reward"] == pytest.approx(
        (1.5, np.std([1.0, 2.0], ddof=1), 2)
    )
    assert rows["rgpo"]["heldout_reward"][0] == pytest.approx(2.5) and rows["ppo"]["n"] == 0
    text = build_report(str(tmp_path), str(tmp_path / "report"))
    assert "| rgpo | 2 | 1.500 ± 0.707 | not run | 0.400 ± 0.141 | 1.500 ± 0.707 |" in text  # no sft: no gain
    assert "| ppo | 0 | not run |" in text and "| grpo | 1 | 3.000 | not run | 1.000 | 0.500 |" in text
    assert "0.243 / 0.364" in text
    for name in ("curves.png", "pareto_gold.png", "table.json"):
        assert (tmp_path / "report" / name).stat().st_size > 0


def test_report_gold_vs_sft_and_the_overoptimisation_gap(tmp_path):
    """Known numbers in: the Welch interval against its textbook formula, the best bin, and a gap that grows
    with KL_ref by construction (Spearman rho = 1)."""
    import numpy as np
    import pytest
    from scipy import stats

    sft_gold, rgpo_window_gold = [1.0, 1.2, 1.1], [2.0, 1.0, 1.6]
    for seed, gold in enumerate(sft_gold, start=1):
        d = tmp_path / f"sft__s{seed}"
        d.mkdir()
        summary = {"reward": 0.0, "kl_ref": 0.0, "gold": gold, "reward_std": 2.0, "gold_std": 0.5}
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "heldout.json").write_text(json.dumps(summary))
    for seed, gold in enumerate(rgpo_window_gold, start=1):
        d = tmp_path / f"rgpo__s{seed}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"reward": 1.0, "kl_ref": 0.2, "gold": gold}))
        (d / "heldout.json").write_text(json.dumps({"reward": 1.0, "kl_ref": 0.2, "gold": gold}))
        rows = []
        for it in range(1, 76):  # 3 bins of 25 iterations; gold peaks in the second bin
            b = (it - 1) // 25
            kl = 0.1 * (b + 1) + 0.01 * seed
            rows.append(
                {
                    "iteration": it,
                    "step": it,
                    "reward": 40 * kl,
                    "rewards/reward_model/mean": 40 * kl,
                    "kl_ref/monitor": kl,
                    "rewards/gold/mean": [1.5, 2.0 + 0.05 * seed, 1.2][b],
                }
            )
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = load(str(tmp_path))
    (row,) = gold_vs_sft(runs)
    a, b = np.array(rgpo_window_gold), np.array(sft_gold)
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)  # Welch-Satterthwaite
    half = stats.t.ppf(0.975, df) * np.sqrt(va + vb)
    diff = a.mean() - b.mean()  # 1.5333 - 1.1
    assert row["window"] == pytest.approx((diff, diff - half, diff + half))
    assert row["best_bin"] == (26, 50) and row["best"][0] == pytest.approx(2.1 - 1.1)
    assert row["heldout"][0] == pytest.approx(diff)  # held-out golds equal the window golds here
    over = overoptimisation(runs)
    assert over["rho"] == pytest.approx(1.0) and len(over["points"]) == 9
    # the first bin of seed 1: proxy shift (4.4 - 0) / 2 minus gold shift (1.5 - 1.1) / 0.5
    assert over["points"][0][4] == pytest.approx(4.4 / 2 - 0.4 / 0.5)
    text = build_report(str(tmp_path), str(tmp_path / "report"))
    assert "| rgpo | 3 | 1.000 ± 0.000 | 1.000 ± 0.000 | 0.200 ± 0.000 |" in text  # reward - sft reward (0)
    assert "| rgpo | 3 | +0.433 [" in text and "| sft | 3 |" in text and "Spearman rho = +1.000" in text


def test_report_reads_the_same_rows_from_metrics_csv_as_from_metrics_jsonl(tmp_path):
    """results/ keeps metrics.csv only; the report must read from it what the JSONL holds (empty cell: not
    logged at that step)."""
    rows = [
        {"iteration": 1, "step": 1, "reward": 1.5, "kl_ref/monitor": 0.25},
        {"iteration": 1, "step": 2, "loss": -0.125},
    ]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    keys = ["iteration", "step", "reward", "kl_ref/monitor", "loss"]
    lines = [",".join(keys)] + [",".join(str(r.get(k, "")) for k in keys) for r in rows]
    (tmp_path / "b" / "metrics.csv").write_text("\n".join(lines) + "\n")
    assert read_rows(str(tmp_path / "a")) == read_rows(str(tmp_path / "b")) == rows


def test_a_corrupt_run_info_is_refused_with_its_path(tmp_path):
    import pytest

    suite = _load("rlhf_suite")
    path = tmp_path / "run_info.json"
    assert suite.read_run_info(str(path)) == []
    path.write_text('[{"command": ["x"]}')  # cut short
    with pytest.raises(SystemExit, match="run_info.json is not valid JSON"):
        suite.read_run_info(str(path))
    path.write_text('{"command": ["x"]}')
    with pytest.raises(SystemExit, match="should hold a list"):
        suite.read_run_info(str(path))


def test_holm_adjustment_matches_its_hand_computed_values():
    import pytest

    # sorted 0.005 0.01 0.03 0.04 times 4 3 2 1 = 0.02 0.03 0.06 0.04 -> running max 0.02 0.03 0.06 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.2]) == pytest.approx([0.2])


def _write_run(d, summary, heldout, rows=()):
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "heldout.json").write_text(json.dumps(heldout))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_pairwise_tests_are_welch_with_holm_over_each_family(tmp_path):
    import pytest
    from scipy import stats

    gold = {"sft": [1.0, 1.1, 0.9], "rgpo": [2.0, 2.2, 1.9], "ppo": [1.8, 2.1, 1.7], "grpo": [1.2, 1.0, 1.5]}
    for m, values in gold.items():
        for seed, g in enumerate(values, start=1):
            _write_run(
                tmp_path / f"{m}__s{seed}",
                {"reward": 0.0, "kl_ref": 0.1, "gold": g},
                {"reward": 0.0, "kl_ref": 0.1 * seed, "gold": g, "samples_per_prompt": 4},
            )
    tests = pairwise(load(str(tmp_path)), "heldout", "gold")
    assert [(r["a"], r["b"]) for r in tests["vs_sft"]] == [("rgpo", "sft"), ("ppo", "sft"), ("grpo", "sft")]
    assert [(r["a"], r["b"]) for r in tests["rgpo_vs"]] == [("rgpo", "ppo"), ("rgpo", "grpo")]
    p = [stats.ttest_ind(gold["rgpo"], gold[m], equal_var=False).pvalue for m in ("ppo", "grpo")]
    assert [r["p"] for r in tests["rgpo_vs"]] == pytest.approx(p)
    lo, hi = sorted(p)
    expected = {min(p): 2 * lo, max(p): max(2 * lo, hi)}  # Holm with two comparisons
    assert [r["p_holm"] for r in tests["rgpo_vs"]] == pytest.approx([expected[x] for x in p])
    text = build_report(str(tmp_path), str(tmp_path / "report"), plots=False)
    assert "4 sample(s) per held-out prompt" in text and "| rgpo - ppo | 3 / 3 |" in text


def test_study_report_frontier_and_reuse_use_the_final_runs_as_base_point(tmp_path):
    import pytest

    # frontier: rgpo and ppo at beta 0.01 / 0.05 (final) / 0.2; gold = 2 - KL for rgpo, 1.5 - KL for ppo
    for m, offset in (("rgpo", 2.0), ("ppo", 1.5)):
        for beta, kl in (("0.01", 0.6), ("0.05", 0.3), ("0.2", 0.1)):
            for seed in (1, 2):
                d = (
                    tmp_path
                    / ("final" if beta == "0.05" else "frontier")
                    / (f"{m}__s{seed}" if beta == "0.05" else f"{m}__beta{beta}__s{seed}")
                )
                h = {"reward": 1.0, "kl_ref": kl, "gold": offset - kl}
                _write_run(d, {**h, "window": [0, 2]}, h)
    # reuse: rgpo at num_iterations 1 (reuse suite) and 2 (final, above); its KLhat_old comes from
    # summary.json
    for seed in (1, 2):
        rows = [{"iteration": i, "step": i, "rgpo/kl_coef": 0.01} for i in (1, 2)]
        summary = {"reward": 1.0, "kl_ref": 0.2, "gold": 1.0, "kl_old": 1e-7 * seed, "kl_coef": 0.01}
        summary |= {"rejected_frac": 0.0, "window": [0, 2]}
        heldout = {"reward": 1.0, "kl_ref": 0.2, "gold": 1.0}
        _write_run(tmp_path / "reuse" / f"rgpo__reuse1__s{seed}", summary, heldout, rows)
    text = build_studies(str(tmp_path), str(tmp_path / "report"))
    data = json.load(open(tmp_path / "report" / "studies.json"))
    rgpo = {p["value"]: p for p in data["frontier"] if p["method"] == "rgpo"}
    assert (
        rgpo["0.05"]["source"] == "final"
        and rgpo["0.05"]["n"] == 2
        and rgpo["0.2"]["gold"][0] == pytest.approx(1.9)
    )
    # RGPO's curve is PPO's + 0.5 at every KL: +0.5 at each PPO point inside RGPO's KL range
    assert [b["difference"] for b in data["rgpo_at_ppo"]] == pytest.approx([0.5, 0.5, 0.5])
    # identical seeds: every bootstrap resample gives the same difference, so the interval is that point
    assert [x for b in data["rgpo_at_ppo"] for x in (b["low"], b["high"])] == pytest.approx([0.5] * 6)
    reuse1 = next(p for p in data["reuse"] if p["method"] == "rgpo" and p["value"] == "1")
    assert reuse1["kl_old"][0] == pytest.approx(1.5e-7) and reuse1["n"] == 2
    assert "Not run yet" in text and "reuse: grpo at 4" in text  # the reuse methods not run are listed
    reuse_row = (
        "| rgpo | 1 | 2 | 1.000 ± 0.000 | 0.200 ± 0.000 | 1.000 ± 0.000 | 1.50e-07 ± 7.1e-08 "
        "| 0.010 ± 0.000 |"
    )
    assert reuse_row in text
    # num_iterations 2 is the final suite's rgpo runs, which log no KLhat_old, kl_coef or clip fraction here
    assert "| rgpo | 2 | 2 | 1.700 ± 0.000 | 0.300 ± 0.000 | 1.000 ± 0.000 | n/a | n/a | n/a | n/a |" in text
    assert "| grpo | 1 | 0 | not run |" in text

    for name in ("frontier.png", "reuse.png", "reuse_per_iteration.png", "report.md"):
        assert (tmp_path / "report" / name).stat().st_size > 0


def _point(method, value, kl, gold):
    return {
        "method": method,
        "value": value,
        "n": len(gold),
        "kl_ref": (float(np.mean(kl)), 0.0, len(kl)),
        "gold": (float(np.mean(gold)), 0.0, len(gold)),
        "kl_ref_values": kl,
        "gold_values": gold,
    }


def test_frontier_interval_resamples_seeds_of_both_methods():
    import pytest

    # RGPO's curve is noiseless (gold 2 - KL); PPO's point has KL 0.3 on both seeds and gold 1.0 or 1.4. A
    # resample's PPO mean is 1.0 (p 1/4), 1.2 (1/2) or 1.4 (1/4), so the 2.5 / 97.5 percentiles are the
    # extremes: RGPO's 1.7 minus 1.4 and minus 1.0
    points = [_point("rgpo", v, [kl, kl], [2 - kl, 2 - kl]) for v, kl in (("a", 0.1), ("b", 0.6))]
    points.append(_point("ppo", "c", [0.3, 0.3], [1.0, 1.4]))
    (row,) = frontier_interpolation(points, "rgpo", "ppo", n_boot=4000)
    assert row["difference"] == pytest.approx(0.5)
    assert (row["low"], row["high"], row["inside"]) == pytest.approx((0.3, 0.7, 1.0))
    # a PPO point outside RGPO's KL range has no interpolation and no interval
    (row,) = frontier_interpolation([*points[:2], _point("ppo", "d", [0.9, 0.9], [1.0, 1.4])], "rgpo", "ppo")
    assert row["interpolated"] is None and row["low"] is None


def test_reuse_tests_are_welch_with_holm_at_each_reuse_count():
    import pytest
    from scipy import stats

    gold = {
        ("rgpo", "1"): [2.0, 2.1, 1.9],
        ("rgpo", "8"): [1.8, 1.9, 2.0],
        ("grpo", "1"): [1.9, 2.0, 2.2],
        ("grpo", "8"): [1.2, 1.5, 1.3],
        ("ppo_clip_kl", "8"): [1.6, 1.7, 1.5],
    }
    points = [_point(m, v, [0.1] * 3, g) for (m, v), g in gold.items()]
    rows = reuse_tests(points, base="1")
    # the base value's tests are the final suite's
    assert not [r for r in rows if r["kind"] == "vs" and r["value"] == "1"]
    at8 = [r for r in rows if r["kind"] == "vs" and r["value"] == "8"]
    assert [(r["a"], r["b"]) for r in at8] == [("rgpo", "grpo"), ("rgpo", "ppo_clip_kl")]
    p = [
        stats.ttest_ind(gold[("rgpo", "8")], gold[(m, "8")], equal_var=False).pvalue
        for m in ("grpo", "ppo_clip_kl")
    ]
    assert [r["p"] for r in at8] == pytest.approx(p)
    assert [r["p_holm"] for r in at8] == pytest.approx(holm(p))
    change = {r["a"]: r for r in rows if r["kind"] == "change"}
    assert set(change) == {"rgpo", "grpo"}  # ppo_clip_kl has no run at 1 reuse
    assert change["grpo"]["diff"] == pytest.approx(
        np.mean(gold[("grpo", "8")]) - np.mean(gold[("grpo", "1")])
    )
    assert change["grpo"]["p"] == pytest.approx(
        stats.ttest_ind(gold[("grpo", "8")], gold[("grpo", "1")], equal_var=False).pvalue
    )


def test_dynamics_table_reports_window_maximum_early_and_the_learning_rate_share(tmp_path):
    """Per run: the window mean, the maximum over every iteration and the mean over the first 50 iterations of
    KL_ref, KLhat_old and gold, and the window's learning rate over its peak; then mean ± std over seeds."""
    import numpy as np
    import pytest

    n = 80
    for seed in (1, 2):
        rows = [
            {
                "iteration": i,
                "step": i,
                "kl_ref/monitor": 0.001 * i * seed,
                "rgpo/kl_old_iteration": 1e-4 / i,
                "rewards/gold/mean": 1.0 + (i == 30) * seed,
                "learning_rate": 1e-4 * (1 - (i - 1) / n),
                "rgpo/kl_coef": max(0.5 / i, 0.01 * seed),
                "rgpo/rejected_frac": 0.02 * seed * (i == 10),
            }
            for i in range(1, n + 1)
        ]
        _write_run(
            tmp_path / f"rgpo__s{seed}",
            {"reward": 0.0, "kl_ref": 0.1, "gold": 1.0, "window": [60, 80]},
            {"reward": 0.0, "kl_ref": 0.1, "gold": 1.0},
            rows,
        )
    runs = load(str(tmp_path))
    assert window_of(runs) == (60, 80)
    (row,) = dynamics(runs, (60, 80))
    kl_window = [np.mean([0.001 * i * s for i in range(61, 81)]) for s in (1, 2)]
    assert row["kl_ref/monitor"]["window"] == pytest.approx(
        (np.mean(kl_window), np.std(kl_window, ddof=1), 2)
    )
    assert row["kl_ref/monitor"]["max"][0] == pytest.approx(np.mean([0.08, 0.16]))
    assert row["rgpo/kl_old_iteration"]["max"][0] == pytest.approx(1e-4)  # iteration 1
    assert row["rgpo/kl_old_iteration"]["early"][0] == pytest.approx(
        np.mean([1e-4 / i for i in range(1, 51)])
    )
    assert row["rewards/gold/mean"]["max"][0] == pytest.approx(2.5)  # the spike at iteration 30: 2 and 3
    lr_share = np.mean([1 - (i - 1) / n for i in range(61, 81)])
    assert row["lr_window_share"][0] == pytest.approx(lr_share)
    # the controller: kl_coef 0.5 / i until its floor 0.01 * seed; the gate rejected 2% x seed at iteration 10
    coef_window = [np.mean([max(0.5 / i, 0.01 * s) for i in range(61, 81)]) for s in (1, 2)]
    assert row["rgpo/kl_coef"]["window"][0] == pytest.approx(np.mean(coef_window))
    assert row["rgpo/kl_coef"]["min"] == pytest.approx((0.015, np.std([0.01, 0.02], ddof=1), 2))
    assert row["rgpo/rejected_frac"]["max"][0] == pytest.approx(0.03)
    text = build_report(str(tmp_path), str(tmp_path / "report"), plots=False)
    assert "## Training dynamics" in text and "| rgpo | 2 |" in text
    assert "| rgpo | 2 | 0.0150 ± 0.0071 | 0.0150 ± 0.0071 | 0.03 ± 0.014 |" in text
