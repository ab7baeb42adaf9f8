"""The grid's `classifier` suite is the run list its reading rule (results/mujoco/classifier/RULES.md,
committed before any run) fixes: three arms x three environments x seeds 0-4 at 499,712 steps, eager,
seeds outermost, none on the seed of the rule's cost measurements."""

from __future__ import annotations

import itertools
import os

import pytest
from _mujoco_utils import ROOT, script

from rgpo_lab import mujoco_grid as grid

tyro = pytest.importorskip("tyro")

RULES = os.path.join(ROOT, "results", "mujoco", "classifier", "RULES.md")
# the rule's constants, written out from RULES.md (and found in its text below)
ARMS = {"ppo": ("ppo", ()), "rgpo": ("rgpo", ()), "rgpo_clf": ("rgpo", ("--acceptance-classifier",))}
ENVS = ("HalfCheetah-v4", "Walker2d-v4", "Hopper-v4")
SEEDS = (0, 1, 2, 3, 4)
STEPS = 499_712
COST_SEED = 1000  # the rule's cost measurements (its pre-check), not part of any result


def test_the_rule_states_these_constants():
    text = open(RULES).read()
    assert "Seeds: 0, 1, 2, 3, 4 for every arm and environment" in text
    assert f"--total-timesteps {STEPS}" in text and f"{STEPS // 2048} rollouts of 2,048" in text
    assert "Environments: HalfCheetah-v4, Walker2d-v4, Hopper-v4" in text and "45 runs" in text
    assert f"seed {COST_SEED}" in text
    assert "`python mujoco_baselines/rgpo_continuous_action.py --acceptance-classifier`" in text


def test_classifier_suite_is_the_rules_run_list():
    runs = grid.SUITES["classifier"]
    got = sorted((r.method, r.flags, r.env_id, r.seed, r.total_timesteps) for r in runs)
    want = sorted(
        (method, flags, env, seed, STEPS)
        for (method, flags), env, seed in itertools.product(ARMS.values(), ENVS, SEEDS)
    )
    assert got == want and len(runs) == 45
    assert len({r.name for r in runs}) == 45 and all(r.suite == "classifier" for r in runs)
    assert [r.seed for r in runs] == sorted(r.seed for r in runs)  # seeds outermost
    assert not any("--compile" in r.flags for r in runs)
    other_seeds = {r.seed for s, rs in grid.SUITES.items() if s != "classifier" for r in rs}
    assert COST_SEED not in {r.seed for r in runs} and COST_SEED not in other_seeds
    for r in runs:  # the script's defaults: only the rule's flags, parsed by the script itself
        cmd = r.command("/tmp/x")
        args = tyro.cli(script(r.method).Args, args=cmd[5:])
        assert (args.env_id, args.seed, args.total_timesteps) == (r.env_id, r.seed, STEPS)
        assert not args.compile and cmd[5:9] == ["--env-id", r.env_id, "--seed", str(r.seed)]
        assert cmd[9:] == ["--total-timesteps", str(STEPS), *r.flags]
        if r.method == "rgpo":
            assert args.acceptance_classifier == (r.variant == "classifier")


def test_classifier_suite_lists_45_runs_and_refuses_compile(capsys):
    assert grid.main(["classifier", "--list"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert len(lines) == 45 and sum(ln.endswith("flags: --acceptance-classifier") for ln in lines) == 15
    with pytest.raises(SystemExit):
        grid.main(["classifier", "--compile", "--list"])
    assert "cannot be combined with classifier (the acceptance classifier has no compiled path)" in (
        capsys.readouterr().err
    )
