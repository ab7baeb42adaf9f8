"""The confirmation report's curves.png: every arm's training return over the run (secondary)."""

from __future__ import annotations

import os

import numpy as np

from rgpo_lab.mujoco_grid import CONFIRM_ENVS
from rgpo_lab.mujoco_report.confirm_runs import ARMS, LABELS

CURVE_ROWS = (  # every arm has a curve: the decoupled L = 8 arms, then the plain L = 8 arms and the baselines
    (("ppo_dec", "rgpo_dec", "ppo_dec_kl", "rgpo_dec_nokl"), "L = 8, decoupled arms"),
    (("ppo_plain", "rgpo_plain", "ppo_L0", "rgpo_L0"), "plain arms at L = 8 and the L = 0 baselines"),
)


def curves(data, out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_envs = len(CONFIRM_ENVS)
    fig, axes = plt.subplots(
        len(CURVE_ROWS), n_envs, figsize=(5 * n_envs, 3.6 * len(CURVE_ROWS)), squeeze=False
    )
    for row, (arms, title) in zip(axes, CURVE_ROWS, strict=True):
        for ax, e in zip(row, CONFIRM_ENVS, strict=True):
            for arm in arms:
                runs = data[arm][e]
                if not runs:
                    continue
                n = min(len(m) for _, _, m in runs)
                x = runs[0][2]["global_step"].to_numpy()[:n]
                y = np.stack([m["return_last100"].to_numpy()[:n] for _, _, m in runs])
                lo, mid, hi = np.nanpercentile(y, [25, 50, 75], axis=0)
                colour = f"C{list(ARMS).index(arm)}"  # one colour per arm across both rows
                ax.plot(x, mid, lw=1, color=colour, label=f"{LABELS[arm]} (n={len(runs)})")
                ax.fill_between(x, lo, hi, color=colour, alpha=0.2)
            ax.set_title(f"{e}: {title}", fontsize=9)
            ax.set_xlabel("environment steps")
            ax.set_ylabel("training return (last 100 episodes)")
        row[0].legend(fontsize=7)
    fig.suptitle(
        "Secondary (never decisive): median and interquartile band over seeds; at L = 8 the training "
        "episodes are the lagged actor's",
        fontsize=9,
    )
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
