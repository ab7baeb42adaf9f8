"""The policy_lag_confirm report on synthetic runs: its tests equal scipy's Welch and a hand Holm, its
reading follows RULES.md (every branch of the attribution), a partial suite is labelled interim with its
missing runs named by class, a run off the suite commit's code path keeps the status from final, and the
provenance compares code paths as syntax trees."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rgpo_lab.mujoco_grid import CONFIRM_ENVS, SUITES
from rgpo_lab.mujoco_report import (
    code_path,
    confirm,
    confirm_curves,
    confirm_reading,
    confirm_runs,
    confirm_statistics,
)
from rgpo_lab.mujoco_report.cells import fmt_or_dash

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEANS = {  # arm -> raw mean return, the same in every environment
    "ppo_dec": 1000.0,
    "rgpo_dec": 2500.0,
    "ppo_dec_kl": 1100.0,
    "rgpo_dec_nokl": 2400.0,
    "ppo_plain": 500.0,
    "rgpo_plain": 500.0,
    "ppo_L0": 3000.0,
    "rgpo_L0": 3000.0,
}


def _write_suite(root, skip=(), commits=(code_path.SUITE_COMMIT,)):
    """Every run of the suite as a folder with final.json (made at ``commits``) and a 3-row metrics.csv; arm
    means from MEANS plus seeded noise."""
    by_key = {v: k for k, v in confirm_runs.ARMS.items()}
    rng = np.random.default_rng(0)
    for r in SUITES["policy_lag_confirm"]:
        if r.name in skip:
            continue
        d = os.path.join(root, r.suite, r.name)
        os.makedirs(d, exist_ok=True)
        value = MEANS[by_key[(r.method, r.variant)]] + rng.normal(0, 150)
        with open(os.path.join(d, "final.json"), "w") as f:
            json.dump({"eval_return_mean": value, "git_commits": list(commits)}, f)
        metrics = {"global_step": [2048, 4096, 6144], "return_last100": [0.0, value / 2, value]}
        if "lag8" in r.variant and "decoupled" not in r.variant:
            metrics.update(
                {"start_ratio_beyond_2": [0.1, 0.2, 0.3], "start_rejected_frac": [0.05, 0.05, 0.05]}
            )
        pd.DataFrame(metrics).to_csv(os.path.join(d, "metrics.csv"), index=False)
    os.makedirs(os.path.join(root, "normalisation"), exist_ok=True)
    with open(os.path.join(ROOT, "results", "mujoco", "normalisation", "baselines.json")) as f:
        baselines = json.load(f)
    with open(os.path.join(root, "normalisation", "baselines.json"), "w") as f:
        json.dump(baselines, f)


def _run(name):
    (r,) = [r for r in SUITES["policy_lag_confirm"] if f"{r.suite}/{r.name}" == name]
    return r


def test_report_tests_match_scipy_and_holm_and_the_reading_follows_the_rule(tmp_path):
    _write_suite(str(tmp_path))
    md = confirm.build(str(tmp_path), str(tmp_path / "out"), n_boot=500, plots=False)
    studies = json.loads((tmp_path / "out" / "studies.json").read_text())
    assert all(v == [] for v in studies["missing"].values()) and "Status: **final**" in md
    assert studies["status"] == "final" and not studies["reading"].startswith("Interim")
    assert "| interim: " not in md and "Interim (see the status above)" not in md
    data = confirm_runs.load(str(tmp_path)).data
    (a,) = [c for c in studies["comparisons"] if c["name"] == "more robust"]
    ps = [a["aggregate"]["p"]]
    for env in CONFIRM_ENVS:
        x, y = confirm_runs.returns(data, "rgpo_dec", env), confirm_runs.returns(data, "ppo_dec", env)
        assert len(x) == len(y) == 10
        t = stats.ttest_ind(x, y, equal_var=False)
        assert a["per_env"][env]["p"] == pytest.approx(t.pvalue, rel=1e-12)
        assert a["per_env"][env]["diff"] == pytest.approx(x.mean() - y.mean(), rel=1e-12)
        ps.append(t.pvalue)
    order = np.argsort(ps)  # Holm by hand
    adjusted, running = [0.0] * 4, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (4 - rank) * ps[i]))
        adjusted[i] = running
    assert a["aggregate"]["p_holm"] == pytest.approx(adjusted[0])
    assert [a["per_env"][e]["p_holm"] for e in CONFIRM_ENVS] == pytest.approx(adjusted[1:])
    assert a["aggregate"]["p"] >= 1 / 500  # floored at 1 / n_boot, and the report says so
    assert "floored at 1 / 500 = 0.002" in md
    # RGPO far above PPO everywhere, PPO + KL penalty not above decoupled PPO: the gate is the cause
    assert a["aggregate"]["verdict"] == "higher"
    assert "confirmed; cause: gate (" in studies["reading"]
    gates = studies["gate_activity"]["rgpo_plain"]["Hopper-v4"]
    assert gates["start_ratio_beyond_2"] == pytest.approx(0.2) and gates[
        "start_rejected_frac"
    ] == pytest.approx(0.05)
    assert gates["start_ratio_beyond_2_n"] == 5
    assert "| plain RGPO | Hopper-v4 | - | 0.200 (5) |" in md  # each number with its n
    # the secondaries are labelled, the Holm grouping and the decoupling rule stated
    for heading in (
        "Secondary: optimality gap",
        "## Secondary: probability of improvement",
        "## Secondary: what the gate / clip saw",
        "## Secondary: training curves",
        "Holm within the comparison",
    ):
        assert heading in md, heading
    assert "decoupling helps PPO" in studies["decoupling"] and "seeds 0-4 only (n = 5" in md
    assert "L = 8 arms and the L = 0 baselines" in md


def test_probability_of_improvement_is_the_mean_over_environments_with_a_stratified_interval(tmp_path):
    _write_suite(str(tmp_path))
    data = confirm_runs.load(str(tmp_path)).data
    poi = confirm_statistics.improvement(data, n_boot=300)
    per_env = []
    for env in CONFIRM_ENVS:
        x, y = confirm_runs.returns(data, "rgpo_dec", env), confirm_runs.returns(data, "ppo_dec", env)
        by_hand = np.mean([[1.0 if a > b else 0.5 if a == b else 0.0 for b in y] for a in x])
        assert poi["per_env"][env] == pytest.approx(by_hand)
        per_env.append(by_hand)
    assert poi["mean"] == pytest.approx(np.mean(per_env)) and poi["envs"] == CONFIRM_ENVS
    assert poi["low"] <= poi["mean"] <= poi["high"] <= 1.0
    # the primary's resampling: the same rng draws (a's environments, then b's) as aggregate_difference
    rng = np.random.default_rng(0)
    xs = [confirm_runs.returns(data, "rgpo_dec", e) for e in CONFIRM_ENVS]
    ys = [confirm_runs.returns(data, "ppo_dec", e) for e in CONFIRM_ENVS]
    boots = []
    for _ in range(300):
        rx = [g[rng.integers(0, len(g), len(g))] for g in xs]
        ry = [g[rng.integers(0, len(g), len(g))] for g in ys]
        boots.append(
            np.mean(
                [
                    ((a[:, None] > b[None]) + 0.5 * (a[:, None] == b[None])).mean()
                    for a, b in zip(rx, ry, strict=True)
                ]
            )
        )
    assert [poi["low"], poi["high"]] == pytest.approx(list(np.percentile(boots, [2.5, 97.5])))


def test_a_partial_suite_is_interim_and_names_its_missing_runs_by_class(tmp_path):
    skip = {r.name for r in SUITES["policy_lag_confirm"] if r.env_id == "Hopper-v4" and r.seed >= 2}
    _write_suite(str(tmp_path), skip=skip)
    runs = [f"{r.suite}/{r.name}" for r in SUITES["policy_lag_confirm"] if r.name in skip]
    incomplete, crashed, nan_run = (
        runs[0],
        runs[1],
        "policy_lag_confirm/Walker2d-v4__rgpo__lag8_decoupled__s7__1000k",
    )
    os.makedirs(tmp_path / incomplete)
    (tmp_path / incomplete / "metrics.csv").write_text("global_step,return_last100\n2048,1.0\n")
    os.makedirs(tmp_path / crashed)
    (tmp_path / crashed / "run.log").write_text(
        "\n# 2026-11-26 10:00:00 python -m x\nTraceback (most recent call last):\nRuntimeError: boom\n"
        "\n# 2026-11-26 11:00:00 python -m x --resume\nok\n"
        "error: loss is not finite (--debug shows the traceback)\n"
    )
    with open(tmp_path / nan_run / "final.json", "w") as f:  # json writes NaN
        json.dump({"eval_return_mean": float("nan"), "git_commits": [code_path.SUITE_COMMIT]}, f)
    md = confirm.build(str(tmp_path), str(tmp_path / "out"), n_boot=200, plots=False)
    studies = json.loads((tmp_path / "out" / "studies.json").read_text())
    missing = studies["missing"]
    assert missing["incomplete"] == [incomplete] and missing["failed"] == [crashed, nan_run]
    assert sorted(missing["not started"]) == sorted(set(runs) - {incomplete, crashed})
    assert "error: loss is not finite" in studies["failed_why"][crashed]
    assert (
        "eval_return_mean is nan" in studies["failed_why"][nan_run] and nan_run in md
    )  # named, never dropped silently
    assert "### Failed (2)" in md and "### Incomplete (1)" in md
    assert len(confirm_runs.returns(confirm_runs.load(str(tmp_path)).data, "rgpo_dec", "Walker2d-v4")) == 9
    total = len(SUITES["policy_lag_confirm"])
    assert studies["status"] == f"INTERIM: {total - len(runs) - 1} of {total} runs finished"
    assert "INTERIM" in md and "Interim, on an incomplete suite" in md
    assert studies["reading"].startswith("Interim, on an incomplete suite: ")
    assert studies["decoupling"].startswith("Interim, on an incomplete suite: ")
    assert "| interim: higher |" in md
    # Hopper has 2 runs per arm: still in the aggregate; with one it would be left out and named
    (a,) = [c for c in studies["comparisons"] if c["name"] == "more robust"]
    assert a["aggregate"]["envs"] == CONFIRM_ENVS


def test_a_run_off_the_suite_commits_code_path_keeps_the_status_from_final(tmp_path):
    """One run resumed at a commit on another code path (final.json's git_commits, not config.json's last
    commit), one at a commit git does not know: not final, both named; the reused runs' commits listed."""
    _write_suite(str(tmp_path))
    other, unknown = "Hopper-v4__ppo__lag8__s0__1000k", "Ant-v4__rgpo__default__s7__1000k"
    for name, commits in ((other, ["e53d11f", code_path.SUITE_COMMIT]), (unknown, ["0" * 40])):
        d = tmp_path / "policy_lag_confirm" / name
        final = json.loads((d / "final.json").read_text())
        (d / "final.json").write_text(json.dumps({**final, "git_commits": commits}))
        (d / "config.json").write_text(json.dumps({"git_commit": code_path.SUITE_COMMIT}))
    md = confirm.build(str(tmp_path), str(tmp_path / "out"), n_boot=200, plots=False)
    studies = json.loads((tmp_path / "out" / "studies.json").read_text())
    assert studies["provenance"]["different"] == [f"policy_lag_confirm/{other}"]
    assert studies["provenance"]["not_checked"] == [f"policy_lag_confirm/{unknown}"]
    assert studies["status"].startswith("NOT FINAL: 2 of the suite's own runs") and "final**" not in md
    assert studies["reading"].startswith("Interim, with 2 of the suite's own runs not confirmed")
    assert f"runs: policy_lag_confirm/{other}" in md and f"runs: policy_lag_confirm/{unknown}" in md
    assert "e53d11f then 393cfc0: 1 run (DIFFERENT code path)" in md
    n_reused = sum(r.suite != "policy_lag_confirm" for r in SUITES["policy_lag_confirm"])
    assert studies["provenance"]["reused"] == [
        {
            "commits": [code_path.SUITE_COMMIT],
            "runs": n_reused,
            "suites": {"annealed5": 12, "main_compiled": 18, "policy_lag": 40},
        }
    ]


