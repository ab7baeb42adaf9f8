"""The stale-samples study (suite policy_lag) by its reading rule `POLICY_LAG`, fixed before its runs:
RGPO against PPO at each lag, each method's change from L = 0 to L = 8, and robustness to lag."""

from __future__ import annotations

import numpy as np

from rgpo_lab.mujoco_report.cells import fmt, fmt_kl, fmt_p, fmt_pct, fmt_tdp
from rgpo_lab.mujoco_report.runs import eval_values, finished, metric_mean
from rgpo_lab.mujoco_report.studies import ANNEALED
from rgpo_lab.statistics import holm, mean_std, ratio_difference_test, verdict, welch

# Stale samples (suite policy_lag), read by this rule, fixed before its runs.
LAG_L0 = ANNEALED  # L = 0: seeds 0-4 of one compiled path
LAG_ARMS = (
    ("ppo", "ppo", ""),
    ("ppo decoupled", "ppo", "_decoupled"),
    ("rgpo", "rgpo", ""),
    ("rgpo decoupled", "rgpo", "_decoupled"),
)
POLICY_LAG = {
    "envs": ["Walker2d-v4", "Ant-v4"],
    "lags": (0, 2, 8),
    "reading": (
        "Reading rule (fixed before the runs). Primary metric: the learner's deterministic evaluation return "
        "at 1M steps (10 mean-action episodes); secondary: the training return (last 100 episodes, collected "
        "by the lagged actor). L = 0 is the annealed comparison on one code path (main_compiled seeds 0-2 + "
        "annealed5 seeds 3-4); a decoupled objective equals its base method at L = 0 (tested bit for bit), "
        "so both share those runs. (1) Per environment and lag, each RGPO variant against each PPO variant: "
        "two-sided Welch, Holm over these 4 tests (one family per environment, lag and metric); 'higher' / "
        "'lower' only where the adjusted p <= 0.05, else 'no significant difference'. (2) Each method's "
        "change from L = 0 to L = 8: two-sided Welch, Holm over the 4 methods of an environment. (3) RGPO (a "
        "variant) is *more robust to lag* than a PPO variant on an environment if its retention at L = 8 "
        "(its mean evaluation return at L = 8 divided by its mean at L = 0) is higher with Holm-adjusted "
        "p <= 0.05 over the 4 RGPO-PPO pairs of that environment, *less robust* if lower at that level, "
        "otherwise no significant difference; the p-value is a bootstrap's (10,000 resamples of each arm's "
        "L = 0 and L = 8 runs, each resampled on its own; twice the smaller tail at 0), so the L = 0 means' "
        "own noise counts (revised before any policy_lag run, from dividing each run by a fixed L = 0 mean, "
        "which ignored it). (4) Whether the gate acted: RGPO's rejected fraction and kl_coef at each lag, "
        "next to the behaviour ratio's statistics, as numbers (no test). (5) Performance profile of the "
        "evaluation returns at L = 8, min-max normalised per environment over every run of the study (all "
        "lags and arms: 0 = the worst run, 1 = the best), with stratified-bootstrap 95% bands."
    ),
}


def lag_runs(runs, env: str, lag: int, method: str, suffix: str) -> list:
    """Finished runs of one arm of the policy-lag study at one lag (L = 0: the annealed one-path runs)."""
    if lag == 0:
        return [
            r
            for r in runs
            if r.final and r.env == env and r.method == method and (r.suite, r.variant) in LAG_L0
        ]
    return finished(runs, suite="policy_lag", env=env, method=method, variant=f"lag{lag}{suffix}")


def _summary(runs, env: str, lag: int, label: str, method: str, suffix: str) -> dict:
    """One arm at one lag: its seeds, evaluation and training returns, and the per-iteration statistics."""
    rs = lag_runs(runs, env, lag, method, suffix)
    return {
        "env": env,
        "lag": lag,
        "arm": label,
        "n": len(rs),
        "seeds": sorted(r.cfg["seed"] for r in rs),
        "eval": mean_std(eval_values(rs)),
        "train": mean_std([r.final_return for r in rs]),
        "behaviour_ratio_mean": metric_mean(rs, "behaviour_ratio_mean"),
        "behaviour_ratio_max": metric_mean(rs, "behaviour_ratio_max", "max"),
        "behaviour_ratio_beyond_1.2": metric_mean(rs, "behaviour_ratio_beyond_1.2"),
        "behaviour_ratio_beyond_2": metric_mean(rs, "behaviour_ratio_beyond_2"),
        "behaviour_kl": metric_mean(rs, "behaviour_kl"),
        "kl": metric_mean(rs, "kl"),
        "rejected_frac": metric_mean(rs, "rejected_frac"),
        "clipfrac": metric_mean(rs, "clipfrac"),
        "kl_coef": metric_mean(rs, "kl_coef"),
        "epochs": metric_mean(rs, "epochs"),
    }


