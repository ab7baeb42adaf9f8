"""The confirmation report's report.md, one function per section, in the order `report_md` writes them;
each section is a list of lines, and the sections are written one blank line apart."""

from __future__ import annotations

import numpy as np

from rgpo_lab.mujoco_grid import CONFIRM_ENVS
from rgpo_lab.mujoco_report.cells import fmt_interval, fmt_or_dash, fmt_p_or_dash, paragraph
from rgpo_lab.mujoco_report.code_path import SUITE_COMMIT
from rgpo_lab.mujoco_report.confirm_reading import attribution_words, decoupling_words, status_of
from rgpo_lab.mujoco_report.confirm_runs import ARMS, COMPARISONS, LABELS, MISSING_CLASSES, Suite
from rgpo_trl.core.gates import LOG_RATIO_CLAMP

# the gate-activity table's columns: (gate_activity's key, decimals)
GATE_COLUMNS = (
    ("start_ratio_beyond_1.2", 3),
    ("start_ratio_beyond_2", 3),
    ("start_ratio_max", 2),
    ("start_rejected_frac", 3),
    ("rejected_frac", 3),
    ("ratio_max", 2),
    ("behaviour_ratio_beyond_2", 3),
    ("is_weight_truncated_frac", 3),
    ("kl_coef", 3),
    ("epochs", 2),
)


def report_md(
    suite: Suite, tables, comparisons, ret, gates, poi, prov, n_boot: int, sens: dict | None = None
) -> str:
    status, prefix = status_of(suite.missing, prov)
    interim = "interim: " if status != "final" else ""
    sections = [
        header_md(status),
        arms_md(tables),
        comparisons_md(comparisons, interim, prefix, n_boot),
        improvement_md(poi),
        retention_md(ret),
        gate_activity_md(gates),
        provenance_md(prov),
        not_finished_md(suite),
        curves_md(),
        sensitivity_md(sens, comparisons) if sens is not None else [],
    ]
    return "\n".join(line for section in sections if section for line in [*section, ""]) + "\n"


def header_md(status: str) -> list[str]:
    return [
        "# Policy lag confirmed or refuted (policy_lag_confirm)",
        "",
        "Command: `python -m rgpo_lab.mujoco_confirm_report`. Rule: "
        "results/mujoco/policy_lag_confirm/RULES.md (committed before the runs). "
        f"Status: **{status}**.",
    ]


def arms_md(tables: dict) -> list[str]:
    """Per arm and environment: raw mean ± std (n); normalised IQM; optimality gap; and pooled."""
    lines = [
        "## Evaluation return at 1M steps: the L = 8 arms and the L = 0 baselines (raw mean ± std (n); "
        "normalised IQM; Secondary: optimality gap)",
        "",
        "| arm | " + " | ".join(CONFIRM_ENVS) + " | pooled IQM | Secondary: pooled gap |",
        "|---|" + "---|" * (len(CONFIRM_ENVS) + 2),
    ]
    for arm in ARMS:
        t = tables[arm]
        cells = [
            f"{fmt_or_dash(t[e]['mean'], 0)} ± {fmt_or_dash(t[e]['std'], 0)} ({t[e]['n']}); "
            f"{fmt_or_dash(t[e]['iqm_norm'], 2)}; {fmt_or_dash(t[e]['gap'], 2)}"
            for e in CONFIRM_ENVS
        ]
        pooled = t["pooled"]
        lines.append(
            f"| {LABELS[arm]} | "
            + " | ".join(cells)
            + f" | {fmt_or_dash(pooled['iqm_norm'], 2)} | {fmt_or_dash(pooled['gap'], 2)} |"
        )
    return lines


def _only(envs: list[str]) -> str:
    """' (only Hopper-v4, ...)' where an aggregate leaves environments out; empty otherwise."""
    return "" if len(envs) == len(CONFIRM_ENVS) else f" (only {', '.join(envs) or 'none'})"


