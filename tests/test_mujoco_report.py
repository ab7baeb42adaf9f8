"""rgpo_lab/mujoco_report/ on a synthetic results folder: known numbers in, known tables out, statistics
checked against scipy."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rgpo_lab.mujoco_report.build import build_report
from rgpo_lab.mujoco_report.paper_tables import (
    aggregate,
    gates_md,
    gates_table,
    kl_md,
    kl_table,
    long_kl_md,
    long_kl_table,
    long_md,
    long_table,
    main_returns_md,
    main_returns_table,
    ppo_kl_md,
)
from rgpo_lab.mujoco_report.policy_lag import policy_lag_scores, policy_lag_tables
from rgpo_lab.mujoco_report.runs import load_runs
from rgpo_lab.mujoco_report.studies import (
    STUDIES,
    ill_conditioned_envs,
    normalised_scores,
    study_aggregate,
    study_contrasts,
    study_md,
    study_table,
    study_tests,
)
from rgpo_lab.statistics import stratified_bootstrap_ci

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_run(
    root, suite, env, method, seed, final_return, kl, variant="default", steps=1_000_000, finished=True
):
    name = f"{env}__{method}__{variant}__s{seed}__{steps // 1000}k"
    d = os.path.join(root, suite, name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(
            {
                "exp_name": f"{method}_continuous_action",
                "env_id": env,
                "seed": seed,
                "total_timesteps": steps,
            },
            f,
        )
    n = len(kl)
    pd.DataFrame(
        {
            "iteration": np.arange(1, n + 1),
            "global_step": 2048 * np.arange(1, n + 1),
            "episodic_return": np.linspace(0, final_return, n),
            "return_last100": np.linspace(0, final_return, n),
            "kl": kl,
            "kl_max": np.asarray(kl) * 2,
            "kl_final": np.asarray(kl) * 1.5,
            "ess": np.full(n, 0.9),
            "grad_var": np.full(n, 1e-3),
            "entropy": np.linspace(1.0, final_return / 100, n),
        }
    ).to_csv(os.path.join(d, "metrics.csv"), index=False)
    if finished:
        with open(os.path.join(d, "final.json"), "w") as f:
            json.dump({"final_return": final_return}, f)


@pytest.fixture()
def results(tmp_path):
    root = str(tmp_path / "results")
    for seed, (ppo, rgpo) in enumerate([(100.0, 300.0), (200.0, 400.0), (300.0, 500.0)]):
        write_run(root, "main", "HalfCheetah-v4", "ppo", seed, ppo, [0.01, 0.05, 0.03, 0.1])
        write_run(root, "main", "HalfCheetah-v4", "rgpo", seed, rgpo, [0.02, 0.02, 0.01, 0.03])
    write_run(root, "main", "Hopper-v4", "ppo", 0, 50.0, [0.01, 0.01])
    write_run(root, "main", "Hopper-v4", "rgpo", 0, 80.0, [0.01, 0.01], finished=False)  # still running
    write_run(root, "gates", "HalfCheetah-v4", "rgpo", 0, 900.0, [0.02] * 30, variant="temperature")
    return root


def test_main_returns_table_and_welch_test(results):
    t = main_returns_table(load_runs(results)).set_index("env")
    hc = t.loc["HalfCheetah-v4"]
    assert (hc.ppo_mean, hc.ppo_std, hc.ppo_n) == (200.0, 100.0, 3)  # sample std, ddof = 1
    assert (hc.rgpo_mean, hc.rgpo_std, hc.rgpo_n) == (400.0, 100.0, 3)
    assert hc.delta_rgpo_vs_ppo == pytest.approx(1.0)
    ref = stats.ttest_ind([300, 400, 500], [100, 200, 300], equal_var=False, alternative="greater")
    assert hc.welch_t == pytest.approx(ref.statistic) and hc.welch_p == pytest.approx(ref.pvalue)
    assert hc.welch_df == pytest.approx(4.0)  # equal variances and n: Welch-Satterthwaite gives 2n - 2
    hop = t.loc["Hopper-v4"]
    assert hop.ppo_n == 1 and np.isnan(hop.ppo_std) and hop.rgpo_n == 0  # unfinished runs do not count
    assert t.loc["Ant-v4"].ppo_n == 0
    md = main_returns_md(t.reset_index())
    assert "400 ± 100 (n=3) / 3006 ± 790" in md and "not run / 709 ± 237" in md and "+100% / -3%" in md


def test_kl_table_both_definitions(results):
    t = kl_table(load_runs(results))
    ppo = t[(t.env == "HalfCheetah-v4") & (t.method == "ppo")].iloc[0]
    assert ppo.n == 3 and ppo.kl_mean == pytest.approx(0.0475) and ppo.kl_max == pytest.approx(0.1)
    assert ppo.spike_rate == pytest.approx(0.5)  # 0.05 and 0.1 exceed 0.04, in every seed
    assert ppo.kl_minibatch_max == pytest.approx(0.2) and ppo.kl_final_mean == pytest.approx(0.07125)
    assert ppo.spike_rate_final == pytest.approx(0.75)  # 1.5 x [0.01, 0.05, 0.03, 0.1]: 3 of 4 above 0.04
    assert "0.0475 / 0.243" in kl_md(t)


def test_aggregate_statistics_against_scipy(results):
    agg = aggregate(load_runs(results), n_boot=500)
    # HalfCheetah only (Hopper's RGPO run is unfinished; Hopper PPO alone still normalises its PPO)
    norm_rgpo = np.array([300, 400, 500]) / 200.0
    assert agg["iqm"]["rgpo"]["iqm"] == pytest.approx(stats.trim_mean(norm_rgpo, 0.25))
    lo, hi = agg["iqm"]["rgpo"]["ci95"]
    assert 1.5 <= lo <= agg["iqm"]["rgpo"]["iqm"] <= hi <= 2.5
    u = stats.mannwhitneyu([300, 400, 500], [100, 200, 300], alternative="greater").statistic
    assert agg["prob_improvement"]["value"] == pytest.approx(u / 9) == pytest.approx(8.5 / 9)


def test_stratified_bootstrap_resamples_within_groups():
    groups = [(np.array([1.0, 1.0]),), (np.array([5.0, 5.0, 5.0]),)]
    lo, hi = stratified_bootstrap_ci(groups, lambda gs: float(np.mean([g[0].mean() for g in gs])), n_boot=200)
    assert lo == hi == 3.0  # each group keeps its own values: the statistic cannot move


def test_gates_window_and_report_files(results, tmp_path):
    gates = gates_table(load_runs(results)).set_index("gate")
    assert gates.loc["temperature"].n == 1 and gates.loc["temperature"].window_return == pytest.approx(
        np.linspace(0, 900, 30)[-20:].mean()
    )
    assert gates.loc["clipped_linear"].n == 0
    out = str(tmp_path / "report")
    text = build_report(results, out, n_boot=200)
    assert "| main | 48 | 7 | 1 | 40 |" in text  # 7 finished, Hopper RGPO in progress, the rest not started
    assert "| clipped_linear | 0 | not run / 3181 | - / -7% |" in text
    for name in (
        "report.md",
        "main_returns.csv",
        "kl_ess.csv",
        "aggregate.json",
        "final_returns.png",
        "curves_kl.png",
        "kl_spectrum.png",
        "gates.png",
    ):
        assert os.path.getsize(os.path.join(out, name)) > 0, name


def test_gates_against_sigmoid_welch(tmp_path):
    """Each gate against sigmoid (main's RGPO, HalfCheetah) on the last-20-iteration window: the change and
    the one-tailed Welch p for sigmoid > gate, against scipy; the paper's change beside it."""
    root = str(tmp_path / "r")
    for seed, (sig, lin) in enumerate([(1000.0, 700.0), (1200.0, 800.0), (1100.0, 1000.0)]):
        write_run(root, "main", "HalfCheetah-v4", "rgpo", seed, sig, [0.02] * 30)
        write_run(root, "gates", "HalfCheetah-v4", "rgpo", seed, lin, [0.02] * 30, variant="clipped_linear")
    t = gates_table(load_runs(root)).set_index("gate")
    window = np.linspace(0, 1, 30)[-20:].mean()  # episodic_return = linspace(0, final, 30)
    ref = stats.ttest_ind(
        np.array([1000, 1200, 1100]) * window,
        np.array([700, 800, 1000]) * window,
        equal_var=False,
        alternative="greater",
    )
    lin = t.loc["clipped_linear"]
    assert lin.p_sigmoid_greater == pytest.approx(ref.pvalue)
    assert lin.vs_sigmoid == pytest.approx(2500 / 3300 - 1)
    assert np.isnan(t.loc["sigmoid"].p_sigmoid_greater) and t.loc["temperature"].n == 0
    md = gates_md(t.reset_index())
    assert (
        f"| clipped_linear | 3 | {lin.window_return:.0f} / 3181 | -24% (p = {ref.pvalue:.2f}) / -7% |" in md
    )
    assert "| temperature | 0 | not run / 1886 | - / -45% |" in md


def test_ppo_kl_table_rows(results):
    """Each setting's row: its run's return and both KL definitions; `default` is main's seed 0; the paper's
    row above; a setting without a finished run is 'not run'."""
    write_run(
        results, "ppo_kl", "HalfCheetah-v4", "ppo", 0, 700.0, [0.01, 0.09, 0.05, 0.2], variant="no_lranneal"
    )
    text = ppo_kl_md(load_runs(results))
    lines = text.splitlines()
    assert "| HalfCheetah-v4 | ppo | paper | 3 | 3107 | 0.243 | 11.59 | 79% | | |" in lines
    # mean 0.0875, max 0.2, 3 of 4 above 0.04; KL_final = 1.5 x: mean 0.13125, 3 of 4 above 0.04
    assert "| HalfCheetah-v4 | ppo | no_lranneal | 1 | 700 | 0.0875 | 0.2000 | 75% | 0.1313 | 75% |" in lines
    # main's seed 0 (return 100, KL 0.01 0.05 0.03 0.1): mean 0.0475, 2 of 4 above 0.04; KL_final 3 of 4
    assert "| HalfCheetah-v4 | ppo | default | 1 | 100 | 0.0475 | 0.1000 | 50% | 0.0713 | 75% |" in lines
    assert "| HalfCheetah-v4 | ppo | all_off | 0 | not run | | | | | |" in lines
    assert "| Walker2d-v4 | ppo | default | 0 | not run | | | | | |" in lines


def test_long_horizon_table_welch_and_figure(tmp_path):
    """The long-horizon table: 1M from `main`'s HalfCheetah runs, 3M / 6M from the `long` suite by budget, an
    unfinished run left out; the one-tailed Welch test against scipy; the curves figure written."""
    root = str(tmp_path / "r")
    for seed, (p1, r1, p3, r3) in enumerate(
        [(1000, 900, 800, 1500), (1200, 950, 700, 1700), (1100, 1000, 900, 1300)]
    ):
        write_run(root, "main", "HalfCheetah-v4", "ppo", seed, p1, [0.05] * 30)
        write_run(root, "main", "HalfCheetah-v4", "rgpo", seed, r1, [0.02] * 30)
        write_run(root, "long", "HalfCheetah-v4", "ppo", seed, p3, [0.2] * 40, steps=3_000_000)
        write_run(root, "long", "HalfCheetah-v4", "rgpo", seed, r3, [0.02] * 40, steps=3_000_000)
    write_run(root, "long", "HalfCheetah-v4", "rgpo", 0, 5000, [0.02] * 10, steps=6_000_000, finished=False)
    write_run(root, "main", "Hopper-v4", "ppo", 0, 3000, [0.02] * 30)  # another env: not in the table
    rows = long_table(load_runs(root))
    assert rows[0] == {"method": "ppo", "1M": [1000, 1200, 1100], "3M": [800, 700, 900], "6M": []}
    assert sorted(rows[1]["3M"]) == [1300, 1500, 1700] and rows[1]["6M"] == []
    md = long_md(rows)
    ref = stats.ttest_ind([1500, 1700, 1300], [800, 700, 900], equal_var=False, alternative="greater")
    assert f"3M: t = {ref.statistic:.2f}" in md and f"p = {ref.pvalue:.3f}" in md
    assert "| rgpo | 950 ± 50 (n=3)" in md and "| not run /" in md
    out = str(tmp_path / "report")
    build_report(root, out, n_boot=50)
    assert os.path.getsize(os.path.join(out, "curves_long.png")) > 0


def test_long_horizon_kl_table_pools_every_iteration_of_a_cell(tmp_path):
    """The long-horizon KL table: per method and budget, mean / max / spike rate over every iteration of the
    cell's finished runs (1M from `main`, 3M / 6M from `long`), by `kl` and by `kl_final`; an unfinished run
    and another environment left out."""
    root = str(tmp_path / "r")
    for seed in range(3):
        write_run(root, "main", "HalfCheetah-v4", "ppo", seed, 1000, [0.01, 0.05, 0.03, 0.1])
    write_run(root, "long", "HalfCheetah-v4", "ppo", 0, 2000, [0.2, 0.02], steps=3_000_000)
    write_run(root, "long", "HalfCheetah-v4", "ppo", 1, 2000, [0.3, 0.3], steps=6_000_000, finished=False)
    write_run(root, "main", "Hopper-v4", "rgpo", 0, 3000, [0.5, 0.5])  # another env: not in the table
    rows = {(r["method"], r["budget"]): r for r in long_kl_table(load_runs(root))}
    one = rows[("ppo", 1)]
    assert one["n"] == 3 and one["kl_mean"] == pytest.approx(0.0475) and one["kl_max"] == pytest.approx(0.1)
    assert one["spike_rate"] == pytest.approx(0.5)  # 0.05 and 0.1 of [0.01, 0.05, 0.03, 0.1] exceed 0.04
    assert one["kl_final_mean"] == pytest.approx(0.07125) and one["spike_rate_final"] == pytest.approx(0.75)
    three = rows[("ppo", 3)]
    assert three["n"] == 1 and three["kl_mean"] == pytest.approx(0.11) and three["spike_rate"] == 0.5
    assert three["kl_final_mean"] == pytest.approx(0.165)  # 1.5 x [0.2, 0.02]
    assert rows[("ppo", 6)]["n"] == 0 and rows[("rgpo", 1)]["n"] == 0
    md = long_kl_md(list(rows.values()))
    assert "| ppo | 1M | 3 | 0.0475 | 0.1000 | 50% | 0.0713 | 75% |" in md
    assert "| ppo | 6M | 0 | not run | | | | |" in md


def test_study_pools_suites_and_tests_against_the_reference_arm(tmp_path):
    """The 'annealed' study pools main_compiled's seeds 0-2 with annealed5's 3-4; training and evaluation
    returns, Welch two-sided against scipy, the std ratio, and the aggregate IQM / probability of improvement
    by hand."""
    root = str(tmp_path / "results")
    ppo, rgpo = [100.0, 200.0, 300.0, 260.0, 240.0], [150.0, 250.0, 100.0, 400.0, 330.0]
    for seed in range(5):
        suite = "main_compiled" if seed < 3 else "annealed5"
        for method, value in (("ppo", ppo[seed]), ("rgpo", rgpo[seed])):
            write_run(root, suite, "Hopper-v4", method, seed, value, [0.02, 0.03])
            if suite == "annealed5":  # only the new runs have a deterministic evaluation
                path = os.path.join(
                    root, suite, f"Hopper-v4__{method}__default__s{seed}__1000k", "final.json"
                )
                json.dump({"final_return": value, "eval_return_mean": 2 * value}, open(path, "w"))
    write_run(root, "annealed5", "Ant-v4", "ppo", 3, 50.0, [0.01], finished=False)  # running: not counted
    write_run(root, "annealed5", "Ant-v4", "rgpo", 4, 50.0, [0.01], finished=False)
    open(
        os.path.join(root, "annealed5", "Ant-v4__rgpo__default__s4__1000k", "metrics.csv"), "w"
    ).close()  # just started
    runs = load_runs(root)
    rows = {r["arm"]: r for r in study_table(runs, STUDIES["annealed"]) if r["env"] == "Hopper-v4"}
    assert rows["ppo"]["n"] == 5 and rows["rgpo"]["seeds"] == [0, 1, 2, 3, 4]
    assert rows["rgpo"]["train"] == pytest.approx((np.mean(rgpo), np.std(rgpo, ddof=1), 5))
    assert rows["rgpo"]["eval"] == pytest.approx((2 * np.mean(rgpo[3:]), 2 * np.std(rgpo[3:], ddof=1), 2))
    ref = stats.ttest_ind(rgpo, ppo, equal_var=False)
    t, df, p = rows["rgpo"]["train_vs_ref"][:3]
    assert (t, p) == pytest.approx((ref.statistic, ref.pvalue)) and 4 < df < 8
    assert rows["rgpo"]["std_ratio"] == pytest.approx(np.std(rgpo, ddof=1) / np.std(ppo, ddof=1))
    assert rows["rgpo"]["train_diff"] == pytest.approx(np.mean(rgpo) / np.mean(ppo) - 1)
    ent = np.array(rgpo) / 100  # the last iteration's entropy of each run
    assert rows["rgpo"]["entropy"] == pytest.approx((ent.mean(), ent.std(ddof=1), 5))
    agg = study_aggregate(runs, STUDIES["annealed"], n_boot=200)
    norm = np.array(rgpo) / np.mean(ppo)
    assert agg["rgpo"]["iqm"] == pytest.approx(stats.trim_mean(norm, 0.25))
    pairs = [(x > y) + 0.5 * (x == y) for x in rgpo for y in ppo]
    assert agg["rgpo"]["p_improvement"] == pytest.approx(np.mean(pairs))
    lo, hi = agg["rgpo"]["iqm_ci95"]
    assert lo <= agg["rgpo"]["iqm"] <= hi
    text = build_report(root, str(tmp_path / "out"), n_boot=50)
    assert "When does RGPO help? annealed" in text and "| Ant-v4 | ppo | 0 | not run |" in text
    assert os.path.exists(tmp_path / "out" / "return_vs_movement.png")
    assert os.path.exists(tmp_path / "out" / "performance_profile_annealed.png")


def test_kl_budget_contrast_tests_capped_ppo_against_rgpo_at_its_default_budget(tmp_path):
    """The kl_budget study's extra pair: PPO with target_kl 0.03 (kl_budget suite) against RGPO at target 0.02
    (main_compiled's seeds 0-2 only), Welch two-sided against scipy, each arm's mean KL over its iterations;
    Holm over the study's family (here the contrast is the only training test with two runs a side)."""
    root = str(tmp_path / "results")
    capped, rgpo = [900.0, 1100.0, 1300.0], [700.0, 650.0, 900.0]
    for seed in range(3):
        write_run(
            root, "kl_budget", "Ant-v4", "ppo", seed, capped[seed], [0.03, 0.01], variant="targetkl0.03"
        )
        write_run(root, "main_compiled", "Ant-v4", "rgpo", seed, rgpo[seed], [0.02, 0.02 + seed / 100])
    write_run(root, "annealed5", "Ant-v4", "rgpo", 3, 5000.0, [0.5])  # seed 3: not in the study's seeds 0-2
    (row,) = [c for c in study_contrasts(load_runs(root), STUDIES["kl_budget"]) if c["env"] == "Ant-v4"]
    assert (row["a"], row["b"]) == ("ppo, target_kl 0.03", "rgpo, target 0.02")
    ref = stats.ttest_ind(capped, rgpo, equal_var=False)
    assert (row["train"][0], row["train"][2]) == pytest.approx((ref.statistic, ref.pvalue))
    assert row["diff"] == pytest.approx(np.mean(capped) / np.mean(rgpo) - 1)
    assert row["kl_a"] == pytest.approx(0.02) and row["kl_b"] == pytest.approx(
        np.mean([0.02, 0.02, 0.02, 0.03, 0.02, 0.04])
    )
    assert np.isnan(row["eval"][0])  # no evaluation in these runs: no test, not a zero
    _, contrasts = study_tests(load_runs(root), STUDIES["kl_budget"])
    (tested,) = [c for c in contrasts if c["env"] == "Ant-v4"]
    assert tested["train_p_holm"] == pytest.approx(ref.pvalue)  # a family of one test
    assert tested["train_verdict"] == ("higher" if ref.pvalue <= 0.05 else "no significant difference")
    md = study_md(load_runs(root), STUDIES["kl_budget"], n_boot=50)
    assert (
        f"{ref.statistic:.2f} / " in md
        and "| HalfCheetah-v4 | ppo, target_kl 0.03 | rgpo, target 0.02 | not run |" in md
    )


def test_minmax_aggregate_is_added_where_the_reference_mean_is_near_zero(tmp_path):
    """With a reference mean within one std of 0 (constant-rate PPO on Ant), dividing by it is meaningless:
    the report flags the environment and adds a min-max aggregate (worst run of the study in that environment
    -> 0, best -> 1), checked against a hand computation; P(arm > reference) compares runs within an
    environment, so it is the same under both normalisations."""
    root = str(tmp_path / "results")
    ant_ppo, ant_rgpo = [-40.0, 5.0, 45.0], [20.0, 50.0, 35.0]  # PPO's mean 3.3, std 42.5
    hc_ppo, hc_rgpo = [1000.0, 1200.0, 1400.0], [1100.0, 1500.0, 1300.0]
    for seed in range(3):
        for env, ppo, rgpo in (("Ant-v4", ant_ppo, ant_rgpo), ("HalfCheetah-v4", hc_ppo, hc_rgpo)):
            for method, value in (("ppo", ppo[seed]), ("rgpo", rgpo[seed])):
                write_run(root, "constant_lr", env, method, seed, value, [0.02], variant="constant_lr")
    runs = load_runs(root)
    study = STUDIES["constant_lr"]
    assert ill_conditioned_envs(runs, study) == ["Ant-v4"]
    mm = normalised_scores(runs, study, scale="minmax")
    assert mm["rgpo"]["Ant-v4"] == pytest.approx((np.array(ant_rgpo) + 40) / 90)
    assert mm["ppo"]["HalfCheetah-v4"] == pytest.approx((np.array(hc_ppo) - 1000) / 500)
    agg_mm = study_aggregate(runs, study, n_boot=100, scale="minmax")
    hand = np.concatenate([(np.array(ant_rgpo) + 40) / 90, (np.array(hc_rgpo) - 1000) / 500])
    assert agg_mm["rgpo"]["iqm"] == pytest.approx(stats.trim_mean(hand, 0.25))
    agg_ref = study_aggregate(runs, study, n_boot=100)
    assert agg_ref["rgpo"]["iqm"] == pytest.approx(
        stats.trim_mean(
            np.concatenate([np.array(ant_rgpo) / np.mean(ant_ppo), np.array(hc_rgpo) / 1200]), 0.25
        )
    )
    assert agg_mm["rgpo"]["p_improvement"] == pytest.approx(agg_ref["rgpo"]["p_improvement"])
    text = study_md(runs, study, n_boot=50)
    assert "min-max normalised per environment" in text and "within one std of 0 on Ant-v4" in text
    with pytest.raises(ValueError, match="scale"):
        normalised_scores(runs, study, scale="zscore")


def test_policy_lag_study_follows_its_reading_rule(tmp_path):
    """The policy-lag rule on known numbers: L = 0 from main_compiled + annealed5 (shared by the decoupled
    arms), the RGPO-vs-PPO family at L = 8 with Holm over 4 tests (scipy's Welch p, Holm by hand), the change
    from L = 0 and the retention family; staleness columns averaged over iterations."""
    root = str(tmp_path / "results")
    env = "Walker2d-v4"
    l0 = {"ppo": [1000.0, 1100.0, 900.0, 1050.0, 950.0], "rgpo": [800.0, 900.0, 1000.0, 850.0, 950.0]}
    l8 = {
        "lag8": {"ppo": [200.0, 300.0, 250.0, 220.0, 280.0], "rgpo": [700.0, 750.0, 800.0, 650.0, 720.0]},
        "lag8_decoupled": {
            "ppo": [900.0, 800.0, 850.0, 950.0, 870.0],
            "rgpo": [820.0, 760.0, 900.0, 780.0, 840.0],
        },
    }

    def finish(suite, method, variant, seed, value):
        path = os.path.join(root, suite, f"{env}__{method}__{variant}__s{seed}__1000k", "final.json")
        json.dump({"final_return": value / 2, "eval_return_mean": value}, open(path, "w"))

    for method, values in l0.items():
        for seed, v in enumerate(values):
            suite = "main_compiled" if seed < 3 else "annealed5"
            write_run(root, suite, env, method, seed, v / 2, [0.02, 0.02])
            finish(suite, method, "default", seed, v)
    for variant, by_method in l8.items():
        for method, values in by_method.items():
            for seed, v in enumerate(values):
                write_run(root, "policy_lag", env, method, seed, v / 2, [0.05, 0.07], variant=variant)
                finish("policy_lag", method, variant, seed, v)
    d = os.path.join(root, "policy_lag", f"{env}__rgpo__lag8__s0__1000k", "metrics.csv")
    m = pd.read_csv(d)
    m["behaviour_ratio_max"], m["rejected_frac"] = [1.0, 3.0], [0.1, 0.3]
    m.to_csv(d, index=False)

    t = policy_lag_tables(load_runs(root))
    summary = {(r["env"], r["lag"], r["arm"]): r for r in t["summary"]}
    assert summary[env, 0, "ppo decoupled"]["eval"] == pytest.approx(
        (np.mean(l0["ppo"]), np.std(l0["ppo"], ddof=1), 5)
    )
    assert summary[env, 8, "rgpo"]["behaviour_ratio_max"] == 3.0
    assert summary[env, 8, "rgpo"]["rejected_frac"] == pytest.approx(0.2)  # one run has the column
    fam = [r for r in t["pairs"] if r["env"] == env and r["lag"] == 8 and r["metric"] == "eval"]
    arms = {
        "rgpo": l8["lag8"]["rgpo"],
        "rgpo decoupled": l8["lag8_decoupled"]["rgpo"],
        "ppo": l8["lag8"]["ppo"],
        "ppo decoupled": l8["lag8_decoupled"]["ppo"],
    }
    raw = [stats.ttest_ind(arms[r["a"]], arms[r["b"]], equal_var=False).pvalue for r in fam]
    assert [r["test"].p for r in fam] == pytest.approx(raw)
    order = np.argsort(raw)
    expected, running = [0.0] * 4, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (4 - rank) * raw[i]))
        expected[i] = running
    assert [r["p_holm"] for r in fam] == pytest.approx(expected)
    by_pair = {(r["a"], r["b"]): r for r in fam}
    assert by_pair["rgpo", "ppo"]["verdict"] == "higher"
    assert by_pair["rgpo", "ppo decoupled"]["verdict"] == "lower"
    change = {r["arm"]: r for r in t["change"] if r["env"] == env}
    assert change["ppo"]["verdict"] == "lower"  # 1000 -> 250
    retention = {(r["a"], r["b"]): r for r in t["robustness"] if r["env"] == env}
    r = retention["rgpo", "ppo"]
    assert r["test"].ratio_a == pytest.approx(np.mean(l8["lag8"]["rgpo"]) / np.mean(l0["rgpo"]))
    assert r["test"].ratio_b == pytest.approx(np.mean(l8["lag8"]["ppo"]) / np.mean(l0["ppo"]))
    assert r["verdict"] == "more robust"  # 0.81 of its L = 0 return kept against PPO's 0.25
    # the family's Holm p from its bootstrap p-values, by hand
    raw = [retention[k]["test"].p for k in retention]
    order, running, expected = np.argsort(raw), 0.0, [0.0] * len(raw)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(raw) - rank) * raw[i]))
        expected[i] = running
    assert [retention[k]["p_holm"] for k in retention] == pytest.approx(expected)
    scores = policy_lag_scores(load_runs(root))  # min-max over every run of the study
    every = [v for d in (l0, l8["lag8"], l8["lag8_decoupled"]) for vs in d.values() for v in vs]
    lo, hi = min(every), max(every)
    assert scores["rgpo"][env] == pytest.approx((np.array(l8["lag8"]["rgpo"]) - lo) / (hi - lo))
    assert scores["ppo"][env].min() == pytest.approx(0.0)  # PPO at L = 8 holds the worst run
    text = build_report(root, str(tmp_path / "out"), n_boot=20, plots=True)
    assert "## Stale samples (policy lag)" in text and "fixed before the runs" in text
    assert (tmp_path / "out" / "performance_profile_policy_lag.png").exists()
    assert (tmp_path / "out" / "curves_policy_lag.png").exists()
    pairs = json.load(open(tmp_path / "out" / "studies.json"))["policy_lag"]["pairs"]  # strict JSON
    walker = [r["test"]["p"] for r in pairs if r["env"] == env and r["lag"] == 8 and r["metric"] == "eval"]
    assert walker == pytest.approx([r["test"].p for r in fam])
    assert all(r["test"]["p"] is None for r in pairs if r["env"] != env)  # no runs: null, not NaN
