"""The "when does RGPO help?" studies (`STUDIES`), each with its arms, tests and reading rule fixed
before its runs: every arm against the first with Holm over the study, and normalised aggregates over
environments."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rgpo_lab.mujoco_grid import MUJOCO_ENVS as ENVS
from rgpo_lab.mujoco_report.cells import fmt, fmt_kl, fmt_p, fmt_pct, fmt_tdp
from rgpo_lab.mujoco_report.runs import eval_return, eval_values, mean_kl
from rgpo_lab.statistics import (
    holm,
    mean_probability_of_improvement,
    mean_std,
    pooled_iqm,
    stratified_bootstrap_ci,
    verdict,
    welch,
)


# The three "when does RGPO help?" questions, read with one code path: each study is a set of arms (a method
# and the suites / variants / seeds its runs come from), one reference arm, and the environments. Fixed before
# the runs.
@dataclass(frozen=True)
class Arm:
    label: str
    method: str
    sources: tuple[tuple[str, str], ...]  # (suite, variant) pairs pooled into this arm
    seeds: tuple[int, ...] | None = None  # None: every seed found

    def pools(self, r) -> bool:
        """Whether a run of this arm's method and environment comes from one of its sources and seeds."""
        return (r.suite, r.variant) in self.sources and (self.seeds is None or r.cfg["seed"] in self.seeds)

    def runs(self, runs, env):
        return [r for r in runs if r.final and r.env == env and r.method == self.method and self.pools(r)]


# One code path (--compile, deterministic evaluation in every run): main_compiled's seeds 0-2 (main's eager
# runs re-run) and annealed5's 3-4. main's eager runs stay the paper tables' (and the eager-vs-compiled
# comparison's).
ANNEALED = (("main_compiled", "default"), ("annealed5", "default"))
STUDIES = {
    "annealed": {
        "title": "PPO vs RGPO, CleanRL defaults (learning rate annealed), seeds 0-4 of one compiled path "
        "(main_compiled's 0-2 + annealed5's 3-4)",
        "envs": ENVS,
        "arms": (Arm("ppo", "ppo", ANNEALED), Arm("rgpo", "rgpo", ANNEALED)),
    },
    "constant_lr": {
        "title": "PPO vs RGPO with a constant learning rate (the paper's likely setting), seeds 0-4",
        "envs": ENVS,
        "arms": (
            Arm("ppo", "ppo", (("constant_lr", "constant_lr"),)),
            Arm("rgpo", "rgpo", (("constant_lr", "constant_lr"),)),
        ),
    },
    "kl_budget": {
        "title": "Gate or budget? RGPO at larger KL targets, PPO with a KL early stop (0.03), seeds 0-2",
        "envs": ["Ant-v4", "HalfCheetah-v4"],
        "arms": (
            Arm("ppo", "ppo", ANNEALED, (0, 1, 2)),
            Arm("ppo, target_kl 0.03", "ppo", (("kl_budget", "targetkl0.03"),)),
            Arm("rgpo, target 0.02", "rgpo", ANNEALED, (0, 1, 2)),
            Arm("rgpo, target 0.05", "rgpo", (("kl_budget", "target0.05"),)),
            Arm("rgpo, target 0.1", "rgpo", (("kl_budget", "target0.1"),)),
        ),
        # beyond the comparisons with the first arm: KL-capped PPO against RGPO at its default budget
        "contrasts": (("ppo, target_kl 0.03", "rgpo, target 0.02"),),
        # how the study is read, fixed before its runs
        "reading": "Read per environment: the gap is the *budget* if RGPO's deficit to PPO shrinks as its "
        "target grows (no significant difference from PPO at 0.05 or 0.1) and KL-capped PPO falls towards "
        "RGPO at 0.02 (below PPO, no significant difference from RGPO at 0.02); it is the *gate* if RGPO "
        "stays below PPO at targets whose mean KL reaches PPO's; anything else is undecided at n = 3.",
    },
}


