"""The studies across suites (rgpo_lab/rlhf_suite.py): beta_ref frontiers, with RGPO's frontier
interpolated at PPO-RLHF's points, and batch reuse, each against the final suite's runs as its base point."""

from __future__ import annotations

import numpy as np

from rgpo_lab.rlhf_report.comparison import ms_cell, welch_family
from rgpo_lab.rlhf_report.runs import window_mean
from rgpo_lab.statistics import matched_difference, mean_std
from rgpo_lab.statistics import welch as welch_test


def study_points(
    suite: str,
    varied: dict[str, list[dict]],
    final: dict[str, list[dict]],
    settings: dict[str, tuple[str, ...]],
    base: str,
    tag: str,
) -> list[dict]:
    """One point per method x setting: the varied suite's ``<method>__<tag><value>`` runs, and at the base
    value the final suite's runs of the method (same rate and seeds). Mean +- sample std over seeds of the
    window and held-out numbers, and the per-seed values for the tests."""
    points = []
    for m, values in settings.items():
        for v in sorted({*values, base}, key=float):
            rs = final.get(m, []) if v == base else varied.get(f"{m}__{tag}{v}", [])
            point = {
                "method": m,
                "value": v,
                "n": len(rs),
                "seeds": [r["seed"] for r in rs],
                "source": "final" if v == base else suite,
            }
            for name, get in {
                "gold": lambda r: r["heldout"].get("gold"),
                "kl_ref": lambda r: r["heldout"].get("kl_ref"),
                "reward": lambda r: r["heldout"].get("reward"),
                "window_gold": lambda r: r["summary"].get("gold"),
                "window_kl_ref": lambda r: r["summary"].get("kl_ref"),
                "window_reward": lambda r: r["summary"].get("reward"),
                "kl_old": lambda r: r["summary"].get("kl_old"),
                "kl_coef": lambda r: r["summary"].get("kl_coef"),
                "rejected_frac": lambda r: r["summary"].get("rejected_frac"),
                "clip_frac": lambda r: window_mean(r, "clip_ratio/region_mean"),
            }.items():
                values_ = [get(r) for r in rs]
                point[f"{name}_values"] = values_
                point[name] = mean_std(values_)
            point["runs"] = rs
            points.append(point)
    return points


def frontier_interpolation(
    points: list[dict], a: str, b: str, n_boot: int = 10_000, seed: int = 0
) -> list[dict]:
    """At each of ``b``'s points, ``a``'s held-out gold linearly interpolated at ``b``'s held-out KL_ref on
    the seed-mean curve of ``a`` (only inside ``a``'s KL range): a positive difference = ``a``'s frontier
    above. The 95% interval resamples the seeds of every point with replacement (percentile bootstrap;
    resamples whose KL falls outside ``a``'s range are dropped, and ``inside`` says what share was kept):
    `rgpo_lab.statistics.matched_difference`, one random stream over ``b``'s points."""
    curve = [(p["kl_ref_values"], p["gold_values"]) for p in points if p["method"] == a and p["n"] > 0]
    rng = np.random.default_rng(seed)
    out = []
    for p in (p for p in points if p["method"] == b and p["n"] > 0):
        m = matched_difference(curve, (p["kl_ref_values"], p["gold_values"]), rng, n_boot)
        row = {"at": b, "value": p["value"], "n": p["n"], "kl_ref": m.x, "gold": m.y}
        row |= {"interpolated": m.interpolated, "difference": m.difference}
        row |= {"low": m.low, "high": m.high, "inside": m.inside}
        out.append(row)
    return out


def reuse_tests(
    points: list[dict], a: str = "rgpo", key: str = "gold", base: str | None = None
) -> list[dict]:
    """At each num_iterations but ``base`` (whose comparisons, over all methods, are the final suite's), ``a``
    against every other method on held-out ``key`` (two-sided Welch, Holm over the comparisons at that value),
    and each method's change from the fewest to the most reuses (Welch): "does RGPO degrade more gracefully
    than clipping as samples get staler?" """
    by = {(p["method"], p["value"]): p[f"{key}_values"] for p in points if p["n"] >= 2}
    values = sorted({v for _, v in by}, key=float)
    rows = []
    for v in (v for v in values if v != base):
        at_v = {m: x for (m, w), x in by.items() if w == v}
        family = [(a, m) for m in at_v if m != a and a in at_v]
        rows += [{"kind": "vs", "value": v, **row} for row in welch_family(family, at_v)]
    if len(values) >= 2:
        first, last = values[0], values[-1]
        for m in dict.fromkeys(m for m, _ in by):
            if (m, first) in by and (m, last) in by:
                w = welch_test(by[(m, last)], by[(m, first)])
                row = {"kind": "change", "value": f"{first}->{last}", "a": m, "b": m}
                row |= {"n_a": len(by[(m, last)]), "n_b": len(by[(m, first)])}
                row |= {"diff": w.diff, "low": w.low, "high": w.high, "p": w.p, "p_holm": None}
                rows.append(row)
    return rows