def comparisons_md(comparisons, interim: str, prefix: str, n_boot: int) -> list[str]:
    """RULES.md's tests, how the rule is applied, and its reading and decoupling sentences."""
    lines = [
        "## Comparisons (a - b; normalised IQM difference with 95% stratified-bootstrap interval, Welch per "
        "environment on raw returns; Holm over the four tests of each row)",
        "",
    ]
    if interim:
        lines += ["Interim (see the status above): every verdict in this table is provisional.", ""]
    lines += [
        "| family | question | a vs b | IQM diff [95%] | Holm p | verdict | "
        + " | ".join(f"{e}: diff, Holm p, verdict" for e in CONFIRM_ENVS)
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(CONFIRM_ENVS),
    ]
    for (family, name, a, b), c in zip(COMPARISONS, comparisons, strict=True):
        agg, per_env = c["aggregate"], c["per_env"]
        env_cells = [
            f"{fmt_or_dash(d['diff'], 0)}, {fmt_p_or_dash(d['p_holm'])}, {d['verdict']}"
            for d in (per_env[e] for e in CONFIRM_ENVS)
        ]
        lines.append(
            f"| {family} | {name} | {LABELS[a]} vs {LABELS[b]} | {fmt_or_dash(agg['diff'], 2)}"
            f"{_only(agg['envs'])} [{fmt_or_dash(agg['low'], 2)}, {fmt_or_dash(agg['high'], 2)}] | "
            f"{fmt_p_or_dash(agg['p_holm'])} | {interim}{agg['verdict']} | " + " | ".join(env_cells) + " |"
        )
    return [
        *lines,
        "",
        paragraph(f"""How the rule is applied (the report's interpretation where RULES.md leaves room): family
        A is the four tests of its row, Holm-corrected together. In family B each comparison's own four tests
        are one Holm group ("Holm within the comparison"), not the tests of all its comparisons together, and
        a family B comparison is significant when its test (1), the normalised IQM difference over the three
        environments, has a Holm verdict of higher or lower; the per-environment Welch verdicts are reported
        beside it and enter no attribution. The cause is read from the gate row and the controller (PPO) row
        (the rule's "PPO + KL penalty vs decoupled PPO"); the controller (RGPO) row is reported, not used. The
        decoupling sentence is given whatever family A says: it is about each method's own arms, not the cause
        of family A's difference. Bootstrap p: twice the smaller tail of the resampled differences at 0
        ({n_boot:,} resamples), floored at 1 / {n_boot:,} = {fmt_p_or_dash(1.0 / n_boot)}, since a tail of 0
        resamples only says p < 1 / n_boot. A row with an environment of fewer than 2 runs in an arm
        aggregates the others (named)."""),
        "",
        f"**Reading (RULES.md):** {prefix}{attribution_words(comparisons)}",
        "",
        f"**Decoupling (RULES.md):** {prefix}{decoupling_words(comparisons)}",
    ]


def improvement_md(poi: dict) -> list[str]:
    return [
        "## Secondary: probability of improvement, decoupled RGPO over decoupled PPO at L = 8",
        "",
        paragraph(f"""rliable's probability of improvement: per environment P(X > Y) over all pairs of a
        decoupled RGPO run X and a decoupled PPO run Y (ties 1/2), averaged over the environments, with a 95%
        stratified-bootstrap interval (runs resampled within each environment, {poi["n_boot"]:,} resamples,
        the primary's rng scheme and seed). Secondary, never decisive."""),
        "",
        "| a vs b | mean over environments [95%] | " + " | ".join(CONFIRM_ENVS) + " |",
        "|---|---|" + "---|" * len(CONFIRM_ENVS),
        f"| {LABELS['rgpo_dec']} vs {LABELS['ppo_dec']} | {fmt_or_dash(poi['mean'], 2)}{_only(poi['envs'])}"
        + f" [{fmt_or_dash(poi['low'], 2)}, {fmt_or_dash(poi['high'], 2)}] | "
        + " | ".join(fmt_or_dash(poi["per_env"][e], 2) for e in CONFIRM_ENVS)
        + " |",
    ]


def retention_md(ret: dict) -> list[str]:
    return [
        "## Secondary: retention (mean L = 8 / mean L = 0), decoupled RGPO vs decoupled PPO",
        "",
        "| env | RGPO | PPO | diff [95%] | Holm p |",
        "|---|---|---|---|---|",
        *(
            f"| {e} | {fmt_or_dash(r['ratio_a'])} | {fmt_or_dash(r['ratio_b'])} | {fmt_interval(r, 3)} | "
            f"{fmt_p_or_dash(r['p_holm'])} |"
            for e, r in ((e, ret[e]) for e in CONFIRM_ENVS)
        ),
    ]


