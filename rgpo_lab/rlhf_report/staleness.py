"""The staleness study's report (world v3): does RGPO's gate help as the samples get staler?

    python -m rgpo_lab.rlhf_report results/rlhf/v3 --studies    # this section, beside the others

Two suites, fixed in `rgpo_lab.rlhf_suite` (STALE_SYNC, STALE_ASYNC) with their reading rules
(STALENESS_RULE), every run 400 optimizer steps of 16 completions: ``stale_sync`` varies TRL's
``steps_per_generation`` S, ``stale_async`` the asynchronous trainer's controlled lag L. Per method and
level: held-out test gold, KL_ref and proxy reward (64 test prompts x 4 samples after training), and window
means (optimizer steps 305-400) of the behaviour ratio r_b = pi / pi_behaviour (``behaviour/*``: mean, the
window's largest, the share with max(r_b, 1 / r_b) beyond 1.2 and 2), KLhat_old, RGPO's kl_coef and
rejected fraction, the clip and CISPO truncation fractions, and (async) the staleness the trainer saw.
Rules A-C and the verdict are applied as STALENESS_RULE states them; figures against the level and along
training (seed mean, band +- 1 std over seeds, x in optimizer steps so every level shares the axis).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rgpo_lab.rlhf_report.figures import save_figure
from rgpo_lab.rlhf_suite import STALE_ASYNC, STALE_STEPS, STALE_SYNC, STALENESS_RULE
from rgpo_lab.statistics import change_difference_test, holm, matched_difference, mean_std, welch

STUDIES = {"stale_sync": ("S", STALE_SYNC), "stale_async": ("L", STALE_ASYNC)}
ALPHA = 0.05
STEP_BIN = 25  # optimizer steps per bin of the curves along training

# name -> (per-step metric keys, first one logged wins; how a run's window reduces it)
WINDOW_METRICS: dict[str, tuple[tuple[str, ...], Callable]] = {
    # TRL's AsyncGRPOTrainer logs the mean ratio to the behaviour policy as ``ratio`` and its k3 KL as ``kl``
    # AsyncRGPOTrainer logs them as rgpo/ratio_old_*
    "r_mean": (("behaviour/ratio_mean", "rgpo/ratio_old_mean", "ratio"), np.mean),
    "r_max": (("behaviour/ratio_max", "rgpo/ratio_old_max"), np.max),
    "r_beyond_1.2": (("behaviour/beyond_1.2", "rgpo/ratio_old_beyond_1.2"), np.mean),
    "r_beyond_2": (("behaviour/beyond_2", "rgpo/ratio_old_beyond_2"), np.mean),
    "kl_old": (("behaviour/kl_old", "rgpo/kl_old"), np.mean),
    "kl_coef": (("rgpo/kl_coef",), np.mean),
    "rejected_frac": (("rgpo/rejected_frac",), np.mean),
    # the gate on r_old alone: rgpo's dual gate logs it apart, rgpo_old's gate is that gate
    "rejected_old": (("rgpo/rejected_frac_old", "rgpo/rejected_frac"), np.mean),
    # rgpo's dual ratio r = max(r_old, r_ref): the share of tokens where pi / pi_ref is the larger (the gate
    # read the ratio to the reference there), and the mean gate weight
    "ref_larger": (("rgpo/ref_ratio_larger_frac",), np.mean),
    "gate_mean": (("rgpo/gate_mean",), np.mean),
    "clip_frac": (("clip_ratio/region_mean", "cispo_clip_ratio"), np.mean),
    "staleness": (("staleness/mean", "sample/staleness_mean"), np.mean),
}
ASYNC_KL_FALLBACK = "kl"  # TRL's AsyncGRPOTrainer: k3 KL to the behaviour policy (no reference there)
HELDOUT = {"gold": "gold", "kl_ref": "kl_ref", "reward": "reward"}


def metric_keys(name: str, suite: str) -> tuple[str, ...]:
    """The per-step keys of WINDOW_METRICS' ``name`` in ``suite``, the first one a run logs wins (the table
    and the figures read the same ones)."""
    keys = WINDOW_METRICS[name][0]
    return (*keys, ASYNC_KL_FALLBACK) if name == "kl_old" and suite == "stale_async" else keys


def _window_value(run: dict, keys: tuple[str, ...], reduce: Callable) -> float | None:
    start, end = run["summary"].get("window", (0, 10**9))
    for key in keys:
        x = [
            row[key]
            for row in run["rows"]
            if start < row["iteration"] <= end and row.get(key) is not None and np.isfinite(row[key])
        ]
        if x:
            return float(reduce(x))
    return None


def staleness_points(runs: dict[str, list[dict]], suite: str) -> list[dict]:
    """One point per method x level of ``suite`` (``runs`` as `rgpo_lab.rlhf_report.runs.load` reads the
    suite's folder: keys ``<method>__<S|L><level>``): n, seeds, per-seed values and mean +- sample std of the
    held-out numbers and of the window metrics (None where a method does not log one)."""
    letter, spec = STUDIES[suite]
    points = []
    for level in spec["levels"]:
        for m in spec["methods"]:
            rs = sorted(runs.get(f"{m}__{letter}{level}", []), key=lambda r: r["seed"])
            point = {
                "suite": suite,
                "method": m,
                "level": level,
                "n": len(rs),
                "seeds": [r["seed"] for r in rs],
            }
            for name, key in HELDOUT.items():
                point[f"{name}_values"] = [r["heldout"].get(key) for r in rs]
            for name, (_, reduce) in WINDOW_METRICS.items():
                point[f"{name}_values"] = [_window_value(r, metric_keys(name, suite), reduce) for r in rs]
            for name in (*HELDOUT, *WINDOW_METRICS):
                point[name] = mean_std(point[f"{name}_values"])
            point["runs"] = rs
            points.append(point)
    return points


def _values(points: list[dict], method: str, level: int, key: str = "gold") -> list[float]:
    for p in points:
        if p["method"] == method and p["level"] == level:
            return [v for v in p[f"{key}_values"] if v is not None]
    return []


def matched_kl(points: list[dict], other: str, level: int, n_boot: int = 10_000, seed: int = 0) -> dict:
    """Rule C: RGPO's seed-mean test gold, interpolated along its (KL_ref, gold) curve over the suite's
    levels, at ``other``'s KL_ref at ``level``, minus ``other``'s gold there; 95% percentile interval with the
    seeds of every point resampled (resamples outside RGPO's KL range dropped; ``inside`` = the share kept):
    the frontier rule, `rgpo_lab.statistics.matched_difference`."""
    curve = [(p["kl_ref_values"], p["gold_values"]) for p in points if p["method"] == "rgpo" and p["n"] > 0]
    theirs = next((p for p in points if p["method"] == other and p["level"] == level and p["n"] > 0), None)
    row = {"method": other, "level": level, "kl_ref": None, "gold": None, "rgpo_gold": None}
    row |= {"difference": None, "low": None, "high": None, "inside": 0.0}
    if theirs is None:
        return row
    m = matched_difference(
        curve, (theirs["kl_ref_values"], theirs["gold_values"]), np.random.default_rng(seed), n_boot
    )
    row |= {"kl_ref": m.x, "gold": m.y, "rgpo_gold": m.interpolated, "difference": m.difference}
    row |= {"low": m.low, "high": m.high, "inside": m.inside}
    return row


def staleness_tests(points: list[dict], suite: str) -> list[dict]:
    """Rules A, B and C for every other method of ``suite``, each family Holm-corrected over the methods, and
    the verdict the rule names."""
    _, spec = STUDIES[suite]
    levels = list(spec["levels"])
    fresh, stale = levels[0], levels[-1]
    others = [m for m in spec["methods"] if m != "rgpo"]
    rows = []
    for m in others:
        a = welch(_values(points, "rgpo", stale), _values(points, m, stale))
        change = welch(_values(points, m, stale), _values(points, m, fresh))
        diff = change_difference_test(
            _values(points, "rgpo", fresh),
            _values(points, "rgpo", stale),
            _values(points, m, fresh),
            _values(points, m, stale),
        )
        row = {"method": m, "fresh": fresh, "stale": stale}
        row |= {"a_diff": a.diff, "a_low": a.low, "a_high": a.high, "a_p": a.p}
        row |= {"b_change": change.diff, "b_low": change.low, "b_high": change.high, "b_p": change.p}
        row |= {"b_diff": diff.diff, "b_diff_low": diff.low, "b_diff_high": diff.high, "b_diff_p": diff.p}
        row["c"] = matched_kl(points, m, stale)
        rows.append(row)
    # RGPO's own change, in the change family beside the others
    own = welch(_values(points, "rgpo", stale), _values(points, "rgpo", fresh))
    rgpo_change = {"method": "rgpo", "b_change": own.diff, "b_low": own.low, "b_high": own.high, "b_p": own.p}
    for key in ("a_p", "b_diff_p"):
        _holm_over_the_family(rows, key)
    _holm_over_the_family([*rows, rgpo_change], "b_p")
    for row in rows:
        row["verdict"] = verdict(row)
    return [*rows, rgpo_change]


def _holm_over_the_family(rows: list[dict], key: str) -> None:
    """Holm over every method the rule names, not only those with runs yet: a test that cannot be made yet
    counts as p = 1 (so the others get the adjustment of the complete family) and stays untested (nan)."""
    p = [r[key] for r in rows]
    adjusted = holm([x if np.isfinite(x) else 1.0 for x in p])
    for row, x, a in zip(rows, p, adjusted, strict=True):
        row[f"{key}_holm"] = a if np.isfinite(x) else float("nan")


def verdict(row: dict) -> str:
    """STALENESS_RULE's words for one other method m, from A (Holm) and C (the matched-KL interval)."""
    m, p, c = row["method"], row.get("a_p_holm", float("nan")), row["c"]
    if not np.isfinite(p) or c["low"] is None:
        return "undecided" + ("" if c["low"] is not None else " (no matched-KL interval)")
    significant = p <= ALPHA
    if significant and row["a_diff"] > 0 and c["low"] > 0:
        return f"RGPO is more robust to staleness than {m}"
    if significant and row["a_diff"] < 0 and c["high"] < 0:
        return f"{m} is more robust to staleness than RGPO"
    if not significant and c["low"] <= 0 <= c["high"]:
        return "no difference"
    return "undecided"


def _cell(ms, digits: int = 3) -> str:
    mean, std, n = ms
    if n == 0:
        return "n/a"
    if abs(mean) < 1e-3 and mean != 0:
        return f"{mean:.2e}" + (f" ± {std:.1e}" if np.isfinite(std) else "")
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if np.isfinite(std) else "")


def _p(x: float) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.3g}"


