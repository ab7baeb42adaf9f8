"""The policy-lag confirmation (suite policy_lag_confirm) read by its rule, results/mujoco/policy_lag_confirm/
RULES.md, committed before its runs.

    python -m rgpo_lab.mujoco_confirm_report                # -> results/mujoco/policy_lag_confirm/report/

Run from the repository root. Reads every run the suite lists (its own and the ones it reuses from
policy_lag, main_compiled and annealed5), so a partial suite gives an interim report that names what is
missing, by class (not started, incomplete, failed). Outcome: the deterministic evaluation return at 1M
steps, normalised by rgpo_lab.mujoco_normalisation. The status is final only with every run finished and
every one of the suite's own runs on the suite commit's code path (`code_path_check`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from typing import NamedTuple

import numpy as np

from rgpo_lab.json_values import plain
from rgpo_lab.mujoco_grid import CONFIRM_ENVS, ROOT, SUITES, GridRun
from rgpo_lab.mujoco_normalisation import Normaliser
from rgpo_lab.mujoco_report.code_path import SUITE_COMMIT, CodePathCheck, code_path_check
from rgpo_lab.results_data import open_metrics
from rgpo_lab.statistics import (
    aggregate_difference,
    holm,
    iqm,
    mean_std,
    optimality_gap,
    probability_of_improvement,
    ratio_difference_test,
    standardised_difference,
    verdict,
    welch,
)
from rgpo_trl.core.gates import LOG_RATIO_CLAMP

RESULTS = os.path.join(ROOT, "results", "mujoco")
OUT = os.path.join(RESULTS, "policy_lag_confirm", "report")
SUITE = "policy_lag_confirm"
ARMS = {  # arm -> (method, variant), in the order of the tables
    "ppo_dec": ("ppo", "lag8_decoupled"),
    "rgpo_dec": ("rgpo", "lag8_decoupled"),
    "ppo_dec_kl": ("ppo", "lag8_decoupled_klpenalty"),
    "rgpo_dec_nokl": ("rgpo", "lag8_decoupled_nokl"),
    "ppo_plain": ("ppo", "lag8"),
    "rgpo_plain": ("rgpo", "lag8"),
    "ppo_L0": ("ppo", "default"),
    "rgpo_L0": ("rgpo", "default"),
}
LABELS = {
    "ppo_dec": "decoupled PPO",
    "rgpo_dec": "decoupled RGPO",
    "ppo_dec_kl": "decoupled PPO + KL penalty",
    "rgpo_dec_nokl": "decoupled RGPO, no KL penalty",
    "ppo_plain": "plain PPO",
    "rgpo_plain": "plain RGPO",
    "ppo_L0": "PPO, L = 0",
    "rgpo_L0": "RGPO, L = 0",
}
# (family, name, arm a, arm b): a - b; Holm within each comparison's four tests (RULES.md)
COMPARISONS = (
    ("A", "more robust", "rgpo_dec", "ppo_dec"),
    ("B", "gate", "rgpo_dec", "ppo_dec_kl"),
    ("B", "controller (RGPO)", "rgpo_dec", "rgpo_dec_nokl"),
    ("B", "controller (PPO)", "ppo_dec_kl", "ppo_dec"),
    ("B", "decoupling (PPO)", "ppo_dec", "ppo_plain"),
    ("B", "decoupling (RGPO)", "rgpo_dec", "rgpo_plain"),
)
START_KEYS = ("start_ratio_beyond_1.2", "start_ratio_beyond_2", "start_ratio_max", "start_rejected_frac")
EPOCH_KEYS = ("rejected_frac", "ratio_max", "kl_coef", "epochs")
MISSING_CLASSES = ("not started", "incomplete", "failed")


def run_dir(results: str, r: GridRun) -> str:
    return os.path.join(results, r.suite, r.name)


class Suite(NamedTuple):
    data: dict  # {arm: {env: [(seed, eval return, metrics rows)]}} of the finished runs
    missing: dict  # {class in MISSING_CLASSES: [suite/run]}: the runs not read
    why_failed: dict  # {suite/run: what failed}
    commits: dict  # {suite/run: [every commit it ran at]} of the finished runs


# a grid session's first line in run.log: "# 2026-11-26 16:54:55 <command>"
LOG_SESSION = re.compile(r"^# \d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", re.MULTILINE)


def log_error(d: str) -> str | None:
    """The error run.log ends with, if its last session (after the grid's last start line) has a traceback
    or the scripts' one-line ``error: ...``; None otherwise (no log, or a run that is still going)."""
    path = os.path.join(d, "run.log")
    if not os.path.isfile(path):
        return None
    with open(path, errors="replace") as f:
        text = f.read()
    starts = [m.start() for m in LOG_SESSION.finditer(text)]
    last = text[starts[-1] :] if starts else text
    lines = [line.strip() for line in last.splitlines() if line.strip()]
    if any(line.startswith("Traceback (most recent call last)") for line in lines) or any(
        line.startswith("error: ") for line in lines
    ):
        return lines[-1][:200]
    return None


def run_commits(d: str) -> list[str]:
    """Every commit a run ran at: final.json's ``git_commits`` (one per session, resumes included), else
    config.json's ``git_commit`` (rewritten on each resume: the last session's only), else ["unknown"]."""
    for name, key in (("final.json", "git_commits"), ("config.json", "git_commit")):
        try:
            with open(os.path.join(d, name)) as f:
                value = json.load(f).get(key)
        except (OSError, ValueError):
            continue
        commits = [value] if isinstance(value, str) else [c for c in value or [] if c]
        if commits:
            return commits
    return ["unknown"]


def load(results: str = RESULTS) -> Suite:
    """Every run the suite lists: the finished ones read, the others classed. Failed: final.json without a
    finite ``eval_return_mean`` (read, never used), or no final.json and run.log ending with an error;
    incomplete: a run folder (metrics, config or log) without final.json; not started: no run folder."""
    import pandas as pd

    by_key = {v: k for k, v in ARMS.items()}
    data: dict = {arm: {env: [] for env in CONFIRM_ENVS} for arm in ARMS}
    missing: dict = {c: [] for c in MISSING_CLASSES}
    why_failed, commits = {}, {}
    for r in SUITES[SUITE]:
        d, name = run_dir(results, r), f"{r.suite}/{r.name}"
        final = os.path.join(d, "final.json")
        if not os.path.isfile(final):
            error = log_error(d)
            if error is not None:
                missing["failed"].append(name)
                why_failed[name] = f"run.log ends with an error: {error}"
            elif os.path.isdir(d) and os.listdir(d):
                missing["incomplete"].append(name)
            else:
                missing["not started"].append(name)
            continue
        with open(final) as f:
            ret = json.load(f).get("eval_return_mean")
        if not isinstance(ret, int | float) or not np.isfinite(ret):
            missing["failed"].append(name)
            why_failed[name] = f"final.json's eval_return_mean is {ret!r}"
            continue
        with open_metrics(d, required=True) as f:
            metrics = pd.read_csv(f)
        data[by_key[(r.method, r.variant)]][r.env_id].append((r.seed, float(ret), metrics))
        commits[name] = run_commits(d)
    return Suite(data, missing, why_failed, commits)


def returns(data, arm, env) -> np.ndarray:
    return np.array([ret for _, ret, _ in sorted(data[arm][env], key=lambda x: x[0])], float)


def compare(data, norm: Normaliser, a: str, b: str, n_boot: int) -> dict:
    """RULES.md's four tests for a - b: the normalised IQM difference (stratified bootstrap) and Welch per
    environment, Holm-corrected together."""
    # an interim report aggregates over the environments that have 2 runs or more in both arms (named)
    envs = [e for e in CONFIRM_ENVS if min(len(returns(data, a, e)), len(returns(data, b, e))) >= 2]
    agg = aggregate_difference(
        [norm(e, returns(data, a, e)) for e in envs],
        [norm(e, returns(data, b, e)) for e in envs],
        n_boot=n_boot,
    )
    if np.isfinite(agg.p):  # a bootstrap p of 0 means below 1 / n_boot: floored there, conservatively
        agg = agg._replace(p=max(agg.p, 1.0 / n_boot))
    per_env = {e: welch(returns(data, a, e), returns(data, b, e)) for e in CONFIRM_ENVS}
    adjusted = holm([agg.p, *(per_env[e].p for e in CONFIRM_ENVS)])
    out = {
        "aggregate": {
            **agg._asdict(),
            "envs": envs,
            "p_holm": adjusted[0],
            "verdict": verdict(agg.diff, adjusted[0]),
        },
        "per_env": {},
    }
    for e, p_adj in zip(CONFIRM_ENVS, adjusted[1:], strict=True):
        w = per_env[e]
        out["per_env"][e] = {
            **w._asdict(),
            "n_a": len(returns(data, a, e)),
            "n_b": len(returns(data, b, e)),
            "p_holm": p_adj,
            "verdict": verdict(w.diff, p_adj),
        }
    return out


def improvement(data, n_boot: int, a: str = "rgpo_dec", b: str = "ppo_dec", seed: int = 0) -> dict:
    """Secondary: rliable's probability of improvement of a over b, the mean over environments of P(X > Y)
    (X a's runs, Y b's, ties 0.5), with a 95% stratified-bootstrap interval: the primary's scheme (rng
    default_rng(seed); per resample a's runs within each environment, then b's), so the resampled runs are
    the primary's. Over the environments with 2 runs or more in both arms, as the primary."""
    per_env = {
        e: probability_of_improvement(returns(data, a, e), returns(data, b, e))
        if len(returns(data, a, e)) and len(returns(data, b, e))
        else None
        for e in CONFIRM_ENVS
    }
    envs = [e for e in CONFIRM_ENVS if min(len(returns(data, a, e)), len(returns(data, b, e))) >= 2]
    nan = float("nan")
    out = {"per_env": per_env, "envs": envs, "mean": nan, "low": nan, "high": nan, "n_boot": n_boot}
    if not envs:
        return out
    xs, ys = [returns(data, a, e) for e in envs], [returns(data, b, e) for e in envs]
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    for i in range(n_boot):
        rx = [g[rng.integers(0, len(g), len(g))] for g in xs]
        ry = [g[rng.integers(0, len(g), len(g))] for g in ys]
        boots[i] = np.mean([probability_of_improvement(x, y) for x, y in zip(rx, ry, strict=True)])
    low, high = np.percentile(boots, [2.5, 97.5])
    out.update(
        mean=float(np.mean([probability_of_improvement(x, y) for x, y in zip(xs, ys, strict=True)])),
        low=float(low),
        high=float(high),
    )
    return out


def arm_table(data, norm: Normaliser) -> dict:
    """Per arm and environment: n, raw mean / std, normalised IQM, optimality gap; and pooled over the three
    environments."""
    table = {}
    for arm in ARMS:
        row = {}
        pooled = []
        for e in CONFIRM_ENVS:
            x = returns(data, arm, e)
            s = norm(e, x)
            pooled.append(s)
            ms = mean_std(x)
            row[e] = {
                "n": ms.n,
                "mean": ms.mean,
                "std": ms.std,
                "iqm_norm": iqm(s) if len(s) else float("nan"),
                "gap": optimality_gap(s) if len(s) else float("nan"),
            }
        allx = np.concatenate(pooled)
        row["pooled"] = {
            "n": len(allx),
            "iqm_norm": iqm(allx) if len(allx) else float("nan"),
            "gap": optimality_gap(allx) if len(allx) else float("nan"),
        }
        table[arm] = row
    return table


def retention(data, n_boot: int) -> dict:
    """Secondary: mean L = 8 return / mean L = 0 return per environment, decoupled RGPO vs decoupled PPO."""
    out = {}
    for e in CONFIRM_ENVS:
        t = ratio_difference_test(
            returns(data, "rgpo_L0", e),
            returns(data, "rgpo_dec", e),
            returns(data, "ppo_L0", e),
            returns(data, "ppo_dec", e),
            n_boot=n_boot,
        )
        out[e] = t._asdict()
    p_adj = holm([out[e]["p"] for e in CONFIRM_ENVS])
    for e, p in zip(CONFIRM_ENVS, p_adj, strict=True):
        out[e]["p_holm"] = p
    return out


SENSITIVITY_DATE = "2026-11-28"  # when the sensitivity section was added: after the final reading (issue 55)


def trimmed_by_env(data, norm: Normaliser, arm: str) -> dict:
    """Which environments' runs the pooled IQM of ``arm`` trims (scipy's trim_mean: int(0.25 n) runs from
    each end of the pooled, sorted scores): {"low": {env: k}, "high": {env: k}}."""
    scores = np.concatenate([norm(e, returns(data, arm, e)) for e in CONFIRM_ENVS])
    envs = np.concatenate([[e] * len(returns(data, arm, e)) for e in CONFIRM_ENVS])
    k = int(0.25 * len(scores))
    order = np.argsort(scores, kind="stable")
    ends = {"low": order[:k], "high": order[len(order) - k :] if k else order[:0]}
    return {end: {e: int((envs[idx] == e).sum()) for e in CONFIRM_ENVS} for end, idx in ends.items()}


def sensitivity(data, norm: Normaliser, n_boot: int) -> dict:
    """Added after the final reading (issue 55), never decisive: each environment's normalising range; which
    environments the pooled IQM of family A's arms trims; per comparison, test (1) without the environment
    of the narrowest range, and the environments weighted equally (the mean of each one's standardised
    difference, `standardised_difference`). Bootstrap p uncorrected, floored at 1 / n_boot as test (1)'s."""
    ranges = {e: norm.high(e) - norm.low(e) for e in CONFIRM_ENVS}
    narrowest = min(ranges, key=ranges.get)
    others = [e for e in CONFIRM_ENVS if e != narrowest]
    rows = []
    for _, _, a, b in COMPARISONS:
        without = aggregate_difference(
            [norm(e, returns(data, a, e)) for e in others],
            [norm(e, returns(data, b, e)) for e in others],
            n_boot=n_boot,
        )
        equal = standardised_difference(
            [returns(data, a, e) for e in CONFIRM_ENVS], [returns(data, b, e) for e in CONFIRM_ENVS], n_boot
        )
        rows.append(
            {
                "without": without._replace(p=max(without.p, 1.0 / n_boot))._asdict(),
                "equal_weights": equal._replace(p=max(equal.p, 1.0 / n_boot))._asdict(),
            }
        )
    return {
        "added": SENSITIVITY_DATE,
        "ranges": ranges,
        "without_env": narrowest,
        "trimmed": {arm: trimmed_by_env(data, norm, arm) for arm in ("rgpo_dec", "ppo_dec")},
        "comparisons": rows,
    }


def sensitivity_lines(sens: dict, comparisons) -> list[str]:
    """The sensitivity section of report.md, labelled as added after the final reading."""
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
        _para(f"""Added after an independent audit (issue 55), once the report above was final; these lines
        change no verdict above. Normalising ranges (R_high - R_low, return units):
        {", ".join(f"{e} {ranges[e]:.1f}" for e in CONFIRM_ENVS)}, so one return unit of {gone} moves a
        normalised score {factors} as much as one of {" / ".join(others)}. The pooled IQM trims the pooled
        runs, not each environment's; the runs it trims, by environment: {trims}. Without {gone}: test (1)
        on the other environments (the same bootstrap). Environments weighted equally: the mean over the three
        environments of each one's standardised difference (mean a - mean b over the pooled seed standard
        deviation sqrt((var a + var b) / 2), raw returns), with the stratified bootstrap. p: two-sided
        bootstrap, not corrected."""),
        "",
        f"| question | a vs b | rule: IQM diff [95%], Holm p | without {gone}: IQM diff [95%], p | "
        "environments weighted equally: mean standardised diff [95%], p | " + " / ".join(CONFIRM_ENVS) + " |",
        "|---|---|---|---|---|---|",
    ]
    for (_, name, a, b), c, row in zip(COMPARISONS, comparisons, sens["comparisons"], strict=True):
        agg, w, eq = c["aggregate"], row["without"], row["equal_weights"]
        lines.append(
            f"| {name} | {LABELS[a]} vs {LABELS[b]} | {_f(agg['diff'], 2)} [{_f(agg['low'], 2)}, "
            f"{_f(agg['high'], 2)}], {_p(agg['p_holm'])} | {_f(w['diff'], 2)} [{_f(w['low'], 2)}, "
            f"{_f(w['high'], 2)}], {_p(w['p'])} | {_f(eq['diff'], 2)} [{_f(eq['low'], 2)}, "
            f"{_f(eq['high'], 2)}], {_p(eq['p'])} | " + " / ".join(_f(x, 2) for x in eq["per_env"]) + " |"
        )
    return [*lines, ""]


