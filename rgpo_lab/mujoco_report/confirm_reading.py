"""What the confirmation report says: the provenance of the suite's runs and the status it allows (final,
interim, not final), and RULES.md's reading of the comparisons in words (the cause, the decoupling)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from rgpo_lab.mujoco_grid import CONFIRM_ENVS, SUITES
from rgpo_lab.mujoco_report.cells import fmt_interval, fmt_or_dash, fmt_p_or_dash
from rgpo_lab.mujoco_report.code_path import CodePathCheck, code_path_check
from rgpo_lab.mujoco_report.confirm_runs import COMPARISONS, LABELS, SUITE


def provenance(commits: dict) -> dict:
    """The suite's own runs grouped by the commits they ran at, each group's code path (True only if every
    commit of its runs is on the suite commit's), and the runs named whose code path is different or not
    checked; the reused runs (other suites') grouped by their commits, not checked against the suite
    commit (RULES.md's check of the new code against theirs stands for them)."""
    checks: dict[str, CodePathCheck] = {}
    own: dict[tuple, list] = {}
    reused: dict[tuple, Counter] = {}
    for run, cs in commits.items():
        if run.startswith(SUITE + "/"):
            own.setdefault(tuple(cs), []).append(run)
            for c in cs:
                if c not in checks:
                    checks[c] = code_path_check(c)
        else:
            reused.setdefault(tuple(cs), Counter())[run.split("/")[0]] += 1

    def combined(cs) -> bool | None:
        same = [checks[c].same for c in cs]
        return False if False in same else None if None in same else True

    groups = [
        {"commits": list(k), "runs": runs, "same": combined(k)}
        for k, runs in sorted(own.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]
    return {
        "own": groups,
        "checks": {c: {"same": ch.same, "notes": list(ch.notes)} for c, ch in sorted(checks.items())},
        "different": [r for g in groups if g["same"] is False for r in g["runs"]],
        "not_checked": [r for g in groups if g["same"] is None for r in g["runs"]],
        "reused": [
            {"commits": list(k), "runs": sum(v.values()), "suites": dict(sorted(v.items()))}
            for k, v in sorted(reused.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
        ],
    }


def status_of(missing: dict, prov: dict) -> tuple[str, str]:
    """The status line and the prefix of every reading: final only with every run of the suite finished and
    every one of its own runs on the suite commit's code path."""
    total = len(SUITES[SUITE])
    n_missing = sum(map(len, missing.values()))
    parts, why = [], []
    if n_missing:
        parts.append(f"INTERIM: {total - n_missing} of {total} runs finished")
        why.append("on an incomplete suite")
    bad = len(prov["different"]) + len(prov["not_checked"])
    if bad:
        parts.append(
            f"NOT FINAL: {bad} of the suite's own runs not confirmed on the suite commit's code path "
            f"({len(prov['different'])} different, {len(prov['not_checked'])} not checked; named under "
            "Provenance)"
        )
        why.append(f"with {bad} of the suite's own runs not confirmed on the suite commit's code path")
    if not parts:
        return "final", ""
    return "; ".join(parts), "Interim, " + " and ".join(why) + ": "


def _ns(c: dict, a: str, b: str) -> str:
    """The n per arm and environment and test (1)'s Holm p: '(n = 5 / 5 Walker2d-v4, ...; Holm p = x)'."""
    ns = ", ".join(
        f"{c['per_env'][e]['n_a']} / {c['per_env'][e]['n_b']} {e}" for e in CONFIRM_ENVS if e in c["per_env"]
    )
    return f"(n = {ns}, {LABELS[a]} / {LABELS[b]}; Holm p = {fmt_p_or_dash(c['aggregate']['p_holm'])})"


def cause(gate_verdict: str, controller_verdict: str) -> str:
    """RULES.md's attribution from the gate comparison's and the controller (PPO) comparison's test (1)
    verdicts: "gate" if decoupled RGPO is significantly above PPO + KL penalty; "controller" if PPO + KL
    penalty is significantly above decoupled PPO and the gate comparison is not significant (tested, no
    significant difference); "gate and controller" if both comparisons are significantly higher;
    "undetermined" otherwise (a gate comparison significantly lower or not tested included)."""
    gate = gate_verdict == "higher"
    ctl = controller_verdict == "higher"
    if gate and ctl:
        return "gate and controller"
    if gate:
        return "gate"
    if ctl and gate_verdict == "no significant difference":
        return "controller"
    return "undetermined"


def attribution_words(comparisons) -> str:
    """RULES.md's reading of family A and, if it confirms, the cause, from test (1)'s Holm verdicts."""
    byname = {name: (c, a, b) for (_, name, a, b), c in zip(COMPARISONS, comparisons, strict=True)}
    c, arm_a, arm_b = byname["more robust"]
    agg = c["aggregate"]
    if not np.isfinite(agg["p_holm"]):
        return "not tested (fewer than 2 runs in a cell)."
    head = (
        f"decoupled RGPO vs decoupled PPO at L = 8: normalised IQM {fmt_or_dash(agg['a'], 2)} vs "
        f"{fmt_or_dash(agg['b'], 2)}, difference {fmt_interval(agg)}, "
        f"Holm p = {fmt_p_or_dash(agg['p_holm'])}: "
    )
    if agg["verdict"] == "no significant difference":
        return (
            head + f"not confirmed: no significant difference {_ns(c, arm_a, arm_b)}; no cause is attributed."
        )
    if agg["verdict"] == "lower":
        return head + "refuted in the other direction: decoupled RGPO is significantly less robust."
    gate, ctl = byname["gate"][0]["aggregate"], byname["controller (PPO)"][0]["aggregate"]
    return head + (
        f"confirmed; cause: {cause(gate['verdict'], ctl['verdict'])} (gate: {LABELS['rgpo_dec']} vs "
        f"{LABELS['ppo_dec_kl']} {gate['verdict']}, Holm p = {fmt_p_or_dash(gate['p_holm'])}; controller: "
        f"{LABELS['ppo_dec_kl']} vs {LABELS['ppo_dec']} {ctl['verdict']}, "
        f"Holm p = {fmt_p_or_dash(ctl['p_holm'])})."
    )


def arm_seeds(variant: str) -> tuple[str, int]:
    """An arm's seeds as the suite lists them ('0-4') and its runs per method and environment (the most)."""
    runs = [r for r in SUITES[SUITE] if r.variant == variant]
    seeds = sorted({r.seed for r in runs})
    per_cell = Counter((r.method, r.env_id) for r in runs)
    words = f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else str(seeds)
    return words, max(per_cell.values())


def decoupling_words(comparisons) -> str:
    """RULES.md: "Decoupling is said to help a method where its decoupled arm is significantly above its
    plain arm" (test (1)'s Holm verdict of the method's decoupling comparison)."""
    byname = {name: (c, a, b) for (_, name, a, b), c in zip(COMPARISONS, comparisons, strict=True)}
    (seeds, n), (dec_seeds, dec_n) = arm_seeds("lag8"), arm_seeds("lag8_decoupled")
    parts = []
    for method in ("PPO", "RGPO"):
        c, a, b = byname[f"decoupling ({method})"]
        agg = c["aggregate"]
        numbers = f"normalised IQM difference {fmt_interval(agg)}, Holm p = {fmt_p_or_dash(agg['p_holm'])}"
        if agg["verdict"] == "higher":
            parts.append(f"decoupling helps {method} ({numbers})")
        elif agg["verdict"] == "lower":
            parts.append(
                f"decoupling does not help {method}: its decoupled arm is significantly below its plain arm "
                f"({numbers})"
            )
        elif agg["verdict"] == "no significant difference":
            parts.append(
                f"decoupling is not shown to help {method}: no significant difference {_ns(c, a, b)}"
            )
        else:
            parts.append(f"decoupling of {method} not tested (fewer than 2 runs in a cell)")
    return (
        f"{'; '.join(parts)}. The plain arms have seeds {seeds} only (n = {n} per environment), as the suite "
        f"lists them; the decoupled arms seeds {dec_seeds} (n = {dec_n})."
    )
