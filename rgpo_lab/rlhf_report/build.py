"""The reports: `build_report` for one suite folder, `build_studies` for the results root holding the
suites; `main` is `python -m rgpo_lab.rlhf_report`'s command line."""

from __future__ import annotations

import argparse
import json
import os

from rgpo_lab import rlhf_report
from rgpo_lab.json_values import plain
from rgpo_lab.rlhf_report.comparison import (
    gold_markdown,
    gold_vs_sft,
    heldout_samples,
    markdown,
    overoptimisation,
    pairwise,
    pairwise_markdown,
    table,
)
from rgpo_lab.rlhf_report.dynamics import dynamics, dynamics_markdown
from rgpo_lab.rlhf_report.figures import dynamics_figure, figures, study_figures
from rgpo_lab.rlhf_report.runs import load, load_suite, window_of
from rgpo_lab.rlhf_report.staleness import STUDIES, build_staleness
from rgpo_lab.rlhf_report.studies import frontier_interpolation, reuse_tests, study_markdown, study_points
from rgpo_lab.rlhf_suite import FRONTIER_BASE, FRONTIER_BETAS, REUSE, REUSE_BASE


def build_report(
    results: str, out: str, plots: bool = True, runs: dict[str, list[dict]] | None = None
) -> str:
    """The comparison report of one suite folder (``runs``: its runs when the caller has loaded them)."""
    runs = load(results) if runs is None else runs
    os.makedirs(out, exist_ok=True)
    rows = table(runs)
    with open(os.path.join(out, "table.json"), "w") as f:
        json.dump(plain(rows), f, indent=2, allow_nan=False)
    gold_rows, over = gold_vs_sft(runs), overoptimisation(runs)
    with open(os.path.join(out, "gold_vs_sft.json"), "w") as f:
        gold = {"rows": gold_rows, "overoptimisation": over and {k: v for k, v in over.items()}}
        json.dump(plain(gold), f, indent=2, allow_nan=False)
    samples = heldout_samples(runs)
    tests = {
        "heldout_gold": pairwise(runs, "heldout", "gold"),
        "window_gold": pairwise(runs, "summary", "gold"),
        "heldout_kl_ref": pairwise(runs, "heldout", "kl_ref"),
    }
    with open(os.path.join(out, "pairwise.json"), "w") as f:
        json.dump(plain(tests), f, indent=2, allow_nan=False)
    window = window_of(runs)
    dyn = dynamics(runs, window)
    with open(os.path.join(out, "dynamics.json"), "w") as f:
        json.dump(plain(dyn), f, indent=2, allow_nan=False)
    figs = (figures(runs, out, over) + dynamics_figure(runs, out)) if plots else []
    intro = (
        f"Command: `python -m rgpo_lab.rlhf_report {results} --out {out}`. Mean ± sample std (ddof 1) over n "
        f"finished seeds; window = the preset's summary window; held-out = {samples} sample(s) per held-out "
        "prompt after training (same reward model, gold rule and KL_ref estimator for every method). The "
        "paper's reward column is its improvement over the initial policy on a different model and reward "
        "model: compare orderings, not values."
    )
    sections = ["# RLHF comparison vs the paper (Sec. 7.3)", "", intro, "", markdown(rows), ""]
    sections += ["## What the gold score adds", "", gold_markdown(gold_rows, over, samples), ""]
    sections += ["## Pairwise tests", "", pairwise_markdown(tests["heldout_gold"], "held-out gold"), ""]
    sections += [pairwise_markdown(tests["window_gold"], "window gold"), ""]
    sections += [pairwise_markdown(tests["heldout_kl_ref"], "held-out KL_ref"), ""]
    sections += ["## Training dynamics (what the window means hide)", "", dynamics_markdown(dyn, window), ""]
    sections += [*[f"![{f}]({f})" for f in figs], ""]
    text = "\n".join(sections)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def _studies_present(root: str) -> list[str]:
    """The report's title: tuning and the final comparison, the v2 studies where their folders exist (both
    named when either does), the staleness study where one of its suites does."""
    names = ["tuning", "final comparison"]
    if any(os.path.isdir(os.path.join(root, s)) for s in ("frontier", "reuse")):
        names += ["KL frontiers", "batch reuse"]
    if any(os.path.isdir(os.path.join(root, s)) for s in STUDIES):
        names.append("stale samples")
    return names