# A run's largest ratio at this value is the log-ratio clamp (r = exp(20) in float32), not a measurement
RATIO_AT_CLAMP = float(np.float32(np.exp(LOG_RATIO_CLAMP))) * (1 - 1e-6)


def gate_activity(data) -> dict:
    """Per L = 8 arm and environment, seed means of the per-iteration means: what the gate or the clip saw
    before each update's first epoch (start_*) next to the epoch means; None where the runs predate the
    start-of-update columns; ``<key>_n`` the runs with the column; ``<key>_at_clamp`` for the largest ratios,
    the runs whose maximum is the log-ratio clamp."""
    out = {}
    for arm in ("ppo_dec", "rgpo_dec", "ppo_dec_kl", "rgpo_dec_nokl", "ppo_plain", "rgpo_plain"):
        out[arm] = {}
        for e in CONFIRM_ENVS:
            runs = data[arm][e]
            row = {}
            for key in (*START_KEYS, *EPOCH_KEYS, "behaviour_ratio_beyond_2", "is_weight_truncated_frac"):
                seeds = [
                    float(m[key].max() if key.endswith("_max") else m[key].mean())
                    for _, _, m in runs
                    if key in m
                ]
                row[key] = float(np.mean(seeds)) if seeds else None
                row[f"{key}_n"] = len(seeds)
                if key.endswith("_max"):
                    row[f"{key}_at_clamp"] = sum(x >= RATIO_AT_CLAMP for x in seeds)
            out[arm][e] = row
    return out


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


