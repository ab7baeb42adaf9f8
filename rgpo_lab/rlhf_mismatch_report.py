"""The mismatch study read by its rule (results/rlhf/v3/mismatch/RULES.md, rgpo_lab.rlhf_mismatch.RULE).

    python -m rgpo_lab.rlhf_mismatch_report          # -> results/rlhf/v3/mismatch/report/

Run from the repository root. Reads the finished runs of v3/mismatch and v3/mismatch_lag (a run is finished
when its heldout.json exists); a partial study gives an interim report naming what is missing. Writes
report.md, studies.json, curves.png (per-step gold, every arm, mean and seed band per cell) and gate.png
(rgpo's rejected share and the share of ratios outside [0.5, 2] per step).
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
    "weight_max": "correction/weight_max",
    "zero_weight_frac": "correction/zero_weight_frac",
    "kl_coef": "rgpo/kl_coef",
}
CURVE_KEYS = {  # the per-step curves read from metrics.csv
    "gold": "rewards/gold/mean",
    "rejected_frac": "rgpo/rejected_frac",
    "outside_0.5_2": "mismatch/outside_0.5_2",
}
CURVE_BIN = 20  # steps per point of the plotted curves (a step's gold is the mean over 16 completions)


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
    curves = {
        name: [
            (it, v)
            for r in rows
            if (it := _number(r.get("iteration"))) is not None
            if (v := _number(r.get(key))) is not None
        ]
        for name, key in CURVE_KEYS.items()
    }
    return {
        "gold": _number(heldout.get("gold")),
        "kl_ref": _number(heldout.get("kl_ref")),
        "window": window,
        "curves": curves,
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
    """Is ignore hurt in each cell (gold below ignore at fp32, Welch, Holm over the cells)? ``state``: hurt,
    not hurt, or not tested (fewer than 2 finished runs a side)."""
    cells = [c for c in data if c != CONTROL]
    tests = {c: welch(_values(data, c, "ignore"), _values(data, CONTROL, "ignore")) for c in cells}
    adjusted = dict(zip(cells, holm([tests[c].p for c in cells]), strict=True))
    out = {}
    for c in cells:
        tested = bool(np.isfinite(adjusted[c]))
        ranks = tested and adjusted[c] <= 0.05 and tests[c].diff < 0
        state = "hurt" if ranks else ("not hurt" if tested else "not tested")
        out[c] = {"diff": tests[c].diff, "p_holm": adjusted[c], "ranks": bool(ranks), "state": state}
    return out


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


HURT_NOTE = {
    "not hurt": " (ignore is not hurt here: this cell cannot rank the corrections)",
    "not tested": " (whether ignore is hurt is not tested yet: fewer than 2 finished runs a side)",
}


def _window_mean(runs, key) -> float | None:
    x = [r["window"][key] for r in runs if r["window"].get(key) is not None]
    return float(np.mean(x)) if x else None


def _missing_summary(missing: list[str]) -> list[str]:
    """The unfinished runs as one line per suite and cell: how many, which seeds."""
    by_cell: dict[tuple[str, str], set[str]] = {}
    for name in missing:
        suite, run = name.rsplit("/", 1)
        parts = run.split("__")
        by_cell.setdefault((suite, parts[2]), set()).add(parts[3])
    lines = ["| suite | cell | runs not finished | seeds |", "|---|---|---|---|"]
    for (suite, cell), seeds in by_cell.items():
        n = sum(1 for m in missing if m.startswith(f"{suite}/") and m.split("__")[2] == cell)
        lines.append(f"| {suite} | {cell} | {n} | {', '.join(sorted(seeds))} |")
    return lines


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
        hurt_cell = "control" if h is None else f"{h['state']} ({_p(h['p_holm'])})"
        lines.append(f"| {cell} | " + " | ".join(cells) + f" | {hurt_cell} |")
    lines += [
        "",
        "Training gold per step (the gold reward of the step's 16 completions; every arm, the mean over "
        f"seeds and a band of one standard error, {CURVE_BIN}-step bins): ![curves](curves.png)",
        "",
        "## Every arm against rgpo, per cell (gold difference, Holm within the cell; matched KL)",
        "",
    ]
    for cell, t in tests.items():
        state = "hurt" if cell == CONTROL else hurt.get(cell, {}).get("state", "not tested")
        peer = t["best_peer"]
        lines.append(f"**{cell}**{HURT_NOTE.get(state, '')}; best peer: {peer}")
        lines.append("")
        lines.append("| arm | n | gold - rgpo | Holm p | KL_ref - rgpo | KL Holm p | verdict |")
        lines.append("|---|---|---|---|---|---|---|")
        for arm, r in t["vs_rgpo"].items():
            lines.append(
                f"| {arm} | {r['n']} | {_f(r['gold_diff_vs_rgpo'])} | {_p(r['p_holm'])} | "
                f"{_f(r['kl_ref_diff_vs_rgpo'])} | {_p(r['kl_p_holm'])} | {r['verdict']} |"
            )
        if peer is not None:
            r = t["vs_rgpo"][peer]
            lines += ["", f"rgpo against the best peer ({peer}): {_against_peer(r)}."]
        lines.append("")
    lines += [
        "## Did the gate act? (window means, steps 304-400, rgpo's runs)",
        "",
        "rejected: share of tokens with g(r) < 0.1 at the step's forward (at lag 1, before the step's "
        "update); per step in ![gate](gate.png)",
        "",
        "| cell | outside [0.9, 1.1] | outside [0.5, 2] | below rejection | rgpo rejected | rgpo kl_coef |",
        "|---|---|---|---|---|---|",
    ]
    for cell in data:
        rg = data[cell].get("rgpo", [])
        keys = ("outside_0.9_1.1", "outside_0.5_2", "below_rejection", "rejected_frac", "kl_coef")
        lines.append(f"| {cell} | " + " | ".join(_f(_window_mean(rg, k)) for k in keys) + " |")
    lines += [
        "",
        "## The corrections' weights (window means: mean weight; largest weight; share of zero weights)",
        "",
        "| cell | " + " | ".join(mm.ARMS) + " |",
        "|---|" + "---|" * len(mm.ARMS),
    ]
    for cell in data:
        row = []
        for arm in mm.ARMS:
            runs = data[cell].get(arm, [])
            keys = ("weight_mean", "weight_max", "zero_weight_frac")
            row.append("; ".join(_f(_window_mean(runs, k), 2) for k in keys))
        lines.append(f"| {cell} | " + " | ".join(row) + " |")
    lines += ["", "## Each arm's change of gold from the fp32 cell (Holm over the cells)", ""]
    cells = [c for c in data if c != CONTROL]
    lines.append("| arm | " + " | ".join(cells) + " |")
    lines.append("|---|" + "---|" * len(cells))
    for arm, per in changes.items():
        lines.append(
            f"| {arm} | " + " | ".join(f"{_f(per[c]['diff'])} ({_p(per[c]['p_holm'])})" for c in cells) + " |"
        )
    if missing:
        lines += ["", f"## Not finished ({len(missing)}; every name in studies.json)", ""]
        lines += _missing_summary(missing)
    return "\n".join(lines) + "\n"


def _against_peer(r: dict) -> str:
    """The vs-rgpo row of the best peer read from rgpo's side."""
    words = r["verdict"]
    if words.startswith("not tested"):
        return words
    numbers = f"(gold {_f(-r['gold_diff_vs_rgpo'])}, n = {r['n']}, Holm p = {_p(r['p_holm'])})"
    if words.endswith("undecided"):  # the peer's gold is higher or lower, at a significantly higher KL_ref
        side = "lower" if words.startswith("higher") else "higher"
        return f"{side} gold, the peer at a significantly higher KL_ref: undecided {numbers}"
    flipped = {"higher": "lower", "lower": "higher"}.get(words, words)
    return f"{flipped} {numbers}"