def _gate_cell(g: dict, key: str, digits: int) -> str:
    """A gate-activity cell: the value and (n), with how many runs' largest ratio is the clamp, if any."""
    if g[key] is None:
        return "-"
    k = g.get(f"{key}_at_clamp", 0)
    return f"{fmt_or_dash(g[key], digits)} ({g[key + '_n']}{f'; {k} at clamp' if k else ''})"


def gate_activity_md(gates: dict) -> list[str]:
    """What the gate or the clip saw before each update's first epoch, beside the epoch means."""
    lines = [
        "## Secondary: what the gate / clip saw, before each update's first epoch (start) vs the epoch means",
        "",
        paragraph("""Seed means of per-iteration values (the largest ratio: the seed mean of each run's
        maximum), each with (n), the runs that log the column. Plain arms see r = pi / pi_behaviour at the
        start. For the decoupled arms the start ratios are 1 by construction (r = pi / pi_prox, and pi_prox is
        pi at the start of the update; their behaviour correction is the truncated weight), so only the plain
        arms' start numbers say whether the gate (or the clip) acted on the stale samples. `-`: not logged by
        those runs (policy_lag's runs predate the start columns; their behaviour_ratio_beyond_2 is the same
        quantity as start_ratio_beyond_2)."""),
        "",
        "| arm | env | start beyond 1.2 | start beyond 2 | start largest r | start rejected | epoch rejected "
        "| epoch largest r | behaviour beyond 2 | truncated weights | mean beta | mean epochs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, per_env in gates.items():
        for e, g in per_env.items():
            cells = [_gate_cell(g, key, digits) for key, digits in GATE_COLUMNS]
            lines.append(f"| {LABELS[arm]} | {e} | " + " | ".join(cells) + " |")
    at_clamp = [
        v
        for per_env in gates.values()
        for g in per_env.values()
        for k, v in g.items()
        if k.endswith("_at_clamp")
    ]
    if any(at_clamp):
        lines += [
            "",
            paragraph(f""""k at clamp": in k of the runs the largest ratio is exp({LOG_RATIO_CLAMP:g}) =
            {np.exp(LOG_RATIO_CLAMP):.3g}, where log-ratios are clamped (rgpo_trl.core.gates.LOG_RATIO_CLAMP):
            the true ratio was at least that, and a mean over such runs is not a measured value."""),
        ]
    return lines


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def provenance_md(prov: dict) -> list[str]:
    """The suite's own runs by the commits they ran at, with each commit's code path, then the reused runs."""
    lines = [
        "## Provenance",
        "",
        paragraph(f"""The suite was fixed at {SUITE_COMMIT}. Its own runs, by every commit each ran at
        (final.json's git_commits, resumes included), each commit's code path compared with the suite commit's
        as syntax trees (the scripts or the lab runner, rgpo_trl's loss, gates, controllers, registry and cli,
        and the names the scripts take from rgpo_trl and rgpo_trl.core; the closing console line and
        docstrings left out). The status is final only if every one of them is on the same code path."""),
        "",
    ]
    what = {True: "same code path", False: "DIFFERENT code path", None: "code path not checked"}
    for g in prov["own"]:
        lines.append(
            f"- {' then '.join(c[:8] for c in g['commits'])}: {_runs(len(g['runs']))} ({what[g['same']]})"
        )
        if g["same"] is not True:
            lines.append(f"  - runs: {', '.join(g['runs'])}")
    for c, check in prov["checks"].items():
        if check["notes"]:
            lines.append(f"- {c[:8]}, {what[check['same']]}: {'; '.join(check['notes'])}")
    lines += [
        "",
        paragraph("""The runs it reuses were made by earlier suites at their own commits, not checked against
        the suite commit here; RULES.md: the new code of this suite (`--kl-penalty`, start-of-update
        statistics) is bit-identical to the code those runs were made with on the same machine, checked over
        the first 39-44 iterations of Walker2d seed 0 of both decoupled arms (--compile), and reused and new
        seeds are equally valid draws, not replays. By the commits they ran at:"""),
        "",
    ]
    for g in prov["reused"]:
        suites = ", ".join(f"{s} {n}" for s, n in g["suites"].items())
        lines.append(f"- {' then '.join(c[:8] for c in g['commits'])}: {_runs(g['runs'])} ({suites})")
    return lines


def not_finished_md(suite: Suite) -> list[str]:
    """The runs not read, by class; no lines when every run finished."""
    n_missing = sum(map(len, suite.missing.values()))
    if not n_missing:
        return []
    counts = ", ".join(f"{cls} {len(suite.missing[cls])}" for cls in MISSING_CLASSES)
    lines = [
        f"## Not finished ({n_missing}: {counts})",
        "",
        paragraph("""As found in the results read: not started, no run folder; incomplete, a run folder
        (metrics, config or log) without final.json; failed, run.log ending with an error, or final.json
        without a finite evaluation return (such a run is named here, never used). No run is replaced or
        re-seeded."""),
    ]
    for cls in MISSING_CLASSES:
        names = suite.missing[cls]
        if names:
            lines += ["", f"### {cls.capitalize()} ({len(names)})", ""]
            if cls == "failed":
                lines += [f"- {name}: {suite.why_failed[name]}" for name in names]
            else:
                lines.append(", ".join(names))
    return lines


def curves_md() -> list[str]:
    return [
        "## Secondary: training curves",
        "",
        "Training return (last 100 episodes) per iteration, median and interquartile band over seeds, for "
        "every arm: the decoupled L = 8 arms (top row), the plain L = 8 arms and the L = 0 baselines (bottom "
        "row). At L = 8 the episodes are collected by the actor of 8 iterations earlier; secondary, never "
        "decisive.",
        "",
        "![curves](curves.png)",
    ]


def sensitivity_md(sens: dict, comparisons) -> list[str]:
    """The sensitivity section, labelled as added after the final reading."""
    ranges, gone = sens["ranges"], sens["without_env"]
    others = [e for e in CONFIRM_ENVS if e != gone]
    factors = " / ".join(f"{ranges[e] / ranges[gone]:.1f}x" for e in others)
    trims = "; ".join(
        f"{LABELS[arm]}: lowest {', '.join(f'{e} {k}' for e, k in t['low'].items() if k)}, highest "
        f"{', '.join(f'{e} {k}' for e, k in t['high'].items() if k)}"
        for arm, t in sens["trimmed"].items()
    )
    lines = [
        f"## Sensitivity (added {sens['added']}, after the final reading; not in RULES.md, decides nothing)",
        "",
        paragraph(f"""Added after an independent audit (issue 55), once the report above was final; these
        lines change no verdict above. Normalising ranges (R_high - R_low, return units):
        {", ".join(f"{e} {ranges[e]:.1f}" for e in CONFIRM_ENVS)}, so one return unit of {gone}
        moves a normalised score {factors} as much as one of {" / ".join(others)}. The pooled IQM trims the
        pooled runs, not each environment's; the runs it trims, by environment: {trims}. Without {gone}: test
        (1) on the other environments (the same bootstrap). Environments weighted equally: the mean over the
        three environments of each one's standardised difference (mean a - mean b over the pooled seed
        standard deviation sqrt((var a + var b) / 2), raw returns), with the stratified bootstrap. p:
        two-sided bootstrap, not corrected."""),
        "",
        f"| question | a vs b | rule: IQM diff [95%], Holm p | without {gone}: IQM diff [95%], p | "
        "environments weighted equally: mean standardised diff [95%], p | " + " / ".join(CONFIRM_ENVS) + " |",
        "|---|---|---|---|---|---|",
    ]
    for (_, name, a, b), c, row in zip(COMPARISONS, comparisons, sens["comparisons"], strict=True):
        agg, w, eq = c["aggregate"], row["without"], row["equal_weights"]
        lines.append(
            f"| {name} | {LABELS[a]} vs {LABELS[b]} | {fmt_interval(agg)}, {fmt_p_or_dash(agg['p_holm'])} | "
            f"{fmt_interval(w)}, {fmt_p_or_dash(w['p'])} | {fmt_interval(eq)}, {fmt_p_or_dash(eq['p'])} | "
            + " / ".join(fmt_or_dash(x, 2) for x in eq["per_env"])
            + " |"
        )
    return lines
