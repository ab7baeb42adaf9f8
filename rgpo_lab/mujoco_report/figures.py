"""The report's figures (PNG): the paper's bars and curves, each study's performance profile and
return-vs-movement plot, the policy-lag study's profile and curves. matplotlib is imported inside each
function, so that --no-plot runs without it."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from rgpo_lab.mujoco_drive import SPIKE_KL  # a KL spike: twice the KL target
from rgpo_lab.mujoco_grid import MUJOCO_ENVS as ENVS
from rgpo_lab.mujoco_grid import MUJOCO_METHODS as METHODS
from rgpo_lab.mujoco_report.paper_tables import long_horizon_runs
from rgpo_lab.mujoco_report.policy_lag import LAG_ARMS, POLICY_LAG, lag_runs, policy_lag_scores
from rgpo_lab.mujoco_report.studies import STUDIES, ill_conditioned_envs, normalised_scores
from rgpo_lab.statistics import mean_std, performance_profile


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


def figures(runs, out) -> list[str]:
    """The paper's figures: the main suite's final-return bars, per-iteration curves and KL spectrum, the
    long-horizon curves, and the shapes of the three gates."""
    import matplotlib

    matplotlib.use("Agg")
    main = [r for r in runs if r.suite == "main" and r.final]
    written = []
    if main:
        written += [
            final_returns_figure(main, out),
            *main_curves_figures(main, out),
            kl_spectrum_figure(main, out),
        ]
    return [*written, *long_horizon_figure(runs, out), gates_figure(out)]


def final_returns_figure(main, out) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6))
    width = 0.2
    for i, m in enumerate(METHODS):
        stats_ = [mean_std([r.final_return for r in main if r.env == e and r.method == m]) for e in ENVS]
        means, yerr = [s[0] for s in stats_], [0 if not np.isfinite(s[1]) else s[1] for s in stats_]
        ax.bar(np.arange(len(ENVS)) + (i - 1.5) * width, means, width, yerr=yerr, label=m, capsize=2)
    ax.set_xticks(np.arange(len(ENVS)), ENVS)
    ax.set_ylabel("final return (last 100 episodes)")
    ax.legend(ncol=4, fontsize=8)
    return _save(fig, out, "final_returns.png")


def main_curves_figures(main, out) -> list[str]:
    """Per-iteration curves of the main suite: return, KL (log, 2x target), ESS, gradient variance."""
    import matplotlib.pyplot as plt

    panels = [
        ("return_last100", "return (last 100 episodes)", False),
        ("kl", "KL to pi_old (log)", True),
        ("ess", "ESS", False),
        ("grad_var", "gradient variance (log)", True),
    ]
    written = []
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
    return written


def kl_spectrum_figure(main, out) -> str:
    import matplotlib.pyplot as plt

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
    return _save(fig, out, "kl_spectrum.png")


def long_horizon_figure(runs, out) -> list[str]:
    """Return and KL over training at each budget (the table gives only the end points); none before a
    budget beyond 1M steps has runs."""
    import matplotlib.pyplot as plt

    long_runs = {b: {m: long_horizon_runs(runs, m, b) for m in ("ppo", "rgpo")} for b in (1, 3, 6)}
    budgets = [b for b, by_method in long_runs.items() if any(by_method.values())]
    if not any(b > 1 for b in budgets):
        return []
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
    return [_save(fig, out, "curves_long.png")]


def gates_figure(out) -> str:
    """g(r) and w(r) of the three gates."""
    import matplotlib.pyplot as plt
    import torch

    import rgpo_trl

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
    return _save(fig, out, "gates.png")


def _save(fig, out, name):
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return name
