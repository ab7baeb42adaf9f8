"""The lab drives the product's scripts: a short run through rgpo_lab.mujoco_drive writes as metrics.csv,
final.json and config.json what the script itself logs (the same script run on its own beside it, same seed:
every logged value, the episodes, the evaluation, the final parameters), and the grid's runs are the scripts'
command lines."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from _mujoco_utils import METHODS, ROOT, SHORT, needs_compiler, read_rows, run_script, script

from rgpo_lab import mujoco_drive as drive
from rgpo_lab import mujoco_grid as grid

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")
tyro = pytest.importorskip("tyro")

SMALL = [*SHORT, "--num-minibatches", "4", "--hidden-size", "32"]
TIMING = {"time", "SPS"}  # wall-clock: the only columns two runs of one seed may differ in


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_written_as_logged(run_dir, logged, final):
    """metrics.csv and final.json of a driven run against the scalars the script logged on its own."""
    rows = read_rows(run_dir)
    steps = [step for step, _ in logged["charts/SPS"]]
    assert [int(r["iteration"]) for r in rows] == list(range(1, len(steps) + 1))
    assert [int(r["global_step"]) for r in rows] == steps
    per_iteration = [t for t in logged if not t.startswith(("charts/episodic_", "eval/"))]
    for tag in per_iteration:
        assert [step for step, _ in logged[tag]] == steps, tag  # one value per iteration
        if drive.column(tag) not in TIMING:
            written = [r[drive.column(tag)] for r in rows]
            assert all(map(_same, written, [v for _, v in logged[tag]])), (tag, written, logged[tag])
    assert set(rows[0]) == {"iteration", "global_step", "time", "episodic_return", "return_last100"} | {
        "episodes",
        "spike",
        "spike_final",
        *map(drive.column, per_iteration),
    }
    assert [r["spike"] for r in rows] == [float(r["kl"] > 2 * 0.02) for r in rows]  # twice the paper's target
    assert [r["spike_final"] for r in rows] == [float(r["kl_final"] > 2 * 0.02) for r in rows]
    episodes = logged["charts/episodic_return"]
    for before, row in zip([0, *steps], rows, strict=False):  # the episodes that ended in the iteration
        new = [ret for step, ret in episodes if before < step <= row["global_step"]]
        upto = [ret for step, ret in episodes if step <= row["global_step"]]
        assert row["episodic_return"] == pytest.approx(np.mean(new), rel=1e-12)
        assert row["return_last100"] == pytest.approx(np.mean(upto[-100:]), rel=1e-12)
        assert row["episodes"] == len(upto)
    returns = [ret for _, ret in episodes]
    assert final["final_return"] == pytest.approx(np.mean(returns[-100:]), rel=1e-12)
    assert final["episodes"] == len(returns) and final["global_step"] == steps[-1]
    evaluation = [ret for _, ret in logged["eval/episodic_return"]]
    assert final["eval_episodes"] == evaluation and len(evaluation) == 2
    assert final["eval_return_mean"] == pytest.approx(np.mean(evaluation), rel=1e-12)
    assert final["eval_return_std"] == pytest.approx(np.std(evaluation, ddof=1), rel=1e-12)


CASES = [
    pytest.param("rgpo", [], id="rgpo"),
    pytest.param(
        "ppo", ["--policy-lag", "2", "--decoupled", "--kl-penalty"], id="ppo-lag2", marks=pytest.mark.slow
    ),
    pytest.param("trpo", [], id="trpo", marks=pytest.mark.slow),
    pytest.param("awr", [], id="awr", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("method,flags", CASES)
def test_driven_run_writes_what_the_script_logs(method, flags, tmp_path, monkeypatch):
    final, driven = drive.drive(str(tmp_path / "run"), method, [*SMALL, *flags])
    logged, own = run_script(method, [*SMALL, *flags], tmp_path / "own", monkeypatch)
    assert_written_as_logged(tmp_path / "run", logged, final)
    for name, tensor in own["agent"].state_dict().items():  # the driver changed nothing in the run
        assert torch.equal(tensor, driven["agent"].state_dict()[name]), name
    config = json.load(open(tmp_path / "run" / "config.json"))
    assert config["hidden_size"] == 32 and config["num_iterations"] == 3 and config["env_id"] == "Hopper-v4"
    assert config["exp_name"] == final["method"] == f"{method}_continuous_action"
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
    assert config["git_commit"] == final["git_commits"][0] == (head.stdout.strip() or None)
    assert sorted(os.listdir(tmp_path / "run")) == ["config.json", "final.json", "metrics.csv"]


# What the MuJoCo reports read from a run's metrics.csv (paper_tables, studies, figures; grad_var, read for
# the main suite's table and figure, only the committed runs have: docs/mujoco.md)
REPORT_COLUMNS = {
    "global_step",
    "episodic_return",
    "return_last100",
    "kl",
    "kl_max",
    "kl_final",
    "ess",
    "entropy",
}


def _final_kl_float64(g) -> float:
    """The last iteration's KL of the final policy to pi_old over the whole rollout, mean(r - 1 - log r),
    recomputed in float64 from the script's end state (the Gaussian's density written out here)."""
    agent, obs, actions = copy.deepcopy(g["agent"]).double(), g["obs"].double(), g["actions"].double()
    anchor = g["b_oldlogprobs"] if "b_oldlogprobs" in g else g["b_logprobs"]  # PPO/RGPO's, or the behaviour's
    with torch.no_grad():
        mean, log_std = agent.actor_mean(obs), agent.actor_logstd
        z = (actions - mean) / log_std.exp()
        logp = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    log_r = logp - anchor.double()
    return float((log_r.exp() - 1 - log_r).mean())


@pytest.mark.parametrize(
    "method,flags",
    [
        pytest.param("rgpo", [], id="rgpo"),
        pytest.param("rgpo", ["--compile"], id="rgpo-compile", marks=[pytest.mark.slow, needs_compiler]),
        pytest.param("ppo", ["--policy-lag", "2", "--decoupled"], id="ppo-lag2", marks=pytest.mark.slow),
        pytest.param("trpo", [], id="trpo", marks=pytest.mark.slow),
        pytest.param("awr", [], id="awr", marks=pytest.mark.slow),
    ],
)
def test_driven_run_has_the_columns_the_reports_read(method, flags, tmp_path):
    """A new run is read by the reports as a committed one: every column they read, under the committed
    runs' names (kl_max: the largest mini-batch KL; kl_final: the final policy's KL over the whole batch,
    as the lab's former copy defined them), kl_final equal to its float64 recomputation from the script's
    end state, and the run loaded by the reports' reader with its final return."""
    from rgpo_lab.mujoco_report.runs import load_runs

    run_dir = tmp_path / "results" / "new_suite" / f"Hopper-v4__{method}__default__s1__0k"
    final, g = drive.drive(str(run_dir), method, [*SMALL, *flags])
    rows = read_rows(run_dir)
    assert REPORT_COLUMNS | {"spike", "spike_final"} <= set(rows[0])
    assert rows[-1]["kl_final"] == pytest.approx(_final_kl_float64(g), rel=1e-4, abs=1e-9)
    assert rows[-2]["kl_final"] != pytest.approx(_final_kl_float64(g), rel=1e-4)  # the check can fail
    assert rows[-1]["kl_max"] == max(g["approx_kls"])  # the last iteration's per-mini-batch KLs
    assert all(r["kl_max"] >= r["kl"] > 0 and r["kl_final"] > 0 for r in rows)
    (run,) = load_runs(str(tmp_path / "results"))
    assert REPORT_COLUMNS <= set(run.metrics.columns) and run.final_return == final["final_return"]
    assert math.isfinite(run.final_return) and run.env == "Hopper-v4"


def test_the_comparison_fails_on_another_seed(tmp_path, monkeypatch):
    """The check can fail: the driven run on seed 1 against the script's own run on seed 2."""
    final, _ = drive.drive(str(tmp_path / "run"), "rgpo", SMALL)
    logged, _ = run_script("rgpo", [*SMALL, "--seed", "2"], tmp_path / "own", monkeypatch)
    with pytest.raises(AssertionError):
        assert_written_as_logged(tmp_path / "run", logged, final)


def test_bad_input_through_the_driver_is_the_scripts_one_line(tmp_path):
    """The script's own check ends the run in one line; nothing is written in the run folder. An unknown
    method gets the usage line."""
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    argv = [
        sys.executable,
        "-m",
        "rgpo_lab.mujoco_drive",
        str(tmp_path / "r"),
        "rgpo",
        "--env-id",
        "Hoper-v4",
    ]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(lines) == 1 and "Did you mean: `Hopper`?" in lines[0], r.stderr
    assert os.listdir(tmp_path / "r") == []
    argv[4] = "sac"
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 2 and "{ppo,rgpo,trpo,awr}" in r.stderr


def test_the_method_list_names_every_script():
    names = [
        f for f in os.listdir(os.path.join(ROOT, "mujoco_baselines")) if f.endswith("_continuous_action.py")
    ]
    assert sorted(grid.MUJOCO_METHODS) == sorted(drive.METHODS) == sorted(METHODS)
    assert sorted(METHODS) == sorted(f.removesuffix("_continuous_action.py") for f in names)


