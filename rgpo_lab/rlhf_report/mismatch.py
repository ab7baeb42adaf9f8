"""The mismatch study read by its rule (results/rlhf/v3/mismatch/RULES.md, rgpo_lab.rlhf_mismatch.RULE).

    python -m rgpo_lab.rlhf_mismatch_report          # -> results/rlhf/v3/mismatch/report/

Run from the repository root. Reads the finished runs of v3/mismatch and v3/mismatch_lag (a run is finished
when its heldout.json exists); a partial study gives an interim report naming what is missing. Writes
report.md, studies.json, curves.png (per-step gold, every arm, mean and seed band per cell) and gate.png
(rgpo's rejected share and the share of ratios outside [0.5, 2] per step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rgpo_lab.json_values import plain
from rgpo_lab.rlhf_report.mismatch_figures import figures
from rgpo_lab.rlhf_report.mismatch_markdown import report_md
from rgpo_lab.rlhf_report.mismatch_runs import OUT, RESULTS, load
from rgpo_lab.rlhf_report.mismatch_verdicts import (
    cell_tests,
    change_from_control,
    diverged,
    families,
    hurt_by_cell,
    sensitivity,
)


def build(results: str = RESULTS, out: str = OUT) -> str:
    data, missing, failed = load(results)
    tests = {cell: cell_tests(data, cell) for cell in data}
    hurt, changes, diverged_runs = hurt_by_cell(data), change_from_control(data), diverged(data)
    sens = sensitivity(data, tests)
    md = report_md(data, missing, failed, tests, hurt, changes, diverged_runs, sens)
    os.makedirs(out, exist_ok=True)
    figures(data, out)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "studies.json"), "w") as f:
        status = "final" if not missing else "interim"
        summary = {
            "status": status,
            "missing": missing,
            "failed": failed,
            "diverged": diverged_runs,
            "families": families(data),
            "cells": tests,
            "hurt": hurt,
            "changes": changes,
            "sensitivity": sens,
        }
        json.dump(plain(summary), f, indent=1, allow_nan=False)
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.rlhf_mismatch_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--out", default=OUT)
    a = p.parse_args(argv)
    print(build(a.results, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
