"""The mismatch study's tests as its rule states them: every arm against rgpo and the best peer per cell,
whether ignore is hurt, each arm's change from fp32 (Holm families), and the sensitivity numbers."""

from __future__ import annotations

import numpy as np

from rgpo_lab import rlhf_mismatch as mm
from rgpo_lab.rlhf_report.mismatch_runs import CONTROL, LAG_SUITE_CELLS, values, window_values
from rgpo_lab.statistics import holm, smallest_detectable_difference, verdict, welch


def diverged(data) -> dict[str, list[str]]:
    """Per cell, the runs whose test KL_ref exceeds 10x the mean of the same arm at fp32 (the pre-check's
    divergence threshold), as "arm s<seed>"; they stay in every test (their gold is finite) and are named."""
    out = {}
    for cell, arms in data.items():
        if cell == CONTROL:
            continue
        names = []
        for arm, runs in arms.items():
            control = values(data, CONTROL, arm, "kl_ref")
            if not control:
                continue
            limit = 10 * float(np.mean(control))
            names += [f"{arm} s{r['seed']}" for r in runs if r["kl_ref"] is not None and r["kl_ref"] > limit]
        if names:
            out[cell] = names
    return out


def families(data) -> list[list[str]]:
    """The Holm families of the across-cell tests (ignore hurt, each arm's change from fp32): each suite's
    cells apart (v3/mismatch's, then v3/mismatch_lag's), the control shared (INTERPRETATION.md)."""
    cells = [c for c in data if c != CONTROL]
    return [[c for c in cells if c not in LAG_SUITE_CELLS], [c for c in cells if c in LAG_SUITE_CELLS]]


def cell_tests(data, cell: str) -> dict:
    """Every arm against rgpo on test gold (Holm within the cell), the matched-KL condition (Welch on KL_ref,
    Holm within the cell), the best peer."""
    peers = {a: np.mean(values(data, cell, a)) for a in mm.PEERS if values(data, cell, a)}
    rows = {
        a: {
            "n": r["n"],
            "n_rgpo": r["n_reference"],
            "gold_diff_vs_rgpo": r["gold_diff"],
            "p": r["p"],
            "p_holm": r["p_holm"],
            "kl_ref_diff_vs_rgpo": r["kl_ref_diff"],
            "kl_p_holm": r["kl_p_holm"],
            "verdict": r["verdict"],
        }
        for a, r in against(data, cell, "rgpo").items()
    }
    best = max(peers.values()) if peers else None
    tied = [a for a in peers if peers[a] == best]
    peer = tied[0] if tied else None
    return {
        "vs_rgpo": rows,
        "best_peer": peer,
        "best_peer_tied_with": tied[1:],
        "vs_best_peer": {} if peer is None else against(data, cell, peer),
    }


def against(data, cell: str, reference: str, arms: tuple[str, ...] | None = None) -> dict:
    """Every other arm against ``reference`` on test gold (Welch, Holm over these comparisons in the cell)
    with the matched-KL condition (Welch on KL_ref, Holm likewise): the issue's "every arm against the best
    peer" (INTERPRETATION.md, 6), a family of its own beside the vs-rgpo one. ``arms``: the study's arms
    (this study's by default)."""
    arms = [a for a in (arms or mm.ARMS) if a != reference]
    ref_gold, ref_kl = values(data, cell, reference), values(data, cell, reference, "kl_ref")
    gold = {a: welch(values(data, cell, a), ref_gold) for a in arms}
    kl = {a: welch(values(data, cell, a, "kl_ref"), ref_kl) for a in arms}
    gold_holm = dict(zip(arms, holm([gold[a].p for a in arms]), strict=True))
    kl_holm = dict(zip(arms, holm([kl[a].p for a in arms]), strict=True))
    return {
        a: {
            "n": len(values(data, cell, a)),
            "n_reference": len(ref_gold),
            "gold_diff": gold[a].diff,
            "p": gold[a].p,
            "p_holm": gold_holm[a],
            "kl_ref_diff": kl[a].diff,
            "kl_p_holm": kl_holm[a],
            "verdict": matched_kl_words(a, gold[a].diff, gold_holm[a], kl[a].diff, kl_holm[a], reference),
        }
        for a in arms
    }