def test_every_grid_run_is_a_command_line_of_its_script():
    """Each run of every suite drives its method's script with flags the script parses (the runs as they are
    now; the committed runs name the command of their commit)."""
    seen = set()
    for runs in grid.SUITES.values():
        for run in runs:
            cmd = run.command("/tmp/x")
            assert cmd[1:5] == ["-m", "rgpo_lab.mujoco_drive", "/tmp/x", run.method]
            if (run.method, tuple(cmd[5:])) in seen:
                continue
            seen.add((run.method, tuple(cmd[5:])))
            args = tyro.cli(script(run.method).Args, args=cmd[5:])
            assert (args.env_id, args.seed, args.total_timesteps) == (
                run.env_id,
                run.seed,
                run.total_timesteps,
            )


def test_grid_compile_flag_adds_compile_to_every_run_but_not_to_compile_equiv(capsys):
    """`mujoco_grid --compile` passes --compile to every script of the named suites (run names unchanged)
    and refuses compile_equiv, whose eager side must stay eager."""
    assert grid.main(["smoke", "gates", "--compile", "--list"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert len(lines) == len(grid.SUITES["smoke"]) + len(grid.SUITES["gates"])
    assert all(ln.endswith("--compile") for ln in lines)
    assert any("HalfCheetah-v4__rgpo__clipped_linear__s0__1000k" in ln for ln in lines)
    assert grid.main(["smoke", "--list"]) == 0
    assert "--compile" not in capsys.readouterr().out
    for argv in (["compile_equiv", "--compile"], ["--list", "--compile"]):  # named, or every suite listed
        with pytest.raises(SystemExit):
            grid.main(argv)
        assert "compile_equiv (its eager runs must stay eager)" in capsys.readouterr().err


def _tiny_runs():
    flags = ("--num-steps", "256", "--num-minibatches", "4", "--hidden-size", "32", "--eval-episodes", "1")
    return [grid.GridRun("t", m, "Hopper-v4", 0, 512, "default", flags) for m in ("ppo", "rgpo")]


@pytest.mark.slow  # two subprocess runs, twice
def test_grid_skips_finished_runs_and_starts_unfinished_ones_again(tmp_path):
    """A run without final.json (killed) starts again from its first step and ends with the metrics of its
    first, uninterrupted run; a finished run is skipped."""
    runs = _tiny_runs()
    assert grid.run_suites(runs, str(tmp_path), jobs=2, poll=0.2) == []
    killed, done = (tmp_path / "t" / r.name for r in runs)
    before = read_rows(killed)
    os.remove(killed / "final.json")
    with open(killed / "metrics.csv") as f:  # as a kill leaves it: the first row only
        head = f.readlines()[:2]
    (killed / "metrics.csv").write_text("".join(head))
    mtime = os.path.getmtime(done / "final.json")
    assert grid.run_suites(runs, str(tmp_path), jobs=2, poll=0.2) == []
    after = read_rows(killed)
    assert len(after) == len(before) == 2
    for a, b in zip(after, before, strict=True):
        assert all(_same(a[k], b[k]) for k in a.keys() - TIMING)
    assert os.path.getmtime(done / "final.json") == mtime


@pytest.mark.slow  # a Ray instance takes minutes to start on a loaded 2-core machine
def test_grid_runner_ray_backend_matches_local_runs(tmp_path):
    """The same runs as Ray tasks on a local Ray instance give the metrics of local subprocess runs."""
    ray = pytest.importorskip("ray")
    runs = _tiny_runs()
    assert grid.run_suites(runs, str(tmp_path / "local"), jobs=2, poll=0.2) == []
    try:
        assert grid.run_suites(runs, str(tmp_path / "ray"), jobs=2, poll=0.2, backend="ray") == []
    finally:
        ray.shutdown()
    for run in runs:
        a, b = read_rows(tmp_path / "local" / "t" / run.name), read_rows(tmp_path / "ray" / "t" / run.name)
        assert len(a) == len(b) == 2
        for ra, rb in zip(a, b, strict=True):
            assert all(_same(ra[k], rb[k]) for k in ra.keys() - TIMING)
