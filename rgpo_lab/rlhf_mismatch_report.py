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
from rgpo_lab.results_data import open_metrics
from rgpo_lab.statistics import holm, mean_std, smallest_detectable_difference, verdict, welch

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
    "outside_0.9_1.1": "mismatch/outside_0.9_1.1",
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
    metrics = open_metrics(d)
    if metrics is not None:
        with metrics as f:
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
        "resumed_from": resumed_from(d),
    }


def resumed_from(d: str) -> list[str]:
    """The checkpoints a run was resumed from: run_info.json has one entry per launch, and the suite runner
    resumes a launch with --resume_from_checkpoint (empty for a run launched once, or without run_info)."""
    path = os.path.join(d, "run_info.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        launches = json.load(f)
    out = []
    for launch in launches if isinstance(launches, list) else [launches]:
        command = launch.get("command", [])
        out += [
            os.path.basename(command[i + 1])
            for i, arg in enumerate(command[:-1])
            if arg == "--resume_from_checkpoint"
        ]
    return out


LAG_SUITE_CELLS = ("lag8", "lag32")  # v3/mismatch_lag's cells; the others are v3/mismatch's


def _failed(d: str) -> bool:
    """A run folder without heldout.json whose run.log ends in a Python error: it stopped, it is not running
    or waiting to resume."""
    log = os.path.join(d, "run.log")
    if not os.path.exists(log):
        return False
    with open(log, errors="replace") as f:
        tail = f.read()[-20000:]
    return "Traceback (most recent call last)" in tail


def load(results: str = RESULTS) -> tuple[dict, list[str], list[str]]:
    """{cell: {arm: [run per seed]}} of both suites, the runs not finished (suite/name) and, among them, those
    that failed (a Python error ends their run.log)."""
    from rgpo_lab.rlhf_suite import SUITE_BUILDERS

    data: dict = {}
    missing, failed = [], []
    for suite in ("v3/mismatch", "v3/mismatch_lag"):
        for r in SUITE_BUILDERS[suite](results):
            arm, cell = r.tag.split("__")
            d = os.path.join(results, suite, r.name)
            run = read_run(d)
            if run is None:
                missing.append(f"{suite}/{r.name}")
                if _failed(d):
                    failed.append(f"{suite}/{r.name}")
                continue
            data.setdefault(cell, {}).setdefault(arm, []).append({"seed": r.seed, **run})
    return data, missing, failed


def diverged(data) -> dict[str, list[str]]:
    """Per cell, the runs whose test KL_ref exceeds 10x the mean of the same arm at fp32 (the pre-check's
    divergence threshold), as "arm s<seed>"; they stay in every test (their gold is finite) and are named."""
    out = {}
    for cell, arms in data.items():
        if cell == CONTROL:
            continue
        names = []
        for arm, runs in arms.items():
            control = _values(data, CONTROL, arm, "kl_ref")
            if not control:
                continue
            limit = 10 * float(np.mean(control))
            names += [f"{arm} s{r['seed']}" for r in runs if r["kl_ref"] is not None and r["kl_ref"] > limit]
        if names:
            out[cell] = names
    return out


def families(data) -> list[list[str]]:
    """The Holm families of the across-cell tests (ignore hurt, each arm's change from fp32): each suite's
    cells apart (v3/mismatch's, then v3/mismatch_lag's), the control shared (INTERPRETATION.md)."""
    cells = [c for c in data if c != CONTROL]
    return [[c for c in cells if c not in LAG_SUITE_CELLS], [c for c in cells if c in LAG_SUITE_CELLS]]


def _values(data, cell, arm, key="gold") -> list[float]:
    return [r[key] for r in data.get(cell, {}).get(arm, []) if r[key] is not None]


def cell_tests(data, cell: str) -> dict:
    """Every arm against rgpo on test gold (Holm within the cell), the matched-KL condition (Welch on KL_ref,
    Holm within the cell), the best peer."""
    peers = {a: np.mean(_values(data, cell, a)) for a in mm.PEERS if _values(data, cell, a)}
    rows = {
        a: {
            "n": r["n"],
            "n_rgpo": r["n_reference"],
            "gold_diff_vs_rgpo": r["gold_diff"],
            "p": r["p"],
            "p_holm": r["p_holm"],
            "kl_ref_diff_vs_rgpo": r["kl_ref_diff"],
            "kl_p_holm": r["kl_p_holm"],
            "verdict": r["verdict"],
        }
        for a, r in against(data, cell, "rgpo").items()
    }
    best = max(peers.values()) if peers else None
    tied = [a for a in peers if peers[a] == best]
    peer = tied[0] if tied else None
    return {
        "vs_rgpo": rows,
        "best_peer": peer,
        "best_peer_tied_with": tied[1:],
        "vs_best_peer": {} if peer is None else against(data, cell, peer),
    }


def against(data, cell: str, reference: str) -> dict:
    """Every other arm against ``reference`` on test gold (Welch, Holm over these comparisons in the cell)
    with the matched-KL condition (Welch on KL_ref, Holm likewise): the issue's "every arm against the best
    peer" (INTERPRETATION.md, 6), a family of its own beside the vs-rgpo one."""
    arms = [a for a in mm.ARMS if a != reference]
    ref_gold, ref_kl = _values(data, cell, reference), _values(data, cell, reference, "kl_ref")
    gold = {a: welch(_values(data, cell, a), ref_gold) for a in arms}
    kl = {a: welch(_values(data, cell, a, "kl_ref"), ref_kl) for a in arms}
    gold_holm = dict(zip(arms, holm([gold[a].p for a in arms]), strict=True))
    kl_holm = dict(zip(arms, holm([kl[a].p for a in arms]), strict=True))
    return {
        a: {
            "n": len(_values(data, cell, a)),
            "n_reference": len(ref_gold),
            "gold_diff": gold[a].diff,
            "p": gold[a].p,
            "p_holm": gold_holm[a],
            "kl_ref_diff": kl[a].diff,
            "kl_p_holm": kl_holm[a],
            "verdict": matched_kl_words(a, gold[a].diff, gold_holm[a], kl[a].diff, kl_holm[a], reference),
        }
        for a in arms
    }


def matched_kl_words(
    arm: str, gold_diff: float, p_holm: float, kl_diff: float, kl_holm: float, reference: str = "rgpo"
) -> str:
    """The rule's words for arm against the reference (rgpo unless named): "rgpo higher / lower than <arm>"
    after Holm, a significant gold difference whose winner has a significantly higher KL_ref "<winner> higher
    gold at a higher KL_ref: undecided", and a win whose KL_ref cannot be tested (fewer than 2 values a side)
    undecided too."""
    words = verdict(gold_diff, p_holm)
    if words not in ("higher", "lower"):
        return words
    winner = arm if words == "higher" else reference
    if not np.isfinite(kl_holm):
        return f"{winner} higher gold, KL_ref not testable: undecided"
    if kl_holm <= 0.05 and (kl_diff > 0) == (winner == arm):
        return f"{winner} higher gold at a higher KL_ref: undecided"
    return f"{reference} {'lower' if words == 'higher' else 'higher'} than {arm}"


def hurt_by_cell(data) -> dict:
    """Is ignore hurt in each cell (gold below ignore at fp32, Welch, Holm over each suite's cells)?
    ``state``: hurt, not hurt, or not tested (fewer than 2 finished runs a side); ``n``: ignore's runs in the
    cell and at fp32."""
    out = {}
    for cells in families(data):
        tests = {c: welch(_values(data, c, "ignore"), _values(data, CONTROL, "ignore")) for c in cells}
        adjusted = dict(zip(cells, holm([tests[c].p for c in cells]), strict=True))
        for c in cells:
            tested = bool(np.isfinite(adjusted[c]))
            ranks = tested and adjusted[c] <= 0.05 and tests[c].diff < 0
            out[c] = {
                "diff": tests[c].diff,
                "p_holm": adjusted[c],
                "ranks": bool(ranks),
                "state": "hurt" if ranks else ("not hurt" if tested else "not tested"),
                "n": [len(_values(data, c, "ignore")), len(_values(data, CONTROL, "ignore"))],
                "family": cells,
            }
    return out


def change_from_control(data) -> dict:
    """Per arm, gold in each cell minus gold at fp32 (Welch, Holm over each suite's cells)."""
    out: dict = {arm: {} for arm in mm.ARMS}
    for cells in families(data):
        for arm in mm.ARMS:
            tests = {c: welch(_values(data, c, arm), _values(data, CONTROL, arm)) for c in cells}
            adjusted = holm([tests[c].p for c in cells])
            for c, p in zip(cells, adjusted, strict=True):
                out[arm][c] = {"diff": tests[c].diff, "p_holm": p, "verdict": verdict(tests[c].diff, p)}
    return out


def _f(x, d=3) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{d}f}"


