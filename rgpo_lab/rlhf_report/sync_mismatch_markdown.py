"""The synchronous mismatch study's report.md, one function per section."""

from __future__ import annotations

from rgpo_lab import rlhf_sync_mismatch as smm
from rgpo_lab.rlhf_report.mismatch_markdown import _f, _p
from rgpo_lab.rlhf_report.sync_mismatch_runs import GATE_ARMS
from rgpo_lab.statistics import mean_std

COMMAND = "python -m rgpo_lab.rlhf_report.sync_mismatch"


def _ms(m: dict, d: int = 3) -> str:
    """mean ± sd (n) of a `mean_std` dict; "-" without runs."""
    return "-" if not m["n"] else f"{_f(m['mean'], d)} ± {_f(m['std'], d)} ({m['n']})"


def header_lines(finished: int, total: int) -> list[str]:
    status = "final" if finished == total else f"INTERIM: {finished} of {total} runs finished"
    return [
        "# Sampler mismatch on the synchronous path: which correction?",
        "",
        f"Command: `{COMMAND}`. Rule: results/rlhf/v3/sync_mismatch/RULES.md (fixed before any run; "
        f"`python -m rgpo_lab.rlhf_sync_mismatch rule`). Status: **{status}**.",
        "",
    ]


def precheck_lines(pre: dict) -> list[str]:
    """The pre-check's table (precheck.json) and what the rule concludes from it."""
    sft = mean_std(pre["sft"])
    lines = [
        "## Pre-check: which cells can rank corrections",
        "",
        f"From precheck.json (seeds {', '.join(map(str, smm.PRECHECK_SEEDS))}, never reused); the SFT "
        f"policy's test gold {_f(sft.mean)} (n = {sft.n}).",
        "",
        *smm.precheck_table(pre),
        "",
    ]
    if pre["ranking_cells"]:
        cells = ", ".join(pre["ranking_cells"])
        lines.append(
            f"By the rule the ranking cells are {cells}: the primary family is each arm against rgpo on "
            "test gold, per seed the mean over these cells (Welch, Holm over the arms, both directions); "
            "each ranking cell is a secondary family; the other cells rank nothing."
        )
    else:
        lines.append(
            "By the rule the study **cannot rank corrections**: no cell has both an uncorrected arm hurt by "
            "the mismatch and an arm that learns above the SFT policy, so there is **no primary family**. "
            "The suite's cells are reported descriptively; their tests rank nothing."
        )
    return [*lines, ""]


def tuning_lines(selection: dict | None) -> list[str]:
    """Each arm's mean validation gold per rate (selection.json) and the chosen rate."""
    lines = ["## Tuning: each arm's learning rate (validation prompts only)", ""]
    if selection is None:
        return [
            *lines,
            "Not finished: no selection.json yet (`python -m rgpo_lab.rlhf_sync_mismatch select`).",
            "",
        ]
    rates = list(smm.TUNE_RATES)
    lines += [
        f"Cells {', '.join(selection['cells'])}, seeds {', '.join(map(str, smm.TUNE_SEEDS))}: mean "
        "validation gold over both cells and the seeds; the highest is chosen.",
        "",
        "| arm | " + " | ".join(rates) + " | chosen |",
        "|---|" + "---|" * (len(rates) + 1),
    ]
    for arm, gold in selection["gold"].items():
        chosen = selection["selected_lr"].get(arm) or "not finished"
        lines.append(f"| {arm} | " + " | ".join(_f(gold.get(r)) for r in rates) + f" | {chosen} |")
    return [*lines, ""]


def summary_lines(summary: dict, arms: tuple[str, ...]) -> list[str]:
    """Test gold and KL_ref per cell and arm."""
    lines = [
        "## Test gold and KL_ref per cell and arm (mean ± sd (n))",
        "",
        "| cell | quantity | " + " | ".join(arms) + " |",
        "|---|---|" + "---|" * len(arms),
    ]
    for cell, per_arm in summary.items():
        for key, name in (("gold", "test gold"), ("kl_ref", "KL_ref")):
            lines.append(f"| {cell} | {name} | " + " | ".join(_ms(per_arm[a][key]) for a in arms) + " |")
    return [*lines, ""]


