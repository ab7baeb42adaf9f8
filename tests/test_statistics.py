"""rgpo_lab.statistics against scipy and hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from rgpo_lab.statistics import (
    aggregate_difference,
    change_difference_test,
    holm,
    iqm,
    mean_probability_of_improvement,
    mean_std,
    normalised_score,
    optimality_gap,
    performance_profile,
    pooled_iqm,
    probability_of_improvement,
    ratio_difference_test,
    simulated_detectable_difference,
    smallest_detectable_difference,
    standardised_difference,
    stratified_bootstrap_ci,
    stratified_resamples,
    verdict,
    welch,
)


def test_mean_std_uses_the_sample_std_and_skips_non_finite_values():
    assert mean_std([1.0, 2.0, 4.0, float("nan")]) == pytest.approx((7 / 3, math.sqrt(7 / 3), 3))
    one = mean_std([5.0])
    assert one.mean == 5.0 and math.isnan(one.std) and one.n == 1
    assert mean_std([]).n == 0


def test_welch_matches_scipy_and_the_satterthwaite_df_by_hand():
    a, b = [1.0, 2.0, 3.0, 5.0], [2.0, 4.0, 9.0]
    w = welch(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert (w.t, w.p) == pytest.approx((ref.statistic, ref.pvalue))
    va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 3
    assert w.df == pytest.approx((va + vb) ** 2 / (va**2 / 3 + vb**2 / 2))
    assert w.diff == pytest.approx(np.mean(a) - np.mean(b))
    one_sided = welch(a, b, alternative="less")
    assert one_sided.p == pytest.approx(ref.pvalue / 2)  # t < 0
    assert math.isnan(welch([1.0], b).p) and welch([1.0], b).diff == pytest.approx(1.0 - 5.0)


def test_holm_by_hand():
    # m = 4: sorted 0.01, 0.02, 0.03, 0.2 -> 0.04, 0.06, 0.06 (monotone), 0.2
    assert holm([0.03, 0.01, 0.2, 0.02]) == pytest.approx([0.06, 0.04, 0.2, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    out = holm([0.01, float("nan"), 0.04])  # nan is not a test: m = 2
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert holm([]) == []


def test_verdict_follows_the_corrected_p_in_both_directions():
    assert verdict(3.0, 0.01) == "higher" and verdict(-3.0, 0.01) == "lower"
    assert verdict(-3.0, 0.2) == "no significant difference"
    assert verdict(1.0, float("nan")).startswith("not tested")


def test_iqm_and_probability_of_improvement_by_hand():
    assert iqm([1, 2, 3, 4, 5, 6, 7, 100]) == pytest.approx(np.mean([3, 4, 5, 6]))
    assert probability_of_improvement([1, 3], [2, 2]) == pytest.approx(0.5)
    assert probability_of_improvement([2], [2]) == pytest.approx(0.5)
    x, y = np.array([3.0, 5.0, 1.0]), np.array([2.0, 4.0])
    u = stats.mannwhitneyu(x, y).statistic
    assert probability_of_improvement(x, y) == pytest.approx(u / 6)


def test_stratified_bootstrap_never_mixes_groups():
    groups = [(np.array([0.0, 0.0]),), (np.array([10.0, 10.0, 10.0]),)]
    lo, hi = stratified_bootstrap_ci(groups, lambda gs: float(np.mean([g[0].mean() for g in gs])), n_boot=100)
    assert lo == hi == 5.0


def test_stratified_resamples_draw_a_then_b_within_each_group_from_one_rng():
    """Each resample: every group of a, then every group of b, resampled within itself by default_rng(seed)
    in that order (the scheme aggregate_difference and standardised_difference share)."""
    a, b = [np.array([1.0, 2.0]), np.array([10.0, 20.0, 30.0])], [np.array([-1.0, -2.0, -3.0])]
    rng = np.random.default_rng(7)
    for ra, rb in stratified_resamples(a, b, n_boot=5, seed=7):
        expected = [g[rng.integers(0, len(g), len(g))] for g in (*a, *b)]
        for got, want in zip((*ra, *rb), expected, strict=True):
            np.testing.assert_array_equal(got, want)
    assert len(list(stratified_resamples(a, b, n_boot=3, seed=0))) == 3


def test_pooled_iqm_and_mean_probability_of_improvement_by_hand():
    groups = [(np.array([1.0, 2.0, 3.0, 4.0]),), (np.array([5.0, 6.0, 7.0, 100.0]),)]
    assert pooled_iqm(groups) == pytest.approx(np.mean([3, 4, 5, 6]))
    pairs = [(np.array([1.0, 3.0]), np.array([2.0, 2.0])), (np.array([5.0]), np.array([1.0]))]
    assert mean_probability_of_improvement(pairs) == pytest.approx((0.5 + 1.0) / 2)


def test_performance_profile_spans_every_run_and_its_band_contains_it():
    scores = [np.array([0.1, 0.5, 0.9]), np.array([2.0, 31.0])]
    prof = performance_profile(scores, n_boot=300)
    assert prof.taus[0] < 0.1 and prof.taus[-1] > 31.0  # no run off the axis
    assert prof.fraction[0] == 1.0 and prof.fraction[-1] == 0.0
    assert np.all(prof.low <= prof.fraction + 1e-12) and np.all(prof.fraction <= prof.high + 1e-12)
    i = int(np.argmin(np.abs(prof.taus - 1.0)))
    # rliable: the mean over environments of each one's fraction (0 of 3 and 2 of 2 above tau = 1: 0.5, not
    # 2/5)
    assert prof.fraction[i] == pytest.approx(np.mean([(s > prof.taus[i]).mean() for s in scores])) == 0.5


def test_ratio_difference_test_resamples_every_sample():
    rng = np.random.default_rng(1)
    a0, a8 = rng.normal(1000, 100, 5), rng.normal(900, 100, 5)  # keeps 90%
    b0, b8 = rng.normal(1000, 100, 5), rng.normal(300, 100, 5)  # keeps 30%
    t = ratio_difference_test(a0, a8, b0, b8, n_boot=4000)
    assert t.ratio_a == pytest.approx(a8.mean() / a0.mean()) and t.ratio_b == pytest.approx(
        b8.mean() / b0.mean()
    )
    assert t.diff == pytest.approx(t.ratio_a - t.ratio_b) and t.low <= t.diff <= t.high
    assert t.p < 0.01 and t == ratio_difference_test(a0, a8, b0, b8, n_boot=4000)  # seeded
    same = ratio_difference_test(a0, a8, a0, a8, n_boot=4000)  # one arm against itself: no difference
    assert same.diff == 0 and same.p > 0.5
    # the denominators' noise counts: a noisier L = 0 sample widens the interval
    wide = ratio_difference_test(a0 + rng.normal(0, 400, 5), a8, b0, b8, n_boot=4000)
    assert wide.high - wide.low > t.high - t.low
    assert np.isnan(ratio_difference_test([1.0], a8, b0, b8).p)  # fewer than 2 runs: not tested
    assert np.isnan(ratio_difference_test(-a0, a8, b0, b8).p)  # a non-positive L = 0 mean: not tested


def test_change_difference_test_against_a_normal_approximation():
    rng = np.random.default_rng(2)
    a1, a16 = rng.normal(2.0, 0.1, 3), rng.normal(1.9, 0.1, 5)  # a loses 0.1
    b1, b16 = rng.normal(2.0, 0.1, 3), rng.normal(1.2, 0.1, 5)  # b loses 0.8
    t = change_difference_test(a1, a16, b1, b16, n_boot=20_000)
    assert t.change_a == pytest.approx(a16.mean() - a1.mean())
    assert t.diff == pytest.approx((a16.mean() - a1.mean()) - (b16.mean() - b1.mean()))
    # the bootstrap's spread of a difference of four means: sqrt(sum of the plug-in variances / n)
    se = math.sqrt(sum(x.var() / len(x) for x in (a1, a16, b1, b16)))
    assert (t.high - t.low) / (2 * 1.96) == pytest.approx(se, rel=0.1)
    assert t.p < 0.001 and t == change_difference_test(a1, a16, b1, b16, n_boot=20_000)  # seeded
    same = change_difference_test(a1, a16, a1, a16, n_boot=2000)
    assert same.diff == 0 and same.p > 0.5
    assert np.isnan(change_difference_test([1.0], a16, b1, b16).p)  # fewer than 2 values: not tested


def test_optimality_gap_by_hand():
    assert optimality_gap([0.2, 1.5, 0.9, -0.4]) == pytest.approx((0.8 + 0 + 0.1 + 1.4) / 4)
    assert optimality_gap([2.0, 3.0]) == 0.0


def test_normalised_score_by_hand_with_the_atari_reference_scores():
    # DQN Zoo's Atari-57 random / human scores (results/atari/sanity/RULES.md): Breakout 1.7 / 30.5, Pong
    # -20.7 / 14.6; halfway is 1.7 + 28.8 / 2 = 16.1 and -20.7 + 35.3 / 2 = -3.05
    assert normalised_score([1.7, 16.1, 30.5, 59.3], 1.7, 30.5) == pytest.approx([0.0, 0.5, 1.0, 2.0])
    assert normalised_score([-21.0, -3.05, 21.0], -20.7, 14.6) == pytest.approx(
        [-0.3 / 35.3, 0.5, 41.7 / 35.3]
    )
    assert float(normalised_score(-0.24, -0.24, 2056.67)) == 0.0
    with pytest.raises(ValueError, match="high must be > low"):
        normalised_score([1.0], 30.5, 1.7)


def test_aggregate_difference_pools_environments_and_resamples_within_each():
    """The point estimate is the IQM of the pooled scores; the stratified bootstrap's interval for a
    difference of pooled means matches the normal approximation from the per-environment variances, and a
    resample never moves a run between environments (a constant shift of one environment stays exact)."""
    rng = np.random.default_rng(0)
    a = [rng.normal(1.2, 0.2, 10), rng.normal(0.9, 0.2, 10), rng.normal(1.0, 0.2, 10)]
    b = [rng.normal(0.7, 0.2, 10), rng.normal(0.5, 0.2, 10), rng.normal(0.6, 0.2, 10)]
    t = aggregate_difference(a, b, n_boot=4000)
    assert t.a == pytest.approx(stats.trim_mean(np.concatenate(a), 0.25))
    assert t.diff == pytest.approx(t.a - t.b) and t.low < t.diff < t.high and t.p < 0.01
    m = aggregate_difference(a, b, statistic=np.mean, n_boot=20_000)
    se = math.sqrt(sum(x.var() / len(x) for x in (*a, *b))) / 3
    assert (m.high - m.low) / (2 * 1.96) == pytest.approx(se, rel=0.1)
    same = aggregate_difference(a, a, n_boot=2000)
    assert same.diff == 0 and same.p > 0.5
    # within-environment resampling: two arms that differ by 0.3 in every run of every environment
    shifted = aggregate_difference([x + 0.3 for x in a], a, statistic=np.mean, n_boot=200)
    assert shifted.diff == pytest.approx(0.3) and shifted.p < 0.05
    assert np.isnan(aggregate_difference([a[0][:1]], [b[0]]).p)  # fewer than 2 runs: not tested


def _with_sd(sd: float, n: int = 5, shift: float = 0.0) -> np.ndarray:
    """n values with sample standard deviation exactly ``sd``."""
    x = np.arange(n, dtype=float)
    return shift + sd * (x - x.mean()) / x.std(ddof=1)


def test_smallest_detectable_difference_has_the_asked_power_by_simulation():
    """Equal spreads: Welch's df is Student's 2n - 2, so Student's t-test simulated at the returned
    difference rejects at the asked rate (an exact reference); unequal spreads: near the textbook
    (t_{1-alpha/2} + t_{power}) SE, and simulated Welch tests reject at about the asked rate."""
    rng = np.random.default_rng(1)
    alpha = 0.05 / 6
    delta = smallest_detectable_difference(_with_sd(1.0), _with_sd(1.0), alpha, 0.8)
    a = rng.normal(delta, 1.0, size=(40_000, 5))
    b = rng.normal(0.0, 1.0, size=(40_000, 5))
    rejected = stats.ttest_ind(a, b, axis=1).pvalue <= alpha
    assert rejected.mean() == pytest.approx(0.8, abs=0.01)
    assert smallest_detectable_difference(_with_sd(2.0), _with_sd(2.0), alpha) == pytest.approx(2 * delta)
    sa, sb = 0.2, 0.36
    delta = smallest_detectable_difference(_with_sd(sa), _with_sd(sb), 0.05, 0.9)
    se = math.sqrt((sa**2 + sb**2) / 5)
    df = (sa**2 / 5 + sb**2 / 5) ** 2 / ((sa**2 / 5) ** 2 / 4 + (sb**2 / 5) ** 2 / 4)
    assert delta == pytest.approx((stats.t.ppf(0.975, df) + stats.t.ppf(0.9, df)) * se, rel=0.03)
    a = rng.normal(delta, sa, size=(40_000, 5))
    b = rng.normal(0.0, sb, size=(40_000, 5))
    assert (stats.ttest_ind(a, b, axis=1, equal_var=False).pvalue <= 0.05).mean() == pytest.approx(
        0.9, abs=0.03
    )
    assert math.isnan(smallest_detectable_difference([1.0], [1.0, 2.0]))
    assert math.isnan(smallest_detectable_difference([1.0, 1.0], [2.0, 2.0]))


def test_standardised_difference_weights_environments_equally_whatever_their_scale():
    """Each environment's (mean a - mean b) / sqrt((var a + var b) / 2) by hand, their mean; rescaling one
    environment's returns (its normalising range) changes nothing, unlike the pooled IQM."""
    a = [np.array([1.0, 2.0, 3.0]), np.array([10.0, 14.0, 12.0, 16.0])]
    b = [np.array([0.0, 1.0, 1.0]), np.array([9.0, 11.0, 10.0])]
    by_hand = [
        (x.mean() - y.mean()) / math.sqrt((x.var(ddof=1) + y.var(ddof=1)) / 2)
        for x, y in zip(a, b, strict=True)
    ]
    res = standardised_difference(a, b, n_boot=400)
    assert res.per_env == pytest.approx(by_hand) and res.diff == pytest.approx(np.mean(by_hand))
    assert res.low <= res.diff <= res.high and res.p < 0.05  # every environment far apart
    scaled = standardised_difference([a[0] * 50, a[1]], [b[0] * 50, b[1]], n_boot=400)
    assert scaled.per_env == pytest.approx(res.per_env)
    assert scaled[1:] == pytest.approx(res[1:])
    same = standardised_difference(a, a, n_boot=200)
    assert same.diff == 0 and same.p == 1.0
    assert math.isnan(standardised_difference([[1.0]], [[1.0, 2.0]]).diff)


