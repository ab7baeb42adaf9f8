"""Run the RLHF comparison as a suite: every method x seed through recipes/hh_rlhf_qwen.py, N at a time,
finished runs skipped, interrupted runs resumed from their latest Trainer checkpoint.

    python -m rgpo_lab.rlhf_suite tiny-paper --jobs 2          # 7 methods + the SFT baseline x 3 seeds
    python -m rgpo_lab.rlhf_suite --list
    python -m rgpo_lab.rlhf_report results/rlhf/tiny-paper     # the table and figures

Run from the repository root of a checkout (cd <checkout> first, or PYTHONPATH=<checkout>): the lab is not
installed with the package, and elsewhere Python finds no module rgpo_lab.

Each run writes ``results/rlhf/<suite>/<method>__s<seed>/``: metrics.jsonl / metrics.csv (per iteration),
summary.json (window averages; for DPO its end-of-run evaluation), heldout.json (the shared held-out
evaluation) and run.log. Checkpoints (``checkpoint-*``) stay there while a run is unfinished (git-ignored) and
are used to resume; a run is finished when its summary.json and heldout.json exist. One CPU process per run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from rgpo_lab import rlhf_mismatch as mm
from rgpo_lab import rlhf_sync_mismatch as smm
from rgpo_lab.job_queue import run_queue

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "recipes", "hh_rlhf_qwen.py")
METHODS = ["rgpo", "rgpo_old", "ppo", "grpo", "ppo_clip_kl", "sapo", "dpo", "sft"]


@dataclass(frozen=True)
class RLHFRun:
    suite: str
    method: str
    seed: int
    config: str
    extra: tuple[str, ...] = ()
    tag: str = ""  # the setting that differs between a suite's runs of one method, e.g. "lr1e-4"

    @property
    def name(self) -> str:
        return f"{self.method}__{self.tag}__s{self.seed}" if self.tag else f"{self.method}__s{self.seed}"

    def command(self, out: str) -> list[str]:
        accelerate_config = os.path.join(ROOT, "recipes", "accelerate_configs", "cpu.yaml")
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", accelerate_config, RECIPE]
        config = os.path.join(ROOT, self.config)
        cmd += ["--config", config, "--method", self.method, "--seed", str(self.seed)]
        cmd += ["--output_dir", out, "--save_final_model", "false", "--disable_tqdm", "true", *self.extra]
        checkpoints = []
        if os.path.isdir(out):
            names = [d for d in os.listdir(out) if d.startswith("checkpoint-")]
            checkpoints = sorted(names, key=lambda d: int(d.split("-")[1]))
        if checkpoints:
            cmd += ["--resume_from_checkpoint", os.path.join(out, checkpoints[-1])]
        return cmd


# the SFT baseline (no training) is evaluated on 512 training prompts instead of 64: it is the reference of
# every method's window gold, so its sampling noise should be small; held out, on the same 64 prompts as the
# others
SFT_EXTRA = ("--train_eval_prompts", "512")

# The tuning protocol, fixed before any of its runs. Every method gets the same learning-rate grid search
# (three rates, seed 100, which no later suite uses); the choice is the rate with the highest mean gold on 256
# validation prompts (the last 256 of the training split, held out of training in every suite below; 2 samples
# each), evaluated at iterations 325, 350, 375 and 400 (`rgpo_lab/rlhf_select.py`). The test prompts are not
# used to choose.
PAPER = "recipes/configs/hh_rlhf_tiny_paper.yaml"
ONLINE = ["rgpo", "rgpo_old", "ppo", "grpo", "ppo_clip_kl", "sapo"]
TUNE_RATES = {**{m: ("5e-5", "1e-4", "2e-4") for m in ONLINE}, "dpo": ("1e-5", "3e-5", "1e-4")}
TUNE_SEED = 100
VALIDATION = ("--validation_prompts", "256", "--validation_samples", "2", "--validation_every", "25")
HELDOUT = ("--heldout_samples", "4")  # 64 test prompts x 4 samples
FRONTIER_BETAS = {
    "rgpo": ("0.01", "0.2"),
    "ppo": ("0.01", "0.2"),
    "sapo": ("0.01", "0.2"),
}
FRONTIER_BASE = "0.05"  # the methods' default beta_ref (recipes.hh_rlhf.methods): the final suite's runs
REUSE = {m: ("1", "4", "8") for m in ("rgpo", "rgpo_old", "grpo", "ppo_clip_kl")}
REUSE_BASE = "2"  # the preset's num_iterations: the final suite's runs


def selected_rates(results: str, world: str = "") -> dict[str, str]:
    """The learning rate chosen per method by the tuning suite (``<results>/[<world>/]tune/selection.json``);
    the suites that use it refuse to start without it."""
    path = os.path.join(results, world, "tune", "selection.json")
    if not os.path.exists(path):
        raise SystemExit(
            f"{path} is missing: run `python -m rgpo_lab.rlhf_suite {world}tune` and "
            f"`python -m rgpo_lab.rlhf_select {os.path.dirname(path)}` first"
        )
    with open(path) as f:
        chosen = {m: row["selected_lr"] for m, row in json.load(f)["methods"].items()}
    return {m: lr for m, lr in chosen.items() if lr is not None}  # a method with an unfinished rate waits


TEXT_FIELDS = frozenset({"method", "dataset", "split"})  # a run's JSON fields that are not numbers


def read_run_json(path: str) -> dict:
    """A run's summary.json, heldout.json or validation.json. The recipe writes a number it could not form (a
    mean over no values) as null, valid JSON, where files written before held NaN: null is read back as NaN
    (outside `TEXT_FIELDS`), so old and new files read the same."""

    def numbers(obj: dict) -> dict:
        return {k: float("nan") if v is None and k not in TEXT_FIELDS else v for k, v in obj.items()}

    with open(path) as f:
        return json.load(f, object_hook=numbers)


def read_validation(run_dir: str) -> dict | None:
    """A tuning run's validation result (gold, reward, kl_ref over the window), None if it has not finished; a
    run evaluated at other iterations than its config asks for is refused."""
    path = os.path.join(run_dir, "validation.json")
    if not os.path.exists(path):
        return None
    result = read_run_json(path)
    if result["iterations"] != result["expected_iterations"]:
        raise SystemExit(
            f"{path}: evaluated at {result['iterations']}, expected {result['expected_iterations']}"
        )
    return {k: result.get(k) for k in ("gold", "reward", "kl_ref")}


def tune_grid(
    tune_dir: str, method: str, rates: tuple[str, ...], edges: tuple[str, str] | None
) -> tuple[str, ...]:
    """A method's tuning rates (ascending): the grid, plus one rate beyond an edge once every grid rate has
    finished and the best of them (highest validation gold) is the lowest or the highest;
    ``edges`` = (below, above)."""
    if edges is None:
        return rates
    scores = [read_validation(os.path.join(tune_dir, f"{method}__lr{lr}__s{TUNE_SEED}")) for lr in rates]
    if any(s is None for s in scores):
        return rates
    best = max(range(len(rates)), key=lambda i: scores[i]["gold"])
    if best == 0:
        return (edges[0], *rates)
    return (*rates, edges[1]) if best == len(rates) - 1 else rates


def _tune(results: str, world: str = "", config: str = PAPER) -> list[RLHFRun]:
    edges = EDGE_RATES if world == "v3/" else {}
    tune_dir = os.path.join(results, world, "tune")
    return [
        RLHFRun(f"{world}tune", m, TUNE_SEED, config, ("--learning_rate", lr, *VALIDATION), tag=f"lr{lr}")
        for m, rates in (TUNE_RATES_V3 if world == "v3/" else TUNE_RATES).items()
        for lr in tune_grid(tune_dir, m, rates, edges.get(m))
    ]


def _final(results: str, world: str = "", config: str = PAPER) -> list[RLHFRun]:
    """Seed by seed (every method and the SFT baseline at seed 1, then seed 2, ...), so that an interrupted
    suite leaves whole seeds, each with its baseline."""
    lr, suite = selected_rates(results, world), f"{world}final"
    return [
        RLHFRun(suite, m, s, config, (*SFT_EXTRA, *VALIDATION, *HELDOUT))
        if m == "sft"
        else RLHFRun(suite, m, s, config, ("--learning_rate", lr[m], *VALIDATION, *HELDOUT))
        for s in range(1, 6)
        for m in [*ONLINE, "dpo", "sft"]
        if m in lr or m == "sft"
    ]


def _frontier(results: str) -> list[RLHFRun]:
    lr = selected_rates(results)
    runs = []
    for s in (1, 2, 3):
        for m, betas in FRONTIER_BETAS.items():
            if m in lr:
                for b in betas:
                    extra = ("--learning_rate", lr[m], "--beta", b, *VALIDATION, *HELDOUT)
                    runs.append(RLHFRun("frontier", m, s, PAPER, extra, tag=f"beta{b}"))
    return runs


def _reuse(results: str) -> list[RLHFRun]:
    lr = selected_rates(results)
    runs = []
    for s in (1, 2, 3):
        for m, ks in REUSE.items():
            if m in lr:
                for k in ks:
                    extra = ("--learning_rate", lr[m], "--num_iterations", k, *VALIDATION, *HELDOUT)
                    runs.append(RLHFRun("reuse", m, s, PAPER, extra, tag=f"reuse{k}"))
    return runs


# World v3 (disjoint test questions, well-formedness gold): the same protocol, fixed before its runs (the same
# rate grids, seed, validation rule and test evaluation), with validation prompts from tiny-hh/validation
# (questions no training prompt contains) instead of the last training prompts; results under
# results/rlhf/v3/.
PAPER_V3 = "recipes/configs/hh_rlhf_tiny_paper_v3.yaml"
# World v3's edge rule, fixed after 13 of its 21 tuning runs had finished and before the other 8: a method
# whose best grid rate is the grid's lowest (highest) gets one more run a grid step below (above) it, at the
# tuning seed, and is selected over the extended grid (`python -m rgpo_lab.rlhf_suite v3/tune` adds these runs
# once the grid has finished). One extension at most: a method still best at the new edge is selected there
# and reported as such.
EDGE_RATES = {**{m: ("2.5e-5", "4e-4") for m in (*ONLINE, "cispo")}, "dpo": ("3e-6", "3e-4")}
# cispo (the staleness study's off-policy peer) joins world v3's tuning after its selection was committed: the
# same grid, seed, rule and edge rule; it is in no final suite.
TUNE_RATES_V3 = {**{m: TUNE_RATES[m] for m in ONLINE}, "cispo": TUNE_RATES["rgpo"], "dpo": TUNE_RATES["dpo"]}

# The staleness study (world v3), fixed and committed before any of its runs. Every method at its v3/tune
# rate; 400 optimizer steps of 16 completions (6,400 samples, each trained on once) at every level, so levels
# compare the same training budget; the summary window is optimizer steps 304-400 (iterations 304/S-400/S);
# test gold and KL_ref from the end-of-run evaluation (64 test prompts x 4 samples); no validation runs.
# - stale_sync: TRL's steps_per_generation S (one generation batch of 16 S completions serves S optimizer
#   steps, so step s of a batch trains on samples s - 1 updates old), num_iterations 1.
# - stale_async: TRL's asynchronous trainer with the in-process worker at a controlled lag L (the samples of
#   the step that trains version v come from version v - L); L starts at 1 because TRL's loader reads one
#   micro-batch ahead (the freshest asynchronous setting; S = 1 of stale_sync is the synchronous, on-policy
#   one); max_staleness max(4, L).
STALE_STEPS, STALE_WINDOW_START, STALE_SAVE_STEPS = 400, 304, 80  # 80: a multiple of every S
STALE_SYNC = {
    "methods": ("rgpo", "rgpo_old", "grpo", "cispo", "sapo"),
    "levels": {1: (1, 2, 3), 4: (1, 2, 3), 16: (1, 2, 3, 4, 5)},
}
STALE_ASYNC = {
    "methods": ("rgpo", "rgpo_old", "grpo"),
    "levels": {1: (1, 2, 3), 2: (1, 2, 3), 8: (1, 2, 3, 4, 5)},
}
STALENESS_RULE = """Reading rules of the staleness study, fixed before its first run. Per suite, the stalest
level (S = 16; L = 8) against the freshest (S = 1; L = 1); the metric is held-out test gold (64 prompts x 4
samples).
A. At the stalest level, RGPO against each other method: two-sided Welch on the 5 seeds, Holm over the
   methods of the suite (4 in stale_sync, 2 in stale_async), both directions; "significant" only after Holm.
