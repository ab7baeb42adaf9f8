"""Run named suites of the MuJoCo baselines: N runs at a time, finished runs skipped, unfinished runs
started again.

    python -m rgpo_lab.mujoco_grid main                   # the paper's 48 runs into results/mujoco/main/
    python -m rgpo_lab.mujoco_grid main ppo_kl --jobs 2   # several suites, 2 runs side by side
    python -m rgpo_lab.mujoco_grid --list                 # the suites and their runs

Plays the role of CleanRL's ``cleanrl_utils/benchmark.py`` (whose wheel does not install on Python 3.11).
Every run is a subprocess that drives the product's script (``python -m rgpo_lab.mujoco_drive <run dir>
<method> <flags>``: ``mujoco_baselines/<method>_continuous_action.py`` run in-process, what it logs written
out) with one torch thread, writing to ``{results}/{suite}/{run}/``: config.json (resolved arguments,
machine, package versions, git commit), metrics.csv (one row per iteration) and final.json (when finished,
with the deterministic evaluation). A run with final.json is skipped; any other run starts again from its
first step (no checkpoints: a run is minutes to an hour on one core, docs/mujoco.md). Output of a run goes
to its ``run.log``; a failed run is reported at the end (exit status 1) and retried next time.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace

from rgpo_lab.job_queue import run_queue
from rgpo_lab.results_data import open_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MUJOCO_ENVS = ["HalfCheetah-v4", "Walker2d-v4", "Hopper-v4", "Ant-v4"]
MUJOCO_METHODS = ["ppo", "trpo", "awr", "rgpo"]  # the paper's table order
# the compile_equiv suite's environments (read by rgpo_lab/benchmarks/compile_equivalence.py)
COMPILE_EQUIV_ENVS = ["Hopper-v4", "HalfCheetah-v4"]


@dataclass(frozen=True)
class GridRun:
    """A run of a suite, to launch: its script, environment, seed, length and flags (`mujoco_report` reads
    a finished one back as a `RunRecord`)."""

    suite: str
    method: str  # ppo | rgpo | trpo | awr
    env_id: str
    seed: int
    total_timesteps: int = 1_000_000
    variant: str = "default"  # a short name for `flags`
    flags: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return f"{self.env_id}__{self.method}__{self.variant}__s{self.seed}__{self.total_timesteps // 1000}k"

    def command(self, run_dir: str) -> list[str]:
        """The run's command line, started in the repository root: the script of ``method`` driven by
        rgpo_lab.mujoco_drive (the committed runs up to 6944b5d were made by the lab's own copy of the
        algorithms, with the same flags; their config.json names the commit). A run with final.json is
        finished whatever command made it (`run_suites`)."""
        argv = [sys.executable, "-m", "rgpo_lab.mujoco_drive", run_dir, self.method]
        argv += ["--env-id", self.env_id, "--seed", str(self.seed)]
        return argv + ["--total-timesteps", str(self.total_timesteps), *self.flags]


def _grid(suite, methods, envs, seeds, steps=1_000_000, variants=(("default", ()),)):
    # seeds outermost: a partial grid has every method per seed
    return [
        GridRun(suite, m, e, s, steps, v, tuple(f))
        for s, e, (v, f), m in itertools.product(seeds, envs, variants, methods)
    ]


def lag_variants(lag: int) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The policy_lag suite's variants at one lag: the plain and the decoupled objective."""
    return (
        (f"lag{lag}", ("--policy-lag", str(lag))),
        (f"lag{lag}_decoupled", ("--policy-lag", str(lag), "--decoupled")),
    )


# policy_lag_confirm's arms at L = 8 (variant name, script, flags). The two component arms each change one
# piece of a decoupled method: PPO with RGPO's adaptive KL penalty and backstop (against decoupled RGPO only
# the gate differs) and RGPO without them, beta fixed at 0 and no backstop (against decoupled RGPO only the
# controller differs).
LAG8 = ("--policy-lag", "8")
CONFIRM_ARMS = (
    ("ppo", "lag8_decoupled", (*LAG8, "--decoupled")),
    ("rgpo", "lag8_decoupled", (*LAG8, "--decoupled")),
    ("ppo", "lag8_decoupled_klpenalty", (*LAG8, "--decoupled", "--kl-penalty")),
    (
        "rgpo",
        "lag8_decoupled_nokl",
        (*LAG8, "--decoupled", "--kl-controller", "fixed", "--kl-coef", "0", "--kl-backstop", "0"),
    ),
)
CONFIRM_ENVS = ["Walker2d-v4", "Ant-v4", "Hopper-v4"]
# The classifier study's runs, as its reading rule (results/mujoco/classifier/RULES.md) fixed them before any
# run: PPO, RGPO and RGPO with the learned acceptance classifier, three of the main table's environments,
# seeds 0-4, 244 rollouts of 2,048 steps (half the main table's budget), default hyper-parameters, eager.
CLASSIFIER_ENVS = ["HalfCheetah-v4", "Walker2d-v4", "Hopper-v4"]
CLASSIFIER_STEPS = 499_712
# suites whose runs fix their code path: --compile is refused for them
EAGER_SUITES = {
    "compile_equiv": "its eager runs must stay eager",
    "classifier": "the acceptance classifier has no compiled path",
}


