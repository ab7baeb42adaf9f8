"""A/B speed of `--compile` against the scripts before it, two runs side by side as in a grid.

    python -m rgpo_lab.benchmarks.mujoco_compile --baseline-ref <git ref> --cleanrl-path /path/to/cleanrl \\
        --out results/benchmarks/mujoco_compile

For each script (ppo, rgpo, trpo, awr) and width (64, 256), every round starts the baseline script (the
repository at ``--baseline-ref``, extracted with ``git archive``: the eager update, bit-identical to today's
default) and today's script with ``--compile`` at the same moment on the two cores, with one torch thread
each, in alternating launch order; each pair gives one speed-up ratio, so machine load hits both sides alike
(``TORCHINDUCTOR_COMPILE_THREADS=1``, as rgpo_lab.mujoco_grid sets it: the compiling run keeps to its own
core). A third pair per round runs CleanRL's ``ppo_continuous_action.py`` (patched for gymnasium 1.x as in
mujoco_speed.py) beside the baseline PPO at width 64.

Reported per run, from its metrics.csv: steady-state SPS (environment steps of iterations 2.. over their
``iter_time``; the first iteration carries the compilation) and the compile cost (first iteration's
``update_time`` minus the median of the others). Round 0 compiles into an empty inductor cache (cold), later
rounds find it warm. The raw ``env.step`` rate of each environment (gymnasium's ``gym.make`` stack, random
actions, one process, nothing beside it) is measured first: the physical limit of one core.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

from rgpo_lab.benchmarks.common import ONE_THREAD, RESULTS, ROOT, extract_baseline, invocation
from rgpo_lab.mujoco_grid import MUJOCO_ENVS as ENVS
from rgpo_lab.mujoco_grid import MUJOCO_METHODS as METHODS
from rgpo_lab.results_data import open_metrics


def raw_env_rate(env_id: str, steps: int) -> float:
    """Steps per second of gymnasium's env.step with uniform random actions (resets included)."""
    import gymnasium as gym
    import numpy as np

    env = gym.make(env_id)
    env.reset(seed=0)
    actions = np.random.default_rng(0).uniform(
        env.action_space.low, env.action_space.high, (steps, *env.action_space.shape)
    )
    t0 = time.perf_counter()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - t0)


def run_stats(run_dir: str) -> dict:
    with open_metrics(run_dir, required=True) as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    later = rows[1:]
    steps = rows[-1]["global_step"] - rows[0]["global_step"]
    return {
        "steady_sps": steps / sum(r["iter_time"] for r in later),
        "compile_s": rows[0]["update_time"] - statistics.median(r["update_time"] for r in later),
        "rollout_s": statistics.median(r["rollout_time"] for r in later),
        "update_s": statistics.median(r["update_time"] for r in later),
    }


def side_by_side(commands: list[tuple[list[str], str, dict]]) -> list[str]:
    """Start the commands together, wait for all; their stdout."""
    procs = []
    for cmd, cwd, env in commands:
        procs.append(
            subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outs = []
    for (cmd, _, _), p in zip(commands, procs, strict=True):
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
        outs.append(out)
    return outs


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rgpo_lab.benchmarks.mujoco_compile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--baseline-ref", help="git ref of the scripts to compare against (required to measure)"
    )
    parser.add_argument("--cleanrl-path", default=None, help="CleanRL checkout (optional: the CleanRL pair)")
    parser.add_argument("--env-id", default="Hopper-v4")
    parser.add_argument("--total-timesteps", type=int, default=16384, help="per run; 2048 per iteration")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--raw-steps", type=int, default=20000)
    parser.add_argument("--out", default=os.path.join(RESULTS, "mujoco_compile"))
    parser.add_argument(
        "--grid-results",
        default=os.path.join(ROOT, "results", "mujoco", "main"),
        help="finished eager runs of the main grid: their SPS give the 48-run wall-time estimate",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="re-write <out>.md/.png from <out>.json (and --grid-results) without measuring",
    )
    args = parser.parse_args()
    if args.render_only:
        with open(args.out + ".json") as f:
            result = json.load(f)
        result["grid_estimate"] = grid_estimate(args.grid_results, result["rows"])
        with open(args.out + ".json", "w") as f:
            json.dump(result, f, indent=2)
        with open(args.out + ".md", "w") as f:
            f.write(markdown(result))
        plot(result, args.out + ".png")
        print(markdown(result))
        return
    if not args.baseline_ref:
        parser.error("--baseline-ref is required (unless --render-only)")

    from rgpo_lab.benchmarks.mujoco_speed import find_cleanrl_file, patch_cleanrl

    tmp = tempfile.mkdtemp(prefix="bench_compile_")
    commit, head = extract_baseline(args.baseline_ref, tmp)
    status = ["git", "-C", ROOT, "status", "--porcelain", "rgpo_lab/mujoco_runner"]
    dirty = bool(subprocess.run(status, capture_output=True, text=True).stdout.strip())
    base_dir = os.path.join(tmp, "mujoco_baselines")

    print("raw env.step rates ...", flush=True)
    raw = {e: raw_env_rate(e, args.raw_steps) for e in ENVS}
    print({e: round(r) for e, r in raw.items()}, flush=True)

    # one core per run, compilation included (inductor compiles on all cores by default), as
    # rgpo_lab.mujoco_grid runs them
    env = {**os.environ, **ONE_THREAD, "PYTHONWARNINGS": "ignore"}
    # the baseline's own mujoco_baselines package (tmp) first, then the checkout (rgpo_trl, the lab runner)
    env["PYTHONPATH"] = os.pathsep.join([tmp, ROOT, env.get("PYTHONPATH", "")])
    common = ["--env-id", args.env_id, "--total-timesteps", str(args.total_timesteps), "--seed", "1"]
    common += ["--no-tensorboard", "--no-verbose", "--checkpoint-every", "0"]
    cleanrl_cmd = None
    if args.cleanrl_path:
        cdir = os.path.join(tmp, "cleanrl")
        os.makedirs(cdir)
        with (
            open(find_cleanrl_file(args.cleanrl_path)) as f,
            open(os.path.join(cdir, "ppo_continuous_action.py"), "w") as g,
        ):
            g.write(patch_cleanrl(f.read()))
        cleanrl_argv = [sys.executable, "ppo_continuous_action.py", "--env-id", args.env_id]
        cleanrl_argv += ["--total-timesteps", str(args.total_timesteps), "--seed", "1", "--num-steps", "2048"]
        cleanrl_argv += ["--update-epochs", "10", "--num-minibatches", "32", "--no-cuda"]
        cleanrl_cmd = (cleanrl_argv, cdir)

    runs: list[dict] = []
    for rnd in range(args.rounds):
        # a fresh inductor cache: round 0 compiles cold, later rounds find it warm
        renv = {**env, "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor_cache")}
        pairs = [(m, w) for m in METHODS for w in args.widths]
        for i, (method, width) in enumerate(pairs):
            sides = {
                "baseline": [os.path.join(base_dir, f"{method}_continuous_action.py")],
                "compile": ["-m", "rgpo_lab.mujoco_runner", method],
            }
            order = list(sides) if (rnd + i) % 2 == 0 else list(sides)[::-1]
            cmds = []
            for side in order:
                name = f"{method}_{width}_{side}_{rnd}"
                flag = ["--compile"] if side == "compile" else []
                argv = [sys.executable, *sides[side], *common, "--hidden-size", str(width)]
                argv += ["--output-dir", os.path.join(tmp, "runs"), "--run-name", name, *flag]
                cmds.append((argv, tmp, renv))
            side_by_side(cmds)
            for side in order:
                stats = run_stats(os.path.join(tmp, "runs", f"{method}_{width}_{side}_{rnd}"))
                runs.append({"round": rnd, "method": method, "width": width, "variant": side, **stats})
                print(
                    f"round {rnd} {method} w{width} {side:8s} SPS {stats['steady_sps']:7.1f} "
                    f"compile {stats['compile_s']:5.1f}s",
                    flush=True,
                )
        if cleanrl_cmd:
            name = f"ppo_64_baseline_cl_{rnd}"
            base_ppo = os.path.join(base_dir, "ppo_continuous_action.py")
            argv = [sys.executable, base_ppo, *common, "--hidden-size", "64"]
            argv += ["--output-dir", os.path.join(tmp, "runs"), "--run-name", name]
            outs = side_by_side([(cleanrl_cmd[0], cleanrl_cmd[1], env), (argv, tmp, env)])
            cl_sps = float(re.findall(r"SPS: (\d+)", outs[0])[-1])  # CleanRL prints global_step / elapsed
            ours = json.load(open(os.path.join(tmp, "runs", name, "final.json")))[
                "SPS"
            ]  # the same definition
            runs.append(
                {"round": rnd, "method": "cleanrl_ppo", "width": 64, "variant": "cleanrl", "run_sps": cl_sps}
            )
            runs.append(
                {
                    "round": rnd,
                    "method": "ppo",
                    "width": 64,
                    "variant": "baseline_beside_cleanrl",
                    "run_sps": ours,
                }
            )
            print(f"round {rnd} cleanrl SPS {cl_sps:.0f} beside baseline ppo w64 SPS {ours:.0f}", flush=True)

    result = summarise(runs, raw, args)
    result.update(
        command=invocation("mujoco_compile"),
        baseline_commit=commit,
        head_commit=head + (" (with uncommitted changes in rgpo_lab/mujoco_runner/)" if dirty else ""),
        machine=f"{platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}",
        versions=versions(),
        load_average_at_end=os.getloadavg(),
    )
    result["grid_estimate"] = grid_estimate(args.grid_results, result["rows"])
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=2)
    with open(args.out + ".csv", "w", newline="") as f:
        keys = sorted({k for r in runs for k in r})
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(runs)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(result))
    plot(result, args.out + ".png")
    print(markdown(result))