B. Each method's change from the freshest to the stalest level (Welch, 3 vs 5 seeds, Holm over the methods),
   and RGPO's change against each other method's (the difference of changes, percentile bootstrap over seeds
   within each cell, 10,000 resamples, two-sided, Holm over the methods).
C. Matched KL: at each other method's stalest point, RGPO's seed-mean gold interpolated along RGPO's
   (KL_ref, gold) curve over the suite's levels at that point's KL_ref (only inside RGPO's KL range), 95%
   percentile-bootstrap interval with seeds resampled within every point (the frontier rule), since a method
   that moves less can look robust for that reason alone.
Verdict per other method m: "RGPO is more robust to staleness than m" if A is significant in RGPO's favour
and C's interval lies above 0; "m is more robust" if A is significant against RGPO and C's interval lies
below 0; "no difference" if A is not significant and C's interval contains 0; "undecided" otherwise
(including m's point outside RGPO's KL range). B is reported beside the verdict, not part of it. Whether
RGPO's gate against pi_old acted is read from rgpo/rejected_frac, rgpo/kl_coef (above its floor) and the
behaviour-ratio statistics at the stalest level."""


def _stale_common(results: str, method: str) -> tuple[str, ...]:
    """The method's v3-selected rate, the test evaluation, no validation."""
    lr = selected_rates(results, "v3/")
    if method not in lr:
        raise SystemExit(f"{method} has no selected v3 rate yet (results/rlhf/v3/tune/selection.json)")
    return ("--learning_rate", lr[method], *HELDOUT, "--validation_prompts", "0")


def _stale_sync(results: str) -> list[RLHFRun]:
    runs = []
    for s, seeds in STALE_SYNC["levels"].items():
        iterations = STALE_STEPS // s  # one iteration: a generation batch, S optimizer steps
        window = ("--window_start", str(STALE_WINDOW_START // s), "--window_end", str(iterations))
        level = (
            "--num_iterations",
            "1",
            "--steps_per_generation",
            str(s),
            "--num_rl_iterations",
            str(iterations),
            # checkpoints at generation-batch boundaries of every S: TRL regenerates after a resume, so a
            # checkpoint inside a batch would give a resumed run other samples than an uninterrupted one
            "--save_steps",
            str(STALE_SAVE_STEPS),
        )
        for seed in seeds:
            for m in STALE_SYNC["methods"]:
                extra = (*_stale_common(results, m), *level, *window)
                runs.append(RLHFRun("v3/stale_sync", m, seed, PAPER_V3, extra, tag=f"S{s}"))
    return runs


def _stale_async(results: str) -> list[RLHFRun]:
    runs = []
    for lag, seeds in STALE_ASYNC["levels"].items():
        window = ("--window_start", str(STALE_WINDOW_START), "--window_end", str(STALE_STEPS))
        level = ("--trainer", "async", "--rollout_lag", str(lag), "--max_staleness", str(max(4, lag)))
        for seed in seeds:
            for m in STALE_ASYNC["methods"]:
                extra = (*_stale_common(results, m), *level, "--num_rl_iterations", str(STALE_STEPS), *window)
                runs.append(RLHFRun("v3/stale_async", m, seed, PAPER_V3, extra, tag=f"L{lag}"))
    return runs


def _mismatch_level(lag: int) -> tuple[str, ...]:
    """The mismatch study's common flags (rgpo_lab.rlhf_mismatch.RULE): async trainer at ``lag``, one rate,
    constant, 400 steps, the test evaluation."""
    return (
        *("--trainer", "async", "--rollout_lag", str(lag), "--max_staleness", str(max(4, lag))),
        *("--learning_rate", mm.LR, "--lr_scheduler_type", "constant", *HELDOUT, "--validation_prompts", "0"),
        *("--num_rl_iterations", str(mm.STEPS), "--window_start", str(mm.WINDOW_START)),
        *("--window_end", str(mm.STEPS)),
    )


def _mismatch_precheck(results: str) -> list[RLHFRun]:
    """The positive control: ignore at fp32 and at the ladder's rungs so far, seeds 1-3."""
    tags = mm.precheck_tags(mm.read_json("precheck.json"))
    flags = {"fp32": ()} | {f"sigma{s:g}": ("--sampler_logit_noise", f"{s:g}") for s in mm.PRECHECK_LADDER}
    return [
        RLHFRun("v3/mismatch_precheck", "ignore", seed, PAPER_V3, (*_mismatch_level(1), *flags[t]), tag=t)
        for seed in mm.PRECHECK_SEEDS
        for t in tags
    ]


def _mismatch_cells() -> dict[str, tuple[str, ...]]:
    calibration, precheck = mm.read_json("calibration.json"), mm.read_json("precheck.json")
    if calibration is None:
        raise SystemExit(
            "v3/mismatch needs the calibration first: python -m rgpo_lab.rlhf_mismatch calibrate"
        )
    if precheck is None or not precheck.get("complete"):
        raise SystemExit(
            "v3/mismatch needs the finished pre-check first: python -m rgpo_lab.rlhf_suite "
            "v3/mismatch_precheck, then python -m rgpo_lab.rlhf_mismatch precheck"
        )
    cells = mm.cell_flags(calibration)
    if precheck["hurt_at"] is not None and precheck["hurt_at"] > 1.0:  # the rung that hurt joins the cells
        cells[f"sigma{precheck['hurt_at']:g}"] = ("--sampler_logit_noise", f"{precheck['hurt_at']:g}")
    return cells


def _mismatch(results: str) -> list[RLHFRun]:
    cells = _mismatch_cells()
    return [
        RLHFRun("v3/mismatch", method, seed, PAPER_V3, (*_mismatch_level(1), *flags), tag=f"{arm}__{cell}")
        for seed in mm.SEEDS
        for cell, flags in cells.items()
        for arm, method in mm.ARMS.items()
    ]


def _mismatch_lag(results: str) -> list[RLHFRun]:
    _mismatch_cells()  # the same preconditions; the fp32 control is v3/mismatch's
    return [
        RLHFRun("v3/mismatch_lag", method, seed, PAPER_V3, _mismatch_level(lag), tag=f"{arm}__lag{lag}")
        for seed in mm.SEEDS
        for lag in (8, 32)
        for arm, method in mm.ARMS.items()
    ]


def _sync_mismatch_run(suite: str, arm: str, cell: str, seed: int, lr: str, extra=()) -> RLHFRun:
    """One run of the synchronous mismatch study (rgpo_lab.rlhf_sync_mismatch.RULE): the arm's method and
    flags, the cell's sampler and reuse, a constant rate, the test evaluation."""
    method, flags = smm.ARMS[arm]
    dose, k = cell.split("__k")
    cell_flags = (*smm.dose_flags(dose), *smm.reuse_flags(int(k)))
    common = ("--learning_rate", lr, "--lr_scheduler_type", "constant", *HELDOUT)
    return RLHFRun(
        suite, method, seed, PAPER_V3, (*flags, *cell_flags, *common, *extra), tag=f"{arm}__{cell}"
    )


def _sync_mismatch_precheck(results: str) -> list[RLHFRun]:
    """Stage A: the uncorrected arm in every cell and the SFT policy's evaluation; stage B (once
    ``python -m rgpo_lab.rlhf_sync_mismatch precheck`` has read stage A): rgpo and tis in each hurt cell."""
    suite, no_validation = "v3/sync_mismatch_precheck", ("--validation_prompts", "0")
    decided = smm.read_json("precheck.json") or {"a": {}}
    hurt = [c for c, a in decided["a"].items() if a["hurt"]]
    runs = []
    for seed in smm.PRECHECK_SEEDS:
        runs.append(RLHFRun(suite, "sft", seed, PAPER_V3, (*HELDOUT, *no_validation)))
        for k in smm.REUSE:
            for dose in smm.doses():
                cell = smm.cell_name(dose, k)
                arms = smm.PRECHECK_ARMS if cell in hurt else ("uncorrected",)
                runs += [
                    _sync_mismatch_run(suite, a, cell, seed, smm.PRECHECK_LR, no_validation) for a in arms
                ]
    return runs


def _sync_mismatch_tune(results: str) -> list[RLHFRun]:
    """Each arm's rate alone, on validation prompts, in the rule's two tuning cells."""
    decided = smm.read_json("precheck.json")
    if decided is None or not decided["complete"]:
        raise SystemExit(
            "v3/sync_mismatch_tune needs the finished pre-check: python -m rgpo_lab.rlhf_suite "
            "v3/sync_mismatch_precheck, then python -m rgpo_lab.rlhf_sync_mismatch precheck "
            "(twice: stage A, then B)"
        )
    runs = []
    for cell in smm.tuning_cells(decided):
        k = int(cell.split("__k")[1])
        validation = (
            "--validation_prompts",
            "256",
            "--validation_samples",
            "2",
            "--validation_every",
            str(25 // k),
        )
        for seed in smm.TUNE_SEEDS:
            for arm in smm.suite_arms(decided["ranking_cells"]):
                for lr in smm.TUNE_RATES:
                    run = _sync_mismatch_run("v3/sync_mismatch_tune", arm, cell, seed, lr, validation)
                    runs.append(
                        RLHFRun(run.suite, run.method, seed, run.config, run.extra, f"{run.tag}__lr{lr}")
                    )
    return runs


def _sync_mismatch(results: str) -> list[RLHFRun]:
    """The suite: every kept arm at its selected rate in the rule's cells, 10 seeds in ranking cells, 5
    elsewhere (seeds in the outer loop, so an interrupted suite leaves whole seeds)."""
    decided, selection = smm.read_json("precheck.json"), smm.read_json("selection.json")
    if decided is None or not decided["complete"] or selection is None:
        raise SystemExit(
            "v3/sync_mismatch needs the pre-check and the selection first: python -m "
            "rgpo_lab.rlhf_sync_mismatch precheck, python -m rgpo_lab.rlhf_suite v3/sync_mismatch_tune, "
            "python -m rgpo_lab.rlhf_sync_mismatch select"
        )
    lr, arms = selection["selected_lr"], smm.suite_arms(decided["ranking_cells"])
    if any(lr.get(arm) is None for arm in arms):
        raise SystemExit(f"v3/sync_mismatch: not every arm has a selected rate yet ({lr})")
    cells = smm.suite_cells(decided["ranking_cells"])
    return [
        _sync_mismatch_run("v3/sync_mismatch", arm, cell, seed, lr[arm], ("--validation_prompts", "0"))
        for seed in smm.SUITE_SEEDS["ranking"]
        for cell, seeds in cells.items()
        if seed in seeds
        for arm in arms
    ]


# suites built when asked for: the final, frontier and reuse suites read the tuning suite's selection
SUITE_BUILDERS = {
    "tune": _tune,
    "final": _final,
    "frontier": _frontier,
    "reuse": _reuse,
    "v3/tune": lambda results: _tune(results, "v3/", PAPER_V3),
    "v3/final": lambda results: _final(results, "v3/", PAPER_V3),
    "v3/stale_sync": _stale_sync,
    "v3/stale_async": _stale_async,
    "v3/mismatch_precheck": _mismatch_precheck,
    "v3/mismatch": _mismatch,
    "v3/mismatch_lag": _mismatch_lag,
    "v3/sync_mismatch_precheck": _sync_mismatch_precheck,
    "v3/sync_mismatch_tune": _sync_mismatch_tune,
    "v3/sync_mismatch": _sync_mismatch,
}

DEMO_RATES, DEMO_SEED = ("1e-4", "3e-4", "1e-3"), 1
TINY = "recipes/configs/hh_rlhf_tiny.yaml"
DEMO_EXTRA = ("--validation_dataset_name", "tiny-hh/validation", "--validation_prompts", "64")
DEMO_EXTRA += ("--validation_samples", "2", "--validation_every", "15", "--heldout_compare_initial", "false")
SMOKE_EXTRA = ("--num_rl_iterations", "2", "--max_completion_length", "8", "--heldout_prompts", "4")
SMOKE_EXTRA += ("--save_strategy", "no")

SUITES: dict[str, list[RLHFRun]] = {
    "tiny-paper": [
        RLHFRun(
            "tiny-paper", m, s, "recipes/configs/hh_rlhf_tiny_paper.yaml", SFT_EXTRA if m == "sft" else ()
        )
        for s in (1, 2, 3)
        for m in METHODS
    ],
    # the demo preset's learning rate (recipes/configs/hh_rlhf_tiny.yaml): rgpo, seed 1, three rates, chosen
    # by the mean gold on 64 validation prompts of world v3 (2 samples each) at the end of the 60 iterations
    "demo-lr": [
        RLHFRun("demo-lr", "rgpo", DEMO_SEED, TINY, ("--learning_rate", lr, *DEMO_EXTRA), tag=f"lr{lr}")
        for lr in DEMO_RATES
    ],
    # a minute: to try the runner (and for its test)
    "smoke": [RLHFRun("smoke", m, 1, TINY, SMOKE_EXTRA) for m in ("rgpo", "dpo", "sft")],
}


def inside(path: str, root: str) -> bool:
    """Whether ``path`` lies in the directory ``root`` (a real containment check: ``/x/proj-cache`` is not in
    ``/x/proj``)."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def run_info(command: list[str]) -> dict:
    """The command, git commit, machine and package versions of a run, written next to its results."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=10)
        return proc.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD") or None
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    versions = {}
    for pkg in ("torch", "transformers", "trl", "accelerate", "datasets", "peft", "deepspeed"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    return {
        "command": [os.path.relpath(c, ROOT) if os.path.isabs(c) and inside(c, ROOT) else c for c in command],
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": versions,
    }


def read_run_info(path: str) -> list[dict]:
    """The launches recorded so far in ``path`` (none if it does not exist); an unreadable file is refused."""
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            info = json.load(f)
    except ValueError as err:
        raise SystemExit(f"{path} is not valid JSON ({err}); fix or delete it to go on") from err
    if not isinstance(info, list):
        raise SystemExit(f"{path} should hold a list of launches, found {type(info).__name__}")
    return info


def finished(out: str) -> bool:
    return all(os.path.exists(os.path.join(out, f)) for f in ("summary.json", "heldout.json"))


def run_suite(
    runs: list[RLHFRun],
    results: str,
    jobs: int,
    extra: tuple[str, ...] = (),
    poll: float = 2.0,
    keep_checkpoints: bool = False,
) -> list:
    """Run the unfinished ``runs`` ``jobs`` at a time (rgpo_lab.job_queue); returns the failed ones with their
    exit status. A finished run's Trainer checkpoints are deleted unless ``keep_checkpoints`` (its results are
    what stays)."""
    out = {r: os.path.join(results, r.suite, r.name) for r in runs}
    todo = [r for r in runs if not finished(out[r])]
    print(
        f"{len(runs)} runs, {len(runs) - len(todo)} finished, {len(todo)} to run, {jobs} at a time",
        flush=True,
    )
    start_time = time.time()

    def start(r: RLHFRun) -> tuple[list[str], str]:
        os.makedirs(out[r], exist_ok=True)
        cmd = [*r.command(out[r]), *extra]  # resumes from the run's latest checkpoint, if any
        info_path = os.path.join(out[r], "run_info.json")
        previous = read_run_info(info_path)
        with open(info_path, "w") as f:  # one entry per launch: a resumed run lists every part
            json.dump([*previous, run_info(cmd)], f, indent=2)
        return cmd, os.path.join(out[r], "run.log")

    def succeeded(r: RLHFRun, code: int) -> bool:
        ok = code == 0 and finished(out[r])
        if ok and not keep_checkpoints:
            for d in os.listdir(out[r]):
                if d.startswith("checkpoint-"):
                    shutil.rmtree(os.path.join(out[r], d))
        done = sum(finished(o) for o in out.values())
        print(
            f"[{time.time() - start_time:7.0f}s] {'done' if ok else 'FAILED'} {r.suite}/{r.name}; "
            f"{done}/{len(runs)} finished",
            flush=True,
        )
        return ok

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return run_queue(todo, jobs, start, env=env, cwd=ROOT, poll=poll, succeeded=succeeded)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.rlhf_suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("suite", nargs="?", choices=[*SUITES, *SUITE_BUILDERS])
    p.add_argument("--results", default=os.path.join(ROOT, "results", "rlhf"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--list", action="store_true")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep finished runs' Trainer checkpoints")
    a, extra = p.parse_known_args(argv)
    if a.list or a.suite is None:
        for name in [*SUITES, *SUITE_BUILDERS] if a.suite is None else [a.suite]:
            try:
                runs = SUITES[name] if name in SUITES else SUITE_BUILDERS[name](a.results)
            except SystemExit as err:
                print(f"{name:11s} (not built yet: {err})")
                continue
            for r in runs:
                state = "finished" if finished(os.path.join(a.results, name, r.name)) else "-"
                print(f"{name:11s} {r.name:24s} {state}")
        return 0
    runs = SUITES[a.suite] if a.suite in SUITES else SUITE_BUILDERS[a.suite](a.results)
    failed = run_suite(runs, a.results, a.jobs, tuple(extra), keep_checkpoints=a.keep_checkpoints)
    for r, code in failed:
        print(f"failed: {r.suite}/{r.name} (exit {code}), see its run.log")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
