r"""A/B speed of the MuJoCo scripts against an earlier version of them (moving the shared code into
mujoco_baselines/common.py must not slow the scripts down).

    python -m rgpo_lab.benchmarks.mujoco_refactor --baseline-ref <git ref> --rounds 3 \
        --out results/benchmarks/mujoco_refactor

For each script and round, the baseline (the repository's ``mujoco_baselines/`` at ``--baseline-ref``,
extracted with ``git archive``) and the current script run one after the other (the order alternates between
rounds) with ``--compile`` at width 256 on Hopper-v4 for ``--iterations`` iterations, one torch thread. The
baseline script imports the baseline's ``mujoco_baselines`` (each side's package first on
``PYTHONPATH``; before, the installed, i.e. current, ``common.py`` served both sides). The time per iteration
is the median of ``iter_time`` over the iterations after the first two (compilation excluded); the reported
ratio is the median over rounds of baseline time / current time (> 1: the current scripts are faster),
beside the ratio of the two variants' medians over every timed iteration of every round (pooled). The bar:
ratio >= 0.97. Single iterations vary a lot on a shared VM even with nothing else running (see the committed
rounds), so use enough rounds and iterations, or count calls instead
(count_mujoco_calls.py); pinning the benchmark to one core (``taskset -c 0``) keeps other work on the other
cores out of it.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile

from rgpo_lab.benchmarks.common import (
    ONE_THREAD,
    RESULTS,
    ROOT,
    extract_baseline,
    hopper_args,
    run_info,
    write_outputs,
)
from rgpo_lab.mujoco_grid import MUJOCO_METHODS as METHODS


def iteration_time(script: str, out: str, iterations: int, env: dict) -> float:
    subprocess.run(
        [sys.executable, script, *hopper_args(out, iterations, compile_=True)],
        check=True,
        env=env,
        capture_output=True,
    )
    with open(os.path.join(out, "r", "metrics.csv")) as f:
        times = [float(row["iter_time"]) for row in csv.DictReader(f)]
    return times[2:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-ref", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--out", default=os.path.join(RESULTS, "mujoco_refactor"))
    a = p.parse_args()
    env = {**os.environ, **ONE_THREAD}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        commit, head = extract_baseline(a.baseline_ref, tmp)
        for method in a.methods:
            # each side imports its own mujoco_baselines package (PYTHONPATH comes before the installed one)
            roots = {"baseline": tmp, "current": ROOT}
            scripts = {
                v: os.path.join(r, "mujoco_baselines", f"{method}_continuous_action.py")
                for v, r in roots.items()
            }
            for rnd in range(a.rounds):
                order = ["baseline", "current"] if rnd % 2 == 0 else ["current", "baseline"]
                times = {
                    v: iteration_time(
                        scripts[v],
                        os.path.join(tmp, f"{method}_{v}_{rnd}"),
                        a.iterations,
                        {**env, "PYTHONPATH": roots[v]},
                    )
                    for v in order
                }
                t = {v: statistics.median(x) for v, x in times.items()}
                rows.append(
                    {
                        "method": method,
                        "round": rnd,
                        **t,
                        "ratio": t["baseline"] / t["current"],
                        "iteration_times": times,
                    }
                )
                print(
                    f"{method} round {rnd}: baseline {t['baseline']:.3f} s, current {t['current']:.3f} s, "
                    f"ratio {t['baseline'] / t['current']:.3f}",
                    flush=True,
                )
    summary = {m: statistics.median(r["ratio"] for r in rows if r["method"] == m) for m in a.methods}
    # every measured iteration of every round pooled per variant: the ratio of the two medians
    pooled = {
        m: statistics.median(x for r in rows if r["method"] == m for x in r["iteration_times"]["baseline"])
        / statistics.median(x for r in rows if r["method"] == m for x in r["iteration_times"]["current"])
        for m in a.methods
    }
    info = run_info(
        "mujoco_refactor",
        True,
        baseline_commit=commit,
        head_commit=head,
        rows=rows,
        median_ratio=summary,
        pooled_ratio=pooled,
        cpu_affinity=sorted(os.sched_getaffinity(0)),
    )
    lines = [
        "# MuJoCo scripts: current vs an earlier version (--compile, width 256, Hopper-v4)",
        "",
        f"Command: `{info['command']}`; baseline {commit[:10]}, current {head[:10]}; {info['machine']}; load "
        f"average at the end {tuple(round(x, 2) for x in info['load_average_at_end'])}; CPUs the benchmark "
        f"ran on: {info['cpu_affinity']}. {a.iterations - 2} timed iterations per run.",
        "",
        "| script | median s / iteration, baseline | current | ratio (baseline / current), median of rounds "
        "| rounds | ratio of the pooled medians |",
        "|---|---|---|---|---|---|",
    ]
    for m in a.methods:
        rs = [r for r in rows if r["method"] == m]
        each = ", ".join(f"{r['ratio']:.3f}" for r in rs)
        lines.append(
            f"| {m} | {statistics.median(r['baseline'] for r in rs):.3f} | "
            f"{statistics.median(r['current'] for r in rs):.3f} | {summary[m]:.3f} | "
            f"{each} | {pooled[m]:.3f} |"
        )
    write_outputs(a.out, info, lines)


if __name__ == "__main__":
    main()
