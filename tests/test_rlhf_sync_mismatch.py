"""The synchronous sampler-mismatch study (rgpo_lab.rlhf_sync_mismatch, issue 55): the suites build exactly
the planned runs with the flags each arm needs, the flags reach the recipe's trainer configs, seeds never
repeat between pre-check, tuning and suite, the pre-check's rule matches scipy and Holm by hand, and the
recipe refuses bad sampler options in one line."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest
from _references import holm_by_hand
from scipy import stats

from recipes.hh_rlhf.parsing import parse_recipe_args
from rgpo_lab import rlhf_suite
from rgpo_lab import rlhf_sync_mismatch as smm
from rgpo_trl.cli import UsageError

ROOT = Path(__file__).resolve().parent.parent
DOSES = ["fp32", "sigma0.15", "sigma0.5", "sigma1", "sigma4"]  # from the rule, not from the module
CELLS = [f"{d}__k{k}" for k in (1, 4) for d in DOSES]
# the arms the issue keeps whatever the budget
SIX = ("uncorrected", "sequence_mask", "tis", "rgpo", "rgpo_coupled", "rgpo_gate")


def _flags(run) -> dict[str, str]:
    """A run's command-line flags (the last value wins, as in argparse)."""
    return {run.extra[i][2:]: run.extra[i + 1] for i in range(0, len(run.extra), 2)}


def _key(run) -> tuple[str, str, int]:
    arm, cell = run.tag.split("__lr")[0].split("__", 1)
    return arm, cell, run.seed


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.setattr(smm, "OUT", str(tmp_path))
    return tmp_path


def _write(out: Path, name: str, obj: dict) -> None:
    (out / name).write_text(json.dumps(obj))


def test_rules_md_quotes_the_rule_committed_before_the_runs():
    """RULES.md quotes the module's rule, and the rule's text there is what it was at 07159d6, before the
    pre-check's first run (its runs record b5884df, a later commit)."""
    rules = (ROOT / "results/rlhf/v3/sync_mismatch/RULES.md").read_text()
    before = subprocess.run(
        ["git", "-C", str(ROOT), "show", "07159d6:results/rlhf/v3/sync_mismatch/RULES.md"],
        capture_output=True,
        text=True,
    )
    if before.returncode:
        pytest.skip("07159d6 is not in this clone's history (a shallow clone): git fetch --unshallow")
    assert smm.RULE in rules and smm.RULE in before.stdout


def test_calibrated_dose_is_the_committed_calibration():
    calibration = json.loads((ROOT / "results/rlhf/v3/mismatch/calibration.json").read_text())
    assert smm.CALIBRATED_SIGMA == calibration["calibrated_sigma"]


def test_precheck_stage_a_then_stage_b(out):
    runs = rlhf_suite.SUITE_BUILDERS["v3/sync_mismatch_precheck"]("unused")
    sft = [r for r in runs if r.method == "sft"]
    assert sorted(r.seed for r in sft) == [101, 102, 103]
    keys = {_key(r) for r in runs if r.method != "sft"}
    assert keys == {("uncorrected", c, s) for c in CELLS for s in (101, 102, 103)}
    assert len(runs) == 3 + 30
    for r in runs:
        if r.method == "sft":
            continue
        f, (dose, k) = _flags(r), r.tag.split("__", 1)[1].split("__k")
        assert r.method == "grpo" and f["vllm_importance_sampling_correction"] == "false"
        assert f["use_in_process_sampler"] == "true" and f["loss_type"] == "dapo"
        assert f.get("sampler_logit_noise") == (None if dose == "fp32" else dose[5:])
        assert f["num_iterations"] == k and int(f["num_rl_iterations"]) * int(k) == 400
        assert int(f["window_end"]) * int(k) == 400 and int(f["window_start"]) * int(k) == 304
        assert f["learning_rate"] == "2.5e-5" and f["lr_scheduler_type"] == "constant"
        assert f["heldout_samples"] == "4" and f["validation_prompts"] == "0"
    # stage B: rgpo and tis join the hurt cells only
    _write(out, "precheck.json", {"a": {"sigma4__k1": {"hurt": True}, "sigma1__k1": {"hurt": False}}})
    more = rlhf_suite.SUITE_BUILDERS["v3/sync_mismatch_precheck"]("unused")
    added = {_key(r) for r in more if r.method != "sft"} - keys
    assert added == {(a, "sigma4__k1", s) for a in ("rgpo", "tis") for s in (101, 102, 103)}


