"""Pick each RLHF method's learning rate from the tuning suite, by the rule fixed before its runs.

    python -m rgpo_lab.rlhf_select results/rlhf/tune      # -> selection.json and selection.md in that folder

Run from the repository root of a checkout (cd <checkout> first, or PYTHONPATH=<checkout>): the lab is not
installed with the package, and elsewhere Python finds no module rgpo_lab.

The rule (set in `rgpo_lab/rlhf_suite.py` before any tuning run): for every method, the learning rate
whose run has the highest mean gold score on the 256 validation prompts (held out of the training split; never
the test prompts), averaged over the evaluations at iterations 325, 350, 375 and 400 (validation.json). A
method is selected only when all of its rates have finished; the table lists every method x rate with its
value.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rgpo_lab.json_values import plain
from rgpo_lab.rlhf_suite import (
    DEMO_RATES,
    DEMO_SEED,
    EDGE_RATES,
    TUNE_RATES,
    TUNE_RATES_V3,
    TUNE_SEED,
    RLHFRun,
    read_validation,
    tune_grid,
)

CRITERION = "gold"  # validation.json's mean gold over the window evaluations


def protocol(tune_dir: str) -> dict:
    """The tuning suite a folder holds: its rates, seed and rule (the v2 and v3 `tune` suites, the demo's
    rate)."""
    path = os.path.normpath(tune_dir)
    if os.path.basename(path) == "demo-lr":
        criterion = (
            f"mean validation {CRITERION} at iteration 60 (64 prompts of tiny-hh/validation, world v3, "
            "2 samples each), highest wins"
        )
        return {"rates": {"rgpo": DEMO_RATES}, "seed": DEMO_SEED, "criterion": criterion}
    v3 = os.path.basename(os.path.dirname(path)) == "v3"
    validation = (
        "256 prompts of tiny-hh/validation, world v3: questions no training prompt contains"
        if v3
        else "256 training-split prompts held out"
    )
    criterion = (
        f"mean validation {CRITERION} at iterations 325-400 ({validation}, 2 samples each), highest wins"
    )
    if v3:
        criterion += (
            "; a method best at its grid's lowest (highest) rate gets one run a grid step below (above) "
            "and is selected over the extended grid, one extension at most"
        )
    rates = TUNE_RATES_V3 if v3 else TUNE_RATES
    return {"rates": rates, "seed": TUNE_SEED, "edges": EDGE_RATES if v3 else {}, "criterion": criterion}


def select(tune_dir: str) -> dict:
    """Every method x rate with the criterion (None if not finished) and, when all rates finished, the
    choice."""
    methods, proto = {}, protocol(tune_dir)
    for method, grid in proto["rates"].items():
        rates = tune_grid(tune_dir, method, grid, proto.get("edges", {}).get(method))
        rows = []
        for lr in rates:
            run = RLHFRun("tune", method, proto["seed"], "", tag=f"lr{lr}")
            rows.append(
                {"lr": lr, "run": run.name, "validation": read_validation(os.path.join(tune_dir, run.name))}
            )
        done = [r for r in rows if r["validation"] is not None]
        selected = (
            max(done, key=lambda r: r["validation"][CRITERION])["lr"] if len(done) == len(rows) else None
        )
        edge = (
            None
            if selected is None
            else "lowest"
            if selected == rates[0]
            else "highest"
            if selected == rates[-1]
            else None
        )
        methods[method] = {"rates": rows, "selected_lr": selected, "edge": edge, "extended": rates != grid}
    return {"criterion": proto["criterion"], "seed": proto["seed"], "methods": methods}


def to_markdown(selection: dict, folder: str = "results/rlhf/tune") -> str:
    lines = [
        "# Learning-rate selection (tuning suite)",
        "",
        f"Rule, fixed before the runs: {selection['criterion']}; one run per method x rate (seed "
        f"{selection['seed']}, used by no other suite). Regenerate: `python -m rgpo_lab.rlhf_select "
        f"{folder}`.",
        "",
        "| method | lr | validation gold | validation proxy reward | validation KL_ref | selected |",
        "|---|---|---|---|---|---|",
    ]
    for method, entry in selection["methods"].items():
        for row in entry["rates"]:
            v = row["validation"]
            cells = (
                ["not run"] * 3
                if v is None
                else [f"{v['gold']:.3f}", f"{v['reward']:.3f}", f"{v['kl_ref']:.3f}"]
            )
            mark = "**yes**" if row["lr"] == entry["selected_lr"] else ""
            if mark and entry.get("edge"):
                mark += f" (the {entry['edge']} rate tried)"
            lines.append(f"| {method} | {row['lr']} | {' | '.join(cells)} | {mark} |")
    edges = [f"{m} ({e['edge']})" for m, e in selection["methods"].items() if e.get("edge")]
    if edges:
        lines += ["", f"Selected at an edge of the rates tried: {', '.join(edges)}."]
    extended = [m for m, e in selection["methods"].items() if e.get("extended")]
    if extended:
        lines += ["", f"Grid extended by the edge rule: {', '.join(extended)}."]
    pending = [m for m, e in selection["methods"].items() if e["selected_lr"] is None]
    if pending:
        lines += ["", f"Not selected yet (a rate has not finished): {', '.join(pending)}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rgpo_lab.rlhf_select",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("tune_dir", help="the tuning suite's results, e.g. results/rlhf/tune")
    a = p.parse_args(argv)
    if not os.path.isdir(a.tune_dir):
        p.error(
            f"tune_dir {a.tune_dir!r} is not a directory (run `python -m rgpo_lab.rlhf_suite tune` first)"
        )
    selection = select(a.tune_dir)
    with open(os.path.join(a.tune_dir, "selection.json"), "w") as f:
        json.dump(plain(selection), f, indent=2, allow_nan=False)
    text = to_markdown(selection, a.tune_dir)
    with open(os.path.join(a.tune_dir, "selection.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