def _p(x) -> str:
    """3 decimals, 4 near the 0.05 threshold (so 0.0496 and 0.0504 do not both read 0.050)."""
    if x is None or not np.isfinite(x):
        return "-"
    if 0.04 <= x < 0.06:
        return f"{x:.4f}"
    return f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


def _window_values(runs, key) -> list[float]:
    return [r["window"][key] for r in runs if r["window"].get(key) is not None]


def _window_mean(runs, key) -> float | None:
    x = _window_values(runs, key)
    return float(np.mean(x)) if x else None


def _missing_summary(missing: list[str]) -> list[str]:
    """The unfinished runs as one line per suite and cell: how many, which seeds."""
    by_cell: dict[tuple[str, str], list[str]] = {}
    for name in missing:
        suite, run = name.rsplit("/", 1)
        parts = run.split("__")
        by_cell.setdefault((suite, parts[2]), []).append(parts[3])
    lines = ["| suite | cell | runs not finished | seeds |", "|---|---|---|---|"]
    for (suite, cell), seeds in by_cell.items():
        lines.append(f"| {suite} | {cell} | {len(seeds)} | {', '.join(sorted(set(seeds)))} |")
    return lines


def _precheck_line() -> str:
    path = os.path.join(mm.OUT, "precheck.json")
    if not os.path.exists(path):
        return "Positive control: no precheck.json."
    with open(path) as f:
        pre = json.load(f)
    if not pre.get("complete"):
        return "Positive control (precheck.md): not complete."
    hurt_at = pre.get("hurt_at")
    if hurt_at is None:
        return "Positive control (precheck.md): no rung hurt ignore, so no cell can rank the corrections."
    return (
        f"Positive control (precheck.md): passed, ignore hurt at sigma {hurt_at:g} (n = 3 a side), which "
        f"joined the suite as cell sigma{hurt_at:g}."
    )