def build_studies(root: str, out: str, plots: bool = True) -> str:
    """The studies' report: the tuning selection, the final comparison (its own report under final/report),
    the beta_ref frontiers and the batch-reuse study, from the committed runs under ``root``."""

    os.makedirs(out, exist_ok=True)
    parts = [
        "# RLHF studies: " + ", ".join(_studies_present(root)),
        "",
        f"Command: `python -m rgpo_lab.rlhf_report {root} --studies --out {out}`; every number below is "
        "regenerated from the committed runs by it.",
        "",
    ]
    selection = os.path.join(root, "tune", "selection.md")
    if os.path.exists(selection):
        with open(selection) as f:
            parts += ["## Learning-rate selection", "", f.read().split("\n", 2)[2].strip(), ""]
    final = os.path.join(root, "final")
    final_runs = load_suite(root, "final")  # read once: the final report's runs and both studies' base point
    if os.path.isdir(final):
        text = build_report(final, os.path.join(final, "report"), plots, final_runs)
        link = os.path.relpath(os.path.join(final, "report", "report.md"), out)
        after = text.split("## Pairwise tests", 1)[1] if "## Pairwise tests" in text else ""
        parts += ["## Final comparison (selected rates)", ""]
        parts += [f"Full table and figures: [final/report/report.md]({link}).", ""]
        parts += [after.split("![", 1)[0].strip(), ""]
    studies: dict = {}
    if any(os.path.isdir(os.path.join(root, s)) for s in ("frontier", "reuse")):
        frontier = study_points(
            "frontier", load_suite(root, "frontier"), final_runs, FRONTIER_BETAS, FRONTIER_BASE, "beta"
        )
        reuse = study_points("reuse", load_suite(root, "reuse"), final_runs, REUSE, REUSE_BASE, "reuse")
        between = frontier_interpolation(frontier, "rgpo", "ppo")
        tests = reuse_tests(reuse, base=REUSE_BASE)
        strip = lambda pts: [{k: v for k, v in p.items() if k != "runs"} for p in pts]  # noqa: E731
        studies |= {"frontier": strip(frontier), "rgpo_at_ppo": between, "reuse": strip(reuse)}
        studies["reuse_tests"] = tests
        parts += [study_markdown(frontier, reuse, between, tests), ""]
        missing = [f"{p['source']}: {p['method']} at {p['value']}" for p in frontier + reuse if p["n"] == 0]
        if missing:
            parts += ["Not run yet: " + "; ".join(missing) + ".", ""]
        if plots:
            parts += [f"![{f}]({f})" for f in study_figures(frontier, reuse, out)] + [""]
    stale = {s: load_suite(root, s) for s in STUDIES if os.path.isdir(os.path.join(root, s))}
    if stale:
        text, studies["staleness"] = build_staleness(stale, out, plots)
        parts += [text, ""]
    with open(os.path.join(out, "studies.json"), "w") as f:
        json.dump(plain(studies), f, indent=2, allow_nan=False)
    text = "\n".join(parts)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def main(argv=None) -> None:
    doc = rlhf_report.__doc__  # the package's docstring is the --help text
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.rlhf_report",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results")
    p.add_argument("--out", default=None)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument(
        "--studies",
        action="store_true",
        help="RESULTS is the root holding tune/ final/ frontier/ reuse/: write the studies' report",
    )
    a = p.parse_args(argv)
    build = build_studies if a.studies else build_report
    print(build(a.results, a.out or os.path.join(a.results, "report"), not a.no_plot))
