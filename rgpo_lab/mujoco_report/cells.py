"""How a number is written in a report cell (mean ± std (n), p-values, KL, percentages, Welch t / df /
p), in one place so that every table writes them alike."""

from __future__ import annotations

import numpy as np


def fmt(mean, std, n, digits=0) -> str:
    """Mean ± std (n=...) of a table cell; "not run" without runs, no ± with one run."""
    if n == 0:
        return "not run"
    s = f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if np.isfinite(std) else "")
    return f"{s} (n={n})"


def paper_fmt(ms) -> str:
    """The paper's (mean, std or None), as its table prints it."""
    mean, std = ms
    return f"{mean}" + (f" ± {std}" if std is not None else "")


def fmt_p(x) -> str:
    """A p-value or a ratio to 3 decimals; empty when there is none."""
    return "" if not np.isfinite(x) else f"{x:.3f}"


def fmt_kl(x) -> str:
    """A KL to 4 decimals; "-" when there is none."""
    return "-" if not np.isfinite(x) else f"{x:.4f}"


def fmt_pct(x) -> str:
    """A relative difference as a signed percentage; empty when there is none."""
    return "" if not np.isfinite(x) else f"{x:+.0%}"


def fmt_tdp(w) -> str:
    """A Welch result (t, df, p) as 't / df / p'; empty when there is none."""
    return "" if w is None or not np.isfinite(w[0]) else f"{w[0]:.2f} / {w[1]:.1f} / {w[2]:.3f}"


def fmt_or_dash(x, digits=3) -> str:
    """A number to ``digits`` decimals; "-" when there is none (None or not finite)."""
    return "-" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def fmt_p_or_dash(x) -> str:
    """A p-value to 3 decimals, below 0.001 in scientific notation; "-" when there is none."""
    return "-" if x is None or not np.isfinite(x) else (f"{x:.3f}" if x >= 0.001 else f"{x:.1e}")


def paragraph(text: str) -> str:
    """``text`` on one line: a paragraph written across source lines."""
    return " ".join(text.split())


def fmt_interval(d: dict, digits=2) -> str:
    """A difference with its interval, 'diff [low, high]', from a test's ``diff``, ``low`` and ``high``."""
    diff, low, high = (fmt_or_dash(d[k], digits) for k in ("diff", "low", "high"))
    return f"{diff} [{low}, {high}]"
