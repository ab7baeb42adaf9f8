"""Python function calls per training iteration of the MuJoCo scripts, current vs an earlier version: a
load-independent companion to mujoco_refactor.py, whose wall-clock ratios a shared VM's timing noise
cannot resolve to the 3% the refactor is held to.

    python -m rgpo_lab.benchmarks.count_mujoco_calls --baseline-ref <git ref> [--compile]

The two versions compute bit-identical numbers (results/benchmarks/mujoco_bit_identity.md), i.e. the same
torch kernels on the same data, so what the refactor can change is Python-level work around them. Each script
runs under ``sys.setprofile`` counting Python calls ("call") and calls into C ("c_call", torch ops included)
for ``--short`` and ``--long`` iterations (Hopper-v4, width 256, seed 1); the difference divided by the extra
iterations is the steady-state count per iteration (start-up and compilation cancel out). Counts, not timings:
the machine's load does not change them (garbage collection can add a few calls).
"""

from __future__ import annotations

import argparse
import json
import os
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

COUNTER = r"""
import collections, json, os, runpy, sys
counts = collections.Counter()
def profile(frame, event, arg):
    counts[event] += 1
script, out = sys.argv[1], sys.argv[2]
sys.argv = [script, *sys.argv[3:]]
sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` sets it
sys.setprofile(profile)
try:
    runpy.run_path(script, run_name="__main__")
finally:
    sys.setprofile(None)
    with open(out, "w") as f:
        json.dump(dict(counts), f)
"""


def count_calls(script: str, out: str, iterations: int, compile_: bool, env: dict) -> dict[str, int]:
    result = os.path.join(out, "counts.json")
    os.makedirs(out, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", COUNTER, script, result, *hopper_args(out, iterations, compile_)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed under the call counter:\n{proc.stderr[-3000:]}")
    with open(result) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-ref", required=True)
    p.add_argument("--short", type=int, default=2)
    p.add_argument("--long", type=int, default=4)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    out = a.out or os.path.join(RESULTS, "mujoco_calls" + ("_compile" if a.compile else ""))
    env = {**os.environ, **ONE_THREAD}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        commit, head = extract_baseline(a.baseline_ref, tmp)
        for method in a.methods:
            row = {"method": method}
            for variant, root in (("baseline", tmp), ("current", ROOT)):
                script = os.path.join(root, "mujoco_baselines", f"{method}_continuous_action.py")
                c = {
                    # each side imports its own mujoco_baselines package (PYTHONPATH before the installed one)
                    n: count_calls(
                        script,
                        os.path.join(tmp, f"{method}_{variant}_{n}"),
                        n,
                        a.compile,
                        {**env, "PYTHONPATH": root},
                    )
                    for n in (a.short, a.long)
                }
                for event in ("call", "c_call"):
                    row[f"{variant}_{event}"] = (c[a.long].get(event, 0) - c[a.short].get(event, 0)) / (
                        a.long - a.short
                    )
            rows.append(row)
            print(row, flush=True)
    info = run_info("count_mujoco_calls", True, baseline_commit=commit, head_commit=head, rows=rows)
    lines = [
        "# MuJoCo scripts: Python calls per iteration, current vs an earlier version",
        "",
        f"Command: `{info['command']}`; baseline {commit[:10]}, current {head[:10]}; {info['machine']}. "
        f"Hopper-v4, width 256, {'--compile' if a.compile else 'eager (the default)'}; per iteration = "
        f"(count at {a.long} iterations - count at {a.short}) / {a.long - a.short}. Counts, not timings: "
        "load does not change them.",
        "",
        "| script | Python calls, baseline | current | current / baseline | calls into C (torch ops "
        "included), baseline | current | current / baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['baseline_call']:.0f} | {r['current_call']:.0f} | "
            f"{r['current_call'] / r['baseline_call']:.3f} | {r['baseline_c_call']:.0f} | "
            f"{r['current_c_call']:.0f} | {r['current_c_call'] / r['baseline_c_call']:.3f} |"
        )
    write_outputs(out, info, lines)


if __name__ == "__main__":
    main()