def test_each_arm_carries_the_flags_its_source_needs():
    expected = {  # arm -> (method, flags that must be there, flags that must not)
        "uncorrected": ("grpo", {"vllm_importance_sampling_correction": "false"}, {"gate_on_sampler"}),
        "sequence_mask": ("grpo", {"vllm_importance_sampling_mode": "sequence_mask"}, set()),
        "tis": ("grpo", {"vllm_importance_sampling_mode": "token_truncate"}, set()),
        "token_mask": ("grpo", {"vllm_importance_sampling_mode": "token_mask"}, set()),
        "cispo": ("cispo", {"beta": "0.0", "vllm_importance_sampling_mode": "sequence_mask"}, set()),
        "rgpo": ("rgpo_old", {"beta": "0.0"}, {"gate_on_sampler", "kl_controller"}),
        "rgpo_coupled": ("rgpo_old", {"beta": "0.0", "gate_on_sampler": "true"}, {"kl_controller"}),
        "rgpo_gate": ("rgpo_old", {"beta": "0.0", "kl_controller": "fixed", "kl_coef": "0.0"}, set()),
    }
    assert set(smm.ARMS) == set(expected)
    for arm, (method, present, absent) in expected.items():
        run = rlhf_suite._sync_mismatch_run("s", arm, "sigma1__k4", 1, "1e-5")
        f = _flags(run)
        assert run.method == method and run.name == f"{method}__{arm}__sigma1__k4__s1"
        assert {k: f[k] for k in present} == present and not absent & set(f)
        assert f["sampler_logit_noise"] == "1" and f["num_iterations"] == "4"


def test_budget_cuts_cispo_then_token_mask_never_the_kept_arms():
    # per arm, by hand (core-hours a run: 0.104 at k = 1, 0.061 at k = 4): fp32 and sigma 0.15 at both k,
    # 5 seeds: 10 * 0.104 + 10 * 0.061 = 1.65; a ranking cell adds 10 runs
    six = SIX
    assert smm.suite_hours(six, []) == pytest.approx(6 * 1.65)
    assert set(smm.KEPT_ARMS) == set(smm.ARMS) - set(smm.CUT_ORDER) == set(six)
    assert smm.suite_arms([]) == (*six, "token_mask", "cispo")  # 8 x 1.65 = 13.2 <= 18
    assert smm.suite_arms(["sigma4__k4"]) == (*six, "token_mask")  # 8 x 2.26 = 18.08 > 18; 7 x 2.26 fits
    assert smm.suite_arms(["sigma1__k1"]) == six  # 7 x 2.69 = 18.83 > 18
    assert smm.suite_arms(["sigma1__k1", "sigma4__k4"]) == six  # 6 x 3.3 = 19.8: the kept arms stay