def _para(text: str) -> str:
    """``text`` on one line: a paragraph written across source lines."""
    return " ".join(text.split())


def _clamped(g: dict, key: str) -> str:
    k = g.get(f"{key}_at_clamp", 0)
    return f"; {k} at clamp" if k else ""


def _f(x, digits=3) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def _p(x) -> str:
    return "-" if x is None or not np.isfinite(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


def _ns(c: dict, a: str, b: str) -> str:
    """The n per arm and environment and test (1)'s Holm p: '(n = 5 / 5 Walker2d-v4, ...; Holm p = x)'."""
    ns = ", ".join(
        f"{c['per_env'][e]['n_a']} / {c['per_env'][e]['n_b']} {e}" for e in CONFIRM_ENVS if e in c["per_env"]
    )
    return f"(n = {ns}, {LABELS[a]} / {LABELS[b]}; Holm p = {_p(c['aggregate']['p_holm'])})"


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
        f"decoupled RGPO vs decoupled PPO at L = 8: normalised IQM {_f(agg['a'], 2)} vs {_f(agg['b'], 2)}, "
        f"difference {_f(agg['diff'], 2)} [{_f(agg['low'], 2)}, {_f(agg['high'], 2)}], "
        f"Holm p = {_p(agg['p_holm'])}: "
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
        f"{LABELS['ppo_dec_kl']} {gate['verdict']}, Holm p = {_p(gate['p_holm'])}; controller: "
        f"{LABELS['ppo_dec_kl']} vs {LABELS['ppo_dec']} {ctl['verdict']}, Holm p = {_p(ctl['p_holm'])})."
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
        numbers = (
            f"normalised IQM difference {_f(agg['diff'], 2)} [{_f(agg['low'], 2)}, {_f(agg['high'], 2)}], "
            f"Holm p = {_p(agg['p_holm'])}"
        )
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


def report_md(
    suite: Suite, tables, comparisons, ret, gates, poi, prov, n_boot: int, sens: dict | None = None
) -> str:
    status, prefix = status_of(suite.missing, prov)
    interim = "interim: " if status != "final" else ""
    lines = [
        "# Policy lag confirmed or refuted (policy_lag_confirm)",
        "",
        "Command: `python -m rgpo_lab.mujoco_confirm_report`. Rule: "
        "results/mujoco/policy_lag_confirm/RULES.md (committed before the runs). "
        f"Status: **{status}**.",
        "",
        "## Evaluation return at 1M steps: the L = 8 arms and the L = 0 baselines (raw mean ± std (n); "
        "normalised IQM; Secondary: optimality gap)",
        "",
        "| arm | " + " | ".join(CONFIRM_ENVS) + " | pooled IQM | Secondary: pooled gap |",
        "|---|" + "---|" * (len(CONFIRM_ENVS) + 2),
    ]
    for arm in ARMS:
        t = tables[arm]
        cells = [
            f"{_f(t[e]['mean'], 0)} ± {_f(t[e]['std'], 0)} ({t[e]['n']}); {_f(t[e]['iqm_norm'], 2)}; "
            f"{_f(t[e]['gap'], 2)}"
            for e in CONFIRM_ENVS
        ]
        lines.append(
            f"| {LABELS[arm]} | "
            + " | ".join(cells)
            + f" | {_f(t['pooled']['iqm_norm'], 2)} | {_f(t['pooled']['gap'], 2)} |"
        )
    lines += [
        "",
        "## Comparisons (a - b; normalised IQM difference with 95% stratified-bootstrap interval, Welch per "
        "environment on raw returns; Holm over the four tests of each row)",
        "",
    ]
    if interim:
        lines += [
            "Interim (see the status above): every verdict in this table is provisional.",
            "",
        ]
    lines += [
        "| family | question | a vs b | IQM diff [95%] | Holm p | verdict | "
        + " | ".join(f"{e}: diff, Holm p, verdict" for e in CONFIRM_ENVS)
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(CONFIRM_ENVS),
    ]
    for (family, name, a, b), c in zip(COMPARISONS, comparisons, strict=True):
        agg = c["aggregate"]
        env_cells = [
            f"{_f(c['per_env'][e]['diff'], 0)}, {_p(c['per_env'][e]['p_holm'])}, {c['per_env'][e]['verdict']}"
            for e in CONFIRM_ENVS
        ]
        partial = (
            "" if len(agg["envs"]) == len(CONFIRM_ENVS) else f" (only {', '.join(agg['envs']) or 'none'})"
        )
        lines.append(
            f"| {family} | {name} | {LABELS[a]} vs {LABELS[b]} | {_f(agg['diff'], 2)}{partial} "
            f"[{_f(agg['low'], 2)}, {_f(agg['high'], 2)}] | {_p(agg['p_holm'])} | "
            f"{interim}{agg['verdict']} | " + " | ".join(env_cells) + " |"
        )
    lines += [
        "",
        _para(f"""How the rule is applied (the report's interpretation where RULES.md leaves room): family A
        is the four tests of its row, Holm-corrected together. In family B each comparison's own four tests
        are one Holm group ("Holm within the comparison"), not the tests of all its comparisons together, and
        a family B comparison is significant when its test (1), the normalised IQM difference over the three
        environments, has a Holm verdict of higher or lower; the per-environment Welch verdicts are reported
        beside it and enter no attribution. The cause is read from the gate row and the controller (PPO) row
        (the rule's "PPO + KL penalty vs decoupled PPO"); the controller (RGPO) row is reported, not used. The
        decoupling sentence is given whatever family A says: it is about each method's own arms, not the cause
        of family A's difference. Bootstrap p: twice the smaller tail of the resampled differences at 0
        ({n_boot:,} resamples), floored at 1 / {n_boot:,} = {_p(1.0 / n_boot)}, since a tail of 0 resamples
        only says p < 1 / n_boot. A row with an environment of fewer than 2 runs in an arm aggregates the
        others (named)."""),
        "",
        f"**Reading (RULES.md):** {prefix}{attribution_words(comparisons)}",
        "",
        f"**Decoupling (RULES.md):** {prefix}{decoupling_words(comparisons)}",
        "",
    ]
    lines += [
        "## Secondary: probability of improvement, decoupled RGPO over decoupled PPO at L = 8",
        "",
        _para(f"""rliable's probability of improvement: per environment P(X > Y) over all pairs of a decoupled
        RGPO run X and a decoupled PPO run Y (ties 1/2), averaged over the environments, with a 95%
        stratified-bootstrap interval (runs resampled within each environment, {poi["n_boot"]:,} resamples,
        the primary's rng scheme and seed). Secondary, never decisive."""),
        "",
        "| a vs b | mean over environments [95%] | " + " | ".join(CONFIRM_ENVS) + " |",
        "|---|---|" + "---|" * len(CONFIRM_ENVS),
        f"| {LABELS['rgpo_dec']} vs {LABELS['ppo_dec']} | {_f(poi['mean'], 2)}"
        + ("" if len(poi["envs"]) == len(CONFIRM_ENVS) else f" (only {', '.join(poi['envs']) or 'none'})")
        + f" [{_f(poi['low'], 2)}, {_f(poi['high'], 2)}] | "
        + " | ".join(_f(poi["per_env"][e], 2) for e in CONFIRM_ENVS)
        + " |",
        "",
        "## Secondary: retention (mean L = 8 / mean L = 0), decoupled RGPO vs decoupled PPO",
        "",
        "| env | RGPO | PPO | diff [95%] | Holm p |",
        "|---|---|---|---|---|",
    ]
    for e in CONFIRM_ENVS:
        r = ret[e]
        lines.append(
            f"| {e} | {_f(r['ratio_a'])} | {_f(r['ratio_b'])} | {_f(r['diff'])} [{_f(r['low'])}, "
            f"{_f(r['high'])}] | {_p(r['p_holm'])} |"
        )
    lines += [
        "",
        "## Secondary: what the gate / clip saw, before each update's first epoch (start) vs the epoch means",
        "",
        _para("""Seed means of per-iteration values (the largest ratio: the seed mean of each run's maximum),
        each with (n), the runs that log the column. Plain arms see r = pi / pi_behaviour at the start. For
        the decoupled arms the start ratios are 1 by construction (r = pi / pi_prox, and pi_prox is pi at the
        start of the update; their behaviour correction is the truncated weight), so only the plain arms'
        start numbers say whether the gate (or the clip) acted on the stale samples. `-`: not logged by those
        runs (policy_lag's runs predate the start columns; their behaviour_ratio_beyond_2 is the same quantity
        as start_ratio_beyond_2)."""),
        "",
        "| arm | env | start beyond 1.2 | start beyond 2 | start largest r | start rejected | epoch rejected "
        "| epoch largest r | behaviour beyond 2 | truncated weights | mean beta | mean epochs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    columns = (
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
    for arm, per_env in gates.items():
        for e, g in per_env.items():
            cells = [
                "-" if g[key] is None else f"{_f(g[key], digits)} ({g[key + '_n']}{_clamped(g, key)})"
                for key, digits in columns
            ]
            lines.append(f"| {LABELS[arm]} | {e} | " + " | ".join(cells) + " |")
    clamped = [
        v
        for per_env in gates.values()
        for g in per_env.values()
        for k, v in g.items()
        if k.endswith("_at_clamp")
    ]
    if any(clamped):
        lines += [
            "",
            _para(f""""k at clamp": in k of the runs the largest ratio is exp({LOG_RATIO_CLAMP:g}) =
            {np.exp(LOG_RATIO_CLAMP):.3g}, where log-ratios are clamped (rgpo_trl.core.gates.LOG_RATIO_CLAMP):
            the true ratio was at least that, and a mean over such runs is not a measured value."""),
        ]
    lines += [
        "",
        "## Provenance",
        "",
        _para(f"""The suite was fixed at {SUITE_COMMIT}. Its own runs, by every commit each ran at
        (final.json's git_commits, resumes included), each commit's code path compared with the suite commit's
        as syntax trees (the scripts or the lab runner, rgpo_trl's loss, gates, controllers, registry and cli,
        and the names the scripts take from rgpo_trl and rgpo_trl.core; the closing console line and
        docstrings left out). The status is final only if every one of them is on the same code path."""),
        "",
    ]
    what = {True: "same code path", False: "DIFFERENT code path", None: "code path not checked"}
    for g in prov["own"]:
        commits = " then ".join(c[:8] for c in g["commits"])
        n = len(g["runs"])
        lines.append(f"- {commits}: {n} run{'s' if n != 1 else ''} ({what[g['same']]})")
        if g["same"] is not True:
            lines.append(f"  - runs: {', '.join(g['runs'])}")
    for c, check in prov["checks"].items():
        if check["notes"]:
            lines.append(f"- {c[:8]}, {what[check['same']]}: {'; '.join(check['notes'])}")
    lines += [
        "",
        _para("""The runs it reuses were made by earlier suites at their own commits, not checked against the
        suite commit here; RULES.md: the new code of this suite (`--kl-penalty`, start-of-update statistics)
        is bit-identical to the code those runs were made with on the same machine, checked over the first
        39-44 iterations of Walker2d seed 0 of both decoupled arms (--compile), and reused and new seeds are
        equally valid draws, not replays. By the commits they ran at:"""),
        "",
    ]
    for g in prov["reused"]:
        suites = ", ".join(f"{s} {n}" for s, n in g["suites"].items())
        n = g["runs"]
        lines.append(
            f"- {' then '.join(c[:8] for c in g['commits'])}: {n} run{'s' if n != 1 else ''} ({suites})"
        )
    n_missing = sum(map(len, suite.missing.values()))
    if n_missing:
        counts = ", ".join(f"{cls} {len(suite.missing[cls])}" for cls in MISSING_CLASSES)
        lines += [
            "",
            f"## Not finished ({n_missing}: {counts})",
            "",
            _para("""As found in the results read: not started, no run folder; incomplete, a run folder
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
    lines += [
        "",
        "## Secondary: training curves",
        "",
        "Training return (last 100 episodes) per iteration, median and interquartile band over seeds, for "
        "every arm: the decoupled L = 8 arms (top row), the plain L = 8 arms and the L = 0 baselines (bottom "
        "row). At L = 8 the episodes are collected by the actor of 8 iterations earlier; secondary, never "
        "decisive.",
        "",
        "![curves](curves.png)",
        "",
    ]
    if sens is not None:
        lines += sensitivity_lines(sens, comparisons)
    return "\n".join(lines) + "\n"


CURVE_ROWS = (  # every arm has a curve: the decoupled L = 8 arms, then the plain L = 8 arms and the baselines
    (("ppo_dec", "rgpo_dec", "ppo_dec_kl", "rgpo_dec_nokl"), "L = 8, decoupled arms"),
    (("ppo_plain", "rgpo_plain", "ppo_L0", "rgpo_L0"), "plain arms at L = 8 and the L = 0 baselines"),
)


def curves(data, out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_envs = len(CONFIRM_ENVS)
    fig, axes = plt.subplots(
        len(CURVE_ROWS), n_envs, figsize=(5 * n_envs, 3.6 * len(CURVE_ROWS)), squeeze=False
    )
    for row, (arms, title) in zip(axes, CURVE_ROWS, strict=True):
        for ax, e in zip(row, CONFIRM_ENVS, strict=True):
            for arm in arms:
                runs = data[arm][e]
                if not runs:
                    continue
                n = min(len(m) for _, _, m in runs)
                x = runs[0][2]["global_step"].to_numpy()[:n]
                y = np.stack([m["return_last100"].to_numpy()[:n] for _, _, m in runs])
                lo, mid, hi = np.nanpercentile(y, [25, 50, 75], axis=0)
                colour = f"C{list(ARMS).index(arm)}"  # one colour per arm across both rows
                ax.plot(x, mid, lw=1, color=colour, label=f"{LABELS[arm]} (n={len(runs)})")
                ax.fill_between(x, lo, hi, color=colour, alpha=0.2)
            ax.set_title(f"{e}: {title}", fontsize=9)
            ax.set_xlabel("environment steps")
            ax.set_ylabel("training return (last 100 episodes)")
        row[0].legend(fontsize=7)
    fig.suptitle(
        "Secondary (never decisive): median and interquartile band over seeds; at L = 8 the training "
        "episodes are the lagged actor's",
        fontsize=9,
    )
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build(results: str = RESULTS, out: str = OUT, n_boot: int = 10_000, plots: bool = True) -> str:
    suite = load(results)
    data = suite.data
    norm = Normaliser.load(os.path.join(results, "normalisation", "baselines.json"))
    tables = arm_table(data, norm)
    comparisons = [compare(data, norm, a, b, n_boot) for _, _, a, b in COMPARISONS]
    ret = retention(data, n_boot)
    gates = gate_activity(data)
    poi = improvement(data, n_boot)
    prov = provenance(suite.commits)
    status, prefix = status_of(suite.missing, prov)
    sens = sensitivity(data, norm, n_boot)
    md = report_md(suite, tables, comparisons, ret, gates, poi, prov, n_boot, sens)
    os.makedirs(out, exist_ok=True)
    if plots:
        curves(data, out)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    studies = {
        "status": status,
        "missing": suite.missing,
        "failed_why": suite.why_failed,
        "arms": tables,
        "comparisons": [
            {"family": fam, "name": name, "a": a, "b": b, **c}
            for (fam, name, a, b), c in zip(COMPARISONS, comparisons, strict=True)
        ],
        "retention": ret,
        "gate_activity": gates,
        "reading": prefix + attribution_words(comparisons),
        "decoupling": prefix + decoupling_words(comparisons),
        "probability_of_improvement": poi,
        "provenance": prov,
        "sensitivity": sens,
    }
    with open(os.path.join(out, "studies.json"), "w") as f:
        json.dump(plain(studies), f, indent=1, allow_nan=False)
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.mujoco_confirm_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--results", default=RESULTS)
    p.add_argument("--out", default=OUT)
    p.add_argument("--bootstrap", type=int, default=10_000)
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args(argv)
    print(build(a.results, a.out, a.bootstrap, not a.no_plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