def study_table(runs, study: dict) -> list[dict]:
    """Per environment and arm: n, training return (last 100 episodes) and deterministic-evaluation return as
    mean, sample std and n; mean KL; against the reference arm (the first): relative difference and two-sided
    Welch t / df / p for both returns."""
    rows = []
    for env in study["envs"]:
        ref = study["arms"][0].runs(runs, env)
        for arm in study["arms"]:
            rs = arm.runs(runs, env)
            train, ev = [r.final_return for r in rs], eval_values(rs)
            ref_train, ref_eval = [r.final_return for r in ref], eval_values(ref)
            row = {
                "env": env,
                "arm": arm.label,
                "n": len(rs),
                "seeds": sorted(r.cfg["seed"] for r in rs),
                "train": mean_std(train),
                "eval": mean_std(ev),
                "kl": mean_kl(rs),
                # the Gaussian policy's entropy after the last update: how much exploration noise the training
                # return (sampled actions) still carries, which the evaluation (mean action) does not
                "entropy": mean_std([r.metrics["entropy"].iloc[-1] for r in rs if "entropy" in r.metrics]),
            }
            if arm is not study["arms"][0]:
                row["train_vs_ref"] = welch(train, ref_train)
                row["eval_vs_ref"] = welch(ev, ref_eval)
                ref_mean, ref_std, _ = mean_std(ref_train)
                row["train_diff"] = row["train"][0] / ref_mean - 1 if ref_train else float("nan")
                row["std_ratio"] = row["train"][1] / ref_std if len(ref_train) > 1 else float("nan")
            rows.append(row)
    return rows


def study_contrasts(runs, study: dict) -> list[dict]:
    """The study's extra pairs of arms (``study["contrasts"]``), per environment: mean training and evaluation
    return of each, the relative difference, two-sided Welch t / df / p on both, and each arm's mean KL."""
    arms = {a.label: a for a in study["arms"]}
    rows = []
    for env in study["envs"]:
        for a_label, b_label in study.get("contrasts", ()):
            a, b = arms[a_label].runs(runs, env), arms[b_label].runs(runs, env)
            a_train, b_train = [r.final_return for r in a], [r.final_return for r in b]
            train_a, train_b = mean_std(a_train), mean_std(b_train)
            rows.append(
                {
                    "env": env,
                    "a": a_label,
                    "b": b_label,
                    "train_a": train_a,
                    "train_b": train_b,
                    "diff": train_a[0] / train_b[0] - 1 if b_train else float("nan"),
                    "train": welch(a_train, b_train),
                    "eval": welch(eval_values(a), eval_values(b)),
                    "kl_a": mean_kl(a),
                    "kl_b": mean_kl(b),
                }
            )
    return rows


def study_tests(runs, study: dict) -> tuple[list[dict], list[dict]]:
    """`study_table` and `study_contrasts` with Holm's correction: one family per metric (training,
    evaluation) holding every test of the study (each arm against the first, every environment, and the extra
    pairs), so 'higher' / 'lower' (in either direction) are said only of corrected two-sided tests."""
    rows, contrasts = study_table(runs, study), study_contrasts(runs, study)
    for metric, row_key, contrast_key in (
        ("train", "train_vs_ref", "train"),
        ("eval", "eval_vs_ref", "eval"),
    ):
        tests = [(r, r[row_key]) for r in rows if row_key in r] + [(c, c[contrast_key]) for c in contrasts]
        for (owner, test), p_adj in zip(tests, holm([t.p for _, t in tests]), strict=True):
            owner[f"{metric}_p_holm"] = p_adj
            owner[f"{metric}_verdict"] = verdict(test.diff, p_adj)
    return rows, contrasts


def code_paths(rs) -> str:
    """Which code path the runs took ('compiled 3, eager 2'), from each run's config.json."""
    n = {"compiled": sum(bool(r.cfg.get("compile")) for r in rs)}
    n["eager"] = len(rs) - n["compiled"]
    return ", ".join(f"{k} {v}" for k, v in n.items() if v) or "none"