def _ci(d: float, low: float, high: float) -> str:
    if d is None or not np.isfinite(d):
        return "-"
    return f"{d:+.3f}" + (f" [{low:+.3f}, {high:+.3f}]" if low is not None and np.isfinite(low) else "")


def staleness_markdown(suite: str, points: list[dict], tests: list[dict]) -> str:
    letter, spec = STUDIES[suite]
    what = "steps_per_generation S" if suite == "stale_sync" else "lag L (weight versions)"
    lines = [
        f"### {suite}: {what}",
        "",
        f"{STALE_STEPS} optimizer steps of 16 completions at every level; held-out = 64 test prompts x 4 "
        "samples after training; window = optimizer steps 305-400 (r_b max: the window's largest). "
        "'n/a': the method does not log it (r_b max and shares: TRL's AsyncGRPOTrainer logs only the mean "
        "ratio; clip fraction: RGPO and SAPO do not clip; kl_coef and the rejected fraction are RGPO's; "
        "staleness seen: weight versions behind, per trained token for RGPO, TRL's per dequeued sample for "
        "GRPO).",
        "",
        f"| method | {letter} | n | test gold | test KL_ref | test proxy | r_b mean | r_b max | "
        "r_b beyond 1.2 | r_b beyond 2 | KLhat_old | kl_coef | rejected | clip / truncated |"
        + (" staleness seen (versions) |" if suite == "stale_async" else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        + ("---|" if suite == "stale_async" else ""),
    ]
    cols = ["gold", "kl_ref", "reward", "r_mean", "r_max", "r_beyond_1.2", "r_beyond_2", "kl_old", "kl_coef"]
    cols += ["rejected_frac", "clip_frac"] + (["staleness"] if suite == "stale_async" else [])
    for p in points:
        cells = " | ".join("not run" if p["n"] == 0 else _cell(p[c]) for c in cols)
        lines.append(f"| {p['method']} | {p['level']} | {p['n']} | {cells} |")
    others = [t for t in tests if "verdict" in t]
    if not others:
        return "\n".join(lines)
    fresh, stale = others[0]["fresh"], others[0]["stale"]
    lines += [
        "",
        f"Tests on test gold ({letter} = {stale} the stalest, {letter} = {fresh} the freshest; each family "
        "Holm-corrected over its methods; [95% interval]):",
        "",
        f"| other method m | A: RGPO - m at {letter} = {stale} | Holm p | B: m's change | Holm p | "
        "B: RGPO's change - m's | Holm p | C: RGPO - m at m's KL_ref | inside | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in others:
        c = t["c"]
        c_cell = "outside RGPO's KL range" if c["rgpo_gold"] is None and c["kl_ref"] is not None else "-"
        if c["difference"] is not None:
            c_cell = _ci(c["difference"], c["low"], c["high"])
        lines.append(
            f"| {t['method']} | {_ci(t['a_diff'], t['a_low'], t['a_high'])} | {_p(t['a_p_holm'])} | "
            f"{_ci(t['b_change'], t['b_low'], t['b_high'])} | {_p(t['b_p_holm'])} | "
            f"{_ci(t['b_diff'], t['b_diff_low'], t['b_diff_high'])} | {_p(t['b_diff_p_holm'])} | {c_cell} | "
            f"{c['inside']:.0%} | {t['verdict']} |"
        )
    own = next(t for t in tests if t["method"] == "rgpo")
    lines += [
        "",
        f"RGPO's own change from {letter} = {fresh} to {stale}: "
        f"{_ci(own['b_change'], own['b_low'], own['b_high'])}"
        f" (Holm p {_p(own['b_p_holm'])}, in B's family).",
    ]
    return "\n".join(lines)


def gate_acted(points: list[dict], suite: str) -> str:
    """Which of RGPO's mechanisms against pi_old acted, freshest level against stalest (numbers, no test):
    the share of tokens the gate on r_old alone rejects (for ``rgpo``, whose gate is dual, the part of its
    rejections the ratio to pi_old accounts for; the pi/pi_ref side is not counted), the KL-to-old
    controller's kl_coef against its floor, and how far r_b moved; for the dual gate also what its
    pi/pi_ref side did (its whole rejected share, the share of tokens where r_ref was the larger ratio, the
    mean gate)."""
    from rgpo_trl.core import PAPER_KL_DEFAULTS

    letter, spec = STUDIES[suite]
    fresh, stale = list(spec["levels"])[0], list(spec["levels"])[-1]
    floor = PAPER_KL_DEFAULTS["kl_coef_min"]
    out = []
    for m in ("rgpo", "rgpo_old"):
        at = {
            q["level"]: q for q in points if q["method"] == m and q["level"] in (fresh, stale) and q["n"] > 0
        }
        if stale not in at:
            continue
        p, f = at[stale], at.get(fresh)

        def then(key: str, f: dict | None = f) -> str:
            return f" ({letter} = {fresh}: {_cell(f[key])})" if f else ""

        rejected, coef = p["rejected_old"], p["kl_coef"]
        gate = "rejected tokens" if rejected.n and rejected.mean > 0 else "rejected no token"
        controller = "left its floor" if coef.n and coef.mean > floor * 1.01 else "stayed at its floor"
        out.append(
            f"{m} at {letter} = {stale}: the gate on r_old {gate} (share {_cell(rejected)}"
            f"{then('rejected_old')}); the KL-to-old controller {controller} (kl_coef {_cell(coef)}"
            f"{then('kl_coef')}, floor {floor:g}); r_b beyond 1.2 {_cell(p['r_beyond_1.2'])}"
            f"{then('r_beyond_1.2')}, beyond 2 {_cell(p['r_beyond_2'])}, largest {_cell(p['r_max'])}."
        )
        if p["ref_larger"].n:  # the dual gate: what its pi / pi_ref side did
            out.append(
                f"Its dual gate as a whole rejected a share {_cell(p['rejected_frac'])}"
                f"{then('rejected_frac')}; "
                f"r = max(r_old, r_ref) was the ratio to pi_ref on a share {_cell(p['ref_larger'])}"
                f"{then('ref_larger')} of the tokens; mean gate weight {_cell(p['gate_mean'])}"
                f"{then('gate_mean')}."
            )
    return " ".join(out)


def along_training(run: dict, keys: tuple[str, ...]) -> tuple[str | None, dict[int, float]]:
    """The first of ``keys`` the run logs, and its mean per bin of `STEP_BIN` optimizer steps (the rows'
    ``step``); (None, {}) if it logs none."""
    for key in keys:
        by_bin: dict[int, list[float]] = {}
        for row in run["rows"]:
            if row.get(key) is not None and np.isfinite(row[key]):
                by_bin.setdefault((row["step"] - 1) // STEP_BIN, []).append(row[key])
        if by_bin:
            return key, {b: float(np.mean(v)) for b, v in sorted(by_bin.items())}
    return None, {}


def staleness_figures(suite: str, points: list[dict], out: str) -> list[str]:
    """``<suite>.png`` (every method against the level) and ``<suite>_per_step.png`` (along training)."""
    import matplotlib

    matplotlib.use("Agg")
    return [level_figure(suite, points, out), per_step_figure(suite, points, out)]


def level_figure(suite: str, points: list[dict], out: str) -> str:
    """Per method, test gold, KL_ref and the window means against the staleness level (seed mean +- 1 std)."""
    import matplotlib.pyplot as plt

    letter, spec = STUDIES[suite]
    methods = list(spec["methods"])
    colour = {m: f"C{i}" for i, m in enumerate(methods)}
    panels = [
        ("gold", "test gold"),
        ("kl_ref", "test KL_ref"),
        ("r_beyond_1.2", "r_b: share beyond 1.2"),
        ("r_max", "r_b: largest in the window"),
        ("kl_old", "KLhat_old (window)"),
        ("rejected_frac", "rejected fraction (RGPO)"),
        ("kl_coef", "kl_coef (RGPO)"),
        ("clip_frac", "clipped / truncated fraction"),
    ]
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        for m in methods:
            pts = [p for p in points if p["method"] == m and p[key].n > 0]
            if pts:
                ax.errorbar(
                    [p["level"] for p in pts],
                    [p[key].mean for p in pts],
                    yerr=[np.nan_to_num(p[key].std) for p in pts],
                    fmt="-o",
                    color=colour[m],
                    ms=4,
                    lw=1,
                    capsize=2,
                    label=m,
                )
        levels = list(spec["levels"])
        ax.set(xscale="log", xlabel=letter, title=title)
        ax.set_xticks(levels, [str(v) for v in levels])
        if key in ("kl_old", "r_max", "kl_coef"):
            ax.set_yscale("log")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no runs yet", ha="center", va="center", transform=ax.transAxes, fontsize=8)
    fig.suptitle(f"{suite}: against {letter} (seed mean ± 1 std)", fontsize=10)
    return save_figure(fig, out, f"{suite}.png")


def per_step_figure(suite: str, points: list[dict], out: str) -> str:
    """Per method and level, the training curves (gold, KL_ref, r_b, KLhat_old, the gate, kl_coef) in bins of
    `STEP_BIN` optimizer steps (seed mean, band +- 1 std)."""
    import matplotlib.pyplot as plt

    letter, spec = STUDIES[suite]
    methods = list(spec["methods"])
    # (keys, first logged wins; title); KL_ref: the monitor's (synchronous), else RGPO's own (asynchronous)
    curves = [
        (("rewards/gold/mean",), "gold (training batches)"),
        (("kl_ref/monitor", "rgpo/kl_ref"), "KL_ref"),
        (metric_keys("r_beyond_1.2", suite), "r_b beyond 1.2"),
        (metric_keys("kl_old", suite), "KLhat_old"),
        (("rgpo/rejected_frac",), "rejected fraction"),
        (("rgpo/kl_coef",), "kl_coef"),
    ]
    subtitle = {
        "kl_ref/monitor": " (pi_old to pi_ref)",
        "rgpo/kl_ref": " (rgpo's)",
        ASYNC_KL_FALLBACK: " (TRL's kl)",
    }
    fig, axes = plt.subplots(len(methods), len(curves), figsize=(3 * len(curves), 2.4 * len(methods)))
    axes = np.atleast_2d(axes)
    for row, m in zip(axes, methods, strict=True):
        for ax, (keys, title) in zip(row, curves, strict=True):
            used = set()
            for i, p in enumerate(p for p in points if p["method"] == m and p["n"] > 0):
                logged = [along_training(r, keys) for r in p["runs"]]
                used |= {key for key, _ in logged if key}
                per_run = [c for _, c in logged]
                bins = sorted(set.intersection(*(set(c) for c in per_run))) if per_run else []
                if not bins:
                    continue
                values = np.array([[c[b] for b in bins] for c in per_run])
                x = np.array(bins) * STEP_BIN + (STEP_BIN + 1) / 2
                mean = values.mean(0)
                ax.plot(x, mean, color=f"C{i}", lw=1, label=f"{letter} = {p['level']} (n={p['n']})")
                if len(values) > 1:
                    std = values.std(0, ddof=1)
                    ax.fill_between(x, mean - std, mean + std, color=f"C{i}", alpha=0.2, lw=0)
            ax.set_title(f"{m}: {title}{''.join(subtitle.get(k, '') for k in sorted(used))}", fontsize=8)
            ax.tick_params(labelsize=6)
            if not ax.lines:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, fontsize=7)
            elif "rgpo/kl_coef" in keys:
                ax.set_yscale("log")
        if row[0].lines:
            row[0].legend(fontsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("optimizer step", fontsize=7)
    fig.suptitle(f"{suite} along training (seed mean, band ± 1 std, bins of {STEP_BIN} steps)", fontsize=9)
    return save_figure(fig, out, f"{suite}_per_step.png")


def build_staleness(
    suites: dict[str, dict[str, list[dict]]], out: str, plots: bool = True
) -> tuple[str, dict]:
    """The staleness section (markdown) and its numbers (for studies.json) from the loaded suites
    (``{"stale_sync": runs, "stale_async": runs}``; a suite without runs is listed as not run)."""
    parts = ["## Stale samples (staleness study)", "", "Reading rules (committed before the first run):", ""]
    parts += ["    " + line for line in STALENESS_RULE.splitlines()] + [""]
    numbers = {}
    for suite in STUDIES:
        runs = suites.get(suite, {})
        points = staleness_points(runs, suite)
        tests = staleness_tests(points, suite)
        strip = [{k: v for k, v in p.items() if k != "runs"} for p in points]
        numbers[suite] = {"points": strip, "tests": tests}
        finished = sum(p["n"] for p in points)
        planned = sum(len(seeds) for seeds in STUDIES[suite][1]["levels"].values()) * len(
            STUDIES[suite][1]["methods"]
        )
        parts += [staleness_markdown(suite, points, tests), ""]
        parts += [f"Runs finished: {finished} of {planned}.", ""]
        acted = gate_acted(points, suite)
        if acted:
            parts += [acted, ""]
        if plots and finished:
            parts += [f"![{f}]({f})" for f in staleness_figures(suite, points, out)] + [""]
    return "\n".join(parts), numbers
