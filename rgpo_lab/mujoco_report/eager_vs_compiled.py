"""main's eager runs against main_compiled's compiled re-runs of the same seeds: whether the two code
paths reach the same returns (compared over seeds: a seed's two runs diverge within the first steps)."""

from __future__ import annotations

import numpy as np

from rgpo_lab.mujoco_grid import MUJOCO_ENVS as ENVS
from rgpo_lab.mujoco_report.cells import fmt, fmt_kl, fmt_p, fmt_tdp
from rgpo_lab.mujoco_report.runs import finished, mean_kl
from rgpo_lab.statistics import holm, mean_std, verdict, welch


def eager_vs_compiled(runs) -> list[dict]:
    """main's eager runs against main_compiled's re-runs of the same seeds (0-2) per environment and method:
    the training return (main's runs have no deterministic evaluation), mean KL, every seed's pair; two-sided
    Welch, Holm over the 8 tests. The check compile_equiv made at 300k steps on two environments, at 1M on all
    four."""
    rows = []
    for env in ENVS:
        for method in ("ppo", "rgpo"):
            eager = finished(runs, suite="main", env=env, method=method)
            compiled = finished(runs, suite="main_compiled", env=env, method=method)
            by_seed = {r.cfg["seed"]: r.final_return for r in compiled}
            rows.append(
                {
                    "env": env,
                    "method": method,
                    "eager": mean_std([r.final_return for r in eager]),
                    "compiled": mean_std(list(by_seed.values())),
                    "kl_eager": mean_kl(eager),
                    "kl_compiled": mean_kl(compiled),
                    "pairs": [(r.cfg["seed"], r.final_return, by_seed.get(r.cfg["seed"])) for r in eager],
                    "test": welch(list(by_seed.values()), [r.final_return for r in eager]),
                }
            )
    for row, p_adj in zip(rows, holm([r["test"].p for r in rows]), strict=True):
        row.update(p_holm=p_adj, verdict=verdict(row["test"].diff, p_adj))
    return rows


def eager_vs_compiled_md(runs) -> str:
    lines = [
        "main's eager runs (seeds 0-2) against main_compiled's compiled re-runs of the same seeds, training "
        "return (last 100 episodes; main's runs have no deterministic evaluation). Two-sided Welch, Holm "
        "over the 8 tests; verdict: compiled against eager. The two paths are different runs of a seed: "
        "--compile's numpy mean action differs from torch's by float32 rounding within the first steps and "
        "the dynamics amplify it (results/benchmarks/mujoco_path_divergence.md), so they are compared over "
        "seeds.",
        "",
        "| env | method | eager | compiled | seed: eager / compiled | mean KL eager / compiled | "
        "Welch t / df / p | Holm p | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in eager_vs_compiled(runs):
        pairs = ", ".join(f"{s}: {e:.0f} / {'-' if c is None else f'{c:.0f}'}" for s, e, c in r["pairs"])
        holm_p = "not tested" if not np.isfinite(r["p_holm"]) else f"{fmt_p(r['p_holm'])}"
        lines.append(
            f"| {r['env']} | {r['method']} | {fmt(*r['eager'])} | {fmt(*r['compiled'])} | {pairs} | "
            f"{fmt_kl(r['kl_eager'])} / {fmt_kl(r['kl_compiled'])} | {fmt_tdp(r['test'])} | {holm_p} | "
            f"{r['verdict']} |"
        )
    return "\n".join(lines)
