"""The synchronous mismatch study's tests as its rule states them: every arm against rgpo (Welch, Holm
over the arms, matched KL_ref) on the per-seed means over the ranking cells (the primary family) and in
each cell (secondary in a ranking cell, descriptive elsewhere); the dose-response and gate summaries."""

from __future__ import annotations

import numpy as np

from rgpo_lab import rlhf_sync_mismatch as smm
from rgpo_lab.rlhf_report.mismatch_markdown import _p
from rgpo_lab.rlhf_report.mismatch_runs import values, window_values
from rgpo_lab.rlhf_report.mismatch_verdicts import against
from rgpo_lab.rlhf_report.sync_mismatch_runs import GATE_ARMS, WINDOW_KEYS, k_of, pooled
from rgpo_lab.statistics import mean_std, simulated_detectable_difference, welch

POWER = 0.8  # of the smallest detectable differences (the rule's)
REFERENCE = smm.REFERENCE_ARM


def family(data: dict, cell: str, arms: tuple[str, ...], descriptive: bool = False) -> dict:
    """Every arm against rgpo in ``data[cell]``: `mismatch_verdicts.against` (gold difference, Welch, Holm
    over the arms, the matched-KL words) with the 95% CI of the difference, the smallest difference the test
    detects (power 0.8, two-sided, at 0.05 / m: the first Holm step; the Welch test simulated) and the words
    the report prints (``descriptive``: a cell outside the rule's families, whose words rank nothing)."""
    rows = against(data, cell, REFERENCE, arms)
    ref = values(data, cell, REFERENCE)
    for arm, r in rows.items():
        w = welch(values(data, cell, arm), ref)
        r["ci95"] = [w.low, w.high]
        r["smallest_detectable"] = simulated_detectable_difference(
            values(data, cell, arm), ref, 0.05 / len(rows), POWER
        )
        r["words"] = described(r) if descriptive else words(r)
    return rows


def words(r: dict) -> str:
    """The rule's words: higher / lower only after Holm (and matched KL); otherwise "no significant
    difference (n, p, smallest detectable)"."""
    if r["verdict"] != "no significant difference":
        return r["verdict"]
    sdd = "-" if not np.isfinite(r["smallest_detectable"]) else f"{r['smallest_detectable']:.3f}"
    return (
        f"no significant difference (n = {r['n']} / {r['n_reference']}, Holm p = {_p(r['p_holm'])}, "
        f"smallest detectable {sdd})"
    )


def described(r: dict) -> str:
    """A descriptive cell's words: the difference and its Holm p, no "higher / lower" (the rule tests no
    family there)."""
    return (
        f"difference {r['gold_diff']:+.3f} (n = {r['n']} / {r['n_reference']}, Holm p = {_p(r['p_holm'])} "
        "within the cell; descriptive, ranks no correction)"
    )


def primary(data: dict, ranking: list[str], arms: tuple[str, ...]) -> dict | None:
    """The primary family: each arm against rgpo on the per-seed means over the ranking cells; None without
    a ranking cell (the rule: then there is no primary family)."""
    if not ranking:
        return None
    samples = {"pooled": pooled(data, ranking)}
    return {"cells": ranking, "tests": family(samples, "pooled", arms)}


def per_cell(data: dict, cells: list[str], ranking: list[str], arms: tuple[str, ...]) -> dict:
    """The same tests in every suite cell: the secondary family in a ranking cell, descriptive elsewhere."""
    return {
        cell: {
            "role": "secondary" if cell in ranking else "descriptive",
            "tests": family(data, cell, arms, descriptive=cell not in ranking),
        }
        for cell in cells
    }


def summary(data: dict, cells: list[str], arms: tuple[str, ...]) -> dict:
    """Per cell and arm: test gold and KL_ref (mean, sample sd, n)."""
    return {
        c: {a: {k: mean_std(values(data, c, a, k))._asdict() for k in ("gold", "kl_ref")} for a in arms}
        for c in cells
    }


def dose_response(data: dict, cells: list[str], arms: tuple[str, ...]) -> dict:
    """Per arm and k: (dose, gold mean / sd / n, KL_ref mean / sd / n) over the suite's cells at that k,
    doses in order (fp32 is dose 0)."""
    out: dict = {}
    for arm in arms:
        for k in smm.REUSE:
            at_k = sorted((c for c in cells if k_of(c) == k), key=smm.dose_of)
            out.setdefault(arm, {})[f"k{k}"] = [
                {
                    "dose": smm.dose_of(c),
                    "gold": mean_std(values(data, c, arm))._asdict(),
                    "kl_ref": mean_std(values(data, c, arm, "kl_ref"))._asdict(),
                }
                for c in at_k
            ]
    return out


def gate(data: dict, cells: list[str], arms: tuple[str, ...]) -> dict:
    """Per cell and arm: the gate arms' rejected share at the first optimizer step of each generation batch
    and over the window, and every arm's window means of TRL's sampling/* (where it logged them), each as
    mean / sd / n over the seeds' window means."""
    out: dict = {}
    for c in cells:
        for arm in arms:
            runs = data.get(c, {}).get(arm, [])
            row = {k: mean_std(window_values(runs, k))._asdict() for k in WINDOW_KEYS}
            if arm in GATE_ARMS:
                first = [r["first_step_rejected"] for r in runs if r["first_step_rejected"] is not None]
                row["first_step_rejected"] = mean_std(first)._asdict()
            out.setdefault(c, {})[arm] = row
    return out
