"""Speed of the single-file scripts' `--compile` (mujoco_baselines/<method>_continuous_action.py) against
the same script eager and against the scripts before the speed work (``--baseline-ref``, 5d1a668: the eager
single files, extracted with ``git show``), as ratios measured in one run.

    python -m rgpo_lab.benchmarks.script_compile --out results/benchmarks/script_compile

Each round runs, per method, the three variants one after the other (never side by side: the machine may be
shared), in an order that rotates from round to round, each as its own process with one torch thread and one
inductor compile thread, Hopper-v4, width 256, 2048 steps per iteration (mini-batches of 64, 10 epochs: the
defaults of all three). The clock is this process's: the moment each iteration's line reaches it (the
scripts print one per iteration, unbuffered); a run's steady speed is the environment steps of iterations
2..N over the time from the first iteration's line to the last, so start-up, the first iteration (it carries
torch.compile's compilation) and the end of the run are left out. A round's ratio divides two of its own runs'
speeds; the result is the median over rounds, with every round's ratio beside it.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

from rgpo_lab.benchmarks.common import ONE_THREAD, RESULTS, ROOT, run_info, write_outputs

METHODS = ("ppo", "rgpo", "trpo", "awr")
VARIANTS = ("baseline", "eager", "compile")
ITERATION_LINE = re.compile(rb"^iter(?:ation)?=(\d+) ")  # the baseline prints iter=, today's iteration=


def extract_scripts(ref: str, dest: str) -> str:
    """The four scripts at git ``ref`` written into ``dest`` (``git show``), and the library they import as it
    was then into ``dest``/lib (``git archive``: the KL controller's API has changed since); returns the ref's
    commit."""
    commit = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    for method in METHODS:
        name = f"mujoco_baselines/{method}_continuous_action.py"
        text = subprocess.run(
            ["git", "-C", ROOT, "show", f"{commit}:{name}"], capture_output=True, check=True
        )
        with open(os.path.join(dest, os.path.basename(name)), "wb") as f:
            f.write(text.stdout)
    os.makedirs(os.path.join(dest, "lib"))
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", commit, "rgpo_trl"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", os.path.join(dest, "lib")], input=archive.stdout, check=True)
    return commit


def command(variant: str, method: str, base_dir: str, out_dir: str, args) -> list[str]:
    """The command line of one run: the baseline with its own flags (minibatch_size 64 is its default),
    today's script with CleanRL's (num_minibatches 32 of 2048 steps: mini-batches of 64)."""
    flags = ["--env-id", args.env_id, "--hidden-size", str(args.hidden_size)]
    flags += ["--total-timesteps", str(args.iterations * 2048), "--num-steps", "2048", "--seed", "1"]
    if variant == "baseline":
        script = os.path.join(base_dir, f"{method}_continuous_action.py")
        return [sys.executable, script, *flags, "--output-dir", out_dir]
    script = os.path.join(ROOT, "mujoco_baselines", f"{method}_continuous_action.py")
    more = ["--eval-episodes", "0"] + (["--compile"] if variant == "compile" else [])
    return [sys.executable, script, *flags, *more]


def timed_run(cmd: list[str], cwd: str, timeout: float, pythonpath: str) -> dict:
    """Runs ``cmd``; the arrival time of each iteration's line, and the steady speed from them."""
    env = {
        **os.environ,
        **ONE_THREAD,
        "PYTHONUNBUFFERED": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": pythonpath,
    }
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stamps = []
    for line in proc.stdout:
        if ITERATION_LINE.match(line):
            stamps.append(time.perf_counter() - start)
        if time.perf_counter() - start > timeout:
            proc.kill()
            raise SystemExit(f"timed out after {timeout} s: {' '.join(cmd)}")
    err = proc.stderr.read().decode(errors="replace")
    if proc.wait() != 0 or len(stamps) < 2:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    steady = stamps[-1] - stamps[0]
    return {
        "first_iteration_s": stamps[0],
        "iteration_s": [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)],
        "steady_sps": 2048 * (len(stamps) - 1) / steady,
        "wall_s": time.perf_counter() - start,
    }