def _aggregate(verdict, diff=0.3, p=0.01):
    return {"a": 0.8, "b": 0.4, "diff": diff, "low": 0.1, "high": 0.5, "p_holm": p, "verdict": verdict}


def _comparisons(robust="higher", gate="higher", controller="no significant difference"):
    verdicts = {"more robust": robust, "gate": gate, "controller (PPO)": controller}
    per_env = {e: {"n_a": 10, "n_b": 9} for e in CONFIRM_ENVS}
    return [
        {"aggregate": _aggregate(verdicts.get(name, "higher")), "per_env": per_env}
        for _, name, _, _ in confirm_runs.COMPARISONS
    ]


@pytest.mark.parametrize(
    ("gate", "controller", "expected"),
    [
        ("higher", "no significant difference", "gate"),
        ("higher", "lower", "gate"),
        ("no significant difference", "higher", "controller"),
        ("higher", "higher", "gate and controller"),
        ("no significant difference", "no significant difference", "undetermined"),
        ("lower", "higher", "undetermined"),  # the gate significantly lower: not "controller"
        ("not tested (fewer than 2 runs a side)", "higher", "undetermined"),
        ("lower", "no significant difference", "undetermined"),
    ],
)
def test_attribution_follows_the_rule_branch_by_branch(gate, controller, expected):
    assert confirm_reading.cause(gate, controller) == expected
    words = confirm_reading.attribution_words(_comparisons(gate=gate, controller=controller))
    assert f"confirmed; cause: {expected} (" in words


