"""The paper's RLHF table (Sec. 7.3) beside ours, from a suite's results folder, plus the gold score and the
held-out evaluation the paper does not have, and the figures.

    python recipes/rlhf_report.py results/rlhf/tiny-paper [--out results/rlhf/tiny-paper/report]

Reads only ``<method>__s<seed>/{summary.json, heldout.json, metrics.jsonl}``. Per method: mean +- sample std
(ddof 1) over the finished seeds (n stated) of the window averages (the paper's iterations 300-400) of the
proxy reward, KL_ref and gold, and of the held-out proxy reward, gold and KL_ref. Methods with no finished run
are listed as not run. Figures: reward and KL_ref per iteration (mean +- 1 std over seeds), the reward-KL_ref
Pareto plot (seeds small, means large) and gold against sqrt(KL_ref) per method (over-optimisation curves).
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

METHODS = ["rgpo", "rgpo_old", "ppo", "grpo", "ppo_clip_kl", "sapo", "dpo"]
# The paper's Table rlhf_main (reward improvement over the initial policy; KL to the reference), Qwen2.5-1.5B.
PAPER = {"rgpo": {"reward": 0.243, "kl_ref": 0.364}, "ppo": {"reward": 0.211, "kl_ref": 0.434},
         "grpo": {"reward": 0.236, "kl_ref": 0.778}, "dpo": {"kl_ref": 0.079}}  # fmt: skip


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
            with open(os.path.join(d, f"{f}.json")) as fh:
                run[f] = json.load(fh)
        path = os.path.join(d, "metrics.jsonl")
        run["rows"] = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
        runs.setdefault(method, []).append(run)
    return runs


def mean_std(values) -> tuple[float, float, int]:
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], float)
    if len(x) == 0:
        return float("nan"), float("nan"), 0
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else float("nan"), len(x)


def table(runs: dict[str, list[dict]]) -> list[dict]:
    rows = []
    for m in METHODS:
        rs = runs.get(m, [])
        row = {"method": m, "n": len(rs)}
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
    lines = ["| method | n | reward (window) | KL_ref (window) | gold (window) | held-out reward | held-out gold | "
             "held-out KL_ref | paper: reward / KL_ref |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        p = PAPER.get(r["method"], {})
        paper = f"{p.get('reward', '-')} / {p.get('kl_ref', '-')}" if p else "-"
        lines.append(f"| {r['method']} | {r['n']} | {_cell(r['reward'])} | {_cell(r['kl_ref'])} | {_cell(r['gold'])} | "
                     f"{_cell(r['heldout_reward'])} | {_cell(r['heldout_gold'])} | {_cell(r['heldout_kl_ref'])} | {paper} |")  # fmt: skip
    return "\n".join(lines)


def figures(runs: dict[str, list[dict]], out: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for i, m in enumerate(METHODS):
        rs = [r for r in runs.get(m, []) if r["rows"]]
        if not rs:
            continue
        for ax, key in zip(axes, ("reward", "kl_ref/monitor"), strict=True):
            per_seed = []
            for r in rs:
                by_it: dict[int, list[float]] = {}
                for row in r["rows"]:
                    if row.get(key) is not None:
                        by_it.setdefault(row["iteration"], []).append(row[key])
                per_seed.append({it: float(np.mean(v)) for it, v in by_it.items()})
            its = sorted(set.intersection(*(set(s) for s in per_seed)))
            y = np.array([[s[it] for it in its] for s in per_seed])
            mu, sd = y.mean(0), y.std(0, ddof=1) if len(y) > 1 else np.zeros(len(its))
            ax.plot(its, mu, color=f"C{i}", label=f"{m} (n={len(rs)})", lw=1)
            ax.fill_between(its, mu - sd, mu + sd, color=f"C{i}", alpha=0.2)
            ax.set_xlabel("iteration")
            ax.set_title(key)
    axes[0].legend(fontsize=7)
    written.append(_save(fig, out, "curves.png"))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, m in enumerate(METHODS):
        rs = runs.get(m, [])
        if not rs:
            continue
        kl = [r["summary"].get("kl_ref") for r in rs]
        rew = [r["summary"].get("reward") for r in rs]
        gold = [r["summary"].get("gold") for r in rs]
        axes[0].scatter(kl, rew, color=f"C{i}", s=12)
        axes[0].scatter([np.mean(kl)], [np.mean(rew)], color=f"C{i}", s=80, label=m)
        axes[1].scatter(np.sqrt(np.maximum(kl, 0)), gold, color=f"C{i}", s=12)
        axes[1].scatter([np.sqrt(max(np.mean(kl), 0))], [np.mean(gold)], color=f"C{i}", s=80, label=m)
    axes[0].set(xlabel="KL_ref (window)", ylabel="proxy reward (window)", title="reward vs KL_ref")
    axes[1].set(
        xlabel="sqrt(KL_ref)", ylabel="gold (window)", title="over-optimisation: gold vs sqrt(KL_ref)"
    )
    axes[0].legend(fontsize=7)
    written.append(_save(fig, out, "pareto_gold.png"))
    return written


def _save(fig, out, name) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=100)
    plt.close(fig)
    return name


def build_report(results: str, out: str, plots: bool = True) -> str:
    runs = load(results)
    os.makedirs(out, exist_ok=True)
    rows = table(runs)
    with open(os.path.join(out, "table.json"), "w") as f:
        json.dump(rows, f, indent=2)
    figs = figures(runs, out) if plots else []
    text = "\n".join([
        "# RLHF comparison vs the paper (Sec. 7.3)", "",
        f"Command: `python recipes/rlhf_report.py {results} --out {out}`. Mean ± sample std (ddof 1) over n finished "
        "seeds; window = the preset's summary window; held-out = one sample per held-out prompt after training "
        "(same reward model, gold rule and KL_ref estimator for every method). The paper's reward column is its "
        "improvement over the initial policy on a different model and reward model: compare orderings, not values.",
        "", markdown(rows), "", *[f"![{f}]({f})" for f in figs], "",
    ])  # fmt: skip
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results")
    p.add_argument("--out", default=None)
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args(argv)
    print(build_report(a.results, a.out or os.path.join(a.results, "report"), not a.no_plot))


if __name__ == "__main__":
    main()
