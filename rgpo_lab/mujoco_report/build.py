"""The report from a results folder: `build_report` writes report.md, the CSVs, aggregate.json and
studies.json from the other modules; `main` is `python -m rgpo_lab.mujoco_report`'s command line."""

from __future__ import annotations

import argparse
import json
import os

from rgpo_lab import mujoco_report
from rgpo_lab.json_values import plain
from rgpo_lab.mujoco_report.eager_vs_compiled import eager_vs_compiled, eager_vs_compiled_md
from rgpo_lab.mujoco_report.figures import figures, policy_lag_figures, study_figures
from rgpo_lab.mujoco_report.paper_tables import (
    PAPER_BETA0,
    PAPER_K_SWEEP,
    aggregate,
    aggregate_md,
    ess_md,
    gates_md,
    gates_table,
    kl_md,
    kl_table,
    long_kl_md,
    long_kl_table,
    long_md,
    long_table,
    main_returns_md,
    main_returns_table,
    ppo_kl_md,
    single_runs_md,
    status_md,
)
from rgpo_lab.mujoco_report.policy_lag import policy_lag_md, policy_lag_tables
from rgpo_lab.mujoco_report.runs import load_runs
from rgpo_lab.mujoco_report.studies import STUDIES, study_md, study_tests


def build_report(results: str, out: str, n_boot: int = 2000, plots: bool = True) -> str:
    runs = load_runs(results)
    os.makedirs(out, exist_ok=True)
    main_t, kl_t, gates_t = main_returns_table(runs), kl_table(runs), gates_table(runs)
    k_t, k_md = single_runs_md(runs, "k_sweep", PAPER_K_SWEEP, "k sweep (1 epoch, seed 1)")
    b_t, b_md = single_runs_md(runs, "beta0", PAPER_BETA0, "beta0 / target (seed 1)")
    long_rows = long_table(runs)
    agg = aggregate(runs, n_boot)
    main_t.to_csv(os.path.join(out, "main_returns.csv"), index=False)
    kl_t.to_csv(os.path.join(out, "kl_ess.csv"), index=False)
    gates_t.to_csv(os.path.join(out, "gates.csv"), index=False)
    k_t.to_csv(os.path.join(out, "k_sweep.csv"), index=False)
    b_t.to_csv(os.path.join(out, "beta0.csv"), index=False)
    with open(os.path.join(out, "aggregate.json"), "w") as f:
        json.dump(plain(agg, named_as_dicts=True), f, indent=2, allow_nan=False)
    figs = (figures(runs, out) + study_figures(runs, out) + policy_lag_figures(runs, out)) if plots else []
    studies = {}
    for name, study in STUDIES.items():
        studies[name], contrasts = study_tests(runs, study)
        if study.get("contrasts"):
            studies[f"{name}_contrasts"] = contrasts
    studies["policy_lag"] = policy_lag_tables(runs)
    studies["eager_vs_compiled"] = eager_vs_compiled(runs)
    with open(os.path.join(out, "studies.json"), "w") as f:
        json.dump(plain(studies, named_as_dicts=True), f, indent=2, allow_nan=False)
    sections = [
        ("Runs", status_md(runs)),
        ("Final return at 1M steps (paper Table main_results)", main_returns_md(main_t)),
        ("KL to pi_old (paper Table kl_stats; both KL definitions)", kl_md(kl_t)),
        ("ESS (paper Table ess_all)", ess_md(kl_t)),
        ("Aggregate over environments (beyond the paper)", aggregate_md(agg)),
        ("Gate comparison, HalfCheetah-v4 (paper Ablation A)", gates_md(gates_t)),
        ("Gate sharpness k (paper Ablation B)", k_md),
        ("beta0 and target (paper Ablation F)", b_md),
        (
            "Long horizon, HalfCheetah-v4 (paper Table longhorizon)",
            long_md(long_rows) + "\n\n" + long_kl_md(long_kl_table(runs)),
        ),
        ("The PPO-KL question", ppo_kl_md(runs)),
        *((f"When does RGPO help? {name}", study_md(runs, study, n_boot)) for name, study in STUDIES.items()),
        ("Eager vs compiled, 1M steps (main vs main_compiled)", eager_vs_compiled_md(runs)),
        ("Stale samples (policy lag)", policy_lag_md(runs)),
    ]
    md = [
        "# MuJoCo results vs the paper",
        "",
        f"Command: `python -m rgpo_lab.mujoco_report {results} --out {out}`. Statistics as in the report's "
        "docstring: mean ± sample std (ddof 1) over n finished seeds; 'not run' = no finished run yet.",
        "",
    ]
    for title, body in sections:
        md += [f"## {title}", "", body, ""]
    md += ["## Figures", ""] + [f"![{f}]({f})" for f in figs]
    text = "\n".join(md) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def main(argv=None):
    doc = mujoco_report.__doc__  # the package's docstring is the --help text
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.mujoco_report",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results", help="results root with one folder per suite (e.g. results/mujoco)")
    p.add_argument("--out", default=None, help="output folder (default: <results>/report)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the aggregate CIs")
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args(argv)
    if not os.path.isdir(a.results):
        raise SystemExit(f"ERROR: {a.results} is not a directory")
    print(build_report(a.results, a.out or os.path.join(a.results, "report"), a.bootstrap, not a.no_plot))