@pytest.mark.parametrize("arm", list(smm.ARMS))
def test_arm_flags_reach_the_recipe_config(arm):
    run = rlhf_suite._sync_mismatch_run("s", arm, "sigma0.5__k4", 7, "2.5e-5")
    argv = ["--config", str(ROOT / run.config), "--method", run.method, "--seed", "7", *run.extra]
    _, args, _ = parse_recipe_args(argv, check_hub=False)
    assert args.use_in_process_sampler is True and args.sampler_logit_noise == 0.5
    assert args.num_iterations == 4 and args.learning_rate == 2.5e-5 and args.beta == 0.0
    assert type(args).__name__ == ("RGPOConfig" if run.method == "rgpo_old" else "GRPOSamplerConfig")
    assert args.vllm_importance_sampling_correction is (arm != "uncorrected")
    assert args.loss_type == {"cispo": "cispo"}.get(arm, "dapo")
    if args.vllm_importance_sampling_correction and arm != "rgpo_coupled":
        assert args.vllm_importance_sampling_clip_max == 3.0
        assert args.vllm_importance_sampling_mode == {
            "tis": "token_truncate",
            "token_mask": "token_mask",
        }.get(arm, "sequence_mask")
    if run.method == "rgpo_old":
        assert args.ratio_mode == "old" and args.gate_on_sampler is (arm == "rgpo_coupled")
        assert (args.kl_controller, args.kl_coef) == (
            ("fixed", 0.0) if arm == "rgpo_gate" else ("adaptive", 0.5)
        )


BAD = [
    (("--use_in_process_sampler", "true", "--sampler_logit_noise", "-1"), "sampler_logit_noise"),
    (("--use_in_process_sampler", "true", "--sampler_top_p", "1.5"), "sampler_top_p"),
    (("--sampler_logit_noise", "0.5"), "use_in_process_sampler=True"),
    (("--use_in_process_sampler", "true", "--vllm_importance_sampling_mode", "bogus"), "vllm_importance"),
    (("--use_in_process_sampler", "true", "--top_p", "0.9"), "top_p=0.9"),
]


@pytest.mark.parametrize("method", ["grpo", "rgpo_old"])
@pytest.mark.parametrize("flags,field", BAD)
def test_recipe_refuses_bad_sampler_options_in_one_line(method, flags, field):
    argv = ["--config", str(ROOT / rlhf_suite.PAPER_V3), "--method", method, "--beta", "0.0", *flags]
    with pytest.raises(UsageError) as info:
        parse_recipe_args(argv, check_hub=False)
    assert field in str(info.value) and "\n" not in str(info.value)


def _precheck_json(out: Path, ranking: list[str]) -> None:
    _write(out, "precheck.json", {"a": {}, "b": {}, "ranking_cells": ranking, "complete": True})


def test_tuning_runs_and_suite_runs_are_the_plan(out):
    with pytest.raises(SystemExit, match="pre-check"):
        rlhf_suite.SUITE_BUILDERS["v3/sync_mismatch_tune"]("unused")
    _precheck_json(out, ["sigma1__k1", "sigma4__k4"])
    tune = rlhf_suite.SUITE_BUILDERS["v3/sync_mismatch_tune"]("unused")
    six = SIX  # ranking cells at k = 1 and 4: 6 x 3.3 core-hours, cispo and token_mask cut
    planned = itertools.product(
        six, ["fp32__k4", "sigma4__k4"], ("1.25e-5", "2.5e-5", "5e-5"), (201, 202, 203)
    )
    assert sorted((*_key(r), _flags(r)["learning_rate"]) for r in tune) == sorted(
        (a, c, s, lr) for a, c, lr, s in planned
    )
    assert all(
        _flags(r)["validation_prompts"] == "256" and _flags(r)["validation_every"] == "6" for r in tune
    )
    assert len({r.name for r in tune}) == len(tune)

    with pytest.raises(SystemExit, match="selection"):
        rlhf_suite.SUITE_BUILDERS["v3/sync_mismatch"]("unused")
    _write(out, "selection.json", {"selected_lr": {a: "5e-5" for a in smm.ARMS} | {"tis": "1.25e-5"}})
    suite = rlhf_suite.SUITE_BUILDERS["v3/sync_mismatch"]("unused")
    other = ["fp32__k1", "sigma0.15__k1", "fp32__k4", "sigma0.15__k4"]
    plan = {(a, c, s) for a in six for c in other for s in range(1, 6)}
    plan |= {(a, c, s) for a in six for c in ("sigma1__k1", "sigma4__k4") for s in range(1, 11)}
    assert sorted(_key(r) for r in suite) == sorted(plan)
    assert all(_flags(r)["learning_rate"] == ("1.25e-5" if "__tis__" in r.name else "5e-5") for r in suite)
    assert {r.seed for r in suite}.isdisjoint(smm.PRECHECK_SEEDS + smm.TUNE_SEEDS)
    assert set(smm.PRECHECK_SEEDS).isdisjoint(smm.TUNE_SEEDS)