def _binned(curve, width=CURVE_BIN) -> dict[int, float]:
    bins: dict[int, list[float]] = {}
    for it, v in curve:
        bins.setdefault(int((it - 1) // width), []).append(v)
    return {(b + 1) * width: float(np.mean(v)) for b, v in bins.items()}


def figures(data, out: str) -> None:
    """curves.png: per cell, every arm's binned training gold (mean over seeds, band of one standard error);
    gate.png: per cell, rgpo's rejected share and the share of ratios outside [0.5, 2]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(data)
    for name, arms, keys in (
        ("curves.png", mm.ARMS, ("gold",)),
        ("gate.png", ("rgpo",), ("rejected_frac", "outside_0.5_2")),
    ):
        cols = 4
        rows = max(1, math.ceil(len(cells) / cols))
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), sharex=True, squeeze=False)
        for ax, cell in zip(axes.flat, cells, strict=False):
            for arm in arms:
                for key in keys:
                    per_seed = [
                        _binned(r["curves"][key]) for r in data[cell].get(arm, []) if r["curves"][key]
                    ]
                    if not per_seed:
                        continue
                    steps = sorted(set.intersection(*(set(c) for c in per_seed)))
                    y = np.array([[c[t] for t in steps] for c in per_seed])
                    mean = y.mean(0)
                    se = y.std(0, ddof=1) / np.sqrt(len(y)) if len(y) > 1 else np.zeros_like(mean)
                    label = arm if len(keys) == 1 else key
                    ax.plot(steps, mean, label=f"{label} (n={len(y)})", lw=1)
                    ax.fill_between(steps, mean - se, mean + se, alpha=0.2)
            ax.set_title(cell, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in list(axes.flat)[len(cells) :]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        if handles:
            fig.legend(
                handles, [lab.split(" (n=")[0] for lab in labels], loc="lower center", ncol=8, fontsize=8
            )
        ylabel = "training gold (16 completions a step)" if name == "curves.png" else "share of tokens"
        fig.supylabel(ylabel, fontsize=9, x=0.002)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        fig.savefig(os.path.join(out, name), dpi=100)
        plt.close(fig)


def build(results: str = RESULTS, out: str = OUT) -> str:
    data, missing = load(results)
    tests = {cell: cell_tests(data, cell) for cell in data}
    hurt, changes = hurt_by_cell(data), change_from_control(data)
    md = report_md(data, missing, tests, hurt, changes)
    os.makedirs(out, exist_ok=True)
    figures(data, out)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "studies.json"), "w") as f:
        json.dump(plain({"missing": missing, "cells": tests, "hurt": hurt, "changes": changes}), f, indent=1)
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.rlhf_mismatch_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--out", default=OUT)
    a = p.parse_args(argv)
    print(build(a.results, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
