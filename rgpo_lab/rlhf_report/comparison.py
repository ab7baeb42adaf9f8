"""One suite's comparison: the paper's table beside ours, each method's gold against the SFT policy
(and the proxy-gold gap against KL_ref), and the pairwise Welch tests with Holm within each family."""

from __future__ import annotations

import numpy as np
from scipy import stats

from rgpo_lab.rlhf_report.runs import BIN, GOLD, KL, PROXY, binned, common_bins
from rgpo_lab.rlhf_suite import METHODS, ONLINE
from rgpo_lab.statistics import holm, mean_std
from rgpo_lab.statistics import welch as welch_test

# The paper's Table rlhf_main (reward improvement over the initial policy; KL to the reference), Qwen2.5-1.5B.
PAPER = {
    "rgpo": {"reward": 0.243, "kl_ref": 0.364},
    "ppo": {"reward": 0.211, "kl_ref": 0.434},
    "grpo": {"reward": 0.236, "kl_ref": 0.778},
    "dpo": {"kl_ref": 0.079},
}


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


def ms_cell(ms, digits=3) -> str:
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
            f"| {r['method']} | {r['n']} | {ms_cell(r['reward'])} | {ms_cell(r['reward_gain'])} | "
            f"{ms_cell(r['kl_ref'])} | {ms_cell(r['gold'])} | {ms_cell(r['heldout_reward'])} | "
            f"{ms_cell(r['heldout_gold'])} | {ms_cell(r['heldout_kl_ref'])} | {paper} |"
        )
    return "\n".join(lines)


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
