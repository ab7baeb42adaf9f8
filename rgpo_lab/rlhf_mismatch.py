"""Sampler/trainer mismatch and real staleness on world v3 (issue 47): the study's design, its rule (fixed
before any run), the noise calibration and the positive-control pre-check.

    python -m rgpo_lab.rlhf_mismatch calibrate        # -> results/rlhf/v3/mismatch/calibration.{json,md}
    python -m rgpo_lab.rlhf_suite v3/mismatch_precheck   # the pre-check's runs (a rung at a time)
    python -m rgpo_lab.rlhf_mismatch precheck         # -> results/rlhf/v3/mismatch/precheck.{json,md}
    python -m rgpo_lab.rlhf_suite v3/mismatch          # the suites, once the pre-check has passed
    python -m rgpo_lab.rlhf_suite v3/mismatch_lag

Run from the repository root. The suites' run lists are built in rgpo_lab.rlhf_suite from this module's
constants and from the committed calibration and pre-check files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "results", "rlhf", "v3", "mismatch")
LR = "5e-5"  # v3's rate selected by RGPO and CISPO (results/rlhf/v3/tune/selection.json)
STEPS, WINDOW_START = 400, 304
SEEDS = (1, 2, 3, 4, 5)
PRECHECK_SEEDS = (1, 2, 3)
# the arms: label -> async method of the recipe (recipes.hh_rlhf.async_methods); rgpo_dual is the recipe's
# async ``rgpo`` (dual gate, beta_ref 0.05), the one arm with a reference
ARMS = {
    "ignore": "ignore",
    "ppo_clip": "ppo_clip",
    "tis": "tis",
    "icepop": "icepop",
    "seq_mask": "seq_mask",
    "rgpo": "rgpo_mu",
    "rgpo_gate": "rgpo_gate",
    "rgpo_dual": "rgpo",
}
PEERS = ("ignore", "ppo_clip", "tis", "icepop", "seq_mask")
CALIBRATION_SIGMAS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
PUBLISHED_OUTSIDE_0_9_1_1 = 0.069  # Qwen2.5-1.5B, vLLM vs transformers in bf16 (TRL PR 7269)
BF16_NEGLIGIBLE = 0.01  # the bf16 sampler is a cell only if at least 1% of its tokens leave [0.9, 1.1]
PRECHECK_LADDER = (1.0, 2.0, 4.0, 8.0)  # the strongest dose, then doubled at most three times
DIVERGED_KL_FACTOR = 10.0  # a pre-check run diverged if its test KL_ref exceeds 10x the control mean


def cell_flags(calibration: dict | None) -> dict[str, tuple[str, ...]]:
    """The mismatch suite's cells (lag 1): name -> the sampler's flags. The calibrated noise and the bf16
    cell come from the committed calibration; without it only the cells that need none."""
    cells = {
        "fp32": (),
        "int8": ("--sampler_quantization", "int8"),
        "sigma0.5": ("--sampler_logit_noise", "0.5"),
        "sigma1.0": ("--sampler_logit_noise", "1.0"),
        "top_p0.9": ("--sampler_top_p", "0.9"),
    }
    if calibration is not None:
        sigma = calibration["calibrated_sigma"]
        cells[f"sigma{sigma:g}_calibrated"] = ("--sampler_logit_noise", f"{sigma:g}")
        if calibration["bf16_is_a_cell"]:
            cells["bf16"] = ("--sampler_dtype", "bfloat16")
    return cells


def precheck_tags(precheck: dict | None) -> list[str]:
    """The pre-check's cells to run now: the control and the rungs decided so far plus the next one (the
    ladder stops at the first rung that hurts)."""
    tags = ["fp32", f"sigma{PRECHECK_LADDER[0]:g}"]
    for rung in (precheck or {}).get("rungs", []):
        if rung.get("state") == "decided" and not rung["hurt"]:
            i = PRECHECK_LADDER.index(rung["sigma"]) + 1
            if i < len(PRECHECK_LADDER):
                tags.append(f"sigma{PRECHECK_LADDER[i]:g}")
    return tags


def read_json(name: str, out: str | None = None) -> dict | None:
    path = os.path.join(out or OUT, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


RULE = """Reading rules of the mismatch study (world v3), fixed before any of its runs.
Every arm at learning rate 5e-5, constant, 400 optimizer steps of 16 completions, seeds 1-5, the in-process
worker at lag 1 unless the cell says otherwise; no reference penalty for any arm but rgpo_dual. Metric: test
gold (64 test prompts x 4 samples) at the end of the run; KL_ref (test) beside it.
Pre-check (positive control), before the suites: the ignore arm at the strongest dose (sigma 1.0) against
ignore at fp32, seeds 1-3. It is hurt if its test gold is lower with a two-sided Welch p <= 0.05, or if a run
diverged (a non-finite loss stopped it, or its test KL_ref exceeds 10x the control's mean). If not hurt, the
dose doubles (2, 4, 8; at most three times), seeds 1-3 again, and the first rung that hurts joins the
mismatch suite as a cell. If no rung hurts, the suites still run and the report says that no cell can rank
the corrections.
Within each cell (family: the cell's comparisons, Holm, both directions): every arm against rgpo (the gate on
pi / pi_sampler with the adaptive KL), two-sided Welch on test gold, 5 seeds; the best peer is the peer arm
(ignore, ppo_clip, tis, icepop, seq_mask) with the highest mean gold in the cell. Words: "rgpo higher / lower
than X" only after Holm; otherwise "no significant difference (n, p)".
Matched KL: a gold difference counts as a win for the arm with higher gold only if that arm's test KL_ref is
not significantly higher (Welch on KL_ref, Holm within the cell); else "higher gold at a higher KL_ref:
undecided".
A cell ranks corrections only if ignore is hurt there: its gold lower than ignore at fp32 (two-sided Welch,
Holm over the cells); otherwise the report says the cell cannot rank them.
Per arm: the change of gold from the control cell (fp32) to each other cell (Welch, Holm over the cells).
Whether the gate acted: rgpo's share of tokens with g(r) < 0.1 at each step's forward (rgpo/rejected_frac;
at lag 1 each step's tokens are seen before its optimizer step) and the shares of r outside [0.9, 1.1] and
[0.5, 2], window means (steps 304-400) with per-step curves and seed bands.
The lag suite (fp32 sampler, the control shared with the mismatch suite): lag 8 and lag 32 (max_staleness
= lag), the same arms and tests.
Decoupled PPO is not an arm: with one optimizer step per sample its proximal policy is the current one and it
reduces to tis with C = 1."""
# Erratum (dated, in results/rlhf/v3/mismatch/RULES.md): the rule's last sentence is wrong and stays as it was
# committed before the runs. With one optimizer step per sample decoupled PPO reduces to plain importance
# weighting by pi / pi_sampler (uncapped, or masked above a cap as AReaL does), not to tis with C = 1, which
# truncates every weight above 1. No arm, test or verdict used the sentence.


# ---------------------------------------------------------------------------------------------- calibration
def _probe_worker(settings: dict, steps: int, policy: str, prompts, seed: int = 0):
    """Per completion token of ``steps`` generation steps: the sampler's reported log-prob and the float32
    trainer's, from the in-process worker with ``settings``."""
    from rgpo_trl.async_rgpo import AsyncRGPOConfig, InProcessRolloutWorker

    args = AsyncRGPOConfig(
        output_dir=os.path.join(OUT, "_probe"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=16,
        num_generations=4,
        max_completion_length=24,
        token_budget=0,
        seed=seed,
        **settings,
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy)
    worker = InProcessRolloutWorker(
        policy, tok, prompts, [lambda completions, **_: [0.0] * len(completions)], args
    )
    mu, pi = [], []
    for _ in range(steps):
        samples, _ = worker._generate_step(0)
        trainer = worker._behaviour_logprobs([s.input_ids.tolist() for s in samples])
        for s, t in zip(samples, trainer, strict=True):
            m = s.completion_mask.astype(bool)
            mu.append(s.old_log_probs[m])
            pi.append(t[m])
    return np.concatenate(mu).astype(np.float64), np.concatenate(pi).astype(np.float64)


def mismatch_stats(mu: np.ndarray, pi: np.ndarray) -> dict:
    """The mismatch as the literature measures it, r = pi / mu per token; below the sigmoid gate's (k = 5)
    rejection point is g(r) < 0.1, r < 1 + log(1/9) / 5."""
    log_r = pi - mu
    r = np.exp(log_r)
    return {
        "tokens": int(len(r)),
        "abs_log_ratio_mean": float(np.abs(log_r).mean()),
        "outside_0.9_1.1": float(((r < 0.9) | (r > 1.1)).mean()),
        "outside_0.5_2": float(((r < 0.5) | (r > 2.0)).mean()),
        "below_gate_rejection": float((r < 1 + np.log(1 / 9) / 5).mean()),
        "ratio_max": float(r.max()),
        "k3_kl": float((r - 1 - log_r).mean()),
    }


def calibrate(steps: int = 8, out: str = OUT) -> dict:
    """Measures every sampler setting on world v3's SFT policy (``steps`` x 16 completions of training
    prompts), picks the noise sigma whose share outside [0.9, 1.1] is nearest the published 6.9%, and decides
    whether bf16 is a cell."""
    from transformers import AutoTokenizer

    from recipes.hh_common.hh_data import load_hh_helpful_prompts
    from recipes.tiny_hh.build import build_tiny_assets

    assets = build_tiny_assets(None, version=3)
    tok = AutoTokenizer.from_pretrained(str(assets.policy_dir))
    prompts, _ = load_hh_helpful_prompts(
        str(assets.train_file), tokenizer=tok, max_prompt_length=128, data_dir=None
    )
    settings = {
        "fp32": {},
        "bf16": {"sampler_dtype": "bfloat16"},
        "int8": {"sampler_quantization": "int8"},
        "top_p0.9": {"sampler_top_p": 0.9},
        **{f"sigma{s:g}": {"sampler_logit_noise": s} for s in (*CALIBRATION_SIGMAS, 0.5, 1.0)},
    }
    measured = {}
    for name, s in settings.items():
        mu, pi = _probe_worker(s, steps, str(assets.policy_dir), prompts)
        measured[name] = {"settings": s, **mismatch_stats(mu, pi)}
        print(f"{name:12s} " + " ".join(f"{k} {v:.4g}" for k, v in measured[name].items() if k != "settings"))
    gaps = {
        s: abs(measured[f"sigma{s:g}"]["outside_0.9_1.1"] - PUBLISHED_OUTSIDE_0_9_1_1)
        for s in CALIBRATION_SIGMAS
    }
    sigma = min(CALIBRATION_SIGMAS, key=lambda s: (gaps[s], s))
    result = {
        "command": "python -m rgpo_lab.rlhf_mismatch calibrate",
        "steps": steps,
        "completions": steps * 16,
        "policy": "world v3 SFT policy (tiny-hh/policy), training prompts, temperature 1",
        "rule": f"sigma from {list(CALIBRATION_SIGMAS)} nearest {PUBLISHED_OUTSIDE_0_9_1_1} outside "
        f"[0.9, 1.1]; bf16 a cell iff its share outside [0.9, 1.1] >= {BF16_NEGLIGIBLE}",
        "calibrated_sigma": sigma,
        "bf16_is_a_cell": measured["bf16"]["outside_0.9_1.1"] >= BF16_NEGLIGIBLE,
        "measured": measured,
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "calibration.json"), "w") as f:
        json.dump(result, f, indent=1, allow_nan=False)
    with open(os.path.join(out, "calibration.md"), "w") as f:
        f.write(calibration_md(result))
    return result


def calibration_md(result: dict) -> str:
    keys = (
        "abs_log_ratio_mean",
        "outside_0.9_1.1",
        "outside_0.5_2",
        "below_gate_rejection",
        "ratio_max",
        "k3_kl",
    )
    lines = [
        "# Sampler mismatch on world v3's SFT policy",
        "",
        f"Command: `{result['command']}` ({result['completions']} completions per setting; "
        f"{result['policy']}). Rule, fixed before measuring: {result['rule']}.",
        "",
        f"Calibrated noise: sigma = {result['calibrated_sigma']:g}; bf16 sampler a suite cell: "
        f"{'yes' if result['bf16_is_a_cell'] else 'no (negligible here)'}.",
        "",
        "| sampler | tokens | mean abs log r | outside [0.9, 1.1] | outside [0.5, 2] | g(r) < 0.1 "
        "| largest r | K3 KL |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in result["measured"].items():
        lines.append(f"| {name} | {m['tokens']} | " + " | ".join(f"{m[k]:.4g}" for k in keys) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- pre-check
def precheck_decision(control: list[dict], rung: list[dict]) -> dict:
    """Is the ignore arm hurt at a rung? ``control`` / ``rung``: per seed {"gold", "kl_ref", "diverged"}."""
    from rgpo_lab.statistics import welch

    control_kl = float(np.mean([r["kl_ref"] for r in control]))
    diverged = [
        r["seed"]
        for r in rung
        if r.get("diverged") or not np.isfinite(r["kl_ref"]) or r["kl_ref"] > DIVERGED_KL_FACTOR * control_kl
    ]
    w = welch([r["gold"] for r in rung if np.isfinite(r["gold"])], [r["gold"] for r in control])
    lower = bool(np.isfinite(w.p) and w.p <= 0.05 and w.diff < 0)
    return {
        "gold_diff": w.diff,
        "p": w.p,
        "gold_lower": lower,
        "diverged_seeds": diverged,
        "hurt": lower or bool(diverged),
    }


def precheck(results: str = os.path.join(ROOT, "results", "rlhf"), out: str = OUT) -> dict:
    """Reads the pre-check's finished runs rung by rung, decides each, stops at the first that hurts."""

    def load(tag: str) -> list[dict]:
        rows = []
        for seed in PRECHECK_SEEDS:
            d = os.path.join(results, "v3", "mismatch_precheck", f"ignore__{tag}__s{seed}")
            if not os.path.exists(os.path.join(d, "heldout.json")):
                return []
            with open(os.path.join(d, "heldout.json")) as f:
                h = {k: float("nan") if v is None else v for k, v in json.load(f).items()}
            rows.append({"seed": seed, "gold": h["gold"], "kl_ref": h["kl_ref"], "diverged": False})
        return rows

    control = load("fp32")
    rungs = []
    for sigma in PRECHECK_LADDER:
        rows = load(f"sigma{sigma:g}")
        if not control or not rows:
            rungs.append({"sigma": sigma, "state": "not run"})
            break
        decision = precheck_decision(control, rows)
        rungs.append({"sigma": sigma, "state": "decided", "runs": rows, **decision})
        if decision["hurt"]:
            break
    hurt_at = next((r["sigma"] for r in rungs if r.get("hurt")), None)
    result = {
        "command": "python -m rgpo_lab.rlhf_mismatch precheck",
        "control": control,
        "rungs": rungs,
        "hurt_at": hurt_at,
        "passed": hurt_at is not None,
        "complete": hurt_at is not None
        or (len(rungs) == len(PRECHECK_LADDER) and rungs[-1]["state"] == "decided"),
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "precheck.json"), "w") as f:
        json.dump(result, f, indent=1, allow_nan=False, default=float)
    with open(os.path.join(out, "precheck.md"), "w") as f:
        f.write(precheck_md(result))
    return result


def precheck_md(result: dict) -> str:
    """The pre-check for a reader: each rung's gold and KL_ref against the control, the decision, the
    conclusion."""

    def cell(rows, key):
        x = [r[key] for r in rows]
        return f"{np.mean(x):.3f} ± {np.std(x, ddof=1):.3f} ({len(x)})" if len(x) > 1 else "-"

    lines = [
        "# Positive control: does the strongest dose hurt the uncorrected arm?",
        "",
        f"Command: `{result['command']}` after `python -m rgpo_lab.rlhf_suite v3/mismatch_precheck` "
        "(rung by rung). Rule (RULES.md): the ignore arm at a dose against ignore at fp32, seeds 1-3; hurt "
        "if test gold is lower (two-sided Welch p <= 0.05) or a run diverged (test KL_ref > "
        f"{DIVERGED_KL_FACTOR:g}x the control's mean); the ladder {list(PRECHECK_LADDER)} stops at the first "
        "rung that hurts.",
        "",
        "| cell | test gold | test KL_ref | gold - control | p | diverged seeds | hurt |",
        "|---|---|---|---|---|---|---|",
        f"| fp32 (control) | {cell(result['control'], 'gold')} | {cell(result['control'], 'kl_ref')} "
        "| | | | |",
    ]
    for rung in result["rungs"]:
        if rung["state"] != "decided":
            lines.append(f"| sigma {rung['sigma']:g} | not run yet | | | | | |")
            continue
        lines.append(
            f"| sigma {rung['sigma']:g} | {cell(rung['runs'], 'gold')} | {cell(rung['runs'], 'kl_ref')} | "
            f"{rung['gold_diff']:+.3f} | {rung['p']:.3f} | {rung['diverged_seeds'] or '-'} | "
            f"{'yes' if rung['hurt'] else 'no'} |"
        )
    if result["passed"]:
        verdict = f"Passed: the uncorrected arm is hurt at sigma {result['hurt_at']:g}."
    elif result["complete"]:
        verdict = "Failed: no rung of the ladder hurt the uncorrected arm; no cell can rank the corrections."
    else:
        verdict = "In progress: the next rung has not run."
    return "\n".join([*lines, "", verdict]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.rlhf_mismatch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", choices=["calibrate", "precheck", "rule"])
    p.add_argument("--steps", type=int, default=8, help="calibrate: generation steps per setting")
    a = p.parse_args(argv)
    if a.command == "calibrate":
        r = calibrate(a.steps)
        print(f"calibrated sigma {r['calibrated_sigma']:g}; bf16 a cell: {r['bf16_is_a_cell']}")
    elif a.command == "precheck":
        r = precheck()
        print(json.dumps({k: r[k] for k in ("hurt_at", "passed", "complete")}))
    else:
        print(RULE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
