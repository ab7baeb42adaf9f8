"""The paper's RLHF table (Sec. 7.3) beside ours, from a suite's results folder, plus the gold score and the
held-out evaluation the paper does not have, and the figures.

    python -m rgpo_lab.rlhf_report results/rlhf/tiny-paper [--out results/rlhf/tiny-paper/report]
    python -m rgpo_lab.rlhf_report results/rlhf --studies   # tune/ final/ frontier/ reuse/ together

Run from the repository root of a checkout (cd <checkout> first, or PYTHONPATH=<checkout>): the lab is not
installed with the package, and elsewhere Python finds no module rgpo_lab.

Reads only ``<method>__s<seed>/{summary.json, heldout.json, metrics.csv}`` (or ``metrics.jsonl``, the same
rows; results/ keeps the CSV). Per method: mean +- sample std (ddof 1) over the finished seeds (n stated) of
the window averages (the paper's iterations 300-400) of the proxy reward, KL_ref and gold, and of the held-out
proxy reward, gold and KL_ref. Methods with no finished run are listed as not run. Figures: reward and KL_ref
per iteration (mean +- 1 std over seeds), the reward-KL_ref Pareto plot (seeds small, means large) and gold
against sqrt(KL_ref) per method (over-optimisation curves).

With the ``sft`` baseline (the initial policy through the same evaluation) it also writes what the gold score
adds: each method's gold minus the SFT policy's gold (Welch 95% interval over seeds), in the pre-registered
window and at the method's best 25-iteration bin (picked after seeing the curve, so optimistic), and whether
the proxy-gold gap grows with KL_ref: per 25-iteration bin of every online run, the proxy shift minus the gold
shift from the SFT policy, each in units of the SFT policy's per-sample std, against KL_ref (Spearman).
Pairwise tests: two-sided Welch, Holm-corrected within each family (every method vs the SFT policy; RGPO vs
every other method), on held-out gold, window gold and held-out KL_ref.
"""

from __future__ import annotations

import argparse
import csv
import json
import os

import numpy as np
from scipy import stats

from rgpo_lab.rlhf_staleness import STUDIES, build_staleness
from rgpo_lab.rlhf_suite import (
    FRONTIER_BASE,
    FRONTIER_BETAS,
    METHODS,
    ONLINE,
    REUSE,
    REUSE_BASE,
    read_run_json,
)
from rgpo_lab.statistics import holm, matched_difference, mean_std
from rgpo_lab.statistics import welch as welch_test

BIN = 25  # iterations per bin of the per-iteration curves (25 x 16 samples per bin and seed)
PROXY, GOLD, KL = "rewards/reward_model/mean", "rewards/gold/mean", "kl_ref/monitor"
# The paper's Table rlhf_main (reward improvement over the initial policy; KL to the reference), Qwen2.5-1.5B.
PAPER = {
    "rgpo": {"reward": 0.243, "kl_ref": 0.364},
    "ppo": {"reward": 0.211, "kl_ref": 0.434},
    "grpo": {"reward": 0.236, "kl_ref": 0.778},
    "dpo": {"kl_ref": 0.079},
}


def load(results: str) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for name in sorted(os.listdir(results)):
        d = os.path.join(results, name)
        if "__s" not in name or not all(
            os.path.exists(os.path.join(d, f)) for f in ("summary.json", "heldout.json")
        ):
            continue
        method, seed = name.rsplit("__s", 1)
        run = {"seed": int(seed), "dir": d}
        for f in ("summary", "heldout"):
            run[f] = read_run_json(os.path.join(d, f"{f}.json"))
        run["rows"] = read_rows(d)
        runs.setdefault(method, []).append(run)
    return runs


def _csv_value(key: str, value: str) -> int | float | str:
    if key in ("iteration", "step"):
        return int(float(value))
    try:
        return float(value)
    except ValueError:  # a text field, e.g. gold_missing_reason
        return value