def versions() -> dict:
    import gymnasium
    import mujoco
    import numpy
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "gymnasium": gymnasium.__version__,
        "mujoco": mujoco.__version__,
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def markdown(info: dict) -> list[str]:
    lines = [
        "# The scripts' `--compile` against the scripts before it",
        "",
        f"Command: `{info['command']}`  ",
        f"Commit measured: {info['head']} (working tree clean: {info['clean']}); baseline: the scripts at "
        f"{info['baseline_commit']}.  ",
        f"Machine: {info['machine']}; {info['versions']}.  ",
        f"Load: `{info['uptime_before']}` before, `{info['uptime_after']}` after.  ",
        f"{info['env_id']}, width {info['hidden_size']}, {info['iterations']} iterations of 2048 steps per "
        f"run, one torch thread, runs one at a time; steady SPS = steps of iterations "
        f"2..{info['iterations']} over their time; ratios: median over {info['rounds']} rounds of each "
        "round's own ratio.",
        "",
        "| method | SPS baseline | SPS eager | SPS --compile | --compile / baseline | --compile / eager | "
        "per round (/ baseline) |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, row in info["results"].items():
        sps = {v: statistics.median(r[v]["steady_sps"] for r in row["rounds"]) for v in VARIANTS}
        per_round = ", ".join(f"{x:.2f}" for x in row["ratio_baseline_rounds"])
        lines.append(
            f"| {method} | {sps['baseline']:.0f} | {sps['eager']:.0f} | {sps['compile']:.0f} | "
            f"{row['ratio_baseline']:.2f}x | {row['ratio_eager']:.2f}x | {per_round} |"
        )
    lines += [
        "",
        "SPS columns: medians over the rounds. The first iteration (with --compile: the compilation) and "
        "start-up are outside the timed span; `first_iteration_s` in the JSON has them.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.script_compile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--baseline-ref", default="5d1a668", help="the scripts before the speed work")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=5, help="per run (>= 3; 2048 steps each)")
    parser.add_argument("--env-id", default="Hopper-v4")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--run-timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--out", default=os.path.join(RESULTS, "script_compile"))
    args = parser.parse_args()
    if args.iterations < 3:
        parser.error(f"--iterations must be >= 3 (two timed iterations at least), got {args.iterations}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")

    tmp = tempfile.mkdtemp(prefix="bench_script_compile_")
    base_dir = os.path.join(tmp, "baseline")
    os.makedirs(base_dir)
    baseline_commit = extract_scripts(args.baseline_ref, base_dir)
    before = uptime()
    results = {m: {"rounds": []} for m in args.methods}
    for r in range(args.rounds):
        for method in args.methods:
            order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]  # rotates the launch order over the rounds
            row = {}
            for variant in order:
                work = os.path.join(tmp, f"r{r}_{method}_{variant}")
                os.makedirs(work)
                cmd = command(variant, method, base_dir, work, args)
                lib = os.path.join(base_dir, "lib") if variant == "baseline" else ROOT
                row[variant] = timed_run(cmd, work, args.run_timeout, pythonpath=lib)
                print(f"round {r} {method} {variant}: {row[variant]['steady_sps']:.0f} SPS", flush=True)
            results[method]["rounds"].append(row)
        write_result(args, results, baseline_commit, before, rounds_done=r + 1)  # kept if a later round fails


def write_result(args, results: dict, baseline_commit: str, before: str, rounds_done: int) -> None:
    """The rounds so far, their ratios and medians, to <out>.json and <out>.md."""

    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", ROOT, *cmd], capture_output=True, text=True).stdout.strip()

    for row in results.values():
        rounds = row["rounds"]
        row["ratio_baseline_rounds"] = [
            x["compile"]["steady_sps"] / x["baseline"]["steady_sps"] for x in rounds
        ]
        row["ratio_eager_rounds"] = [x["compile"]["steady_sps"] / x["eager"]["steady_sps"] for x in rounds]
        row["ratio_baseline"] = statistics.median(row["ratio_baseline_rounds"])
        row["ratio_eager"] = statistics.median(row["ratio_eager_rounds"])
    info = run_info(
        "script_compile",
        with_torch=True,
        head=git("rev-parse", "HEAD"),
        clean=not git("status", "--porcelain", "mujoco_baselines", "rgpo_lab/benchmarks"),
        baseline_commit=baseline_commit,
        versions=versions(),
        uptime_before=before,
        uptime_after=uptime(),
        env_id=args.env_id,
        hidden_size=args.hidden_size,
        iterations=args.iterations,
        rounds=rounds_done,
        results=results,
    )
    write_outputs(args.out, info, markdown(info))


if __name__ == "__main__":
    main()