def test_no_significant_difference_attributes_no_cause_and_says_n_and_p():
    comparisons = _comparisons(robust="no significant difference", gate="higher", controller="higher")
    comparisons[0]["aggregate"].update(p_holm=0.4)
    words = confirm_reading.attribution_words(comparisons)
    assert "not confirmed: no significant difference (n = 10 / 9 Walker2d-v4, 10 / 9 Ant-v4" in words
    assert "Holm p = 0.400)" in words and "no cause is attributed" in words and "cause:" not in words
    comparisons[0]["aggregate"].update(diff=-0.3, p_holm=0.01, verdict="lower")
    assert "refuted in the other direction" in confirm_reading.attribution_words(comparisons)


def test_decoupling_is_said_to_help_only_where_the_decoupled_arm_is_significantly_above():
    comparisons = _comparisons()
    names = [name for _, name, _, _ in confirm_runs.COMPARISONS]
    comparisons[names.index("decoupling (RGPO)")]["aggregate"].update(verdict="no significant difference")
    words = confirm_reading.decoupling_words(comparisons)
    assert "decoupling helps PPO (" in words and "decoupling is not shown to help RGPO" in words
    assert "seeds 0-4 only (n = 5 per environment)" in words


def test_provenance_compares_code_paths_by_syntax_tree():
    """The suite commit is its own code path; the commit before the component flags is not; a commit whose
    only change in the code path is the closing console line (TrainingRun.finish) is; commits that add issue
    47's corrections module to rgpo_trl.core (an export none of the scripts' names come from) are."""
    assert code_path.same_code_path(code_path.SUITE_COMMIT) is True
    # before --kl-penalty and the start-of-update statistics
    assert code_path.same_code_path("e53d11f") is False
    assert code_path.same_code_path("f76bccb") is True  # TrainingRun.finish's closing line only
    for commit in ("67d0af29", "afc5f609"):  # rgpo_trl.core also imports corrections.py
        check = code_path.code_path_check(commit)
        assert check.same is True and any("corrections.py" in n for n in check.notes)
    assert code_path.same_code_path("0" * 40) is None
    assert code_path.same_code_path("unknown") is None
    assert {"rgpo_trl/cli.py", "rgpo_trl/core/registry.py"} <= set(code_path.CODE_PATH)


