"""The mismatch study's report.md, one function per section."""

from __future__ import annotations

import json
import os

import numpy as np

from rgpo_lab import rlhf_mismatch as mm
from rgpo_lab.rlhf_report.mismatch_figures import CURVE_BIN
from rgpo_lab.rlhf_report.mismatch_runs import CONTROL, values, window_mean, window_values
from rgpo_lab.rlhf_report.mismatch_verdicts import families
from rgpo_lab.statistics import mean_std


def _f(x, d=3) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{d}f}"


def _p(x) -> str:
    """3 decimals, 4 near the 0.05 threshold (so 0.0496 and 0.0504 do not both read 0.050)."""
    if x is None or not np.isfinite(x):
        return "-"
    if 0.04 <= x < 0.06:
        return f"{x:.4f}"
    return f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


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
    """report.md: its sections in order (the sensitivity section only when ``sens`` is given)."""
    lines = [
        *_header_lines(data, missing),
        *_gold_lines(data, hurt),
        *_vs_rgpo_lines(tests, hurt, diverged_runs, complete=not missing),
        *_vs_best_peer_lines(tests, hurt),
        *_gate_lines(data),
        *_weight_lines(data),
        *_change_lines(data, changes),
        *_unfinished_lines(missing, failed),
    ]
    if sens is not None:
        lines += ["", *sensitivity_lines(sens, tests)[:-1]]
    return "\n".join(lines) + "\n"


def _header_lines(data, missing) -> list[str]:
    """The title, the command and rule, the status (final or interim) and the positive control."""
    total = len(missing) + sum(len(v) for c in data.values() for v in c.values())
    status = "final" if not missing else f"INTERIM: {total - len(missing)} of {total} runs finished"
    return [
        "# Sampler mismatch and staleness: which correction, and did RGPO's gate act?",
        "",
        f"Command: `python -m rgpo_lab.rlhf_mismatch_report`. Rule: results/rlhf/v3/mismatch/RULES.md "
        f"(interpretations fixed before the final reading: INTERPRETATION.md). Status: **{status}**.",
        "",
        _precheck_line(),
        "",
    ]


def _gold_lines(data, hurt) -> list[str]:
    """Test gold per cell and arm with whether ignore is hurt, the Holm families, the curves figure."""
    lines = [
        "## Test gold per cell and arm (mean ± std (n); after the semicolon the mean test KL_ref)",
        "",
        "| cell | " + " | ".join(mm.ARMS) + " | ignore hurt vs fp32 (Holm p) |",
        "|---|" + "---|" * (len(mm.ARMS) + 1),
    ]
    for cell in data:
        cells = []
        for arm in mm.ARMS:
            g, k = mean_std(values(data, cell, arm)), mean_std(values(data, cell, arm, "kl_ref"))
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
    ]
    return lines


def _vs_rgpo_lines(tests, hurt, diverged_runs, complete: bool) -> list[str]:
    """Per cell: every arm against rgpo (gold, matched KL_ref), rgpo against the best peer, diverged runs."""
    lines = ["## Every arm against rgpo, per cell (gold difference, Holm within the cell; matched KL)", ""]
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
    return lines


def _gate_lines(data) -> list[str]:
    """Did the gate act: the mismatch shares and rgpo's rejected share and kl_coef per cell."""
    lines = [
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
    return lines


def _weight_lines(data) -> list[str]:
    """The corrections' weights per cell and arm (window means)."""
    lines = [
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
            row.append("; ".join(_f(window_mean(runs, k), 2) for k in keys))
        lines.append(f"| {cell} | " + " | ".join(row) + " |")
    return lines


def _change_lines(data, changes) -> list[str]:
    """Each arm's change of gold from the fp32 cell (Welch, Holm p)."""
    lines = ["", "## Each arm's change of gold from the fp32 cell (Holm over each suite's cells)", ""]
    cells = [c for c in data if c != CONTROL]
    lines.append("| arm | " + " | ".join(cells) + " |")
    lines.append("|---|" + "---|" * len(cells))
    for arm, per in changes.items():
        lines.append(
            f"| {arm} | " + " | ".join(f"{_f(per[c]['diff'])} ({_p(per[c]['p_holm'])})" for c in cells) + " |"
        )
    return lines


def _unfinished_lines(missing: list[str], failed: list[str]) -> list[str]:
    """The failed runs and the runs not finished (nothing once every run finished)."""
    lines: list[str] = []
    if failed:
        lines += ["", f"## Failed ({len(failed)}: a Python error ended the run; not replaced)", ""]
        lines += [", ".join(failed)]
    if missing:
        lines += ["", f"## Not finished ({len(missing)}; every name in studies.json)", ""]
        lines += _missing_summary(missing)
    return lines


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
    x = window_values(runs, key)
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
