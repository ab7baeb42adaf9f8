r"""Does `--compile` learn the same as the eager update? Reads the grid suite `compile_equiv`.

    python -m rgpo_lab.mujoco_grid compile_equiv --jobs 2      # 48 runs: 4 scripts x Hopper/HalfCheetah x
                                                                 # seeds 0-2 x eager/--compile, 300k steps
    python -m rgpo_lab.benchmarks.compile_equivalence results/mujoco \
        --out results/benchmarks/mujoco_compile_equivalence

`--compile` changes float rounding (inductor fuses and reorders operations), so runs of the same seed diverge
after a few iterations and only distributions can be compared. Per script and environment, for the final
return (mean of the last 100 episodes), the mean per-mini-batch KL to pi_old over all iterations, the mean
final-policy KL and the KL-spike rate: eager and compiled mean +- sample std over the seeds, the difference
in units of the eager seed std, and a two-sided Welch t-test (scipy). The pre-registered criterion for "agrees
within seed noise": no metric with p < 0.05. With 3 seeds a side the test only detects large differences
(about 2.5 seed stds at 80% power); the standardised differences are reported so the reader can judge.
Runs not finished yet are listed, never filled in.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics

from rgpo_lab.benchmarks.common import RESULTS
from rgpo_lab.mujoco_grid import COMPILE_EQUIV_ENVS as ENVS
from rgpo_lab.mujoco_grid import MUJOCO_METHODS as METHODS
from rgpo_lab.results_data import open_metrics

SEEDS = [0, 1, 2]
METRICS = {
    "final_return": "final return",
    "kl": "mean KL (per mini-batch)",
    "kl_final": "mean KL (final policy)",
    "spike": "spike rate",
}


def load_run(run_dir: str) -> dict | None:
    """None while the run has not finished; a recorded log that is not restored raises (`open_metrics`)."""
    try:
        with open(os.path.join(run_dir, "final.json")) as f:
            final = json.load(f)
    except (OSError, ValueError):
        return None
    metrics = open_metrics(run_dir)
    if metrics is None:
        return None
    with metrics as f:
        rows = list(csv.DictReader(f))
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            commit = json.load(f).get("git_commit", "unknown")
    except (OSError, ValueError):
        commit = "unknown"
    return {
        "commit": commit,
        "final_return": float(final["final_return"]),
        "kl": statistics.fmean(float(r["kl"]) for r in rows),
        "kl_final": statistics.fmean(float(r["kl_final"]) for r in rows),
        "spike": statistics.fmean(float(r["spike"]) for r in rows),
        "SPS": float(final["SPS"]),
    }


def welch_p(a: list[float], b: list[float]) -> float:
    """Two-sided Welch p (rgpo_lab.statistics); two constant samples: 1 if equal, else 0."""
    from rgpo_lab.statistics import welch

    if len(a) >= 2 and len(b) >= 2 and statistics.stdev(a) == 0 and statistics.stdev(b) == 0:
        return 1.0 if statistics.fmean(a) == statistics.fmean(b) else 0.0
    return welch(a, b).p


def analyse(results: str) -> dict:
    suite = os.path.join(results, "compile_equiv")
    out, missing, commits = [], [], {"eager": set(), "compile": set()}
    for method in METHODS:
        for env in ENVS:
            side = {}
            for variant in ("eager", "compile"):
                side[variant] = []
                for seed in SEEDS:
                    name = f"{env}__{method}__{variant}__s{seed}__300k"
                    run = load_run(os.path.join(suite, name))
                    (side[variant].append(run) if run else missing.append(name))
                    if run:
                        commits[variant].add(run["commit"][:7])
            row = {
                "method": method,
                "env": env,
                "n_eager": len(side["eager"]),
                "n_compile": len(side["compile"]),
            }
            for key in [*METRICS, "SPS"]:
                a = [r[key] for r in side["eager"]]
                b = [r[key] for r in side["compile"]]
                row[key] = {
                    "eager": a,
                    "compile": b,
                    "p": welch_p(a, b),
                    "std_diff": (statistics.fmean(b) - statistics.fmean(a)) / statistics.stdev(a)
                    if len(a) >= 2 and len(b) >= 1 and statistics.stdev(a) > 0
                    else math.nan,
                }
            if row["n_eager"] >= 2 and row["n_compile"] >= 2:
                row["agrees"] = all(not (row[k]["p"] < 0.05) for k in METRICS)
            out.append(row)
    return {"rows": out, "missing": missing, "commits": {k: sorted(v) for k, v in commits.items()}}


def fmt(values: list[float], digits: int) -> str:
    if not values:
        return "not run"
    if len(values) == 1:
        return f"{values[0]:.{digits}f} (n=1)"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def markdown(r: dict, command: str) -> str:
    lines = [
        "# `--compile` vs eager: learning outcomes over seeds",
        "",
        f"Command: `{command}` (runs: `python -m rgpo_lab.mujoco_grid compile_equiv`). Mean ± sample std "
        "over seeds 0-2, 300k steps, width 256; Δ = (compiled − eager mean) / eager seed std; p: two-sided "
        "Welch t-test. Criterion fixed before the runs: agrees if no metric has p < 0.05 (low power with 3 "
        f"seeds). Commits of the runs: eager {', '.join(r['commits']['eager']) or '-'}; --compile "
        f"{', '.join(r['commits']['compile']) or '-'}.",
        "",
        "| script | env | metric | eager | --compile | Δ (seed stds) | p |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        for key, label in METRICS.items():
            m = row[key]
            digits = 1 if key == "final_return" else 4
            lines.append(
                f"| {row['method']} | {row['env']} | {label} | {fmt(m['eager'], digits)} | "
                f"{fmt(m['compile'], digits)} | {m['std_diff']:+.2f} | {m['p']:.2f} |"
            )
    lines += [
        "",
        "| script | env | seeds (eager / compile) | agrees within seed noise | SPS eager -> compile |",
        "|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        verdict = {True: "yes", False: "**no**"}.get(row.get("agrees"), "not enough runs")
        sps = row["SPS"]
        speed = (
            f"{statistics.fmean(sps['eager']):.0f} -> {statistics.fmean(sps['compile']):.0f}"
            if sps["eager"] and sps["compile"]
            else "-"
        )
        lines.append(
            f"| {row['method']} | {row['env']} | {row['n_eager']} / {row['n_compile']} | "
            f"{verdict} | {speed} |"
        )
    if r["missing"]:
        lines += [
            "",
            f"Not run (or not finished) yet: {len(r['missing'])} runs: " + ", ".join(r["missing"]) + ".",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.compile_equivalence",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("results", help="the grid's results directory (holds compile_equiv/)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "mujoco_compile_equivalence"))
    args = parser.parse_args()
    r = analyse(args.results)
    command = f"python -m rgpo_lab.benchmarks.compile_equivalence {args.results} --out {args.out}"
    with open(args.out + ".json", "w") as f:
        json.dump({**r, "command": command}, f, indent=2)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(r, command))
    print(markdown(r, command))


if __name__ == "__main__":
    main()