def family_table(tests: dict) -> list[str]:
    lines = [
        "| arm | n (arm / rgpo) | gold - rgpo [95% CI] | p | Holm p | smallest detectable | KL_ref - rgpo "
        "| KL Holm p | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, r in tests.items():
        lo, hi = r["ci95"]
        lines.append(
            f"| {arm} | {r['n']} / {r['n_reference']} | {_f(r['gold_diff'])} [{_f(lo)}, {_f(hi)}] | "
            f"{_p(r['p'])} | {_p(r['p_holm'])} | {_f(r['smallest_detectable'])} | {_f(r['kl_ref_diff'])} | "
            f"{_p(r['kl_p_holm'])} | {r['words']} |"
        )
    return lines


def primary_lines(primary: dict | None) -> list[str]:
    lines = ["## Primary comparison: every arm against rgpo over the ranking cells", ""]
    if primary is None:
        return [*lines, "None: the pre-check found no ranking cell, so the rule has no primary family.", ""]
    lines += [
        f"Test gold per seed: the mean over {', '.join(primary['cells'])} (seeds finished in every one). "
        "Welch, Holm over the arms; a higher gold is a win only if that arm's KL_ref is not significantly "
        "higher (Holm within the family). Smallest detectable: power 0.8 at the first Holm step's level.",
        "",
        *family_table(primary["tests"]),
    ]
    return [*lines, ""]


def cell_lines(per_cell: dict, complete: bool) -> list[str]:
    lines = ["## Every arm against rgpo, per cell (Holm over the arms within the cell; matched KL)", ""]
    if not complete:
        lines += ["Interim: every test below is on the runs finished so far.", ""]
    for cell, f in per_cell.items():
        role = (
            "a ranking cell: the secondary family"
            if f["role"] == "secondary"
            else "not a ranking cell: descriptive, it ranks no correction"
        )
        lines += [f"**{cell}** ({role})", "", *family_table(f["tests"]), ""]
    return lines


def dose_lines() -> list[str]:
    return [
        "## Dose-response",
        "",
        "Test gold and KL_ref against the sampler's logit noise (0: the faithful fp32 sampler), per k and "
        "arm: the mean over seeds and a band of ± one sd (the numbers are the table above; "
        "verdicts.json `dose_response`): ![dose response](dose_response.png)",
        "",
    ]


def gate_lines(gate: dict, arms: tuple[str, ...]) -> list[str]:
    """Did the gate act: the gate arms' rejected share (first step of each batch, window) and kl_coef; the
    corrected arms' sampling/* ratios."""
    lines = [
        "## Did the gate act? (window: optimizer steps 305-400; mean ± sd (n) over seeds)",
        "",
        "rejected: share of tokens with g(r) < 0.1 (rgpo/rejected_frac); at the first optimizer step of a "
        "generation batch the decoupled gate's ratio pi / pi_old is 1.",
        "",
        "| cell | arm | rejected, first step of each batch | rejected, every step | kl_coef |",
        "|---|---|---|---|---|",
    ]
    for cell, per_arm in gate.items():
        for arm in (a for a in GATE_ARMS if a in arms):
            g = per_arm[arm]
            lines.append(
                f"| {cell} | {arm} | {_ms(g['first_step_rejected'])} | {_ms(g['rejected_frac'])} | "
                f"{_ms(g['kl_coef'], 4)} |"
            )
    lines += [
        "",
        "TRL's sampling/* (logged only by arms with its correction on; window means): importance ratio "
        "min / mean / max, mean |log-prob difference|.",
        "",
        "| cell | arm | ratio min | ratio mean | ratio max | logp difference |",
        "|---|---|---|---|---|---|",
    ]
    for cell, per_arm in gate.items():
        for arm in arms:
            g = per_arm[arm]
            if g["is_mean"]["n"]:
                keys = ("is_min", "is_mean", "is_max", "logp_diff")
                lines.append(f"| {cell} | {arm} | " + " | ".join(_ms(g[k]) for k in keys) + " |")
    return [*lines, ""]


def unfinished_lines(missing: list[str], failed: list[str], resumed: dict) -> list[str]:
    """Failed and unfinished runs per cell and arm (seeds), and the runs resumed from a checkpoint."""
    lines: list[str] = []
    if failed:
        lines += [f"## Failed ({len(failed)}: a Python error ended the run)", "", ", ".join(failed), ""]
    if missing:
        by: dict[tuple[str, str], list[str]] = {}
        for name in missing:
            _, arm, dose, k, seed = name.rsplit("/", 1)[1].split("__")
            by.setdefault((f"{dose}__{k}", arm), []).append(seed)
        lines += [f"## Not finished ({len(missing)}; every name in verdicts.json)", ""]
        lines += ["| cell | arm | runs not finished | seeds |", "|---|---|---|---|"]
        lines += [f"| {c} | {a} | {len(s)} | {', '.join(s)} |" for (c, a), s in by.items()]
        lines.append("")
    said = "; ".join(f"{n} (from {', '.join(cps)})" for n, cps in resumed.items()) or "none"
    return [*lines, f"Runs resumed from a checkpoint (run_info.json): {said}.", ""]