def test_precheck_rule_matches_scipy_and_holm():
    control = [1.2, 1.3, 1.25]
    gold = {c: {"uncorrected": control} for c in ("fp32__k1", "fp32__k4")}
    gold["sigma4__k1"] = {"uncorrected": [0.1, 0.0, -0.1], "rgpo": [1.6, 1.7, 1.65], "tis": [0.9, 1.0, 1.1]}
    gold["sigma4__k4"] = {"uncorrected": [0.2, 0.3, 0.1], "rgpo": [0.9, 1.0, 1.1], "tis": [1.0, 1.05, 1.0]}
    gold["sigma1__k1"] = {"uncorrected": [1.5, 1.6, 1.55]}  # higher: not hurt
    sft = [1.1, 1.15, 1.12]
    r = smm.precheck_decision(gold, sft)
    cells = ["sigma4__k1", "sigma4__k4", "sigma1__k1"]
    control_of = {"sigma4__k1": control, "sigma4__k4": control, "sigma1__k1": control}
    p = [stats.ttest_ind(gold[c]["uncorrected"], control_of[c], equal_var=False).pvalue for c in cells]
    for c, ph in zip(cells, holm_by_hand(p), strict=True):
        assert r["a"][c]["p_holm"] == pytest.approx(ph)
    assert [c for c in cells if r["a"][c]["hurt"]] == ["sigma4__k1", "sigma4__k4"]
    assert r["b"]["sigma4__k1"]["best"] == "rgpo" and r["b"]["sigma4__k4"]["best"] == "tis"
    pb = [stats.ttest_ind(gold[c][r["b"][c]["best"]], sft, equal_var=False).pvalue for c in cells[:2]]
    for c, ph in zip(cells[:2], holm_by_hand(pb), strict=True):
        assert r["b"][c]["p_holm"] == pytest.approx(ph)
    # k = 1's best arm is far above SFT; k = 4's best (tis, 1.02) is below it: that cell cannot rank
    assert r["ranking_cells"] == ["sigma4__k1"] and r["complete"]
    assert smm.tuning_cells(r) == ["fp32__k1", "sigma4__k1"]
    # two qualifying cells at k = 1: the smaller dose ranks
    gold["sigma1__k1"] = {"uncorrected": [0.3, 0.2, 0.25], "rgpo": [1.5, 1.6, 1.55], "tis": [1.4, 1.5, 1.45]}
    r = smm.precheck_decision(gold, sft)
    assert r["qualifying_cells"] == ["sigma4__k1", "sigma1__k1"] and r["ranking_cells"] == ["sigma1__k1"]
    assert smm.tuning_cells({"ranking_cells": []}) == ["fp32__k4", "sigma0.15__k4"]


def test_selection_takes_the_highest_mean_validation_gold_and_waits_for_unfinished_arms(out, tmp_path):
    _precheck_json(out, [])  # tuning cells fp32__k4, sigma0.15__k4; 8 arms
    results = tmp_path / "results"
    means = {"1.25e-5": 1.0, "2.5e-5": 1.3, "5e-5": 1.2}
    for arm in SIX:  # token_mask and cispo never finish
        for lr, mean in means.items():
            for i, (cell, seed) in enumerate(
                itertools.product(["fp32__k4", "sigma0.15__k4"], (201, 202, 203))
            ):
                d = (
                    results
                    / "v3"
                    / "sync_mismatch_tune"
                    / f"{smm.ARMS[arm][0]}__{arm}__{cell}__lr{lr}__s{seed}"
                )
                d.mkdir(parents=True)
                gold = mean + (1.0 if arm == "tis" and lr == "5e-5" and i == 0 else 0.0)  # one run lifts 5e-5
                (d / "validation.json").write_text(
                    json.dumps({"gold": gold, "iterations": [100], "expected_iterations": [100]})
                )
    r = smm.select(str(results), str(out))
    assert r["selected_lr"] == {
        **{a: "2.5e-5" for a in SIX},
        "tis": "5e-5",
        "token_mask": None,
        "cispo": None,
    }
    assert r["gold"]["tis"]["5e-5"] == pytest.approx(1.2 + 1.0 / 6)  # 1.367 > 1.3