def matched_kl_words(
    arm: str, gold_diff: float, p_holm: float, kl_diff: float, kl_holm: float, reference: str = "rgpo"
) -> str:
    """The rule's words for arm against the reference (rgpo unless named): "rgpo higher / lower than <arm>"
    after Holm, a significant gold difference whose winner has a significantly higher KL_ref "<winner> higher
    gold at a higher KL_ref: undecided", and a win whose KL_ref cannot be tested (fewer than 2 values a side)
    undecided too."""
    words = verdict(gold_diff, p_holm)
    if words not in ("higher", "lower"):
        return words
    winner = arm if words == "higher" else reference
    if not np.isfinite(kl_holm):
        return f"{winner} higher gold, KL_ref not testable: undecided"
    if kl_holm <= 0.05 and (kl_diff > 0) == (winner == arm):
        return f"{winner} higher gold at a higher KL_ref: undecided"
    return f"{reference} {'lower' if words == 'higher' else 'higher'} than {arm}"


def hurt_by_cell(data) -> dict:
    """Is ignore hurt in each cell (gold below ignore at fp32, Welch, Holm over each suite's cells)?
    ``state``: hurt, not hurt, or not tested (fewer than 2 finished runs a side); ``n``: ignore's runs in the
    cell and at fp32."""
    out = {}
    for cells in families(data):
        tests = {c: welch(values(data, c, "ignore"), values(data, CONTROL, "ignore")) for c in cells}
        adjusted = dict(zip(cells, holm([tests[c].p for c in cells]), strict=True))
        for c in cells:
            tested = bool(np.isfinite(adjusted[c]))
            ranks = tested and adjusted[c] <= 0.05 and tests[c].diff < 0
            out[c] = {
                "diff": tests[c].diff,
                "p_holm": adjusted[c],
                "ranks": bool(ranks),
                "state": "hurt" if ranks else ("not hurt" if tested else "not tested"),
                "n": [len(values(data, c, "ignore")), len(values(data, CONTROL, "ignore"))],
                "family": cells,
            }
    return out


def change_from_control(data) -> dict:
    """Per arm, gold in each cell minus gold at fp32 (Welch, Holm over each suite's cells)."""
    out: dict = {arm: {} for arm in mm.ARMS}
    for cells in families(data):
        for arm in mm.ARMS:
            tests = {c: welch(values(data, c, arm), values(data, CONTROL, arm)) for c in cells}
            adjusted = holm([tests[c].p for c in cells])
            for c, p in zip(cells, adjusted, strict=True):
                out[arm][c] = {"diff": tests[c].diff, "p_holm": p, "verdict": verdict(tests[c].diff, p)}
    return out


SENSITIVITY_DATE = "2026-11-28"  # when the sensitivity section was added: after the final reading (issue 55)
POWER = 0.8  # of the smallest detectable differences


def sensitivity(data, tests) -> dict:
    """Added after the final reading (issue 55), never decisive: every gate arm's rejected share; the
    smallest gold difference each test could detect (`smallest_detectable_difference` at POWER, two-sided,
    at alpha 0.05 / m, m the size of its Holm family) for each arm's change from fp32 and for every arm
    against the cell's best peer; the runs resumed from a checkpoint."""
    changes = {}
    for cells in families(data):
        for arm in mm.ARMS:
            for c in cells:
                changes.setdefault(arm, {})[c] = smallest_detectable_difference(
                    values(data, c, arm), values(data, CONTROL, arm), 0.05 / len(cells), POWER
                )
    vs_peer = {}
    for cell, t in tests.items():
        peer = t["best_peer"]
        if peer is None:
            continue
        others = [a for a in mm.ARMS if a != peer]
        vs_peer[cell] = {
            a: smallest_detectable_difference(
                values(data, cell, a), values(data, cell, peer), 0.05 / len(others), POWER
            )
            for a in others
        }
    gate_arms = [a for a in mm.ARMS if a.startswith("rgpo")]
    return {
        "added": SENSITIVITY_DATE,
        "power": POWER,
        "rejected": {
            cell: {a: window_values(data[cell].get(a, []), "rejected_frac") for a in gate_arms}
            for cell in data
        },
        "detectable_change_from_control": changes,
        "detectable_vs_best_peer": vs_peer,
        "resumed": {
            f"{arm} {cell} s{r['seed']}": r["resumed_from"]
            for cell, arms in data.items()
            for arm, runs in arms.items()
            for r in runs
            if r.get("resumed_from")
        },
    }