def _ignore_higher(h: dict) -> bool:
    """Not hurt because ignore's gold is significantly *above* its fp32 gold: said in words, so the small Holm
    p beside "not hurt" is not read as nearly hurt."""
    return h["state"] == "not hurt" and h["p_holm"] <= 0.05 and h["diff"] > 0


def _ranks(cell: str, hurt: dict) -> bool:
    """Whether the cell may rank the corrections (ignore hurt there; never the control)."""
    return cell != CONTROL and hurt.get(cell, {}).get("ranks", False)


def _cell_note(cell: str, hurt: dict, complete: bool) -> str:
    """Whether the cell can rank the corrections (only where ignore is hurt: the rule), in words."""
    if cell == CONTROL:
        return "the control: this cell cannot rank the corrections"
    h = hurt.get(cell, {"state": "not tested", "n": [0, 0]})
    n = f"n = {h['n'][0]} vs {h['n'][1]}" if complete else f"interim; n = {h['n'][0]} vs {h['n'][1]}"
    if h["state"] == "hurt":
        return f"ignore is hurt here ({n}, Holm p = {_p(h['p_holm'])}): this cell ranks the corrections"
    if h["state"] == "not hurt":
        p_holm = _p(h["p_holm"])
        higher = ", its gold higher" if _ignore_higher(h) else ""
        cannot = "this cell cannot rank the corrections"
        return f"ignore is not hurt here{higher} ({n}, Holm p = {p_holm}): {cannot}"
    return f"whether ignore is hurt is not tested yet ({n}; fewer than 2 finished runs a side)"


