"""The reports' figures (PNG): reward, KL_ref and gold along training, the Pareto and over-optimisation
plots, the dynamics curves, the frontier and reuse plots. matplotlib is imported inside each function,
so that --no-plot runs without it."""

from __future__ import annotations

import os

import numpy as np

from rgpo_lab.rlhf_report.dynamics import KL_OLD, LR
from rgpo_lab.rlhf_report.runs import BIN, GOLD, KL, PROXY, binned, common_bins
from rgpo_lab.rlhf_suite import METHODS, ONLINE


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
    written.append(save_figure(fig, out, "curves.png"))
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
    written.append(save_figure(fig, out, "pareto_gold.png"))
    return written


def save_figure(fig, out: str, name: str) -> str:
    """Write ``fig`` as ``out/name`` (100 dpi, tight layout), close it and return ``name``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=100)
    plt.close(fig)
    return name


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
    return [save_figure(fig, out, "curves_dynamics.png")]


def study_figures(frontier: list[dict], reuse: list[dict], out: str) -> list[str]:
    """frontier.png, reuse.png and reuse_per_iteration.png."""
    import matplotlib

    matplotlib.use("Agg")
    return [frontier_figure(frontier, out), reuse_figure(reuse, out), reuse_per_iteration_figure(reuse, out)]


def frontier_figure(frontier: list[dict], out: str) -> str:
    """Gold against held-out KL_ref and proxy reward against window KL_ref, per method along beta_ref."""
    import matplotlib.pyplot as plt

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
    return save_figure(fig, out, "frontier.png")


def reuse_figure(reuse: list[dict], out: str) -> str:
    """The batch-reuse study's held-out and window numbers against num_iterations, per method."""
    import matplotlib.pyplot as plt

    colour = {m: f"C{i}" for i, m in enumerate(METHODS)}
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
    return save_figure(fig, out, "reuse.png")


def reuse_per_iteration_figure(reuse: list[dict], out: str) -> str:
    """Along training, per method and reuse count: does the pi_old gate or the controller start to act as
    samples get staler?"""
    import matplotlib.pyplot as plt

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
    return save_figure(fig, out, "reuse_per_iteration.png")
