"""The policy-lag confirmation (suite policy_lag_confirm) read by its rule, results/mujoco/policy_lag_confirm/
RULES.md, committed before its runs.

    python -m rgpo_lab.mujoco_confirm_report                # -> results/mujoco/policy_lag_confirm/report/

Run from the repository root. Reads every run the suite lists (its own and the ones it reuses from
policy_lag, main_compiled and annealed5), so a partial suite gives an interim report that names what is
missing, by class (not started, incomplete, failed). Outcome: the deterministic evaluation return at 1M
steps, normalised by rgpo_lab.mujoco_normalisation. The status is final only with every run finished and
every one of the suite's own runs on the suite commit's code path (`code_path_check`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rgpo_lab.json_values import plain
from rgpo_lab.mujoco_normalisation import Normaliser
from rgpo_lab.mujoco_report.confirm_curves import curves
from rgpo_lab.mujoco_report.confirm_md import report_md
from rgpo_lab.mujoco_report.confirm_reading import attribution_words, decoupling_words, provenance, status_of
from rgpo_lab.mujoco_report.confirm_runs import COMPARISONS, OUT, RESULTS, load
from rgpo_lab.mujoco_report.confirm_statistics import (
    arm_table,
    compare,
    gate_activity,
    improvement,
    retention,
    sensitivity,
)


def build(results: str = RESULTS, out: str = OUT, n_boot: int = 10_000, plots: bool = True) -> str:
    suite = load(results)
    data = suite.data
    norm = Normaliser.load(os.path.join(results, "normalisation", "baselines.json"))
    tables = arm_table(data, norm)
    comparisons = [compare(data, norm, a, b, n_boot) for _, _, a, b in COMPARISONS]
    ret = retention(data, n_boot)
    gates = gate_activity(data)
    poi = improvement(data, n_boot)
    prov = provenance(suite.commits)
    status, prefix = status_of(suite.missing, prov)
    sens = sensitivity(data, norm, n_boot)
    md = report_md(suite, tables, comparisons, ret, gates, poi, prov, n_boot, sens)
    os.makedirs(out, exist_ok=True)
    if plots:
        curves(data, out)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    studies = {
        "status": status,
        "missing": suite.missing,
        "failed_why": suite.why_failed,
        "arms": tables,
        "comparisons": [
            {"family": fam, "name": name, "a": a, "b": b, **c}
            for (fam, name, a, b), c in zip(COMPARISONS, comparisons, strict=True)
        ],
        "retention": ret,
        "gate_activity": gates,
        "reading": prefix + attribution_words(comparisons),
        "decoupling": prefix + decoupling_words(comparisons),
        "probability_of_improvement": poi,
        "provenance": prov,
        "sensitivity": sens,
    }
    with open(os.path.join(out, "studies.json"), "w") as f:
        json.dump(plain(studies), f, indent=1, allow_nan=False)
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.mujoco_confirm_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--out", default=OUT)
    p.add_argument("--bootstrap", type=int, default=10_000)
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args(argv)
    print(build(a.results, a.out, a.bootstrap, not a.no_plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
