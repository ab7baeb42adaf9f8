"""``python -m rgpo_lab.mujoco_runner <method> [flags]``: the lab runner of ``<method>`` (ppo, rgpo, trpo,
awr), the same as ``python -m rgpo_lab.mujoco_runner.<method>_continuous_action [flags]``."""

from __future__ import annotations

import importlib
import sys

import tyro

from rgpo_trl.cli import run_main

METHODS = ("ppo", "rgpo", "trpo", "awr")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in METHODS:
        print(
            f"usage: python -m rgpo_lab.mujoco_runner {{{','.join(METHODS)}}} [flags]  (--help after the "
            "method lists its flags)",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"rgpo_lab.mujoco_runner.{argv[0]}_continuous_action")
    sys.argv = [sys.argv[0], *argv[1:]]  # the method's flags (run_main takes --debug out of them)
    prog = f"python -m rgpo_lab.mujoco_runner {argv[0]}"
    return run_main(
        lambda: module.main(tyro.cli(module.Args, description=module.__doc__, prog=prog)),
        errors=module.common.SCRIPT_ERRORS,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
