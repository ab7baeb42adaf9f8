"""The confirmation report's numbers: RULES.md's tests (`compare`), the secondary ones (probability of
improvement, retention, gate activity), the per-arm table and the sensitivity added after the final
reading."""

from __future__ import annotations

import numpy as np

from rgpo_lab.mujoco_grid import CONFIRM_ENVS
from rgpo_lab.mujoco_normalisation import Normaliser
from rgpo_lab.mujoco_report.confirm_runs import ARMS, COMPARISONS, EPOCH_KEYS, START_KEYS, returns
from rgpo_lab.statistics import (
    aggregate_difference,
    holm,
    iqm,
    mean_probability_of_improvement,
    mean_std,
    optimality_gap,
    probability_of_improvement,
    ratio_difference_test,
    standardised_difference,
    stratified_resamples,
    verdict,
    welch,
)
from rgpo_trl.core.gates import LOG_RATIO_CLAMP


def compare(data, norm: Normaliser, a: str, b: str, n_boot: int) -> dict:
    """RULES.md's four tests for a - b: the normalised IQM difference (stratified bootstrap) and Welch per
    environment, Holm-corrected together."""
    # an interim report aggregates over the environments that have 2 runs or more in both arms (named)
    envs = [e for e in CONFIRM_ENVS if min(len(returns(data, a, e)), len(returns(data, b, e))) >= 2]
    agg = aggregate_difference(
        [norm(e, returns(data, a, e)) for e in envs],
        [norm(e, returns(data, b, e)) for e in envs],
        n_boot=n_boot,
    )
    if np.isfinite(agg.p):  # a bootstrap p of 0 means below 1 / n_boot: floored there, conservatively
        agg = agg._replace(p=max(agg.p, 1.0 / n_boot))
    per_env = {e: welch(returns(data, a, e), returns(data, b, e)) for e in CONFIRM_ENVS}
    adjusted = holm([agg.p, *(per_env[e].p for e in CONFIRM_ENVS)])
    out = {
        "aggregate": {
            **agg._asdict(),
            "envs": envs,
            "p_holm": adjusted[0],
            "verdict": verdict(agg.diff, adjusted[0]),
        },
        "per_env": {},
    }
    for e, p_adj in zip(CONFIRM_ENVS, adjusted[1:], strict=True):
        w = per_env[e]
        out["per_env"][e] = {
            **w._asdict(),
            "n_a": len(returns(data, a, e)),
            "n_b": len(returns(data, b, e)),
            "p_holm": p_adj,
            "verdict": verdict(w.diff, p_adj),
        }
    return out


def improvement(data, n_boot: int, a: str = "rgpo_dec", b: str = "ppo_dec", seed: int = 0) -> dict:
    """Secondary: rliable's probability of improvement of a over b, the mean over environments of P(X > Y)
    (X a's runs, Y b's, ties 0.5), with a 95% stratified-bootstrap interval: the primary's scheme (rng
    default_rng(seed); per resample a's runs within each environment, then b's), so the resampled runs are
    the primary's. Over the environments with 2 runs or more in both arms, as the primary."""
    per_env = {
        e: probability_of_improvement(returns(data, a, e), returns(data, b, e))
        if len(returns(data, a, e)) and len(returns(data, b, e))
        else None
        for e in CONFIRM_ENVS
    }
    envs = [e for e in CONFIRM_ENVS if min(len(returns(data, a, e)), len(returns(data, b, e))) >= 2]
    nan = float("nan")
    out = {"per_env": per_env, "envs": envs, "mean": nan, "low": nan, "high": nan, "n_boot": n_boot}
    if not envs:
        return out
    xs, ys = [returns(data, a, e) for e in envs], [returns(data, b, e) for e in envs]
    boots = [
        mean_probability_of_improvement(zip(rx, ry, strict=True))
        for rx, ry in stratified_resamples(xs, ys, n_boot, seed)
    ]
    low, high = np.percentile(boots, [2.5, 97.5])
    out.update(
        mean=mean_probability_of_improvement(zip(xs, ys, strict=True)),
        low=float(low),
        high=float(high),
    )
    return out


def arm_table(data, norm: Normaliser) -> dict:
    """Per arm and environment: n, raw mean / std, normalised IQM, optimality gap; and pooled over the three
    environments."""
    table = {}
    for arm in ARMS:
        row = {}
        pooled = []
        for e in CONFIRM_ENVS:
            x = returns(data, arm, e)
            s = norm(e, x)
            pooled.append(s)
            ms = mean_std(x)
            row[e] = {
                "n": ms.n,
                "mean": ms.mean,
                "std": ms.std,
                "iqm_norm": iqm(s) if len(s) else float("nan"),
                "gap": optimality_gap(s) if len(s) else float("nan"),
            }
        allx = np.concatenate(pooled)
        row["pooled"] = {
            "n": len(allx),
            "iqm_norm": iqm(allx) if len(allx) else float("nan"),
            "gap": optimality_gap(allx) if len(allx) else float("nan"),
        }
        table[arm] = row
    return table


