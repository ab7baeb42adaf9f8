r"""Bit-identity of the MuJoCo scripts against an earlier version of them: a refactor must not change a run.

    python benchmarks/check_mujoco_bit_identity.py --baseline-ref <git ref> \
        --out benchmarks/results/mujoco_bit_identity

For each script (ppo, rgpo, trpo, awr), environment (Hopper-v4, HalfCheetah-v4) and mode (eager default,
``--compile``), the baseline (``mujoco_baselines/`` at ``--baseline-ref``, extracted with ``git archive``) and
the current script run 4 iterations (seed 3, with ``--eval-every 2``); every column of metrics.csv except the
wall-clock timings (time, SPS, iter_time, rollout_time, update_time) must be equal as written (the same text),
and the deterministic evaluation's episode returns too. Exit status 1 when any pair differs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

from bench_common import ROOT, extract_baseline, run_info, write_outputs

TIMING = {"time", "SPS", "iter_time", "rollout_time", "update_time"}


def run(script: str, out: str, env_id: str, compile_: bool) -> None:
    argv = [sys.executable, script, "--env-id", env_id, "--seed", "3", "--total-timesteps", "8192"]
    argv += ["--output-dir", out, "--run-name", "r", "--no-tensorboard", "--no-verbose", "--eval-every", "2"]
    argv += ["--compile"] if compile_ else []
    subprocess.run(argv, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def read(out: str) -> tuple[list[dict], list[str], list]:
    with open(os.path.join(out, "r", "metrics.csv")) as f:
        reader = csv.DictReader(f)
        rows = [{k: v for k, v in row.items() if k not in TIMING} for row in reader]
        columns = list(reader.fieldnames)
    with open(os.path.join(out, "r", "final.json")) as f:
        return rows, columns, json.load(f)["eval_episodes"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-ref", required=True)
    p.add_argument("--modes", nargs="+", default=["eager", "compile"], choices=["eager", "compile"])
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "mujoco_bit_identity"))
    a = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        commit, head = extract_baseline(a.baseline_ref, tmp)
        for method in ("ppo", "rgpo", "trpo", "awr"):
            for env_id in ("Hopper-v4", "HalfCheetah-v4"):
                for mode in a.modes:
                    outs = {}
                    for side, root in (("baseline", tmp), ("current", ROOT)):
                        outs[side] = os.path.join(tmp, f"{method}_{env_id}_{mode}_{side}")
                        run(
                            os.path.join(root, "mujoco_baselines", f"{method}_continuous_action.py"),
                            outs[side],
                            env_id,
                            mode == "compile",
                        )
                    (rows_b, cols_b, eval_b), (rows_c, cols_c, eval_c) = (
                        read(outs["baseline"]),
                        read(outs["current"]),
                    )
                    same = rows_b == rows_c and cols_b == cols_c and eval_b == eval_c
                    results.append(
                        {
                            "script": method,
                            "env": env_id,
                            "mode": mode,
                            "iterations": len(rows_c),
                            "identical": same,
                        }
                    )
                    print(method, env_id, mode, "identical" if same else "DIFFERENT", flush=True)
    info = run_info(
        "check_mujoco_bit_identity.py", True, baseline_commit=commit, head_commit=head, results=results
    )
    lines = [
        "# MuJoCo scripts: bit-identity against an earlier version",
        "",
        f"Command: `{info['command']}`; baseline {commit[:10]}, current {head[:10]}; {info['machine']}.",
        "",
        "metrics.csv of 4 iterations (every column but the wall-clock timings, as written) and the "
        "deterministic evaluation's episode returns.",
        "",
        "| script | env | mode | iterations | identical |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['script']} | {r['env']} | {r['mode']} | {r['iterations']} | "
        f"{'yes' if r['identical'] else 'NO'} |"
        for r in results
    ]
    write_outputs(a.out, info, lines)
    return 0 if all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
