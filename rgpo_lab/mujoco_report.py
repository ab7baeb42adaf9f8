"""The paper's MuJoCo tables and figures from a results directory, next to the paper's own numbers.

    python -m rgpo_lab.mujoco_report results/mujoco --out results/mujoco/report

Reads only ``<results>/<suite>/<run>/{config.json, metrics.csv, final.json}`` (as written by
``mujoco_grid.py``) and the suite definitions in ``mujoco_grid.py`` (to list the runs that have not run yet).
Writes ``<out>/report.md``, one CSV per table and the figures as PNG. Only finished runs (with ``final.json``)
enter a table; the others are counted as in progress or not run, never filled in.

Statistics (per run first, then across seeds; n = number of finished seeds, stated in every cell):
- final return: mean of the run's last 100 episodes (``final.json``); mean +- sample std (ddof = 1) over
  seeds; RGPO vs PPO: one-tailed Welch t-test (H1: RGPO > PPO), as the paper;
- KL: ``kl`` = mean over the iteration's mini-batches of mean(r - 1 - log r) before each update, ``kl_final``
  = the iteration's final policy against pi_old over the whole batch; mean over iterations and seeds, max over
  iterations and seeds, spike rate = share of iterations with KL > 0.04 (2 x target);
- ESS, gradient variance: mean over iterations and seeds;
- beyond the paper (the rliable protocol of Agarwal et al. 2021, computed with scipy because rliable 1.2 needs
  arch < 8, whose 7.x releases fail to import with pandas 3, and pinning pandas < 3 for every user of the
  extra would be worse): interquartile mean (IQM) of PPO-normalised final returns (each run divided by the
  mean of the PPO runs of its environment) with a stratified-bootstrap 95% CI (runs resampled within each
  environment), and the probability of improvement P(RGPO > PPO) (Mann-Whitney U / (n m), averaged over
  environments) with its stratified-bootstrap 95% CI. Where the reference mean is within one std of 0
  (constant-rate PPO on Ant, found after those runs), a min-max normalised aggregate (each environment's
  worst run of the study -> 0, best -> 1) is added beside the pre-registered one.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mujoco_baselines import SPIKE_KL  # a KL spike: twice the target, the scripts' --spike-kl default
from rgpo_lab.mujoco_grid import MUJOCO_ENVS as ENVS
from rgpo_lab.mujoco_grid import MUJOCO_METHODS as METHODS
from rgpo_lab.mujoco_grid import SUITES
from rgpo_lab.statistics import (
    holm,
    iqm,
    mean_std,
    performance_profile,
    probability_of_improvement,
    ratio_difference_test,
    stratified_bootstrap_ci,
    verdict,
    welch,
)

# The paper's numbers (tables main_results, kl_stats, ess_all, gate_cmp, k_sweep, longhorizon; Ablation F).
PAPER_RETURNS = {  # env -> method -> (mean, std or None)
    "HalfCheetah-v4": {"ppo": (3107, 1489), "trpo": (1413, 233), "awr": (1509, 104), "rgpo": (3006, 790)},
    "Walker2d-v4": {"ppo": (1653, 853), "trpo": (1350, 131), "awr": (350, None), "rgpo": (2998, 412)},
    "Hopper-v4": {"ppo": (1732, 661), "trpo": (1335, 173), "awr": (730, None), "rgpo": (1727, 238)},
    "Ant-v4": {"ppo": (709, 237), "trpo": (332, 109), "awr": (58, None), "rgpo": (1043, 178)},
}
PAPER_WELCH_P = {"Walker2d-v4": 0.047, "Ant-v4": 0.064}
PAPER_KL = {  # env -> method -> (mean KL, max KL, spike rate)
    "HalfCheetah-v4": {
        "awr": (1.983, 58.26, 0.99),
        "ppo": (0.243, 11.59, 0.79),
        "rgpo": (0.021, 0.038, 0.0),
        "trpo": (0.007, 0.010, 0.0),
    },
    "Walker2d-v4": {
        "awr": (0.795, 28.02, 0.92),
        "ppo": (0.119, 0.621, 0.73),
        "rgpo": (0.020, 0.042, 0.0),
        "trpo": (0.007, 0.010, 0.0),
    },
    "Ant-v4": {
        "awr": (18.85, 1000, 1.0),
        "ppo": (0.409, 7.271, 0.84),
        "rgpo": (0.020, 0.045, 0.0),
        "trpo": (0.005, 0.010, 0.0),
    },
    "Hopper-v4": {
        "awr": (0.085, 0.459, 0.73),
        "ppo": (0.043, 0.196, 0.44),
        "rgpo": (0.019, 0.047, 0.0),
        "trpo": (0.007, 0.010, 0.0),
    },
}
PAPER_ESS = {
    "HalfCheetah-v4": {"ppo": 0.973, "trpo": 0.977, "rgpo": 0.876, "awr": 0.654},
    "Walker2d-v4": {"ppo": 0.974, "trpo": 0.974, "rgpo": 0.870, "awr": 0.704},
    "Ant-v4": {"ppo": 0.970, "trpo": 0.972, "rgpo": 0.871, "awr": 0.456},
    "Hopper-v4": {"ppo": 0.980, "trpo": 0.969, "rgpo": 0.881, "awr": 0.628},
}
PAPER_GATES = {  # gate -> (mean return of the last-20-iteration window, seed std, ESS, mean KL)
    "sigmoid": (3414, 449, 0.869, 0.0198),
    "clipped_linear": (3181, 1351, 0.962, 0.0212),
    "temperature": (1886, 854, 0.990, 0.0197),
}
PAPER_K_SWEEP = {
    "ppo_1epoch": 1630,
    "k2_1epoch": 1026,
    "k5_1epoch": 1959,
    "k10_1epoch": 1921,
    "k20_1epoch": 1756,
}
PAPER_BETA0 = {
    "beta0.2_target0.02": 2805,
    "beta0.5_target0.02": 3623,
    "beta1.0_target0.02": 3438,
    "beta0.5_target0.01": 3523,
}
PAPER_LONG = {
    "ppo": {1: (2247, 956), 3: (1896, 66), 6: (1116, 417)},
    "rgpo": {1: (2946, 768), 3: (2696, 1114), 6: (3095, 980)},
}
PAPER_LONG_P6 = 0.028


@dataclass
class RunRecord:
    """A run read back from its directory: config.json, metrics.csv and, once it has finished, final.json
    (``final`` None while it runs). What `mujoco_grid` launches is a `GridRun`."""

    suite: str
    name: str
    cfg: dict
    metrics: pd.DataFrame
    final: dict | None

    @property
    def method(self) -> str:
        return self.cfg["exp_name"].replace("_continuous_action", "")

    @property
    def env(self) -> str:
        return self.cfg["env_id"]

    @property
    def variant(self) -> str:  # mujoco_grid.py names runs {env}__{method}__{variant}__s{seed}__{steps}k
        parts = self.name.split("__")
        return parts[2] if len(parts) == 5 else "default"

    @property
    def final_return(self) -> float:
        return float(self.final["final_return"]) if self.final else float("nan")


def load_runs(root: str) -> list[RunRecord]:
    runs = []
    for suite in sorted(os.listdir(root)):
        suite_dir = os.path.join(root, suite)
        if not os.path.isdir(suite_dir):
            continue
        for name in sorted(os.listdir(suite_dir)):
            d = os.path.join(suite_dir, name)
            metrics = os.path.join(d, "metrics.csv")
            if not os.path.isfile(os.path.join(d, "config.json")) or not os.path.isfile(metrics):
                continue
            if os.path.getsize(metrics) == 0:  # a run that has just started: no header yet
                continue
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            final = None
            if os.path.isfile(os.path.join(d, "final.json")):
                with open(os.path.join(d, "final.json")) as f:
                    final = json.load(f)
            runs.append(RunRecord(suite, name, cfg, pd.read_csv(metrics), final))
    return runs


# ----------------------------------------------------------------------------------------------- tables
def _finished(runs, **where) -> list[RunRecord]:
    return [r for r in runs if r.final and all(getattr(r, k) == v for k, v in where.items())]


def _fmt(mean, std, n, digits=0) -> str:
    if n == 0:
        return "not run"
    s = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if np.isfinite(std) else "")
    return f"{s} (n={n})"


def _paper_fmt(ms) -> str:
    mean, std = ms
    return f"{mean}" + (f" ± {std}" if std is not None else "")


def main_returns_table(runs):
    rows = []
    for env in ENVS:
        row = {"env": env}
        finals = {
            m: [r.final_return for r in _finished(runs, suite="main", env=env, method=m)] for m in METHODS
        }
        for m in METHODS:
            mean, std, n = mean_std(finals[m])
            row.update({f"{m}_mean": mean, f"{m}_std": std, f"{m}_n": n})
        ppo, rgpo = row["ppo_mean"], row["rgpo_mean"]
        row["delta_rgpo_vs_ppo"] = (rgpo - ppo) / abs(ppo) if row["ppo_n"] and row["rgpo_n"] else float("nan")
        w = welch(finals["rgpo"], finals["ppo"], "greater")
        row["welch_t"], row["welch_df"], row["welch_p"] = w.t, w.df, w.p
        rows.append(row)
    return pd.DataFrame(rows)


def main_returns_md(t: pd.DataFrame) -> str:
    lines = [
        "`main`'s eager runs (seeds 0-2, as the paper's 3 seeds; no deterministic evaluation): "
        "training return (mean of the last 100 episodes). RGPO vs PPO: one-tailed Welch (H1: RGPO > PPO), "
        "as the paper, uncorrected.",
        "",
        "| env | "
        + " | ".join(f"{m.upper()} ours / paper" for m in METHODS)
        + " | RGPO vs PPO ours / paper | Welch t (df), p ours / paper |",
        "|---|" + "---|" * (len(METHODS) + 2),
    ]
    for _, r in t.iterrows():
        cells = [
            f"{_fmt(r[f'{m}_mean'], r[f'{m}_std'], r[f'{m}_n'])} / {_paper_fmt(PAPER_RETURNS[r.env][m])}"
            for m in METHODS
        ]
        pp, pr = PAPER_RETURNS[r.env]["ppo"][0], PAPER_RETURNS[r.env]["rgpo"][0]
        delta = f"{100 * r.delta_rgpo_vs_ppo:+.0f}%" if np.isfinite(r.delta_rgpo_vs_ppo) else "-"
        welch = f"{r.welch_t:.2f} ({r.welch_df:.1f}), {r.welch_p:.3f}" if np.isfinite(r.welch_p) else "-"
        paper_p = PAPER_WELCH_P.get(r.env)
        lines.append(
            f"| {r.env} | " + " | ".join(cells) + f" | {delta} / {100 * (pr - pp) / pp:+.0f}% | "
            f"{welch} / {paper_p if paper_p is not None else 'n.s.'} |"
        )
    return "\n".join(lines)


def kl_table(runs, suite="main"):
    rows = []
    for env in ENVS:
        for m in METHODS:
            rs = _finished(runs, suite=suite, env=env, method=m)
            if not rs:
                rows.append({"env": env, "method": m, "n": 0})
                continue
            df = pd.concat([r.metrics for r in rs])
            rows.append(
                {
                    "env": env,
                    "method": m,
                    "n": len(rs),
                    "kl_mean": df["kl"].mean(),
                    "kl_max": df["kl"].max(),
                    "kl_minibatch_max": df["kl_max"].max(),
                    "spike_rate": (df["kl"] > SPIKE_KL).mean(),
                    "kl_final_mean": df["kl_final"].mean(),
                    "kl_final_max": df["kl_final"].max(),
                    "spike_rate_final": (df["kl_final"] > SPIKE_KL).mean(),
                    "ess": df["ess"].mean(),
                    "grad_var": df["grad_var"].mean(),
                }
            )
    return pd.DataFrame(rows)


def kl_md(t: pd.DataFrame) -> str:
    lines = [
        "| env | method | n | mean KL ours / paper | max KL ours / paper | spike rate ours / paper | "
        "max mini-batch KL | mean KL_final | max KL_final | spike rate (KL_final) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in t.iterrows():
        pk = PAPER_KL[r.env][r.method]
        if r.n == 0:
            lines.append(
                f"| {r.env} | {r.method} | 0 | not run / {pk[0]} | - / {pk[1]} | - / {pk[2]:.0%} | | | | |"
            )
            continue
        lines.append(
            f"| {r.env} | {r.method} | {r.n} | {r.kl_mean:.4f} / {pk[0]} | {r.kl_max:.4f} / {pk[1]} | "
            f"{r.spike_rate:.0%} / {pk[2]:.0%} | {r.kl_minibatch_max:.4f} | {r.kl_final_mean:.4f} | "
            f"{r.kl_final_max:.4f} | {r.spike_rate_final:.0%} |"
        )
    return "\n".join(lines)


def ess_md(t: pd.DataFrame) -> str:
    lines = [
        "| env | " + " | ".join(f"{m.upper()} ours / paper" for m in METHODS) + " |",
        "|---|" + "---|" * len(METHODS),
    ]
    for env in ENVS:
        cells = []
        for m in METHODS:
            r = t[(t.env == env) & (t.method == m)].iloc[0]
            ours = f"{r.ess:.3f}" if r.n else "not run"
            cells.append(f"{ours} / {PAPER_ESS[env][m]}")
        lines.append(f"| {env} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gates_table(runs):
    """Ablation A on HalfCheetah-v4: sigmoid from `main`, the other gates from `gates`; each other gate
    against sigmoid on the window return (change and one-tailed Welch p for sigmoid > gate)."""
    rows, windows = [], {}
    for gate in PAPER_GATES:
        rs = (
            _finished(runs, suite="main", env="HalfCheetah-v4", method="rgpo")
            if gate == "sigmoid"
            else _finished(runs, suite="gates", env="HalfCheetah-v4", variant=gate)
        )
        window = windows[gate] = [r.metrics["episodic_return"].dropna().iloc[-20:].mean() for r in rs]
        mean, std, n = mean_std(window)
        df = pd.concat([r.metrics for r in rs]) if rs else pd.DataFrame({"ess": [], "kl": []})
        rows.append(
            {
                "gate": gate,
                "n": n,
                "window_return": mean,
                "seed_std": std,
                "final_return": mean_std([r.final_return for r in rs])[0],
                "ess": df["ess"].mean(),
                "kl_mean": df["kl"].mean(),
            }
        )
    t = pd.DataFrame(rows)
    sigmoid = windows["sigmoid"]
    t["vs_sigmoid"] = t.window_return / (np.mean(sigmoid) if sigmoid else np.nan) - 1
    t["p_sigmoid_greater"] = [
        np.nan if g == "sigmoid" else welch(sigmoid, windows[g], "greater").p for g in t.gate
    ]
    return t


def gates_md(t):
    lines = [
        "| gate | n | return (last-20-iteration window) ours / paper | vs sigmoid ours (p, sigmoid > gate) / "
        "paper | seed std ours / paper | ESS ours / paper | mean KL ours / paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, r in t.iterrows():
        p = PAPER_GATES[r.gate]
        paper_vs = "-" if r.gate == "sigmoid" else f"{p[0] / PAPER_GATES['sigmoid'][0] - 1:+.0%}"
        if r.n == 0:
            lines.append(
                f"| {r.gate} | 0 | not run / {p[0]} | - / {paper_vs} | - / {p[1]} | - / {p[2]} | - / {p[3]} |"
            )
            continue
        ours_vs = "-" if r.gate == "sigmoid" or np.isnan(r.vs_sigmoid) else f"{r.vs_sigmoid:+.0%}"
        if not np.isnan(r.p_sigmoid_greater):
            ours_vs += f" (p = {r.p_sigmoid_greater:.2f})"
        lines.append(
            f"| {r.gate} | {r.n} | {r.window_return:.0f} / {p[0]} | {ours_vs} / {paper_vs} | "
            f"{r.seed_std:.0f} / {p[1]} | {r.ess:.3f} / {p[2]} | {r.kl_mean:.4f} / {p[3]} |"
        )
    return "\n".join(lines)


def single_runs_md(runs, suite, paper, title):
    rows, lines = (
        [],
        [f"| {title} | n | final return ours / paper | mean KL | spike rate |", "|---|---|---|---|---|"],
    )
    for variant, value in paper.items():
        method = "ppo" if variant.startswith("ppo") else "rgpo"
        variant_name = variant.removeprefix("ppo_") if method == "ppo" else variant
        rs = _finished(runs, suite=suite, method=method, variant=variant_name)
        mean, _, n = mean_std([r.final_return for r in rs])
        kl = pd.concat([r.metrics["kl"] for r in rs]) if rs else pd.Series(dtype=float)
        rows.append({"variant": variant, "n": n, "final_return": mean, "kl_mean": kl.mean()})
        ours = f"{mean:.0f}" if n else "not run"
        klc = f"{kl.mean():.4f} | {(kl > SPIKE_KL).mean():.0%}" if n else "- | -"
        lines.append(f"| {variant} | {n} | {ours} / {value} | {klc} |")
    return pd.DataFrame(rows), "\n".join(lines)


def _long_runs(runs, method, budget):
    """Finished HalfCheetah runs of the long-horizon table: `main`'s at 1M steps, the `long` suite's at 3M /
    6M."""
    if budget == 1:
        return _finished(runs, suite="main", env="HalfCheetah-v4", method=method)
    return [
        r for r in _finished(runs, suite="long", method=method) if r.cfg["total_timesteps"] == budget * 10**6
    ]


def long_table(runs):
    rows = []
    for m in ("ppo", "rgpo"):
        row = {"method": m}
        for budget in (1, 3, 6):
            row[f"{budget}M"] = [r.final_return for r in _long_runs(runs, m, budget)]
        rows.append(row)
    return rows


def long_kl_table(runs) -> list[dict]:
    """KL to pi_old of the long-horizon runs per method and budget, over every iteration of the cell's runs
    (as kl_table): mean, max and spike rate by ``kl``, mean and spike rate by ``kl_final``."""
    rows = []
    for m in ("ppo", "rgpo"):
        for budget in (1, 3, 6):
            rs = _long_runs(runs, m, budget)
            row = {"method": m, "budget": budget, "n": len(rs)}
            if rs:
                df = pd.concat([r.metrics for r in rs])
                row.update(
                    {
                        "kl_mean": df["kl"].mean(),
                        "kl_max": df["kl"].max(),
                        "spike_rate": (df["kl"] > SPIKE_KL).mean(),
                        "kl_final_mean": df["kl_final"].mean(),
                        "spike_rate_final": (df["kl_final"] > SPIKE_KL).mean(),
                    }
                )
            rows.append(row)
    return rows


def long_kl_md(rows) -> str:
    lines = [
        f"KL to pi_old per budget, over every iteration of the cell's runs (spike: KL > {SPIKE_KL:g}):",
        "",
        "| method | budget | n | mean KL | max KL | spike rate | mean KL_final | spike rate (KL_final) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["n"]:
            lines.append(f"| {r['method']} | {r['budget']}M | 0 | not run | | | | |")
            continue
        lines.append(
            f"| {r['method']} | {r['budget']}M | {r['n']} | {r['kl_mean']:.4f} | {r['kl_max']:.4f} | "
            f"{r['spike_rate']:.0%} | {r['kl_final_mean']:.4f} | {r['spike_rate_final']:.0%} |"
        )
    return "\n".join(lines)


def long_md(rows):
    lines = [
        "1M: `main`'s eager runs (seeds 0-2); 3M and 6M: the `long` suite (seeds 0-2, --compile). Training "
        "return (mean of the last 100 episodes).",
        "",
        "| method | 1M ours / paper | 3M ours / paper | 6M ours / paper |",
        "|---|---|---|---|",
    ]
    for row in rows:
        cells = [
            f"{_fmt(*mean_std(row[f'{b}M']))} / {_paper_fmt(PAPER_LONG[row['method']][b])}" for b in (1, 3, 6)
        ]
        lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    tests = []
    for b in (1, 3, 6):
        w = welch(rows[1][f"{b}M"], rows[0][f"{b}M"], "greater")
        t, df, p = w.t, w.df, w.p
        paper = f" (paper: p = {PAPER_LONG_P6})" if b == 6 else ""
        tests.append(
            f"{b}M: " + (f"t = {t:.2f} (df {df:.1f}), p = {p:.3f}" if np.isfinite(p) else "-") + paper
        )
    return "\n".join(lines) + "\n\nRGPO > PPO, one-tailed Welch: " + "; ".join(tests)


def aggregate(runs, n_boot=2000):
    """IQM of PPO-normalised final returns per method and P(RGPO > PPO), with stratified-bootstrap CIs."""
    per_env = {}
    for env in ENVS:
        finals = {
            m: np.array([r.final_return for r in _finished(runs, suite="main", env=env, method=m)])
            for m in METHODS
        }
        if len(finals["ppo"]) and finals["ppo"].mean() != 0:
            per_env[env] = {m: v / abs(finals["ppo"].mean()) for m, v in finals.items() if len(v)}
    out = {"envs": sorted(per_env), "iqm": {}, "prob_improvement": None}
    for m in METHODS:
        groups = [(v[m],) for v in per_env.values() if m in v]
        if groups:
            stat = lambda gs: iqm(np.concatenate([g[0] for g in gs]))  # noqa: E731
            out["iqm"][m] = {"iqm": stat(groups), "ci95": stratified_bootstrap_ci(groups, stat, n_boot)}
    pairs = [(v["rgpo"], v["ppo"]) for v in per_env.values() if "rgpo" in v and "ppo" in v]
    if pairs:
        stat = lambda gs: float(np.mean([probability_of_improvement(x, y) for x, y in gs]))  # noqa: E731
        out["prob_improvement"] = {"value": stat(pairs), "ci95": stratified_bootstrap_ci(pairs, stat, n_boot)}
    return out


def aggregate_md(agg) -> str:
    if not agg["iqm"]:
        return "not run"
    lines = [
        f"Environments: {', '.join(agg['envs'])}.",
        "",
        "| method | IQM (PPO-normalised) | 95% CI |",
        "|---|---|---|",
    ]
    for m, v in agg["iqm"].items():
        lines.append(f"| {m} | {v['iqm']:.3f} | {v['ci95'][0]:.3f}-{v['ci95'][1]:.3f} |")
    if agg["prob_improvement"]:
        p = agg["prob_improvement"]
        lines += ["", f"P(RGPO > PPO) = {p['value']:.3f} (95% CI {p['ci95'][0]:.3f}-{p['ci95'][1]:.3f})"]
    return "\n".join(lines)


def ppo_kl_md(runs) -> str:
    """The PPO-KL question: return and both KL definitions per setting (seed 0; `default` is main's seed 0),
    below the paper's row (3 seeds; the paper does not say which KL definition it reports)."""
    lines = [
        "| env | method | setting | n | final return | mean KL | max KL | spike rate | mean KL_final | "
        "spike rate (KL_final) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for env in ("HalfCheetah-v4", "Walker2d-v4"):
        for m in ("ppo", "rgpo"):
            (ret, _), (kl_mean, kl_max, spikes) = PAPER_RETURNS[env][m], PAPER_KL[env][m]
            lines.append(f"| {env} | {m} | paper | 3 | {ret} | {kl_mean} | {kl_max} | {spikes:.0%} | | |")
            for variant in ("default", "no_gradclip", "no_advnorm", "no_lranneal", "all_off"):
                rs = (
                    [r for r in _finished(runs, suite="main", env=env, method=m) if r.cfg["seed"] == 0]
                    if variant == "default"
                    else _finished(runs, suite="ppo_kl", env=env, method=m, variant=variant)
                )
                if not rs:
                    lines.append(f"| {env} | {m} | {variant} | 0 | not run | | | | | |")
                    continue
                df = pd.concat([r.metrics for r in rs])
                lines.append(
                    f"| {env} | {m} | {variant} | {len(rs)} | {np.mean([r.final_return for r in rs]):.0f} | "
                    f"{df['kl'].mean():.4f} | {df['kl'].max():.4f} | {(df['kl'] > SPIKE_KL).mean():.0%} | "
                    f"{df['kl_final'].mean():.4f} | {(df['kl_final'] > SPIKE_KL).mean():.0%} |"
                )
    return "\n".join(lines)


def status_md(runs) -> str:
    have = {(r.suite, r.name): r for r in runs}
    lines = ["| suite | runs | finished | in progress | not started |", "|---|---|---|---|---|"]
    for suite, expected in SUITES.items():
        if suite == "smoke":
            continue
        done = sum(1 for e in expected if (suite, e.name) in have and have[suite, e.name].final)
        partial = sum(1 for e in expected if (suite, e.name) in have and not have[suite, e.name].final)
        lines.append(f"| {suite} | {len(expected)} | {done} | {partial} | {len(expected) - done - partial} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- studies
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
    return _finished(runs, suite="policy_lag", env=env, method=method, variant=f"lag{lag}{suffix}")


def _metric_mean(rs, key, how="mean") -> float:
    """Over every iteration of the runs: the mean (or max) of a metrics column; nan where no run has it."""
    cols = [r.metrics[key] for r in rs if key in r.metrics]
    if not cols:
        return float("nan")
    pooled = pd.concat(cols)
    return float(pooled.max() if how == "max" else pooled.mean())


def policy_lag_tables(runs) -> dict:
    """The policy-lag study by its reading rule: per-arm summaries, the pairwise families, the change from
    L = 0 to L = 8 and the robustness family (see POLICY_LAG['reading'])."""
    arms, summary, pairs, change, robust = LAG_ARMS, [], [], [], []
    for env in POLICY_LAG["envs"]:
        base = {label: _eval_values(lag_runs(runs, env, 0, m, "")) for label, m, _ in arms}
        for lag in POLICY_LAG["lags"]:
            for label, m, suffix in arms:
                rs = lag_runs(runs, env, lag, m, suffix)
                summary.append(
                    {
                        "env": env,
                        "lag": lag,
                        "arm": label,
                        "n": len(rs),
                        "seeds": sorted(r.cfg["seed"] for r in rs),
                        "eval": mean_std(_eval_values(rs)),
                        "train": mean_std([r.final_return for r in rs]),
                        "behaviour_ratio_mean": _metric_mean(rs, "behaviour_ratio_mean"),
                        "behaviour_ratio_max": _metric_mean(rs, "behaviour_ratio_max", "max"),
                        "behaviour_ratio_beyond_1.2": _metric_mean(rs, "behaviour_ratio_beyond_1.2"),
                        "behaviour_ratio_beyond_2": _metric_mean(rs, "behaviour_ratio_beyond_2"),
                        "behaviour_kl": _metric_mean(rs, "behaviour_kl"),
                        "kl": _metric_mean(rs, "kl"),
                        "rejected_frac": _metric_mean(rs, "rejected_frac"),
                        "clipfrac": _metric_mean(rs, "clipfrac"),
                        "kl_coef": _metric_mean(rs, "kl_coef"),
                        "epochs": _metric_mean(rs, "epochs"),
                    }
                )
            if lag == 0:
                continue
            for metric in ("eval", "train"):
                family = []
                for r_label, r_m, r_suffix in arms[2:]:
                    for p_label, p_m, p_suffix in arms[:2]:
                        a, b = (
                            lag_runs(runs, env, lag, m, sfx) for m, sfx in ((r_m, r_suffix), (p_m, p_suffix))
                        )
                        va, vb = (
                            (_eval_values(x) if metric == "eval" else [r.final_return for r in x])
                            for x in (a, b)
                        )
                        family.append(
                            {
                                "env": env,
                                "lag": lag,
                                "metric": metric,
                                "a": r_label,
                                "b": p_label,
                                "test": welch(va, vb),
                            }
                        )
                for row, p_adj in zip(family, holm([f["test"].p for f in family]), strict=True):
                    row.update(p_holm=p_adj, verdict=verdict(row["test"].diff, p_adj))
                pairs += family
        family = []
        for label, m, suffix in arms:
            stale = _eval_values(lag_runs(runs, env, 8, m, suffix))
            family.append(
                {
                    "env": env,
                    "arm": label,
                    "l0": mean_std(base[label]),
                    "l8": mean_std(stale),
                    "test": welch(stale, base[label]),
                }
            )
        for row, p_adj in zip(family, holm([f["test"].p for f in family]), strict=True):
            row.update(p_holm=p_adj, verdict=verdict(row["test"].diff, p_adj))
        change += family
        family = []
        for r_label, r_m, r_sfx in arms[2:]:
            for p_label, p_m, p_sfx in arms[:2]:
                test = ratio_difference_test(
                    base[r_label],
                    _eval_values(lag_runs(runs, env, 8, r_m, r_sfx)),
                    base[p_label],
                    _eval_values(lag_runs(runs, env, 8, p_m, p_sfx)),
                )
                family.append({"env": env, "a": r_label, "b": p_label, "test": test})
        for row, p_adj in zip(family, holm([f["test"].p for f in family]), strict=True):
            word = verdict(row["test"].diff, p_adj)
            row.update(
                p_holm=p_adj, verdict={"higher": "more robust", "lower": "less robust"}.get(word, word)
            )
        robust += family
    return {"summary": summary, "pairs": pairs, "change": change, "robustness": robust}


def policy_lag_md(runs) -> str:
    t = policy_lag_tables(runs)
    f = lambda ms, d=0: _fmt(ms.mean, ms.std, ms.n, d)  # noqa: E731
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
        cells = " | ".join(_p(r[k]) if k != "behaviour_kl" and k != "kl" else _kl(r[k]) for k in keys)
        head = f"| {r['env']} | {r['lag']} | {r['arm']} | {r['n']} | {f(r['eval'])} | {f(r['train'])} | "
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
            f"{_tdp(w)} | {_p(r['p_holm'])} | {r['verdict']} |"
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
            f"| {r['env']} | {r['arm']} | {f(r['l0'])} | {f(r['l8'])} | {_pct(change)} | "
            f"{_tdp(r['test'])} | {_p(r['p_holm'])} | {r['verdict']} |"
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
            f"| {r['env']} | {r['a']} | {r['b']} | {_p(w.ratio_a)} | {_p(w.ratio_b)} | {ci} | "
            f"{_p(w.p)} | {_p(r['p_holm'])} | {r['verdict']} |"
        )
    return "\n".join(lines)


def eager_vs_compiled(runs) -> list[dict]:
    """main's eager runs against main_compiled's re-runs of the same seeds (0-2) per environment and method:
    the training return (main's runs have no deterministic evaluation), mean KL, every seed's pair; two-sided
    Welch, Holm over the 8 tests. The check compile_equiv made at 300k steps on two environments, at 1M on all
    four."""
    rows = []
    for env in ENVS:
        for method in ("ppo", "rgpo"):
            eager = _finished(runs, suite="main", env=env, method=method)
            compiled = _finished(runs, suite="main_compiled", env=env, method=method)
            by_seed = {r.cfg["seed"]: r.final_return for r in compiled}
            rows.append(
                {
                    "env": env,
                    "method": method,
                    "eager": mean_std([r.final_return for r in eager]),
                    "compiled": mean_std(list(by_seed.values())),
                    "kl_eager": _mean_kl(eager),
                    "kl_compiled": _mean_kl(compiled),
                    "pairs": [(r.cfg["seed"], r.final_return, by_seed.get(r.cfg["seed"])) for r in eager],
                    "test": welch(list(by_seed.values()), [r.final_return for r in eager]),
                }
            )
    for row, p_adj in zip(rows, holm([r["test"].p for r in rows]), strict=True):
        row.update(p_holm=p_adj, verdict=verdict(row["test"].diff, p_adj))
    return rows


def eager_vs_compiled_md(runs) -> str:
    lines = [
        "main's eager runs (seeds 0-2) against main_compiled's compiled re-runs of the same seeds, training "
        "return (last 100 episodes; main's runs have no deterministic evaluation). Two-sided Welch, Holm "
        "over the 8 tests; verdict: compiled against eager. The two paths are different runs of a seed: "
        "--compile's numpy mean action differs from torch's by float32 rounding within the first steps and "
        "the dynamics amplify it (results/benchmarks/mujoco_path_divergence.md), so they are compared over "
        "seeds.",
        "",
        "| env | method | eager | compiled | seed: eager / compiled | mean KL eager / compiled | "
        "Welch t / df / p | Holm p | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in eager_vs_compiled(runs):
        pairs = ", ".join(f"{s}: {e:.0f} / {'-' if c is None else f'{c:.0f}'}" for s, e, c in r["pairs"])
        holm_p = "not tested" if not np.isfinite(r["p_holm"]) else f"{_p(r['p_holm'])}"
        lines.append(
            f"| {r['env']} | {r['method']} | {_fmt(*r['eager'])} | {_fmt(*r['compiled'])} | {pairs} | "
            f"{_kl(r['kl_eager'])} / {_kl(r['kl_compiled'])} | {_tdp(r['test'])} | {holm_p} | "
            f"{r['verdict']} |"
        )
    return "\n".join(lines)


def _eval(r) -> float:
    return float(r.final.get("eval_return_mean", float("nan")))


def _eval_values(rs) -> list[float]:
    """The deterministic-evaluation returns of the runs that have one."""
    return [v for v in map(_eval, rs) if np.isfinite(v)]


def _mean_kl(rs) -> float:
    """Mean KL to pi_old over every iteration of the runs (nan without runs)."""
    return float(pd.concat([r.metrics["kl"] for r in rs]).mean()) if rs else float("nan")


def study_table(runs, study: dict) -> list[dict]:
    """Per environment and arm: n, training return (last 100 episodes) and deterministic-evaluation return as
    mean, sample std and n; mean KL; against the reference arm (the first): relative difference and two-sided
    Welch t / df / p for both returns."""
    rows = []
    for env in study["envs"]:
        ref = study["arms"][0].runs(runs, env)
        for arm in study["arms"]:
            rs = arm.runs(runs, env)
            train, ev = [r.final_return for r in rs], _eval_values(rs)
            ref_train, ref_eval = [r.final_return for r in ref], _eval_values(ref)
            row = {
                "env": env,
                "arm": arm.label,
                "n": len(rs),
                "seeds": sorted(r.cfg["seed"] for r in rs),
                "train": mean_std(train),
                "eval": mean_std(ev),
                "kl": _mean_kl(rs),
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
                    "eval": welch(_eval_values(a), _eval_values(b)),
                    "kl_a": _mean_kl(a),
                    "kl_b": _mean_kl(b),
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
        stat = lambda gs: iqm(np.concatenate([g[0] for g in gs]))  # noqa: E731
        entry = {
            "iqm": stat(groups),
            "iqm_ci95": stratified_bootstrap_ci(groups, stat, n_boot),
            "n": sum(map(len, per_env.values())),
        }
        pairs = [(per_env[e], scores[ref_label][e]) for e in per_env if e in scores[ref_label]]
        if arm.label != ref_label and pairs:
            pstat = lambda gs: float(np.mean([probability_of_improvement(x, y) for x, y in gs]))  # noqa: E731
            entry["p_improvement"] = pstat(pairs)
            entry["p_improvement_ci95"] = stratified_bootstrap_ci(pairs, pstat, n_boot)
        out[arm.label] = entry
    return out


def _p(x) -> str:
    return "" if not np.isfinite(x) else f"{x:.3f}"


def _kl(x) -> str:
    return "-" if not np.isfinite(x) else f"{x:.4f}"


def _pct(x) -> str:
    return "" if not np.isfinite(x) else f"{x:+.0%}"


def _tdp(w) -> str:
    """A Welch result (t, df, p) as 't / df / p'; empty when there is none."""
    return "" if w is None or not np.isfinite(w[0]) else f"{w[0]:.2f} / {w[1]:.1f} / {w[2]:.3f}"


def _holm_cell(row, metric) -> str:
    """'Holm p: verdict' of one corrected test; empty where the row has no test."""
    if f"{metric}_p_holm" not in row:
        return ""
    p_adj = row[f"{metric}_p_holm"]
    return "not tested" if not np.isfinite(p_adj) else f"{_p(p_adj)}: {row[f'{metric}_verdict']}"


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
            f"| {r['env']} | {r['arm']} | {r['n']} | {_fmt(*r['train'])} | {_fmt(*r['eval'])} | "
            f"{r['kl']:.4f} | {_fmt(*r['entropy'], digits=2)} | {_pct(r.get('train_diff', np.nan))} | "
            f"{_p(r.get('std_ratio', np.nan))} | {_tdp(r.get('train_vs_ref'))} | {_holm_cell(r, 'train')} | "
            f"{_tdp(r.get('eval_vs_ref'))} | {_holm_cell(r, 'eval')} |"
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
                f"| {c['env']} | {c['a']} | {c['b']} | {_fmt(*c['train_a'])} | {_fmt(*c['train_b'])} | "
                f"{_pct(c['diff'])} | {_tdp(c['train'])} | {_holm_cell(c, 'train')} | {_tdp(c['eval'])} | "
                f"{_holm_cell(c, 'eval')} | {_kl(c['kl_a'])} / {_kl(c['kl_b'])} |"
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
        for name, key in (("training return", lambda r: r.final_return), ("evaluation return", _eval)):
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


def study_figures(runs, out) -> list[str]:
    """Per study: a performance profile (share of runs whose normalised training return exceeds tau) and the
    return-vs-movement figure (each run's return against its cumulative sqrt(KL_final), one panel per
    environment): do the arms differ at equal movement?"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, study in STUDIES.items():
        if not any(a.runs(runs, e) for a in study["arms"] for e in study["envs"]):
            continue
        panels = [("reference", f"1 = {study['arms'][0].label}'s mean")]
        if ill_conditioned_envs(runs, study):  # as in study_md: the reference mean is near 0 somewhere
            panels.append(("minmax", "min-max per environment"))
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.4), squeeze=False)
        for ax, (scale, what) in zip(axes[0], panels, strict=True):
            _profile_panel(ax, normalised_scores(runs, study, scale=scale), [a.label for a in study["arms"]])
            ax.set_xlabel(f"normalised training return tau ({what})")
        written.append(_save(fig, out, f"performance_profile_{name}.png"))
        envs = study["envs"]
        fig, axes = plt.subplots(1, len(envs), figsize=(4.2 * len(envs), 3.4), squeeze=False)
        for j, env in enumerate(envs):
            ax = axes[0, j]
            for k, arm in enumerate(study["arms"]):
                for i, r in enumerate(arm.runs(runs, env)):
                    move = np.cumsum(np.sqrt(np.clip(r.metrics["kl_final"].to_numpy(), 0, None)))
                    ax.plot(
                        move,
                        r.metrics["return_last100"],
                        color=f"C{k}",
                        lw=0.8,
                        alpha=0.7,
                        label=arm.label if i == 0 else None,
                    )
            ax.set_title(env, fontsize=9)
            ax.set_xlabel("cumulative sqrt(KL_final)")
            if j == 0:
                ax.set_ylabel("return (last 100 episodes)")
            ax.legend(fontsize=6)
        written.append(
            _save(
                fig, out, f"return_vs_movement_{name}.png" if name != "annealed" else "return_vs_movement.png"
            )
        )
    return written


def policy_lag_scores(runs) -> dict[str, dict[str, np.ndarray]]:
    """Evaluation returns at L = 8 per arm and environment, min-max normalised per environment over every run
    of the policy-lag study (all lags and arms), as its reading rule fixes."""
    out: dict[str, dict[str, np.ndarray]] = {label: {} for label, _, _ in LAG_ARMS}
    for env in POLICY_LAG["envs"]:
        every = [
            v
            for lag in POLICY_LAG["lags"]
            for _, m, sfx in LAG_ARMS
            for v in _eval_values(lag_runs(runs, env, lag, m, sfx))
        ]
        if len(every) < 2 or max(every) == min(every):
            continue
        lo, span = min(every), max(every) - min(every)
        for label, m, sfx in LAG_ARMS:
            x = np.asarray(_eval_values(lag_runs(runs, env, 8, m, sfx)), float)
            if len(x):
                out[label][env] = (x - lo) / span
    return out


def policy_lag_figures(runs, out) -> list[str]:
    """The policy-lag study's profile (its reading rule (5)) and, per environment, the L = 8 arms along
    training: training return, the behaviour ratio's max, the gate's rejected / PPO's clipped fraction and
    RGPO's kl_coef (mean ± sample std over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(lag_runs(runs, env, 8, m, sfx) for env in POLICY_LAG["envs"] for _, m, sfx in LAG_ARMS):
        return []
    written = []
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    _profile_panel(ax, policy_lag_scores(runs), [label for label, _, _ in LAG_ARMS])
    ax.set_xlabel("evaluation return at L = 8 (min-max per environment over the study's runs)")
    written.append(_save(fig, out, "performance_profile_policy_lag.png"))
    panels = [
        ("return_last100", "training return (last 100)"),
        ("behaviour_ratio_max", "max r_b"),
        ("rejected_frac", "rejected (RGPO) / clipped (PPO)"),
        ("kl_coef", "RGPO kl_coef"),
    ]
    envs = POLICY_LAG["envs"]
    fig, axes = plt.subplots(
        len(envs), len(panels), figsize=(4.0 * len(panels), 3.0 * len(envs)), squeeze=False
    )
    for i, env in enumerate(envs):
        for j, (key, title) in enumerate(panels):
            ax = axes[i, j]
            for label, m, sfx in LAG_ARMS:
                rs = lag_runs(runs, env, 8, m, sfx)
                col = "clipfrac" if key == "rejected_frac" and m == "ppo" else key
                rs = [r for r in rs if col in r.metrics]
                if rs:
                    _plot_mean_band(ax, rs, col, label, log=False)
            ax.set_title(f"{env}, L = 8: {title}", fontsize=8)
            ax.set_xlabel("environment steps")
        axes[i, 0].legend(fontsize=6)
    written.append(_save(fig, out, "curves_policy_lag.png"))
    return written


def _profile_panel(ax, scores: dict[str, dict[str, np.ndarray]], labels, n_boot: int = 2000) -> None:
    """Performance profiles of several arms on one axis spanning every run of every arm, each with its
    stratified-bootstrap 95% band (rgpo_lab.statistics.performance_profile)."""
    pooled = [x for label in labels for x in scores.get(label, {}).values()]
    if not pooled:
        return
    lo, hi = float(min(x.min() for x in pooled)), float(max(x.max() for x in pooled))
    pad = 0.05 * (hi - lo if hi > lo else 1.0)
    taus = np.linspace(lo - pad, hi + pad, 201)
    for k, label in enumerate(labels):
        per_env = list(scores.get(label, {}).values())
        if not per_env:
            continue
        prof = performance_profile(per_env, taus, n_boot=n_boot)
        n = sum(map(len, per_env))
        ax.plot(taus, prof.fraction, color=f"C{k}", label=f"{label} (n={n})")
        ax.fill_between(taus, prof.low, prof.high, color=f"C{k}", alpha=0.15)
    ax.set_ylabel("fraction of runs > tau")
    ax.legend(fontsize=7)


# ----------------------------------------------------------------------------------------------- figures
def _plot_mean_band(ax, rs, key, label, log):
    """Mean ± sample std of metric `key` over the runs `rs` (cut to the shortest), against environment steps;
    on a log axis the band's floor is a tenth of the mean."""
    if not rs:
        return
    n = min(len(r.metrics) for r in rs)
    x = rs[0].metrics["global_step"].to_numpy()[:n]
    y = np.stack([r.metrics[key].to_numpy()[:n] for r in rs])
    mu, sd = np.nanmean(y, 0), np.nanstd(y, 0, ddof=1) if len(rs) > 1 else np.zeros(n)
    ax.plot(x, mu, label=f"{label} (n={len(rs)})", lw=1)
    ax.fill_between(x, mu - sd if not log else np.maximum(mu - sd, mu * 0.1), mu + sd, alpha=0.2)


def figures(runs, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    import rgpo_trl

    main = [r for r in runs if r.suite == "main" and r.final]
    written = []
    if main:
        # final-return bars
        fig, ax = plt.subplots(figsize=(9, 3.6))
        width = 0.2
        for i, m in enumerate(METHODS):
            stats_ = [mean_std([r.final_return for r in main if r.env == e and r.method == m]) for e in ENVS]
            means, yerr = [s[0] for s in stats_], [0 if not np.isfinite(s[1]) else s[1] for s in stats_]
            ax.bar(np.arange(len(ENVS)) + (i - 1.5) * width, means, width, yerr=yerr, label=m, capsize=2)
        ax.set_xticks(np.arange(len(ENVS)), ENVS)
        ax.set_ylabel("final return (last 100 episodes)")
        ax.legend(ncol=4, fontsize=8)
        written.append(_save(fig, out, "final_returns.png"))
        # per-iteration curves: return, KL (log, 2x target), ESS, grad var
        panels = [
            ("return_last100", "return (last 100 episodes)", False),
            ("kl", "KL to pi_old (log)", True),
            ("ess", "ESS", False),
            ("grad_var", "gradient variance (log)", True),
        ]
        for key, title, log in panels:
            fig, axes = plt.subplots(1, len(ENVS), figsize=(4.2 * len(ENVS), 3.2), squeeze=False)
            for j, env in enumerate(ENVS):
                ax = axes[0, j]
                for m in METHODS:
                    _plot_mean_band(ax, [r for r in main if r.env == env and r.method == m], key, m, log)
                if key == "kl":
                    ax.axhline(SPIKE_KL, color="k", ls=":", lw=0.8, label="2 x target")
                if log:
                    ax.set_yscale("log")
                ax.set_title(f"{env}", fontsize=9)
                ax.set_xlabel("environment steps")
            axes[0, 0].set_ylabel(title)
            axes[0, 0].legend(fontsize=7)
            written.append(_save(fig, out, f"curves_{key}.png"))
        # KL spectrum
        fig, ax = plt.subplots(figsize=(9, 3.4))
        for i, m in enumerate(METHODS):
            kls = [[r.metrics["kl"] for r in main if r.env == e and r.method == m] for e in ENVS]
            vals = [pd.concat(series or [pd.Series([np.nan])]).mean() for series in kls]
            ax.bar(np.arange(len(ENVS)) + (i - 1.5) * 0.2, vals, 0.2, label=m)
        ax.axhline(SPIKE_KL, color="k", ls=":", lw=0.8)
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(ENVS)), ENVS)
        ax.set_ylabel("mean KL to pi_old (log)")
        ax.legend(ncol=4, fontsize=8)
        written.append(_save(fig, out, "kl_spectrum.png"))
    # long horizon: return and KL over training at each budget (the table gives only the end points)
    long_runs = {b: {m: _long_runs(runs, m, b) for m in ("ppo", "rgpo")} for b in (1, 3, 6)}
    budgets = [b for b, by_method in long_runs.items() if any(by_method.values())]
    if any(b > 1 for b in budgets):
        fig, axes = plt.subplots(2, len(budgets), figsize=(4.2 * len(budgets), 6.0), squeeze=False)
        for j, b in enumerate(budgets):
            for m, rs in long_runs[b].items():
                _plot_mean_band(axes[0, j], rs, "return_last100", m, log=False)
                _plot_mean_band(axes[1, j], rs, "kl", m, log=True)
            axes[0, j].set_title(f"HalfCheetah-v4, {b}M steps", fontsize=9)
            axes[1, j].axhline(SPIKE_KL, color="k", ls=":", lw=0.8, label="2 x target")
            axes[1, j].set_yscale("log")
            axes[1, j].set_xlabel("environment steps")
        axes[0, 0].set_ylabel("return (last 100 episodes)")
        axes[1, 0].set_ylabel("KL to pi_old (log)")
        axes[0, 0].legend(fontsize=7)
        axes[1, 0].legend(fontsize=7)
        written.append(_save(fig, out, "curves_long.png"))
    # g(r) and w(r) of the three gates
    r = torch.linspace(0.01, 3.0, 600, dtype=torch.float64)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for name in ("sigmoid", "clipped_linear", "temperature"):
        gate = rgpo_trl.make_gate(name)
        axes[0].plot(r, gate.g(torch.log(r)), label=repr(gate))
        axes[1].plot(r, gate.w(torch.log(r)), label=repr(gate))
    axes[0].set_title("g(r)")
    axes[1].set_title("w(r) = g'(r) r")
    for ax in axes:
        ax.set_xlabel("r")
        ax.legend(fontsize=7)
    written.append(_save(fig, out, "gates.png"))
    return written


def _save(fig, out, name):
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name


def _plain(x):
    """studies.json's values: NamedTuples (MeanStd, Welch) as dicts, tuples as lists, numpy scalars as
    floats."""
    if hasattr(x, "_asdict"):
        return {k: _plain(v) for k, v in x._asdict().items()}
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x.item() if isinstance(x, np.generic) else x


def build_report(results: str, out: str, n_boot: int = 2000, plots: bool = True) -> str:
    runs = load_runs(results)
    os.makedirs(out, exist_ok=True)
    main_t, kl_t, gates_t = main_returns_table(runs), kl_table(runs), gates_table(runs)
    k_t, k_md = single_runs_md(runs, "k_sweep", PAPER_K_SWEEP, "k sweep (1 epoch, seed 1)")
    b_t, b_md = single_runs_md(runs, "beta0", PAPER_BETA0, "beta0 / target (seed 1)")
    long_rows = long_table(runs)
    agg = aggregate(runs, n_boot)
    main_t.to_csv(os.path.join(out, "main_returns.csv"), index=False)
    kl_t.to_csv(os.path.join(out, "kl_ess.csv"), index=False)
    gates_t.to_csv(os.path.join(out, "gates.csv"), index=False)
    k_t.to_csv(os.path.join(out, "k_sweep.csv"), index=False)
    b_t.to_csv(os.path.join(out, "beta0.csv"), index=False)
    with open(os.path.join(out, "aggregate.json"), "w") as f:
        json.dump(agg, f, indent=2)
    figs = (figures(runs, out) + study_figures(runs, out) + policy_lag_figures(runs, out)) if plots else []
    studies = {}
    for name, study in STUDIES.items():
        studies[name], contrasts = study_tests(runs, study)
        if study.get("contrasts"):
            studies[f"{name}_contrasts"] = contrasts
    studies["policy_lag"] = policy_lag_tables(runs)
    studies["eager_vs_compiled"] = eager_vs_compiled(runs)
    with open(os.path.join(out, "studies.json"), "w") as f:
        json.dump(_plain(studies), f, indent=2)
    sections = [
        ("Runs", status_md(runs)),
        ("Final return at 1M steps (paper Table main_results)", main_returns_md(main_t)),
        ("KL to pi_old (paper Table kl_stats; both KL definitions)", kl_md(kl_t)),
        ("ESS (paper Table ess_all)", ess_md(kl_t)),
        ("Aggregate over environments (beyond the paper)", aggregate_md(agg)),
        ("Gate comparison, HalfCheetah-v4 (paper Ablation A)", gates_md(gates_t)),
        ("Gate sharpness k (paper Ablation B)", k_md),
        ("beta0 and target (paper Ablation F)", b_md),
        (
            "Long horizon, HalfCheetah-v4 (paper Table longhorizon)",
            long_md(long_rows) + "\n\n" + long_kl_md(long_kl_table(runs)),
        ),
        ("The PPO-KL question", ppo_kl_md(runs)),
        *((f"When does RGPO help? {name}", study_md(runs, study, n_boot)) for name, study in STUDIES.items()),
        ("Eager vs compiled, 1M steps (main vs main_compiled)", eager_vs_compiled_md(runs)),
        ("Stale samples (policy lag)", policy_lag_md(runs)),
    ]
    md = [
        "# MuJoCo results vs the paper",
        "",
        f"Command: `python -m rgpo_lab.mujoco_report {results} --out {out}`. Statistics as in the report's "
        "docstring: mean ± sample std (ddof 1) over n finished seeds; 'not run' = no finished run yet.",
        "",
    ]
    for title, body in sections:
        md += [f"## {title}", "", body, ""]
    md += ["## Figures", ""] + [f"![{f}]({f})" for f in figs]
    text = "\n".join(md) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="results root with one folder per suite (e.g. results/mujoco)")
    p.add_argument("--out", default=None, help="output folder (default: <results>/report)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the aggregate CIs")
    p.add_argument("--no-plot", action="store_true")
    a = p.parse_args(argv)
    if not os.path.isdir(a.results):
        raise SystemExit(f"ERROR: {a.results} is not a directory")
    print(build_report(a.results, a.out or os.path.join(a.results, "report"), a.bootstrap, not a.no_plot))


if __name__ == "__main__":
    main()