def _holm_family(family: list[dict], words: dict | None = None) -> list[dict]:
    """Each row's Holm-adjusted p over the family and its verdict (renamed by ``words``, if given)."""
    for row, p_adj in zip(family, holm([f["test"].p for f in family]), strict=True):
        word = verdict(row["test"].diff, p_adj)
        row.update(p_holm=p_adj, verdict=(words or {}).get(word, word))
    return family


def _pairs(runs, env: str, lag: int, metric: str) -> list[dict]:
    """(1): each RGPO variant against each PPO variant at ``lag`` on ``metric`` ("eval" or "train")."""
    family = []
    for r_label, r_m, r_suffix in LAG_ARMS[2:]:
        for p_label, p_m, p_suffix in LAG_ARMS[:2]:
            a, b = (lag_runs(runs, env, lag, m, sfx) for m, sfx in ((r_m, r_suffix), (p_m, p_suffix)))
            va, vb = ((eval_values(x) if metric == "eval" else [r.final_return for r in x]) for x in (a, b))
            family.append(
                {"env": env, "lag": lag, "metric": metric, "a": r_label, "b": p_label, "test": welch(va, vb)}
            )
    return _holm_family(family)


def _change(runs, env: str, base: dict) -> list[dict]:
    """(2): each method's change of evaluation return from L = 0 (``base``) to L = 8."""
    family = []
    for label, m, suffix in LAG_ARMS:
        stale = eval_values(lag_runs(runs, env, 8, m, suffix))
        family.append(
            {
                "env": env,
                "arm": label,
                "l0": mean_std(base[label]),
                "l8": mean_std(stale),
                "test": welch(stale, base[label]),
            }
        )
    return _holm_family(family)


def _robustness(runs, env: str, base: dict) -> list[dict]:
    """(3): each RGPO variant's retention at L = 8 against each PPO variant's."""
    family = []
    for r_label, r_m, r_sfx in LAG_ARMS[2:]:
        for p_label, p_m, p_sfx in LAG_ARMS[:2]:
            test = ratio_difference_test(
                base[r_label],
                eval_values(lag_runs(runs, env, 8, r_m, r_sfx)),
                base[p_label],
                eval_values(lag_runs(runs, env, 8, p_m, p_sfx)),
            )
            family.append({"env": env, "a": r_label, "b": p_label, "test": test})
    return _holm_family(family, {"higher": "more robust", "lower": "less robust"})


def policy_lag_tables(runs) -> dict:
    """The policy-lag study by its reading rule: per-arm summaries, the pairwise families, the change from
    L = 0 to L = 8 and the robustness family (see POLICY_LAG['reading'])."""
    summary, pairs, change, robust = [], [], [], []
    for env in POLICY_LAG["envs"]:
        base = {label: eval_values(lag_runs(runs, env, 0, m, "")) for label, m, _ in LAG_ARMS}
        for lag in POLICY_LAG["lags"]:
            summary += [_summary(runs, env, lag, label, m, suffix) for label, m, suffix in LAG_ARMS]
            if lag != 0:
                pairs += _pairs(runs, env, lag, "eval") + _pairs(runs, env, lag, "train")
        change += _change(runs, env, base)
        robust += _robustness(runs, env, base)
    return {"summary": summary, "pairs": pairs, "change": change, "robustness": robust}


def policy_lag_md(runs) -> str:
    t = policy_lag_tables(runs)
    lines = [
        POLICY_LAG["reading"],
        "",
        "Per arm: returns as mean ± sample std (n); staleness and the trust region's statistics as means "
        "over every iteration of the arm's runs (behaviour ratio r_b = pi_prox / pi_behaviour at the start "
        "of each update; 'beyond x': share with max(r_b, 1/r_b) > x; max: over iterations and runs).",
        "",
        "| env | L | arm | n | evaluation return | training return | r_b mean | r_b max | r_b beyond 1.2 | "
        "r_b beyond 2 | KLhat(prox, behaviour) | KL to anchor | rejected | clipped | kl_coef | epochs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = ["behaviour_ratio_mean", "behaviour_ratio_max", "behaviour_ratio_beyond_1.2"]
    keys += ["behaviour_ratio_beyond_2", "behaviour_kl", "kl", "rejected_frac", "clipfrac"]
    keys += ["kl_coef", "epochs"]
    for r in t["summary"]:
        cells = " | ".join(fmt_p(r[k]) if k != "behaviour_kl" and k != "kl" else fmt_kl(r[k]) for k in keys)
        head = (
            f"| {r['env']} | {r['lag']} | {r['arm']} | {r['n']} | {fmt(*r['eval'])} | {fmt(*r['train'])} | "
        )
        lines.append(head + cells + " |")
    lines += [
        "",
        "(1) RGPO variants against PPO variants at each lag (two-sided Welch, Holm within environment, "
        "lag and metric):",
        "",
        "| env | L | metric | a | b | mean a - b | Welch t / df / p | Holm p | verdict (a vs b) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in t["pairs"]:
        w = r["test"]
        lines.append(
            f"| {r['env']} | {r['lag']} | {r['metric']} | {r['a']} | {r['b']} | {w.diff:.0f} | "
            f"{fmt_tdp(w)} | {fmt_p(r['p_holm'])} | {r['verdict']} |"
        )
    lines += [
        "",
        "(2) Each method from L = 0 to L = 8, evaluation return (two-sided Welch, Holm over the 4 methods "
        "of an environment):",
        "",
        "| env | arm | L = 0 | L = 8 | change | Welch t / df / p | Holm p | verdict (L = 8 vs 0) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in t["change"]:
        change = r["l8"].mean / r["l0"].mean - 1 if r["l0"].n and r["l0"].mean else float("nan")
        lines.append(
            f"| {r['env']} | {r['arm']} | {fmt(*r['l0'])} | {fmt(*r['l8'])} | {fmt_pct(change)} | "
            f"{fmt_tdp(r['test'])} | {fmt_p(r['p_holm'])} | {r['verdict']} |"
        )
    lines += [
        "",
        "(3) Robustness: retention at L = 8 (mean evaluation return at L = 8 / at L = 0), RGPO "
        "variants against PPO variants (bootstrap over both lags' runs, Holm over the 4 pairs of an "
        "environment):",
        "",
        "| env | a | b | retention a | retention b | a - b [95% CI] | bootstrap p | Holm p | "
        "verdict (a vs b) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in t["robustness"]:
        w = r["test"]
        ci = "" if not np.isfinite(w.low) else f"{w.diff:+.2f} [{w.low:+.2f}, {w.high:+.2f}]"
        lines.append(
            f"| {r['env']} | {r['a']} | {r['b']} | {fmt_p(w.ratio_a)} | {fmt_p(w.ratio_b)} | {ci} | "
            f"{fmt_p(w.p)} | {fmt_p(r['p_holm'])} | {r['verdict']} |"
        )
    return "\n".join(lines)


def policy_lag_scores(runs) -> dict[str, dict[str, np.ndarray]]:
    """Evaluation returns at L = 8 per arm and environment, min-max normalised per environment over every run
    of the policy-lag study (all lags and arms), as its reading rule fixes."""
    out: dict[str, dict[str, np.ndarray]] = {label: {} for label, _, _ in LAG_ARMS}
    for env in POLICY_LAG["envs"]:
        every = [
            v
            for lag in POLICY_LAG["lags"]
            for _, m, sfx in LAG_ARMS
            for v in eval_values(lag_runs(runs, env, lag, m, sfx))
        ]
        if len(every) < 2 or max(every) == min(every):
            continue
        lo, span = min(every), max(every) - min(every)
        for label, m, sfx in LAG_ARMS:
            x = np.asarray(eval_values(lag_runs(runs, env, 8, m, sfx)), float)
            if len(x):
                out[label][env] = (x - lo) / span
    return out