def _confirm_suite() -> list[GridRun]:
    """policy_lag_confirm (issue 46), fixed before its runs: L = 8, seeds 0-9, the three environments, the
    four arms of CONFIRM_ARMS; L = 0 for seeds 5-9 of PPO and RGPO (seeds 0-4 are main_compiled's and
    annealed5's); Hopper's plain L = 8 arms at seeds 0-4 (Walker2d's and Ant's are policy_lag's). A run
    that an earlier suite already made on the same code path (script, flags, --compile, deterministic
    evaluation) is listed under that suite and found finished there; the rest are this suite's (140 runs).
    Per seed, L = 8 first."""
    runs = []
    for seed in range(10):
        for env in CONFIRM_ENVS:
            for method, variant, flags in CONFIRM_ARMS:
                reused = seed < 5 and env != "Hopper-v4" and variant == "lag8_decoupled"
                runs.append(
                    GridRun(
                        "policy_lag" if reused else "policy_lag_confirm",
                        method,
                        env,
                        seed,
                        1_000_000,
                        variant,
                        flags,
                    )
                )
        for env in CONFIRM_ENVS:
            for method in ("ppo", "rgpo"):
                if seed < 5 and env == "Hopper-v4":
                    runs.append(GridRun("policy_lag_confirm", method, env, seed, 1_000_000, "lag8", LAG8))
                elif seed < 5:
                    runs.append(GridRun("policy_lag", method, env, seed, 1_000_000, "lag8", LAG8))
        for env in CONFIRM_ENVS:
            for method in ("ppo", "rgpo"):
                suite = "policy_lag_confirm" if seed >= 5 else ("main_compiled" if seed < 3 else "annealed5")
                runs.append(GridRun(suite, method, env, seed))
    return runs