# The stand-in for a commit with the lab runner whose code path is the suite commit's: the last commit before
# the code path itself changed (the acceptance classifier's argument of rgpo_loss). The working tree served
# until then; a later change to the loss would rightly make it another code path.
STAND_IN = "e554ba5"


def _worktree_show(real_show, files):
    """A stand-in commit "WORKTREE": `STAND_IN`'s tree, with ``files`` ({path: text or None}) changed."""
    if code_path._git_ls(STAND_IN, "rgpo_lab") is None:
        pytest.skip(f"commit {STAND_IN} is not in this clone (git fetch --unshallow)")

    def show(commit, path):
        if commit != "WORKTREE":
            return real_show(commit, path)
        return files[path] if path in files else real_show(STAND_IN, path)

    return show


def _worktree_ls(real_ls, extra=()):
    def ls(commit, *paths):
        if commit != "WORKTREE":
            return real_ls(commit, *paths)
        found = [f for f in real_ls(STAND_IN, *paths) if f.endswith(".py")]
        return sorted(found + [e for e in extra if any(e.startswith(p) for p in paths)])

    return ls


def test_provenance_at_a_commit_with_the_lab_runner_compares_the_runner(monkeypatch):
    """From issue 48 on, the code the suite's runs execute is rgpo_lab/mujoco_runner (moved from
    mujoco_baselines/, imports and texts changed) and mujoco_baselines/ holds the single-file scripts: at such
    a commit (here `STAND_IN`) the suite commit's mujoco_baselines/<file> is
    compared with the runner's <file>, found the same code path; compared with the scripts instead, it is
    not."""
    monkeypatch.setattr(code_path, "_git_show", _worktree_show(code_path._git_show, {}))
    monkeypatch.setattr(code_path, "_git_ls", _worktree_ls(code_path._git_ls))
    check = code_path.code_path_check("WORKTREE")
    assert check.same is True and any("entry point" in n for n in check.notes)
    # no mapping: the suite's files vs the scripts
    monkeypatch.setattr(code_path, "RUNNER", "mujoco_baselines")
    assert code_path.same_code_path("WORKTREE") is not True


