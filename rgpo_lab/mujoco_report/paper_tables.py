"""The paper's MuJoCo tables (returns, KL, ESS, gates, k sweep, beta0, long horizon, the PPO-KL
question, the aggregate over environments, the runs' status), each beside the paper's numbers, which
live here with them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rgpo_lab.mujoco_drive import SPIKE_KL  # a KL spike: twice the KL target
from rgpo_lab.mujoco_grid import MUJOCO_ENVS as ENVS
from rgpo_lab.mujoco_grid import MUJOCO_METHODS as METHODS
from rgpo_lab.mujoco_grid import SUITES
from rgpo_lab.mujoco_report.cells import fmt, paper_fmt
from rgpo_lab.mujoco_report.runs import finished
from rgpo_lab.statistics import (
    mean_probability_of_improvement,
    mean_std,
    pooled_iqm,
    stratified_bootstrap_ci,
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


def main_returns_table(runs):
    rows = []
    for env in ENVS:
        row = {"env": env}
        finals = {
            m: [r.final_return for r in finished(runs, suite="main", env=env, method=m)] for m in METHODS
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
            f"{fmt(r[f'{m}_mean'], r[f'{m}_std'], r[f'{m}_n'])} / {paper_fmt(PAPER_RETURNS[r.env][m])}"
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
            rs = finished(runs, suite=suite, env=env, method=m)
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
            finished(runs, suite="main", env="HalfCheetah-v4", method="rgpo")
            if gate == "sigmoid"
            else finished(runs, suite="gates", env="HalfCheetah-v4", variant=gate)
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
        rs = finished(runs, suite=suite, method=method, variant=variant_name)
        mean, _, n = mean_std([r.final_return for r in rs])
        kl = pd.concat([r.metrics["kl"] for r in rs]) if rs else pd.Series(dtype=float)
        rows.append({"variant": variant, "n": n, "final_return": mean, "kl_mean": kl.mean()})
        ours = f"{mean:.0f}" if n else "not run"
        klc = f"{kl.mean():.4f} | {(kl > SPIKE_KL).mean():.0%}" if n else "- | -"
        lines.append(f"| {variant} | {n} | {ours} / {value} | {klc} |")
    return pd.DataFrame(rows), "\n".join(lines)


def long_horizon_runs(runs, method, budget):
    """Finished HalfCheetah runs of the long-horizon table: `main`'s at 1M steps, the `long` suite's at 3M /
    6M."""
    if budget == 1:
        return finished(runs, suite="main", env="HalfCheetah-v4", method=method)
    return [
        r for r in finished(runs, suite="long", method=method) if r.cfg["total_timesteps"] == budget * 10**6
    ]


def long_table(runs):
    rows = []
    for m in ("ppo", "rgpo"):
        row = {"method": m}
        for budget in (1, 3, 6):
            row[f"{budget}M"] = [r.final_return for r in long_horizon_runs(runs, m, budget)]
        rows.append(row)
    return rows


def long_kl_table(runs) -> list[dict]:
    """KL to pi_old of the long-horizon runs per method and budget, over every iteration of the cell's runs
    (as kl_table): mean, max and spike rate by ``kl``, mean and spike rate by ``kl_final``."""
    rows = []
    for m in ("ppo", "rgpo"):
        for budget in (1, 3, 6):
            rs = long_horizon_runs(runs, m, budget)
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
            f"{fmt(*mean_std(row[f'{b}M']))} / {paper_fmt(PAPER_LONG[row['method']][b])}" for b in (1, 3, 6)
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
            m: np.array([r.final_return for r in finished(runs, suite="main", env=env, method=m)])
            for m in METHODS
        }
        if len(finals["ppo"]) and finals["ppo"].mean() != 0:
            per_env[env] = {m: v / abs(finals["ppo"].mean()) for m, v in finals.items() if len(v)}
    out = {"envs": sorted(per_env), "iqm": {}, "prob_improvement": None}
    for m in METHODS:
        groups = [(v[m],) for v in per_env.values() if m in v]
        if groups:
            out["iqm"][m] = {
                "iqm": pooled_iqm(groups),
                "ci95": stratified_bootstrap_ci(groups, pooled_iqm, n_boot),
            }
    pairs = [(v["rgpo"], v["ppo"]) for v in per_env.values() if "rgpo" in v and "ppo" in v]
    if pairs:
        out["prob_improvement"] = {
            "value": mean_probability_of_improvement(pairs),
            "ci95": stratified_bootstrap_ci(pairs, mean_probability_of_improvement, n_boot),
        }
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
                    [r for r in finished(runs, suite="main", env=env, method=m) if r.cfg["seed"] == 0]
                    if variant == "default"
                    else finished(runs, suite="ppo_kl", env=env, method=m, variant=variant)
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