# The paper's experiments at full scale. Seeds, steps and variants are fixed here, before any result is seen.
PPO_KL_VARIANTS = (
    ("no_gradclip", ("--max-grad-norm", "0")),
    ("no_advnorm", ("--no-norm-adv",)),
    ("no_lranneal", ("--no-anneal-lr",)),
    ("all_off", ("--max-grad-norm", "0", "--no-norm-adv", "--no-anneal-lr")),
)
SUITES: dict[str, list[GridRun]] = {
    "main": _grid("main", MUJOCO_METHODS, MUJOCO_ENVS, [0, 1, 2]),
    "ppo_kl": _grid(
        "ppo_kl", ["ppo", "rgpo"], ["HalfCheetah-v4", "Walker2d-v4"], [0], variants=PPO_KL_VARIANTS
    ),
    "gates": _grid(
        "gates",
        ["rgpo"],
        ["HalfCheetah-v4"],
        [0, 1, 2],
        variants=(
            ("clipped_linear", ("--gate", "clipped_linear")),
            ("temperature", ("--gate", "temperature")),
        ),
    ),
    "k_sweep": _grid(
        "k_sweep",
        ["rgpo"],
        ["HalfCheetah-v4"],
        [1],
        variants=tuple(
            (f"k{k}_1epoch", ("--gate-params", "k", str(k), "--update-epochs", "1")) for k in (2, 5, 10, 20)
        ),
    )
    + _grid("k_sweep", ["ppo"], ["HalfCheetah-v4"], [1], variants=(("1epoch", ("--update-epochs", "1")),)),
    "beta0": _grid(
        "beta0",
        ["rgpo"],
        ["HalfCheetah-v4"],
        [1],
        variants=tuple(
            (f"beta{b}_target{t}", ("--kl-coef", str(b), "--kl-target", str(t)))
            for b, t in ((0.2, 0.02), (0.5, 0.02), (1.0, 0.02), (0.5, 0.01))
        ),
    ),
    "long": _grid("long", ["ppo", "rgpo"], ["HalfCheetah-v4"], [0, 1, 2], steps=3_000_000)
    + _grid("long", ["ppo", "rgpo"], ["HalfCheetah-v4"], [0, 1, 2], steps=6_000_000),
    # "Does RGPO beat PPO, and when?", fixed before its runs; meant to run with --compile.
    # annealed5 adds seeds 3-4 to main's PPO/RGPO cells (seeds 0-2 are main's eager runs); constant_lr is the
    # paper's likely setting (no learning-rate annealing); kl_budget separates the gate from the trust-region
    # size: RGPO at larger KL targets, and PPO with CleanRL's KL early stop.
    "annealed5": _grid("annealed5", ["ppo", "rgpo"], MUJOCO_ENVS, [3, 4]),
    "kl_budget": sorted(  # seeds outermost across both methods: a partial suite still has every arm per seed
        _grid(
            "kl_budget",
            ["rgpo"],
            ["Ant-v4", "HalfCheetah-v4"],
            [0, 1, 2],
            variants=(("target0.05", ("--kl-target", "0.05")), ("target0.1", ("--kl-target", "0.1"))),
        )
        + _grid(
            "kl_budget",
            ["ppo"],
            ["Ant-v4", "HalfCheetah-v4"],
            [0, 1, 2],
            variants=(("targetkl0.03", ("--target-kl", "0.03")),),
        ),
        key=lambda run: run.seed,
    ),
    "constant_lr": _grid(
        "constant_lr",
        ["ppo", "rgpo"],
        MUJOCO_ENVS,
        [0, 1, 2, 3, 4],
        variants=(("constant_lr", ("--no-anneal-lr",)),),
    ),
    # main's PPO and RGPO seeds 0-2 again on the compiled path with deterministic evaluation, so that every
    # annealed comparison uses runs of one code path (with annealed5's seeds 3-4); also the eager-vs-compiled
    # check at 1M steps on all four environments. Meant to run with --compile.
    "main_compiled": _grid("main_compiled", ["ppo", "rgpo"], MUJOCO_ENVS, [0, 1, 2]),
    # Stale samples: iteration t's rollout collected by the actor of iteration t - L, PPO and RGPO each plain
    # (ratio to the behaviour policy) and decoupled (ratio to the proximal policy, truncated weight pi_prox /
    # pi_behaviour). Fixed before its runs; L = 0 is the annealed comparison (main_compiled + annealed5).
    # Meant to run with --compile.
    "policy_lag": sorted(
        _grid("policy_lag", ["ppo", "rgpo"], ["Walker2d-v4", "Ant-v4"], [0, 1, 2], variants=lag_variants(2))
        + _grid(
            "policy_lag",
            ["ppo", "rgpo"],
            ["Walker2d-v4", "Ant-v4"],
            [0, 1, 2, 3, 4],
            variants=lag_variants(8),
        ),
        key=lambda run: (run.seed, "lag2" in run.variant),  # per seed, the stalest level first
    ),
    # Stale samples confirmed or refuted (issue 46): 10 seeds, Hopper added, the components of the decoupled
    # methods apart; the reading rule is results/mujoco/policy_lag_confirm/RULES.md, committed before the
    # runs. Meant to run with --compile.
    "policy_lag_confirm": _confirm_suite(),
    # Does the learned acceptance classifier improve RGPO (RULES.md above)? Eager, 45 runs; per seed and
    # environment the three arms side by side.
    "classifier": sorted(
        _grid("classifier", ["ppo", "rgpo"], CLASSIFIER_ENVS, range(5), CLASSIFIER_STEPS)
        + _grid(
            "classifier",
            ["rgpo"],
            CLASSIFIER_ENVS,
            range(5),
            CLASSIFIER_STEPS,
            variants=(("classifier", ("--acceptance-classifier",)),),
        ),
        key=lambda run: (run.seed, CLASSIFIER_ENVS.index(run.env_id)),
    ),
    # --compile changes float rounding: 3 seeds x 300k steps per script, eager vs compiled (read by
    # rgpo_lab/benchmarks/compile_equivalence.py)
    "compile_equiv": _grid(
        "compile_equiv",
        MUJOCO_METHODS,
        COMPILE_EQUIV_ENVS,
        [0, 1, 2],
        steps=300_000,
        variants=(("eager", ()), ("compile", ("--compile",))),
    ),
    # a few minutes: for trying the grid (and its tests)
    "smoke": _grid(
        "smoke",
        ["ppo", "rgpo"],
        ["Hopper-v4"],
        [0],
        steps=4096,
        variants=(("default", ("--num-steps", "1024", "--num-minibatches", "16")),),
    ),
}


def progress_of(run_dir: str) -> int:
    """Environment steps done by a run, from the last row of its metrics.csv (0 if none)."""
    try:
        with open(os.path.join(run_dir, "final.json")) as f:
            return int(json.load(f)["global_step"])
    except (OSError, KeyError, ValueError):  # not finished (or being written): count the metrics rows
        pass
    try:
        f = open_metrics(run_dir)
        if f is None:
            return 0
        with f:
            rows = list(csv.DictReader(f))
        return int(rows[-1]["global_step"]) if rows else 0
    except (OSError, KeyError, ValueError):
        return 0