def test_simulated_detectable_difference_has_the_asked_power_under_scipys_welch_test():
    """At the returned difference, scipy's own Welch test on fresh normal samples (another seed, the same
    sizes and standard deviations) rejects in 80% of draws; with 3 values a side that needs a larger
    difference than the noncentral-t form gives, and with 60 a side the two agree."""
    a, b = [0.0, 1.0, 2.0], [0.0, 2.0, 4.0, 6.0]  # sd 1 and 2.58, n 3 and 4
    alpha = 0.05 / 8
    delta = simulated_detectable_difference(a, b, alpha, 0.8)
    rng = np.random.default_rng(12345)
    x = delta + np.std(a, ddof=1) * rng.standard_normal((40000, 3))
    y = np.std(b, ddof=1) * rng.standard_normal((40000, 4))
    rejected = stats.ttest_ind(x, y, axis=1, equal_var=False).pvalue <= alpha
    assert rejected.mean() == pytest.approx(0.8, abs=0.01)
    assert delta > 1.05 * smallest_detectable_difference(a, b, alpha, 0.8)
    big_a, big_b = _with_sd(1.0, 60), _with_sd(2.0, 60)
    assert simulated_detectable_difference(big_a, big_b) == pytest.approx(
        smallest_detectable_difference(big_a, big_b), rel=0.03
    )
    assert math.isnan(simulated_detectable_difference([1.0], [1.0, 2.0]))
