"""The mismatch study read by its rule (results/rlhf/v3/mismatch/RULES.md, rgpo_lab.rlhf_mismatch.RULE).

    python -m rgpo_lab.rlhf_mismatch_report          # -> results/rlhf/v3/mismatch/report/

Run from the repository root. Reads the finished runs of v3/mismatch and v3/mismatch_lag (a run is finished
when its heldout.json exists); a partial study gives an interim report naming what is missing.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys

import numpy as np

from rgpo_lab import rlhf_mismatch as mm
from rgpo_lab.json_values import plain
from rgpo_lab.statistics import holm, mean_std, verdict, welch

RESULTS = os.path.join(mm.ROOT, "results", "rlhf")
OUT = os.path.join(mm.OUT, "report")
CONTROL = "fp32"
WINDOW_KEYS = {  # the window means read from each run's metrics.csv (steps WINDOW_START-STEPS)
    "outside_0.9_1.1": "mismatch/outside_0.9_1.1",
    "outside_0.5_2": "mismatch/outside_0.5_2",
    "below_rejection": "mismatch/below_gate_rejection",
    "abs_log_ratio": "mismatch/abs_log_ratio_mean",
    "rejected_frac": "rgpo/rejected_frac",
    "weight_mean": "correction/weight_mean",
    "zero_weight_frac": "correction/zero_weight_frac",
    "kl_coef": "rgpo/kl_coef",
}


def _number(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def read_run(d: str) -> dict | None:
    """heldout.json (test gold, KL_ref) and the window means of metrics.csv; None while unfinished."""
    path = os.path.join(d, "heldout.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        heldout = json.load(f)
    rows = []
    metrics = os.path.join(d, "metrics.csv")
    if os.path.exists(metrics):
        with open(metrics, newline="") as f:
            rows = list(csv.DictReader(f))
    window = {}
    for name, key in WINDOW_KEYS.items():
        x = [
            v
            for r in rows
            if (it := _number(r.get("iteration"))) is not None and mm.WINDOW_START < it <= mm.STEPS
            if (v := _number(r.get(key))) is not None
        ]
        window[name] = float(np.mean(x)) if x else None
    curve = [(_number(r.get("iteration")), _number(r.get("rewards/gold/mean"))) for r in rows]
    return {
        "gold": _number(heldout.get("gold")),
        "kl_ref": _number(heldout.get("kl_ref")),
        "window": window,
        "curve": [(i, g) for i, g in curve if i is not None and g is not None],
    }


def load(results: str = RESULTS) -> tuple[dict, list[str]]:
    """{cell: {arm: [run per seed]}} of both suites, and the missing runs (suite/name)."""
    from rgpo_lab.rlhf_suite import SUITE_BUILDERS

    data: dict = {}
    missing = []
    for suite in ("v3/mismatch", "v3/mismatch_lag"):
        for r in SUITE_BUILDERS[suite](results):
            arm, cell = r.tag.split("__")
            run = read_run(os.path.join(results, suite, r.name))
            if run is None:
                missing.append(f"{suite}/{r.name}")
                continue
            data.setdefault(cell, {}).setdefault(arm, []).append({"seed": r.seed, **run})
    return data, missing


def _values(data, cell, arm, key="gold") -> list[float]:
    return [r[key] for r in data.get(cell, {}).get(arm, []) if r[key] is not None]


def cell_tests(data, cell: str) -> dict:
    """Every arm against rgpo on test gold (Holm within the cell), the matched-KL condition (Welch on KL_ref,
    Holm within the cell), the best peer."""
    arms = [a for a in mm.ARMS if a != "rgpo"]
    gold = {a: welch(_values(data, cell, a), _values(data, cell, "rgpo")) for a in arms}
    kl = {a: welch(_values(data, cell, a, "kl_ref"), _values(data, cell, "rgpo", "kl_ref")) for a in arms}
    gold_holm = dict(zip(arms, holm([gold[a].p for a in arms]), strict=True))
    kl_holm = dict(zip(arms, holm([kl[a].p for a in arms]), strict=True))
    peers = {a: np.mean(_values(data, cell, a)) for a in mm.PEERS if _values(data, cell, a)}
    rows = {}
    for a in arms:
        words = verdict(gold[a].diff, gold_holm[a])
        if words in ("higher", "lower"):
            winner_kl_higher = (kl[a].diff > 0) == (words == "higher") and kl_holm[a] <= 0.05
            if winner_kl_higher:
                words = f"{words} gold at a higher KL_ref: undecided"
        rows[a] = {
            "n": len(_values(data, cell, a)),
            "gold_diff_vs_rgpo": gold[a].diff,
            "p": gold[a].p,
            "p_holm": gold_holm[a],
            "kl_ref_diff_vs_rgpo": kl[a].diff,
            "kl_p_holm": kl_holm[a],
            "verdict": words,
        }
    return {"vs_rgpo": rows, "best_peer": max(peers, key=peers.get) if peers else None}


def hurt_by_cell(data) -> dict:
    """Is ignore hurt in each cell (gold below ignore at fp32, Welch, Holm over the cells)?"""
    cells = [c for c in data if c != CONTROL]
    tests = {c: welch(_values(data, c, "ignore"), _values(data, CONTROL, "ignore")) for c in cells}
    adjusted = dict(zip(cells, holm([tests[c].p for c in cells]), strict=True))
    return {
        c: {
            "diff": tests[c].diff,
            "p_holm": adjusted[c],
            "ranks": bool(np.isfinite(adjusted[c]) and adjusted[c] <= 0.05 and tests[c].diff < 0),
        }
        for c in cells
    }


def change_from_control(data) -> dict:
    """Per arm, gold in each cell minus gold at fp32 (Welch, Holm over the cells)."""
    out = {}
    cells = [c for c in data if c != CONTROL]
    for arm in mm.ARMS:
        tests = {c: welch(_values(data, c, arm), _values(data, CONTROL, arm)) for c in cells}
        adjusted = holm([tests[c].p for c in cells])
        out[arm] = {
            c: {"diff": tests[c].diff, "p_holm": p, "verdict": verdict(tests[c].diff, p)}
            for c, p in zip(cells, adjusted, strict=True)
        }
    return out


def _f(x, d=3) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{d}f}"


def _p(x) -> str:
    return "-" if x is None or not np.isfinite(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


def report_md(data, missing, tests, hurt, changes) -> str:
    total = len(missing) + sum(len(v) for c in data.values() for v in c.values())
    status = "final" if not missing else f"INTERIM: {total - len(missing)} of {total} runs finished"
    lines = [
        "# Sampler mismatch and staleness: which correction, and did RGPO's gate act?",
        "",
        f"Command: `python -m rgpo_lab.rlhf_mismatch_report`. Rule: results/rlhf/v3/mismatch/RULES.md. "
        f"Status: **{status}**.",
        "",
        "## Test gold per cell and arm (mean ± std (n)); KL_ref (test) below",
        "",
        "| cell | " + " | ".join(mm.ARMS) + " | ignore hurt vs fp32 (Holm p) |",
        "|---|" + "---|" * (len(mm.ARMS) + 1),
    ]
    for cell in data:
        cells = []
        for arm in mm.ARMS:
            g, k = mean_std(_values(data, cell, arm)), mean_std(_values(data, cell, arm, "kl_ref"))
            cells.append(f"{_f(g.mean)} ± {_f(g.std)} ({g.n}); {_f(k.mean)}")
        h = hurt.get(cell)
        hurt_cell = "control" if h is None else f"{'yes' if h['ranks'] else 'no'} ({_p(h['p_holm'])})"
        lines.append(f"| {cell} | " + " | ".join(cells) + f" | {hurt_cell} |")
    lines += [
        "",
        "## Every arm against rgpo, per cell (gold difference, Holm within the cell; matched KL)",
        "",
    ]
    for cell, t in tests.items():
        ranks = cell == CONTROL or hurt.get(cell, {}).get("ranks")
        note = "" if ranks else " (ignore is not hurt here: this cell cannot rank the corrections)"
        lines.append(f"**{cell}**{note}; best peer: {t['best_peer']}")
        lines.append("")
        lines.append("| arm | n | gold - rgpo | Holm p | KL_ref - rgpo | KL Holm p | verdict |")
        lines.append("|---|---|---|---|---|---|---|")
        for arm, r in t["vs_rgpo"].items():
            lines.append(
                f"| {arm} | {r['n']} | {_f(r['gold_diff_vs_rgpo'])} | {_p(r['p_holm'])} | "
                f"{_f(r['kl_ref_diff_vs_rgpo'])} | {_p(r['kl_p_holm'])} | {r['verdict']} |"
            )
        lines.append("")
    lines += ["## Did the gate act? (window means, steps 304-400)", ""]
    lines.append(
        "| cell | outside [0.9, 1.1] | outside [0.5, 2] | below rejection | rgpo rejected | rgpo kl_coef |"
    )
    lines.append("|---|---|---|---|---|---|")
    for cell in data:
        rg = data[cell].get("rgpo", [])

        def w(key, runs=rg):
            x = [r["window"][key] for r in runs if r["window"].get(key) is not None]
            return float(np.mean(x)) if x else None

        keys = ("outside_0.9_1.1", "outside_0.5_2", "below_rejection", "rejected_frac", "kl_coef")
        lines.append(f"| {cell} | " + " | ".join(_f(w(k)) for k in keys) + " |")
    lines += ["", "## Each arm's change of gold from the fp32 cell (Holm over the cells)", ""]
    cells = [c for c in data if c != CONTROL]
    lines.append("| arm | " + " | ".join(cells) + " |")
    lines.append("|---|" + "---|" * len(cells))
    for arm, per in changes.items():
        lines.append(
            f"| {arm} | " + " | ".join(f"{_f(per[c]['diff'])} ({_p(per[c]['p_holm'])})" for c in cells) + " |"
        )
    if missing:
        lines += ["", f"## Not finished ({len(missing)})", "", ", ".join(missing)]
    return "\n".join(lines) + "\n"


def build(results: str = RESULTS, out: str = OUT) -> str:
    data, missing = load(results)
    tests = {cell: cell_tests(data, cell) for cell in data}
    hurt, changes = hurt_by_cell(data), change_from_control(data)
    md = report_md(data, missing, tests, hurt, changes)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "studies.json"), "w") as f:
        json.dump(plain({"missing": missing, "cells": tests, "hurt": hurt, "changes": changes}), f, indent=1)
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--out", default=OUT)
    a = p.parse_args(argv)
    print(build(a.results, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