def versions() -> dict:
    import gymnasium
    import mujoco
    import numpy
    import torch

    return {
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "gymnasium": gymnasium.__version__,
        "mujoco": mujoco.__version__,
    }


def summarise(runs: list[dict], raw: dict, args) -> dict:
    rows = []
    for method in METHODS:
        for width in args.widths:
            sel = {
                v: sorted(
                    (r for r in runs if r["method"] == method and r["width"] == width and r["variant"] == v),
                    key=lambda r: r["round"],
                )
                for v in ("baseline", "compile")
            }
            ratios = [
                c["steady_sps"] / b["steady_sps"]
                for b, c in zip(sel["baseline"], sel["compile"], strict=True)
            ]
            warm_s = [r["compile_s"] for r in sel["compile"][1:]]
            rows.append(
                {
                    "method": method,
                    "width": width,
                    "baseline_sps": statistics.median(r["steady_sps"] for r in sel["baseline"]),
                    "compile_sps": statistics.median(r["steady_sps"] for r in sel["compile"]),
                    "speedup": statistics.median(ratios),
                    "speedup_per_round": ratios,
                    "baseline_update_s": statistics.median(r["update_s"] for r in sel["baseline"]),
                    "compile_update_s": statistics.median(r["update_s"] for r in sel["compile"]),
                    "baseline_rollout_s": statistics.median(r["rollout_s"] for r in sel["baseline"]),
                    "compile_rollout_s": statistics.median(r["rollout_s"] for r in sel["compile"]),
                    "compile_s_cold": sel["compile"][0]["compile_s"],
                    "compile_s_warm": statistics.median(warm_s) if warm_s else None,
                }
            )
    out = {"env_id": args.env_id, "raw_env_rate": raw, "rows": rows}
    cl = [r for r in runs if r["variant"] == "cleanrl"]
    if cl:
        beside = [r for r in runs if r["variant"] == "baseline_beside_cleanrl"]
        out["cleanrl_sps"] = statistics.median(r["run_sps"] for r in cl)
        out["baseline_ppo64_over_cleanrl"] = statistics.median(
            b["run_sps"] / c["run_sps"] for b, c in zip(beside, cl, strict=True)
        )
    return out


def grid_estimate(grid_dir: str, rows: list[dict]) -> dict | None:
    """Wall time of the 48-run main grid on 2 cores: each (method, env) at the median SPS of its finished
    eager runs (two side by side, as the grid ran them), and the same divided by the method's width-256
    speed-up measured here (on Hopper-v4 only: an estimate for the other environments) plus one cold compile
    per run."""
    import glob

    sps: dict[tuple[str, str], list[float]] = {}
    for path in glob.glob(os.path.join(grid_dir, "*", "final.json")):
        with open(path) as f:
            final = json.load(f)
        sps.setdefault((final["method"].split("_")[0], final["env_id"]), []).append(float(final["SPS"]))
    cells = [(m, e) for m in METHODS for e in ENVS]
    if not all(c in sps for c in cells):
        return None
    speed = {x["method"]: x for x in rows if x["width"] == 256}
    eager = sum(3 * 1e6 / statistics.median(sps[c]) for c in cells) / 2
    compiled = (
        sum(
            3 * (1e6 / (statistics.median(sps[(m, e)]) * speed[m]["speedup"]) + speed[m]["compile_s_cold"])
            for m, e in cells
        )
        / 2
    )
    n = sum(len(v) for v in sps.values())
    return {"eager_hours": eager / 3600, "compile_hours": compiled / 3600, "finished_runs": n}


