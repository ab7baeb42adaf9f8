"""Every comparison the project reports, in one place: per-seed summaries, Welch tests, Holm's correction
within a family, and the rliable protocol (IQM, probability of improvement, stratified bootstrap, performance
profiles).

Definitions follow rliable (Agarwal et al., 2021), computed with numpy/scipy: rliable 1.2 needs ``arch < 8``,
whose 7.x releases fail to import with pandas 3, and pinning pandas < 3 for every user of the extra would cost
more than these few functions. The tests check each against scipy or a hand computation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from scipy import optimize, stats


class MeanStd(NamedTuple):
    mean: float
    std: float  # sample std (ddof = 1); nan for one value
    n: int


def mean_std(values) -> MeanStd:
    """Mean, sample standard deviation and n of the finite values (None skipped)."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if len(x) == 0:
        return MeanStd(float("nan"), float("nan"), 0)
    return MeanStd(float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else float("nan"), len(x))


class Welch(NamedTuple):
    t: float
    df: float  # Welch-Satterthwaite degrees of freedom
    p: float
    diff: float  # mean(a) - mean(b)
    low: float = float("nan")  # the 95% confidence interval of diff (for the test's ``alternative``)
    high: float = float("nan")


def welch(a, b, alternative: str = "two-sided") -> Welch:
    """Welch's t-test of mean(a) against mean(b) (scipy's ``alternative``) with the 95% confidence interval of
    the difference; nan below 2 values a side."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    diff = float(a.mean() - b.mean()) if len(a) and len(b) else float("nan")
    if len(a) < 2 or len(b) < 2:
        return Welch(float("nan"), float("nan"), float("nan"), diff)
    res = stats.ttest_ind(a, b, equal_var=False, alternative=alternative)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    ci = res.confidence_interval(0.95)
    return Welch(float(res.statistic), float(df), float(res.pvalue), diff, float(ci.low), float(ci.high))


def smallest_detectable_difference(a, b, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest |mean(a) - mean(b)| that a two-sided Welch test at level ``alpha`` detects with
    probability ``power``, were the true standard deviations the samples' own and the sizes the same: the
    noncentral t with the Welch-Satterthwaite degrees of freedom. For a Holm family of m tests pass
    alpha / m (its first step). nan below 2 values a side or without spread."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:
        return float("nan")
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    critical = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(nc: float) -> float:  # both tails; the lower one as the upper tail at -nc (finite there)
        return float(stats.nct.sf(critical, df, nc) + stats.nct.sf(critical, df, -nc)) - power

    high = 1.0
    while shortfall(high) < 0:
        high *= 2
    return float(optimize.brentq(shortfall, 0.0, high, xtol=1e-10) * np.sqrt(va + vb))


def simulated_detectable_difference(
    a, b, alpha: float = 0.05, power: float = 0.8, draws: int = 20000, seed: int = 0
) -> float:
    """`smallest_detectable_difference` by simulating the Welch test itself: normal samples of the same sizes
    with the samples' own standard deviations, each draw tested at its own Welch-Satterthwaite degrees of
    freedom. The noncentral-t form fixes the degrees of freedom at the observed ones and is optimistic with
    3 values a side; this one is what the test does. Deterministic (``seed``); nan as there."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if len(a) < 2 or len(b) < 2 or a.std(ddof=1) + b.std(ddof=1) == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    za, zb = rng.standard_normal((draws, len(a))), rng.standard_normal((draws, len(b)))
    shift = a.std(ddof=1) * za.mean(1) - b.std(ddof=1) * zb.mean(1)  # mean(x) - mean(y) at no difference
    va = a.var(ddof=1) * za.var(1, ddof=1) / len(a)
    vb = b.var(ddof=1) * zb.var(1, ddof=1) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    critical, se = stats.t.ppf(1 - alpha / 2, df), np.sqrt(va + vb)

    def shortfall(d: float) -> float:
        return float(np.mean(np.abs(d + shift) / se > critical)) - power

    high = smallest_detectable_difference(a, b, alpha, power)
    while shortfall(high) < 0:
        high *= 1.5
    return float(optimize.brentq(shortfall, 0.0, high, xtol=1e-4 * high))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values of one family (nan entries are not tests and stay nan): the k-th
    smallest of m p-values becomes max over j <= k of min(1, (m - j + 1) p_(j)). Reject where adjusted
    p <= alpha."""
    p = np.asarray(pvalues, float)
    valid = np.flatnonzero(np.isfinite(p))
    out = np.full(len(p), np.nan)
    m = len(valid)
    running = 0.0
    for rank, i in enumerate(valid[np.argsort(p[valid], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def verdict(diff: float, p_adjusted: float, alpha: float = 0.05) -> str:
    """The words for one corrected two-sided test: 'higher', 'lower' or 'no significant difference'."""
    if not np.isfinite(p_adjusted):
        return "not tested (fewer than 2 runs a side)"
    if p_adjusted > alpha:
        return "no significant difference"
    return "higher" if diff > 0 else "lower"


def iqm(x) -> float:
    """Interquartile mean: the mean of the middle 50% of the values (rliable's IQM, scipy's 25% trimmed
    mean)."""
    return float(stats.trim_mean(np.asarray(x, float), 0.25))


def normalised_score(raw, low: float, high: float) -> np.ndarray:
    """(raw - low) / (high - low): 0 at the low reference, 1 at the high one, so scores of different tasks
    share a scale. Atari's human-normalised score takes low = a random agent's and high = a human tester's
    score (results/atari/sanity/RULES.md); the MuJoCo studies take low = the better of the random-policy and
    zero-action returns, high = the on-policy reference (rgpo_lab.mujoco_normalisation)."""
    if not high > low:
        raise ValueError(f"high must be > low, got low {low} and high {high}")
    return (np.asarray(raw, float) - low) / (high - low)


def optimality_gap(x, threshold: float = 1.0) -> float:
    """rliable's optimality gap: how far normalised scores fall short of ``threshold`` on average,
    mean(max(0, threshold - x)); scores above the threshold earn nothing extra."""
    return float(np.mean(np.maximum(0.0, threshold - np.asarray(x, float))))


def stratified_resamples(
    a_groups: Sequence[np.ndarray], b_groups: Sequence[np.ndarray], n_boot: int, seed: int
):
    """rliable's stratified bootstrap, ``n_boot`` times: (a's groups, b's groups), each group resampled with
    replacement within itself, a's groups then b's from one rng (default_rng(seed)), so every statistic
    drawn this way sees the same resamples."""
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        ra = [g[rng.integers(0, len(g), len(g))] for g in a_groups]
        rb = [g[rng.integers(0, len(g), len(g))] for g in b_groups]
        yield ra, rb


class AggregateDifference(NamedTuple):
    a: float  # the statistic of arm a's pooled scores
    b: float
    diff: float  # a - b
    low: float  # 95% stratified-bootstrap interval of diff
    high: float
    p: float  # two-sided: twice the smaller tail of the resampled differences at 0


def aggregate_difference(
    a_per_env: Sequence,
    b_per_env: Sequence,
    statistic: Callable | None = None,
    n_boot: int = 10_000,
    seed: int = 0,
) -> AggregateDifference:
    """statistic(pooled a) - statistic(pooled b) over several environments (default: the IQM of normalised
    scores), with rliable's stratified bootstrap: each arm's runs resampled within each environment. nan (not
    tested) where an environment has fewer than 2 runs in an arm."""
    statistic = statistic or iqm
    a_groups = [np.asarray(x, float)[np.isfinite(np.asarray(x, float))] for x in a_per_env]
    b_groups = [np.asarray(x, float)[np.isfinite(np.asarray(x, float))] for x in b_per_env]
    nan = float("nan")
    if not a_groups or any(len(g) == 0 for g in (*a_groups, *b_groups)):
        return AggregateDifference(nan, nan, nan, nan, nan, nan)
    va, vb = statistic(np.concatenate(a_groups)), statistic(np.concatenate(b_groups))
    if any(len(g) < 2 for g in (*a_groups, *b_groups)):
        return AggregateDifference(va, vb, va - vb, nan, nan, nan)
    diffs = np.array(
        [
            statistic(np.concatenate(ra)) - statistic(np.concatenate(rb))
            for ra, rb in stratified_resamples(a_groups, b_groups, n_boot, seed)
        ],
        float,
    )
    low, high, p = _percentile_interval_and_p(diffs)
    return AggregateDifference(float(va), float(vb), float(va - vb), low, high, p)


class StandardisedDifference(NamedTuple):
    per_env: list[float]  # each environment's (mean a - mean b) / its pooled seed standard deviation
    diff: float  # their mean: every environment weighted equally, in units of its own spread
    low: float  # 95% stratified-bootstrap interval of diff
    high: float
    p: float  # two-sided: twice the smaller tail of the resampled differences at 0


def standardised_difference(
    a_per_env: Sequence, b_per_env: Sequence, n_boot: int = 10_000, seed: int = 0
) -> StandardisedDifference:
    """The mean over environments of each one's standardised mean difference (Cohen's d: mean a - mean b over
    sqrt((var a + var b) / 2), sample variances), so no environment counts more for a narrower normalising
    range; stratified bootstrap as ``aggregate_difference`` (the same rng order), resamples without spread
    dropped. nan where an environment has fewer than 2 runs in an arm."""

    def d(a: np.ndarray, b: np.ndarray) -> float:
        spread = np.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
        return float((a.mean() - b.mean()) / spread) if spread > 0 else float("nan")

    a_groups = [np.asarray(x, float)[np.isfinite(np.asarray(x, float))] for x in a_per_env]
    b_groups = [np.asarray(x, float)[np.isfinite(np.asarray(x, float))] for x in b_per_env]
    nan = float("nan")
    if not a_groups or any(len(g) < 2 for g in (*a_groups, *b_groups)):
        return StandardisedDifference([nan] * len(a_groups), nan, nan, nan, nan)
    per_env = [d(a, b) for a, b in zip(a_groups, b_groups, strict=True)]
    diffs = np.array(
        [
            np.mean([d(x, y) for x, y in zip(ra, rb, strict=True)])
            for ra, rb in stratified_resamples(a_groups, b_groups, n_boot, seed)
        ],
        float,
    )
    low, high, p = _percentile_interval_and_p(diffs[np.isfinite(diffs)])
    return StandardisedDifference(per_env, float(np.mean(per_env)), low, high, p)


def probability_of_improvement(x, y) -> float:
    """P(X > Y) + 0.5 P(X = Y) over all pairs: the Mann-Whitney U statistic / (n m)."""
    x, y = np.asarray(x, float)[:, None], np.asarray(y, float)[None, :]
    return float(((x > y) + 0.5 * (x == y)).mean())


def stratified_bootstrap_ci(
    groups: list[tuple[np.ndarray, ...]], statistic: Callable, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95% percentile CI of ``statistic(groups)`` with every array of every group (environment) resampled with
    replacement within itself: rliable's stratified bootstrap."""
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_boot):
        resampled = [tuple(a[rng.integers(0, len(a), len(a))] for a in g) for g in groups]
        values.append(statistic(resampled))
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def pooled_iqm(groups: Sequence[tuple[np.ndarray, ...]]) -> float:
    """The IQM of every group's first array pooled: one arm's statistic for ``stratified_bootstrap_ci``."""
    return iqm(np.concatenate([g[0] for g in groups]))