def test_provenance_catches_a_new_runner_file_a_rebound_name_and_an_import_that_touches_a_registry(
    monkeypatch,
):
    real_show, real_ls = code_path._git_show, code_path._git_ls
    core = real_show(STAND_IN, "rgpo_trl/core/__init__.py")
    corrections = real_show(STAND_IN, "rgpo_trl/core/corrections.py")
    cases = [
        # a runner file the suite commit lacks: not checked (named), never ignored
        (
            {"rgpo_lab/mujoco_runner/helper.py": "X = 1\n"},
            ["rgpo_lab/mujoco_runner/helper.py"],
            None,
            "helper",
        ),
        # rgpo_trl.core's make_gate taken from another module: a different code path
        (
            {"rgpo_trl/core/__init__.py": core + "from .corrections import make_correction as make_gate\n"},
            [],
            False,
            "make_gate",
        ),
        # the extra module imported by rgpo_trl.core registers into GATES: not checked
        (
            {"rgpo_trl/core/corrections.py": corrections + "from .gates import GATES\nGATES['x'] = 1\n"},
            [],
            None,
            "GATES",
        ),
        # the runner's entry point changed: a different code path
        ({"rgpo_lab/mujoco_runner/__main__.py": "import os\n"}, [], False, "entry point"),
    ]
    for files, extra, expected, named in cases:
        monkeypatch.setattr(code_path, "_git_show", _worktree_show(real_show, files))
        monkeypatch.setattr(code_path, "_git_ls", _worktree_ls(real_ls, extra))
        check = code_path.code_path_check("WORKTREE")
        assert check.same is expected and any(named in n for n in check.notes), (named, check)


