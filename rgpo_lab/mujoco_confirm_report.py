"""The policy-lag confirmation (suite policy_lag_confirm) read by its rule, results/mujoco/policy_lag_confirm/
RULES.md, committed before its runs.

    python -m rgpo_lab.mujoco_confirm_report                # -> results/mujoco/policy_lag_confirm/report/

Run from the repository root. Reads every run the suite lists (its own and the ones it reuses from
policy_lag, main_compiled and annealed5), so a partial suite gives an interim report that names what is
missing. Outcome: the deterministic evaluation return at 1M steps, normalised by
rgpo_lab.mujoco_normalisation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from rgpo_lab.json_values import plain
from rgpo_lab.mujoco_grid import CONFIRM_ENVS, ROOT, SUITES, GridRun
from rgpo_lab.mujoco_normalisation import Normaliser
from rgpo_lab.statistics import (
    aggregate_difference,
    holm,
    iqm,
    mean_std,
    optimality_gap,
    probability_of_improvement,
    ratio_difference_test,
    verdict,
    welch,
)

RESULTS = os.path.join(ROOT, "results", "mujoco")
OUT = os.path.join(RESULTS, "policy_lag_confirm", "report")
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


def run_dir(results: str, r: GridRun) -> str:
    return os.path.join(results, r.suite, r.name)


def load(results: str = RESULTS) -> tuple[dict, list[str]]:
    """{arm: {env: [(seed, eval return, metrics rows)]}} of the finished runs, and the missing runs' names."""
    import pandas as pd

    by_key = {v: k for k, v in ARMS.items()}
    data: dict = {arm: {env: [] for env in CONFIRM_ENVS} for arm in ARMS}
    missing = []
    for r in SUITES["policy_lag_confirm"]:
        d = run_dir(results, r)
        final = os.path.join(d, "final.json")
        if not os.path.isfile(final):
            missing.append(f"{r.suite}/{r.name}")
            continue
        with open(final) as f:
            ret = float(json.load(f)["eval_return_mean"])
        metrics = pd.read_csv(os.path.join(d, "metrics.csv"))
        data[by_key[(r.method, r.variant)]][r.env_id].append((r.seed, ret, metrics))
        commit = "unknown"
        if os.path.isfile(os.path.join(d, "config.json")):
            with open(os.path.join(d, "config.json")) as f:
                commit = json.load(f).get("git_commit") or "unknown"
        COMMITS.setdefault(commit, []).append(f"{r.suite}/{r.name}")
    return data, missing


COMMITS: dict[str, list[str]] = {}  # git commit -> the runs made with it (filled by `load`)
SUITE_COMMIT = "393cfc0"  # the commit the suite was fixed at; its runs are launched from a worktree of it
# what decides a run's trajectory: the scripts, the loss, the gates, the controllers
CODE_PATH = (
    "mujoco_baselines",
    "rgpo_trl/core/gates.py",
    "rgpo_trl/core/objective.py",
    "rgpo_trl/core/kl_control.py",
)
# From issue 48 on, the code the suite's runs execute (mujoco_baselines/ at the suite commit) is the lab
# runner, moved here with its code unchanged but for import paths; mujoco_baselines/ then holds the product's
# single-file scripts, which the grid does not run. At such a commit the suite commit's
# mujoco_baselines/<file> is compared with RUNNER/<file>.
RUNNER = "rgpo_lab/mujoco_runner"
OLD_PACKAGE, RUNNER_PACKAGE = "mujoco_baselines", "rgpo_lab.mujoco_runner"


def _git_show(commit: str, path: str) -> str | None:
    import subprocess

    shown = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:{path}"], capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def _code_without_finish(commit: str, path: str) -> str | None:
    """``path`` at ``commit`` as an AST dump without TrainingRun.finish (it only prints the closing line) and
    without docstrings (help texts), imports of the old package ``mujoco_baselines`` written as the runner's
    ``rgpo_lab.mujoco_runner`` (its location from issue 48 on)."""
    import ast

    source = _git_show(commit, path)
    if source is None:
        return None
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "TrainingRun":
            node.body = [n for n in node.body if not (isinstance(n, ast.FunctionDef) and n.name == "finish")]
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == OLD_PACKAGE:
            node.module = RUNNER_PACKAGE + node.module[len(OLD_PACKAGE) :]
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == OLD_PACKAGE:
                    alias.name = RUNNER_PACKAGE + alias.name[len(OLD_PACKAGE) :]
    return ast.dump(tree)


