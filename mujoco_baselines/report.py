"""Paper-style table and learning curves from a grid of MuJoCo baseline runs.

    python mujoco_baselines/report.py runs/ --out benchmarks/results/mujoco_grid

Reads every ``<run>/config.json`` + ``metrics.csv`` (+ ``final.json``) under the given directories,
groups runs by (env, method) and writes ``<out>.md`` / ``<out>.csv`` (one row per group) and
``<out>_curves.png`` (return, KL to pi_old and ESS per iteration, mean +- std over seeds).

Columns (metric definitions in mujoco_baselines/README.md, "Outputs and logs"; computed per seed, then mean +- std over seeds):
- final return: mean of the last 100 episodes of a seed (``final.json``), mean +- std over seeds
- KL mean: mean over iterations of the iteration KL (mean over mini-batches of mean(r - 1 - log r))
- KL max: the largest iteration KL of any seed
- spike rate: fraction of iterations with iteration KL > 0.04
- ESS: mean over iterations (w per method: RGPO g'(r) r, PPO clip(r), TRPO r, AWR its weights)
- grad var: mean over iterations of the per-iteration gradient variance
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import numpy as np
import pandas as pd


def method_label(cfg: dict) -> str:
    name = cfg.get("exp_name", "?").replace("_continuous_action", "")
    if name == "rgpo" and cfg.get("gate", "sigmoid") != "sigmoid":
        name += f"[{cfg['gate']}]"
    return name


def load_runs(dirs):
    runs = []
    for d in dirs:
        for cfg_path in sorted(glob.glob(os.path.join(d, "**", "config.json"), recursive=True)):
            run_dir = os.path.dirname(cfg_path)
            metrics_path = os.path.join(run_dir, "metrics.csv")
            if not os.path.exists(metrics_path):
                continue
            cfg = json.load(open(cfg_path))
            df = pd.read_csv(metrics_path)
            if df.empty:
                continue
            final_path = os.path.join(run_dir, "final.json")
            final = json.load(open(final_path)) if os.path.exists(final_path) else None
            runs.append({"cfg": cfg, "df": df, "final": final, "dir": run_dir})
    return runs


def summarise(runs, spike_kl=0.04):
    rows = []
    groups = {}
    for r in runs:
        groups.setdefault((r["cfg"]["env_id"], method_label(r["cfg"])), []).append(r)
    for (env, method), rs in sorted(groups.items()):
        finals = [r["final"]["final_return"] for r in rs if r["final"]]
        per_seed = pd.DataFrame(
            {
                "kl_mean": [r["df"]["kl"].mean() for r in rs],
                "kl_max": [r["df"]["kl"].max() for r in rs],
                "spike_rate": [(r["df"]["kl"] > spike_kl).mean() for r in rs],
                "ess": [r["df"]["ess"].mean() for r in rs],
                "grad_var": [r["df"]["grad_var"].mean() for r in rs],
                "sps": [r["df"]["SPS"].iloc[-1] for r in rs],
                "steps": [r["df"]["global_step"].iloc[-1] for r in rs],
            }
        )
        rows.append(
            {
                "env": env,
                "method": method,
                "seeds": len(rs),
                "finished": len(finals),
                "steps": int(per_seed["steps"].min()),
                "final_return_mean": float(np.mean(finals)) if finals else float("nan"),
                "final_return_std": float(np.std(finals)) if finals else float("nan"),
                "worst_seed_return": float(np.min(finals)) if finals else float("nan"),
                "kl_mean": per_seed["kl_mean"].mean(),
                "kl_max": per_seed["kl_max"].max(),
                "spike_rate": per_seed["spike_rate"].mean(),
                "ess_mean": per_seed["ess"].mean(),
                "grad_var_mean": per_seed["grad_var"].mean(),
                "sps_mean": per_seed["sps"].mean(),
            }
        )
    return pd.DataFrame(rows), groups


def to_markdown(table: pd.DataFrame) -> str:
    lines = [
        "| env | method | seeds | steps | final return (mean ± std) | worst seed | KL mean | KL max | spike rate "
        "| ESS | grad var | SPS |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r.env} | {r.method} | {r.seeds} | {r.steps} | {r.final_return_mean:.1f} ± {r.final_return_std:.1f} "
            f"| {r.worst_seed_return:.1f} | {r.kl_mean:.4f} | {r.kl_max:.4f} | {100 * r.spike_rate:.0f}% "
            f"| {r.ess_mean:.3f} | {r.grad_var_mean:.2e} | {r.sps_mean:.0f} |"
        )
    return "\n".join(lines)


def plot(groups, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({env for env, _ in groups})
    panels = [("return_last100", "return (last 100 episodes)"), ("kl", "KL to pi_old"), ("ess", "ESS")]
    fig, axes = plt.subplots(
        len(envs), len(panels), figsize=(5 * len(panels), 3.6 * len(envs)), squeeze=False
    )
    for i, env in enumerate(envs):
        for (genv, method), rs in sorted(groups.items()):
            if genv != env:
                continue
            n = min(len(r["df"]) for r in rs)
            x = rs[0]["df"]["global_step"].to_numpy()[:n]
            for j, (key, title) in enumerate(panels):
                y = np.stack([r["df"][key].to_numpy()[:n] for r in rs])
                m, s = np.nanmean(y, 0), np.nanstd(y, 0)
                ax = axes[i, j]
                ax.plot(x, m, label=f"{method} ({len(rs)} seeds)")
                ax.fill_between(x, m - s, m + s, alpha=0.2)
                ax.set_title(f"{env}: {title}")
                ax.set_xlabel("environment steps")
                if key == "kl":
                    ax.axhline(0.04, color="k", ls=":", lw=0.8)
        axes[i, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", help="directories containing run folders (e.g. runs/)")
    p.add_argument(
        "--out", default="mujoco_report", help="output prefix: <out>.md, <out>.csv, <out>_curves.png"
    )
    p.add_argument("--spike-kl", type=float, default=0.04)
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args()
    runs = load_runs(args.dirs)
    if not runs:
        raise SystemExit(f"no runs (config.json + metrics.csv) under {args.dirs}")
    table, groups = summarise(runs, args.spike_kl)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    table.to_csv(args.out + ".csv", index=False)
    md = to_markdown(table)
    with open(args.out + ".md", "w") as f:
        f.write(md + "\n")
    if not args.no_plot:
        plot(groups, args.out + "_curves.png")
    print(md)


if __name__ == "__main__":
    main()
