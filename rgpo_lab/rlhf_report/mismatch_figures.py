"""The mismatch study's figures: curves.png (training gold per cell and arm) and gate.png (rgpo's rejected
share and the mismatch shares). matplotlib is imported inside `figures`."""

from __future__ import annotations

import math
import os

import numpy as np

from rgpo_lab import rlhf_mismatch as mm

CURVE_BIN = 20  # steps per point of the plotted curves (a step's gold is the mean over 16 completions)


def binned(curve, width=CURVE_BIN) -> dict[int, float]:
    bins: dict[int, list[float]] = {}
    for it, v in curve:
        bins.setdefault(int((it - 1) // width), []).append(v)
    return {(b + 1) * width: float(np.mean(v)) for b, v in bins.items()}


def figures(data, out: str) -> None:
    """curves.png: per cell, every arm's binned training gold (mean over seeds, band of one standard error);
    gate.png: per cell, rgpo's rejected share and the shares of ratios outside [0.5, 2] and [0.9, 1.1]. Each
    arm / series keeps one colour in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(data)
    for name, arms, keys in (
        ("curves.png", mm.ARMS, ("gold",)),
        ("gate.png", ("rgpo",), ("rejected_frac", "outside_0.5_2", "outside_0.9_1.1")),
    ):
        cols = 4
        rows = max(1, math.ceil(len(cells) / cols))
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), sharex=True, squeeze=False)
        for ax, cell in zip(axes.flat, cells, strict=False):
            for arm in arms:
                for key in keys:
                    per_seed = [binned(r["curves"][key]) for r in data[cell].get(arm, []) if r["curves"][key]]
                    if not per_seed:
                        continue
                    steps = sorted(set.intersection(*(set(c) for c in per_seed)))
                    y = np.array([[c[t] for t in steps] for c in per_seed])
                    mean = y.mean(0)
                    se = y.std(0, ddof=1) / np.sqrt(len(y)) if len(y) > 1 else np.zeros_like(mean)
                    label = arm if len(keys) == 1 else key
                    colour = f"C{(list(arms).index(arm) if len(keys) == 1 else keys.index(key)) % 10}"
                    ax.plot(steps, mean, label=label, lw=1, color=colour)
                    ax.fill_between(steps, mean - se, mean + se, alpha=0.2, color=colour)
            ax.set_title(cell, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in list(axes.flat)[len(cells) :]:
            ax.axis("off")
        series = list(arms) if len(keys) == 1 else list(keys)
        handles = [
            matplotlib.lines.Line2D([], [], color=f"C{i % 10}", label=label) for i, label in enumerate(series)
        ]
        fig.legend(handles=handles, loc="lower center", ncol=8, fontsize=8)
        ylabel = "training gold (16 completions a step)" if name == "curves.png" else "share of tokens"
        fig.supylabel(ylabel, fontsize=9, x=0.002)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        fig.savefig(os.path.join(out, name), dpi=100)
        plt.close(fig)
