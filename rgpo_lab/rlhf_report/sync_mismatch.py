"""The synchronous sampler-mismatch study read by its rule (results/rlhf/v3/sync_mismatch/RULES.md,
rgpo_lab.rlhf_sync_mismatch.RULE), written before the suite's results exist.

    python -m rgpo_lab.rlhf_report.sync_mismatch [--out DIR]   # -> results/rlhf/v3/sync_mismatch/report/

Run from the repository root. Reads precheck.json (which cells rank), selection.json (the tuned rates) and
the finished runs of v3/sync_mismatch (heldout.json and the per-step log); a partial suite gives an interim
report naming what is missing. Writes report.md, verdicts.json and dose_response.png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from rgpo_lab import rlhf_sync_mismatch as smm
from rgpo_lab.json_values import plain
from rgpo_lab.rlhf_report import sync_mismatch_markdown as md
from rgpo_lab.rlhf_report import sync_mismatch_verdicts as sv
from rgpo_lab.rlhf_report.sync_mismatch_runs import load, planned


def verdicts(results: str) -> dict:
    """Everything the report says, as data (verdicts.json)."""
    pre = smm.read_json("precheck.json")
    if pre is None or not pre.get("complete"):
        raise SystemExit("the pre-check has not finished: python -m rgpo_lab.rlhf_sync_mismatch precheck")
    ranking = pre["ranking_cells"]
    arms, cells = smm.suite_arms(ranking), list(smm.suite_cells(ranking))
    data, missing, failed = load(results, pre)
    return {
        "status": "final" if not missing else "interim",
        "planned": len(planned(pre)),
        "missing": missing,
        "failed": failed,
        "precheck": pre,
        "selection": smm.read_json("selection.json"),
        "arms": arms,
        "ranking_cells": ranking,
        "primary": sv.primary(data, ranking, arms),
        "cells": sv.per_cell(data, cells, ranking, arms),
        "summary": sv.summary(data, cells, arms),
        "dose_response": sv.dose_response(data, cells, arms),
        "gate": sv.gate(data, cells, arms),
        "resumed": {
            f"{arm} {cell} s{r['seed']}": r["resumed_from"]
            for cell, per_arm in data.items()
            for arm, runs in per_arm.items()
            for r in runs
            if r["resumed_from"]
        },
    }


def report_md(v: dict) -> str:
    arms = tuple(v["arms"])
    lines = [
        *md.header_lines(v["planned"] - len(v["missing"]), v["planned"]),
        *md.precheck_lines(v["precheck"]),
        *md.tuning_lines(v["selection"]),
        *md.summary_lines(v["summary"], arms),
        *md.primary_lines(v["primary"]),
        *md.cell_lines(v["cells"], complete=not v["missing"]),
        *md.dose_lines(),
        *md.gate_lines(v["gate"], arms),
        *md.unfinished_lines(v["missing"], v["failed"], v["resumed"]),
    ]
    return "\n".join(lines)


def dose_figure(dose_response: dict, out: str) -> None:
    """dose_response.png: rows test gold and KL_ref, columns k; per arm the mean over seeds against dose
    (categorical positions, doses in order) with a band of ± one sd."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [f"k{k}" for k in smm.REUSE]
    fig, axes = plt.subplots(2, len(ks), figsize=(5 * len(ks), 6), squeeze=False)
    for col, k in enumerate(ks):
        for row, key in enumerate(("gold", "kl_ref")):
            ax = axes[row][col]
            for i, (arm, per_k) in enumerate(dose_response.items()):
                points = [p for p in per_k[k] if p[key]["n"]]
                x = range(len(points))
                mean = np.array([p[key]["mean"] for p in points])
                sd = np.array([p[key]["std"] if p[key]["n"] > 1 else 0.0 for p in points])
                ax.plot(x, mean, marker="o", lw=1, color=f"C{i}", label=arm)
                ax.fill_between(x, mean - sd, mean + sd, alpha=0.15, color=f"C{i}")
                ax.set_xticks(list(x), [f"{p['dose']:g}" for p in points])
            ax.set_title(f"{'test gold' if key == 'gold' else 'test KL_ref'}, {k}", fontsize=9)
            ax.set_xlabel("logit noise sigma (0: fp32)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "dose_response.png"), dpi=100)
    plt.close(fig)


def build(results: str | None = None, out: str | None = None) -> str:
    results, out = results or smm.RESULTS, out or os.path.join(smm.OUT, "report")
    v = verdicts(results)
    text = report_md(v)
    os.makedirs(out, exist_ok=True)
    dose_figure(v["dose_response"], out)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "verdicts.json"), "w") as f:
        json.dump(plain(v), f, indent=1, allow_nan=False)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.rlhf_report.sync_mismatch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", default=None, help="the results/rlhf folder (default: the checkout's)")
    p.add_argument("--out", default=None, help="default: results/rlhf/v3/sync_mismatch/report")
    a = p.parse_args(argv)
    print(build(a.results, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