def report_md(data, missing, failed, tests, hurt, changes, diverged_runs, sens: dict | None = None) -> str:
    total = len(missing) + sum(len(v) for c in data.values() for v in c.values())
    status = "final" if not missing else f"INTERIM: {total - len(missing)} of {total} runs finished"
    complete = not missing
    lines = [
        "# Sampler mismatch and staleness: which correction, and did RGPO's gate act?",
        "",
        f"Command: `python -m rgpo_lab.rlhf_mismatch_report`. Rule: results/rlhf/v3/mismatch/RULES.md "
        f"(interpretations fixed before the final reading: INTERPRETATION.md). Status: **{status}**.",
        "",
        _precheck_line(),
        "",
        "## Test gold per cell and arm (mean ± std (n); after the semicolon the mean test KL_ref)",
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
        if h is None:
            hurt_cell = "control"
        else:
            state = "not hurt: higher" if _ignore_higher(h) else h["state"]
            hurt_cell = f"{state} ({_p(h['p_holm'])})"
        lines.append(f"| {cell} | " + " | ".join(cells) + f" | {hurt_cell} |")
    fam = [f for f in families(data) if f]
    lines += [
        "",
        "Holm families of the across-cell tests (ignore hurt; each arm's change from fp32): "
        + "; ".join("{" + ", ".join(f) + "}" for f in fam)
        + " (each suite's cells, the fp32 control shared).",
        "",
        "Training gold per step (the gold reward of the step's 16 completions; every arm, the mean over "
        f"seeds and a band of one standard error, {CURVE_BIN}-step bins): ![curves](curves.png)",
        "",
        "## Every arm against rgpo, per cell (gold difference, Holm within the cell; matched KL)",
        "",
    ]
    if not complete:
        lines += ["Interim: every verdict below is on the runs finished so far (n = arm / rgpo).", ""]
    for cell, t in tests.items():
        peer = t["best_peer"]
        tie = f" (tied with {', '.join(t['best_peer_tied_with'])})" if t.get("best_peer_tied_with") else ""
        lines.append(f"**{cell}** ({_cell_note(cell, hurt, complete)}); best peer: {peer}{tie}")
        lines.append("")
        lines.append("| arm | n (arm / rgpo) | gold - rgpo | Holm p | KL_ref - rgpo | KL Holm p | verdict |")
        lines.append("|---|---|---|---|---|---|---|")
        for arm, r in t["vs_rgpo"].items():
            lines.append(
                f"| {arm} | {r['n']} / {r['n_rgpo']} | {_f(r['gold_diff_vs_rgpo'])} | {_p(r['p_holm'])} | "
                f"{_f(r['kl_ref_diff_vs_rgpo'])} | {_p(r['kl_p_holm'])} | {r['verdict']} |"
            )
        if peer is not None:
            prefix = "" if _ranks(cell, hurt) else "(this cell does not rank the corrections) "
            lines += [
                "",
                f"{prefix}rgpo against the best peer ({peer}): {_against_peer(peer, t['vs_rgpo'][peer])}.",
            ]
        if cell in diverged_runs:
            lines += [
                "",
                f"Diverged (test KL_ref above 10x the arm's fp32 mean): {', '.join(diverged_runs[cell])}.",
            ]
        lines.append("")
    lines += _vs_best_peer_lines(tests, hurt)
    lines += [
        "## Did the gate act? (rgpo's runs, window means over steps 305-400: mean ± std (n))",
        "",
        "rejected: share of tokens with g(r) < 0.1 at the step's forward (at lag 1, before the step's "
        f"update); along training ({CURVE_BIN}-step bins) in ![gate](gate.png)",
        "",
        "| cell | outside [0.9, 1.1] | outside [0.5, 2] | below rejection | rgpo rejected | rgpo kl_coef |",
        "|---|---|---|---|---|---|",
    ]
    for cell in data:
        rg = data[cell].get("rgpo", [])
        keys = ("outside_0.9_1.1", "outside_0.5_2", "below_rejection", "rejected_frac", "kl_coef")
        lines.append(f"| {cell} | " + " | ".join(_window_spread(rg, k) for k in keys) + " |")
    lines += [
        "",
        "## The corrections' weights (window means: mean weight; each step's largest weight; share of zero "
        "weights)",
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
    lines += ["", "## Each arm's change of gold from the fp32 cell (Holm over each suite's cells)", ""]
    cells = [c for c in data if c != CONTROL]
    lines.append("| arm | " + " | ".join(cells) + " |")
    lines.append("|---|" + "---|" * len(cells))
    for arm, per in changes.items():
        lines.append(
            f"| {arm} | " + " | ".join(f"{_f(per[c]['diff'])} ({_p(per[c]['p_holm'])})" for c in cells) + " |"
        )
    if failed:
        lines += ["", f"## Failed ({len(failed)}: a Python error ended the run; not replaced)", ""]
        lines += [", ".join(failed)]
    if missing:
        lines += ["", f"## Not finished ({len(missing)}; every name in studies.json)", ""]
        lines += _missing_summary(missing)
    if sens is not None:
        lines += ["", *sensitivity_lines(sens, tests)[:-1]]
    return "\n".join(lines) + "\n"


def _vs_best_peer_lines(tests, hurt) -> list[str]:
    """Per cell, every arm's gold minus the best peer's (Holm p), the verdicts that are not "no significant
    difference", and the arms not tested yet."""
    arms = list(mm.ARMS)
    lines = [
        "## Every arm against the best peer, per cell (gold difference (Holm p), Holm within the cell; "
        "matched KL)",
        "",
        "The best peer is the peer arm (ignore, ppo_clip, tis, icepop, seq_mask) with the highest mean gold "
        "in the cell, so it is picked after the fact: the other peers' differences lean negative by "
        "construction.",
        "",
        "| cell | best peer | " + " | ".join(arms) + " | verdicts |",
        "|---|---|" + "---|" * (len(arms) + 1),
    ]
    for cell, t in tests.items():
        peer, rows = t["best_peer"], t.get("vs_best_peer", {})
        if peer is None:
            continue
        entries = [
            "(best peer)" if a == peer else f"{_f(rows[a]['gold_diff'])} ({_p(rows[a]['p_holm'])})"
            for a in arms
        ]
        said = [
            r["verdict"]
            for r in rows.values()
            if r["verdict"] != "no significant difference" and not r["verdict"].startswith("not tested")
        ]
        untested = [a for a, r in rows.items() if r["verdict"].startswith("not tested")]
        if untested:
            said.append(f"not tested (fewer than 2 runs a side): {', '.join(untested)}")
        note = "" if _ranks(cell, hurt) else " (cell does not rank)"
        lines.append(
            f"| {cell}{note} | {peer} | " + " | ".join(entries) + f" | {'; '.join(said) or 'none'} |"
        )
    return [*lines, ""]


SENSITIVITY_DATE = "2026-11-28"  # when the sensitivity section was added: after the final reading (issue 55)
POWER = 0.8  # of the smallest detectable differences


def sensitivity(data, tests) -> dict:
    """Added after the final reading (issue 55), never decisive: every gate arm's rejected share; the
    smallest gold difference each test could detect (`smallest_detectable_difference` at POWER, two-sided,
    at alpha 0.05 / m, m the size of its Holm family) for each arm's change from fp32 and for every arm
    against the cell's best peer; the runs resumed from a checkpoint."""
    changes = {}
    for cells in families(data):
        for arm in mm.ARMS:
            for c in cells:
                changes.setdefault(arm, {})[c] = smallest_detectable_difference(
                    _values(data, c, arm), _values(data, CONTROL, arm), 0.05 / len(cells), POWER
                )
    vs_peer = {}
    for cell, t in tests.items():
        peer = t["best_peer"]
        if peer is None:
            continue
        others = [a for a in mm.ARMS if a != peer]
        vs_peer[cell] = {
            a: smallest_detectable_difference(
                _values(data, cell, a), _values(data, cell, peer), 0.05 / len(others), POWER
            )
            for a in others
        }
    gate_arms = [a for a in mm.ARMS if a.startswith("rgpo")]
    return {
        "added": SENSITIVITY_DATE,
        "power": POWER,
        "rejected": {
            cell: {a: _window_values(data[cell].get(a, []), "rejected_frac") for a in gate_arms}
            for cell in data
        },
        "detectable_change_from_control": changes,
        "detectable_vs_best_peer": vs_peer,
        "resumed": {
            f"{arm} {cell} s{r['seed']}": r["resumed_from"]
            for cell, arms in data.items()
            for arm, runs in arms.items()
            for r in runs
            if r.get("resumed_from")
        },
    }


def sensitivity_lines(sens: dict, tests) -> list[str]:
    """The sensitivity section of report.md, labelled as added after the final reading."""
    gate_arms = list(next(iter(sens["rejected"].values()), {}))
    lines = [
        f"## Sensitivity (added {sens['added']}, after the final reading; not in RULES.md, decides nothing)",
        "",
        "Added after an independent audit (issue 55), once the report above was final; these lines change no "
        "verdict above.",
        "",
        "Rejected share of every gate arm (tokens with g(r) < 0.1 at the step's forward, window means over "
        "steps 305-400: mean ± std (n)); the table above gives rgpo's alone:",
        "",
        "| cell | " + " | ".join(gate_arms) + " |",
        "|---|" + "---|" * len(gate_arms),
    ]
    for cell, per_arm in sens["rejected"].items():
        cells = []
        for a in gate_arms:
            m = mean_std(per_arm[a])
            cells.append("-" if not m.n else f"{_f(m.mean)} ± {_f(m.std)} ({m.n})")
        lines.append(f"| {cell} | " + " | ".join(cells) + " |")
    power = f"{sens['power']:.0%}"
    lines += [
        "",
        f"Smallest detectable gold difference: the smallest true difference a test detects with {power} "
        "power (two-sided Welch at 0.05 / m, m its Holm family's size, the first Holm step; the noncentral t "
        "with Welch's degrees of freedom, the observed standard deviations and n taken as true). A "
        '"no significant difference" rules out only differences well above it.',
        "",
        "Each arm's change of gold from the fp32 cell (m = the suite's cells):",
        "",
    ]
    change = sens["detectable_change_from_control"]
    cells = list(next(iter(change.values()), {}))
    lines += ["| arm | " + " | ".join(cells) + " |", "|---|" + "---|" * len(cells)]
    for arm, per in change.items():
        lines.append(f"| {arm} | " + " | ".join(_f(per[c]) for c in cells) + " |")
    lines += ["", "Every arm against the cell's best peer (m = 7):", ""]
    arms = list(mm.ARMS)
    lines += ["| cell | best peer | " + " | ".join(arms) + " |", "|---|---|" + "---|" * len(arms)]
    for cell, per in sens["detectable_vs_best_peer"].items():
        peer = tests[cell]["best_peer"]
        entries = ["(best peer)" if a == peer else _f(per[a]) for a in arms]
        lines.append(f"| {cell} | {peer} | " + " | ".join(entries) + " |")
    resumed = sens["resumed"]
    lines += [
        "",
        f"Runs resumed from a checkpoint after an interruption ({len(resumed)}; run_info.json lists each "
        "launch): "
        + ("; ".join(f"{name} (from {', '.join(cps)})" for name, cps in resumed.items()) or "none")
        + ".",
        "",
    ]
    return lines


def _window_spread(runs, key) -> str:
    x = _window_values(runs, key)
    if not x:
        return "-"
    m = mean_std(x)
    return f"{_f(m.mean)} ± {_f(m.std)} ({m.n})"


def _against_peer(peer: str, r: dict) -> str:
    """The vs-rgpo row of the best peer, with the numbers from rgpo's side."""
    numbers = (
        f"(gold {_f(-r['gold_diff_vs_rgpo'])}, n = {r['n_rgpo']} / {r['n']}, Holm p = {_p(r['p_holm'])})"
    )
    words = r["verdict"]
    if words.startswith("not tested"):
        return words
    return f"{words} {numbers}"


def _binned(curve, width=CURVE_BIN) -> dict[int, float]:
    bins: dict[int, list[float]] = {}
    for it, v in curve:
        bins.setdefault(int((it - 1) // width), []).append(v)
    return {(b + 1) * width: float(np.mean(v)) for b, v in bins.items()}


def figures(data, out: str) -> None:
    """curves.png: per cell, every arm's binned training gold (mean over seeds, band of one standard error);
    gate.png: per cell, rgpo's rejected share and the shares of ratios outside [0.5, 2] and [0.9, 1.1]. Each
    arm / series keeps one colour in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(data)
    for name, arms, keys in (
        ("curves.png", mm.ARMS, ("gold",)),
        ("gate.png", ("rgpo",), ("rejected_frac", "outside_0.5_2", "outside_0.9_1.1")),
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
                    colour = f"C{(list(arms).index(arm) if len(keys) == 1 else keys.index(key)) % 10}"
                    ax.plot(steps, mean, label=label, lw=1, color=colour)
                    ax.fill_between(steps, mean - se, mean + se, alpha=0.2, color=colour)
            ax.set_title(cell, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in list(axes.flat)[len(cells) :]:
            ax.axis("off")
        series = list(arms) if len(keys) == 1 else list(keys)
        handles = [
            matplotlib.lines.Line2D([], [], color=f"C{i % 10}", label=label) for i, label in enumerate(series)
        ]
        fig.legend(handles=handles, loc="lower center", ncol=8, fontsize=8)
        ylabel = "training gold (16 completions a step)" if name == "curves.png" else "share of tokens"
        fig.supylabel(ylabel, fontsize=9, x=0.002)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        fig.savefig(os.path.join(out, name), dpi=100)
        plt.close(fig)


def build(results: str = RESULTS, out: str = OUT) -> str:
    data, missing, failed = load(results)
    tests = {cell: cell_tests(data, cell) for cell in data}
    hurt, changes, diverged_runs = hurt_by_cell(data), change_from_control(data), diverged(data)
    sens = sensitivity(data, tests)
    md = report_md(data, missing, failed, tests, hurt, changes, diverged_runs, sens)
    os.makedirs(out, exist_ok=True)
    figures(data, out)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "studies.json"), "w") as f:
        status = "final" if not missing else "interim"
        summary = {
            "status": status,
            "missing": missing,
            "failed": failed,
            "diverged": diverged_runs,
            "families": families(data),
            "cells": tests,
            "hurt": hurt,
            "changes": changes,
            "sensitivity": sens,
        }
        json.dump(plain(summary), f, indent=1, allow_nan=False)
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