def mean_probability_of_improvement(pairs) -> float:
    """The mean over groups (environments) of each one's P(X > Y), from its (x, y): rliable's aggregate
    probability of improvement."""
    return float(np.mean([probability_of_improvement(x, y) for x, y in pairs]))


class Profile(NamedTuple):
    taus: np.ndarray
    fraction: np.ndarray  # share of runs with a score > tau
    low: np.ndarray  # stratified-bootstrap 95% band
    high: np.ndarray


def performance_profile(
    scores_per_env: Sequence[np.ndarray], taus: np.ndarray | None = None, n_boot: int = 2000, seed: int = 0
) -> Profile:
    """rliable's run-score performance profile: per environment the fraction of its runs whose score exceeds
    tau, averaged over environments (so an environment with more finished runs does not weigh more), with a
    stratified-bootstrap 95% band (runs resampled within each environment). Default taus span every run (from
    below the lowest score to above the highest), so no run falls off the axis."""
    groups = [np.asarray(s, float) for s in scores_per_env]
    if taus is None:
        pooled = np.concatenate(groups)
        lo, hi = float(pooled.min()), float(pooled.max())
        pad = 0.05 * (hi - lo if hi > lo else 1.0)
        taus = np.linspace(lo - pad, hi + pad, 201)

    def profile(gs):
        return np.mean([(g[:, None] > taus[None, :]).mean(0) for g in gs], axis=0)

    fraction = profile(groups)
    rng = np.random.default_rng(seed)
    boots = np.array([profile([g[rng.integers(0, len(g), len(g))] for g in groups]) for _ in range(n_boot)])
    low, high = np.percentile(boots, [2.5, 97.5], axis=0)
    return Profile(taus, fraction, low, high)