def _finished(results: Path, name: str, gold: float) -> None:
    d = results / "v3" / "sync_mismatch_precheck" / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text("{}")
    (d / "heldout.json").write_text(json.dumps({"gold": gold, "kl_ref": 0.5}))


def test_precheck_reads_the_runs_then_asks_for_stage_b(out, tmp_path):
    results = tmp_path / "results"
    with pytest.raises(SystemExit, match="stage A"):
        smm.precheck(str(results), str(out))
    for i, seed in enumerate((101, 102, 103)):
        _finished(results, f"sft__s{seed}", 1.1 + 0.01 * i)
        for cell in CELLS:  # only sigma4 at k = 1 falls
            _finished(
                results,
                f"grpo__uncorrected__{cell}__s{seed}",
                (0.1 if cell == "sigma4__k1" else 1.2) + 0.02 * i,
            )
    r = smm.precheck(str(results), str(out))
    assert [c for c, a in r["a"].items() if a["hurt"]] == ["sigma4__k1"] and not r["complete"]
    assert "In progress" in (out / "precheck.md").read_text()
    stage_b = {
        _key(x) for x in rlhf_suite.SUITE_BUILDERS["v3/sync_mismatch_precheck"]("unused") if x.method != "sft"
    }
    assert {(a, c) for a, c, _ in stage_b if a != "uncorrected"} == {
        ("rgpo", "sigma4__k1"),
        ("tis", "sigma4__k1"),
    }
    for i, seed in enumerate((101, 102, 103)):
        _finished(results, f"rgpo_old__rgpo__sigma4__k1__s{seed}", 1.6 + 0.02 * i)
        _finished(results, f"grpo__tis__sigma4__k1__s{seed}", 1.4 + 0.02 * i)
    r = smm.precheck(str(results), str(out))
    assert r["complete"] and r["ranking_cells"] == ["sigma4__k1"] and r["b"]["sigma4__k1"]["best"] == "rgpo"
    assert "Ranking cells: sigma4__k1." in (out / "precheck.md").read_text()


def test_a_finished_run_without_its_gold_stops_the_rule_in_one_line(out, tmp_path):
    """A null gold is a failed measurement: the pre-check and the selection name the run instead of dropping
    it or writing NaN."""
    results = tmp_path / "results"
    _finished(results, "sft__s101", 1.0)
    (results / "v3" / "sync_mismatch_precheck" / "sft__s101" / "heldout.json").write_text(
        json.dumps({"gold": None, "kl_ref": 0.5})
    )
    with pytest.raises(SystemExit, match=r"sft__s101/heldout.json: the test gold is null"):
        smm.heldout(str(results), "v3/sync_mismatch_precheck", "sft__s101")
    d = tmp_path / "tune_run"
    d.mkdir()
    (d / "validation.json").write_text(
        json.dumps({"gold": None, "iterations": [1], "expected_iterations": [1]})
    )
    with pytest.raises(SystemExit, match="the validation gold is null"):
        smm.validation_gold(str(d))


def test_the_output_folder_is_read_at_call_time(out, tmp_path, monkeypatch):
    monkeypatch.setattr(smm, "RESULTS", str(tmp_path / "nothing"))
    monkeypatch.setattr(smm, "OUT", str(out))
    with pytest.raises(SystemExit, match="stage A"):  # reads the patched RESULTS, not the checkout's
        smm.precheck()