def markdown(r: dict) -> str:
    raw = r["raw_env_rate"][r["env_id"]]
    lines = [
        "# `--compile`: A/B speed against the scripts before it",
        "",
        f"Command: `{r['command']}`  ",
        f"Baseline: the scripts at {r['baseline_commit'][:10]} (eager update; today's default is "
        f"bit-identical to it); `--compile`: {r['head_commit'][:10]}{r['head_commit'][40:]}.  ",
        f"Machine: {r['machine']}; {', '.join(f'{k} {v}' for k, v in r['versions'].items())}; one torch "
        "thread per run, baseline and `--compile` run side by side on the 2 cores; load average at end "
        f"{', '.join(f'{x:.1f}' for x in r['load_average_at_end'])}.",
        "",
        f"Env {r['env_id']}; steady-state SPS (iterations after the first); speed-up = median over rounds of "
        "the per-pair ratio. Fraction of the raw env-step rate = SPS / the rate of gymnasium's `env.step` "
        f"with random actions on one core ({raw:.0f} steps/s for {r['env_id']}).",
        "",
        "| script | width | baseline SPS | `--compile` SPS | speed-up | per round | update s/iter (base -> "
        "compile) | rollout s/iter | of raw env rate (base -> compile) | compile s (cold / warm) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["rows"]:
        warm = "-" if x["compile_s_warm"] is None else f"{x['compile_s_warm']:.0f}"
        lines.append(
            f"| {x['method']} | {x['width']} | {x['baseline_sps']:.0f} | {x['compile_sps']:.0f} | "
            f"{x['speedup']:.2f}x | {', '.join(f'{v:.2f}' for v in x['speedup_per_round'])} | "
            f"{x['baseline_update_s']:.2f} -> {x['compile_update_s']:.2f} | {x['baseline_rollout_s']:.2f} -> "
            f"{x['compile_rollout_s']:.2f} | {x['baseline_sps'] / raw:.0%} -> {x['compile_sps'] / raw:.0%} | "
            f"{x['compile_s_cold']:.0f} / {warm} |"
        )
    lines += [
        "",
        "Raw `env.step` rates (steps/s, one core): "
        + ", ".join(f"{e} {v:.0f}" for e, v in r["raw_env_rate"].items())
        + ".",
    ]
    if "cleanrl_sps" in r:
        ratio = r["baseline_ppo64_over_cleanrl"]
        ppo64 = next(x for x in r["rows"] if x["method"] == "ppo" and x["width"] == 64)
        ppo256 = next((x for x in r["rows"] if x["method"] == "ppo" and x["width"] == 256), None)
        at_256 = "."
        if ppo256:
            chained = ratio * ppo256["speedup"] * ppo256["baseline_sps"] / ppo64["baseline_sps"]
            at_256 = f", {chained:.2f}x at width 256."
        lines += [
            "",
            "CleanRL `ppo_continuous_action.py` (width 64), run beside our baseline PPO at width 64: "
            f"{r['cleanrl_sps']:.0f} SPS; our baseline / CleanRL = {ratio:.2f}x (whole-run SPS, CleanRL's "
            "definition; ours with --no-tensorboard, CleanRL writing its TensorBoard events). Chained with "
            f"the speed-ups above: PPO `--compile` / CleanRL ~ {ratio * ppo64['speedup']:.2f}x at width 64"
            + at_256,
        ]
    g = r.get("grid_estimate")
    if g:
        lines += [
            "",
            "Estimated wall time of the 48-run `main` grid (1M steps each) on this 2-core machine, from the "
            f"SPS of the {g['finished_runs']} finished eager grid runs (two side by side): eager "
            f"{g['eager_hours']:.1f} h; with `--compile` (the width-256 speed-ups above, measured on "
            f"{r['env_id']} only, plus a cold compile per run) ~{g['compile_hours']:.1f} h.",
        ]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = r["rows"]
    labels = [f"{x['method']}\nw{x['width']}" for x in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar([i - 0.2 for i in xs], [x["baseline_sps"] for x in rows], 0.4, label="baseline (eager)")
    ax.bar([i + 0.2 for i in xs], [x["compile_sps"] for x in rows], 0.4, label="--compile")
    ax.axhline(
        r["raw_env_rate"][r["env_id"]], color="k", ls="--", lw=1, label=f"raw env.step rate ({r['env_id']})"
    )
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("steady-state SPS (one core, two runs side by side)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
