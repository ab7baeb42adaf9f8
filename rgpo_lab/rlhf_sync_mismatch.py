"""Sampler mismatch on the synchronous path (issue 55, world v3): the arms, cells, seeds and rule of the
study, fixed before any of its runs, and its pre-check's decision. The trainers generate with the in-process
sampler (`rgpo_trl.trainer.sync_sampler`), so TRL's own vLLM code computes every correction.

    python -m rgpo_lab.rlhf_suite v3/sync_mismatch_precheck   # stage A, then again for stage B
    python -m rgpo_lab.rlhf_sync_mismatch precheck            # -> results/rlhf/v3/sync_mismatch/precheck.*
    python -m rgpo_lab.rlhf_suite v3/sync_mismatch_tune       # once the pre-check is complete
    python -m rgpo_lab.rlhf_sync_mismatch select              # -> results/rlhf/v3/sync_mismatch/selection.*
    python -m rgpo_lab.rlhf_suite v3/sync_mismatch            # the suite, at the selected rates
    python -m rgpo_lab.rlhf_sync_mismatch rule                # the rule (RULES.md quotes it)

Run from the repository root. The run lists are built in rgpo_lab.rlhf_suite from this module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from rgpo_lab import rlhf_mismatch as mm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results", "rlhf")
OUT = os.path.join(RESULTS, "v3", "sync_mismatch")
STEPS, WINDOW_START, SAVE_STEPS = 400, 304, 80  # optimizer steps of 16 completions; 80: a multiple of each k
REUSE = (1, 4)  # num_iterations: optimizer steps per generation batch
CALIBRATED_SIGMA = 0.15  # results/rlhf/v3/mismatch/calibration.json (a test checks they agree)
LADDER = (CALIBRATED_SIGMA, 0.5, 1.0, 4.0)  # logit-noise doses of the pre-check, the faithful sampler below
PRECHECK_LR = "2.5e-5"  # v3/tune's selected rate of grpo and rgpo_old, the methods the arms are built on
PRECHECK_SEEDS = (101, 102, 103)
TUNE_SEEDS = (201, 202, 203)
TUNE_RATES = ("1.25e-5", "2.5e-5", "5e-5")
SUITE_SEEDS = {"ranking": tuple(range(1, 11)), "other": (1, 2, 3, 4, 5)}
PRECHECK_ARMS = ("uncorrected", "rgpo", "tis")  # the control, RGPO's default, the best-guess correction

SAMPLER = ("--use_in_process_sampler", "true")
_TRL_IS = ("--vllm_importance_sampling_clip_max", "3.0")  # TRL 1.16's default C_max, written out
_GRPO = ("--loss_type", "dapo", *_TRL_IS)
_RGPO = ("--beta", "0.0", *_TRL_IS)
# arm -> (recipe method, flags). No arm has a reference penalty; every loss is aggregated per token (dapo).
ARMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "uncorrected": ("grpo", ("--loss_type", "dapo", "--vllm_importance_sampling_correction", "false")),
    "sequence_mask": ("grpo", (*_GRPO, "--vllm_importance_sampling_mode", "sequence_mask")),
    "tis": ("grpo", (*_GRPO, "--vllm_importance_sampling_mode", "token_truncate")),
    "rgpo": ("rgpo_old", (*_RGPO, "--vllm_importance_sampling_mode", "sequence_mask")),
    "rgpo_coupled": ("rgpo_old", (*_RGPO, "--gate_on_sampler", "true")),
    "rgpo_gate": (
        "rgpo_old",
        (
            *_RGPO,
            "--vllm_importance_sampling_mode",
            "sequence_mask",
            "--kl_controller",
            "fixed",
            "--kl_coef",
            "0.0",
        ),
    ),
    "token_mask": ("grpo", (*_GRPO, "--vllm_importance_sampling_mode", "token_mask")),
    "cispo": ("cispo", ("--beta", "0.0", *_TRL_IS, "--vllm_importance_sampling_mode", "sequence_mask")),
}
KEPT_ARMS = ("uncorrected", "sequence_mask", "tis", "rgpo", "rgpo_coupled", "rgpo_gate")  # never cut
CUT_ORDER = ("cispo", "token_mask")  # cut first, to fit the budget
BUDGET_HOURS = 18.0
# core-hours of one run per k, measured (RULES.md "Cost"), with a 1.3 margin
RUN_HOURS = {1: 0.104, 4: 0.061}
REFERENCE_ARM = "rgpo"


def dose_flags(dose: str) -> tuple[str, ...]:
    """The sampler's flags of a dose: ``fp32`` (faithful: the same code path, factor exactly 1) or
    ``sigma<s>`` (logit noise)."""
    return SAMPLER if dose == "fp32" else (*SAMPLER, "--sampler_logit_noise", dose.removeprefix("sigma"))


def reuse_flags(k: int) -> tuple[str, ...]:
    """``num_iterations`` k with the budget fixed in optimizer steps (400 of 16 completions), the window at
    steps 304-400, checkpoints at generation-batch boundaries."""
    n = STEPS // k
    return (
        *("--num_iterations", str(k), "--steps_per_generation", "1", "--num_rl_iterations", str(n)),
        *("--window_start", str(WINDOW_START // k), "--window_end", str(n), "--save_steps", str(SAVE_STEPS)),
    )


def cell_name(dose: str, k: int) -> str:
    return f"{dose}__k{k}"


def dose_of(cell: str) -> float:
    dose = cell.split("__")[0]
    return 0.0 if dose == "fp32" else float(dose.removeprefix("sigma"))


def doses() -> list[str]:
    return ["fp32", *(f"sigma{s:g}" for s in LADDER)]


def suite_cells(ranking: list[str]) -> dict[str, tuple[int, ...]]:
    """The suite's cells and their seeds: fp32 and the calibrated dose at each k (5 seeds), every ranking
    cell (10 seeds)."""
    cells = {
        cell_name(d, k): SUITE_SEEDS["other"] for k in REUSE for d in ("fp32", f"sigma{CALIBRATED_SIGMA:g}")
    }
    return cells | {c: SUITE_SEEDS["ranking"] for c in ranking}


def suite_hours(arms, ranking: list[str]) -> float:
    return len(arms) * sum(
        RUN_HOURS[int(c.split("__k")[1])] * len(s) for c, s in suite_cells(ranking).items()
    )


def suite_arms(ranking: list[str]) -> tuple[str, ...]:
    """The arms that fit BUDGET_HOURS, cutting in CUT_ORDER; the kept arms are never cut."""
    arms = list(ARMS)
    for arm in CUT_ORDER:
        if suite_hours(arms, ranking) <= BUDGET_HOURS:
            break
        arms.remove(arm)
    return tuple(arms)


RULE = """Reading rules of the synchronous sampler-mismatch study (world v3, issue 55), fixed before any of
its runs. Trainers: RGPOTrainer and TRL's GRPOTrainer (recipe methods rgpo_old, grpo, cispo) generating with
the in-process sampler in every cell (fp32: the faithful sampler, TRL's factor exactly 1; sigma s: Gaussian
logit noise s in the sampler only), 400 optimizer steps of 16 completions at num_iterations k (k = 1: 400
generation batches; k = 4: 100 batches, each trained on 4 times), constant learning rate, no reference
penalty, token-level aggregation (loss_type dapo). Metric: test gold (64 test prompts x 4 samples) at the end
of the run, KL_ref (test) beside it.
Arms (each from its source; TRL 1.16 defaults written out): uncorrected = GRPO (clip 0.2) with
vllm_importance_sampling_correction false; sequence_mask (TRL's default), tis (token_truncate) and token_mask
(IcePop-like) = GRPO with TRL's factor pi_old / pi_sampler in that mode, C_max 3, no C_min; cispo = TRL's
loss_type cispo (epsilon_high 5, ScaleRL / TRL docs) with TRL's default factor (sequence_mask, C_max 3);
rgpo = RGPOTrainer's default, decoupled (sigmoid gate k 5 and adaptive KL on pi / pi_old, TRL's
sequence_mask factor on the policy term); rgpo_coupled = gate_on_sampler true (gate and KL on
pi / pi_sampler, no factor); rgpo_gate = rgpo with the KL coefficient fixed at 0 (the gate alone).
Pre-check (seeds 101-103, every arm at 2.5e-5, never reused): stage A runs the uncorrected arm at fp32 and at
sigma 0.15 (calibrated), 0.5, 1, 4, for k = 1 and 4, and the SFT policy's test evaluation (method sft).
(a) a cell's uncorrected arm is hurt if its test gold is lower than at fp32 with the same k (two-sided
Welch, Holm over the 8 cells, adjusted p <= 0.05; a significant rise is reported, not hurt). Stage B runs
rgpo and tis in each hurt cell. (b) the best of the three arms (highest mean gold) is above the SFT policy
(two-sided Welch, Holm over the hurt cells). A cell qualifies iff (a) and (b) hold; per k the qualifying
cell with the smallest dose (the most realistic) is that k's ranking cell. If no cell qualifies, the report
says the study cannot rank corrections, and the docs do not rank.
Tuning (seeds 201-203, 256 validation prompts x 2 samples, evaluated 4 times in the window): each arm's
learning rate alone, from 1.25e-5, 2.5e-5, 5e-5, in two cells at one k: fp32 and the ranking cell with the
largest dose (its k; without a ranking cell: fp32 and sigma 0.15 at k = 4); selected: the highest mean
validation gold over both cells and the 3 seeds; the test prompts never choose.
Suite (each arm at its selected rate): for k = 1 and 4, the cells fp32 and sigma 0.15 and every ranking cell;
seeds 1-10 in ranking cells and 1-5 elsewhere. Arms cut to fit the budget in the order cispo, token_mask; the
others are never cut.
Primary comparison (fixed now): each arm against rgpo on test gold pooled over the ranking cells (per seed:
the mean over the ranking cells), two-sided Welch, Holm over the arms, both directions, with the difference,
its 95% CI and the smallest detectable difference (power 0.8). Per ranking cell the same tests as a
secondary family. Matched KL as in the asynchronous study: a higher gold is a win only if that arm's test
KL_ref is not significantly higher (Welch, Holm within the family). Per arm a dose-response curve (test
gold and KL_ref against dose, per k, seed bands). Whether the gate acted: rgpo's rejected share
(rgpo/rejected_frac) at the first optimizer step of each generation batch and over the window; TRL's
sampling/* ratios (logged by the corrected arms only).
Words: "higher / lower" only after Holm; otherwise "no significant difference (n, p, smallest detectable)"."""


def read_json(name: str, out: str | None = None) -> dict | None:
    """``<out>/<name>`` (`OUT` by default) as JSON, None while it does not exist (`rlhf_mismatch`'s)."""
    return mm.read_json(name, out or OUT)


# ---------------------------------------------------------------------------------------------- pre-check
def heldout(results: str, suite: str, name: str) -> dict | None:
    """A finished run's test gold and KL_ref (None while it has not finished)."""
    path = os.path.join(results, suite, name, "heldout.json")
    if not os.path.exists(os.path.join(results, suite, name, "summary.json")) or not os.path.exists(path):
        return None
    with open(path) as f:
        h = json.load(f)
    if h.get("gold") is None:  # a finished run without its measurement: the rule has no way to read it
        raise SystemExit(f"{path}: the test gold is null: rerun this run before the rule reads the cell")
    return {k: float("nan") if h.get(k) is None else float(h[k]) for k in ("gold", "kl_ref")}


def precheck_decision(gold: dict[str, dict[str, list[float]]], sft: list[float]) -> dict:
    """The pre-check's rule on finished runs. ``gold``: cell -> arm -> test gold per seed (every cell of
    stage A; stage B's arms where run); ``sft``: the SFT policy's test gold per seed."""
    from rgpo_lab.statistics import holm, simulated_detectable_difference, welch

    hurt_cells = [c for c in gold if not c.startswith("fp32")]
    a, sdd = {}, {}
    for c in hurt_cells:
        control = gold[cell_name("fp32", int(c.split("__k")[1]))]["uncorrected"]
        a[c] = welch(gold[c]["uncorrected"], control)
        # at the first Holm step's level: no drop smaller than this was likely to be called hurt
        sdd[c] = simulated_detectable_difference(gold[c]["uncorrected"], control, 0.05 / len(hurt_cells))
    for c, p in zip(a, holm([w.p for w in a.values()]), strict=True):
        hurt = bool(p <= 0.05 and a[c].diff < 0)
        a[c] = {"diff": a[c].diff, "p": a[c].p, "p_holm": p, "hurt": hurt, "smallest_detectable": sdd[c]}
    hurt = [c for c in a if a[c]["hurt"]]
    b = {}
    for c in hurt:
        arms = {arm: x for arm, x in gold[c].items() if len(x) == len(PRECHECK_SEEDS)}
        if set(arms) == set(PRECHECK_ARMS):
            best = max(arms, key=lambda arm: np.mean(arms[arm]))
            b[c] = {"best": best, "welch": welch(arms[best], sft)}
    for c, p in zip(b, holm([v["welch"].p for v in b.values()]), strict=True):
        w = b[c].pop("welch")
        b[c].update(diff=w.diff, p=w.p, p_holm=p, learns=bool(p <= 0.05 and w.diff > 0))
    qualifying = [c for c in hurt if b.get(c, {}).get("learns")]
    return {
        "a": a,
        "b": b,
        "qualifying_cells": qualifying,
        "ranking_cells": [
            min(q, key=dose_of) for k in REUSE if (q := [c for c in qualifying if c.endswith(f"__k{k}")])
        ],
        "complete": len(b) == len(hurt),
    }


def precheck(results: str | None = None, out: str | None = None) -> dict:
    """Reads the pre-check's runs and applies the rule; writes precheck.json / precheck.md once stage A has
    finished (``results``, ``out``: `RESULTS`, `OUT` as they are at the call)."""
    results, out = results or RESULTS, out or OUT
    suite = "v3/sync_mismatch_precheck"
    gold: dict[str, dict[str, list[float]]] = {}
    for k in REUSE:
        for dose in doses():
            cell = cell_name(dose, k)
            for arm in PRECHECK_ARMS:
                rows = [
                    heldout(results, suite, f"{ARMS[arm][0]}__{arm}__{cell}__s{s}") for s in PRECHECK_SEEDS
                ]
                if all(r is not None for r in rows):
                    gold.setdefault(cell, {})[arm] = [r["gold"] for r in rows]
    sft = [heldout(results, suite, f"sft__s{s}") for s in PRECHECK_SEEDS]
    stage_a = all(len(gold.get(cell_name(d, k), {}).get("uncorrected", [])) for d in doses() for k in REUSE)
    if not stage_a or any(r is None for r in sft):
        raise SystemExit("stage A has not finished: python -m rgpo_lab.rlhf_suite v3/sync_mismatch_precheck")
    result = {
        "command": "python -m rgpo_lab.rlhf_sync_mismatch precheck",
        "gold": gold,
        "sft": [r["gold"] for r in sft],
        **precheck_decision(gold, [r["gold"] for r in sft]),
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "precheck.json"), "w") as f:
        json.dump(result, f, indent=1, allow_nan=False, default=float)
    with open(os.path.join(out, "precheck.md"), "w") as f:
        f.write(precheck_md(result))
    return result


def precheck_md(r: dict) -> str:
    lines = [
        "# Pre-check of the synchronous sampler-mismatch study",
        "",
        f"Command: `{r['command']}`; rule: RULES.md. SFT policy's test gold {np.mean(r['sft']):.3f} "
        f"(n = {len(r['sft'])}).",
        "",
    ]
    return "\n".join([*lines, *precheck_table(r)]) + "\n"


def precheck_table(r: dict) -> list[str]:
    """precheck.md's table of (a) and (b) per cell and its verdict (the study's report quotes it)."""
    lines = [
        "Smallest detectable: the difference a two-sided Welch test at the first Holm step's level",
        "(0.05 / 8) detects with power 0.8 at the cell's own spread, the test simulated",
        "(`rgpo_lab.statistics.simulated_detectable_difference`).",
        "",
        "| cell | uncorrected - fp32 | smallest detectable | p (Holm) | hurt (a) | best arm | best - SFT "
        "| p (Holm) | learns (b) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c, a in r["a"].items():
        b = r["b"].get(c)
        tail = (
            f"{b['best']} | {b['diff']:+.3f} | {b['p_holm']:.3f} | {'yes' if b['learns'] else 'no'}"
            if b
            else "- | | |"
        )
        lines.append(
            f"| {c} | {a['diff']:+.3f} | {a['smallest_detectable']:.3f} | {a['p_holm']:.3f} | "
            f"{'yes' if a['hurt'] else 'no'} | {tail} |"
        )
    verdict = (
        "In progress: stage B has not finished in every hurt cell."
        if not r["complete"]
        else f"Ranking cells: {', '.join(r['ranking_cells'])}."
        if r["ranking_cells"]
        else "No cell meets (a) and (b): the study cannot rank corrections."
    )
    return [*lines, "", verdict]


def tuning_cells(precheck_result: dict) -> list[str]:
    """fp32 and the ranking cell with the largest dose (ties: the larger k), at that cell's k; without a
    ranking cell fp32 and sigma 0.15 at k = 4."""
    ranking = precheck_result["ranking_cells"]
    if not ranking:
        return [cell_name("fp32", 4), cell_name(f"sigma{CALIBRATED_SIGMA:g}", 4)]
    best = max(ranking, key=lambda c: (dose_of(c), int(c.split("__k")[1])))
    return [cell_name("fp32", int(best.split("__k")[1])), best]


def validation_gold(run_dir: str) -> float | None:
    """A tuning run's mean validation gold over its window evaluations (validation.json), None until it has
    finished; a run evaluated at other iterations than its config asks for is refused."""
    path = os.path.join(run_dir, "validation.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        v = json.load(f)
    if v["iterations"] != v["expected_iterations"]:
        raise SystemExit(f"{path}: evaluated at {v['iterations']}, expected {v['expected_iterations']}")
    if v["gold"] is None:  # a finished run without its measurement: the selection has no way to read it
        raise SystemExit(f"{path}: the validation gold is null: rerun this run before the selection")
    return float(v["gold"])


def select(results: str | None = None, out: str | None = None) -> dict:
    """Each arm's rate: the highest mean validation gold over the tuning cells and seeds (an arm waits until
    all its runs have finished; ``results``, ``out``: `RESULTS`, `OUT` as they are at the call)."""
    results, out = results or RESULTS, out or OUT
    decided = read_json("precheck.json", out)
    cells = tuning_cells(decided)
    table: dict[str, dict[str, float | None]] = {}
    for arm in suite_arms(decided["ranking_cells"]):
        for lr in TUNE_RATES:
            names = [f"{ARMS[arm][0]}__{arm}__{c}__lr{lr}__s{s}" for c in cells for s in TUNE_SEEDS]
            gold = [validation_gold(os.path.join(results, "v3", "sync_mismatch_tune", n)) for n in names]
            table.setdefault(arm, {})[lr] = None if None in gold else float(np.mean(gold))
    chosen = {
        arm: max(rates, key=rates.get) if None not in rates.values() else None for arm, rates in table.items()
    }
    result = {"command": "python -m rgpo_lab.rlhf_sync_mismatch select", "cells": cells, "gold": table}
    result["selected_lr"] = chosen
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "selection.json"), "w") as f:
        json.dump(result, f, indent=1, allow_nan=False)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.rlhf_sync_mismatch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=["precheck", "select", "rule"])
    a = p.parse_args(argv)
    if a.command == "precheck":
        r = precheck()
        print(json.dumps({k: r[k] for k in ("ranking_cells", "complete")}))
    elif a.command == "select":
        print(json.dumps(select()["selected_lr"]))
    else:
        print(RULE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