def read_rows(run_dir: str) -> list[dict]:
    """The per-step metric rows of a run: metrics.csv (empty cells: not logged at that step) or
    metrics.jsonl (null: a NaN the run logged, read as not logged). Text fields (``gold_missing_reason``) stay
    text."""
    path = os.path.join(run_dir, "metrics.csv")
    if os.path.exists(path):
        with open(path, newline="") as f:
            return [{k: _csv_value(k, v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    path = os.path.join(run_dir, "metrics.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def table(runs: dict[str, list[dict]]) -> list[dict]:
    rows = []
    sft = [r["summary"]["reward"] for r in runs.get("sft", [])]
    sft_reward = float(np.mean(sft)) if sft else float("nan")
    for m in METHODS:
        rs = runs.get(m, [])
        row = {"method": m, "n": len(rs)}
        # the paper reports the reward as an improvement over the initial policy: the same against `sft`
        row["reward_gain"] = mean_std([r["summary"].get("reward") - sft_reward for r in rs])
        for key in ("reward", "kl_ref", "gold"):
            row[key] = mean_std([r["summary"].get(key) for r in rs])
            row[f"heldout_{key}"] = mean_std([r["heldout"].get(key) for r in rs])
        rows.append(row)
    return rows


def _cell(ms, digits=3) -> str:
    mean, std, n = ms
    if n == 0:
        return "not run"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if np.isfinite(std) else "")


def markdown(rows: list[dict]) -> str:
    lines = [
        "| method | n | reward (window) | reward - SFT | KL_ref (window) | gold (window) | held-out reward | "
        "held-out gold | held-out KL_ref | paper: reward gain / KL_ref |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = PAPER.get(r["method"], {})
        paper = f"{p.get('reward', '-')} / {p.get('kl_ref', '-')}" if p else "-"
        lines.append(
            f"| {r['method']} | {r['n']} | {_cell(r['reward'])} | {_cell(r['reward_gain'])} | "
            f"{_cell(r['kl_ref'])} | {_cell(r['gold'])} | {_cell(r['heldout_reward'])} | "
            f"{_cell(r['heldout_gold'])} | {_cell(r['heldout_kl_ref'])} | {paper} |"
        )
    return "\n".join(lines)


def binned(run: dict, key: str, width: int = BIN) -> dict[int, float]:
    """Mean of ``key`` per bin of ``width`` iterations (bin b holds iterations b*width+1 .. (b+1)*width)."""
    by_bin: dict[int, list[float]] = {}
    for row in run["rows"]:
        if row.get(key) is not None and np.isfinite(row[key]):
            by_bin.setdefault((row["iteration"] - 1) // width, []).append(row[key])
    return {b: float(np.mean(v)) for b, v in sorted(by_bin.items())}


def common_bins(curves: list[dict[int, float]]) -> list[int]:
    """The bins every curve has (seeds of a run may stop at different iterations), in order."""
    return sorted(set.intersection(*(set(c) for c in curves))) if curves else []


def welch(a, b) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its Welch 95% confidence interval."""
    w = welch_test(a, b)
    return w.diff, w.low, w.high


def pairwise(
    runs: dict[str, list[dict]], source: str = "heldout", key: str = "gold"
) -> dict[str, list[dict]]:
    """Two families of two-sided Welch tests on ``runs[m][source][key]`` over seeds, each Holm-corrected
    across its comparisons: every method against the SFT policy, and RGPO against every other method (n >= 2 a
    side)."""
    values = {m: [r[source].get(key) for r in runs.get(m, [])] for m in METHODS}
    values = {m: v for m, v in values.items() if len(v) >= 2 and None not in v}
    families = {
        "vs_sft": [(m, "sft") for m in METHODS if m != "sft" and m in values and "sft" in values],
        "rgpo_vs": [
            ("rgpo", m) for m in METHODS if m not in ("rgpo", "sft") and m in values and "rgpo" in values
        ],
    }
    return {name: welch_family(pairs, values) for name, pairs in families.items()}


def welch_family(pairs: list[tuple[str, str]], values: dict[str, list[float]]) -> list[dict]:
    """A two-sided Welch test of ``values[a]`` against ``values[b]`` for each pair, Holm-corrected across the
    pairs (one family)."""
    rows = []
    for a, b in pairs:
        w = welch_test(values[a], values[b])
        row = {"a": a, "b": b, "n_a": len(values[a]), "n_b": len(values[b])}
        rows.append({**row, "diff": w.diff, "low": w.low, "high": w.high, "p": w.p})
    for row, adjusted in zip(rows, holm([r["p"] for r in rows]), strict=True):
        row["p_holm"] = adjusted
    return rows


def pairwise_markdown(tests: dict[str, list[dict]], what: str) -> str:
    lines = []
    for name, title in (("vs_sft", "method - SFT"), ("rgpo_vs", "RGPO - method")):
        rows = tests.get(name, [])
        if not rows:
            continue
        lines += [
            f"{title}, {what} (two-sided Welch, Holm-corrected across the {len(rows)} comparisons):",
            "",
            "| comparison | n | difference [95% CI] | p | p (Holm) |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['a']} - {r['b']} | {r['n_a']} / {r['n_b']} | {r['diff']:+.3f} [{r['low']:+.3f}, "
                f"{r['high']:+.3f}] | {r['p']:.3g} | {r['p_holm']:.3g} |"
            )
        lines.append("")
    return "\n".join(lines) if lines else f"Pairwise tests on {what}: need at least 2 finished seeds a side."


def gold_vs_sft(runs: dict[str, list[dict]]) -> list[dict]:
    """Per method: window gold - SFT gold, and best-bin gold - SFT gold, with Welch 95% intervals over
    seeds."""
    sft = [r["summary"]["gold"] for r in runs.get("sft", [])]
    sft_heldout = [r["heldout"].get("gold") for r in runs.get("sft", [])]
    out = []
    if len(sft) < 2:
        return out
    for m in (m for m in METHODS if m != "sft"):
        rs = runs.get(m, [])
        if len(rs) < 2:
            continue
        row = {
            "method": m,
            "n": len(rs),
            "n_sft": len(sft),
            "window": welch([r["summary"]["gold"] for r in rs], sft),
        }
        heldout = [r["heldout"].get("gold") for r in rs]
        if len(sft_heldout) >= 2 and None not in heldout + sft_heldout:
            row["heldout"] = welch(heldout, sft_heldout)  # same code, same held-out prompts
        curves = [binned(r, GOLD) for r in rs]
        common = common_bins(curves)
        if common:
            best = max(common, key=lambda b: np.mean([c[b] for c in curves]))
            row["best_bin"] = (best * BIN + 1, (best + 1) * BIN)
            row["best"] = welch([c[best] for c in curves], sft)
        out.append(row)
    return out


def overoptimisation(runs: dict[str, list[dict]]) -> dict | None:
    """Proxy shift minus gold shift from the SFT policy (each in SFT per-sample std units) per bin of every
    online run, against the bin's KL_ref: Spearman correlation, pooled and per method."""
    sft = [r["summary"] for r in runs.get("sft", [])]
    if not sft or any(k not in s for s in sft for k in ("reward_std", "gold_std")):
        return None
    p0, g0 = np.mean([s["reward"] for s in sft]), np.mean([s["gold"] for s in sft])
    ps, gs = np.mean([s["reward_std"] for s in sft]), np.mean([s["gold_std"] for s in sft])
    points = []
    for m in ONLINE:
        for r in runs.get(m, []):
            proxy, gold, kl = binned(r, PROXY), binned(r, GOLD), binned(r, KL)
            for b in sorted(set(proxy) & set(gold) & set(kl)):
                points.append((m, r["seed"], b, kl[b], (proxy[b] - p0) / ps - (gold[b] - g0) / gs))
    if len(points) < 3:
        return None
    kl, gap = np.array([p[3] for p in points]), np.array([p[4] for p in points])
    rho = stats.spearmanr(kl, gap)
    per_method = {}
    for m in ONLINE:
        sel = [i for i, p in enumerate(points) if p[0] == m]
        if len(sel) >= 3:
            per_method[m] = float(stats.spearmanr(kl[sel], gap[sel]).statistic)
    return {
        "points": points,
        "rho": float(rho.statistic),
        "p": float(rho.pvalue),
        "per_method": per_method,
        "sft": {"reward": p0, "gold": g0, "reward_std": ps, "gold_std": gs},
    }


def heldout_samples(runs: dict[str, list[dict]]) -> str:
    """Samples per held-out prompt, as the runs recorded it (older runs: one)."""
    k = sorted({r["heldout"].get("samples_per_prompt", 1) for rs in runs.values() for r in rs})
    return " or ".join(map(str, k)) if k else "1"


def gold_markdown(rows: list[dict], over: dict | None, samples: str = "1") -> str:
    if not rows:
        return (
            "Gold vs the SFT policy: needs at least 2 finished seeds of the `sft` baseline and of a method."
        )
    lines = [
        "| method | n | window gold - SFT gold [95% CI] | best bin (iterations) | best-bin gold - SFT gold "
        "[95% CI] | held-out gold - SFT held-out gold [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    fmt = lambda t: f"{t[0]:+.3f} [{t[1]:+.3f}, {t[2]:+.3f}]"  # noqa: E731
    for r in rows:
        best = f"{r['best_bin'][0]}-{r['best_bin'][1]} | {fmt(r['best'])}" if "best" in r else "- | -"
        held = fmt(r["heldout"]) if "heldout" in r else "-"
        lines.append(f"| {r['method']} | {r['n']} | {fmt(r['window'])} | {best} | {held} |")
    text = (
        f"Gold minus the SFT policy's gold (n_sft = {rows[0]['n_sft']} evaluation seeds), Welch 95% interval "
        "over seeds. The window is fixed in advance; the best bin is the 25-iteration bin with the highest "
        "seed-mean gold, chosen after seeing the curve (an optimistic estimate). Held out: the same code on "
        "the same held-out prompts for the method and the "
        f"SFT policy, {samples} sample(s) per prompt and seed.\n\n" + "\n".join(lines)
    )
    if over is not None:
        per = ", ".join(f"{m} {v:+.2f}" for m, v in over["per_method"].items())
        text += (
            f"\n\nProxy-gold gap vs KL_ref: Spearman rho = {over['rho']:+.3f} (p = {over['p']:.2g}) over "
            f"{len(over['points'])} bins of {BIN} iterations of all online runs (bins of one run are not "
            f"independent, so the p-value is optimistic); per method: {per}. Gap = proxy shift - gold shift "
            "from the SFT policy, each in units of the SFT policy's per-sample std (proxy "
            f"{over['sft']['reward_std']:.3f}, gold {over['sft']['gold_std']:.3f})."
        )
    return text


def figures(runs: dict[str, list[dict]], out: str, over: dict | None = None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    sft_gold = [r["summary"]["gold"] for r in runs.get("sft", []) if "gold" in r["summary"]]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.4))
    for i, m in enumerate(ONLINE):
        rs = [r for r in runs.get(m, []) if r["rows"]]
        if not rs:
            continue
        for ax, key, width in zip(axes, ("reward", KL, GOLD), (1, 1, BIN), strict=True):
            per_seed = [binned(r, key, width) for r in rs]
            xs = common_bins(per_seed)
            if not xs:
                continue
            y = np.array([[c[b] for b in xs] for c in per_seed])
            mu, sd = y.mean(0), y.std(0, ddof=1) if len(y) > 1 else np.zeros(len(xs))
            its = np.array(xs) * width + (width + 1) / 2
            ax.plot(its, mu, color=f"C{i}", label=f"{m} (n={len(rs)})", lw=1)
            ax.fill_between(its, mu - sd, mu + sd, color=f"C{i}", alpha=0.2)
            ax.set_xlabel("iteration")
            ax.set_title(
                f"{key} (mean ± 1 std over seeds" + (f", {width}-iteration bins)" if width > 1 else ")")
            )
    if sft_gold:
        axes[2].axhline(np.mean(sft_gold), color="k", ls="--", lw=1, label="SFT policy")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    written.append(_save(fig, out, "curves.png"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    for i, m in enumerate(METHODS):
        rs = runs.get(m, [])
        if not rs:
            continue
        kl = [r["summary"].get("kl_ref") for r in rs]
        rew = [r["summary"].get("reward") for r in rs]
        axes[0].scatter(kl, rew, color=f"C{i}", s=12)
        axes[0].scatter([np.mean(kl)], [np.mean(rew)], color=f"C{i}", s=80, label=m)
        if m in ONLINE:  # gold along training: seed-mean per bin against the seed-mean sqrt(KL_ref)
            curves = [(binned(r, KL), binned(r, GOLD)) for r in rs if r["rows"]]
            xs = common_bins([k for k, _ in curves] + [g for _, g in curves])
            if xs:
                x = [np.sqrt(max(np.mean([k[b] for k, _ in curves]), 0)) for b in xs]
                y = [np.mean([g[b] for _, g in curves]) for b in xs]
                axes[1].plot(x, y, "-o", color=f"C{i}", ms=3, lw=1, label=m)
        elif rs and "gold" in rs[0]["summary"]:
            g = [r["summary"]["gold"] for r in rs]
            axes[1].scatter(
                [np.sqrt(max(np.mean(kl), 0))], [np.mean(g)], color=f"C{i}", s=60, marker="s", label=m
            )
    axes[0].set(
        xlabel="KL_ref (window)", ylabel="proxy reward (window)", title="reward vs KL_ref (seeds small)"
    )
    axes[1].set(xlabel="sqrt(KL_ref)", ylabel="gold", title=f"gold vs sqrt(KL_ref), {BIN}-iteration bins")
    if over is not None:
        for i, m in enumerate(ONLINE):
            pts = [p for p in over["points"] if p[0] == m]
            if pts:
                axes[2].scatter(
                    [np.sqrt(max(p[3], 0)) for p in pts], [p[4] for p in pts], color=f"C{i}", s=8, label=m
                )
        axes[2].axhline(0, color="k", lw=0.5)
        axes[2].set(
            xlabel="sqrt(KL_ref)",
            ylabel="proxy shift - gold shift (SFT std units)",
            title=f"proxy-gold gap (Spearman rho {over['rho']:+.2f})",
        )
    for ax in axes[:2]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    written.append(_save(fig, out, "pareto_gold.png"))
    return written


def _save(fig, out, name) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=100)
    plt.close(fig)
    return name


KL_OLD, LR = "rgpo/kl_old_iteration", "learning_rate"
KL_COEF, REJECTED = "rgpo/kl_coef", "rgpo/rejected_frac"  # did the gate against pi_old act?
EARLY = 50  # iterations: "early training" in the dynamics table


def _per_run(rs: list[dict], key: str, fn) -> list[float]:
    """``fn`` of each run's ``key`` column over its iterations (runs without the column left out)."""
    out = []
    for r in rs:
        values = [(row["iteration"], row[key]) for row in r["rows"] if row.get(key) is not None]
        if values:
            out.append(fn(values))
    return out


def dynamics(runs: dict[str, list[dict]], window: tuple[int, int]) -> list[dict]:
    """What a window mean hides, per online method (mean ± std over seeds of per-run values): KL_ref,
    KLhat_old (methods that log it) and gold in the window, their maximum over all iterations and their mean
    over the first ``EARLY`` iterations; and the learning rate in the window as a share of its peak (the
    schedule decays)."""
    lo, hi = window
    rows = []
    for m in ONLINE:
        rs = [r for r in runs.get(m, []) if r["rows"]]
        if not rs:
            continue
        row = {"method": m, "n": len(rs)}
        for key in (KL, KL_OLD, GOLD):
            row[key] = {
                "window": mean_std(_per_run(rs, key, lambda v: np.mean([x for i, x in v if lo < i <= hi]))),
                "max": mean_std(_per_run(rs, key, lambda v: max(x for _, x in v))),
                "early": mean_std(_per_run(rs, key, lambda v: np.mean([x for i, x in v if i <= EARLY]))),
            }
        row["lr_window_share"] = mean_std(
            _per_run(rs, LR, lambda v: np.mean([x for i, x in v if lo < i <= hi]) / max(x for _, x in v))
        )
        row[KL_COEF] = {
            "window": mean_std(_per_run(rs, KL_COEF, lambda v: np.mean([x for i, x in v if lo < i <= hi]))),
            "min": mean_std(_per_run(rs, KL_COEF, lambda v: min(x for _, x in v))),
        }
        row[REJECTED] = {"max": mean_std(_per_run(rs, REJECTED, lambda v: max(x for _, x in v)))}
        rows.append(row)
    return rows


def _sci(ms) -> str:
    """Mean ± std in 2 significant digits (KLhat_old spans orders of magnitude)."""
    mean, std, n = ms
    return "not run" if n == 0 else f"{mean:.2g}" + (f" ± {std:.2g}" if np.isfinite(std) else "")


def dynamics_markdown(rows: list[dict], window: tuple[int, int]) -> str:
    lo, hi = window
    lines = [
        "Per online method, mean ± std over seeds of each run's value: in the window "
        f"({lo}-{hi}), the maximum over every iteration, and the mean over the first "
        f"{EARLY} iterations; the learning rate decays linearly to 0 (TRL's default "
        "schedule), its window mean as a share of its peak in the last column.",
        "",
        "| method | n | KL_ref window / max / early | KLhat_old window / max / early | "
        "gold window / max / early | learning rate in the window / peak |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        fmt = {KL: lambda ms: _cell(ms, 4), KL_OLD: _sci, GOLD: lambda ms: _cell(ms, 3)}
        cells = [
            " / ".join(fmt[k](r[k][part]) for part in ("window", "max", "early"))
            if r[k]["window"][2]
            else "-"
            for k in (KL, KL_OLD, GOLD)
        ]
        lines.append(f"| {r['method']} | {r['n']} | {' | '.join(cells)} | {_cell(r['lr_window_share'], 3)} |")
    gated = [r for r in rows if r[KL_COEF]["window"][2]]
    if gated:
        lines += [
            "",
            "The KL-to-old controller and the gate against pi_old (methods that log them), mean ± std over "
            "seeds of each run's value: kl_coef in the window and its minimum over training (its floor is "
            "kl_coef_min), and the largest fraction of tokens the gate rejected (g < 0.1) at any iteration.",
            "",
            "| method | n | kl_coef window | kl_coef min | rejected fraction, max over iterations |",
            "|---|---|---|---|---|",
        ]
        for r in gated:
            coef, rejected = r[KL_COEF], r[REJECTED]["max"]
            lines.append(
                f"| {r['method']} | {r['n']} | {_cell(coef['window'], 4)} | {_cell(coef['min'], 4)} | "
                f"{_sci(rejected)} |"
            )
    return "\n".join(lines)


def dynamics_figure(runs: dict[str, list[dict]], out: str) -> list[str]:
    """KLhat_old per iteration (log scale; methods that log it) and the learning rate, mean ± std over
    seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(
        r["rows"] and any(KL_OLD in row for row in r["rows"]) for m in ONLINE for r in runs.get(m, [])
    ):
        return []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for i, m in enumerate(ONLINE):
        rs = [r for r in runs.get(m, []) if r["rows"]]
        for ax, key in zip(axes, (KL_OLD, LR), strict=True):
            per_seed = [c for c in (binned(r, key, 1) for r in rs) if c]
            xs = common_bins(per_seed)
            if not xs:
                continue
            y = np.array([[c[b] for b in xs] for c in per_seed])
            mu, sd = y.mean(0), y.std(0, ddof=1) if len(y) > 1 else np.zeros(len(xs))
            its = np.array(xs) + 1
            ax.plot(its, mu, color=f"C{i}", label=f"{m} (n={len(per_seed)})", lw=1)
            low = np.maximum(mu - sd, mu * 0.1) if key == KL_OLD else mu - sd
            ax.fill_between(its, low, mu + sd, color=f"C{i}", alpha=0.2)
    axes[0].set_yscale("log")
    axes[0].set_title("KLhat_old per iteration (mean ± 1 std over seeds)")
    axes[1].set_title("learning rate")
    for ax in axes:
        ax.set_xlabel("iteration")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return [_save(fig, out, "curves_dynamics.png")]


def _window_of(runs: dict[str, list[dict]]) -> tuple[int, int]:
    """The summary window the runs used (their summary.json), else the last quarter of the longest run."""
    for rs in runs.values():
        for r in rs:
            if r["summary"].get("window"):
                return tuple(r["summary"]["window"])
    n = max((row["iteration"] for rs in runs.values() for r in rs for row in r["rows"]), default=0)
    return (3 * n) // 4, n


def build_report(
    results: str, out: str, plots: bool = True, runs: dict[str, list[dict]] | None = None
) -> str:
    """The comparison report of one suite folder (``runs``: its runs when the caller has loaded them)."""
    runs = load(results) if runs is None else runs
    os.makedirs(out, exist_ok=True)
    rows = table(runs)
    with open(os.path.join(out, "table.json"), "w") as f:
        json.dump(rows, f, indent=2)
    gold_rows, over = gold_vs_sft(runs), overoptimisation(runs)
    with open(os.path.join(out, "gold_vs_sft.json"), "w") as f:
        json.dump(
            {"rows": gold_rows, "overoptimisation": over and {k: v for k, v in over.items()}}, f, indent=2
        )
    samples = heldout_samples(runs)
    tests = {
        "heldout_gold": pairwise(runs, "heldout", "gold"),
        "window_gold": pairwise(runs, "summary", "gold"),
        "heldout_kl_ref": pairwise(runs, "heldout", "kl_ref"),
    }
    with open(os.path.join(out, "pairwise.json"), "w") as f:
        json.dump(tests, f, indent=2)
    window = _window_of(runs)
    dyn = dynamics(runs, window)
    with open(os.path.join(out, "dynamics.json"), "w") as f:
        json.dump(dyn, f, indent=2)
    figs = (figures(runs, out, over) + dynamics_figure(runs, out)) if plots else []
    intro = (
        f"Command: `python -m rgpo_lab.rlhf_report {results} --out {out}`. Mean ± sample std (ddof 1) over n "
        f"finished seeds; window = the preset's summary window; held-out = {samples} sample(s) per held-out "
        "prompt after training (same reward model, gold rule and KL_ref estimator for every method). The "
        "paper's reward column is its improvement over the initial policy on a different model and reward "
        "model: compare orderings, not values."
    )
    sections = ["# RLHF comparison vs the paper (Sec. 7.3)", "", intro, "", markdown(rows), ""]
    sections += ["## What the gold score adds", "", gold_markdown(gold_rows, over, samples), ""]
    sections += ["## Pairwise tests", "", pairwise_markdown(tests["heldout_gold"], "held-out gold"), ""]
    sections += [pairwise_markdown(tests["window_gold"], "window gold"), ""]
    sections += [pairwise_markdown(tests["heldout_kl_ref"], "held-out KL_ref"), ""]
    sections += ["## Training dynamics (what the window means hide)", "", dynamics_markdown(dyn, window), ""]
    sections += [*[f"![{f}]({f})" for f in figs], ""]
    text = "\n".join(sections)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


# --- the studies: the results root holds tune/, final/, frontier/ and reuse/ (rgpo_lab/rlhf_suite.py)


def window_mean(run: dict, key: str) -> float | None:
    """Mean of a per-iteration metric over the run's summary window (iterations start < i <= end)."""
    start, end = run["summary"].get("window", (300, 400))
    x = [row[key] for row in run["rows"] if start < row["iteration"] <= end and row.get(key) is not None]
    return float(np.mean(x)) if x else None


def load_suite(root: str, suite: str) -> dict[str, list[dict]]:
    """``load`` of ``<root>/<suite>``; empty when the suite has not started."""
    path = os.path.join(root, suite)
    return load(path) if os.path.isdir(path) else {}


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
        return _cell(p[c], digits)

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


def study_figures(frontier: list[dict], reuse: list[dict], out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    colour = {m: f"C{i}" for i, m in enumerate(METHODS)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for m in dict.fromkeys(p["method"] for p in frontier):
        pts = sorted((p for p in frontier if p["method"] == m and p["n"] > 0), key=lambda p: p["kl_ref"][0])
        for ax, (x, y) in zip(axes, (("kl_ref", "gold"), ("window_kl_ref", "window_reward")), strict=True):
            if not pts:
                continue
            xerr = [np.nan_to_num(p[x][1]) for p in pts]
            yerr = [np.nan_to_num(p[y][1]) for p in pts]
            style = {"fmt": "-o", "color": colour[m], "ms": 4, "lw": 1, "capsize": 2, "label": m}
            ax.errorbar([p[x][0] for p in pts], [p[y][0] for p in pts], xerr=xerr, yerr=yerr, **style)
            for p in pts:
                ax.annotate(
                    f"{p['value']}", (p[x][0], p[y][0]), fontsize=6, xytext=(3, 3), textcoords="offset points"
                )
    axes[0].set(
        xlabel="held-out KL_ref", ylabel="held-out gold", title="gold frontier (labels: beta_ref; ± 1 std)"
    )
    axes[1].set(xlabel="window KL_ref", ylabel="window proxy reward", title="proxy frontier")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    written.append(_save(fig, out, "frontier.png"))
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    panels = [
        ("gold", "held-out gold"),
        ("kl_ref", "held-out KL_ref"),
        ("window_reward", "window proxy reward"),
        ("kl_old", "KLhat_old (window)"),
        ("rejected_frac", "rejected fraction (RGPO) "),
        ("clip_frac", "clipped fraction (clip methods)"),
    ]
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        for m in dict.fromkeys(p["method"] for p in reuse):
            pts = [p for p in reuse if p["method"] == m and p["n"] > 0 and p[key][2] > 0]
            if pts:
                yerr = [np.nan_to_num(p[key][1]) for p in pts]
                style = {"fmt": "-o", "color": colour[m], "ms": 4, "lw": 1, "capsize": 2, "label": m}
                ax.errorbar([int(p["value"]) for p in pts], [p[key][0] for p in pts], yerr=yerr, **style)
        ax.set(xscale="log", xlabel="num_iterations (reuses of a generation batch)", title=title)
        ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
        if key == "kl_old":
            ax.set_yscale("log")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    written.append(_save(fig, out, "reuse.png"))
    # along training, per reuse count: does the pi_old gate or the controller start to act as samples get
    # staler?
    methods = list(dict.fromkeys(p["method"] for p in reuse))
    panels = [
        (PROXY, "proxy reward"),
        (GOLD, "gold"),
        (KL, "KL_ref"),
        ("rgpo/kl_old", "KLhat_old"),
        ("rgpo/rejected_frac", "rejected fraction"),
        ("clip_ratio/region_mean", "clipped fraction"),
        ("rgpo/kl_coef", "kl_coef"),
    ]
    fig, axes = plt.subplots(
        len(methods), len(panels), figsize=(3 * len(panels), 2.4 * len(methods)), squeeze=False
    )
    for row, m in zip(axes, methods, strict=True):
        for ax, (key, title) in zip(row, panels, strict=True):
            for i, p in enumerate(p for p in reuse if p["method"] == m and p["n"] > 0):
                curves = [binned(r, key) for r in p["runs"]]
                xs = common_bins(curves)
                if xs:
                    means = [np.mean([c[b] for c in curves]) for b in xs]
                    label = f"{p['value']} (n={p['n']})"
                    ax.plot(np.array(xs) * BIN + (BIN + 1) / 2, means, color=f"C{i}", lw=1, label=label)
            ax.set_title(f"{m}: {title}", fontsize=8)
            ax.tick_params(labelsize=6)
            if not ax.lines:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, fontsize=7)
            elif key == "rgpo/kl_old":  # 0 at one reuse: symlog keeps it on the axis
                ax.set_yscale("symlog", linthresh=1e-8)
            elif key == "rgpo/kl_coef":
                ax.set_yscale("log")
        if row[0].lines:
            row[0].legend(title="num_iterations", fontsize=6, title_fontsize=6)
    for ax in axes[-1]:
        ax.set_xlabel("iteration", fontsize=7)
    fig.suptitle("batch reuse along training (seed mean, bins of 25 iterations)", fontsize=9)
    written.append(_save(fig, out, "reuse_per_iteration.png"))
    return written


def _studies_present(root: str) -> list[str]:
    """The report's title: tuning and the final comparison, the v2 studies where their folders exist (both
    named when either does), the staleness study where one of its suites does."""
    names = ["tuning", "final comparison"]
    if any(os.path.isdir(os.path.join(root, s)) for s in ("frontier", "reuse")):
        names += ["KL frontiers", "batch reuse"]
    if any(os.path.isdir(os.path.join(root, s)) for s in STUDIES):
        names.append("stale samples")
    return names


def build_studies(root: str, out: str, plots: bool = True) -> str:
    """The studies' report: the tuning selection, the final comparison (its own report under final/report),
    the beta_ref frontiers and the batch-reuse study, from the committed runs under ``root``."""

    os.makedirs(out, exist_ok=True)
    parts = [
        "# RLHF studies: " + ", ".join(_studies_present(root)),
        "",
        f"Command: `python -m rgpo_lab.rlhf_report {root} --studies --out {out}`; every number below is "
        "regenerated from the committed runs by it.",
        "",
    ]
    selection = os.path.join(root, "tune", "selection.md")
    if os.path.exists(selection):
        with open(selection) as f:
            parts += ["## Learning-rate selection", "", f.read().split("\n", 2)[2].strip(), ""]
    final = os.path.join(root, "final")
    final_runs = load_suite(root, "final")  # read once: the final report's runs and both studies' base point
    if os.path.isdir(final):
        text = build_report(final, os.path.join(final, "report"), plots, final_runs)
        link = os.path.relpath(os.path.join(final, "report", "report.md"), out)
        after = text.split("## Pairwise tests", 1)[1] if "## Pairwise tests" in text else ""
        parts += ["## Final comparison (selected rates)", ""]
        parts += [f"Full table and figures: [final/report/report.md]({link}).", ""]
        parts += [after.split("![", 1)[0].strip(), ""]
    studies: dict = {}
    if any(os.path.isdir(os.path.join(root, s)) for s in ("frontier", "reuse")):
        frontier = study_points(
            "frontier", load_suite(root, "frontier"), final_runs, FRONTIER_BETAS, FRONTIER_BASE, "beta"
        )
        reuse = study_points("reuse", load_suite(root, "reuse"), final_runs, REUSE, REUSE_BASE, "reuse")
        between = frontier_interpolation(frontier, "rgpo", "ppo")
        tests = reuse_tests(reuse, base=REUSE_BASE)
        strip = lambda pts: [{k: v for k, v in p.items() if k != "runs"} for p in pts]  # noqa: E731
        studies |= {"frontier": strip(frontier), "rgpo_at_ppo": between, "reuse": strip(reuse)}
        studies["reuse_tests"] = tests
        parts += [study_markdown(frontier, reuse, between, tests), ""]
        missing = [f"{p['source']}: {p['method']} at {p['value']}" for p in frontier + reuse if p["n"] == 0]
        if missing:
            parts += ["Not run yet: " + "; ".join(missing) + ".", ""]
        if plots:
            parts += [f"![{f}]({f})" for f in study_figures(frontier, reuse, out)] + [""]
    stale = {s: load_suite(root, s) for s in STUDIES if os.path.isdir(os.path.join(root, s))}
    if stale:
        text, studies["staleness"] = build_staleness(stale, out, plots)
        parts += [text, ""]
    with open(os.path.join(out, "studies.json"), "w") as f:
        json.dump(studies, f, indent=2)
    text = "\n".join(parts)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results")
    p.add_argument("--out", default=None)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument(
        "--studies",
        action="store_true",
        help="RESULTS is the root holding tune/ final/ frontier/ reuse/: write the studies' report",
    )
    a = p.parse_args(argv)
    build = build_studies if a.studies else build_report
    print(build(a.results, a.out or os.path.join(a.results, "report"), not a.no_plot))


if __name__ == "__main__":
    main()