def retention(data, n_boot: int) -> dict:
    """Secondary: mean L = 8 return / mean L = 0 return per environment, decoupled RGPO vs decoupled PPO."""
    out = {}
    for e in CONFIRM_ENVS:
        t = ratio_difference_test(
            returns(data, "rgpo_L0", e),
            returns(data, "rgpo_dec", e),
            returns(data, "ppo_L0", e),
            returns(data, "ppo_dec", e),
            n_boot=n_boot,
        )
        out[e] = t._asdict()
    p_adj = holm([out[e]["p"] for e in CONFIRM_ENVS])
    for e, p in zip(CONFIRM_ENVS, p_adj, strict=True):
        out[e]["p_holm"] = p
    return out


SENSITIVITY_DATE = "2026-11-28"  # when the sensitivity section was added: after the final reading (issue 55)


def trimmed_by_env(data, norm: Normaliser, arm: str) -> dict:
    """Which environments' runs the pooled IQM of ``arm`` trims (scipy's trim_mean: int(0.25 n) runs from
    each end of the pooled, sorted scores): {"low": {env: k}, "high": {env: k}}."""
    scores = np.concatenate([norm(e, returns(data, arm, e)) for e in CONFIRM_ENVS])
    envs = np.concatenate([[e] * len(returns(data, arm, e)) for e in CONFIRM_ENVS])
    k = int(0.25 * len(scores))
    order = np.argsort(scores, kind="stable")
    ends = {"low": order[:k], "high": order[len(order) - k :] if k else order[:0]}
    return {end: {e: int((envs[idx] == e).sum()) for e in CONFIRM_ENVS} for end, idx in ends.items()}


def sensitivity(data, norm: Normaliser, n_boot: int) -> dict:
    """Added after the final reading (issue 55), never decisive: each environment's normalising range; which
    environments the pooled IQM of family A's arms trims; per comparison, test (1) without the environment
    of the narrowest range, and the environments weighted equally (the mean of each one's standardised
    difference, `standardised_difference`). Bootstrap p uncorrected, floored at 1 / n_boot as test (1)'s."""
    ranges = {e: norm.high(e) - norm.low(e) for e in CONFIRM_ENVS}
    narrowest = min(ranges, key=ranges.get)
    others = [e for e in CONFIRM_ENVS if e != narrowest]
    rows = []
    for _, _, a, b in COMPARISONS:
        without = aggregate_difference(
            [norm(e, returns(data, a, e)) for e in others],
            [norm(e, returns(data, b, e)) for e in others],
            n_boot=n_boot,
        )
        equal = standardised_difference(
            [returns(data, a, e) for e in CONFIRM_ENVS], [returns(data, b, e) for e in CONFIRM_ENVS], n_boot
        )
        rows.append(
            {
                "without": without._replace(p=max(without.p, 1.0 / n_boot))._asdict(),
                "equal_weights": equal._replace(p=max(equal.p, 1.0 / n_boot))._asdict(),
            }
        )
    return {
        "added": SENSITIVITY_DATE,
        "ranges": ranges,
        "without_env": narrowest,
        "trimmed": {arm: trimmed_by_env(data, norm, arm) for arm in ("rgpo_dec", "ppo_dec")},
        "comparisons": rows,
    }


# A run's largest ratio at this value is the log-ratio clamp (r = exp(20) in float32), not a measurement
RATIO_AT_CLAMP = float(np.float32(np.exp(LOG_RATIO_CLAMP))) * (1 - 1e-6)


def gate_activity(data) -> dict:
    """Per L = 8 arm and environment, seed means of the per-iteration means: what the gate or the clip saw
    before each update's first epoch (start_*) next to the epoch means; None where the runs predate the
    start-of-update columns; ``<key>_n`` the runs with the column; ``<key>_at_clamp`` for the largest ratios,
    the runs whose maximum is the log-ratio clamp."""
    out = {}
    for arm in ("ppo_dec", "rgpo_dec", "ppo_dec_kl", "rgpo_dec_nokl", "ppo_plain", "rgpo_plain"):
        out[arm] = {}
        for e in CONFIRM_ENVS:
            runs = data[arm][e]
            row = {}
            for key in (*START_KEYS, *EPOCH_KEYS, "behaviour_ratio_beyond_2", "is_weight_truncated_frac"):
                seeds = [
                    float(m[key].max() if key.endswith("_max") else m[key].mean())
                    for _, _, m in runs
                    if key in m
                ]
                row[key] = float(np.mean(seeds)) if seeds else None
                row[f"{key}_n"] = len(seeds)
                if key.endswith("_max"):
                    row[f"{key}_at_clamp"] = sum(x >= RATIO_AT_CLAMP for x in seeds)
            out[arm][e] = row
    return out
