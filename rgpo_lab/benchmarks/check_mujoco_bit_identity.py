r"""Bit-identity of the MuJoCo scripts against an earlier version of them: a refactor must not change a run.

    python -m rgpo_lab.benchmarks.check_mujoco_bit_identity --baseline-ref <git ref> \
        --out results/benchmarks/mujoco_bit_identity

For each script (ppo, rgpo, trpo, awr), environment (Hopper-v4, HalfCheetah-v4) and mode (eager default,
``--compile``), the baseline (``mujoco_baselines/`` at ``--baseline-ref``, extracted with ``git archive``) and
the current script run 4 iterations (seed 3, with ``--eval-every 2``); every column of metrics.csv except the
wall-clock timings (time, SPS, iter_time, rollout_time, update_time) must be equal as written (the same text),
and the deterministic evaluation's episode returns too. Then the stale-sample paths and the early stops, on
Hopper-v4 in both modes: ppo with ``--policy-lag 2 --decoupled --target-kl 0.01`` and rgpo with
``--policy-lag 2 --decoupled --kl-backstop 0.02`` (``--variants none`` skips them). Each side runs with its
own ``mujoco_baselines`` package first on PYTHONPATH, so the baseline script imports the baseline's
common.py, not the installed (current) one. Exit status 1 when any pair differs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

from rgpo_lab.benchmarks.common import RESULTS, ROOT, extract_baseline, run_info, write_outputs
from rgpo_lab.mujoco_grid import MUJOCO_METHODS

TIMING = {"time", "SPS", "iter_time", "rollout_time", "update_time"}
# (script, extra flags) run on Hopper-v4 beside the default runs: the stale-sample paths and the early stops
VARIANTS = {
    "ppo": ["--policy-lag", "2", "--decoupled", "--target-kl", "0.01"],
    "rgpo": ["--policy-lag", "2", "--decoupled", "--kl-backstop", "0.02"],
}


def run(root: str, method: str, out: str, env_id: str, compile_: bool, extra: list[str]) -> None:
    """``root``'s script of ``method``, importing ``root``'s mujoco_baselines package (PYTHONPATH before the
    installed package)."""
    script = os.path.join(root, "mujoco_baselines", f"{method}_continuous_action.py")
    argv = [sys.executable, script, "--env-id", env_id, "--seed", "3", "--total-timesteps", "8192"]
    argv += ["--output-dir", out, "--run-name", "r", "--no-tensorboard", "--no-verbose", "--eval-every", "2"]
    argv += (["--compile"] if compile_ else []) + extra
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
    subprocess.run(argv, check=True, capture_output=True, env=env)


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
    p.add_argument("--variants", choices=["all", "none"], default="all")
    p.add_argument("--out", default=os.path.join(RESULTS, "mujoco_bit_identity"))
    a = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        commit, head = extract_baseline(a.baseline_ref, tmp)
        cases = [(m, e, []) for m in MUJOCO_METHODS for e in ("Hopper-v4", "HalfCheetah-v4")]
        if a.variants == "all":
            cases += [(m, "Hopper-v4", flags) for m, flags in VARIANTS.items()]
        for method, env_id, extra in cases:
            for mode in a.modes:
                outs = {}
                for side, root in (("baseline", tmp), ("current", ROOT)):
                    outs[side] = os.path.join(tmp, f"{method}_{env_id}_{mode}_{len(results)}_{side}")
                    run(root, method, outs[side], env_id, mode == "compile", extra)
                baseline, current = read(outs["baseline"]), read(outs["current"])  # (rows, columns, eval)
                same = baseline == current
                results.append(
                    {
                        "script": method,
                        "env": env_id,
                        "flags": " ".join(extra),
                        "mode": mode,
                        "iterations": len(current[0]),
                        "identical": same,
                    }
                )
                print(method, env_id, " ".join(extra), mode, "identical" if same else "DIFFERENT", flush=True)
    info = run_info(
        "check_mujoco_bit_identity", True, baseline_commit=commit, head_commit=head, results=results
    )
    lines = [
        "# MuJoCo scripts: bit-identity against an earlier version",
        "",
        f"Command: `{info['command']}`; baseline {commit[:10]}, current {head[:10]}; {info['machine']}.",
        "",
        "metrics.csv of 4 iterations (every column but the wall-clock timings, as written) and the "
        "deterministic evaluation's episode returns.",
        "",
        "| script | env | flags | mode | iterations | identical |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['script']} | {r['env']} | {r['flags'] or 'defaults'} | {r['mode']} | {r['iterations']} | "
        f"{'yes' if r['identical'] else 'NO'} |"
        for r in results
    ]
    write_outputs(a.out, info, lines)
    return 0 if all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