def _point_row(p: dict, cols: list[str], digits: int = 3) -> str:
    """Cells of a study point: "not run" without runs, "n/a" where the method does not log the metric,
    KLhat_old (1e-7 at one reuse) in scientific notation."""

    def cell(c: str) -> str:
        mean, std, n = p[c]
        if p["n"] == 0:
            return "not run"
        if n == 0:
            return "n/a"
        if c == "kl_old":
            return f"{mean:.2e}" + (f" ± {std:.1e}" if np.isfinite(std) else "")
        return ms_cell(p[c], digits)

    return " | ".join(cell(c) for c in cols)


def study_markdown(
    frontier: list[dict], reuse: list[dict], between: list[dict], tests: list[dict] = ()
) -> str:
    lines = [
        "## KL frontiers (beta_ref)",
        "",
        "Held-out: 64 test prompts x the runs' samples per prompt after training; window: iterations 300-400 "
        "on the training prompts. The base beta_ref (the preset's) is the final suite's runs.",
        "",
        "| method | beta_ref | n | held-out gold | held-out KL_ref | held-out proxy | window gold | "
        "window KL_ref |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cols = ["gold", "kl_ref", "reward", "window_gold", "window_kl_ref"]
    for p in frontier:
        lines.append(f"| {p['method']} | {p['value']} | {p['n']} | {_point_row(p, cols)} |")
    if any(b["interpolated"] is not None for b in between):
        lines += [
            "",
            "RGPO's frontier at PPO-RLHF's points (RGPO's seed-mean held-out gold interpolated at the "
            "PPO point's held-out KL_ref; only inside RGPO's KL range; 95% interval: seeds resampled within "
            "every point, 10,000 times). Reading rule, fixed before the frontier runs: RGPO's frontier lies "
            "above (below) PPO-RLHF's at a point where the interval excludes 0 on the positive (negative) "
            "side; otherwise no significant difference there.",
            "",
            "| PPO beta_ref | PPO KL_ref | PPO gold | RGPO gold at that KL_ref | RGPO - PPO | 95% interval | "
            "resamples inside RGPO's range |",
            "|---|---|---|---|---|---|---|",
        ]
        for b in between:
            rg = "outside RGPO's range" if b["interpolated"] is None else f"{b['interpolated']:.3f}"
            diff = "-" if b["difference"] is None else f"{b['difference']:+.3f}"
            ci = "-" if b["low"] is None else f"[{b['low']:+.3f}, {b['high']:+.3f}]"
            lines.append(
                f"| {b['value']} | {b['kl_ref']:.3f} | {b['gold']:.3f} | {rg} | {diff} | {ci} | "
                f"{b['inside']:.0%} |"
            )
    lines += [
        "",
        "## Batch reuse (num_iterations)",
        "",
        "Window means (iterations 300-400) over seeds; KLhat_old, kl_coef and the rejected fraction are "
        "RGPO's own statistics (rgpo/*); the clipped fraction is the clip methods' clip_ratio/region_mean. "
        "The base num_iterations (the preset's) is the final suite's runs.",
        "",
        "| method | num_iterations | n | held-out gold | held-out KL_ref | window proxy | KLhat_old | "
        "kl_coef | rejected frac | clipped frac |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    reuse_cols = ["gold", "kl_ref", "window_reward", "kl_old", "kl_coef", "rejected_frac", "clip_frac"]
    for p in reuse:
        lines.append(f"| {p['method']} | {p['value']} | {p['n']} | {_point_row(p, reuse_cols)} |")
    if tests:
        lines += [
            "",
            "Held-out gold: RGPO against each method at every num_iterations but the preset's (there, the "
            "final comparison's tests), two-sided Welch, Holm over the comparisons at that value; and each "
            "method's change from the fewest to the most reuses (Welch). Reading rule, fixed before the "
            "reuse runs: RGPO degrades more gracefully than a method if at the most reuses it is above it "
            "(Holm p < 0.05); otherwise no significant difference.",
            "",
            "| num_iterations | comparison | difference | Welch 95% CI | p | Holm p |",
            "|---|---|---|---|---|---|",
        ]
        for t in tests:
            what = f"{t['a']} - {t['b']}" if t["kind"] == "vs" else f"{t['a']}: most - fewest reuses"
            holm_p = "-" if t["p_holm"] is None else f"{t['p_holm']:.3g}"
            lines.append(
                f"| {t['value']} | {what} | {t['diff']:+.3f} | [{t['low']:+.3f}, {t['high']:+.3f}] | "
                f"{t['p']:.3g} | {holm_p} |"
            )
    return "\n".join(lines)