class RatioTest(NamedTuple):
    ratio_a: float  # mean(a_after) / mean(a_before)
    ratio_b: float
    diff: float  # ratio_a - ratio_b
    low: float  # 95% percentile-bootstrap interval of diff
    high: float
    p: float  # two-sided bootstrap p: twice the smaller tail of the resampled differences at 0


def ratio_difference_test(
    a_before, a_after, b_before, b_after, n_boot: int = 10_000, seed: int = 0
) -> RatioTest:
    """Is arm a's retention mean(after) / mean(before) different from arm b's? Every one of the four samples
    is resampled on its own (the denominators' sampling error counts, unlike dividing each run by a fixed
    mean); nan (not tested) below 2 runs in any sample or where a 'before' mean is not positive."""
    xs = [np.asarray(x, float) for x in (a_before, a_after, b_before, b_after)]
    xs = [x[np.isfinite(x)] for x in xs]
    nan = float("nan")
    if any(len(x) < 2 for x in xs) or xs[0].mean() <= 0 or xs[2].mean() <= 0:
        ra = xs[1].mean() / xs[0].mean() if len(xs[0]) and len(xs[1]) and xs[0].mean() > 0 else nan
        rb = xs[3].mean() / xs[2].mean() if len(xs[2]) and len(xs[3]) and xs[2].mean() > 0 else nan
        return RatioTest(float(ra), float(rb), float(ra - rb), nan, nan, nan)
    ra, rb = xs[1].mean() / xs[0].mean(), xs[3].mean() / xs[2].mean()
    rng = np.random.default_rng(seed)
    means = [np.array([x[rng.integers(0, len(x), len(x))].mean() for _ in range(n_boot)]) for x in xs]
    with np.errstate(divide="ignore", invalid="ignore"):
        diffs = means[1] / means[0] - means[3] / means[2]
    low, high, p = _percentile_interval_and_p(diffs[np.isfinite(diffs)])
    return RatioTest(float(ra), float(rb), float(ra - rb), low, high, p)