def study_runs_md(runs, study: dict) -> str:
    """The runs each arm of a study uses: suites, variants, seeds and code path."""
    lines = []
    for arm in study["arms"]:
        rs = [r for env in study["envs"] for r in arm.runs(runs, env)]
        seeds = "all seeds" if arm.seeds is None else f"seeds {', '.join(map(str, arm.seeds))}"
        sources = "; ".join(f"{suite}/{variant}" for suite, variant in arm.sources)
        lines.append(f"- {arm.label}: {sources} ({seeds}); finished runs: {len(rs)} ({code_paths(rs)})")
    return "\n".join(lines)


def normalised_scores(
    runs, study: dict, key=lambda r: r.final_return, min_runs: int = 2, scale: str = "reference"
) -> dict[str, dict[str, np.ndarray]]:
    """arm -> env -> each run's normalised score; an arm's environment enters only when it and the reference
    arm have at least ``min_runs`` scores (no interval from one run).

    ``scale="reference"`` divides by |mean of the reference arm's runs| in that environment (the protocol
    fixed before the runs); ``scale="minmax"`` maps the worst run of the study in that environment to 0 and
    the best to 1, which stays defined when the reference mean is near 0 (rliable's min-max normalisation,
    without a random policy's score)."""
    if scale not in ("reference", "minmax"):
        raise ValueError(f"scale must be 'reference' or 'minmax', got {scale!r}")
    out: dict[str, dict[str, np.ndarray]] = {a.label: {} for a in study["arms"]}
    for env in study["envs"]:
        per_arm = {}
        for arm in study["arms"]:
            x = np.array([key(r) for r in arm.runs(runs, env)], float)
            per_arm[arm.label] = x[np.isfinite(x)]
        ref = per_arm[study["arms"][0].label]
        if len(ref) < min_runs:
            continue
        if scale == "reference":
            offset, denom = 0.0, abs(ref.mean())
        else:
            pooled = np.concatenate([x for x in per_arm.values() if len(x) >= min_runs])
            offset, denom = pooled.min(), pooled.max() - pooled.min()
        if denom == 0:
            continue
        for label, x in per_arm.items():
            if len(x) >= min_runs:
                out[label][env] = (x - offset) / denom
    return out


def ill_conditioned_envs(runs, study: dict, key=lambda r: r.final_return) -> list[str]:
    """Environments where the reference arm's mean is within one sample std of 0: dividing by it there makes
    the reference-normalised aggregate meaningless (a sign flip or a blow-up), so the report adds the min-max
    one."""
    flagged = []
    for env in study["envs"]:
        mean, std, n = mean_std([key(r) for r in study["arms"][0].runs(runs, env)])
        if n >= 2 and abs(mean) < std:
            flagged.append(env)
    return flagged


def study_aggregate(
    runs, study: dict, n_boot=2000, key=lambda r: r.final_return, scale: str = "reference"
) -> dict:
    """IQM of normalised scores per arm (``normalised_scores``' ``scale``) and P(arm > reference), with
    stratified-bootstrap 95% CIs. P(arm > reference) compares runs within an environment, so no
    per-environment normalisation changes it."""
    scores = normalised_scores(runs, study, key, scale=scale)
    ref_label = study["arms"][0].label
    out = {}
    for arm in study["arms"]:
        per_env = scores[arm.label]
        if not per_env:
            continue
        groups = [(v,) for v in per_env.values()]
        entry = {
            "iqm": pooled_iqm(groups),
            "iqm_ci95": stratified_bootstrap_ci(groups, pooled_iqm, n_boot),
            "n": sum(map(len, per_env.values())),
        }
        pairs = [(per_env[e], scores[ref_label][e]) for e in per_env if e in scores[ref_label]]
        if arm.label != ref_label and pairs:
            entry["p_improvement"] = mean_probability_of_improvement(pairs)
            entry["p_improvement_ci95"] = stratified_bootstrap_ci(
                pairs, mean_probability_of_improvement, n_boot
            )
        out[arm.label] = entry
    return out