def same_code_path(commit: str) -> bool | None:
    """Whether ``commit`` has the suite commit's scripts, loss, gates and controllers (CODE_PATH), compared
    as syntax trees, TrainingRun.finish (the closing console line) and docstrings left out; at a commit with
    the lab runner (issue 48 on) the suite commit's mujoco_baselines/ is compared with the runner (RUNNER).
    None where git cannot tell (an unknown commit, a file missing at ``commit``)."""
    import subprocess

    listed = subprocess.run(
        ["git", "-C", ROOT, "ls-tree", "-r", "--name-only", SUITE_COMMIT, "--", *CODE_PATH],
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0 or commit == "unknown":
        return None
    has_runner = _git_show(commit, f"{RUNNER}/common.py") is not None
    for path in (p for p in listed.stdout.split() if p.endswith(".py")):
        theirs_path = path
        if has_runner and path.startswith(OLD_PACKAGE + "/"):
            theirs_path = RUNNER + path[len(OLD_PACKAGE) :]
        mine, theirs = _code_without_finish(SUITE_COMMIT, path), _code_without_finish(commit, theirs_path)
        if theirs is None:
            return None
        if mine != theirs:
            return False
    return True


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


def gate_activity(data) -> dict:
    """Per L = 8 arm and environment, seed means of the per-iteration means: what the gate or the clip saw
    before each update's first epoch (start_*) next to the epoch means; None where the runs predate the
    start-of-update columns."""
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
            out[arm][e] = row
    return out


def _f(x, digits=3) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def _p(x) -> str:
    return "-" if x is None or not np.isfinite(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


def report_md(data, missing, tables, comparisons, ret, gates, attribution) -> str:
    total = len(SUITES["policy_lag_confirm"])
    status = "final" if not missing else f"INTERIM: {total - len(missing)} of {total} runs finished"
    lines = [
        "# Policy lag confirmed or refuted (policy_lag_confirm)",
        "",
        "Command: `python -m rgpo_lab.mujoco_confirm_report`. Rule: "
        "results/mujoco/policy_lag_confirm/RULES.md (committed before the runs). "
        f"Status: **{status}**.",
        "",
        "## Evaluation return at 1M steps, L = 8 (raw mean ± std (n); normalised IQM; optimality gap)",
        "",
        "| arm | " + " | ".join(CONFIRM_ENVS) + " | pooled IQM | pooled gap |",
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
            f"[{_f(agg['low'], 2)}, {_f(agg['high'], 2)}] | {_p(agg['p_holm'])} | {agg['verdict']} | "
            + " | ".join(env_cells)
            + " |"
        )
    interim = "Interim, on an incomplete suite: " if missing else ""
    lines += ["", f"**Reading (RULES.md):** {interim}{attribution}", ""]
    lines += [
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
        "## What the gate / clip saw: before each update's first epoch (start) vs the epoch means",
        "",
        "Seed means of per-iteration values (the largest ratio: the seed mean of each run's maximum). Plain "
        "arms see r = pi / pi_behaviour at the start; decoupled arms r = 1 (their behaviour correction is "
        "the truncated weight). `-`: not logged by those runs (policy_lag's runs predate the start columns; "
        "their behaviour_ratio_beyond_2 is the same quantity as start_ratio_beyond_2).",
        "",
        "| arm | env | start beyond 1.2 | start beyond 2 | start largest r | start rejected | epoch rejected "
        "| epoch largest r | behaviour beyond 2 | truncated weights | mean beta | mean epochs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, per_env in gates.items():
        for e, g in per_env.items():
            cells = [
                _f(g["start_ratio_beyond_1.2"]),
                _f(g["start_ratio_beyond_2"]),
                _f(g["start_ratio_max"], 2),
                _f(g["start_rejected_frac"]),
                _f(g["rejected_frac"]),
                _f(g["ratio_max"], 2),
                _f(g["behaviour_ratio_beyond_2"]),
                _f(g["is_weight_truncated_frac"]),
                _f(g["kl_coef"], 3),
                _f(g["epochs"], 2),
            ]
            lines.append(f"| {LABELS[arm]} | {e} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Provenance",
        "",
        f"The suite was fixed at {SUITE_COMMIT}. Its own runs, by the commit they record (their scripts, "
        "loss, gates and controllers compared with the suite commit's as syntax trees, the closing console "
        "line left out); the runs it reuses were made by earlier suites at their own commits, on "
        "trajectories checked identical (RULES.md):",
        "",
    ]
    what = {True: "same code path", False: "DIFFERENT code path", None: "not checked"}
    n_own = 0
    for commit, runs in sorted(COMMITS.items(), key=lambda kv: -len(kv[1])):
        own = [r for r in runs if r.startswith("policy_lag_confirm/")]
        n_own += len(own)
        if own:
            lines.append(f"- {commit[:8]}: {len(own)} runs ({what[same_code_path(commit)]})")
    reused = sum(map(len, COMMITS.values())) - n_own
    lines.append(f"- reused from policy_lag, main_compiled and annealed5: {reused} runs")
    if missing:
        lines += ["", f"## Not finished ({len(missing)})", "", ", ".join(missing)]
    lines += ["", "![curves](curves.png)", ""]
    return "\n".join(lines) + "\n"


def attribution_words(comparisons) -> str:
    """RULES.md's attribution, applied to the corrected tests."""
    byname = {name: c for (_, name, _, _), c in zip(COMPARISONS, comparisons, strict=True)}
    a = byname["more robust"]["aggregate"]
    if not np.isfinite(a["p_holm"]):
        return "not tested (fewer than 2 runs in a cell)."
    head = (
        f"decoupled RGPO vs decoupled PPO at L = 8: normalised IQM {_f(a['a'], 2)} vs {_f(a['b'], 2)}, "
        f"difference {_f(a['diff'], 2)} [{_f(a['low'], 2)}, {_f(a['high'], 2)}], Holm p = {_p(a['p_holm'])}: "
    )
    if a["verdict"] == "no significant difference":
        return head + "not confirmed (no significant difference); no cause is attributed."
    if a["verdict"] == "lower":
        return head + "refuted: decoupled RGPO is significantly less robust."
    gate = byname["gate"]["aggregate"]["verdict"] == "higher"
    ctl = byname["controller (PPO)"]["aggregate"]["verdict"] == "higher"
    cause = (
        "gate and controller" if gate and ctl else "gate" if gate else "controller" if ctl else "undetermined"
    )
    return head + f"confirmed; cause: {cause}."


def curves(data, out: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CONFIRM_ENVS), figsize=(5 * len(CONFIRM_ENVS), 3.6))
    for ax, e in zip(axes, CONFIRM_ENVS, strict=True):
        for arm in ("ppo_dec", "rgpo_dec", "ppo_dec_kl", "rgpo_dec_nokl"):
            runs = data[arm][e]
            if not runs:
                continue
            n = min(len(m) for _, _, m in runs)
            x = runs[0][2]["global_step"].to_numpy()[:n]
            y = np.stack([m["return_last100"].to_numpy()[:n] for _, _, m in runs])
            lo, mid, hi = np.nanpercentile(y, [25, 50, 75], axis=0)
            ax.plot(x, mid, lw=1, label=f"{LABELS[arm]} (n={len(runs)})")
            ax.fill_between(x, lo, hi, alpha=0.2)
        ax.set_title(f"{e}, L = 8")
        ax.set_xlabel("environment steps")
        ax.set_ylabel("training return (last 100 episodes)")
    axes[0].legend(fontsize=7)
    fig.suptitle("median and interquartile band over seeds", fontsize=9)
    fig.tight_layout()
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "curves.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build(results: str = RESULTS, out: str = OUT, n_boot: int = 10_000, plots: bool = True) -> str:
    COMMITS.clear()
    data, missing = load(results)
    norm = Normaliser.load(os.path.join(results, "normalisation", "baselines.json"))
    tables = arm_table(data, norm)
    comparisons = [compare(data, norm, a, b, n_boot) for _, _, a, b in COMPARISONS]
    ret = retention(data, n_boot)
    gates = gate_activity(data)
    words = attribution_words(comparisons)
    md = report_md(data, missing, tables, comparisons, ret, gates, words)
    os.makedirs(out, exist_ok=True)
    if plots:
        curves(data, out)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    studies = {
        "missing": missing,
        "arms": tables,
        "comparisons": [
            {"family": fam, "name": name, "a": a, "b": b, **c}
            for (fam, name, a, b), c in zip(COMPARISONS, comparisons, strict=True)
        ],
        "retention": ret,
        "gate_activity": gates,
        "reading": words,
        "probability_of_improvement": {
            e: probability_of_improvement(returns(data, "rgpo_dec", e), returns(data, "ppo_dec", e))
            if len(returns(data, "rgpo_dec", e)) and len(returns(data, "ppo_dec", e))
            else None
            for e in CONFIRM_ENVS
        },
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
