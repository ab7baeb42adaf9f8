"""What the window means hide: KL_ref, KLhat_old and gold at their maximum and early in training, the
learning rate's decay, and whether the KL-to-old controller and the pi_old gate acted."""

from __future__ import annotations

import numpy as np

from rgpo_lab.rlhf_report.comparison import ms_cell
from rgpo_lab.rlhf_report.runs import GOLD, KL
from rgpo_lab.rlhf_suite import ONLINE
from rgpo_lab.statistics import mean_std

KL_OLD, LR = "rgpo/kl_old_iteration", "learning_rate"
KL_COEF, REJECTED = "rgpo/kl_coef", "rgpo/rejected_frac"  # did the gate against pi_old act?
EARLY = 50  # iterations: "early training" in the dynamics table


def _per_run(rs: list[dict], key: str, fn) -> list[float]:
    """``fn`` of each run's ``key`` column over its iterations (runs without the column left out)."""
    out = []
    for r in rs:
        values = [(row["iteration"], row[key]) for row in r["rows"] if row.get(key) is not None]
        if values:
            out.append(fn(values))
    return out


def dynamics(runs: dict[str, list[dict]], window: tuple[int, int]) -> list[dict]:
    """What a window mean hides, per online method (mean ± std over seeds of per-run values): KL_ref,
    KLhat_old (methods that log it) and gold in the window, their maximum over all iterations and their mean
    over the first ``EARLY`` iterations; and the learning rate in the window as a share of its peak (the
    schedule decays)."""
    lo, hi = window
    rows = []
    for m in ONLINE:
        rs = [r for r in runs.get(m, []) if r["rows"]]
        if not rs:
            continue
        row = {"method": m, "n": len(rs)}
        for key in (KL, KL_OLD, GOLD):
            row[key] = {
                "window": mean_std(_per_run(rs, key, lambda v: np.mean([x for i, x in v if lo < i <= hi]))),
                "max": mean_std(_per_run(rs, key, lambda v: max(x for _, x in v))),
                "early": mean_std(_per_run(rs, key, lambda v: np.mean([x for i, x in v if i <= EARLY]))),
            }
        row["lr_window_share"] = mean_std(
            _per_run(rs, LR, lambda v: np.mean([x for i, x in v if lo < i <= hi]) / max(x for _, x in v))
        )
        row[KL_COEF] = {
            "window": mean_std(_per_run(rs, KL_COEF, lambda v: np.mean([x for i, x in v if lo < i <= hi]))),
            "min": mean_std(_per_run(rs, KL_COEF, lambda v: min(x for _, x in v))),
        }
        row[REJECTED] = {"max": mean_std(_per_run(rs, REJECTED, lambda v: max(x for _, x in v)))}
        rows.append(row)
    return rows


def _sci(ms) -> str:
    """Mean ± std in 2 significant digits (KLhat_old spans orders of magnitude)."""
    mean, std, n = ms
    return "not run" if n == 0 else f"{mean:.2g}" + (f" ± {std:.2g}" if np.isfinite(std) else "")


def dynamics_markdown(rows: list[dict], window: tuple[int, int]) -> str:
    lo, hi = window
    lines = [
        "Per online method, mean ± std over seeds of each run's value: in the window "
        f"({lo}-{hi}), the maximum over every iteration, and the mean over the first "
        f"{EARLY} iterations; the learning rate decays linearly to 0 (TRL's default "
        "schedule), its window mean as a share of its peak in the last column.",
        "",
        "| method | n | KL_ref window / max / early | KLhat_old window / max / early | "
        "gold window / max / early | learning rate in the window / peak |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        fmt = {KL: lambda ms: ms_cell(ms, 4), KL_OLD: _sci, GOLD: lambda ms: ms_cell(ms, 3)}
        cells = [
            " / ".join(fmt[k](r[k][part]) for part in ("window", "max", "early"))
            if r[k]["window"][2]
            else "-"
            for k in (KL, KL_OLD, GOLD)
        ]
        lines.append(
            f"| {r['method']} | {r['n']} | {' | '.join(cells)} | {ms_cell(r['lr_window_share'], 3)} |"
        )
    gated = [r for r in rows if r[KL_COEF]["window"][2]]
    if gated:
        lines += [
            "",
            "The KL-to-old controller and the gate against pi_old (methods that log them), mean ± std over "
            "seeds of each run's value: kl_coef in the window and its minimum over training (its floor is "
            "kl_coef_min), and the largest fraction of tokens the gate rejected (g < 0.1) at any iteration.",
            "",
            "| method | n | kl_coef window | kl_coef min | rejected fraction, max over iterations |",
            "|---|---|---|---|---|",
        ]
        for r in gated:
            coef, rejected = r[KL_COEF], r[REJECTED]["max"]
            lines.append(
                f"| {r['method']} | {r['n']} | {ms_cell(coef['window'], 4)} | {ms_cell(coef['min'], 4)} | "
                f"{_sci(rejected)} |"
            )
    return "\n".join(lines)