class ChangeTest(NamedTuple):
    change_a: float  # mean(a_after) - mean(a_before)
    change_b: float
    diff: float  # change_a - change_b
    low: float  # 95% percentile-bootstrap interval of diff
    high: float
    p: float  # two-sided bootstrap p: twice the smaller tail of the resampled differences at 0


def change_difference_test(
    a_before, a_after, b_before, b_after, n_boot: int = 10_000, seed: int = 0
) -> ChangeTest:
    """Does arm a change more than arm b from one condition to another (a difference of differences of
    means)? Each of the four samples is resampled within itself (percentile bootstrap); nan (not tested)
    below 2 values in any sample."""
    xs = [np.asarray(x, float) for x in (a_before, a_after, b_before, b_after)]
    xs = [x[np.isfinite(x)] for x in xs]
    nan = float("nan")
    ca = xs[1].mean() - xs[0].mean() if len(xs[0]) and len(xs[1]) else nan
    cb = xs[3].mean() - xs[2].mean() if len(xs[2]) and len(xs[3]) else nan
    if any(len(x) < 2 for x in xs):
        return ChangeTest(float(ca), float(cb), float(ca - cb), nan, nan, nan)
    rng = np.random.default_rng(seed)
    means = [x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1) for x in xs]
    low, high, p = _percentile_interval_and_p((means[1] - means[0]) - (means[3] - means[2]))
    return ChangeTest(float(ca), float(cb), float(ca - cb), low, high, p)