def run_suites(
    runs: list[GridRun],
    results: str,
    jobs: int,
    poll: float = 2.0,
    backend: str = "local",
    ray_address: str | None = None,
) -> list[tuple[GridRun, int]]:
    """Run ``runs`` ``jobs`` at a time on ``backend`` (``local`` or ``ray``, see rgpo_lab.job_queue); returns
    the failed ones with their exit status."""
    from tqdm import tqdm

    results = os.path.abspath(results)  # the runs start in ROOT: a relative path names the caller's folder
    run_dir = {r: os.path.join(results, r.suite, r.name) for r in runs}
    todo = [r for r in runs if not os.path.exists(os.path.join(run_dir[r], "final.json"))]
    print(
        f"{len(runs)} runs, {len(runs) - len(todo)} finished, {len(todo)} to run, {jobs} at a time "
        f"({backend})",
        flush=True,
    )

    def start(r: GridRun) -> tuple[list[str], str]:
        command = r.command(run_dir[r])
        os.makedirs(run_dir[r], exist_ok=True)
        log_path = os.path.join(run_dir[r], "run.log")
        with open(log_path, "a") as log:
            log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n")
        return command, log_path

    def succeeded(r: GridRun, code: int) -> bool:
        if code != 0:
            tqdm.write(f"FAILED ({code}): {r.name}, see {run_dir[r]}/run.log")
        return code == 0

    # steps already done are the bar's `initial`, so its rate and ETA count this session's steps only
    bar = tqdm(
        total=sum(r.total_timesteps for r in runs),
        initial=sum(progress_of(d) for d in run_dir.values()),
        unit="step",
        unit_scale=True,
        dynamic_ncols=True,
        smoothing=0.05,
    )

    def on_poll(ended: int, running: int, failed: int) -> None:
        # a restarted run first drops its earlier metrics rows: the bar waits for it to catch up instead of
        # going backwards (negative rate and ETA)
        steps = sum(progress_of(d) for d in run_dir.values())
        bar.update(max(0, steps - bar.n))
        bar.set_postfix_str(
            f"runs {len(runs) - len(todo) + ended}/{len(runs)} done, {running} running, {failed} failed"
        )

    # one core per run, compilation included (--compile: inductor would otherwise compile on all cores)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    try:
        return run_queue(
            todo,
            jobs,
            start,
            env=env,
            cwd=ROOT,
            backend=backend,
            ray_address=ray_address,
            poll=poll,
            succeeded=succeeded,
            on_poll=on_poll,
        )
    finally:
        bar.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.mujoco_grid",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("suites", nargs="*", help=f"suites to run: {', '.join(SUITES)}")
    p.add_argument(
        "--results", default=os.path.join(ROOT, "results", "mujoco"), help="results root directory"
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs side by side (default: cores)")
    p.add_argument("--list", action="store_true", help="list the suites' runs and their state, run nothing")
    p.add_argument(
        "--compile",
        action="store_true",
        help="pass --compile to every run (the fast path; learning outcomes agree with the eager path "
        "within seed noise: results/benchmarks/mujoco_compile_equivalence.md); same run names, each "
        "config.json records the mode. Not with compile_equiv, whose "
        "runs fix their mode, nor with classifier (eager only)",
    )
    p.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local subprocesses, or Ray tasks (pip install 'rgpo-trl[ray]'; shared storage and the repo on "
        "every node)",
    )
    p.add_argument(
        "--ray-address", default=None, help="Ray cluster address (default: start a local Ray instance)"
    )
    args = p.parse_args(argv)
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown or not (args.suites or args.list):
        p.error(
            f"unknown suite(s) {unknown}; choose from {list(SUITES)}"
            if unknown
            else "name at least one suite"
        )
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    suites = args.suites or list(SUITES)
    runs = [r for s in suites for r in SUITES[s]]
    if args.compile:
        eager = [s for s in suites if s in EAGER_SUITES]
        if eager:
            why = "; ".join(f"{s} ({EAGER_SUITES[s]})" for s in eager)
            p.error(f"--compile cannot be combined with {why}")
        runs = [replace(r, flags=(*r.flags, "--compile")) for r in runs]
    if args.list:
        for r in runs:
            d = os.path.join(args.results, r.suite, r.name)
            state = "done" if os.path.exists(os.path.join(d, "final.json")) else f"{progress_of(d)} steps"
            print(f"{r.suite:8s} {r.name:60s} {state}  flags: {' '.join(r.flags) or '-'}")
        return 0
    # SIGTERM (e.g. `kill`, a session ending) unwinds like Ctrl-C, so the runs in progress are stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    failed = run_suites(runs, args.results, args.jobs, backend=args.backend, ray_address=args.ray_address)
    for r, code in failed:
        print(f"failed: {r.suite}/{r.name} (exit {code})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
