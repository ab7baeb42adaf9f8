"""The lab around rgpo-trl: what produced the committed results (statistics, suite runners, reports), kept
apart from what users run (the library ``rgpo_trl``, the MuJoCo scripts, the recipe).

The lab is not installed with the package (the wheel holds ``rgpo_trl`` and ``mujoco_baselines`` only): run it
from the repository root of a checkout, ``cd <checkout> && python -m rgpo_lab.<module> ...``, or from
elsewhere with ``PYTHONPATH=<checkout>``. Anywhere else Python answers ``No module named 'rgpo_lab'`` before
any of the lab's code runs. The RLHF suites start the checkout's recipe by path (``recipes/hh_rlhf_qwen.py``;
the MuJoCo grid drives ``mujoco_baselines/<method>_continuous_action.py``), so the package refuses to
import, in one line naming the checkout root it expected, from a copy that lacks it."""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKOUT_FILES = ("recipes/hh_rlhf_qwen.py",)


def missing_checkout_files(root: str = ROOT) -> list[str]:
    """The files of `CHECKOUT_FILES` that ``root`` lacks (none in a checkout)."""
    return [name for name in CHECKOUT_FILES if not os.path.isfile(os.path.join(root, name))]


if missing_checkout_files():
    # name=__name__: `python -m rgpo_lab.<module>` then reports the message on one line, not a traceback
    raise ImportError(
        f"rgpo_lab runs from a checkout of rgpo-trl and {ROOT} is not one "
        f"({', '.join(missing_checkout_files())} not found): cd <checkout> && python -m rgpo_lab.<module>",
        name=__name__,
    )