def test_curves_show_every_arm_once_with_its_median_over_seeds(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _write_suite(str(tmp_path))
    data = confirm_runs.load(str(tmp_path)).data
    arms = [arm for row, _ in confirm_curves.CURVE_ROWS for arm in row]
    assert sorted(arms) == sorted(confirm_runs.ARMS)  # every arm, none twice
    captured = {}
    real_savefig = plt.Figure.savefig

    def keep(fig, *args, **kwargs):
        captured["fig"] = fig
        return real_savefig(fig, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plt.Figure, "savefig", keep)
        confirm_curves.curves(data, str(tmp_path / "out"))
    axes = captured["fig"].axes
    assert len(axes) == len(confirm_curves.CURVE_ROWS) * len(CONFIRM_ENVS)
    for i, (row, _) in enumerate(confirm_curves.CURVE_ROWS):
        for j, env in enumerate(CONFIRM_ENVS):
            lines = axes[i * len(CONFIRM_ENVS) + j].get_lines()
            with_runs = [arm for arm in row if data[arm][env]]
            assert len(lines) == len(with_runs)
            for line, arm in zip(lines, with_runs, strict=True):
                runs = data[arm][env]
                n = min(len(m) for _, _, m in runs)
                median = np.median(np.stack([m["return_last100"].to_numpy()[:n] for _, _, m in runs]), axis=0)
                np.testing.assert_allclose(line.get_ydata(), median)
                assert line.get_label().startswith(confirm_runs.LABELS[arm])


def test_a_largest_ratio_at_the_log_ratio_clamp_is_counted_and_explained(tmp_path):
    clamp = float(np.float32(np.exp(20.0)))  # what a float32 exp of the clamped log-ratio gives
    metrics = [pd.DataFrame({"ratio_max": [3.0, clamp]}), pd.DataFrame({"ratio_max": [2.0, 5.0]})]
    data = {arm: {e: [] for e in CONFIRM_ENVS} for arm in confirm_runs.ARMS}
    data["rgpo_dec_nokl"]["Hopper-v4"] = [(0, 1.0, metrics[0]), (1, 1.0, metrics[1])]
    gates = confirm_statistics.gate_activity(data)
    g = gates["rgpo_dec_nokl"]["Hopper-v4"]
    assert g["ratio_max"] == pytest.approx((clamp + 5.0) / 2) and g["ratio_max_n"] == 2
    assert g["ratio_max_at_clamp"] == 1
    assert gates["rgpo_dec_nokl"]["Walker2d-v4"]["ratio_max_at_clamp"] == 0
    # in the report: the count beside the cell's n, and what the clamp means
    _write_suite(str(tmp_path))
    (run,) = [
        r for r in SUITES["policy_lag_confirm"] if r.name == "Hopper-v4__rgpo__lag8_decoupled_nokl__s0__1000k"
    ]
    path = os.path.join(str(tmp_path), run.suite, run.name, "metrics.csv")
    pd.read_csv(path).assign(ratio_max=[2.0, 3.0, clamp]).to_csv(path, index=False)
    md = confirm.build(str(tmp_path), str(tmp_path / "out"), n_boot=200, plots=False)
    assert f"| {fmt_or_dash(clamp, 2)} (1; 1 at clamp) |" in md
    assert '"k at clamp": in k of the runs the largest ratio is exp(20)' in md


def test_sensitivity_section_is_labelled_and_recomputes_from_the_baselines(tmp_path):
    """Added after the final reading (issue 55): the normalising ranges from baselines.json by hand, the
    environment of the narrowest range left out of test (1), each environment's standardised difference by
    hand, the pooled IQM's trimmed runs by environment; the section comes last and says it decides nothing."""
    from rgpo_lab.statistics import aggregate_difference

    _write_suite(str(tmp_path))
    md = confirm.build(str(tmp_path), str(tmp_path / "out"), n_boot=300, plots=False)
    sens = json.loads((tmp_path / "out" / "studies.json").read_text())["sensitivity"]
    with open(os.path.join(ROOT, "results", "mujoco", "normalisation", "baselines.json")) as f:
        table = json.load(f)["environments"]
    low = {e: max(table[e]["random"]["mean"], table[e]["zero"]["mean"]) for e in CONFIRM_ENVS}
    ranges = {e: table[e]["reference"]["mean"] - low[e] for e in CONFIRM_ENVS}
    assert sens["ranges"] == pytest.approx(ranges)
    gone = min(ranges, key=ranges.get)
    assert sens["without_env"] == gone
    data = confirm_runs.load(str(tmp_path)).data
    others = [e for e in CONFIRM_ENVS if e != gone]

    def scores(arm, e):
        return (confirm_runs.returns(data, arm, e) - low[e]) / ranges[e]

    (i,) = [k for k, c in enumerate(confirm_runs.COMPARISONS) if c[1] == "more robust"]
    without = aggregate_difference(
        [scores("rgpo_dec", e) for e in others], [scores("ppo_dec", e) for e in others]
    )
    row = sens["comparisons"][i]
    assert row["without"]["diff"] == pytest.approx(without.diff)
    d = []
    for e in CONFIRM_ENVS:
        x, y = confirm_runs.returns(data, "rgpo_dec", e), confirm_runs.returns(data, "ppo_dec", e)
        d.append((x.mean() - y.mean()) / np.sqrt((x.var(ddof=1) + y.var(ddof=1)) / 2))
    assert row["equal_weights"]["per_env"] == pytest.approx(d)
    assert row["equal_weights"]["diff"] == pytest.approx(np.mean(d))
    pooled = sorted((s, e) for e in CONFIRM_ENVS for s in scores("ppo_dec", e))
    k = len(pooled) // 4
    for end, part in (("low", pooled[:k]), ("high", pooled[-k:])):
        assert sens["trimmed"]["ppo_dec"][end] == {e: sum(x[1] == e for x in part) for e in CONFIRM_ENVS}
    assert md.index("## Secondary: training curves") < md.index("## Sensitivity (added ")
    assert "after the final reading; not in RULES.md, decides nothing" in md
    assert f"| without {gone}: IQM diff [95%], p |" in md
