"""The README's "Fine-tune a model with RGPOTrainer" block, run verbatim: the reward rises on the tiny model,
and the KL it prints is the controller's own input, checked by replaying the paper's adaptive-beta rule
(written out here from DESIGN.md, not the library's controller) on the logged per-iteration series."""

from __future__ import annotations

import math
import os
import re

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRINTED = re.compile(
    r"reward (?P<first>[\d.]+) -> (?P<last>[\d.]+) \(first / last 4 batches\); "
    r"KLhat_old per iteration max (?P<kl_max>[\d.]+) \(target 0\.02\); kl_coef (?P<coef0>[\d.e-]+) -> "
    r"(?P<coef1>[\d.e-]+) \(raised (?P<raised>\d+)x, lowered (?P<lowered>\d+)x\)"
)


def readme_block() -> str:
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Fine-tune a model with `RGPOTrainer`", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


def paper_rule(coef: float, mean_kl: float, target: float = 0.02, lo: float = 0.01, hi: float = 5.0) -> float:
    """Eq. beta_update: double at >= 1.5 target, halve at <= target / 1.5, within [lo, hi]."""
    if mean_kl >= 1.5 * target:
        return min(2 * coef, hi)
    if mean_kl <= target / 1.5:
        return max(coef / 2, lo)
    return coef


def test_readme_example_learns_and_prints_the_controllers_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme_example"}
    threads = torch.get_num_threads()
    try:
        exec(compile(readme_block(), "README.md", "exec"), namespace)  # noqa: S102
    finally:
        torch.set_num_threads(threads)  # the block sets one thread; the rest of the session keeps its own
    printed = PRINTED.search(capsys.readouterr().out)
    assert printed, "the README example printed no summary line"
    logs = namespace["trainer"].state.log_history

    # the reward rose: mean of the first vs the last four generated batches
    rewards = [h["reward"] for h in logs if "reward" in h]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last - first > 0.1, (first, last)
    assert (float(printed["first"]), float(printed["last"])) == (round(first, 3), round(last, 3))

    # an iteration is two passes over one batch (num_iterations=2), so its token-weighted mean KLhat_old is
    # the plain mean of the two steps' values (the first pass is on-policy: 0)
    steps = [h for h in logs if "rgpo/kl_old" in h]
    assert len(steps) == 64
    pairs = zip(steps[::2], steps[1::2], strict=True)
    per_iteration = [(a["rgpo/kl_old"] + b["rgpo/kl_old"]) / 2 for a, b in pairs]
    series = [h["rgpo/kl_old_iteration"] for h in logs if "rgpo/kl_old_iteration" in h]
    assert len(series) == 32
    for ours, logged in zip(per_iteration, series, strict=True):
        assert math.isclose(ours, logged, rel_tol=1e-5, abs_tol=1e-9)
    assert float(printed["kl_max"]) == round(max(series), 4)
    assert max(series) != max(h["rgpo/kl_old"] for h in steps)  # not the per-step maximum

    # replaying the rule on that series gives every coefficient the trainer used, and the last one
    used = [h["rgpo/kl_coef"] for h in steps[1::2]] + [namespace["trainer"].kl_coef]
    replayed = [0.5]
    for mean_kl in series:
        replayed.append(paper_rule(replayed[-1], mean_kl))
    assert replayed == used
    raised = sum(b > a for a, b in zip(replayed, replayed[1:], strict=False))
    lowered = sum(b < a for a, b in zip(replayed, replayed[1:], strict=False))
    assert raised >= 1 and lowered >= 1  # the controller acted both ways
    assert (int(printed["raised"]), int(printed["lowered"])) == (raised, lowered)
    assert (float(printed["coef0"]), float(printed["coef1"])) == (0.5, replayed[-1])