def _holm_cell(row, metric) -> str:
    """'Holm p: verdict' of one corrected test; empty where the row has no test."""
    if f"{metric}_p_holm" not in row:
        return ""
    p_adj = row[f"{metric}_p_holm"]
    return "not tested" if not np.isfinite(p_adj) else f"{fmt_p(p_adj)}: {row[f'{metric}_verdict']}"


def study_md(runs, study: dict, n_boot=2000) -> str:
    rows, contrasts = study_tests(runs, study)
    lines = [
        study["title"] + ". Mean ± sample std (n); Welch two-sided against the first arm; Holm over every "
        "test of the study per metric (the table's and the further pairs'), verdict of the corrected test "
        "(arm against the first arm).",
        "",
        "Runs:",
        study_runs_md(runs, study),
        "",
        "| env | arm | n | training return | evaluation return | mean KL | policy entropy, last iteration | "
        "vs ref (training) | std / ref std | Welch t / df / p (training) | Holm p (training) | "
        "Welch t / df / p (evaluation) | Holm p (evaluation) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['env']} | {r['arm']} | {r['n']} | {fmt(*r['train'])} | {fmt(*r['eval'])} | "
            f"{r['kl']:.4f} | {fmt(*r['entropy'], digits=2)} | {fmt_pct(r.get('train_diff', np.nan))} | "
            f"{fmt_p(r.get('std_ratio', np.nan))} | {fmt_tdp(r.get('train_vs_ref'))} | "
            f"{_holm_cell(r, 'train')} | "
            f"{fmt_tdp(r.get('eval_vs_ref'))} | {_holm_cell(r, 'eval')} |"
        )
    if contrasts:
        lines += [
            "",
            "Further pairs (Welch two-sided, a against b; Holm in the study's family):",
            "",
            "| env | a | b | training return a | training return b | a vs b | Welch t / df / p (training) | "
            "Holm p (training) | Welch t / df / p (evaluation) | Holm p (evaluation) | mean KL a / b |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in contrasts:
            lines.append(
                f"| {c['env']} | {c['a']} | {c['b']} | {fmt(*c['train_a'])} | {fmt(*c['train_b'])} | "
                f"{fmt_pct(c['diff'])} | {fmt_tdp(c['train'])} | {_holm_cell(c, 'train')} | "
                f"{fmt_tdp(c['eval'])} | "
                f"{_holm_cell(c, 'eval')} | {fmt_kl(c['kl_a'])} / {fmt_kl(c['kl_b'])} |"
            )
    if study.get("reading"):
        lines += ["", study["reading"]]
    flagged = ill_conditioned_envs(runs, study)
    scales = [("reference", "normalised by the first arm's mean per environment")]
    if flagged:  # added after the constant_lr runs, where Ant-v4's PPO mean is near 0
        why = (
            "min-max normalised per environment over all the study's runs (0 = its worst "
            "run, 1 = its best), added because the first arm's mean is within one std of 0 on "
        )
        scales.append(("minmax", why + ", ".join(flagged)))
    for scale, how in scales:
        for name, key in (("training return", lambda r: r.final_return), ("evaluation return", eval_return)):
            agg = study_aggregate(runs, study, n_boot, key, scale=scale)
            if not agg:
                continue
            lines += [
                "",
                f"Aggregate over environments, {name} {how} "
                "(IQM and P(arm > first arm) with stratified-bootstrap 95% CIs):",
                "",
                "| arm | runs | IQM | 95% CI | P(arm > first arm) | 95% CI |",
                "|---|---|---|---|---|---|",
            ]
            for label, e in agg.items():
                pi = e.get("p_improvement")
                if pi is None:
                    p_cells = " |  |"
                else:
                    p_ci = e["p_improvement_ci95"]
                    p_cells = f"{pi:.3f} | {p_ci[0]:.3f}-{p_ci[1]:.3f} |"
                ci = e["iqm_ci95"]
                lines.append(f"| {label} | {e['n']} | {e['iqm']:.3f} | {ci[0]:.3f}-{ci[1]:.3f} | " + p_cells)
    return "\n".join(lines)