def _percentile_interval_and_p(diffs: np.ndarray) -> tuple[float, float, float]:
    """The 95% percentile interval of bootstrap differences and the two-sided p: twice the smaller tail at
    0."""
    p = min(1.0, 2 * min(float((diffs <= 0).mean()), float((diffs >= 0).mean())))
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high), p


def interpolate(curve: Sequence[tuple[float, float]], x: float) -> float | None:
    """y on the piecewise-linear ``curve`` [(x, y), ...] at ``x``; None outside its x range."""
    curve = sorted(curve)
    if len(curve) < 2 or not curve[0][0] <= x <= curve[-1][0]:
        return None
    return float(np.interp(x, [c[0] for c in curve], [c[1] for c in curve]))


class MatchedDifference(NamedTuple):
    x: float  # the point's mean x (e.g. KL_ref)
    y: float  # the point's mean y (e.g. gold)
    interpolated: float | None  # the curve's y at x; None outside its x range
    difference: float | None  # interpolated - y
    low: float | None  # 95% percentile-bootstrap interval of the difference
    high: float | None
    inside: float  # share of the resamples whose x fell inside the curve's range


def matched_difference(
    curve: Sequence[tuple[Sequence[float], Sequence[float]]],
    point: tuple[Sequence[float], Sequence[float]],
    rng: np.random.Generator,
    n_boot: int = 10_000,
) -> MatchedDifference:
    """A curve against a point at the point's x (a comparison at matched KL, say): the curve through its
    points' seed means of (x, y), interpolated at the point's seed-mean x, minus the point's mean y. Every
    point is given as its per-seed (x values, y values). The interval resamples the seeds of every point with
    replacement (``rng``, points in the curve's order, then the point); resamples whose x falls outside the
    curve's range are dropped. No interval unless every point has 2 seeds or more."""

    def mean(values) -> float:
        return float(np.mean(np.asarray(values, float)))

    x, y = mean(point[0]), mean(point[1])
    interpolated = interpolate([(mean(cx), mean(cy)) for cx, cy in curve], x)
    difference = None if interpolated is None else interpolated - y
    if interpolated is None or not all(len(v[0]) >= 2 for v in [*curve, point]):
        return MatchedDifference(x, y, interpolated, difference, None, None, 0.0)

    def resampled(v) -> tuple[np.ndarray, np.ndarray]:
        vx, vy = np.asarray(v[0], float), np.asarray(v[1], float)
        idx = rng.integers(0, len(vx), size=(n_boot, len(vx)))
        return vx[idx].mean(1), vy[idx].mean(1)

    curves = [resampled(c) for c in curve]
    px, py = resampled(point)
    diffs = [
        g - py[i]
        for i in range(n_boot)
        if (g := interpolate([(c[0][i], c[1][i]) for c in curves], px[i])) is not None
    ]
    if not diffs:
        return MatchedDifference(x, y, interpolated, difference, None, None, 0.0)
    low, high = (float(v) for v in np.percentile(diffs, [2.5, 97.5]))
    return MatchedDifference(x, y, interpolated, difference, low, high, len(diffs) / n_boot)
