"""Independent references the tests check the library against (no library code)."""

from __future__ import annotations


def paper_rule(beta: float, mean_kl: float, target=0.02, lo=0.01, hi=5.0) -> float:
    """The paper's adaptive KL-coefficient rule (Eq. beta_update) written out: double above 1.5 x target,
    halve below target / 1.5, within [lo, hi]; the reference the controller and the trainers are checked
    against."""
    if mean_kl >= 1.5 * target:
        return min(2 * beta, hi)
    if mean_kl <= target / 1.5:
        return max(beta / 2, lo)
    return beta


def holm_by_hand(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment written out: the reference `rgpo_lab.statistics.holm` and the reports'
    families are checked against."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted
